/*
 * cpu_backward.c: the backward stages, semantics section 9 ("Gradients").
 *
 * For a branch b, a query row (t, h) of KV group g, its keys r (as the forward
 * visits them: cpu_attention.c) and the forward's LSE:
 *     p_r  = exp(scale q . k_r - lse)        e_r = dO . v_r
 *     dg_b = sum_r p_r e_r  (= dO . o_b)     D   = g_b dg_b  (= dO_b . o_b)
 *     ds_r = p_r (g_b e_r - D)
 *     dq  += scale sum_r ds_r k_r   dk_r += scale ds_r q   dv_r += p_r g_b dO
 * Each attention stage runs two passes, both in double:
 *   1. over query tokens (parallel): dg_b, D (kept in `delta`) and dq;
 *   2. over key rows (parallel): dk_r, dv_r summed over every query row that
 *      reads r, queries ascending, heads ascending (the compressed branch: one
 *      compressed row per item; window: one token; selected: one block of l_s
 *      tokens, and only the queries whose selection holds it).
 * So every accumulator element is summed by one thread in a fixed order, and
 * the result does not depend on the thread count (no atomics). Each stage adds
 * its part to the accumulators (zeroed by the core), rounding once per stage;
 * BWD_STORE rounds the accumulators once to the dtype. delta, the accumulators,
 * the LSEs, gates and dgate have the call's float type: f32, or f64 in an f64
 * call, whose gradients then round nowhere before BWD_STORE's f64 store.
 *
 * BWD_COMPRESS takes dkc, dvc back through phi: MEAN gives each of a block's l
 * rows dkc_i / l; LINEAR gives the rows and pe dkc_i W[g, j]^T and W the outer
 * products (k[i*d + j] + pe[g, j])^T dkc_i (section 1's W[g][j][r][c], r the
 * input feature). The dtype rounding of kc, vc passes gradients through.
 */
#include <math.h>

#include "cpu_backend.h"
#include "cpu_dtype.h"
#include "cpu_parallel.h"

typedef struct bwd_job {
    const nsa_bk_args *a;
    int branch;
    int64_t max_keys;   /* keys per query (pass 1) or per item (pass 2), at most */
    int64_t max_ranges; /* key ranges per query, at most */
} bwd_job;

typedef struct range64 {
    int64_t begin, end;
} range64;


/* The branch's key and value rows: kc / vc (compressed rows) or k[b] / v[b]. */
static const nsa_bk_tensor *keys_of(const nsa_bk_args *a, int b) { return b == NSA_BRANCH_CMP ? &a->kc : &a->k[b]; }
static const nsa_bk_tensor *values_of(const nsa_bk_args *a, int b)
{
    return b == NSA_BRANCH_CMP ? &a->vc : &a->v[b];
}

/* The key rows query t sees in branch b for KV head g, as the forward visits
 * them (cpu_attention.c); returns the number of ranges written to r. */
static int64_t key_ranges(const nsa_bk_args *a, int b, int64_t t, int64_t g, range64 *r, int64_t cap)
{
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    int64_t seq;
    const int64_t tl = nsa_cpu_local(p, t, &seq), start = p->cu_seqlens_k[seq]; /* key row of position 0 */
    if (b == NSA_BRANCH_CMP) {
        const int64_t l = cfg->cmp_block, d = cfg->cmp_stride;
        const int64_t nc = tl + 1 >= l ? (tl + 1 - l) / d + 1 : 0;
        r[0] = (range64){p->cu_cmp[seq], p->cu_cmp[seq] + nc};
        return 1;
    }
    if (b == NSA_BRANCH_WIN) {
        const int64_t first = tl - cfg->window + 1 > 0 ? tl - cfg->window + 1 : 0;
        r[0] = (range64){start + first, start + tl + 1};
        return 1;
    }
    const int64_t ls = cfg->slc_block, n = cfg->num_selected;
    const int32_t *idx = nsa_cpu_i32_at(&a->indices, t, g);
    int64_t nr = 0;
    for (int64_t k = 0; k < n && nr < cap; k++) {
        const int64_t j = idx[k];
        if (j < 0 || j * ls > tl) continue;
        const int64_t last = (j + 1) * ls - 1 < tl ? (j + 1) * ls - 1 : tl;
        r[nr++] = (range64){start + j * ls, start + last + 1};
    }
    return nr;
}

