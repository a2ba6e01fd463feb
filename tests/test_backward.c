/*
 * nsa_backward on a backend against the fp64 gradient reference
 * (tests/common/grad.c, itself checked against finite differences by
 * test_grad.c), semantics section 9.
 *
 * Per case: the inputs of the corpus, rounded to the dtype; the backend's own
 * forward gives the LSEs and the selection (or the case's fixed indices); dO is
 * drawn from the case's seed and rounded to the dtype. Every gradient buffer is
 * poisoned (0xFF: NaN) before nsa_backward. The reference takes its
 * gradients at the same inputs, the same selection and kc, vc rounded as the
 * library rounds them. Where the case's k (v) is one tensor for every branch
 * (the corpus's dense and strided layouts), the test passes one view for all
 * branches and one dk (dv) view, and compares it with the sum of the
 * reference's branch gradients; DISTINCT cases get one tensor per branch.
 *
 * A gradient element passes when
 *     |got - ref| <= rms_tol * max(rms(ref tensor), 0.1 rms(dO)) + rel_tol * |ref|
 * (dpe: the floor times sqrt(compressed rows), as it sums them and the keys'
 * sum is 0) with (rms_tol, rel_tol) = (1e-4, 1e-4) for f32, (1e-2, 4e-3) for f16 and
 * (1e-2, 1.6e-2) for bf16: the outputs are rounded once to the dtype (2^-11,
 * 2^-8 relative), and the backend accumulates in f32 between stages.
 * Also checked: bitwise determinism run to run, and (cpu) the same bits on one
 * thread as on several.
 *
 * Usage: test_backward [backend] [modes] [corpus]    (defaults: cpu f32,f16,bf16 small)
 * A backend that is unavailable, or refuses training plans, exits 77 (skipped).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

static const char *g_backend = "cpu";
static const char *g_modes = "f32,f16,bf16";
static const char *g_corpus = "small";
static nsa_context *g_ctx;
static double g_worst[3];
static long g_elems, g_cases;

/* ---- buffers */

typedef struct hostbuf {
    nsa_buffer *buf;
    int64_t n;        /* elements */
    nsa_dtype dtype;
} hostbuf;

static nsa_buffer *upload(nsa_context *ctx, const float *src, int64_t n, nsa_dtype dt)
{
    const size_t es = nsa_dtype_size(dt);
    void *tmp = malloc((size_t)(n ? n : 1) * es);
    ck_assert_ptr_nonnull(tmp);
    ck_assert_int_eq(nsa_convert(src, NSA_DTYPE_F32, tmp, dt, n), NSA_SUCCESS);
    nsa_buffer *b = NULL;
    ck_assert_int_eq(nsa_buffer_alloc(ctx, (size_t)(n ? n : 1) * es, &b), NSA_SUCCESS);
    if (n) ck_assert_int_eq(nsa_buffer_write(b, 0, tmp, (size_t)n * es), NSA_SUCCESS);
    free(tmp);
    return b;
}

static nsa_buffer *poisoned(nsa_context *ctx, int64_t n, nsa_dtype dt)
{
    const size_t bytes = (size_t)(n ? n : 1) * nsa_dtype_size(dt);
    nsa_buffer *b = NULL;
    ck_assert_int_eq(nsa_buffer_alloc(ctx, bytes, &b), NSA_SUCCESS);
    ck_assert_int_eq(nsa_buffer_fill(b, 0, 0xFF, bytes), NSA_SUCCESS);
    return b;
}

/* The buffer's n elements of dtype dt as doubles (malloc'ed). */
static double *download(nsa_buffer *b, int64_t n, nsa_dtype dt)
{
    const size_t es = nsa_dtype_size(dt);
    void *tmp = malloc((size_t)(n ? n : 1) * es);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    double *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    ck_assert(tmp && f && d);
    if (n) {
        ck_assert_int_eq(nsa_buffer_read(b, 0, tmp, (size_t)n * es), NSA_SUCCESS);
        ck_assert_int_eq(nsa_convert(tmp, dt, f, NSA_DTYPE_F32, n), NSA_SUCCESS);
    }
    for (int64_t i = 0; i < n; i++) d[i] = f[i];
    free(tmp);
    free(f);
    return d;
}

