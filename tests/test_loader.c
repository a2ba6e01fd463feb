/*
 * The backend loader: names, NSA_BACKEND / NSA_DEVICE / NSA_BACKEND_PATH, and
 * modules that are present but unusable (fake modules built by tests/fake/).
 *
 * The registry loads a module once per process, so every test runs in its own
 * forked child (Check's default) and sets its environment first; main() itself
 * never calls libnsa.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"
#include "nsa.h"

#ifndef FAKE_UNAVAILABLE_DIR
#error "FAKE_UNAVAILABLE_DIR must be defined by tests/meson.build"
#endif

static void clean_env(void)
{
    unsetenv("NSA_BACKEND");
    unsetenv("NSA_DEVICE");
    unsetenv("NSA_BACKEND_PATH");
}

#define ASSERT_STATUS(expr, want)                                                                       \
    do {                                                                                                \
        nsa_status got_ = (expr);                                                                       \
        ck_assert_msg(got_ == (want), "%s returned %s, expected %s (message: %s)", #expr,               \
                      nsa_status_string(got_), nsa_status_string(want), nsa_last_error());              \
    } while (0)

#define ASSERT_MESSAGE_HAS(needle)                                                                      \
    ck_assert_msg(strstr(nsa_last_error(), (needle)) != NULL, "message \"%s\" does not mention \"%s\"", \
                  nsa_last_error(), (needle))

/* request (a backend argument, or NULL for NSA_BACKEND) must give a cpu context. */
static void expect_cpu_context(const char *request)
{
    nsa_context *ctx = NULL;
    EXPECT_OK(nsa_context_create(request, request ? 0 : -1, &ctx));
    ck_assert_str_eq(nsa_context_backend(ctx), "cpu");
    EXPECT_OK(nsa_context_destroy(ctx));
}

START_TEST(unknown_name_lists_available)
{
    clean_env();
    setenv("NSA_BACKEND", "nope", 1);
    nsa_context *ctx = (nsa_context *)0x1;
    ASSERT_STATUS(nsa_context_create(NULL, -1, &ctx), NSA_ERR_BACKEND_UNAVAILABLE);
    ASSERT_MESSAGE_HAS("nope");
    ASSERT_MESSAGE_HAS("cpu");
    /* the same through the explicit argument */
    ASSERT_STATUS(nsa_context_create("nope", 0, &ctx), NSA_ERR_BACKEND_UNAVAILABLE);
    ASSERT_MESSAGE_HAS("cpu");
}
END_TEST

START_TEST(malformed_names)
{
    clean_env();
    static const char *bad[] = {"CPU", "../cpu", "cpu/x", "c pu", "cpu;rm", "a-b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        nsa_context *ctx = NULL;
        nsa_status s = nsa_context_create(bad[i], 0, &ctx);
        ck_assert_msg(s == NSA_ERR_BACKEND_UNAVAILABLE, "name \"%s\": %s (%s)", bad[i], nsa_status_string(s),
                      nsa_last_error());
        ck_assert_msg(ctx == NULL, "name \"%s\" produced a context", bad[i]);
        ck_assert_msg(nsa_last_error()[0] != '\0', "name \"%s\": empty message", bad[i]);
    }
}
END_TEST

START_TEST(fake_module_reports_its_reason)
{
    clean_env();
    setenv("NSA_BACKEND_PATH", FAKE_UNAVAILABLE_DIR, 1);
    nsa_context *ctx = NULL;
    ASSERT_STATUS(nsa_context_create("fake", 0, &ctx), NSA_ERR_BACKEND_UNAVAILABLE);
    ASSERT_MESSAGE_HAS("libfakert.so.1");
    ck_assert_ptr_null(ctx);
    /* through the environment too */
    setenv("NSA_BACKEND", "fake", 1);
    ASSERT_STATUS(nsa_context_create(NULL, -1, &ctx), NSA_ERR_BACKEND_UNAVAILABLE);
    ASSERT_MESSAGE_HAS("libfakert.so.1");
}
END_TEST

START_TEST(path_is_a_colon_list)
{
    clean_env();
    setenv("NSA_BACKEND_PATH", "/nonexistent/nsa-a:" FAKE_NOENTRY_DIR ":" FAKE_UNAVAILABLE_DIR, 1);
    nsa_context *ctx = NULL;
    ASSERT_STATUS(nsa_context_create("fake", 0, &ctx), NSA_ERR_BACKEND_UNAVAILABLE);
    ASSERT_MESSAGE_HAS("libfakert.so.1");
}
END_TEST

