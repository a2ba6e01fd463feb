/*
 * Settings (include/nsa.h, "Settings"): the log callback and its levels, the
 * CPU thread count, the backend module path and the kernel cache folder, each
 * set through the API over its environment variable, reset by NULL / 0, and
 * bad values refused with a named status. Each test runs in a process of its
 * own (Check's fork mode), so module loads and settings do not leak between
 * tests.
 */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "expect.h"
#include "nsa.h"
#include "testkit.h"

#if !defined(FAKE_UNAVAILABLE_DIR) || !defined(FAKE_BADVERSION_DIR)
#error "FAKE_UNAVAILABLE_DIR and FAKE_BADVERSION_DIR must be defined by tests/meson.build"
#endif

typedef struct capture {
    int n[4];
    char text[8192];
} capture;

static void on_log(nsa_log_level level, const char *message, void *user)
{
    capture *c = user;
    if ((int)level >= 0 && (int)level < 4) c->n[level]++;
    size_t used = strlen(c->text);
    snprintf(c->text + used, sizeof c->text - used, "[%s] %s\n", nsa_log_level_name(level), message);
}

START_TEST(log_callback_levels)
{
    capture cap;
    memset(&cap, 0, sizeof cap);
    EXPECT_OK(nsa_set_log(on_log, NSA_LOG_INFO, &cap));
    nsa_context *ctx = NULL;
    EXPECT_OK(nsa_context_create("cpu", 0, &ctx));
    ck_assert_msg(strstr(cap.text, "[info] context: backend cpu, device 0"), "log: %s", cap.text);
    nsa_config cfg;
    EXPECT_OK(nsa_config_init(&cfg));
    cfg.num_q_heads = 2, cfg.num_kv_heads = 1, cfg.head_dim_qk = 8, cfg.head_dim_v = 8;
    cfg.cmp_block = 8, cfg.cmp_stride = 4, cfg.slc_block = 16, cfg.num_selected = 3, cfg.num_init = 1;
    cfg.num_local = 1, cfg.window = 16, cfg.dtype = NSA_DTYPE_F32;
    const int64_t cu[2] = {0, 40};
    nsa_plan *plan = NULL;
    EXPECT_OK(nsa_plan_create(ctx, &cfg, cu, 1, &plan));
    ck_assert_msg(strstr(cap.text, "[info] plan on cpu: 40 tokens in 1 sequences, stages compress"), "log: %s",
                  cap.text);
    ck_assert_int_eq(cap.n[NSA_LOG_DEBUG], 0); /* above max_level: not delivered */
    nsa_plan_destroy(plan);
    nsa_context_destroy(ctx);
    /* max_level ERROR: the INFO messages stop */
    memset(&cap, 0, sizeof cap);
    EXPECT_OK(nsa_set_log(on_log, NSA_LOG_ERROR, &cap));
    EXPECT_OK(nsa_context_create("cpu", 0, &ctx));
    nsa_context_destroy(ctx);
    ck_assert_msg(cap.text[0] == '\0', "log: %s", cap.text);
    /* no callback: nothing reaches it */
    EXPECT_OK(nsa_set_log(NULL, NSA_LOG_DEBUG, &cap));
    EXPECT_OK(nsa_context_create("cpu", 0, &ctx));
    nsa_context_destroy(ctx);
    ck_assert_msg(cap.text[0] == '\0', "log: %s", cap.text);
    EXPECT(nsa_set_log(on_log, (nsa_log_level)4, &cap), NSA_ERR_INVALID_VALUE, "max_level");
    EXPECT(nsa_set_log(on_log, (nsa_log_level)-1, &cap), NSA_ERR_INVALID_VALUE, "max_level");
    ck_assert_str_eq(nsa_log_level_name(NSA_LOG_WARN), "warn");
}
END_TEST

/* A module that is there but will not load is a WARN; a backend passed over
 * for the next one in the list is an INFO. */
START_TEST(log_module_trouble)
{
    capture cap;
    memset(&cap, 0, sizeof cap);
    EXPECT_OK(nsa_set_log(on_log, NSA_LOG_DEBUG, &cap));
    EXPECT_OK(nsa_set_backend_path(FAKE_BADVERSION_DIR));
    nsa_context *ctx = NULL;
    EXPECT_OK(nsa_context_create("fakever,cpu", 0, &ctx));
    ck_assert_str_eq(nsa_context_backend(ctx), "cpu");
    nsa_context_destroy(ctx);
    ck_assert_msg(strstr(cap.text, "[warn] backend fakever: module libnsa_backend_fakever.so was built for backend "
                                   "API version"), "log: %s", cap.text);
    ck_assert_msg(strstr(cap.text, "[info] backend fakever not used"), "log: %s", cap.text);
    ck_assert_msg(strstr(cap.text, "[info] context: backend cpu"), "log: %s", cap.text);
}
END_TEST