static void tolerances(nsa_dtype dt, double *rms_tol, double *rel_tol)
{
    *rms_tol = dt == NSA_DTYPE_F32 ? 1e-4 : 1e-2;
    *rel_tol = dt == NSA_DTYPE_F32 ? 1e-4 : dt == NSA_DTYPE_F16 ? 4e-3 : 1.6e-2;
}

/* got against ref (n elements); fails naming the tensor and element. */
static void compare(const tk_case *c, const char *name, const double *got, const double *ref, int64_t n,
                    double floor)
{
    double rms = 0.0, rt, lt;
    for (int64_t i = 0; i < n; i++) rms += ref[i] * ref[i];
    rms = n ? sqrt(rms / (double)n) : 0.0;
    if (rms < floor) rms = floor; /* a tensor whose gradient is (nearly) 0: judged on dO's scale */
    tolerances(c->cfg.dtype, &rt, &lt);
    char desc[256];
    for (int64_t i = 0; i < n; i++) {
        const double err = fabs(got[i] - ref[i]), tol = rt * rms + lt * fabs(ref[i]) + 1e-30;
        const int d = c->cfg.dtype;
        if (err / tol > g_worst[d]) g_worst[d] = err / tol;
        if (!(err <= tol))
            ck_abort_msg("%s: %s[%lld] = %.9g, reference %.9g (|diff| %.3g > tolerance %.3g; rms %.3g)",
                         tk_case_describe(c, desc, sizeof desc), name, (long long)i, got[i], ref[i], err, tol, rms);
    }
    g_elems += n;
}

/* ---- one case */

typedef struct bwd_out {
    double *t[TK_G_COUNT]; /* in tk_ref64 layout; for shared k/v, t[TK_G_K] holds the sum */
    unsigned char *raw[TK_G_COUNT];
    size_t raw_bytes[TK_G_COUNT];
} bwd_out;

static void bwd_out_free(bwd_out *o)
{
    for (int i = 0; i < TK_G_COUNT; i++) {
        free(o->t[i]);
        free(o->raw[i]);
    }
}

/* Runs the forward (for lse and the selection) and the backward of case c on
 * ctx; returns the gradients. sel receives the selection used (malloc'ed). */