START_TEST(fake_module_in_backend_list)
{
    clean_env();
    setenv("NSA_BACKEND_PATH", FAKE_UNAVAILABLE_DIR, 1);
    nsa_context *ctx = NULL;
    (void)nsa_context_create("fake", 0, &ctx); /* registers it */
    int count = 0;
    ASSERT_STATUS(nsa_backend_list(NULL, 0, &count), NSA_SUCCESS);
    ck_assert_int_ge(count, 1);
    nsa_backend_info *infos = calloc((size_t)count, sizeof *infos);
    ck_assert_ptr_nonnull(infos);
    int count2 = 0;
    ASSERT_STATUS(nsa_backend_list(infos, count, &count2), NSA_SUCCESS);
    ck_assert_int_eq(count, count2);
    for (int i = 0; i < count; ++i)
        if (strcmp(infos[i].name, "fake") == 0) {
            ck_assert_int_eq(infos[i].available, 0);
            ck_assert_msg(strstr(infos[i].reason, "libfakert.so.1"), "reason: %s", infos[i].reason);
        }
    free(infos);
}
END_TEST

START_TEST(wrong_api_version)
{
    clean_env();
    setenv("NSA_BACKEND_PATH", FAKE_BADVERSION_DIR, 1);
    nsa_context *ctx = NULL;
    ASSERT_STATUS(nsa_context_create("fakever", 0, &ctx), NSA_ERR_VERSION_MISMATCH);
    ASSERT_MESSAGE_HAS("version");
    ck_assert_ptr_null(ctx);
}
END_TEST

START_TEST(missing_entry_symbol)
{
    clean_env();
    setenv("NSA_BACKEND_PATH", FAKE_NOENTRY_DIR, 1);
    nsa_context *ctx = NULL;
    ASSERT_STATUS(nsa_context_create("fakenoentry", 0, &ctx), NSA_ERR_BACKEND_UNAVAILABLE);
    ASSERT_MESSAGE_HAS("nsa_backend_entry");
    ck_assert_ptr_null(ctx);
}
END_TEST

START_TEST(comma_list_picks_first_available)
{
    clean_env();
    nsa_context *ctx = NULL;
    ASSERT_STATUS(nsa_context_create("nope,cpu", 0, &ctx), NSA_SUCCESS);
    ck_assert_str_eq(nsa_context_backend(ctx), "cpu");
    ASSERT_STATUS(nsa_context_destroy(ctx), NSA_SUCCESS);
    /* a present but unavailable module is skipped too */
    setenv("NSA_BACKEND_PATH", FAKE_UNAVAILABLE_DIR, 1);
    setenv("NSA_BACKEND", "fake,nope,cpu", 1);
    ctx = NULL;
    ASSERT_STATUS(nsa_context_create(NULL, -1, &ctx), NSA_SUCCESS);
    ck_assert_str_eq(nsa_context_backend(ctx), "cpu");
    ASSERT_STATUS(nsa_context_destroy(ctx), NSA_SUCCESS);
}
END_TEST

START_TEST(explicit_argument_wins)
{
    clean_env();
    setenv("NSA_BACKEND", "nope", 1);
    setenv("NSA_DEVICE", "99", 1);
    nsa_context *ctx = NULL;
    ASSERT_STATUS(nsa_context_create("cpu", 0, &ctx), NSA_SUCCESS);
    ck_assert_str_eq(nsa_context_backend(ctx), "cpu");
    ASSERT_STATUS(nsa_context_destroy(ctx), NSA_SUCCESS);
}
END_TEST

START_TEST(environment_backend_used)
{
    clean_env();
    setenv("NSA_BACKEND", "cpu", 1);
    nsa_context *ctx = NULL;
    ASSERT_STATUS(nsa_context_create(NULL, -1, &ctx), NSA_SUCCESS);
    ck_assert_str_eq(nsa_context_backend(ctx), "cpu");
    ck_assert_msg(nsa_context_device(ctx) && nsa_context_device(ctx)[0], "empty device name");
    ASSERT_STATUS(nsa_context_destroy(ctx), NSA_SUCCESS);
}
END_TEST

