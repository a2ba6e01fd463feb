/*
 * Backend output vs the oracle. Every element of every row the oracle computed
 * is checked; NaN or inf where the reference is finite never passes (the runner
 * poisons outputs with NaN, so an element a backend never wrote fails here).
 * Where the case samples its rows (tk_case.rows) the rows left out are not
 * compared, but must still hold written values (o finite, LSEs not NaN,
 * selected entries -1 or an eligible block), so a row the backend skipped
 * fails wherever it is.
 *
 * Near-tie rule (semantics 7): the selection is a discrete choice, so a backend
 * may pick another block than the oracle where two scores differ by less than
 * rounding. For each (t, g) whose selected set differs from the oracle's, the
 * backend's set must itself be well formed (ascending, -1 padded, eligible, the
 * same count, every forced block present) and every differing block's oracle
 * score must lie within score_tol of the selection boundary: blocks the backend
 * took but the oracle did not must score at least (lowest unforced score the
 * oracle kept) - tol, and blocks the oracle took but the backend did not at most
 * (highest score the oracle left out) + tol. If any row was such a swap, o and
 * lse[SLC] are judged against the oracle re-run with the backend's indices.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

tk_tolerance tk_tolerance_for(nsa_dtype dtype)
{
    tk_tolerance t;
    switch (dtype) {
    case NSA_DTYPE_F16:
        t = (tk_tolerance){1e-2, 2e-3, 1e-4, 2e-3, 2e-4, 1e-4};
        break;
    case NSA_DTYPE_BF16:
        t = (tk_tolerance){1e-2, 1e-2, 1e-4, 2e-3, 2e-4, 1e-4};
        break;
    case NSA_DTYPE_F64:
        t = (tk_tolerance){1e-12, 1e-12, 1e-14, 1e-12, 1e-13, 1e-5};
        break;
    default:
        t = (tk_tolerance){1e-4, 1e-4, 1e-6, 1e-4, 1e-5, 1e-5};
        break;
    }
    return t;
}

#define FAILF(v, ...)                                              \
    do {                                                           \
        if ((v)->pass) snprintf((v)->msg, sizeof (v)->msg, __VA_ARGS__); \
        (v)->pass = 0;                                             \
    } while (0)

/* Checks one (t, g) row of the backend's selection against the oracle's.
 * Returns 0: identical, 1: a near-tie swap, -1: a mismatch (message in v). */