/* float accumulator elements [at, at + n) += x (rounded once to the float type) */
static void add_at(const nsa_bk_tensor *acc, int64_t at, const double *x, int64_t n)
{
    if (acc->dtype == NSA_DTYPE_F64) {
        double *dst = (double *)nsa_cpu_base(acc) + at;
        for (int64_t i = 0; i < n; i++) dst[i] += x[i];
        return;
    }
    float *dst = (float *)nsa_cpu_base(acc) + at;
    for (int64_t i = 0; i < n; i++) dst[i] = (float)((double)dst[i] + x[i]);
}

/* accumulator row (row, head) += x */
static void add_row(const nsa_bk_tensor *acc, int64_t row, int64_t head, const double *x, int64_t n)
{
    add_at(acc, nsa_cpu_at(acc, row, head), x, n);
}

/* ---- pass 1: per query token (dg, delta, dq) */

static size_t pass1_bytes(const nsa_config *cfg, int64_t max_keys, int64_t max_ranges)
{
    const int64_t G = nsa_cpu_group(cfg);
    return 2 * nsa_cpu_doubles(G * cfg->head_dim_qk) + nsa_cpu_doubles(G * cfg->head_dim_v) +
           2 * nsa_cpu_doubles(G * max_keys) + 2 * nsa_cpu_doubles(G) + nsa_cpu_doubles(nsa_cpu_dmax(cfg)) +
           nsa_cpu_doubles(2 * max_ranges);
}

static void pass1_tokens(void *user, int64_t begin, int64_t end, void *mem)
{
    const bwd_job *job = user;
    const nsa_bk_args *a = job->a;
    const nsa_config *cfg = &a->plan->cfg;
    const int b = job->branch;
    const int64_t G = nsa_cpu_group(cfg), Dqk = cfg->head_dim_qk, Dv = cfg->head_dim_v, cap = job->max_keys;
    const double scale = (double)cfg->scale;
    const nsa_bk_tensor *K = keys_of(a, b), *V = values_of(a, b);
    unsigned char *m = mem;
    double *q = (double *)m; m += nsa_cpu_doubles(G * Dqk);
    double *dq = (double *)m; m += nsa_cpu_doubles(G * Dqk);
    double *dO = (double *)m; m += nsa_cpu_doubles(G * Dv);
    double *pw = (double *)m; m += nsa_cpu_doubles(G * cap);
    double *ev = (double *)m; m += nsa_cpu_doubles(G * cap);
    double *lse = (double *)m; m += nsa_cpu_doubles(G);
    double *gate = (double *)m; m += nsa_cpu_doubles(G);
    double *row = (double *)m; m += nsa_cpu_doubles(nsa_cpu_dmax(cfg));
    range64 *rg = (range64 *)(void *)m;

    for (int64_t t = begin; t < end; t++)
        for (int64_t g = 0; g < cfg->num_kv_heads; g++) {
            const int64_t nr = key_ranges(a, b, t, g, rg, job->max_ranges);
            for (int64_t u = 0; u < G; u++) {
                const int64_t h = g * G + u;
                nsa_cpu_load_row(nsa_cpu_base(&a->q), a->q.dtype, nsa_cpu_at(&a->q, t, h), Dqk, q + u * Dqk);
                nsa_cpu_load_row(nsa_cpu_base(&a->dout), a->dout.dtype, nsa_cpu_at(&a->dout, t, h), Dv, dO + u * Dv);
                lse[u] = nsa_cpu_fget(&a->lse[b], nsa_cpu_at(&a->lse[b], t, h));
                gate[u] = nsa_cpu_fget(&a->gate[b], nsa_cpu_at(&a->gate[b], t, h));
            }
            /* p_r and e_r for every key, in the forward's order */
            int64_t n = 0;
            for (int64_t r = 0; r < nr; r++)
                for (int64_t key = rg[r].begin; key < rg[r].end && n < cap; key++, n++) {
                    nsa_cpu_load_row(nsa_cpu_base(K), K->dtype, nsa_cpu_at(K, key, g), Dqk, row);
                    for (int64_t u = 0; u < G; u++)
                        pw[u * cap + n] = isinf(lse[u]) && lse[u] < 0
                                              ? 0.0
                                              : exp(scale * nsa_cpu_dot(q + u * Dqk, row, Dqk) - lse[u]);
                    nsa_cpu_load_row(nsa_cpu_base(V), V->dtype, nsa_cpu_at(V, key, g), Dv, row);
                    for (int64_t u = 0; u < G; u++) ev[u * cap + n] = nsa_cpu_dot(dO + u * Dv, row, Dv);
                }
            for (int64_t u = 0; u < G; u++) {
                const int64_t h = g * G + u;
                double dg = 0.0;
                for (int64_t i = 0; i < n; i++) dg += pw[u * cap + i] * ev[u * cap + i];
                if (a->dgate[b].buf) nsa_cpu_fset(&a->dgate[b], nsa_cpu_at(&a->dgate[b], t, h), dg);
                nsa_cpu_fset(&a->delta, nsa_cpu_at(&a->delta, t, h), gate[u] * dg);
                /* ds_i = p_i (g e_i - D) = g p_i (e_i - dg), kept in pw */
                for (int64_t i = 0; i < n; i++) pw[u * cap + i] *= gate[u] * (ev[u * cap + i] - dg);
            }
            if (!a->dq_acc.buf) continue;
            for (int64_t c = 0; c < G * Dqk; c++) dq[c] = 0.0;
            int64_t i = 0;
            for (int64_t r = 0; r < nr; r++)
                for (int64_t key = rg[r].begin; key < rg[r].end && i < n; key++, i++) {
                    nsa_cpu_load_row(nsa_cpu_base(K), K->dtype, nsa_cpu_at(K, key, g), Dqk, row);
                    for (int64_t u = 0; u < G; u++) {
                        const double ds = scale * pw[u * cap + i];
                        double *d = dq + u * Dqk;
                        for (int64_t c = 0; c < Dqk; c++) d[c] += ds * row[c];
                    }
                }
            for (int64_t u = 0; u < G; u++) add_row(&a->dq_acc, t, g * G + u, dq + u * Dqk, Dqk);
        }
}

