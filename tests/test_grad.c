/*
 * The gradient reference (tests/common/grad.c) against independent checks:
 *   - its forward equals the fp64 oracle's (oracle.c) on the corpus inputs,
 *     selection included (the oracle's top-n is passed back in);
 *   - its backward of shards of the rows (section 11; P = 2, 4, 8 at random cuts,
 *     empty shards allowed) gives each shard's dq, dg rows bitwise as the whole
 *     backward's and 0 elsewhere, and the shards' partials summed in position
 *     order equal the whole backward's gradients to 1e-12 of each tensor's scale
 *     (its largest element, at least dq's);
 *   - its backward equals central finite differences of its forward in fp64,
 *     along a random direction in each input tensor alone and in all of them
 *     at once, the selection held fixed: |AD - FD| <= 1e-6 * sum |grad * u|
 *     (plus 1e-10 (1 + |L|), FD's own rounding, for derivatives near 0); the
 *     differences are central at h = 1e-3 and 5e-4, Richardson-extrapolated.
 * Runs on the small corpus (every mode, ragged T, T < l, packed sequences,
 * G 1..16, Dqk != Dv, LINEAR with and without pe, EXTERNAL, fixed indices)
 * and on the full corpus's cases of at most 600 tokens.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

static double g_worst_fd, g_worst_fwd, g_worst_shard;
static int g_dirs, g_cases, g_tiny, g_shardings;

/* L(x) = sum dO . o(x) */
static double loss(const tk_case *c, const tk_ref64 *x, const int32_t *sel, const double *dO, double *o, int64_t no)
{
    ck_assert_int_eq(tk_ref64_forward(c, x, sel, 0, o, (double *[3]){NULL, NULL, NULL}), NSA_SUCCESS);
    double L = 0.0;
    for (int64_t e = 0; e < no; e++) L += dO[e] * o[e];
    return L;
}

/* x[i] += a * u[i] for the tensors in mask */
static void axpy(tk_ref64 *x, double a, double *const u[TK_G_COUNT], unsigned mask)
{
    for (int i = 0; i < TK_G_COUNT; i++)
        if ((mask >> i) & 1u)
            for (int64_t e = 0; e < x->n[i]; e++) x->t[i][e] += a * u[i][e];
}

/* Section 11 on the reference: the backward of P shards of the packed rows */
static void check_shards(const tk_case *c, const tk_ref64 *x, const int32_t *sel, const double *dO,
                         const tk_ref64 *full)
{
    const int64_t T = tk_case_tokens(c), Hq = c->cfg.num_q_heads, Dk = c->cfg.head_dim_qk;
    static const int parts[] = {2, 4, 8};
    if (T < 2) return;
    for (int pi = 0; pi < 3; pi++) {
        const int P = parts[pi];
        int64_t cut[9];
        cut[0] = 0;
        cut[P] = T;
        for (int s = 1; s < P; s++) cut[s] = 1 + (int64_t)(nsa_random_u64(c->seed, 910 + (uint64_t)P, (uint64_t)s) %
                                                           (uint64_t)(T - 1));
        for (int s = 1; s < P; s++) /* sort the cuts (equal cuts: an empty shard) */
            for (int u = s + 1; u < P; u++)
                if (cut[u] < cut[s]) {
                    const int64_t tmp = cut[s];
                    cut[s] = cut[u];
                    cut[u] = tmp;
                }
        tk_ref64 sum, part;
        ck_assert_int_eq(tk_ref64_alloc(c, &sum), NSA_SUCCESS);
        ck_assert_int_eq(tk_ref64_alloc(c, &part), NSA_SUCCESS);
        for (int s = 0; s < P; s++) {
            for (int i = 0; i < TK_G_COUNT; i++)
                if (part.n[i]) memset(part.t[i], 0, (size_t)part.n[i] * sizeof(double));
            ck_assert_int_eq(tk_ref64_backward_rows(c, x, sel, 0, dO, cut[s], cut[s + 1], &part), NSA_SUCCESS);
            for (int i = 0; i < TK_G_COUNT; i++) {
                /* dq [T, Hq, Dk] and dg_b [T, Hq]: the shard's rows complete, the others 0 */
                const int64_t per = i == TK_G_Q ? Hq * Dk : (i >= TK_G_GATE && i < TK_G_GATE + 3) ? Hq : 0;
                for (int64_t e = 0; e < part.n[i]; e++) {
                    if (per) {
                        const int64_t row = e / per;
                        const double want = row >= cut[s] && row < cut[s + 1] ? full->t[i][e] : 0.0;
                        if (part.t[i][e] != want) /* (not ck_assert per element: each one writes to check's pipe) */
                            ck_abort_msg("%s: shard [%lld, %lld) of %d: d%s[%lld] = %.17g, want %.17g",
                                         c->label, (long long)cut[s], (long long)cut[s + 1], P, tk_ref64_name(i),
                                         (long long)e, part.t[i][e], want);
                    }
                    sum.t[i][e] += part.t[i][e];
                }
            }
        }
        tk_ref64_free(&part);
        /* a tensor's scale: its largest element, or dq's where it is smaller (a gradient near 0,
         * such as dpe where the blocks' terms cancel, keeps the rounding of its terms) */
        double qscale = 0.0;
        for (int64_t e = 0; e < full->n[TK_G_Q]; e++) qscale = fmax(qscale, fabs(full->t[TK_G_Q][e]));
        for (int i = 0; i < TK_G_COUNT; i++) {
            double scale = qscale;
            for (int64_t e = 0; e < full->n[i]; e++) scale = fmax(scale, fabs(full->t[i][e]));
            for (int64_t e = 0; e < full->n[i]; e++) {
                const double err = fabs(sum.t[i][e] - full->t[i][e]) / (1e-300 + scale);
                if (err > g_worst_shard) g_worst_shard = err;
                if (!(fabs(sum.t[i][e] - full->t[i][e]) <= 1e-12 * scale))
                    ck_abort_msg("%s: %d shards: sum of d%s[%lld] = %.17g, whole backward %.17g", c->label, P,
                                 tk_ref64_name(i), (long long)e, sum.t[i][e], full->t[i][e]);
            }
        }
        tk_ref64_free(&sum);
        g_shardings++;
    }
}