static int check_selection_row(const tk_case *c, const tk_oracle *ref, const int32_t *got, int64_t tg,
                               int64_t kh, const tk_tolerance *tol, tk_verdict *v)
{
    const nsa_config *g = &c->cfg;
    const int64_t n = g->num_selected, Hkv = g->num_kv_heads, ls = g->slc_block;
    const int32_t *want = ref->sel + (tg * Hkv + kh) * n;
    const double *score = ref->scores + (tg * Hkv + kh) * ref->max_ns;
    int64_t seq, t;
    tk_case_token(c, tg, &seq, &t);
    if (memcmp(got, want, (size_t)n * sizeof *got) == 0) return 0;
    if (c->fixed_indices) {
        FAILF(v, "%s: selected[t=%lld (seq %lld local %lld), kv head %lld] differs from the given indices",
              c->label, (long long)tg, (long long)seq, (long long)t, (long long)kh);
        return -1;
    }
    int64_t eligible = t / ls + 1;
    int64_t count = eligible < n ? eligible : n;
    /* well formed: count ascending eligible entries, then -1 */
    for (int64_t k = 0; k < n; ++k) {
        int ok = k < count ? (got[k] >= 0 && got[k] < eligible && (k == 0 || got[k] > got[k - 1])) : got[k] == -1;
        if (!ok) {
            FAILF(v,
                  "%s: selected[t=%lld (seq %lld local %lld), kv head %lld][%lld] = %d is malformed (expected "
                  "%lld ascending eligible indices in [0, %lld) then -1; oracle has %d)",
                  c->label, (long long)tg, (long long)seq, (long long)t, (long long)kh, (long long)k, got[k],
                  (long long)count, (long long)eligible, want[k]);
            return -1;
        }
    }
    /* membership */
    char *in_got = calloc((size_t)eligible, 1), *in_ref = calloc((size_t)eligible, 1);
    if (!in_got || !in_ref) {
        free(in_got);
        free(in_ref);
        FAILF(v, "%s: out of host memory", c->label);
        return -1;
    }
    for (int64_t k = 0; k < count; ++k) {
        in_got[got[k]] = 1;
        in_ref[want[k]] = 1;
    }
    double lo = INFINITY, hi = -INFINITY; /* lowest kept unforced, highest left out */
    for (int64_t j = 0; j < eligible; ++j) {
        if (tk_block_forced(g, t, j)) continue;
        if (in_ref[j] && score[j] < lo) lo = score[j];
        if (!in_ref[j] && score[j] > hi) hi = score[j];
    }
    int result = 1;
    for (int64_t j = 0; j < eligible && result == 1; ++j) {
        if (in_got[j] == in_ref[j]) continue;
        if (tk_block_forced(g, t, j)) {
            FAILF(v, "%s: t=%lld (seq %lld local %lld) kv head %lld: forced block %lld %s by the backend",
                  c->label, (long long)tg, (long long)seq, (long long)t, (long long)kh, (long long)j,
                  in_got[j] ? "selected twice?" : "was not selected");
            result = -1;
        } else if (in_got[j] && !(score[j] >= lo - tol->score_tol * fmax(1.0, fabs(lo)))) {
            FAILF(v,
                  "%s: t=%lld (seq %lld local %lld) kv head %lld: backend selected block %lld (oracle score "
                  "%.9g) over the oracle's boundary score %.9g (tol %.1e)",
                  c->label, (long long)tg, (long long)seq, (long long)t, (long long)kh, (long long)j, score[j],
                  lo, tol->score_tol);
            result = -1;
        } else if (in_ref[j] && !(score[j] <= hi + tol->score_tol * fmax(1.0, fabs(hi)))) {
            FAILF(v,
                  "%s: t=%lld (seq %lld local %lld) kv head %lld: backend dropped block %lld (oracle score "
                  "%.9g) although the best block left out scores %.9g (tol %.1e)",
                  c->label, (long long)tg, (long long)seq, (long long)t, (long long)kh, (long long)j, score[j],
                  hi, tol->score_tol);
            result = -1;
        }
    }
    free(in_got);
    free(in_ref);
    return result;
}

static int row_checked(const tk_oracle *ref, int64_t t)
{
    return !ref->sampled || ref->sampled[t];
}

/* RMS of the rows [T][width] of x the oracle computed (every row: the same sum,
 * in the same order, as over the flat array) */
static double rms_of_rows(const tk_oracle *ref, const double *x, int64_t T, int64_t width)
{
    double s = 0.0;
    int64_t count = 0;
    for (int64_t t = 0; t < T; ++t) {
        if (!row_checked(ref, t)) continue;
        for (int64_t e = 0; e < width; ++e) s += x[t * width + e] * x[t * width + e];
        count += width;
    }
    return count > 0 ? sqrt(s / (double)count) : 0.0;
}

/* Token t's rows where the oracle's sample leaves it out: not compared, but the
 * runner's poison (NaN, 0x7f7f7f7f indices) must be gone: o finite, no LSE NaN
 * or +inf (-inf: the branch sees nothing), each selected entry -1 or a block
 * that starts at or before t. */
