/*
 * cpu_attention.c: the three attention branches of the semantics page.
 *
 *   CMP_ATTN  section 2 ("Compressed attention"): query t (local position)
 *             attends the nc(t) compressed rows i with i*d + l - 1 <= t;
 *             nc(t) = 0 gives o = 0 and lse = -inf.
 *   SLC_ATTN  section 4 ("Selected attention"): every token s <= t of the
 *             selected blocks of the query's KV group; -1 slots are empty.
 *   WIN_ATTN  section 5 ("Sliding window"): tokens [max(0, t - w + 1), t].
 *
 * All three are one function, attend_group(): softmax(scale * q . k_s) @ v_s
 * over a list of key-row ranges, in double: logits first, then their maximum
 * m, then sum = sum_s exp(logit_s - m), o = (sum_s exp(logit_s - m) v_s) / sum
 * and lse = m + log(sum) (natural log of the scaled logits). Keys are visited
 * in ascending order; o_b and lse are stored once in the call's float type (f32,
 * f64 in an f64 call: nsa_bk_float_dtype). The G query heads of
 * a KV head share their keys and are computed together.
 *
 * Parallel over tokens; one thread computes all heads of a token.
 *
 * Measured (paper defaults: Hq=64 Hkv=4 Dqk=192 Dv=128 n=16 w=512, bf16,
 * one sequence of T=1024, 2 threads, whole forward; slc and win are ~75%):
 *   v1  per query head, dtype converted inside the dot          9.5 s
 *   v2  per KV group: each K/V row converted once and used by
 *       the G heads; 4-chain dot (cpu_dtype.h)                   3.4 s  (this)
 *   v3  v2 with q transposed so the G dots advance together
 *       (vectorised over heads): ~1.45x slower than v2, not kept.
 */
#include <math.h>

#include "cpu_backend.h"
#include "cpu_dtype.h"
#include "cpu_parallel.h"

/* Rows [begin, end) of the K and V tensors (token rows, or compressed rows). */
typedef struct key_range {
    int64_t begin, end;
} key_range;

/* Per-thread scratch of an attention stage. All G query heads of one KV head
 * see the same keys, so they are processed together: each key and value row
 * is converted to double once and used G times. */
typedef struct attn_scratch {
    double *q;         /* [G][Dqk] the query rows of the group */
    double *acc;       /* [G][Dv] weighted sums of value rows */
    double *logits;    /* [G][max_keys], then the softmax weights */
    double *max, *sum; /* [G] per head: the largest logit, the sum of the weights */
    double *row;       /* [max(Dqk, Dv)] one key or value row */
    key_range *ranges; /* [max_ranges] */
} attn_scratch;

typedef struct attn_job {
    const nsa_bk_args *a;
    int64_t first;      /* the stage's first token: items [begin, end) are tokens first + [begin, end) */
    int64_t max_keys;   /* keys per query, at most */
    int64_t max_ranges; /* key ranges per query, at most */
} attn_job;

/* Scratch bytes per thread, or 0 (with *ok = 0) when that does not fit size_t. */
static size_t scratch_bytes(const nsa_config *cfg, int64_t max_keys, int64_t max_ranges, int *ok)
{
    const int64_t G = nsa_cpu_group(cfg);
    *ok = max_keys <= (INT64_MAX / 8) / G && max_ranges <= INT64_MAX / 64;
    if (!*ok)
        return 0;
    size_t rb = ((size_t)max_ranges * sizeof(key_range) + 63u) & ~(size_t)63u;
    return nsa_cpu_doubles(G * cfg->head_dim_qk) + nsa_cpu_doubles(G * cfg->head_dim_v) +
           nsa_cpu_doubles(G * max_keys) + 2 * nsa_cpu_doubles(G) + nsa_cpu_doubles(nsa_cpu_dmax(cfg)) + rb;
}

static attn_scratch scratch_parts(void *mem, const nsa_config *cfg, int64_t max_keys)
{
    const int64_t G = nsa_cpu_group(cfg);
    attn_scratch s;
    unsigned char *m = mem;
    s.q = (double *)m;
    m += nsa_cpu_doubles(G * cfg->head_dim_qk);
    s.acc = (double *)m;
    m += nsa_cpu_doubles(G * cfg->head_dim_v);
    s.logits = (double *)m;
    m += nsa_cpu_doubles(G * max_keys);
    s.max = (double *)m;
    m += nsa_cpu_doubles(G);
    s.sum = (double *)m;
    m += nsa_cpu_doubles(G);
    s.row = (double *)m;
    m += nsa_cpu_doubles(nsa_cpu_dmax(cfg));
    s.ranges = (key_range *)m;
    return s;
}

