/*
 * The per-backend parity test: every configuration of the corpus, in every
 * dtype and in the fixed-indices mode, against the fp64 oracle of tests/common.
 *
 *   test_oracle <backend> [modes] [corpus]
 *     backend  cpu | opencl | cuda | hip  (a name nsa_context_create accepts)
 *     modes    comma list of f32, f16, bf16, fixed, f64  (default: all five; f64
 *              is reported skipped on a backend that refuses it, as every GPU
 *              backend does, and must run on cpu)
 *     corpus   full | small | gpu                   (default: full; the environment
 *              variable NSA_TEST_CORPUS overrides, for sanitizer runs; gpu, the
 *              model sizes, checks about 256 sampled tokens per sequence against
 *              the oracle, and its summary lines say how many: "rows checked")
 *   NSA_TEST_CASE=substring runs only the cases whose label contains it.
 *
 * Exit status 77 (meson's "skipped") when the backend is unavailable on this
 * machine: an absent backend never passes. One binary, registered once per
 * backend by tests/meson.build.
 *
 * Runs without fork (CK_NOFORK): GPU runtimes do not survive fork(), and a single
 * context is shared by all the tests of the run.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

static const char *g_backend;
static const char *g_corpus = "full";
static nsa_context *g_ctx;
static tk_case *g_cases;
static int g_ncases;
static char g_modes[256] = ",f32,f16,bf16,fixed,f64,"; /* the run's modes, comma-framed */

/* The dtypes the determinism and NaN-rule checks run in: f32 (also asked for by
 * "fixed") and bf16, as far as the run's modes ask for them, else f16 if asked.
 * A run limited to 16-bit modes (a forced tensor-core kernel, which refuses f32
 * plans by design) thus checks them in its own dtypes. Returns the count. */
static int check_dtypes(nsa_dtype out[2])
{
    int n = 0;
    if (strstr(g_modes, ",f32,") || strstr(g_modes, ",fixed,")) out[n++] = NSA_DTYPE_F32;
    if (strstr(g_modes, ",bf16,")) out[n++] = NSA_DTYPE_BF16;
    if (n == 0 && strstr(g_modes, ",f16,")) out[n++] = NSA_DTYPE_F16;
    return n;
}

/* Runs the corpus in one dtype; fixed: force caller-given indices on every case
 * with a selected branch. */
static void run_corpus(nsa_dtype dtype, int fixed, const char *title)
{
    const char *filter = getenv("NSA_TEST_CASE");
    tk_stats st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < g_ncases; ++i) {
        tk_case c = g_cases[i];
        if (filter && !strstr(c.label, filter)) continue;
        tk_case_set_dtype(&c, dtype);
        if (fixed) {
            if (c.cfg.num_selected == 0) continue;
            c.fixed_indices = 1;
        }
        tk_verdict v;
        tk_check_case(g_ctx, &c, &v);
        tk_stats_add(&st, &c, &v);
        if (!v.pass) {
            char desc[512];
            fprintf(stderr, "FAIL %s\n     %s\n", tk_case_describe(&c, desc, sizeof desc), v.msg);
        }
    }
    char full_title[128];
    snprintf(full_title, sizeof full_title, "parity-%s %s (%s corpus)", g_backend, title, g_corpus);
    tk_stats_print(stdout, full_title, &st);
    fflush(stdout);
    ck_assert_msg(st.run > 0 || filter, "no configuration ran");
    ck_assert_msg(st.unsupported == 0 || getenv("NSA_TEST_ALLOW_UNSUPPORTED"),
                  "%s: %d configurations unsupported by the backend (first: %s)", title, st.unsupported,
                  st.first_failure);
    int real_failures = getenv("NSA_TEST_ALLOW_UNSUPPORTED") ? st.failed - st.unsupported : st.failed;
    ck_assert_msg(real_failures == 0, "%s: %d of %d configurations failed; first: %s", title, st.failed, st.run,
                  st.first_failure);
}

START_TEST(test_f32)
{
    run_corpus(NSA_DTYPE_F32, 0, "f32");
}
END_TEST