/* ---- pass 2: per key row (dk, dv) */

/* Does query t's selection (KV head g) hold block j? */
static int selects(const nsa_bk_args *a, int64_t t, int64_t g, int64_t j)
{
    const int32_t *idx = nsa_cpu_i32_at(&a->indices, t, g);
    for (int64_t k = 0; k < a->plan->cfg.num_selected; k++)
        if (idx[k] == j) return 1;
    return 0;
}

static size_t pass2_bytes(const nsa_config *cfg, int64_t max_keys)
{
    const int64_t D = cfg->head_dim_qk + cfg->head_dim_v;
    return 2 * nsa_cpu_doubles(max_keys * D) + nsa_cpu_doubles(D);
}

/* Key rows [r0, r0 + nk) of KV head g in branch b (rows of keys_of / values_of;
 * the token rows of sequence `seq`, or its compressed rows), read by the
 * queries t in [tq0, tq1) for which visible(t) > 0 keys of the set: the first
 * visible(t) of them. Adds dk, dv of the set to the accumulators. */
static void key_set(const nsa_bk_args *a, int b, int64_t g, int64_t r0, int64_t nk, int64_t tq0, int64_t tq1,
                    int64_t blk, void *mem)
{
    const nsa_config *cfg = &a->plan->cfg;
    const int64_t G = nsa_cpu_group(cfg), Dqk = cfg->head_dim_qk, Dv = cfg->head_dim_v, D = Dqk + Dv;
    const double scale = (double)cfg->scale;
    const nsa_bk_tensor *K = keys_of(a, b), *V = values_of(a, b);
    const nsa_bk_tensor *dK = b == NSA_BRANCH_CMP ? &a->dkc_acc : &a->dk_acc[b];
    const nsa_bk_tensor *dV = b == NSA_BRANCH_CMP ? &a->dvc_acc : &a->dv_acc[b];
    if (!dK->buf && !dV->buf) return;
    double *kv = mem;                                         /* [nk][Dqk | Dv] the rows */
    double *acc = kv + nsa_cpu_doubles(nk * D) / sizeof(double); /* [nk][dk | dv] */
    double *qo = acc + nsa_cpu_doubles(nk * D) / sizeof(double);  /* [Dqk | Dv] q and dO of one row */
    for (int64_t i = 0; i < nk; i++) {
        nsa_cpu_load_row(nsa_cpu_base(K), K->dtype, nsa_cpu_at(K, r0 + i, g), Dqk, kv + i * D);
        nsa_cpu_load_row(nsa_cpu_base(V), V->dtype, nsa_cpu_at(V, r0 + i, g), Dv, kv + i * D + Dqk);
    }
    for (int64_t c = 0; c < nk * D; c++) acc[c] = 0.0;
    const int64_t ls = cfg->slc_block;
    for (int64_t t = tq0; t < tq1; t++) {
        int64_t seq, nv = nk;
        const int64_t tl = nsa_cpu_local(a->plan, t, &seq);
        if (b == NSA_BRANCH_SLC) { /* the queries that selected block blk see its tokens <= t */
            if (!selects(a, t, g, blk)) continue;
            nv = tl - blk * ls + 1 < nk ? tl - blk * ls + 1 : nk;
        }
        for (int64_t u = 0; u < G; u++) {
            const int64_t h = g * G + u;
            const double lse = nsa_cpu_fget(&a->lse[b], nsa_cpu_at(&a->lse[b], t, h));
            if (isinf(lse) && lse < 0) continue; /* the row sees nothing */
            const double gate = nsa_cpu_fget(&a->gate[b], nsa_cpu_at(&a->gate[b], t, h));
            const double delta = nsa_cpu_fget(&a->delta, nsa_cpu_at(&a->delta, t, h));
            nsa_cpu_load_row(nsa_cpu_base(&a->q), a->q.dtype, nsa_cpu_at(&a->q, t, h), Dqk, qo);
            nsa_cpu_load_row(nsa_cpu_base(&a->dout), a->dout.dtype, nsa_cpu_at(&a->dout, t, h), Dv, qo + Dqk);
            for (int64_t i = 0; i < nv; i++) {
                const double *kr = kv + i * D;
                const double p = exp(scale * nsa_cpu_dot(qo, kr, Dqk) - lse);
                const double e = nsa_cpu_dot(qo + Dqk, kr + Dqk, Dv);
                const double ds = scale * p * (gate * e - delta), pg = p * gate;
                double *ak = acc + i * D;
                for (int64_t c = 0; c < Dqk; c++) ak[c] += ds * qo[c];
                for (int64_t c = 0; c < Dv; c++) ak[Dqk + c] += pg * qo[Dqk + c];
            }
        }
    }
    for (int64_t i = 0; i < nk; i++) {
        if (dK->buf) add_row(dK, r0 + i, g, acc + i * D, Dqk);
        if (dV->buf) add_row(dV, r0 + i, g, acc + i * D + Dqk, Dv);
    }
}