static void run_backward(nsa_context *ctx, const tk_case *c, const tk_inputs *in, const float *dO, int shared,
                         bwd_out *out, int32_t **sel_out)
{
    const nsa_config *g = &c->cfg;
    const nsa_dtype dt = g->dtype;
    const int64_t T = tk_case_tokens(c), Hq = g->num_q_heads, Hkv = g->num_kv_heads, Dk = g->head_dim_qk,
                  Dv = g->head_dim_v, l = g->cmp_block, n = g->num_selected, Nc = in->total_cmp;
    const int on[3] = {1, n > 0, g->window > 0};
    const int lin = g->compress == NSA_COMPRESS_LINEAR, ext = g->compress == NSA_COMPRESS_EXTERNAL;
    char msg[512];

    /* the forward, for the LSEs and the selection */
    tk_output fo;
    nsa_status s = tk_run(ctx, c, in, &fo, msg, sizeof msg);
    ck_assert_msg(s == NSA_SUCCESS, "%s: forward: %s", c->label, msg);
    int32_t *sel = NULL;
    if (n > 0) {
        const int32_t *src = c->fixed_indices ? in->given : fo.sel;
        ck_assert_ptr_nonnull(src);
        sel = malloc((size_t)(T * Hkv * n + 1) * sizeof *sel);
        ck_assert_ptr_nonnull(sel);
        memcpy(sel, src, (size_t)(T * Hkv * n) * sizeof *sel);
    }

    nsa_config cfg = c->cfg;
    cfg.flags |= NSA_CONFIG_TRAINING;
    nsa_plan *plan = NULL;
    s = nsa_plan_create(ctx, &cfg, c->cu_seqlens, c->batch, &plan);
    ck_assert_msg(s == NSA_SUCCESS, "%s: training plan: %s", c->label, nsa_last_error());

    nsa_backward_args a;
    memset(&a, 0, sizeof a);
    nsa_buffer *bufs[64];
    int nb = 0;
#define KEEP(b) (bufs[nb++] = (b))
    a.q = nsa_tensor_dense(KEEP(upload(ctx, in->q, T * Hq * Dk, dt)), 0, Hq, Dk);
    a.dout = nsa_tensor_dense(KEEP(upload(ctx, dO, T * Hq * Dv, dt)), 0, Hq, Dv);
    int first_kv = -1;
    for (int b = 0; b < 3; b++) {
        if (!on[b]) continue;
        a.gate[b] = nsa_tensor_dense(KEEP(upload(ctx, in->gate[b], T * Hq, NSA_DTYPE_F32)), 0, Hq, 1);
        a.lse[b] = nsa_tensor_dense(KEEP(upload(ctx, fo.lse[b], T * Hq, NSA_DTYPE_F32)), 0, Hq, 1);
        a.dgate[b] = nsa_tensor_dense(KEEP(poisoned(ctx, T * Hq, NSA_DTYPE_F32)), 0, Hq, 1);
        if (b == 0 && ext) continue;
        if (shared && first_kv >= 0) { /* one tensor for every branch: the first branch's views */
            a.k[b] = a.k[first_kv];
            a.v[b] = a.v[first_kv];
            a.dk[b] = a.dk[first_kv];
            a.dv[b] = a.dv[first_kv];
            continue;
        }
        a.k[b] = nsa_tensor_dense(KEEP(upload(ctx, in->k[b], T * Hkv * Dk, dt)), 0, Hkv, Dk);
        a.v[b] = nsa_tensor_dense(KEEP(upload(ctx, in->v[b], T * Hkv * Dv, dt)), 0, Hkv, Dv);
        a.dk[b] = nsa_tensor_dense(KEEP(poisoned(ctx, T * Hkv * Dk, dt)), 0, Hkv, Dk);
        a.dv[b] = nsa_tensor_dense(KEEP(poisoned(ctx, T * Hkv * Dv, dt)), 0, Hkv, Dv);
        if (first_kv < 0) first_kv = b;
    }
    if (n > 0) {
        nsa_buffer *ib = NULL;
        ck_assert_int_eq(nsa_buffer_alloc(ctx, (size_t)(T * Hkv * n + 1) * 4, &ib), NSA_SUCCESS);
        KEEP(ib);
        if (T) ck_assert_int_eq(nsa_buffer_write(ib, 0, sel, (size_t)(T * Hkv * n) * 4), NSA_SUCCESS);
        a.block_indices = nsa_tensor_dense(ib, 0, Hkv, n);
    }
    a.dq = nsa_tensor_dense(KEEP(poisoned(ctx, T * Hq * Dk, dt)), 0, Hq, Dk);
    if (lin) {
        a.w_k = nsa_tensor_dense(KEEP(upload(ctx, in->w_k, Hkv * l * Dk * Dk, dt)), 0, 1, 1);
        a.w_v = nsa_tensor_dense(KEEP(upload(ctx, in->w_v, Hkv * l * Dv * Dv, dt)), 0, 1, 1);
        a.dw_k = nsa_tensor_dense(KEEP(poisoned(ctx, Hkv * l * Dk * Dk, dt)), 0, 1, 1);
        a.dw_v = nsa_tensor_dense(KEEP(poisoned(ctx, Hkv * l * Dv * Dv, dt)), 0, 1, 1);
        if (c->use_pe) {
            a.pe_k = nsa_tensor_dense(KEEP(upload(ctx, in->pe_k, Hkv * l * Dk, dt)), 0, 1, 1);
            a.pe_v = nsa_tensor_dense(KEEP(upload(ctx, in->pe_v, Hkv * l * Dv, dt)), 0, 1, 1);
            a.dpe_k = nsa_tensor_dense(KEEP(poisoned(ctx, Hkv * l * Dk, dt)), 0, 1, 1);
            a.dpe_v = nsa_tensor_dense(KEEP(poisoned(ctx, Hkv * l * Dv, dt)), 0, 1, 1);
        }
    }
    if (ext) {
        a.kc = nsa_tensor_dense(KEEP(upload(ctx, in->kc, Nc * Hkv * Dk, dt)), 0, Hkv, Dk);
        a.vc = nsa_tensor_dense(KEEP(upload(ctx, in->vc, Nc * Hkv * Dv, dt)), 0, Hkv, Dv);
        a.dkc = nsa_tensor_dense(KEEP(poisoned(ctx, Nc * Hkv * Dk, dt)), 0, Hkv, Dk);
        a.dvc = nsa_tensor_dense(KEEP(poisoned(ctx, Nc * Hkv * Dv, dt)), 0, Hkv, Dv);
    }
    s = nsa_backward(plan, &a, NULL);
    ck_assert_msg(s == NSA_SUCCESS, "%s: nsa_backward: %s: %s", c->label, nsa_status_string(s), nsa_last_error());
    ck_assert_int_eq(nsa_context_synchronize(ctx), NSA_SUCCESS);

    /* read back in the reference's layout */
    memset(out, 0, sizeof *out);
    const struct { int id; nsa_tensor *t; int64_t n; nsa_dtype dt; } want[] = {
        {TK_G_Q, &a.dq, T * Hq * Dk, dt},
        {TK_G_K + 0, &a.dk[0], T * Hkv * Dk, dt}, {TK_G_K + 1, &a.dk[1], T * Hkv * Dk, dt},
        {TK_G_K + 2, &a.dk[2], T * Hkv * Dk, dt}, {TK_G_V + 0, &a.dv[0], T * Hkv * Dv, dt},
        {TK_G_V + 1, &a.dv[1], T * Hkv * Dv, dt}, {TK_G_V + 2, &a.dv[2], T * Hkv * Dv, dt},
        {TK_G_GATE + 0, &a.dgate[0], T * Hq, NSA_DTYPE_F32}, {TK_G_GATE + 1, &a.dgate[1], T * Hq, NSA_DTYPE_F32},
        {TK_G_GATE + 2, &a.dgate[2], T * Hq, NSA_DTYPE_F32}, {TK_G_WK, &a.dw_k, Hkv * l * Dk * Dk, dt},
        {TK_G_WV, &a.dw_v, Hkv * l * Dv * Dv, dt}, {TK_G_PEK, &a.dpe_k, Hkv * l * Dk, dt},
        {TK_G_PEV, &a.dpe_v, Hkv * l * Dv, dt}, {TK_G_KC, &a.dkc, Nc * Hkv * Dk, dt},
        {TK_G_VC, &a.dvc, Nc * Hkv * Dv, dt},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const int id = want[i].id;
        if (!want[i].t->buffer) continue;
        /* a shared gradient is read once, from its first branch */
        int dup = 0;
        for (size_t j = 0; j < i; j++)
            if (want[j].t->buffer == want[i].t->buffer) dup = 1;
        if (dup) continue;
        out->t[id] = download(want[i].t->buffer, want[i].n, want[i].dt);
        out->raw_bytes[id] = (size_t)want[i].n * nsa_dtype_size(want[i].dt);
        out->raw[id] = malloc(out->raw_bytes[id] + 1);
        ck_assert_ptr_nonnull(out->raw[id]);
        if (want[i].n) ck_assert_int_eq(nsa_buffer_read(want[i].t->buffer, 0, out->raw[id], out->raw_bytes[id]),
                                        NSA_SUCCESS);
    }
    for (int i = 0; i < nb; i++) nsa_buffer_free(bufs[i]);
    nsa_plan_destroy(plan);
    tk_output_free(&fo);
    *sel_out = sel;
#undef KEEP
}

