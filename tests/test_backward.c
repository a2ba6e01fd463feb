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
 * The comparison and its tolerances are the testkit's (tk_compare_grads).
 * Also checked: bitwise determinism run to run, and (cpu) the same bits on one
 * thread as on several.
 *
 * Usage: test_backward [backend] [modes] [corpus]    (defaults: cpu f32,f16,bf16,f64 small)
 * A backend that is unavailable, or refuses training plans, exits 77 (skipped).
 * Mode f64 (tolerance 1e-10, semantics 7 "f64") is reported skipped on a backend
 * that refuses f64 plans (every GPU backend) and must run on cpu.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

static const char *g_backend = "cpu";
static const char *g_modes = "f32,f16,bf16,f64";
static const char *g_corpus = "small";
static nsa_context *g_ctx;
static double g_worst[NSA_DTYPE_F64 + 1]; /* by dtype */
static long g_elems, g_cases;

/* The forward on ctx for the LSEs and the selection, then the backward. */
static void run_backward(nsa_context *ctx, const tk_case *c, const tk_inputs *in, const float *dO, tk_grads *got,
                         int32_t **sel_out)
{
    char msg[1024];
    tk_output fo;
    nsa_status s = tk_run(ctx, c, in, &fo, msg, sizeof msg);
    ck_assert_msg(s == NSA_SUCCESS, "%s: forward: %s", c->label, msg);
    const int64_t T = tk_case_tokens(c), Hkv = c->cfg.num_kv_heads, n = c->cfg.num_selected;
    int32_t *sel = NULL;
    if (n > 0) {
        const int32_t *src = c->fixed_indices ? in->given : fo.sel;
        ck_assert_ptr_nonnull(src);
        sel = malloc((size_t)(T * Hkv * n + 1) * sizeof *sel);
        ck_assert_ptr_nonnull(sel);
        memcpy(sel, src, (size_t)(T * Hkv * n) * sizeof *sel);
    }
    s = tk_run_backward(ctx, c, in, dO, fo.lse_d, sel, got, msg, sizeof msg);
    ck_assert_msg(s == NSA_SUCCESS, "%s: %s", c->label, msg);
    tk_output_free(&fo);
    *sel_out = sel;
}

/* dO for case c: uniform [-1, 1) from its seed, rounded to the dtype. */
static float *draw_dout(const tk_case *c, uint64_t stream)
{
    float *dO = NULL;
    ck_assert_int_eq(tk_dout_make(c, c->seed ^ 0xd0d0ULL, stream, &dO), NSA_SUCCESS);
    return dO;
}

static void scale_inputs(const tk_case *c, tk_inputs *in, float *dO, const int *e);

/* Case c0 in dtype dt against the fp64 reference, its inputs first scaled by
 * powers of two (scale_inputs) where pw is given, and the tolerance's floor
 * (tk_compare_grads: a tenth of dO's RMS) raised by 2^pw[5]. */
static void check_case_scaled(const tk_case *c0, nsa_dtype dt, const int *pw)
{
    tk_case c = *c0;
    tk_case_set_dtype(&c, dt);
    const int64_t no = tk_case_tokens(&c) * c.cfg.num_q_heads * c.cfg.head_dim_v;
    tk_inputs in;
    ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
    float *dO = draw_dout(&c, 901);
    if (pw) scale_inputs(&c, &in, dO, pw);
    tk_grads got;
    int32_t *sel = NULL;
    run_backward(g_ctx, &c, &in, dO, &got, &sel);

    tk_ref64 x, ref;
    ck_assert_int_eq(tk_ref64_from_inputs(&c, &in, &x), NSA_SUCCESS);
    double *dO64 = malloc((size_t)(no + 1) * sizeof *dO64), rms_do = 0.0;
    ck_assert_ptr_nonnull(dO64);
    for (int64_t e = 0; e < no; e++) {
        dO64[e] = dO[e];
        rms_do += dO64[e] * dO64[e];
    }
    rms_do = no ? sqrt(rms_do / (double)no) : 0.0;
    if (pw) rms_do = ldexp(rms_do, pw[5]);
    ck_assert_int_eq(tk_ref64_backward(&c, &x, sel, 1, dO64, &ref), NSA_SUCCESS);
    if (got.shared) tk_ref64_sum_shared(&ref);
    tk_grad_verdict v;
    tk_compare_grads(&c, &got, &ref, rms_do, in.total_cmp, &v);
    char desc[256];
    ck_assert_msg(v.pass, "%s: %s", tk_case_describe(&c, desc, sizeof desc), v.msg);
    if (v.worst > g_worst[dt]) g_worst[dt] = v.worst;
    g_elems += v.elements;

    /* run to run: the same bits */
    tk_grads again;
    int32_t *sel2 = NULL;
    run_backward(g_ctx, &c, &in, dO, &again, &sel2);
    for (int i = 0; i < TK_G_COUNT; i++)
        if (got.raw[i])
            ck_assert_msg(again.raw[i] && memcmp(got.raw[i], again.raw[i], got.raw_bytes[i]) == 0,
                          "%s: %s differs between two runs", c.label, tk_ref64_name(i));
    tk_grads_free(&again);
    free(sel2);
    g_cases++;

    tk_grads_free(&got);
    free(sel);
    free(dO);
    free(dO64);
    tk_ref64_free(&x);
    tk_ref64_free(&ref);
    tk_inputs_free(&in);
}