static void unsampled_written(const tk_case *c, const tk_output *got, int64_t t, tk_verdict *v)
{
    const nsa_config *g = &c->cfg;
    const int64_t Hq = g->num_q_heads, Hkv = g->num_kv_heads, Dv = g->head_dim_v, n = g->num_selected;
    int64_t seq, local;
    tk_case_token(c, t, &seq, &local);
    for (int64_t e = 0; e < Hq * Dv; ++e) {
        const int64_t i = t * Hq * Dv + e;
        const double have = got->o_d ? got->o_d[i] : (double)got->o[i];
        if (!isfinite(have)) {
            FAILF(v, "%s: o[t=%lld (seq %lld local %lld), head %lld, %lld] = %g (a row left out of the sample, "
                  "yet it must be written)", c->label, (long long)t, (long long)seq, (long long)local,
                  (long long)(e / Dv), (long long)(e % Dv), have);
            return;
        }
    }
    for (int b = 0; b < 3; ++b)
        for (int64_t h = 0; h < Hq && (got->lse_d[b] || got->lse[b]); ++h) {
            const double have = got->lse_d[b] ? got->lse_d[b][t * Hq + h] : (double)got->lse[b][t * Hq + h];
            if (isnan(have) || have == INFINITY) {
                FAILF(v, "%s: lse[%d][t=%lld (seq %lld local %lld), head %lld] = %g (a row left out of the "
                      "sample, yet it must be written)", c->label, b, (long long)t, (long long)seq,
                      (long long)local, (long long)h, have);
                return;
            }
        }
    for (int64_t e = 0; e < Hkv * n && got->sel; ++e) {
        const int32_t j = got->sel[t * Hkv * n + e];
        if (j != -1 && !(j >= 0 && j <= local / g->slc_block)) {
            FAILF(v, "%s: selected[t=%lld (seq %lld local %lld), kv head %lld][%lld] = %d is no eligible block "
                  "(a row left out of the sample, yet it must be written)", c->label, (long long)t,
                  (long long)seq, (long long)local, (long long)(e / n), (long long)(e % n), j);
            return;
        }
    }
}

static double rms_of_f(const float *x, int64_t count)
{
    double s = 0.0;
    for (int64_t i = 0; i < count; ++i) s += (double)x[i] * (double)x[i];
    return count > 0 ? sqrt(s / (double)count) : 0.0;
}