static void pass2_items(void *user, int64_t begin, int64_t end, void *mem)
{
    const bwd_job *job = user;
    const nsa_bk_args *a = job->a;
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    const int b = job->branch;
    /* Each item's readers are the queries at positions x0 .. x1 - 1 of its
     * sequence; only those at positions >= shift (the plan's queries) are rows. */
    for (int64_t it = begin; it < end; it++) {
        int64_t seq, x0, x1, r0 = it, nk = 1, blk = 0;
        if (b == NSA_BRANCH_CMP) { /* item: compressed row it, read by positions >= i*d + l - 1 */
            seq = nsa_cpu_cmp_row_sequence(p, it);
            x0 = (it - p->cu_cmp[seq]) * cfg->cmp_stride + cfg->cmp_block - 1;
            x1 = p->cu_seqlens_k[seq + 1] - p->cu_seqlens_k[seq];
        } else {
            const int64_t rl = nsa_cpu_key_local(p, it, &seq), tk = p->cu_seqlens_k[seq + 1] - p->cu_seqlens_k[seq];
            if (b == NSA_BRANCH_WIN) { /* item: key rl, read by positions rl .. rl + w - 1 */
                x0 = rl;
                x1 = rl + cfg->window < tk ? rl + cfg->window : tk;
            } else { /* selected: the item that starts a block handles the block */
                const int64_t ls = cfg->slc_block;
                if (rl % ls != 0) continue;
                nk = rl + ls < tk ? ls : tk - rl;
                blk = rl / ls;
                x0 = rl;
                x1 = tk;
            }
        }
        const int64_t shift = nsa_cpu_shift(p, seq);
        if (x0 < shift) x0 = shift;
        if (x1 <= x0) continue; /* no query of the plan reads it */
        const int64_t tq0 = nsa_cpu_query_row(p, seq, x0), tq1 = nsa_cpu_query_row(p, seq, x1);
        for (int64_t g = 0; g < cfg->num_kv_heads; g++) key_set(a, b, g, r0, nk, tq0, tq1, blk, mem);
    }
}