static void check_case(const tk_case *c0, nsa_dtype dt)
{
    tk_case c = *c0;
    tk_case_set_dtype(&c, dt);
    const nsa_config *g = &c.cfg;
    const int64_t T = tk_case_tokens(&c), Hq = g->num_q_heads, Dv = g->head_dim_v, no = T * Hq * Dv;
    const int shared = c.layout != TK_LAYOUT_DISTINCT;
    tk_inputs in;
    ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
    float *dO = malloc((size_t)(no + 1) * sizeof *dO), *tmp16 = malloc((size_t)(no + 1) * 2);
    ck_assert(dO && tmp16);
    ck_assert_int_eq(nsa_random_uniform(c.seed ^ 0xd0d0ULL, 901, 0, no, -1.0f, 1.0f, dO), NSA_SUCCESS);
    if (dt != NSA_DTYPE_F32) { /* dO rounded to the dtype, so both sides see the same values */
        ck_assert_int_eq(nsa_convert(dO, NSA_DTYPE_F32, tmp16, dt, no), NSA_SUCCESS);
        ck_assert_int_eq(nsa_convert(tmp16, dt, dO, NSA_DTYPE_F32, no), NSA_SUCCESS);
    }
    free(tmp16);

    bwd_out got;
    int32_t *sel = NULL;
    run_backward(g_ctx, &c, &in, dO, shared, &got, &sel);

    tk_ref64 x, ref;
    ck_assert_int_eq(tk_ref64_from_inputs(&c, &in, &x), NSA_SUCCESS);
    double *dO64 = malloc((size_t)(no + 1) * sizeof *dO64);
    ck_assert_ptr_nonnull(dO64);
    for (int64_t e = 0; e < no; e++) dO64[e] = dO[e];
    ck_assert_int_eq(tk_ref64_backward(&c, &x, sel, 1, dO64, &ref), NSA_SUCCESS);
    double rms_do = 0.0;
    for (int64_t e = 0; e < no; e++) rms_do += dO64[e] * dO64[e];
    rms_do = no ? sqrt(rms_do / (double)no) : 0.0;
    if (shared) { /* one k (v) tensor for every branch that reads k: its gradient is the sum */
        for (int kv = 0; kv < 2; kv++) {
            const int base = kv ? TK_G_V : TK_G_K;
            int first = -1;
            for (int b = 0; b < 3; b++) {
                if (!ref.t[base + b]) continue;
                if (first < 0) {
                    first = b;
                    continue;
                }
                for (int64_t e = 0; e < ref.n[base + b]; e++) ref.t[base + first][e] += ref.t[base + b][e];
                ref.n[base + b] = 0;
            }
        }
    }
    for (int i = 0; i < TK_G_COUNT; i++) {
        if (!ref.t[i] || ref.n[i] == 0) continue;
        ck_assert_msg(got.t[i] != NULL, "%s: the backend returned no %s", c.label, tk_ref64_name(i));
        /* dpe sums the gradients of every compressed row of the batch, and for keys that
         * sum is 0 (softmax is shift invariant): its error grows as sqrt(rows) */
        const double rows = i == TK_G_PEK || i == TK_G_PEV ? sqrt((double)(in.total_cmp > 1 ? in.total_cmp : 1)) : 1;
        compare(&c, tk_ref64_name(i), got.t[i], ref.t[i], ref.n[i], 0.1 * rms_do * rows);
    }

    /* run to run: the same bits */
    bwd_out again;
    int32_t *sel2 = NULL;
    run_backward(g_ctx, &c, &in, dO, shared, &again, &sel2);
    for (int i = 0; i < TK_G_COUNT; i++)
        if (got.raw[i])
            ck_assert_msg(again.raw[i] && memcmp(got.raw[i], again.raw[i], got.raw_bytes[i]) == 0,
                          "%s: %s differs between two runs", c.label, tk_ref64_name(i));
    bwd_out_free(&again);
    free(sel2);
    g_cases++;

    bwd_out_free(&got);
    free(sel);
    free(dO);
    free(dO64);
    tk_ref64_free(&x);
    tk_ref64_free(&ref);
    tk_inputs_free(&in);
}

