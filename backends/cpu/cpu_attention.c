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
 * All three are one function, attend(): softmax(scale * q . k_s) @ v_s over a
 * list of key-row ranges, in double: logits first, then their maximum m, then
 * sum = sum_s exp(logit_s - m), o = (sum_s exp(logit_s - m) v_s) / sum and
 * lse = m + log(sum) (natural log of the scaled logits). Keys are visited in
 * ascending order; o_b is stored as f32, lse as f32.
 *
 * Parallel over tokens; one thread computes all heads of a token.
 */
#include <math.h>

#include "cpu_backend.h"
#include "cpu_dtype.h"
#include "cpu_parallel.h"

/* Rows [begin, end) of the K and V tensors (token rows, or compressed rows). */
typedef struct key_range {
    int64_t begin, end;
} key_range;

/* Per-thread scratch of an attention stage. */
typedef struct attn_scratch {
    double *q;        /* [Dqk] the query row */
    double *acc;      /* [Dv] the weighted sum of value rows */
    double *logits;   /* [max_keys] */
    key_range *ranges;/* [max_ranges] */
} attn_scratch;

typedef struct attn_job {
    const nsa_bk_args *a;
    int64_t max_keys;   /* capacity of logits */
    int64_t max_ranges; /* capacity of ranges */
} attn_job;

static size_t scratch_bytes(const nsa_config *cfg, int64_t max_keys, int64_t max_ranges)
{
    size_t rb = ((size_t)max_ranges * sizeof(key_range) + 63u) & ~(size_t)63u;
    return nsa_cpu_doubles(cfg->head_dim_qk) + nsa_cpu_doubles(cfg->head_dim_v) + nsa_cpu_doubles(max_keys) +
           rb;
}

static attn_scratch scratch_parts(void *mem, const nsa_config *cfg, int64_t max_keys)
{
    attn_scratch s;
    unsigned char *m = mem;
    s.q = (double *)m;
    m += nsa_cpu_doubles(cfg->head_dim_qk);
    s.acc = (double *)m;
    m += nsa_cpu_doubles(cfg->head_dim_v);
    s.logits = (double *)m;
    m += nsa_cpu_doubles(max_keys);
    s.ranges = (key_range *)m;
    return s;
}

/* Softmax attention of the query row q (already loaded, length Dqk) over key
 * rows `ranges` of head `g` of k and v; writes the f32 output row o_row[Dv]
 * and, when lse_out is not NULL, the log-sum-exp. No keys: o = 0, lse = -inf. */
static void attend(const double *q, const nsa_config *cfg, const nsa_bk_tensor *k, const nsa_bk_tensor *v,
                   int64_t g, const key_range *ranges, int64_t nranges, double *logits, double *acc,
                   float *o_row, float *lse_out)
{
    const int64_t Dqk = cfg->head_dim_qk, Dv = cfg->head_dim_v;
    const double scale = (double)cfg->scale;
    const void *kb = nsa_cpu_base(k);
    const void *vb = nsa_cpu_base(v);

    /* 1. scaled logits and their maximum */
    int64_t n = 0;
    double m = -INFINITY;
    for (int64_t r = 0; r < nranges; r++)
        for (int64_t s = ranges[r].begin; s < ranges[r].end; s++) {
            double x = scale * nsa_cpu_dot_row(q, kb, k->dtype, nsa_cpu_at(k, s, g), Dqk);
            logits[n++] = x;
            if (x > m)
                m = x;
        }
    if (n == 0) {
        for (int64_t c = 0; c < Dv; c++)
            o_row[c] = 0.0f;
        if (lse_out)
            *lse_out = -INFINITY;
        return;
    }

    /* 2. unnormalised weights exp(x - m), their sum, and the weighted values */
    for (int64_t c = 0; c < Dv; c++)
        acc[c] = 0.0;
    double sum = 0.0;
    n = 0;
    for (int64_t r = 0; r < nranges; r++)
        for (int64_t s = ranges[r].begin; s < ranges[r].end; s++) {
            double p = exp(logits[n++] - m);
            sum += p;
            nsa_cpu_axpy_row(p, vb, v->dtype, nsa_cpu_at(v, s, g), Dv, acc);
        }

    /* 3. normalise */
    for (int64_t c = 0; c < Dv; c++)
        o_row[c] = (float)(acc[c] / sum);
    if (lse_out)
        *lse_out = (float)(m + log(sum));
}

