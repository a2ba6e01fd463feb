/*
 * cpu_select.c: semantics section 3 ("Block importance and selection").
 *
 *   BLOCK_SCORES  s(t, g, j) = sum_{h in group g} sum_i (overlap(i, j) / d) * p_cmp(t, h, i)
 *                 with p_cmp(t, h, i) = exp(scale * q(t,h) . kc_i - lse_cmp(t, h)) over
 *                 the visible compressed blocks i (i*d + l - 1 <= t), for the eligible
 *                 j = 0 .. floor(t / l_s); stored as f32 in scores[t, g, j] (in every
 *                 dtype, f64 included: scores only rank blocks).
 *   SELECT_TOPN   the n eligible blocks of highest rank: forced blocks (j < n_init, and
 *                 floor(t/l_s) - n_local < j <= floor(t/l_s)) above every other, then by
 *                 score; among forced blocks and equal scores the lower index wins; fewer
 *                 than n eligible: all of them. Ascending, unused slots -1.
 *   SCORES_TOPN   both for one (t, g) at a time, through a local score row.
 *
 * The fused stage rounds its scores to f32 exactly as BLOCK_SCORES stores them
 * and then runs the same selection, so both paths pick bitwise the same blocks.
 * NaN scores (only from NaN inputs) rank below every number.
 */
#include <math.h>

#include "cpu_backend.h"
#include "cpu_dtype.h"
#include "cpu_parallel.h"

typedef struct select_job {
    const nsa_bk_args *a;
    int64_t first; /* items [begin, end) are tokens first + [begin, end) */
} select_job;

/* Per-thread scratch of the score stages. */
typedef struct score_scratch {
    double *q;    /* [G][Dqk] the query rows of the group */
    double *lse;  /* [G] their lse_cmp */
    double *row;  /* [Dqk] one compressed key row */
    double *acc;  /* [max_ns] s(t, g, j) being summed */
    float *score; /* [max_ns] the f32 scores (fused stage only) */
} score_scratch;

static size_t score_scratch_bytes(const nsa_bk_plan *p)
{
    const nsa_config *cfg = &p->cfg;
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    size_t fb = ((size_t)p->max_ns * sizeof(float) + 63u) & ~(size_t)63u;
    return nsa_cpu_doubles(G * cfg->head_dim_qk) + nsa_cpu_doubles(G) + nsa_cpu_doubles(cfg->head_dim_qk) +
           nsa_cpu_doubles(p->max_ns) + fb;
}

static score_scratch score_scratch_parts(void *mem, const nsa_bk_plan *p)
{
    const nsa_config *cfg = &p->cfg;
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    score_scratch s;
    unsigned char *m = mem;
    s.q = (double *)m;
    m += nsa_cpu_doubles(G * cfg->head_dim_qk);
    s.lse = (double *)m;
    m += nsa_cpu_doubles(G);
    s.row = (double *)m;
    m += nsa_cpu_doubles(cfg->head_dim_qk);
    s.acc = (double *)m;
    m += nsa_cpu_doubles(p->max_ns);
    s.score = (float *)m;
    return s;
}

/* Scores of every eligible block of (t, g) into out[0 .. floor(t_local/l_s)],
 * rounded to f32:
 *   s(t, g, j) = sum_{h in group g} sum_{visible i} (overlap(i, j) / d) * p_cmp(t, h, i)
 * summed with i outer and h inner (each compressed row is read once). */