START_TEST(default_backend_is_available)
{
    clean_env();
    nsa_context *ctx = NULL;
    ASSERT_STATUS(nsa_context_create(NULL, -1, &ctx), NSA_SUCCESS);
    const char *name = nsa_context_backend(ctx);
    ck_assert_msg(strcmp(name, "cpu") == 0 || strcmp(name, "cuda") == 0 || strcmp(name, "hip") == 0 ||
                      strcmp(name, "opencl") == 0,
                  "default backend %s", name);
    ASSERT_STATUS(nsa_context_destroy(ctx), NSA_SUCCESS);
}
END_TEST

START_TEST(device_out_of_range)
{
    clean_env();
    nsa_context *ctx = NULL;
    setenv("NSA_DEVICE", "99", 1);
    ASSERT_STATUS(nsa_context_create("cpu", -1, &ctx), NSA_ERR_DEVICE_NOT_FOUND);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(nsa_last_error()[0] != '\0', "empty message");
    unsetenv("NSA_DEVICE");
    ASSERT_STATUS(nsa_context_create("cpu", 99, &ctx), NSA_ERR_DEVICE_NOT_FOUND);
    ck_assert_ptr_null(ctx);
    char name[64];
    ASSERT_STATUS(nsa_device_name("cpu", 99, name, sizeof name), NSA_ERR_DEVICE_NOT_FOUND);
}
END_TEST

START_TEST(backend_list_has_cpu)
{
    clean_env();
    int count = -1;
    ASSERT_STATUS(nsa_backend_list(NULL, 0, &count), NSA_SUCCESS);
    ck_assert_int_ge(count, 1);
    nsa_backend_info infos[32];
    int n = 0;
    ASSERT_STATUS(nsa_backend_list(infos, 32, &n), NSA_SUCCESS);
    int found = 0;
    for (int i = 0; i < n && i < 32; ++i)
        if (strcmp(infos[i].name, "cpu") == 0) {
            found = 1;
            ck_assert_int_eq(infos[i].available, 1);
            ck_assert_int_ge(infos[i].device_count, 1);
        }
    ck_assert_msg(found, "cpu missing from nsa_backend_list");
    /* a capacity smaller than the count writes only that many */
    memset(infos, 0xAB, sizeof infos);
    ASSERT_STATUS(nsa_backend_list(infos, 1, &n), NSA_SUCCESS);
    ck_assert_int_eq(n, count);
    unsigned char *raw = (unsigned char *)&infos[1];
    ck_assert_msg(raw[0] == 0xAB && raw[sizeof infos[1] - 1] == 0xAB, "wrote past capacity");
    char name[NSA_NAME_MAX];
    ASSERT_STATUS(nsa_device_name("cpu", 0, name, sizeof name), NSA_SUCCESS);
    ck_assert_msg(name[0] != '\0', "empty cpu device name");
}
END_TEST


/* Item 4: names that are neither a known backend nor a module file take no
 * registry slot, so no number of bad names locks out a real backend. */
START_TEST(unknown_names_take_no_slot)
{
    clean_env();
    /* 16 distinct unknown names, then cpu: the old registry had filled its 16 slots */
    setenv("NSA_BACKEND", "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,cpu", 1);
    expect_cpu_context(NULL);
    char name[64], bogus[32];
    for (int i = 0; i < 64; ++i) {
        snprintf(bogus, sizeof bogus, "bogus%d", i);
        EXPECT(nsa_device_name(bogus, 0, name, sizeof name), NSA_ERR_BACKEND_UNAVAILABLE, "not found");
    }
    EXPECT_OK(nsa_device_name("cpu", 0, name, sizeof name));
    unsetenv("NSA_BACKEND");
    expect_cpu_context("cpu");
    /* a real module is still found and registered after them */
    setenv("NSA_BACKEND_PATH", FAKE_UNAVAILABLE_DIR, 1);
    nsa_context *ctx = NULL;
    EXPECT(nsa_context_create("fake", 0, &ctx), NSA_ERR_BACKEND_UNAVAILABLE, "libfakert.so.1");
}
END_TEST