/* Loads q(t, h) into s->q. */
static void load_query(const nsa_bk_args *a, int64_t t, int64_t h, double *q)
{
    nsa_cpu_load_row(nsa_cpu_base(&a->q), a->q.dtype, nsa_cpu_at(&a->q, t, h), a->plan->cfg.head_dim_qk, q);
}

/* Output row and optional lse of branch b for (t, h). */
static float *out_row(const nsa_bk_args *a, int b, int64_t t, int64_t h)
{
    return nsa_cpu_f32_at(&a->o_b[b], t, h);
}

static float *lse_ptr(const nsa_bk_args *a, int b, int64_t t, int64_t h)
{
    return a->lse[b].buf ? nsa_cpu_f32_at(&a->lse[b], t, h) : NULL;
}

/* ---- section 2: compressed attention */

static void cmp_tokens(void *user, int64_t begin, int64_t end, void *mem)
{
    const attn_job *job = user;
    const nsa_bk_args *a = job->a;
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    attn_scratch s = scratch_parts(mem, cfg, job->max_keys);
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    const int64_t l = cfg->cmp_block, d = cfg->cmp_stride;

    for (int64_t t = begin; t < end; t++) {
        int64_t b;
        int64_t tl = nsa_cpu_local(p, t, &b);
        /* nc(t) = floor((t + 1 - l) / d) + 1 if t + 1 >= l, else 0 */
        int64_t nc = tl + 1 >= l ? (tl + 1 - l) / d + 1 : 0;
        key_range r = {p->cu_cmp[b], p->cu_cmp[b] + nc};
        for (int64_t h = 0; h < cfg->num_q_heads; h++) {
            load_query(a, t, h, s.q);
            attend(s.q, cfg, &a->kc, &a->vc, h / G, &r, 1, s.logits, s.acc, out_row(a, NSA_BRANCH_CMP, t, h),
                   lse_ptr(a, NSA_BRANCH_CMP, t, h));
        }
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
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    const int64_t ls = cfg->slc_block, n = cfg->num_selected;

    for (int64_t t = begin; t < end; t++) {
        int64_t b;
        int64_t tl = nsa_cpu_local(p, t, &b);
        int64_t start = p->cu_seqlens[b];
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
            for (int64_t h = g * G; h < (g + 1) * G; h++) {
                load_query(a, t, h, s.q);
                attend(s.q, cfg, &a->k[NSA_BRANCH_SLC], &a->v[NSA_BRANCH_SLC], g, s.ranges, nr, s.logits, s.acc,
                       out_row(a, NSA_BRANCH_SLC, t, h), lse_ptr(a, NSA_BRANCH_SLC, t, h));
            }
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
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    const int64_t w = cfg->window;

    for (int64_t t = begin; t < end; t++) {
        int64_t b;
        int64_t tl = nsa_cpu_local(p, t, &b);
        int64_t first = tl - w + 1 > 0 ? tl - w + 1 : 0; /* max(0, t - w + 1) */
        key_range r = {p->cu_seqlens[b] + first, t + 1};
        for (int64_t h = 0; h < cfg->num_q_heads; h++) {
            load_query(a, t, h, s.q);
            attend(s.q, cfg, &a->k[NSA_BRANCH_WIN], &a->v[NSA_BRANCH_WIN], h / G, &r, 1, s.logits, s.acc,
                   out_row(a, NSA_BRANCH_WIN, t, h), lse_ptr(a, NSA_BRANCH_WIN, t, h));
        }
    }
}

/* ---- stage entry points */

static nsa_status check_f32(const nsa_bk_tensor *t, const char *stage, const char *name, int optional)
{
    if (optional && !t->buf)
        return NSA_SUCCESS;
    if (!t->buf)
        return nsa_cpu_host()->set_error(NSA_ERR_MISSING_TENSOR, "cpu backend: stage %s needs tensor %s", stage,
                                         name);
    if (t->dtype != NSA_DTYPE_F32)
        return nsa_cpu_host()->set_error(NSA_ERR_UNSUPPORTED, "cpu backend: stage %s: tensor %s must be f32",
                                         stage, name);
    return NSA_SUCCESS;
}

nsa_status nsa_cpu_cmp_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    const nsa_bk_plan *p = a->plan;
    const char *s = "cmp_attn";
    nsa_status st;
    if ((st = nsa_cpu_need(&a->q, s, "q", 1, 0)) || (st = nsa_cpu_need(&a->kc, s, "kc", 1, 0)) ||
        (st = nsa_cpu_need(&a->vc, s, "vc", 1, 0)) || (st = check_f32(&a->o_b[NSA_BRANCH_CMP], s, "o_cmp", 0)) ||
        (st = check_f32(&a->lse[NSA_BRANCH_CMP], s, "lse_cmp", 1)))
        return st;
    attn_job job = {a, p->max_nc, 1};
    return nsa_cpu_parallel_for(ctx->threads, p->total_tokens, 0, scratch_bytes(&p->cfg, job.max_keys, 1),
                                cmp_tokens, &job);
}

nsa_status nsa_cpu_slc_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    const char *s = "slc_attn";
    nsa_status st;
    if ((st = nsa_cpu_need(&a->q, s, "q", 1, 0)) || (st = nsa_cpu_need(&a->k[NSA_BRANCH_SLC], s, "k_slc", 1, 0)) ||
        (st = nsa_cpu_need(&a->v[NSA_BRANCH_SLC], s, "v_slc", 1, 0)) ||
        (st = nsa_cpu_need(&a->indices, s, "indices", 0, 1)) ||
        (st = check_f32(&a->o_b[NSA_BRANCH_SLC], s, "o_slc", 0)) ||
        (st = check_f32(&a->lse[NSA_BRANCH_SLC], s, "lse_slc", 1)))
        return st;
    /* at most n blocks of l_s tokens, and never more than the sequence */
    int64_t n = cfg->num_selected;
    int64_t max_keys = n > p->max_len / cfg->slc_block + 1 ? p->max_len : n * cfg->slc_block;
    if (max_keys > p->max_len)
        max_keys = p->max_len;
    int64_t max_ranges = n < p->max_len ? n : p->max_len;
    attn_job job = {a, max_keys, max_ranges};
    return nsa_cpu_parallel_for(ctx->threads, p->total_tokens, 0, scratch_bytes(cfg, max_keys, max_ranges),
                                slc_tokens, &job);
}

nsa_status nsa_cpu_win_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    const nsa_bk_plan *p = a->plan;
    const char *s = "win_attn";
    nsa_status st;
    if ((st = nsa_cpu_need(&a->q, s, "q", 1, 0)) || (st = nsa_cpu_need(&a->k[NSA_BRANCH_WIN], s, "k_win", 1, 0)) ||
        (st = nsa_cpu_need(&a->v[NSA_BRANCH_WIN], s, "v_win", 1, 0)) ||
        (st = check_f32(&a->o_b[NSA_BRANCH_WIN], s, "o_win", 0)) ||
        (st = check_f32(&a->lse[NSA_BRANCH_WIN], s, "lse_win", 1)))
        return st;
    int64_t max_keys = p->cfg.window < p->max_len ? p->cfg.window : p->max_len;
    attn_job job = {a, max_keys, 1};
    return nsa_cpu_parallel_for(ctx->threads, p->total_tokens, 0, scratch_bytes(&p->cfg, max_keys, 1),
                                win_tokens, &job);
}