/* Softmax attention of the G query heads of KV head g at token t over the key
 * rows `ranges` of k and v (head g). For each query head h of the group:
 *   logit_s = scale * q(t,h) . k_s, m = max_s logit_s,
 *   sum = sum_s exp(logit_s - m), o = (sum_s exp(logit_s - m) v_s) / sum,
 *   lse = m + log(sum),
 * all in double, keys in ascending order; o_b[branch](t, h) and, if given,
 * lse[branch](t, h) are stored in the float type. No keys: o = 0 and lse = -inf. */
static void attend_group(const nsa_bk_args *a, int branch, const nsa_bk_tensor *k, const nsa_bk_tensor *v,
                         int64_t t, int64_t g, const key_range *ranges, int64_t nranges, const attn_job *job,
                         const attn_scratch *s)
{
    const nsa_config *cfg = &a->plan->cfg;
    const int64_t G = nsa_cpu_group(cfg), Dqk = cfg->head_dim_qk, Dv = cfg->head_dim_v;
    const int64_t cap = job->max_keys; /* row length of s->logits */
    const double scale = (double)cfg->scale;
    const void *kb = nsa_cpu_base(k);
    const void *vb = nsa_cpu_base(v);

    for (int64_t u = 0; u < G; u++)
        nsa_cpu_load_row(nsa_cpu_base(&a->q), a->q.dtype, nsa_cpu_at(&a->q, t, g * G + u), Dqk, s->q + u * Dqk);

    /* 1. scaled logits: logits[u][i] for query head g*G + u and the i-th key */
    int64_t n = 0;
    for (int64_t r = 0; r < nranges; r++)
        for (int64_t key = ranges[r].begin; key < ranges[r].end; key++, n++) {
            nsa_cpu_load_row(kb, k->dtype, nsa_cpu_at(k, key, g), Dqk, s->row);
            for (int64_t u = 0; u < G; u++)
                s->logits[u * cap + n] = scale * nsa_cpu_dot(s->q + u * Dqk, s->row, Dqk);
        }

    /* 2. per head: the maximum m, the weights exp(logit - m) (in place), their sum */
    for (int64_t u = 0; u < G; u++) {
        double *lg = s->logits + u * cap;
        double m = -INFINITY, sum = 0.0;
        for (int64_t i = 0; i < n; i++)
            if (lg[i] > m)
                m = lg[i];
        for (int64_t i = 0; i < n; i++) {
            lg[i] = exp(lg[i] - m);
            sum += lg[i];
        }
        s->max[u] = m;
        s->sum[u] = sum;
        for (int64_t c = 0; c < Dv; c++)
            s->acc[u * Dv + c] = 0.0;
    }

    /* 3. weighted values, keys in ascending order */
    int64_t i = 0;
    for (int64_t r = 0; r < nranges; r++)
        for (int64_t key = ranges[r].begin; key < ranges[r].end; key++, i++) {
            nsa_cpu_load_row(vb, v->dtype, nsa_cpu_at(v, key, g), Dv, s->row);
            for (int64_t u = 0; u < G; u++) {
                double p = s->logits[u * cap + i];
                double *acc = s->acc + u * Dv;
                for (int64_t c = 0; c < Dv; c++)
                    acc[c] += p * s->row[c];
            }
        }

    /* 4. normalise and store */
    const nsa_bk_tensor *ob = &a->o_b[branch];
    for (int64_t u = 0; u < G; u++) {
        int64_t h = g * G + u;
        const double *acc = s->acc + u * Dv;
        for (int64_t c = 0; c < Dv; c++) /* s->row holds max(Dqk, Dv) doubles */
            s->row[c] = n ? acc[c] / s->sum[u] : 0.0;
        nsa_cpu_store_row(s->row, nsa_cpu_base(ob), ob->dtype, nsa_cpu_at(ob, t, h), Dv);
        if (a->lse[branch].buf)
            nsa_cpu_fset(&a->lse[branch], nsa_cpu_at(&a->lse[branch], t, h),
                         n ? s->max[u] + log(s->sum[u]) : -INFINITY);
    }
}

/* ---- section 2: compressed attention */