/* Item 4: the message says what is wrong with a name. */
START_TEST(name_problems_are_named)
{
    clean_env();
    nsa_context *ctx = NULL;
    const char *name32 = "abcdefghijklmnopqrstuvwxyz012345"; /* 32 characters */
    ck_assert_uint_eq(strlen(name32), 32);
    EXPECT(nsa_context_create(name32, 0, &ctx), NSA_ERR_BACKEND_UNAVAILABLE, "32 characters");
    char name[16];
    EXPECT(nsa_device_name(name32, 0, name, sizeof name), NSA_ERR_BACKEND_UNAVAILABLE, "at most 31");
    EXPECT(nsa_context_create("Cpu", 0, &ctx), NSA_ERR_BACKEND_UNAVAILABLE, "'C'");
    EXPECT(nsa_context_create("cpu-x", 0, &ctx), NSA_ERR_BACKEND_UNAVAILABLE, "character 4 is '-'");
    EXPECT(nsa_context_create("nope,cp\tu", 0, &ctx), NSA_ERR_BACKEND_UNAVAILABLE, "byte 0x09");
    /* a name that is well-formed but absent says so */
    EXPECT(nsa_context_create("nosuchbackend", 0, &ctx), NSA_ERR_BACKEND_UNAVAILABLE,
           "libnsa_backend_nosuchbackend.so not found");
    ck_assert_ptr_null(ctx);
}
END_TEST

/* Item 9: a list of empty names says so instead of "()". */
START_TEST(empty_names_are_named)
{
    clean_env();
    setenv("NSA_BACKEND", ",,,", 1);
    nsa_context *ctx = NULL;
    EXPECT(nsa_context_create(NULL, -1, &ctx), NSA_ERR_BACKEND_UNAVAILABLE, "(empty): an empty name");
    ck_assert_msg(!strstr(nsa_last_error(), "()"), "message still has an empty list: %s", nsa_last_error());
    /* an empty element next to a usable backend is harmless */
    expect_cpu_context("cpu,");
}
END_TEST

/* Item 9: a backend whose context creation fails is passed over for the next
 * listed one; alone, its failure gets a message naming it even when the module
 * gave none. */
START_TEST(context_failure_falls_back)
{
    clean_env();
    setenv("NSA_BACKEND_PATH", FAKE_FAILING_DIR, 1);
    nsa_context *ctx = NULL;
    EXPECT(nsa_context_create("fakectx", 0, &ctx), NSA_ERR_DEVICE, "backend fakectx failed creating a context");
    ck_assert_ptr_null(ctx);
    expect_cpu_context("fakectx,cpu");
    setenv("NSA_BACKEND", "nope,fakectx,cpu", 1);
    expect_cpu_context(NULL);
    /* none usable: each listed name says why */
    EXPECT(nsa_context_create("fakectx,nope", 0, &ctx), NSA_ERR_DEVICE, "fakectx: NSA_ERR_DEVICE");
    ck_assert_msg(strstr(nsa_last_error(), "nope: module libnsa_backend_nope.so not found"), "message: %s",
                  nsa_last_error());
    /* one listed backend keeps its own status and message */
    EXPECT(nsa_context_create("cpu", 3, &ctx), NSA_ERR_DEVICE_NOT_FOUND, "selects device 3, but backend cpu has 1");
}
END_TEST

/* Item 7: a version symbol that is a function (at an odd address) is refused
 * without reading it as an int (a misaligned load, which UBSan reports). */
START_TEST(version_symbol_is_a_function)
{
    clean_env();
    setenv("NSA_BACKEND_PATH", FAKE_FAILING_DIR, 1);
    nsa_context *ctx = NULL;
    EXPECT(nsa_context_create("fakefunc", 0, &ctx), NSA_ERR_VERSION_MISMATCH, "not an int variable");
    ck_assert_ptr_null(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("loader");
    tcase_add_test(tc, unknown_name_lists_available);
    tcase_add_test(tc, malformed_names);
    tcase_add_test(tc, fake_module_reports_its_reason);
    tcase_add_test(tc, path_is_a_colon_list);
    tcase_add_test(tc, fake_module_in_backend_list);
    tcase_add_test(tc, wrong_api_version);
    tcase_add_test(tc, missing_entry_symbol);
    tcase_add_test(tc, comma_list_picks_first_available);
    tcase_add_test(tc, explicit_argument_wins);
    tcase_add_test(tc, environment_backend_used);
    tcase_add_test(tc, default_backend_is_available);
    tcase_add_test(tc, device_out_of_range);
    tcase_add_test(tc, backend_list_has_cpu);
    tcase_add_test(tc, unknown_names_take_no_slot);
    tcase_add_test(tc, name_problems_are_named);
    tcase_add_test(tc, empty_names_are_named);
    tcase_add_test(tc, context_failure_falls_back);
    tcase_add_test(tc, version_symbol_is_a_function);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    expect_counts_init();
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    expect_report(sr, "loader");
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
