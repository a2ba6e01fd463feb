/*
 * dev/precision/bwd_rounding.c -- how far the backward lands from the fp64
 * reference, in units of test_backward's tolerance, when a GPU kernel rounds
 * the probability-side operand of its products to the 16-bit dtype once (as
 * FlashAttention does) instead of splitting it into hi + lo (as bwd_attn_sm80
 * and bwd_attn_sm90 do in bf16). No GPU: the reference itself computes each
 * variant (tk_ref64_emulate, tests/common/grad.c), then the testkit's
 * comparison (tk_compare_grads, the tolerances of test_backward) judges it
 * against the exact reference, tensor by tensor, over a corpus (the same
 * inputs, dO and cpu selection as test_backward; T <= 700).
 *
 * Variants (bits of tk_ref64_emulate):
 *   dq          scale ds rounded before dq += ds k
 *   dk          scale ds rounded before dk += ds q
 *   dv          g p rounded before dv += g p dO
 *   center      dq's k replaced by k - mean k (the mean of the branch's keys of
 *               the sequence and KV head; sum_r ds_r = 0 makes it the same sum),
 *               the difference rounded too
 *   one         dq = scale (sum (p dp) k - D sum p k) with p dp and p rounded
 *               (the one-sweep rows kernels without their split)
 * "operands in f16": the same roundings to f16 in a bf16 call (a kernel that
 * multiplies in f16, its other operand converted from bf16 exactly, which holds
 * where that operand's values lie in f16's range).
 * Outputs are rounded to the dtype (dgate to fp32) as a backend returns them.
 *
 * Build and run from the repository root, after a meson build in build-cu:
 *   cc -O2 -Iinclude -Itests/common dev/precision/bwd_rounding.c \
 *      build-cu/tests/common/libnsa_testkit.a -Lbuild-cu/core -lnsa -lm -o /tmp/bwd_rounding
 *   LD_LIBRARY_PATH=build-cu/core /tmp/bwd_rounding [full|small]
 * Results: docs/cuda-results.md, 2026-12-07 (the precision of single rounding).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nsa.h"
#include "testkit.h"

typedef struct {
    const char *name;
    int mode;
    int f16;                  /* round the operands to f16 whatever the call's dtype */
    double worst[TK_G_COUNT]; /* per tensor, over the corpus */
    char where[TK_G_COUNT][96];
    int fails;                /* (case, tensor) pairs past the tolerance */
} variant;