/* ---- stage entry points */

/* the core's float tensors (LSEs, gates, delta, accumulators): the call's float type */
static nsa_status need_f32(const nsa_bk_args *a, const nsa_bk_tensor *t, const char *stage, const char *name)
{
    return nsa_cpu_need_float(a, t, stage, name, 0, NSA_ERR_INTERNAL);
}

static nsa_status attn_backward(const nsa_cpu_context *ctx, const nsa_bk_args *a, int b, const char *stage)
{
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    nsa_status st;
    if ((st = nsa_cpu_need(&a->q, stage, "q", 1, 0)) || (st = nsa_cpu_need(&a->dout, stage, "dout", 1, 0)) ||
        (st = nsa_cpu_need(keys_of(a, b), stage, "k", 1, 0)) ||
        (st = nsa_cpu_need(values_of(a, b), stage, "v", 1, 0)) || (st = need_f32(a, &a->lse[b], stage, "lse")) ||
        (st = need_f32(a, &a->gate[b], stage, "gate")) || (st = need_f32(a, &a->delta, stage, "delta")) ||
        (b == NSA_BRANCH_SLC && (st = nsa_cpu_need(&a->indices, stage, "indices", 0, 1))))
        return st;
    int64_t keys1, ranges1 = 1, keys2 = 1, items = p->total_keys;
    if (b == NSA_BRANCH_CMP) {
        keys1 = p->max_nc;
        items = p->total_cmp;
    } else if (b == NSA_BRANCH_WIN) {
        keys1 = cfg->window < p->max_len ? cfg->window : p->max_len;
    } else {
        const int64_t n = cfg->num_selected, ls = cfg->slc_block;
        keys1 = n > p->max_len / ls + 1 ? p->max_len : n * ls;
        if (keys1 > p->max_len) keys1 = p->max_len;
        ranges1 = n < p->max_len ? n : p->max_len;
        keys2 = ls < p->max_len ? ls : p->max_len;
    }
    if (keys1 < 1) keys1 = 1;
    bwd_job job = {a, b, keys1, ranges1};
    if ((st = nsa_cpu_parallel_for(ctx->threads, p->total_tokens, 0, pass1_bytes(cfg, keys1, ranges1), pass1_tokens,
                                   &job)))
        return st;
    if (items == 0) return NSA_SUCCESS;
    job.max_keys = keys2;
    return nsa_cpu_parallel_for(ctx->threads, items, 0, pass2_bytes(cfg, keys2), pass2_items, &job);
}

nsa_status nsa_cpu_bwd_cmp_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    return attn_backward(ctx, a, NSA_BRANCH_CMP, "bwd_cmp_attn");
}
nsa_status nsa_cpu_bwd_slc_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    return attn_backward(ctx, a, NSA_BRANCH_SLC, "bwd_slc_attn");
}
nsa_status nsa_cpu_bwd_win_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    return attn_backward(ctx, a, NSA_BRANCH_WIN, "bwd_win_attn");
}

/* ---- BWD_COMPRESS */

typedef struct cbwd_job {
    const nsa_bk_args *a;
} cbwd_job;

/* Rows: item = key row t; its gradient from every block i that holds it (i*d <=
 * t_local <= i*d + l - 1), blocks ascending. */
