/*
 * EXPECT / EXPECT_OK for the Check suites that call libnsa with bad arguments
 * (test_invalid.c, test_loader.c), and the figures they print at the end:
 * invalid calls tried, calls that returned the expected status with a message
 * naming what was wrong, and tests that crashed (a signal in Check's forked
 * child). The counters live in a shared anonymous mapping so that the forked
 * children's counts reach main().
 */
#ifndef NSA_TESTS_EXPECT_H
#define NSA_TESTS_EXPECT_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "nsa.h"

typedef struct expect_counts {
    long tried; /* EXPECT calls: invalid calls made */
    long named; /* of them: the expected status and a message naming the needle */
} expect_counts;

static expect_counts expect_local, *expect_shared = &expect_local;

/* Call in main() before srunner_run_all. */
static inline void expect_counts_init(void)
{
    void *p = mmap(NULL, sizeof(expect_counts), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) expect_shared = p;
    memset(expect_shared, 0, sizeof *expect_shared);
}

/* call must return want, with a non-empty nsa_last_error() that contains needle. */
#define EXPECT(call, want, needle)                                                                       \
    do {                                                                                                 \
        __atomic_fetch_add(&expect_shared->tried, 1, __ATOMIC_RELAXED);                                  \
        nsa_status got_ = (call);                                                                        \
        const char *m_ = nsa_last_error();                                                               \
        ck_assert_msg(got_ == (want), "%s returned %s (%d), expected %s (%d); message: %s", #call,        \
                      nsa_status_string(got_), (int)got_, nsa_status_string(want), (int)(want), m_);     \
        ck_assert_msg(m_ != NULL && m_[0] != '\0', "%s: empty nsa_last_error()", #call);                 \
        ck_assert_msg(strstr(m_, (needle)) != NULL, "%s: message \"%s\" does not mention \"%s\"", #call, \
                      m_, (needle));                                                                     \
        __atomic_fetch_add(&expect_shared->named, 1, __ATOMIC_RELAXED);                                  \
    } while (0)

#define EXPECT_OK(call)                                                                                 \
    do {                                                                                                \
        nsa_status got_ = (call);                                                                       \
        ck_assert_msg(got_ == NSA_SUCCESS, "%s returned %s: %s", #call, nsa_status_string(got_),        \
                      nsa_last_error());                                                                \
        ck_assert_msg(nsa_last_error() && nsa_last_error()[0] == '\0',                                 \
                      "%s succeeded but nsa_last_error() is \"%s\"", #call, nsa_last_error());          \
    } while (0)

/* Prints "<suite>: N invalid calls tried, N named errors, N crashes" and
 * returns the number of tests that crashed. */
static inline int expect_report(SRunner *sr, const char *suite)
{
    int crashes = 0, n = srunner_ntests_run(sr);
    TestResult **res = srunner_results(sr);
    for (int i = 0; res && i < n; i++)
        if (tr_rtype(res[i]) == CK_ERROR) crashes++;
    free(res);
    printf("%s: %ld invalid calls tried, %ld named errors, %d crashes\n", suite, expect_shared->tried,
           expect_shared->named, crashes);
    return crashes;
}

#endif