int tk_compare(const tk_case *c, const tk_inputs *in, const tk_oracle *ref, const tk_output *got, tk_verdict *v)
{
    memset(v, 0, sizeof *v);
    v->pass = 1;
    v->status = NSA_SUCCESS;
    const nsa_config *g = &c->cfg;
    const tk_tolerance tol = tk_tolerance_for(g->dtype);
    const int64_t T = tk_case_tokens(c), Hq = g->num_q_heads, Hkv = g->num_kv_heads, Dv = g->head_dim_v;
    const int64_t n = g->num_selected;
    const int on[3] = {1, n > 0, g->window > 0};
    static const char *bname[3] = {"cmp", "slc", "win"};
    tk_oracle rerun;
    memset(&rerun, 0, sizeof rerun);
    const tk_oracle *eff = ref; /* the reference o and lse[SLC] are judged against */

    if (got->stray_writes) {
        FAILF(v, "%s: the backend wrote %lld bytes it does not own (first: %s)", c->label,
              (long long)got->stray_writes, got->stray_where);
    }

    /* ---- selection (not reported with caller-given indices) */
    if (n > 0 && !got->sel && !c->fixed_indices) {
        FAILF(v, "%s: no selected indices were read back", c->label);
    } else if (n > 0 && got->sel) {
        int swaps = 0;
        for (int64_t t = 0; t < T && v->pass; ++t) {
            if (!row_checked(ref, t)) continue;
            for (int64_t kh = 0; kh < Hkv && v->pass; ++kh) {
                int r = check_selection_row(c, ref, got->sel + (t * Hkv + kh) * n, t, kh, &tol, v);
                if (r == 1) ++swaps;
                v->elements += n;
            }
        }
        v->tie_swaps = swaps;
        if (v->pass && swaps > 0) {
            nsa_status st = tk_oracle_run(c, in, got->sel, &rerun);
            if (st != NSA_SUCCESS) {
                FAILF(v, "%s: oracle re-run failed: %s", c->label, nsa_status_string(st));
                return 0;
            }
            eff = &rerun; /* the same case, so the same sample of rows */
        }
    }

    /* ---- o: the scale of the o_rms term (testkit.h) is the larger of the
     * RMS of the reference o and the RMS of the value inputs of the enabled
     * branches: each branch output is a convex combination of V rows, so
     * rounding P before P@V errs in proportion to |V|, which for long
     * sequences is far above |o| (averages of many random rows shrink). */
    const double rms = rms_of_rows(ref, ref->o, T, Hq * Dv);
    double scale = rms;
    for (int b = 0; b < 3; ++b)
        if (on[b] && in->v[b]) {
            double rv = rms_of_f(in->v[b], T * g->num_kv_heads * Dv);
            if (rv > scale) scale = rv;
        }
    for (int64_t t = 0; t < T; ++t) {
        if (!row_checked(ref, t)) {
            unsampled_written(c, got, t, v);
            continue;
        }
        v->rows_checked++;
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t x = 0; x < Dv; ++x) {
                int64_t i = (t * Hq + h) * Dv + x;
                double want = eff->o[i], have = got->o_d ? got->o_d[i] : (double)got->o[i];
                double err = fabs(have - want);
                double lim = tol.o_rms * scale + tol.o_rel * fabs(want) + tol.o_abs;
                v->elements++;
                if (!isfinite(have) || !(err <= lim)) {
                    int64_t seq, local;
                    tk_case_token(c, t, &seq, &local);
                    FAILF(v, "%s: o[t=%lld (seq %lld local %lld), head %lld, %lld] = %.17g, oracle %.17g (err %.3g > tol %.3g, scale %.3g)",
                          c->label, (long long)t, (long long)seq, (long long)local, (long long)h, (long long)x,
                          have, want, err, lim, scale);
                    if (isnan(err)) err = INFINITY;
                }
                double rel = rms > 0 ? err / rms : err;
                if (!(rel <= v->o_err)) v->o_err = isnan(rel) ? INFINITY : rel;
                double ratio = err / lim;
                if (!(ratio <= v->o_ratio)) v->o_ratio = isnan(ratio) ? INFINITY : ratio;
            }
    }

    /* ---- LSEs */
    for (int b = 0; b < 3; ++b) {
        if (!on[b]) continue;
        const double *want_l = (b == NSA_BRANCH_SLC ? eff : ref)->lse[b];
        for (int64_t t = 0; t < T; ++t) {
            if (!row_checked(ref, t)) continue;
            for (int64_t h = 0; h < Hq; ++h) {
                double want = want_l[t * Hq + h];
                double have = got->lse_d[b] ? got->lse_d[b][t * Hq + h] : (double)got->lse[b][t * Hq + h];
                v->elements++;
                int ok;
                double err = 0.0;
                if (isinf(want) && want < 0) {
                    ok = isinf(have) && have < 0;
                } else {
                    err = fabs(have - want);
                    ok = isfinite(have) && err <= tol.lse_abs + tol.lse_rel * fabs(want);
                    if (err > v->lse_err || !isfinite(have)) v->lse_err = isfinite(have) ? err : INFINITY;
                }
                if (!ok) {
                    int64_t seq, local;
                    tk_case_token(c, t, &seq, &local);
                    FAILF(v, "%s: lse_%s[t=%lld (seq %lld local %lld), head %lld] = %.17g, oracle %.17g", c->label,
                          bname[b], (long long)t, (long long)seq, (long long)local, (long long)h, have, want);
                }
            }
        }
    }
    tk_oracle_free(&rerun);
    return v->pass;
}

int tk_check_case(nsa_context *ctx, const tk_case *c, tk_verdict *v)
{
    memset(v, 0, sizeof *v);
    tk_inputs in;
    tk_oracle ref;
    tk_output got;
    memset(&ref, 0, sizeof ref);
    memset(&got, 0, sizeof got);
    nsa_status st = tk_inputs_make(c, &in);
    if (st != NSA_SUCCESS) {
        v->status = st;
        snprintf(v->msg, sizeof v->msg, "%s: making inputs: %s: %s", c->label, nsa_status_string(st),
                 nsa_last_error());
        return 0;
    }
    st = tk_oracle_run(c, &in, c->fixed_indices ? in.given : NULL, &ref);
    if (st != NSA_SUCCESS) {
        v->status = st;
        snprintf(v->msg, sizeof v->msg, "%s: oracle: %s", c->label, nsa_status_string(st));
        tk_inputs_free(&in);
        return 0;
    }
    char msg[TK_MSG_MAX - TK_LABEL_MAX - 8];
    st = tk_run(ctx, c, &in, &got, msg, sizeof msg);
    if (st != NSA_SUCCESS) {
        v->status = st;
        v->pass = 0;
        snprintf(v->msg, sizeof v->msg, "%s: %s", c->label, msg);
    } else {
        tk_compare(c, &in, &ref, &got, v);
    }
    tk_output_free(&got);
    tk_oracle_free(&ref);
    tk_inputs_free(&in);
    return v->pass;
}