static void compress_rows_bwd(void *user, int64_t begin, int64_t end, void *mem)
{
    const nsa_bk_args *a = ((const cbwd_job *)user)->a;
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    const int64_t l = cfg->cmp_block, d = cfg->cmp_stride, Dqk = cfg->head_dim_qk, Dv = cfg->head_dim_v;
    const int linear = cfg->compress == NSA_COMPRESS_LINEAR;
    double *acc = mem, *row = acc + nsa_cpu_doubles(nsa_cpu_dmax(cfg)) / sizeof(double);
    double *wrow = row + nsa_cpu_doubles(nsa_cpu_dmax(cfg)) / sizeof(double);
    for (int64_t t = begin; t < end; t++) {
        int64_t seq;
        const int64_t tl = nsa_cpu_key_local(p, t, &seq), nc = p->cu_cmp[seq + 1] - p->cu_cmp[seq];
        int64_t i0 = tl - l + 1 > 0 ? (tl - l + 1 + d - 1) / d : 0, i1 = tl / d; /* blocks i0 .. i1 */
        if (i1 > nc - 1) i1 = nc - 1;
        for (int side = 0; side < 2; side++) {
            const nsa_bk_tensor *dx = side ? &a->dv_acc[NSA_BRANCH_CMP] : &a->dk_acc[NSA_BRANCH_CMP];
            const nsa_bk_tensor *dc = side ? &a->dvc_acc : &a->dkc_acc;
            const nsa_bk_tensor *w = side ? &a->w_v : &a->w_k;
            const int64_t D = side ? Dv : Dqk;
            if (!dx->buf) continue;
            for (int64_t g = 0; g < cfg->num_kv_heads; g++) {
                for (int64_t c = 0; c < D; c++) acc[c] = 0.0;
                for (int64_t i = i0; i <= i1; i++) {
                    nsa_cpu_load_row(nsa_cpu_base(dc), dc->dtype, nsa_cpu_at(dc, p->cu_cmp[seq] + i, g), D, row);
                    if (!linear) {
                        for (int64_t c = 0; c < D; c++) acc[c] += row[c] / (double)l;
                        continue;
                    }
                    const int64_t j = tl - i * d, w0 = w->offset + (g * l + j) * D * D;
                    for (int64_t r = 0; r < D; r++) { /* (dkc_i W^T)[r] = sum_c W[r][c] dkc_i[c] */
                        nsa_cpu_load_row(nsa_cpu_base(w), w->dtype, w0 + r * D, D, wrow);
                        acc[r] += nsa_cpu_dot(wrow, row, D);
                    }
                }
                add_row(dx, t, g, acc, D);
            }
        }
    }
}

/* LINEAR weights: item = (g, j); dW[g][j][r][c] = sum_i a_i[r] dkc_i[c] and
 * dpe[g][j][r] = sum_i sum_c W[g][j][r][c] dkc_i[c], rows i over the batch ascending. */
static void compress_weights_bwd(void *user, int64_t begin, int64_t end, void *mem)
{
    const nsa_bk_args *a = ((const cbwd_job *)user)->a;
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    const int64_t l = cfg->cmp_block, d = cfg->cmp_stride;
    double *acc = mem, *x = acc + nsa_cpu_doubles(nsa_cpu_dmax(cfg)) / sizeof(double);
    double *sum = x + nsa_cpu_doubles(nsa_cpu_dmax(cfg)) / sizeof(double);
    double *pe = sum + nsa_cpu_doubles(nsa_cpu_dmax(cfg)) / sizeof(double);
    for (int64_t it = begin; it < end; it++) {
        const int64_t g = it / l, j = it % l;
        for (int side = 0; side < 2; side++) {
            const nsa_bk_tensor *dw = side ? &a->dw_v_acc : &a->dw_k_acc, *dpe = side ? &a->dpe_v_acc : &a->dpe_k_acc;
            const nsa_bk_tensor *dc = side ? &a->dvc_acc : &a->dkc_acc, *xin = side ? &a->v[NSA_BRANCH_CMP] : &a->k[NSA_BRANCH_CMP];
            const nsa_bk_tensor *w = side ? &a->w_v : &a->w_k, *pin = side ? &a->pe_v : &a->pe_k;
            const int64_t D = side ? cfg->head_dim_v : cfg->head_dim_qk;
            if (dw->buf) {
                if (pin->buf) nsa_cpu_load_row(nsa_cpu_base(pin), pin->dtype, pin->offset + (g * l + j) * D, D, pe);
                for (int64_t r = 0; r < D; r++) {
                    for (int64_t c = 0; c < D; c++) acc[c] = 0.0;
                    for (int64_t seq = 0; seq < p->batch; seq++)
                        for (int64_t row = p->cu_cmp[seq]; row < p->cu_cmp[seq + 1]; row++) {
                            const int64_t tok = p->cu_seqlens_k[seq] + (row - p->cu_cmp[seq]) * d + j;
                            nsa_cpu_load_row(nsa_cpu_base(xin), xin->dtype, nsa_cpu_at(xin, tok, g) + r, 1, x);
                            const double ar = x[0] + (pin->buf ? pe[r] : 0.0);
                            nsa_cpu_axpy_row(ar, nsa_cpu_base(dc), dc->dtype, nsa_cpu_at(dc, row, g), D, acc);
                        }
                    add_at(dw, dw->offset + ((g * l + j) * D + r) * D, acc, D);
                }
            }
            if (dpe->buf) {
                for (int64_t c = 0; c < D; c++) sum[c] = 0.0;
                for (int64_t row = 0; row < p->total_cmp; row++)
                    nsa_cpu_axpy_row(1.0, nsa_cpu_base(dc), dc->dtype, nsa_cpu_at(dc, row, g), D, sum);
                const int64_t w0 = w->offset + (g * l + j) * D * D;
                for (int64_t r = 0; r < D; r++) {
                    nsa_cpu_load_row(nsa_cpu_base(w), w->dtype, w0 + r * D, D, x);
                    const double dr = nsa_cpu_dot(x, sum, D);
                    add_at(dpe, dpe->offset + (g * l + j) * D + r, &dr, 1);
                }
            }
        }
    }
}