static tk_case *g_cases_list;
static int g_ncases;

static void run_mode(nsa_dtype dt)
{
    for (int i = 0; i < g_ncases; i++) {
        if (tk_case_tokens(&g_cases_list[i]) > 700) continue; /* the fp64 reference is O(T^2) */
        check_case(&g_cases_list[i], dt);
    }
}

START_TEST(test_f32) { run_mode(NSA_DTYPE_F32); }
END_TEST
START_TEST(test_f16) { run_mode(NSA_DTYPE_F16); }
END_TEST
START_TEST(test_bf16) { run_mode(NSA_DTYPE_BF16); }
END_TEST

/* cpu: one thread gives the same bits as several (the reductions' order does
 * not depend on who runs them) */
START_TEST(test_threads)
{
    if (strcmp(g_backend, "cpu") != 0) return;
    int done = 0;
    for (int i = 0; i < g_ncases && done < 6; i++) {
        tk_case c = g_cases_list[i];
        if (tk_case_tokens(&c) > 700 || tk_case_tokens(&c) < 8) continue;
        tk_case_set_dtype(&c, NSA_DTYPE_BF16);
        const int64_t no = tk_case_tokens(&c) * c.cfg.num_q_heads * c.cfg.head_dim_v;
        tk_inputs in;
        ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
        float *dO = malloc((size_t)(no + 1) * sizeof *dO);
        ck_assert_ptr_nonnull(dO);
        ck_assert_int_eq(nsa_random_uniform(c.seed, 902, 0, no, -1.0f, 1.0f, dO), NSA_SUCCESS);
        bwd_out r[2];
        int32_t *sel[2];
        for (int k = 0; k < 2; k++) {
            ck_assert_int_eq(nsa_set_cpu_threads(k ? 3 : 1), NSA_SUCCESS);
            nsa_context *ctx = NULL;
            ck_assert_int_eq(nsa_context_create("cpu", 0, &ctx), NSA_SUCCESS);
            run_backward(ctx, &c, &in, dO, c.layout != TK_LAYOUT_DISTINCT, &r[k], &sel[k]);
            nsa_context_destroy(ctx);
        }
        ck_assert_int_eq(nsa_set_cpu_threads(0), NSA_SUCCESS);
        for (int t = 0; t < TK_G_COUNT; t++)
            if (r[0].raw[t])
                ck_assert_msg(r[1].raw[t] && memcmp(r[0].raw[t], r[1].raw[t], r[0].raw_bytes[t]) == 0,
                              "%s: %s differs between 1 and 3 threads", c.label, tk_ref64_name(t));
        for (int k = 0; k < 2; k++) {
            bwd_out_free(&r[k]);
            free(sel[k]);
        }
        free(dO);
        tk_inputs_free(&in);
        done++;
    }
    ck_assert_int_ge(done, 3);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc > 1) g_backend = argv[1];
    if (argc > 2) g_modes = argv[2];
    if (argc > 3) g_corpus = argv[3];
    if (nsa_context_create(g_backend, 0, &g_ctx) != NSA_SUCCESS) {
        printf("SKIP: backend %s: %s\n", g_backend, nsa_last_error());
        return 77;
    }
    {   /* does the backend take training plans? */
        nsa_config cfg;
        nsa_config_init(&cfg);
        cfg.num_q_heads = 2;
        cfg.num_kv_heads = 1;
        cfg.head_dim_qk = cfg.head_dim_v = 8;
        cfg.flags = NSA_CONFIG_TRAINING;
        const int64_t cu[2] = {0, 64};
        nsa_plan *p = NULL;
        nsa_status s = nsa_plan_create(g_ctx, &cfg, cu, 1, &p);
        if (s == NSA_ERR_UNSUPPORTED) {
            printf("SKIP: backend %s has no backward: %s\n", g_backend, nsa_last_error());
            nsa_context_destroy(g_ctx);
            return 77;
        }
        nsa_plan_destroy(p);
    }
    g_ncases = tk_corpus(g_corpus, &g_cases_list);
    if (g_ncases < 0) {
        printf("unknown corpus %s\n", g_corpus);
        return 2;
    }
    Suite *su = suite_create("backward");
    TCase *tc = tcase_create("backward");
    tcase_set_timeout(tc, 1800);
    if (strstr(g_modes, "f32")) tcase_add_test(tc, test_f32);
    if (strstr(g_modes, "f16")) tcase_add_test(tc, test_f16);
    if (strstr(g_modes, "bf16")) tcase_add_test(tc, test_bf16);
    tcase_add_test(tc, test_threads);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    printf("backward-%s: %ld cases, %ld gradient elements; worst error / tolerance f32 %.3g, f16 %.3g, bf16 %.3g\n",
           g_backend, g_cases, g_elems, g_worst[NSA_DTYPE_F32], g_worst[NSA_DTYPE_F16], g_worst[NSA_DTYPE_BF16]);
    free(g_cases_list);
    nsa_context_destroy(g_ctx);
    return failed ? 1 : 0;
}