START_TEST(test_f16)
{
    run_corpus(NSA_DTYPE_F16, 0, "f16");
}
END_TEST

START_TEST(test_bf16)
{
    run_corpus(NSA_DTYPE_BF16, 0, "bf16");
}
END_TEST

START_TEST(test_fixed)
{
    run_corpus(NSA_DTYPE_F32, 1, "fixed-indices f32");
}
END_TEST

/* f64 (semantics 7, "f64"): where the backend has it, the corpus against the
 * oracle with fp64 tolerances (1e-12 of the output scale), and the
 * fixed-indices mode; where it does not, nsa_plan_create must refuse it with
 * NSA_ERR_UNSUPPORTED naming the backend and the dtype, and the mode is
 * reported skipped. The cpu backend must have it. */
START_TEST(test_f64)
{
    tk_case c = g_cases[0];
    tk_case_set_dtype(&c, NSA_DTYPE_F64);
    nsa_plan *plan = NULL;
    nsa_status s = nsa_plan_create(g_ctx, &c.cfg, c.cu_seqlens, c.batch, &plan);
    char m[TK_MSG_MAX];
    snprintf(m, sizeof m, "%s", nsa_last_error());
    nsa_plan_destroy(plan);
    if (s == NSA_ERR_UNSUPPORTED && strcmp(nsa_context_backend(g_ctx), "cpu") != 0) {
        ck_assert_msg(strstr(m, "f64") && strstr(m, nsa_context_backend(g_ctx)),
                      "the refusal of f64 must name the dtype and the backend: %s", m);
        printf("parity-%s f64: SKIPPED, the backend does not support f64 (%s)\n", g_backend, m);
        fflush(stdout);
        return;
    }
    ck_assert_msg(s == NSA_SUCCESS, "nsa_plan_create (f64): %s: %s", nsa_status_string(s), m);
    run_corpus(NSA_DTYPE_F64, 0, "f64");
    run_corpus(NSA_DTYPE_F64, 1, "fixed-indices f64");
}
END_TEST

/* Bitwise reproducibility: the same case twice gives the same bytes. Uses a
 * varlen, strided and a long case (the gpu corpus: a packed G = 4 batch), in two dtypes. */
START_TEST(test_determinism)
{
    static const char *labels[] = {"B8-mixed", "strided-ext", "long1000", "s-strided", "s-varlen", "g-G4-packed"};
    nsa_dtype dtypes[2];
    const int nd = check_dtypes(dtypes);
    if (nd == 0) {
        printf("parity-%s determinism: SKIPPED, no f32, f16 or bf16 mode asked for\n", g_backend);
        return;
    }
    int checked = 0;
    for (int i = 0; i < g_ncases; ++i)
        for (size_t k = 0; k < sizeof labels / sizeof labels[0]; ++k) {
            if (strcmp(g_cases[i].label, labels[k]) != 0) continue;
            for (int d = 0; d < nd; ++d) {
                tk_case c = g_cases[i];
                tk_case_set_dtype(&c, dtypes[d]);
                char msg[TK_MSG_MAX];
                int same = tk_check_determinism(g_ctx, &c, msg, sizeof msg);
                ck_assert_msg(same, "%s (%s)", msg, nsa_dtype_name(dtypes[d]));
                ++checked;
            }
        }
    printf("parity-%s determinism: %d runs pairs bitwise identical\n", g_backend, checked);
    ck_assert_msg(checked > 0, "no determinism case found in the corpus");
}
END_TEST

/* The NaN rule (docs/nsa-semantics.md, "Non-finite inputs"): a NaN in an input
 * makes NaN every output row its arithmetic reaches, and no other. A NaN in
 * q(t, h) reaches row (t, h) of o only (and of the LSE of each branch that
 * sees a key there: the LSEs' NaN pattern must be the cpu backend's); a NaN
 * in k(s, g) reaches whole rows of KV group g only, row (s, h in g) always
 * (the window), others as the selection has it. */
