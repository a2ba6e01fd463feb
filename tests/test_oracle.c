/*
 * The per-backend parity test: every configuration of the corpus, in every
 * dtype and in the fixed-indices mode, against the fp64 oracle of tests/common.
 *
 *   test_oracle <backend> [modes] [corpus]
 *     backend  cpu | opencl | cuda | hip  (a name nsa_context_create accepts)
 *     modes    comma list of f32, f16, bf16, fixed  (default: all four)
 *     corpus   full | small                         (default: full; the environment
 *              variable NSA_TEST_CORPUS overrides, for sanitizer runs)
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

static const char *g_backend;
static const char *g_corpus = "full";
static nsa_context *g_ctx;
static tk_case *g_cases;
static int g_ncases;

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

/* Bitwise reproducibility: the same case twice gives the same bytes. Uses a
 * varlen, strided and a long case, in two dtypes. */
START_TEST(test_determinism)
{
    static const char *labels[] = {"B8-mixed", "strided-ext", "long1000", "s-strided", "s-varlen"};
    static const nsa_dtype dtypes[] = {NSA_DTYPE_F32, NSA_DTYPE_BF16};
    int checked = 0;
    for (int i = 0; i < g_ncases; ++i)
        for (size_t k = 0; k < sizeof labels / sizeof labels[0]; ++k) {
            if (strcmp(g_cases[i].label, labels[k]) != 0) continue;
            for (size_t d = 0; d < 2; ++d) {
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

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s <backend> [f32,f16,bf16,fixed] [full|small]\n", argv[0]);
        return 2;
    }
    g_backend = argv[1];
    const char *modes = argc > 2 ? argv[2] : "f32,f16,bf16,fixed";
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
    char buf[128];
    snprintf(buf, sizeof buf, ",%s,", modes);
    if (strstr(buf, ",f32,")) tcase_add_test(tc, test_f32);
    if (strstr(buf, ",f16,")) tcase_add_test(tc, test_f16);
    if (strstr(buf, ",bf16,")) tcase_add_test(tc, test_bf16);
    if (strstr(buf, ",fixed,")) tcase_add_test(tc, test_fixed);
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