static void cmp_tokens(void *user, int64_t begin, int64_t end, void *mem)
{
    const attn_job *job = user;
    const nsa_bk_args *a = job->a;
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    attn_scratch s = scratch_parts(mem, cfg, job->max_keys);
    const int64_t l = cfg->cmp_block, d = cfg->cmp_stride;

    for (int64_t t = job->first + begin; t < job->first + end; t++) {
        int64_t b;
        int64_t tl = nsa_cpu_local(p, t, &b);
        /* nc(t) = floor((t + 1 - l) / d) + 1 if t + 1 >= l, else 0:
         * exactly the blocks i with i*d + l - 1 <= t */
        int64_t nc = tl + 1 >= l ? (tl + 1 - l) / d + 1 : 0;
        key_range r = {p->cu_cmp[b], p->cu_cmp[b] + nc};
        for (int64_t g = 0; g < cfg->num_kv_heads; g++)
            attend_group(a, NSA_BRANCH_CMP, &a->kc, &a->vc, t, g, &r, 1, job, &s);
    }
}

/* ---- section 4: selected attention */

static void slc_tokens(void *user, int64_t begin, int64_t end, void *mem)
{
    const attn_job *job = user;
    const nsa_bk_args *a = job->a;
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    attn_scratch s = scratch_parts(mem, cfg, job->max_keys);
    const int64_t ls = cfg->slc_block, n = cfg->num_selected;

    for (int64_t t = job->first + begin; t < job->first + end; t++) {
        int64_t b;
        int64_t tl = nsa_cpu_local(p, t, &b);
        int64_t start = p->cu_seqlens_k[b]; /* key row of position 0 */
        for (int64_t g = 0; g < cfg->num_kv_heads; g++) {
            /* tokens of the selected blocks, causally cut at t; -1 slots are empty */
            const int32_t *idx = nsa_cpu_i32_at(&a->indices, t, g);
            int64_t nr = 0, keys = 0;
            for (int64_t k = 0; k < n && nr < job->max_ranges; k++) {
                int64_t j = idx[k];
                if (j < 0 || j * ls > tl) /* empty slot (or an ineligible block: nothing visible) */
                    continue;
                int64_t last = (j + 1) * ls - 1 < tl ? (j + 1) * ls - 1 : tl;
                int64_t len = last - j * ls + 1;
                if (len > job->max_keys - keys) /* only with repeated indices, which the core rejects */
                    len = job->max_keys - keys;
                if (len <= 0)
                    break;
                s.ranges[nr].begin = start + j * ls;
                s.ranges[nr].end = start + j * ls + len;
                nr++;
                keys += len;
            }
            attend_group(a, NSA_BRANCH_SLC, &a->k[NSA_BRANCH_SLC], &a->v[NSA_BRANCH_SLC], t, g, s.ranges, nr, job,
                         &s);
        }
    }
}

/* ---- section 5: sliding window */

static void win_tokens(void *user, int64_t begin, int64_t end, void *mem)
{
    const attn_job *job = user;
    const nsa_bk_args *a = job->a;
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    attn_scratch s = scratch_parts(mem, cfg, job->max_keys);
    const int64_t w = cfg->window;

    for (int64_t t = job->first + begin; t < job->first + end; t++) {
        int64_t b;
        int64_t tl = nsa_cpu_local(p, t, &b);
        int64_t first = tl - w + 1 > 0 ? tl - w + 1 : 0; /* max(0, t - w + 1) */
        key_range r = {p->cu_seqlens_k[b] + first, p->cu_seqlens_k[b] + tl + 1};
        for (int64_t g = 0; g < cfg->num_kv_heads; g++)
            attend_group(a, NSA_BRANCH_WIN, &a->k[NSA_BRANCH_WIN], &a->v[NSA_BRANCH_WIN], t, g, &r, 1, job, &s);
    }
}

/* Runs one attention stage over tokens [t0, t1). */
static nsa_status run_attention(const nsa_cpu_context *ctx, const nsa_bk_args *a, const char *stage,
                                int64_t max_keys, int64_t max_ranges, nsa_cpu_range_fn fn, int64_t t0, int64_t t1)
{
    const nsa_bk_plan *p = a->plan;
    int ok;
    size_t bytes = scratch_bytes(&p->cfg, max_keys, max_ranges, &ok);
    if (!ok)
        return nsa_cpu_host()->set_error(NSA_ERR_OUT_OF_MEMORY, "cpu backend: %s: scratch for %lld keys overflows",
                                         stage, (long long)max_keys);
    attn_job job = {a, t0, max_keys, max_ranges};
    return nsa_cpu_parallel_for(ctx->threads, t1 - t0, 0, bytes, fn, &job);
}