static int row_nan(const float *x, int64_t row, int64_t n)
{
    int any = 0, all = 1;
    for (int64_t e = 0; e < n; e++) {
        const int isn = x[row * n + e] != x[row * n + e];
        any |= isn;
        all &= isn;
    }
    return any ? (all ? 1 : 2) : 0; /* 2: a partly NaN row */
}

static int nonfinite_case(const tk_case *c0, nsa_dtype dt, int where_k, nsa_context *cpu, char *msg, size_t size)
{
    tk_case c = *c0;
    tk_case_set_dtype(&c, dt);
    const int64_t T = c.cu_seqlens[c.batch], Hq = c.cfg.num_q_heads, Hkv = c.cfg.num_kv_heads;
    const int64_t G = Hq / Hkv, Dqk = c.cfg.head_dim_qk, Dv = c.cfg.head_dim_v;
    const int64_t t = T / 2, h = Hq - 1, gk = Hkv - 1;
    tk_inputs in;
    tk_output out, ref;
    memset(&out, 0, sizeof out);
    memset(&ref, 0, sizeof ref);
    int ok = 0;
    if (tk_inputs_make(&c, &in) != NSA_SUCCESS) return snprintf(msg, size, "inputs"), 0;
    if (where_k) {
        for (int b = 0; b < 3; b++)
            if (in.k[b]) in.k[b][(t * Hkv + gk) * Dqk] = NAN;
    } else {
        in.q[(t * Hq + h) * Dqk] = NAN;
    }
    char m2[TK_MSG_MAX];
    if (tk_run(g_ctx, &c, &in, &out, m2, sizeof m2) != NSA_SUCCESS) {
        snprintf(msg, size, "%.900s", m2);
        goto done;
    }
    if (tk_run(cpu, &c, &in, &ref, m2, sizeof m2) != NSA_SUCCESS) {
        snprintf(msg, size, "cpu: %.900s", m2);
        goto done;
    }
    int64_t nan_rows = 0;
    for (int64_t r = 0; r < T * Hq; r++) {
        const int64_t rt = r / Hq, rh = r % Hq;
        const int got = row_nan(out.o, r, Dv);
        /* k: rows of group gk may be NaN (which ones depends on the selection, where
         * the ranking of NaN scores is unspecified); the token's own row is (window) */
        const int want = where_k ? (rh / G == gk && (got != 0 || rt == t)) : (rt == t && rh == h);
        nan_rows += got != 0;
        if (got != want || (!where_k && row_nan(ref.o, r, Dv) != want)) {
            snprintf(msg, size, "o row (token %lld, head %lld): %s, expected %s", (long long)rt, (long long)rh,
                     got == 2 ? "partly NaN" : got ? "NaN" : "finite", want == 2 ? "partly NaN" : want ? "NaN" : "finite");
            goto done;
        }
        for (int b = 0; b < 3; b++) {
            if (!out.lse[b]) continue;
            const int lg = out.lse[b][r] != out.lse[b][r];
            const int lw = where_k ? lg : ref.lse[b][r] != ref.lse[b][r];
            if (lg != lw) {
                snprintf(msg, size, "lse[%d] row (token %lld, head %lld): %s, expected %s", b, (long long)rt,
                         (long long)rh, lg ? "NaN" : "not NaN", lw ? "NaN" : "not NaN");
                goto done;
            }
        }
    }
    if (nan_rows == 0) {
        snprintf(msg, size, "no NaN row at all");
        goto done;
    }
    ok = 1;
done:
    tk_output_free(&out);
    tk_output_free(&ref);
    tk_inputs_free(&in);
    return ok;
}