static void check_case(const tk_case *c0, nsa_dtype dt) { check_case_scaled(c0, dt, NULL); }

static tk_case *g_cases_list;
static int g_ncases;

/* Scales the case's q, keys, values, gates and dO by 2^e[0..4] (each distinct
 * array once: branches that share k or v share the pointer). */
static void scale_inputs(const tk_case *c, tk_inputs *in, float *dO, const int *e)
{
    const int64_t T = tk_case_tokens(c), Hq = c->cfg.num_q_heads, Hkv = c->cfg.num_kv_heads;
    const int64_t nq = T * Hq * c->cfg.head_dim_qk, nk = T * Hkv * c->cfg.head_dim_qk;
    const int64_t nv = T * Hkv * c->cfg.head_dim_v, no = T * Hq * c->cfg.head_dim_v;
    for (int64_t i = 0; i < nq; i++) in->q[i] = ldexpf(in->q[i], e[0]);
    for (int b = 0; b < 3; b++) {
        int dup_k = 0, dup_v = 0;
        for (int j = 0; j < b; j++) {
            dup_k |= in->k[j] == in->k[b];
            dup_v |= in->v[j] == in->v[b];
        }
        if (in->k[b] && !dup_k)
            for (int64_t i = 0; i < nk; i++) in->k[b][i] = ldexpf(in->k[b][i], e[1]);
        if (in->v[b] && !dup_v)
            for (int64_t i = 0; i < nv; i++) in->v[b][i] = ldexpf(in->v[b][i], e[2]);
        if (in->gate[b])
            for (int64_t i = 0; i < T * Hq; i++) in->gate[b][i] = ldexpf(in->gate[b][i], e[3]);
    }
    for (int64_t i = 0; i < no; i++) dO[i] = ldexpf(dO[i], e[4]);
}

/* bf16 MEAN cases of the corpus (T <= 700), up to max of them, spread over it */
static int pick_mean_cases(int max, int *idx)
{
    int n = 0, seen = 0;
    for (int i = 0; i < g_ncases; i++) {
        const tk_case *c = &g_cases_list[i];
        if (c->cfg.compress != NSA_COMPRESS_MEAN || tk_case_tokens(c) > 700 || c->fixed_indices) continue;
        if (seen++ % 3 == 0 && n < max) idx[n++] = i;
    }
    return n;
}

/* The backward commutes with powers of two (semantics section 9: a bf16
 * kernel may scale its operands by powers of two, every factor undone in
 * fp32). With q, k, v, the gates and dO of a MEAN case scaled by 2^-8, 2^8,
 * 2^6, 2^10, 2^-10, every gradient is the unscaled run's times its power,
 * bit for bit: dq 2^14, dk 2^-2, dv 2^0, dgate 2^-4 (ds = g p (dO . v - dg)
 * scales by 2^6, dg by 2^-4). */
START_TEST(test_bf16_pow2)
{
    static const int e[5] = {-8, 8, 6, 10, -10};
    int idx[8];
    const int n = pick_mean_cases(8, idx);
    ck_assert_int_ge(n, 3);
    for (int ci = 0; ci < n; ci++) {
        tk_case c = g_cases_list[idx[ci]];
        tk_case_set_dtype(&c, NSA_DTYPE_BF16);
        tk_inputs in;
        ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
        float *dO = draw_dout(&c, 903);
        tk_grads g0, g1;
        int32_t *s0 = NULL, *s1 = NULL;
        run_backward(g_ctx, &c, &in, dO, &g0, &s0);
        scale_inputs(&c, &in, dO, e);
        run_backward(g_ctx, &c, &in, dO, &g1, &s1);
        const int64_t ns = tk_case_tokens(&c) * c.cfg.num_kv_heads * c.cfg.num_selected;
        if (ns > 0) ck_assert_msg(memcmp(s0, s1, (size_t)ns * sizeof *s0) == 0, "%s: the selection changed", c.label);
        int checked = 0;
        for (int i = 0; i < TK_G_COUNT; i++) {
            if (!g0.t[i] || g0.n[i] == 0) continue;
            ck_assert_int_eq(g1.n[i], g0.n[i]);
            const int pw = i == TK_G_Q ? 14 : i < TK_G_V ? -2 : i < TK_G_GATE ? 0 : -4;
            ck_assert_msg(i <= TK_G_GATE + 2, "%s: unexpected gradient %s", c.label, tk_ref64_name(i));
            for (int64_t x = 0; x < g0.n[i]; x++)
                ck_assert_msg(g1.t[i][x] == ldexp(g0.t[i][x], pw), "%s: %s[%lld] = %.9g scaled, %.9g x 2^%d unscaled",
                              c.label, tk_ref64_name(i), (long long)x, g1.t[i][x], g0.t[i][x], pw);
            checked++;
        }
        ck_assert_int_ge(checked, 3);
        tk_grads_free(&g0);
        tk_grads_free(&g1);
        free(s0);
        free(s1);
        free(dO);
        tk_inputs_free(&in);
    }
}
END_TEST