int tk_check_determinism(nsa_context *ctx, const tk_case *c, char *msg, size_t msg_size)
{
    tk_inputs in;
    tk_output a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    int same = 0;
    nsa_status st = tk_inputs_make(c, &in);
    if (st != NSA_SUCCESS) {
        snprintf(msg, msg_size, "%s: making inputs: %s", c->label, nsa_status_string(st));
        return 0;
    }
    if ((st = tk_run(ctx, c, &in, &a, msg, msg_size)) != NSA_SUCCESS ||
        (st = tk_run(ctx, c, &in, &b, msg, msg_size)) != NSA_SUCCESS)
        goto done;
    const nsa_config *g = &c->cfg;
    int64_t T = tk_case_tokens(c);
    if (a.o_raw_bytes != b.o_raw_bytes || memcmp(a.o_raw, b.o_raw, a.o_raw_bytes) != 0) {
        snprintf(msg, msg_size, "%s: o differs between two identical runs", c->label);
        goto done;
    }
    for (int k = 0; k < 3; ++k)
        if (a.lse[k] && memcmp(a.lse[k], b.lse[k], (size_t)(T * g->num_q_heads) * sizeof(float)) != 0) {
            snprintf(msg, msg_size, "%s: lse[%d] differs between two identical runs", c->label, k);
            goto done;
        }
    if (a.sel && memcmp(a.sel, b.sel, (size_t)(T * g->num_kv_heads * g->num_selected) * sizeof(int32_t)) != 0) {
        snprintf(msg, msg_size, "%s: selected indices differ between two identical runs", c->label);
        goto done;
    }
    same = 1;
    snprintf(msg, msg_size, "%s: two runs bitwise identical", c->label);
done:
    tk_output_free(&a);
    tk_output_free(&b);
    tk_inputs_free(&in);
    return same;
}

void tk_stats_add(tk_stats *s, const tk_case *c, const tk_verdict *v)
{
    s->run++;
    if (v->status == NSA_ERR_UNSUPPORTED) s->unsupported++;
    if (v->pass) s->passed++;
    else {
        s->failed++;
        if (!s->first_failure[0]) snprintf(s->first_failure, sizeof s->first_failure, "%s", v->msg);
    }
    if (v->status == NSA_SUCCESS) {
        if (v->o_ratio > s->max_o_ratio || !s->worst[0]) {
            if (v->o_ratio >= s->max_o_ratio) {
                s->max_o_ratio = v->o_ratio;
                snprintf(s->worst, sizeof s->worst, "%s", c->label);
            }
        }
        if (v->o_err > s->max_o_err) s->max_o_err = v->o_err;
        if (v->lse_err > s->max_lse_err) s->max_lse_err = v->lse_err;
        s->tie_swaps += v->tie_swaps;
    }
    s->sampled |= c->rows > 0;
    s->rows_checked += v->rows_checked;
    s->rows_total += tk_case_tokens(c);
}

void tk_stats_print(FILE *f, const char *title, const tk_stats *s)
{
    fprintf(f,
            "%s: %d run, %d passed, %d failed (%d unsupported); max o err %.3g of rms (%.3g of tol, case %s), "
            "max lse err %.3g, %lld near-tie swaps",
            title, s->run, s->passed, s->failed, s->unsupported, s->max_o_err, s->max_o_ratio,
            s->worst[0] ? s->worst : "-", s->max_lse_err, (long long)s->tie_swaps);
    if (s->sampled)
        fprintf(f, "; rows checked: %lld of %lld", (long long)s->rows_checked, (long long)s->rows_total);
    fprintf(f, "\n");
    if (s->failed) fprintf(f, "%s: first failure: %s\n", title, s->first_failure);
}