nsa_status nsa_cpu_bwd_compress(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    const char *s = "bwd_compress";
    nsa_status st;
    if (cfg->compress == NSA_COMPRESS_EXTERNAL || p->total_cmp == 0) return NSA_SUCCESS;
    if ((st = need_f32(a, &a->dkc_acc, s, "dkc_acc")) || (st = need_f32(a, &a->dvc_acc, s, "dvc_acc"))) return st;
    const int linear = cfg->compress == NSA_COMPRESS_LINEAR;
    if (linear && ((st = nsa_cpu_need(&a->w_k, s, "w_k", 1, 0)) || (st = nsa_cpu_need(&a->w_v, s, "w_v", 1, 0)) ||
                   ((a->dw_k_acc.buf || a->dw_v_acc.buf) &&
                    ((st = nsa_cpu_need(&a->k[NSA_BRANCH_CMP], s, "k_cmp", 1, 0)) ||
                     (st = nsa_cpu_need(&a->v[NSA_BRANCH_CMP], s, "v_cmp", 1, 0))))))
        return st;
    cbwd_job job = {a};
    if ((a->dk_acc[NSA_BRANCH_CMP].buf || a->dv_acc[NSA_BRANCH_CMP].buf) &&
        (st = nsa_cpu_parallel_for(ctx->threads, p->total_keys, 0, 3 * nsa_cpu_doubles(nsa_cpu_dmax(cfg)),
                                   compress_rows_bwd, &job)))
        return st;
    if (linear && (a->dw_k_acc.buf || a->dw_v_acc.buf || a->dpe_k_acc.buf || a->dpe_v_acc.buf))
        return nsa_cpu_parallel_for(ctx->threads, cfg->num_kv_heads * cfg->cmp_block, 1,
                                    4 * nsa_cpu_doubles(nsa_cpu_dmax(cfg)), compress_weights_bwd, &job);
    return NSA_SUCCESS;
}

/* ---- BWD_STORE: each accumulator rounded once to its output's dtype */

static void store_rows(void *user, int64_t begin, int64_t end, void *mem)
{
    const nsa_bk_args *a = ((const cbwd_job *)user)->a;
    double *x = mem;
    for (int64_t it = begin; it < end; it++) {
        /* item = (store k, row): rows of the stores laid end to end */
        int64_t k = 0, row = it;
        while (k < a->num_store && row >= a->store[k].rows) row -= a->store[k++].rows;
        if (k == a->num_store) continue;
        const nsa_bk_store *s = &a->store[k];
        for (int64_t h = 0; h < s->heads; h++) {
            nsa_cpu_load_row(nsa_cpu_base(&s->acc), s->acc.dtype, nsa_cpu_at(&s->acc, row, h), s->dim, x);
            nsa_cpu_store_row(x, nsa_cpu_base(&s->out), s->out.dtype, nsa_cpu_at(&s->out, row, h), s->dim);
        }
    }
}

nsa_status nsa_cpu_bwd_store(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    int64_t rows = 0, dim = 1;
    for (int k = 0; k < a->num_store; k++) {
        nsa_status st;
        if ((st = need_f32(a, &a->store[k].acc, "bwd_store", "acc")) ||
            (st = nsa_cpu_need(&a->store[k].out, "bwd_store", "out", 1, 0)))
            return st;
        rows += a->store[k].rows;
        if (a->store[k].dim > dim) dim = a->store[k].dim;
    }
    cbwd_job job = {a};
    return rows ? nsa_cpu_parallel_for(ctx->threads, rows, 0, nsa_cpu_doubles(dim), store_rows, &job) : NSA_SUCCESS;
}