static void check_case(const tk_case *c0)
{
    tk_case c = *c0;
    tk_case_set_dtype(&c, NSA_DTYPE_F32);
    const nsa_config *g = &c.cfg;
    const int64_t T = tk_case_tokens(&c), Hq = g->num_q_heads, Dv = g->head_dim_v, no = T * Hq * Dv;
    tk_inputs in;
    ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
    tk_oracle orc;
    ck_assert_int_eq(tk_oracle_run(&c, &in, c.fixed_indices ? in.given : NULL, &orc), NSA_SUCCESS);
    tk_ref64 x, grad;
    ck_assert_int_eq(tk_ref64_from_inputs(&c, &in, &x), NSA_SUCCESS);
    double *o = malloc(((size_t)no + 1) * sizeof *o), *dO = malloc(((size_t)no + 1) * sizeof *dO);
    double *lse[3] = {NULL, NULL, NULL};
    ck_assert_ptr_nonnull(o);
    ck_assert_ptr_nonnull(dO);
    for (int b = 0; b < 3; b++)
        if (orc.lse[b]) ck_assert_ptr_nonnull(lse[b] = malloc(((size_t)(T * Hq) + 1) * sizeof(double)));

    /* the forward against the oracle (dtype rounding of kc, vc on, as there) */
    ck_assert_int_eq(tk_ref64_forward(&c, &x, orc.sel, 1, o, lse), NSA_SUCCESS);
    for (int64_t e = 0; e < no; e++) {
        const double err = fabs(o[e] - orc.o[e]) / (1.0 + fabs(orc.o[e]));
        if (err > g_worst_fwd) g_worst_fwd = err;
        ck_assert_msg(err <= 1e-12, "%s: o[%lld] = %.17g, oracle %.17g", c.label, (long long)e, o[e], orc.o[e]);
    }
    for (int b = 0; b < 3; b++)
        for (int64_t e = 0; lse[b] && e < T * Hq; e++) {
            const double a = lse[b][e], r = orc.lse[b][e];
            ck_assert_msg(a == r || fabs(a - r) <= 1e-12 * (1.0 + fabs(r)), "%s: lse[%d][%lld] = %.17g, oracle %.17g",
                          c.label, b, (long long)e, a, r);
        }

    /* the backward against central differences */
    float *tmp = malloc(((size_t)no + 1) * sizeof *tmp);
    ck_assert_ptr_nonnull(tmp);
    ck_assert_int_eq(nsa_random_uniform(c.seed ^ 0x5eedULL, 900, 0, no, -1.0f, 1.0f, tmp), NSA_SUCCESS);
    for (int64_t e = 0; e < no; e++) dO[e] = tmp[e];
    free(tmp);
    ck_assert_int_eq(tk_ref64_backward(&c, &x, orc.sel, 0, dO, &grad), NSA_SUCCESS);
    check_shards(&c, &x, orc.sel, dO, &grad);
    double *u[TK_G_COUNT] = {NULL};
    unsigned all = 0;
    for (int i = 0; i < TK_G_COUNT; i++) {
        if (x.n[i] == 0) continue;
        all |= 1u << i;
        float *f = malloc((size_t)x.n[i] * sizeof *f);
        ck_assert_ptr_nonnull(f);
        ck_assert_ptr_nonnull(u[i] = malloc((size_t)x.n[i] * sizeof(double)));
        ck_assert_int_eq(nsa_random_uniform(c.seed ^ 0xd1ecULL, 901 + (uint64_t)i, 0, x.n[i], -1.0f, 1.0f, f),
                         NSA_SUCCESS);
        for (int64_t e = 0; e < x.n[i]; e++) u[i][e] = f[e];
        free(f);
    }
    const double eps = 1e-3;
    for (int i = 0; i <= TK_G_COUNT; i++) {
        const unsigned mask = i < TK_G_COUNT ? (1u << i) & all : all;
        if (!mask) continue;
        double ad = 0.0, mag = 0.0;
        for (int j = 0; j < TK_G_COUNT; j++)
            if ((mask >> j) & 1u)
                for (int64_t e = 0; e < x.n[j]; e++) {
                    ad += grad.t[j][e] * u[j][e];
                    mag += fabs(grad.t[j][e] * u[j][e]);
                }
        /* central differences at h and h / 2, Richardson-extrapolated: error O(h^4) */
        double dh[2], lmax = 0.0;
        for (int k = 0; k < 2; k++) {
            const double h = k == 0 ? eps : eps / 2;
            axpy(&x, h, u, mask);
            const double lp = loss(&c, &x, orc.sel, dO, o, no);
            axpy(&x, -2.0 * h, u, mask);
            const double lm = loss(&c, &x, orc.sel, dO, o, no);
            axpy(&x, h, u, mask);
            dh[k] = (lp - lm) / (2.0 * h);
            lmax = fmax(lmax, fmax(fabs(lp), fabs(lm)));
        }
        const double fd = (4.0 * dh[1] - dh[0]) / 3.0;
        /* FD's own rounding, about 1e-16 |L| sqrt(terms) / h: a floor for derivatives near 0 */
        const double floor = 1e-10 * (1.0 + lmax);
        const double rel = fabs(ad - fd) / (mag > floor ? mag : floor);
        if (mag > 1e4 * floor) {
            if (rel > g_worst_fd) g_worst_fd = rel;
        } else {
            g_tiny++; /* a derivative near 0: only the floor applies */
        }
        ck_assert_msg(fabs(ad - fd) <= 1e-6 * mag + floor, "%s: d/d%s: AD %.12g, FD %.12g (rel %.3g of %.3g)",
                      c.label, i < TK_G_COUNT ? tk_ref64_name(i) : "(all)", ad, fd, rel, mag);
        g_dirs++;
    }
    g_cases++;
    for (int i = 0; i < TK_G_COUNT; i++) free(u[i]);
    for (int b = 0; b < 3; b++) free(lse[b]);
    free(o);
    free(dO);
    tk_ref64_free(&grad);
    tk_ref64_free(&x);
    tk_oracle_free(&orc);
    tk_inputs_free(&in);
}

static void run(const char *corpus, int64_t max_tokens)
{
    tk_case *cases = NULL;
    const int n = tk_corpus(corpus, &cases);
    ck_assert_int_gt(n, 0);
    for (int i = 0; i < n; i++)
        if (tk_case_tokens(&cases[i]) <= max_tokens) check_case(&cases[i]);
    free(cases);
}

START_TEST(small_corpus)
{
    run("small", INT64_MAX);
}
END_TEST

START_TEST(full_corpus_short_cases)
{
    run("full", 600);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grad");
    TCase *tc = tcase_create("reference");
    tcase_set_timeout(tc, 0);
    tcase_add_test(tc, small_corpus);
    tcase_add_test(tc, full_corpus_short_cases);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    printf("grad: %d cases, %d directions; worst |AD - FD| / sum|grad u| = %.3g (%d directions with a "
           "derivative near 0 held to the floor only); worst forward vs oracle %.3g; %d shardings, worst sum of "
           "shards vs whole %.3g of the tensor's scale\n",
           g_cases, g_dirs, g_worst_fd, g_tiny, g_worst_fwd, g_shardings, g_worst_shard);
    return failed ? 1 : 0;
}
