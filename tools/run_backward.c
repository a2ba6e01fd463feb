/* `nsa run --backward` (run_backward.h). */
#include "run_backward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_check.h"
#include "run_inputs.h"
#include "tool.h"

/* fp64 FLOPs of the reference backward: about three forwards' attention work. */
static double backward_cost(const tk_case *c)
{
    double f = 0.0;
    for (int64_t b = 0; b < c->batch; b++) f += run_check_cost(&c->cfg, c->cu_seqlens[b + 1] - c->cu_seqlens[b]);
    return 3.0 * f;
}

/* The key-side gradients' fp64 sums rounded once to the dtype (in place, as doubles). */
static nsa_status round_key_grads(const tk_case *c, tk_grads *g)
{
    const nsa_dtype dt = c->cfg.dtype;
    for (int i = TK_G_K; i < TK_G_COUNT && dt != NSA_DTYPE_F64; i++) {
        if ((i >= TK_G_GATE && i < TK_G_WK) || !g->t[i] || g->n[i] == 0) continue;
        void *x = malloc((size_t)g->n[i] * nsa_dtype_size(dt));
        nsa_status s = x ? nsa_convert(g->t[i], NSA_DTYPE_F64, x, dt, g->n[i]) : NSA_ERR_OUT_OF_MEMORY;
        if (s == NSA_SUCCESS) s = nsa_convert(x, dt, g->t[i], NSA_DTYPE_F64, g->n[i]);
        free(x);
        if (s != NSA_SUCCESS) return s;
    }
    return NSA_SUCCESS;
}

int run_backward_do(const char *cmd, nsa_context *ctx, const char *backend, const tk_case *c, const tk_inputs *in,
                    const tk_output *fwd, const char *inputs_dir, int check, double budget_flops, int shards,
                    run_bwd *r)
{
    memset(r, 0, sizeof *r);
    const nsa_config *g = &c->cfg;
    const int64_t T = tk_case_tokens(c), Hq = g->num_q_heads, Dv = g->head_dim_v, no = T * Hq * Dv;
    float *dO = NULL;
    int found = 0, rc = 0;
    char msg[TOOL_ERR_MAX];
    if (inputs_dir) {
        const int64_t shape[3] = {T, Hq, Dv};
        if ((rc = run_inputs_load_floats(cmd, inputs_dir, "do", 3, shape, g->dtype, &dO, &found)) != 0) return rc;
    }
    r->dout_from = found ? "do.npy" : "seed";
    if (!found) { /* uniform [-1, 1) from the seed (its own stream), rounded to the dtype */
        nsa_status s = tk_dout_make(c, c->seed, 0xd0, &dO);
        if (s != NSA_SUCCESS) return tool_report(cmd, "drawing dO", s);
    }
    const int32_t *sel = c->fixed_indices ? in->given : fwd->sel;
    double t0 = tool_now();
    nsa_status s;
    if (shards > 0) { /* the shards' parts summed in fp64, then rounded once */
        int64_t cut[TK_MAX_BATCH][TK_MAX_SHARDS + 1];
        tk_shard_cuts(c, shards, NULL, cut);
        s = tk_run_shards(ctx, c, in, shards, cut, dO, fwd->lse_d, sel, NULL, &r->g, msg, sizeof msg);
        if (s == NSA_SUCCESS && (s = round_key_grads(c, &r->g)) != NSA_SUCCESS)
            snprintf(msg, sizeof msg, "rounding the summed gradients: %s", nsa_status_string(s));
    } else {
        s = tk_run_backward(ctx, c, in, dO, fwd->lse_d, sel, &r->g, msg, sizeof msg);
    }
    r->seconds = tool_now() - t0;
    if (s != NSA_SUCCESS) {
        fprintf(stderr, "%s: backward: %s\n", cmd, msg);
        free(dO);
        return TOOL_EXIT_FAIL;
    }

    if (!check) {
        snprintf(r->note, sizeof r->note, "not checked (--check-tokens 0)");
    } else if (backward_cost(c) > budget_flops) {
        snprintf(r->note, sizeof r->note,
                 "not checked: the whole problem's reference backward (%.3g fp64 GFLOP) exceeds the budget "
                 "(--check-gflop %.3g); gradients have no causal prefix to sample",
                 backward_cost(c) / 1e9, budget_flops / 1e9);
    } else {
        double rms_do = 0.0;
        for (int64_t e = 0; e < no; e++) rms_do += (double)dO[e] * (double)dO[e];
        rms_do = no ? sqrt(rms_do / (double)no) : 0.0;
        tk_ref64 ref;
        memset(&ref, 0, sizeof ref);
        t0 = tool_now();
        if (strcmp(backend, "cpu") == 0) {
            r->reference = "the fp64 gradient reference (tests/common/grad.c)";
            tk_ref64 x;
            double *d64 = malloc((size_t)(no + 1) * sizeof *d64);
            s = d64 ? tk_ref64_from_inputs(c, in, &x) : NSA_ERR_OUT_OF_MEMORY;
            if (s == NSA_SUCCESS) {
                for (int64_t e = 0; e < no; e++) d64[e] = dO[e];
                s = tk_ref64_backward(c, &x, sel, 1, d64, &ref);
                tk_ref64_free(&x);
            }
            free(d64);
            if (s == NSA_SUCCESS && r->g.shared) tk_ref64_sum_shared(&ref);
        } else {
            r->reference = "the cpu backend";
            nsa_context *cpu = NULL;
            tk_grads cg;
            s = nsa_context_create("cpu", 0, &cpu);
            if (s == NSA_SUCCESS) s = tk_run_backward(cpu, c, in, dO, fwd->lse_d, sel, &cg, msg, sizeof msg);
            nsa_context_destroy(cpu);
            if (s == NSA_SUCCESS) { /* the cpu's gradients as the reference */
                for (int i = 0; i < TK_G_COUNT; i++) {
                    ref.t[i] = cg.t[i];
                    ref.n[i] = cg.n[i];
                    cg.t[i] = NULL;
                }
                tk_grads_free(&cg);
            }
        }
        r->ref_seconds = tool_now() - t0;
        if (s != NSA_SUCCESS) {
            fprintf(stderr, "%s: the reference backward failed: %s\n", cmd, nsa_status_string(s));
            tk_ref64_free(&ref);
            free(dO);
            return TOOL_EXIT_FAIL;
        }
        tk_compare_grads(c, &r->g, &ref, rms_do, in->total_cmp, &r->v);
        r->checked = 1;
        tk_ref64_free(&ref);
    }
    free(dO);
    return 0;
}