START_TEST(test_nonfinite)
{
    nsa_context *cpu = NULL;
    ck_assert_int_eq(nsa_context_create("cpu", 0, &cpu), NSA_SUCCESS);
    nsa_dtype dts[2];
    const int nd = check_dtypes(dts);
    int checked = 0;
    for (int i = 0; i < g_ncases && checked < 12 && nd > 0; ++i) {
        const tk_case *c = &g_cases[i];
        /* cases with a branch of each kind, at least 16 tokens, and small enough that the cpu backend's two
         * reference runs per case stay short: the rule is about propagation, which any size shows (the gpu
         * corpus's 8192-token cases took minutes on the cpu backend; every small and full case is far below) */
        const double work = (double)c->cu_seqlens[c->batch] * (double)c->cfg.num_q_heads * (double)c->cfg.head_dim_qk;
        if (c->cfg.num_selected == 0 || c->cfg.window == 0 || c->cu_seqlens[c->batch] < 16 || work > 4194304.0)
            continue;
        for (int d = 0; d < nd; d++)
            for (int wk = 0; wk < 2; wk++) {
                char msg[TK_MSG_MAX];
                ck_assert_msg(nonfinite_case(c, dts[d], wk, cpu, msg, sizeof msg), "%s, %s, NaN in %s: %s", c->label,
                              nsa_dtype_name(dts[d]), wk ? "k" : "q", msg);
                ++checked;
            }
    }
    nsa_context_destroy(cpu);
    if (nd == 0) {
        printf("parity-%s NaN rule: SKIPPED, no f32, f16 or bf16 mode asked for\n", g_backend);
        return;
    }
    printf("parity-%s NaN rule: %d runs (NaN in q, NaN in k; %s%s%s)\n", g_backend, checked, nsa_dtype_name(dts[0]),
           nd > 1 ? ", " : "", nd > 1 ? nsa_dtype_name(dts[1]) : "");
    ck_assert_msg(checked > 0, "no case with all three branches in the corpus");
}
END_TEST

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s <backend> [f32,f16,bf16,fixed,f64] [full|small]\n", argv[0]);
        return 2;
    }
    g_backend = argv[1];
    const char *modes = argc > 2 ? argv[2] : "f32,f16,bf16,fixed,f64";
    snprintf(g_modes, sizeof g_modes, ",%s,", modes);
    if (argc > 3) g_corpus = argv[3];
    if (getenv("NSA_TEST_CORPUS") && *getenv("NSA_TEST_CORPUS")) g_corpus = getenv("NSA_TEST_CORPUS");

    nsa_status s = nsa_context_create(g_backend, -1, &g_ctx);
    if (s == NSA_ERR_BACKEND_UNAVAILABLE) {
        printf("SKIP: backend '%s' unavailable here: %s\n", g_backend, nsa_last_error());
        return 77;
    }
    if (s != NSA_SUCCESS) {
        fprintf(stderr, "nsa_context_create(%s): %s: %s\n", g_backend, nsa_status_string(s), nsa_last_error());
        return 1;
    }
    printf("backend %s, device %s\n", nsa_context_backend(g_ctx), nsa_context_device(g_ctx));
    g_ncases = tk_corpus(g_corpus, &g_cases);
    if (g_ncases <= 0) {
        fprintf(stderr, "unknown corpus '%s'\n", g_corpus);
        nsa_context_destroy(g_ctx);
        return 2;
    }
    printf("%s corpus: %d configurations\n", g_corpus, g_ncases);

    Suite *suite = suite_create("parity");
    TCase *tc = tcase_create(g_backend);
    tcase_set_timeout(tc, 0);
    tcase_add_test(tc, test_determinism);
    tcase_add_test(tc, test_nonfinite);
    char buf[128];
    snprintf(buf, sizeof buf, ",%s,", modes);
    if (strstr(buf, ",f32,")) tcase_add_test(tc, test_f32);
    if (strstr(buf, ",f16,")) tcase_add_test(tc, test_f16);
    if (strstr(buf, ",bf16,")) tcase_add_test(tc, test_bf16);
    if (strstr(buf, ",fixed,")) tcase_add_test(tc, test_fixed);
    if (strstr(buf, ",f64,")) tcase_add_test(tc, test_f64);
    suite_add_tcase(suite, tc);

    SRunner *sr = srunner_create(suite);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    free(g_cases);
    nsa_context_destroy(g_ctx);
    return failed == 0 ? 0 : 1;
}