/* q at 2^60 and the keys at 2^-60 (the same logits): past the range of the
 * CUDA backend's f16 operands (bwd_f16.cu), whose bf16 kernels then run;
 * the gradients still meet the reference. dk is 2^60 times its usual size,
 * and so is its rounding error where it cancels to 0 (a one-key row has
 * ds = p (e - dg) = 0 exactly, p = 1 only to rounding), so the floor is
 * raised by 2^60: the check then bears on dk alone. */
START_TEST(test_bf16_far_range)
{
    static const int e[6] = {60, -60, 0, 0, 0, 60};
    int idx[4];
    const int n = pick_mean_cases(4, idx);
    ck_assert_int_ge(n, 2);
    for (int ci = 0; ci < n; ci++) check_case_scaled(&g_cases_list[idx[ci]], NSA_DTYPE_BF16, e);
}
END_TEST

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
START_TEST(test_f64)
{
    /* a backend without f64 refuses the plan, naming itself and the dtype */
    nsa_config cfg;
    nsa_config_init(&cfg);
    cfg.num_q_heads = 2;
    cfg.num_kv_heads = 1;
    cfg.head_dim_qk = cfg.head_dim_v = 8;
    cfg.dtype = NSA_DTYPE_F64;
    cfg.flags = NSA_CONFIG_TRAINING;
    const int64_t cu[2] = {0, 64};
    nsa_plan *p = NULL;
    const nsa_status s = nsa_plan_create(g_ctx, &cfg, cu, 1, &p);
    char m[1024];
    snprintf(m, sizeof m, "%s", nsa_last_error());
    nsa_plan_destroy(p);
    if (s == NSA_ERR_UNSUPPORTED && strcmp(nsa_context_backend(g_ctx), "cpu") != 0) {
        ck_assert_msg(strstr(m, "f64") && strstr(m, nsa_context_backend(g_ctx)),
                      "the refusal of f64 must name the dtype and the backend: %s", m);
        printf("backward-%s f64: SKIPPED, the backend does not support f64 (%s)\n", g_backend, m);
        return;
    }
    ck_assert_msg(s == NSA_SUCCESS, "nsa_plan_create (f64 training): %s: %s", nsa_status_string(s), m);
    run_mode(NSA_DTYPE_F64);
}
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
        tk_inputs in;
        ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
        float *dO = draw_dout(&c, 902);
        tk_grads r[2];
        int32_t *sel[2];
        for (int k = 0; k < 2; k++) {
            ck_assert_int_eq(nsa_set_cpu_threads(k ? 3 : 1), NSA_SUCCESS);
            nsa_context *ctx = NULL;
            ck_assert_int_eq(nsa_context_create("cpu", 0, &ctx), NSA_SUCCESS);
            run_backward(ctx, &c, &in, dO, &r[k], &sel[k]);
            nsa_context_destroy(ctx);
        }
        ck_assert_int_eq(nsa_set_cpu_threads(0), NSA_SUCCESS);
        for (int t = 0; t < TK_G_COUNT; t++)
            if (r[0].raw[t])
                ck_assert_msg(r[1].raw[t] && memcmp(r[0].raw[t], r[1].raw[t], r[0].raw_bytes[t]) == 0,
                              "%s: %s differs between 1 and 3 threads", c.label, tk_ref64_name(t));
        for (int k = 0; k < 2; k++) {
            tk_grads_free(&r[k]);
            free(sel[k]);
        }
        free(dO);
        tk_inputs_free(&in);
        done++;
    }
    ck_assert_int_ge(done, 3);
}
END_TEST

/* The backward stages a training plan lists (nsa_plan_info.bwd_stages, the
 * order of semantics section 9) and their kernels through
 * nsa_plan_stage_kernel past the forward's indices; a plan made without
 * NSA_CONFIG_TRAINING lists none and refuses those indices. */