static int round_to(double *v, int64_t n, nsa_dtype dt)
{
    float *tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp); /* 4 bytes: room for any 16- or 32-bit type */
    if (!tmp) return -1;
    int bad = n > 0 && (nsa_convert(v, NSA_DTYPE_F64, tmp, dt, n) != NSA_SUCCESS ||
                        nsa_convert(tmp, dt, v, NSA_DTYPE_F64, n) != NSA_SUCCESS);
    free(tmp);
    return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
    const char *corpus = argc > 1 ? argv[1] : "full";
    variant vs[] = {
        {.name = "exact (output rounding only)", .mode = 0},
        {.name = "dq", .mode = TK_EMU_DQ},
        {.name = "dk", .mode = TK_EMU_DK},
        {.name = "dv", .mode = TK_EMU_DV},
        {.name = "dq dk dv (FlashAttention)", .mode = TK_EMU_DQ | TK_EMU_DK | TK_EMU_DV},
        {.name = "dq center", .mode = TK_EMU_DQ | TK_EMU_CENTER},
        {.name = "dq center, dk, dv", .mode = TK_EMU_DQ | TK_EMU_CENTER | TK_EMU_DK | TK_EMU_DV},
        {.name = "one", .mode = TK_EMU_ONE},
        {.name = "one, dk, dv", .mode = TK_EMU_ONE | TK_EMU_DK | TK_EMU_DV},
        {.name = "dq dk dv, operands in f16", .mode = TK_EMU_DQ | TK_EMU_DK | TK_EMU_DV, .f16 = 1},
        {.name = "one, dk, dv, operands in f16", .mode = TK_EMU_ONE | TK_EMU_DK | TK_EMU_DV, .f16 = 1},
    };
    const int nv = (int)(sizeof vs / sizeof vs[0]);
    nsa_context *ctx = NULL;
    if (nsa_context_create("cpu", 0, &ctx) != NSA_SUCCESS) {
        fprintf(stderr, "bwd_rounding: no cpu context: %s\n", nsa_last_error());
        return 1;
    }
    tk_case *cases = NULL;
    const int ncases = tk_corpus(corpus, &cases);
    if (ncases <= 0) {
        fprintf(stderr, "bwd_rounding: no corpus '%s'\n", corpus);
        return 1;
    }
    const nsa_dtype dts[] = {NSA_DTYPE_BF16, NSA_DTYPE_F16};
    for (int di = 0; di < 2; di++) {
        const nsa_dtype dt = dts[di];
        for (int k = 0; k < nv; k++) {
            memset(vs[k].worst, 0, sizeof vs[k].worst);
            memset(vs[k].where, 0, sizeof vs[k].where);
            vs[k].fails = 0;
        }
        int run = 0;
        for (int ci = 0; ci < ncases; ci++) {
            if (tk_case_tokens(&cases[ci]) > 700) continue; /* the fp64 reference is O(T^2) */
            tk_case c = cases[ci];
            tk_case_set_dtype(&c, dt);
            tk_inputs in;
            tk_output fo;
            char msg[1024];
            float *dO = NULL;
            if (tk_inputs_make(&c, &in) != NSA_SUCCESS || tk_dout_make(&c, c.seed ^ 0xd0d0ULL, 901, &dO) != NSA_SUCCESS ||
                tk_run(ctx, &c, &in, &fo, msg, sizeof msg) != NSA_SUCCESS) {
                fprintf(stderr, "bwd_rounding: %s: setup failed\n", c.label);
                return 1;
            }
            const int32_t *sel = c.cfg.num_selected > 0 ? (c.fixed_indices ? in.given : fo.sel) : NULL;
            const int64_t no = tk_case_tokens(&c) * c.cfg.num_q_heads * c.cfg.head_dim_v;
            double *dO64 = malloc((size_t)(no + 1) * sizeof *dO64), rms_do = 0.0;
            tk_ref64 x, ref;
            if (!dO64 || tk_ref64_from_inputs(&c, &in, &x) != NSA_SUCCESS) return 1;
            for (int64_t e = 0; e < no; e++) {
                dO64[e] = dO[e];
                rms_do += dO64[e] * dO64[e];
            }
            rms_do = no ? sqrt(rms_do / (double)no) : 0.0;
            tk_ref64_emulate(0, dt);
            if (tk_ref64_backward(&c, &x, sel, 1, dO64, &ref) != NSA_SUCCESS) return 1;
            for (int k = 0; k < nv; k++) {
                tk_ref64 emu;
                tk_ref64_emulate(vs[k].mode, vs[k].f16 ? NSA_DTYPE_F16 : dt);
                const nsa_status s = tk_ref64_backward(&c, &x, sel, 1, dO64, &emu);
                tk_ref64_emulate(0, dt);
                if (s != NSA_SUCCESS) return 1;
                tk_grads got;
                memset(&got, 0, sizeof got);
                for (int i = 0; i < TK_G_COUNT; i++) {
                    got.t[i] = emu.t[i];
                    got.n[i] = emu.n[i];
                    const int gate = i >= TK_G_GATE && i < TK_G_GATE + 3;
                    if (emu.t[i] && round_to(emu.t[i], emu.n[i], gate ? NSA_DTYPE_F32 : dt) != 0) return 1;
                }
                /* tensor by tensor: tk_compare_grads stops at a tensor past its tolerance */
                int64_t keep[TK_G_COUNT];
                memcpy(keep, ref.n, sizeof keep);
                for (int i = 0; i < TK_G_COUNT; i++) {
                    if (!ref.t[i] || keep[i] == 0) continue;
                    for (int j = 0; j < TK_G_COUNT; j++) ref.n[j] = j == i ? keep[j] : 0;
                    tk_grad_verdict v;
                    tk_compare_grads(&c, &got, &ref, rms_do, in.total_cmp, &v);
                    if (!v.pass) vs[k].fails++;
                    if (v.worst > vs[k].worst[i]) {
                        vs[k].worst[i] = v.worst;
                        snprintf(vs[k].where[i], sizeof vs[k].where[i], "%s", c.label);
                    }
                }
                memcpy(ref.n, keep, sizeof keep);
                tk_ref64_free(&emu);
            }
            run++;
            tk_ref64_free(&ref);
            tk_ref64_free(&x);
            free(dO64);
            free(dO);
            tk_output_free(&fo);
            tk_inputs_free(&in);
        }
        printf("%s, corpus %s, %d cases: worst error / tolerance per gradient (case), failing (case, tensor) pairs\n",
               nsa_dtype_name(dt), corpus, run);
        for (int k = 0; k < nv; k++) {
            double w = 0.0;
            for (int i = 0; i < TK_G_COUNT; i++)
                if (vs[k].worst[i] > w) w = vs[k].worst[i];
            printf("  %-28s worst %6.3f, %3d failing:", vs[k].name, w, vs[k].fails);
            for (int i = 0; i < TK_G_COUNT; i++)
                if (vs[k].worst[i] >= 0.25) printf(" %s %.3f (%s)", tk_ref64_name(i), vs[k].worst[i], vs[k].where[i]);
            printf("\n");
        }
        fflush(stdout);
    }
    free(cases);
    nsa_context_destroy(ctx);
    return 0;
}