START_TEST(cpu_threads)
{
    nsa_context *ctx = NULL;
    EXPECT_OK(nsa_context_create("cpu", 0, &ctx));
    const int pooled = strncmp(nsa_context_device(ctx), "pthreads", 8) == 0; /* -Dthreads=false: one thread */
    nsa_context_destroy(ctx);
    setenv("NSA_CPU_THREADS", "2", 1);
    EXPECT_OK(nsa_set_cpu_threads(3));
    EXPECT_OK(nsa_context_create("cpu", 0, &ctx));
    if (pooled) ck_assert_str_eq(nsa_context_device(ctx), "pthreads x3"); /* the API wins */
    nsa_context_destroy(ctx);
    EXPECT_OK(nsa_set_cpu_threads(0)); /* back to the environment */
    EXPECT_OK(nsa_context_create("cpu", 0, &ctx));
    if (pooled) ck_assert_str_eq(nsa_context_device(ctx), "pthreads x2");
    nsa_context_destroy(ctx);
    unsetenv("NSA_CPU_THREADS");
    EXPECT(nsa_set_cpu_threads(-1), NSA_ERR_INVALID_VALUE, "threads = -1");
    EXPECT(nsa_set_cpu_threads(1025), NSA_ERR_INVALID_VALUE, "threads = 1025");
}
END_TEST

START_TEST(backend_path)
{
    unsetenv("NSA_BACKEND_PATH");
    EXPECT_OK(nsa_set_backend_path("/nonexistent/nsa-a:" FAKE_UNAVAILABLE_DIR));
    nsa_context *ctx = NULL;
    /* the fake module is found there: its own reason comes back */
    EXPECT(nsa_context_create("fake", 0, &ctx), NSA_ERR_BACKEND_UNAVAILABLE, "libfakert.so.1");
    ck_assert_ptr_null(ctx);
    EXPECT(nsa_set_backend_path(""), NSA_ERR_INVALID_VALUE, "dirs is empty");
    char *longp = malloc(5000);
    ck_assert_ptr_nonnull(longp);
    memset(longp, 'a', 4999);
    longp[4999] = '\0';
    EXPECT(nsa_set_backend_path(longp), NSA_ERR_INVALID_VALUE, "4999 characters");
    free(longp);
    EXPECT_OK(nsa_set_backend_path(NULL));
}
END_TEST

START_TEST(backend_path_not_set)
{
    /* without the setting (and without NSA_BACKEND_PATH) the fake module is nowhere */
    unsetenv("NSA_BACKEND_PATH");
    nsa_context *ctx = NULL;
    EXPECT(nsa_context_create("fake", 0, &ctx), NSA_ERR_BACKEND_UNAVAILABLE, "not found");
}
END_TEST

static int count_entries(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

START_TEST(cache_dir)
{
    EXPECT(nsa_set_cache_dir(""), NSA_ERR_INVALID_VALUE, "dir is empty");
    nsa_context *ctx = NULL;
    if (nsa_context_create("opencl", 0, &ctx) != NSA_SUCCESS) {
        printf("cache_dir: no OpenCL device here; only the argument checks ran\n");
        return;
    }
    char dir[] = "/tmp/nsa-settings-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    setenv("NSA_CACHE_DIR", "off", 1); /* the API must win over it */
    EXPECT_OK(nsa_set_cache_dir(dir));
    tk_case *cases = NULL;
    ck_assert_int_gt(tk_corpus("small", &cases), 0);
    tk_case c = cases[0];
    free(cases);
    tk_case_set_dtype(&c, NSA_DTYPE_F32);
    tk_inputs in;
    tk_output out;
    char msg[TK_MSG_MAX];
    ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
    ck_assert_msg(tk_run(ctx, &c, &in, &out, msg, sizeof msg) == NSA_SUCCESS, "%s", msg);
    tk_output_free(&out);
    tk_inputs_free(&in);
    nsa_context_destroy(ctx);
    ck_assert_int_eq(count_entries(dir, "opencl-"), 1);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    EXPECT_OK(nsa_set_cache_dir(NULL));
}
END_TEST

int main(void)
{
    expect_counts_init();
    Suite *s = suite_create("settings");
    TCase *tc = tcase_create("settings");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, log_callback_levels);
    tcase_add_test(tc, log_module_trouble);
    tcase_add_test(tc, cpu_threads);
    tcase_add_test(tc, backend_path);
    tcase_add_test(tc, backend_path_not_set);
    tcase_add_test(tc, cache_dir);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