START_TEST(test_stage_kernels)
{
    static const struct {
        int64_t n, w;
        nsa_compress_mode compress;
        int training;
        const char *want;
    } cases[] = {
        {4, 32, NSA_COMPRESS_MEAN, 1, "compress bwd_cmp_attn bwd_compress bwd_slc_attn bwd_win_attn bwd_store"},
        {0, 0, NSA_COMPRESS_MEAN, 1, "compress bwd_cmp_attn bwd_compress bwd_store"},
        {4, 0, NSA_COMPRESS_EXTERNAL, 1, "compress bwd_cmp_attn bwd_slc_attn bwd_store"},
        {4, 32, NSA_COMPRESS_MEAN, 0, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nsa_config cfg;
        nsa_config_init(&cfg);
        cfg.num_q_heads = 4;
        cfg.num_kv_heads = 2;
        cfg.head_dim_qk = 32;
        cfg.head_dim_v = 16;
        cfg.cmp_block = 16;
        cfg.cmp_stride = 8;
        cfg.slc_block = 16;
        cfg.num_selected = cases[i].n;
        cfg.num_init = cases[i].n ? 1 : 0;
        cfg.num_local = cases[i].n ? 1 : 0;
        cfg.window = cases[i].w;
        cfg.compress = cases[i].compress;
        cfg.flags = cases[i].training ? NSA_CONFIG_TRAINING : 0;
        const int64_t cu[3] = {0, 100, 170};
        nsa_plan *p = NULL;
        nsa_status s = nsa_plan_create(g_ctx, &cfg, cu, 2, &p);
        if (s == NSA_ERR_UNSUPPORTED) continue; /* a configuration this backend lacks */
        ck_assert_msg(s == NSA_SUCCESS, "case %zu: nsa_plan_create: %s", i, nsa_last_error());
        nsa_plan_info info;
        ck_assert_int_eq(nsa_plan_get_info(p, &info), NSA_SUCCESS);
        ck_assert_str_eq(info.bwd_stages, cases[i].want);
        int words = 0;
        for (const char *q = cases[i].want; *q; q++) words += (q == cases[i].want || q[-1] == ' ') && *q != ' ';
        ck_assert_int_eq(info.num_bwd_stages, words);
        const char *q = info.bwd_stages;
        for (int k = 0; k < info.num_bwd_stages; k++) {
            char name[NSA_NAME_MAX];
            ck_assert_msg(nsa_plan_stage_kernel(p, info.num_stages + k, name, sizeof name) == NSA_SUCCESS,
                          "case %zu, backward stage %d: %s", i, k, nsa_last_error());
            ck_assert_msg(name[0] != '\0', "case %zu, backward stage %d: empty kernel name", i, k);
            const size_t len = strcspn(q, " ");
            /* the other backends report the stage's name, or (opencl's compress) their kernel's, which
             * starts with it; cuda's backward kernels are named by family (bwd_attn_sm80) */
            if (strcmp(g_backend, "cuda") != 0)
                ck_assert_msg(strncmp(name, q, len) == 0 && (name[len] == '\0' || name[len] == '_'),
                              "case %zu: stage %.*s reports %s", i, (int)len, q, name);
            q += len;
            while (*q == ' ') q++;
        }
        char name[8];
        ck_assert_int_eq(nsa_plan_stage_kernel(p, info.num_stages + info.num_bwd_stages, name, sizeof name),
                         NSA_ERR_INVALID_VALUE);
        ck_assert_ptr_nonnull(strstr(nsa_last_error(), "backward"));
        ck_assert_int_eq(nsa_plan_stage_kernel(p, -1, name, sizeof name), NSA_ERR_INVALID_VALUE);
        nsa_plan_destroy(p);
    }
}
END_TEST

/* Is name one of the comma-separated items of g_modes? */
static int has_mode(const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = g_modes; *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        p += len + (end ? 1 : 0);
    }
    return 0;
}

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
    if (has_mode("f32")) tcase_add_test(tc, test_f32);
    if (has_mode("f16")) tcase_add_test(tc, test_f16);
    if (has_mode("bf16")) {
        tcase_add_test(tc, test_bf16);
        tcase_add_test(tc, test_bf16_pow2);
        tcase_add_test(tc, test_bf16_far_range);
    }
    if (has_mode("f64")) tcase_add_test(tc, test_f64);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_stage_kernels);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    printf("backward-%s: %ld cases, %ld gradient elements; worst error / tolerance f32 %.3g, f16 %.3g, bf16 %.3g, "
           "f64 %.3g\n",
           g_backend, g_cases, g_elems, g_worst[NSA_DTYPE_F32], g_worst[NSA_DTYPE_F16], g_worst[NSA_DTYPE_BF16],
           g_worst[NSA_DTYPE_F64]);
    free(g_cases_list);
    nsa_context_destroy(g_ctx);
    return failed ? 1 : 0;
}