/* ---- stage entry points */

/* o_b and lse have the call's float type */
static nsa_status check_float(const nsa_bk_args *a, const nsa_bk_tensor *t, const char *stage, const char *name,
                              int optional)
{
    return nsa_cpu_need_float(a, t, stage, name, optional, NSA_ERR_UNSUPPORTED);
}

nsa_status nsa_cpu_cmp_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    return nsa_cpu_cmp_attn_rows(ctx, a, 0, a->plan->total_tokens);
}

nsa_status nsa_cpu_cmp_attn_rows(const nsa_cpu_context *ctx, const nsa_bk_args *a, int64_t t0, int64_t t1)
{
    const nsa_bk_plan *p = a->plan;
    const char *s = "cmp_attn";
    nsa_status st;
    if ((st = nsa_cpu_need(&a->q, s, "q", 1, 0)) || (st = nsa_cpu_need(&a->kc, s, "kc", 1, 0)) ||
        (st = nsa_cpu_need(&a->vc, s, "vc", 1, 0)) || (st = check_float(a, &a->o_b[NSA_BRANCH_CMP], s, "o_cmp", 0)) ||
        (st = check_float(a, &a->lse[NSA_BRANCH_CMP], s, "lse_cmp", 1)))
        return st;
    return run_attention(ctx, a, s, p->max_nc, 1, cmp_tokens, t0, t1);
}

nsa_status nsa_cpu_slc_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    return nsa_cpu_slc_attn_rows(ctx, a, 0, a->plan->total_tokens);
}

nsa_status nsa_cpu_slc_attn_rows(const nsa_cpu_context *ctx, const nsa_bk_args *a, int64_t t0, int64_t t1)
{
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    const char *s = "slc_attn";
    nsa_status st;
    if ((st = nsa_cpu_need(&a->q, s, "q", 1, 0)) || (st = nsa_cpu_need(&a->k[NSA_BRANCH_SLC], s, "k_slc", 1, 0)) ||
        (st = nsa_cpu_need(&a->v[NSA_BRANCH_SLC], s, "v_slc", 1, 0)) ||
        (st = nsa_cpu_need(&a->indices, s, "indices", 0, 1)) ||
        (st = check_float(a, &a->o_b[NSA_BRANCH_SLC], s, "o_slc", 0)) ||
        (st = check_float(a, &a->lse[NSA_BRANCH_SLC], s, "lse_slc", 1)))
        return st;
    /* at most n blocks of l_s tokens, and never more than the sequence */
    int64_t n = cfg->num_selected;
    int64_t max_keys = n > p->max_len / cfg->slc_block + 1 ? p->max_len : n * cfg->slc_block;
    if (max_keys > p->max_len)
        max_keys = p->max_len;
    int64_t max_ranges = n < p->max_len ? n : p->max_len;
    return run_attention(ctx, a, s, max_keys, max_ranges, slc_tokens, t0, t1);
}

nsa_status nsa_cpu_win_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    return nsa_cpu_win_attn_rows(ctx, a, 0, a->plan->total_tokens);
}

nsa_status nsa_cpu_win_attn_rows(const nsa_cpu_context *ctx, const nsa_bk_args *a, int64_t t0, int64_t t1)
{
    const nsa_bk_plan *p = a->plan;
    const char *s = "win_attn";
    nsa_status st;
    if ((st = nsa_cpu_need(&a->q, s, "q", 1, 0)) || (st = nsa_cpu_need(&a->k[NSA_BRANCH_WIN], s, "k_win", 1, 0)) ||
        (st = nsa_cpu_need(&a->v[NSA_BRANCH_WIN], s, "v_win", 1, 0)) ||
        (st = check_float(a, &a->o_b[NSA_BRANCH_WIN], s, "o_win", 0)) ||
        (st = check_float(a, &a->lse[NSA_BRANCH_WIN], s, "lse_win", 1)))
        return st;
    int64_t max_keys = p->cfg.window < p->max_len ? p->cfg.window : p->max_len;
    return run_attention(ctx, a, s, max_keys, 1, win_tokens, t0, t1);
}