int run_backward_write(const char *cmd, const char *dir, const tk_case *c, const tk_inputs *in, const run_bwd *r)
{
    const nsa_config *g = &c->cfg;
    const int64_t T = tk_case_tokens(c), Hq = g->num_q_heads, Hkv = g->num_kv_heads, Dk = g->head_dim_qk,
                  Dv = g->head_dim_v, l = g->cmp_block, Nc = in->total_cmp;
    static const char *const br[3] = {"cmp", "slc", "win"};
    for (int i = 0; i < TK_G_COUNT; i++) {
        if (!r->g.t[i] || r->g.n[i] == 0) continue;
        char name[32];
        int64_t shape[4];
        int nd = 3;
        if (i == TK_G_Q) {
            snprintf(name, sizeof name, "dq");
            shape[0] = T, shape[1] = Hq, shape[2] = Dk;
        } else if (i >= TK_G_K && i < TK_G_K + 3) {
            snprintf(name, sizeof name, r->g.shared ? "dk" : "dk_%s", br[i - TK_G_K]);
            shape[0] = T, shape[1] = Hkv, shape[2] = Dk;
        } else if (i >= TK_G_V && i < TK_G_V + 3) {
            snprintf(name, sizeof name, r->g.shared ? "dv" : "dv_%s", br[i - TK_G_V]);
            shape[0] = T, shape[1] = Hkv, shape[2] = Dv;
        } else if (i >= TK_G_GATE && i < TK_G_GATE + 3) {
            snprintf(name, sizeof name, "dg_%s", br[i - TK_G_GATE]);
            shape[0] = T, shape[1] = Hq, nd = 2;
        } else if (i == TK_G_WK || i == TK_G_WV) {
            const int64_t D = i == TK_G_WK ? Dk : Dv;
            snprintf(name, sizeof name, i == TK_G_WK ? "dw_k" : "dw_v");
            shape[0] = Hkv, shape[1] = l, shape[2] = D, shape[3] = D, nd = 4;
        } else if (i == TK_G_PEK || i == TK_G_PEV) {
            snprintf(name, sizeof name, i == TK_G_PEK ? "dpe_k" : "dpe_v");
            shape[0] = Hkv, shape[1] = l, shape[2] = i == TK_G_PEK ? Dk : Dv;
        } else {
            snprintf(name, sizeof name, i == TK_G_KC ? "dkc" : "dvc");
            shape[0] = Nc, shape[1] = Hkv, shape[2] = i == TK_G_KC ? Dk : Dv;
        }
        const int64_t n = r->g.n[i];
        if (c->cfg.dtype == NSA_DTYPE_F64) { /* '<f8': the gradients as computed */
            int rc = run_outputs_write_f64(cmd, dir, name, nd, shape, r->g.t[i]);
            if (rc) return rc;
            continue;
        }
        float *f = malloc((size_t)(n + 1) * sizeof *f);
        if (!f) {
            fprintf(stderr, "%s: out of memory writing %s\n", cmd, name);
            return TOOL_EXIT_FAIL;
        }
        for (int64_t e = 0; e < n; e++) f[e] = (float)r->g.t[i][e]; /* exact: the values are of the dtype */
        int rc = run_outputs_write_f32(cmd, dir, name, nd, shape, f);
        free(f);
        if (rc) return rc;
    }
    return 0;
}

void run_backward_free(run_bwd *r) { tk_grads_free(&r->g); }