static void group_scores(const nsa_bk_args *a, int64_t t, int64_t g, const score_scratch *s, float *out)
{
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    const int64_t l = cfg->cmp_block, d = cfg->cmp_stride, ls = cfg->slc_block;
    const int64_t Dqk = cfg->head_dim_qk;
    const double scale = (double)cfg->scale;
    const nsa_bk_tensor *kc = &a->kc;

    int64_t b;
    int64_t tl = nsa_cpu_local(p, t, &b);
    int64_t ne = tl / ls + 1; /* eligible blocks j = 0 .. floor(t / l_s) */
    int64_t nc = tl + 1 >= l ? (tl + 1 - l) / d + 1 : 0; /* visible compressed blocks */
    for (int64_t j = 0; j < ne; j++)
        s->acc[j] = 0.0;
    for (int64_t u = 0; u < G; u++) {
        nsa_cpu_load_row(nsa_cpu_base(&a->q), a->q.dtype, nsa_cpu_at(&a->q, t, g * G + u), Dqk, s->q + u * Dqk);
        s->lse[u] = nsa_cpu_fget(&a->lse[NSA_BRANCH_CMP], nsa_cpu_at(&a->lse[NSA_BRANCH_CMP], t, g * G + u));
    }

    for (int64_t i = 0; i < nc; i++) {
        nsa_cpu_load_row(nsa_cpu_base(kc), kc->dtype, nsa_cpu_at(kc, p->cu_cmp[b] + i, g), Dqk, s->row);
        /* compressed block i covers tokens [c0, c1]; it overlaps selection
         * blocks c0/l_s .. c1/l_s, all eligible since c1 <= t */
        int64_t c0 = i * d, c1 = i * d + l - 1;
        for (int64_t u = 0; u < G; u++) {
            double logit = scale * nsa_cpu_dot(s->q + u * Dqk, s->row, Dqk);
            double pc = exp(logit - s->lse[u]); /* p_cmp(t, h, i) */
            for (int64_t j = c0 / ls; j <= c1 / ls; j++) {
                int64_t s0 = j * ls > c0 ? j * ls : c0;
                int64_t s1 = (j + 1) * ls - 1 < c1 ? (j + 1) * ls - 1 : c1;
                s->acc[j] += ((double)(s1 - s0 + 1) / (double)d) * pc; /* overlap(i, j) / d */
            }
        }
    }
    for (int64_t j = 0; j < ne; j++)
        out[j] = (float)s->acc[j];
}

/* 1 if block j1 (score s1) ranks above block j2 (score s2). */
static int ranks_above(int64_t j1, float s1, int f1, int64_t j2, float s2, int f2)
{
    if (f1 != f2)
        return f1; /* forced above unforced */
    if (!f1) {
        int n1 = isnan(s1), n2 = isnan(s2);
        if (n1 != n2)
            return n2; /* a number above NaN */
        if (!n1 && s1 != s2)
            return s1 > s2;
    }
    return j1 < j2; /* forced pair, or equal scores: the lower index */
}

/* Top-n of the scores of one (t, g) row (section 3) into idx[0 .. n-1]. */
static void select_row(const nsa_config *cfg, int64_t tl, const float *score, int32_t *idx)
{
    const int64_t n = cfg->num_selected, ls = cfg->slc_block;
    const int64_t cur = tl / ls; /* the query's own block */
    const int64_t ne = cur + 1;  /* eligible blocks 0 .. cur */
#define FORCED(j) ((j) < cfg->num_init || (j) > cur - cfg->num_local)

    if (ne <= n) { /* every eligible block */
        for (int64_t k = 0; k < n; k++)
            idx[k] = k < ne ? (int32_t)k : -1;
        return;
    }
    /* keep the best k blocks seen so far in idx[0 .. k-1], best first */
    int64_t k = 0;
    for (int64_t j = 0; j < ne; j++) {
        int fj = FORCED(j);
        int64_t pos = k;
        while (pos > 0 && ranks_above(j, score[j], fj, idx[pos - 1], score[idx[pos - 1]], FORCED(idx[pos - 1])))
            pos--;
        if (pos >= n)
            continue; /* not among the best n */
        int64_t last = k < n ? k : n - 1;
        for (int64_t m = last; m > pos; m--)
            idx[m] = idx[m - 1];
        idx[pos] = (int32_t)j;
        if (k < n)
            k++;
    }
#undef FORCED
    /* report ascending (insertion sort of n entries) */
    for (int64_t a = 1; a < n; a++) {
        int32_t v = idx[a];
        int64_t m = a;
        while (m > 0 && idx[m - 1] > v) {
            idx[m] = idx[m - 1];
            m--;
        }
        idx[m] = v;
    }
}

/* ---- BLOCK_SCORES */

static void scores_tokens(void *user, int64_t begin, int64_t end, void *mem)
{
    const select_job *job = user;
    const nsa_bk_args *a = job->a;
    score_scratch s = score_scratch_parts(mem, a->plan);
    for (int64_t t = begin; t < end; t++)
        for (int64_t g = 0; g < a->plan->cfg.num_kv_heads; g++)
            group_scores(a, t, g, &s, nsa_cpu_f32_at(&a->scores, t, g));
}

/* ---- SELECT_TOPN */

static void topn_tokens(void *user, int64_t begin, int64_t end, void *mem)
{
    (void)mem;
    const select_job *job = user;
    const nsa_bk_args *a = job->a;
    const nsa_bk_plan *p = a->plan;
    for (int64_t t = begin; t < end; t++) {
        int64_t b;
        int64_t tl = nsa_cpu_local(p, t, &b);
        for (int64_t g = 0; g < p->cfg.num_kv_heads; g++)
            select_row(&p->cfg, tl, nsa_cpu_f32_at(&a->scores, t, g), nsa_cpu_i32_at(&a->indices, t, g));
    }
}

/* ---- SCORES_TOPN (fused) */

static void fused_tokens(void *user, int64_t begin, int64_t end, void *mem)
{
    const select_job *job = user;
    const nsa_bk_args *a = job->a;
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    score_scratch s = score_scratch_parts(mem, p);
    for (int64_t t = job->first + begin; t < job->first + end; t++) {
        int64_t b;
        int64_t tl = nsa_cpu_local(p, t, &b);
        for (int64_t g = 0; g < cfg->num_kv_heads; g++) {
            group_scores(a, t, g, &s, s.score);
            select_row(cfg, tl, s.score, nsa_cpu_i32_at(&a->indices, t, g));
        }
    }
}

/* ---- stage entry points */

static nsa_status need_scores_inputs(const nsa_bk_args *a, const char *s)
{
    nsa_status st;
    if ((st = nsa_cpu_need(&a->q, s, "q", 1, 0)) || (st = nsa_cpu_need(&a->kc, s, "kc", 1, 0)) ||
        (st = nsa_cpu_need(&a->lse[NSA_BRANCH_CMP], s, "lse_cmp", 1, 0)))
        return st;
    return nsa_cpu_need_float(a, &a->lse[NSA_BRANCH_CMP], s, "lse_cmp", 0, NSA_ERR_UNSUPPORTED);
}

static nsa_status need_f32_scores(const nsa_bk_args *a, const char *s)
{
    nsa_status st = nsa_cpu_need(&a->scores, s, "scores", 1, 0);
    if (st == NSA_SUCCESS && a->scores.dtype != NSA_DTYPE_F32)
        return nsa_cpu_host()->set_error(NSA_ERR_UNSUPPORTED, "cpu backend: stage %s: scores must be f32", s);
    return st;
}

nsa_status nsa_cpu_block_scores(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    const nsa_bk_plan *p = a->plan;
    nsa_status st;
    if ((st = need_scores_inputs(a, "block_scores")) || (st = need_f32_scores(a, "block_scores")))
        return st;
    select_job job = {a, 0};
    return nsa_cpu_parallel_for(ctx->threads, p->total_tokens, 0, score_scratch_bytes(p), scores_tokens, &job);
}

nsa_status nsa_cpu_select_topn(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    const nsa_bk_plan *p = a->plan;
    nsa_status st;
    if ((st = need_f32_scores(a, "select_topn")) || (st = nsa_cpu_need(&a->indices, "select_topn", "indices", 0, 1)))
        return st;
    select_job job = {a, 0};
    return nsa_cpu_parallel_for(ctx->threads, p->total_tokens, 0, 0, topn_tokens, &job);
}

nsa_status nsa_cpu_scores_topn(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    return nsa_cpu_scores_topn_rows(ctx, a, 0, a->plan->total_tokens);
}

nsa_status nsa_cpu_scores_topn_rows(const nsa_cpu_context *ctx, const nsa_bk_args *a, int64_t t0, int64_t t1)
{
    const nsa_bk_plan *p = a->plan;
    nsa_status st;
    if ((st = need_scores_inputs(a, "scores_topn")) || (st = nsa_cpu_need(&a->indices, "scores_topn", "indices", 0, 1)))
        return st;
    select_job job = {a, t0};
    return nsa_cpu_parallel_for(ctx->threads, t1 - t0, 0, score_scratch_bytes(p), fused_tokens, &job);
}
