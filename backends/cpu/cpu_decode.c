/*
 * cpu_decode.c: the decode stages, semantics section 10 ("Decoding").
 *
 *   DECODE_APPEND  reads the step's lengths (cu_seqlens_q, cache_seqlens) and page
 *                  tables, checks every one of them before it writes anything
 *                  (a failed check returns its named status, naming the sequence
 *                  and entry, and writes only the status tensor), then per
 *                  sequence copies the TQ new tokens' k, v into each distinct
 *                  raw cache at positions TK0 .. TK - 1 and (MEAN, LINEAR) forms
 *                  the compressed rows Nc(TK0) <= i < Nc(TK) into kc_cache /
 *                  vc_cache with the forward's own per-row function
 *                  (nsa_cpu_compress_block), from the cached tokens.
 *   DECODE_ATTN    per sequence with TQ > 0: gathers its cached prefix through
 *                  the page tables into the plan's scratch (raw k, v of positions
 *                  0 .. TK - 1 for each branch that reads them, compressed rows
 *                  0 .. Nc(TK) - 1), then runs the forward's own stages on rows
 *                  TK0 .. TK - 1 of a one-sequence plan of TK tokens (cmp_attn,
 *                  scores_topn, slc_attn, win_attn, combine: cpu_attention.c,
 *                  cpu_select.c, cpu_combine.c), their q, gates and outputs
 *                  being views of the step's packed rows shifted so that local
 *                  position t is packed row cu_seqlens_q[b] + t - TK0.
 *
 * So every returned row is computed by the same functions, from the same
 * values in the same order, as the cpu forward's row of the whole sequence:
 * the two are bitwise equal (tests/test_decode.c checks it). The gather costs
 * O(TK) per sequence and step, and the plan keeps max_context rows of scratch
 * per raw cache: a reference, not a serving kernel.
 */
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "cpu_backend.h"
#include "cpu_dtype.h"
#include "cpu_parallel.h"

/* The decode plan's scratch (nsa_bk_plan.backend_plan of a decode plan). */
typedef struct cpu_decode_plan {
    void *mem;                 /* one allocation holding everything below */
    nsa_cpu_buffer raw_k[3], raw_v[3]; /* gathered raw prefix per branch [max_context, Hkv, D] (dtype) */
    int have_raw[3];
    nsa_cpu_buffer kc, vc;     /* gathered compressed rows [max_nc, Hkv, D] (dtype) */
    int64_t *tok_seq;          /* [max_context] zeros: the one-sequence plan's token -> sequence */
    int32_t *pcount, *ccount;  /* [num_pages], [num_cmp_pages]: uses of each page in a step's tables */
    int32_t *len;              /* [2B + 1]: cu_seqlens_q, then cache_seqlens, as read */
    double *scratch;           /* compression scratch: 3 * nsa_cpu_doubles(dmax) */
} cpu_decode_plan;

static nsa_status oom(size_t bytes)
{
    return nsa_cpu_host()->set_error(NSA_ERR_OUT_OF_MEMORY,
                                     "cpu backend: out of host memory for a decode plan's %zu bytes of scratch", bytes);
}

/* Appends n bytes (64-aligned) to a running total; 1 on overflow. */
static int add_part(size_t *total, int64_t count, size_t esize, size_t *at)
{
    size_t b;
    if (nsa_ck_bytes(count, esize, &b) || b > SIZE_MAX - 64u) return 1;
    b = (b + 63u) & ~(size_t)63u;
    if (*total > SIZE_MAX - b) return 1;
    *at = *total;
    *total += b;
    return 0;
}

nsa_status nsa_cpu_plan_prepare(void *bctx, nsa_bk_plan *plan)
{
    (void)bctx;
    plan->backend_plan = NULL;
    if (!plan->decode) return NSA_SUCCESS; /* forward plans need nothing */
    const nsa_config *cfg = &plan->cfg;
    const nsa_decode_limits *lim = &plan->lim;
    const int64_t hkv = cfg->num_kv_heads, dk = cfg->head_dim_qk, dv = cfg->head_dim_v, ctx = lim->max_context;
    const size_t es = nsa_dtype_size(cfg->dtype);
    const int raw[3] = {cfg->compress != NSA_COMPRESS_EXTERNAL, cfg->num_selected > 0, cfg->window > 0};
    cpu_decode_plan *d = calloc(1, sizeof *d);
    if (!d) return oom(sizeof *d);
    size_t total = 0, at_k[3] = {0}, at_v[3] = {0}, at_kc, at_vc, at_tok, at_pc, at_cc, at_len, at_sc;
    int64_t rk, rv, ck, cv;
    int bad = nsa_ck_mul(ctx * hkv, dk, &rk) || nsa_ck_mul(ctx * hkv, dv, &rv) ||
              nsa_ck_mul(plan->max_nc * hkv, dk, &ck) || nsa_ck_mul(plan->max_nc * hkv, dv, &cv);
    for (int b = 0; b < 3 && !bad; b++)
        if (raw[b]) bad = add_part(&total, rk, es, &at_k[b]) || add_part(&total, rv, es, &at_v[b]);
    bad = bad || add_part(&total, ck, es, &at_kc) || add_part(&total, cv, es, &at_vc) ||
          add_part(&total, ctx, sizeof(int64_t), &at_tok) || add_part(&total, lim->num_pages, 4, &at_pc) ||
          add_part(&total, lim->num_cmp_pages, 4, &at_cc) || add_part(&total, 2 * lim->batch + 1, 4, &at_len) ||
          add_part(&total, 3 * (int64_t)(nsa_cpu_doubles(nsa_cpu_dmax(cfg)) / sizeof(double)), sizeof(double), &at_sc);
    if (bad) {
        free(d);
        return nsa_cpu_host()->set_error(NSA_ERR_INVALID_SHAPE, "cpu backend: a decode plan's scratch for contexts of "
                                         "%lld tokens overflows the address space", (long long)ctx);
    }
    d->mem = aligned_alloc(64, total);
    if (!d->mem) {
        free(d);
        return oom(total);
    }
    unsigned char *m = d->mem;
    for (int b = 0; b < 3; b++) {
        d->have_raw[b] = raw[b];
        if (!raw[b]) continue;
        d->raw_k[b] = (nsa_cpu_buffer){m + at_k[b], (size_t)rk * es, NULL};
        d->raw_v[b] = (nsa_cpu_buffer){m + at_v[b], (size_t)rv * es, NULL};
    }
    d->kc = (nsa_cpu_buffer){m + at_kc, (size_t)ck * es, NULL};
    d->vc = (nsa_cpu_buffer){m + at_vc, (size_t)cv * es, NULL};
    d->tok_seq = (int64_t *)(m + at_tok);
    memset(d->tok_seq, 0, (size_t)ctx * sizeof(int64_t));
    d->pcount = (int32_t *)(m + at_pc);
    d->ccount = (int32_t *)(m + at_cc);
    d->len = (int32_t *)(m + at_len);
    d->scratch = (double *)(m + at_sc);
    plan->backend_plan = d;
    plan->backend_bytes = total;
    return NSA_SUCCESS;
}

void nsa_cpu_plan_release(void *bctx, nsa_bk_plan *plan)
{
    (void)bctx;
    cpu_decode_plan *d = plan->backend_plan;
    if (!d) return;
    free(d->mem);
    free(d);
    plan->backend_plan = NULL;
}

/* ---- helpers */

static int same_cache(const nsa_bk_tensor *a, const nsa_bk_tensor *b)
{
    return a->buf && a->buf == b->buf && a->offset == b->offset && a->stride_token == b->stride_token &&
           a->stride_head == b->stride_head;
}

/* Nc(x) of section 1, and Ns(x) of section 3 (the cpu backend's own device-side copy) */
static int64_t num_cmp(const nsa_config *c, int64_t x)
{
    return x >= c->cmp_block ? (x - c->cmp_block) / c->cmp_stride + 1 : 0;
}

static int32_t table_at(const nsa_bk_tensor *t, int64_t row, int64_t col)
{
    return nsa_cpu_i32_at(t, row, 0)[col];
}

/* Copies row (src_row, every head) of src to row dst_row of dst, D elements per head, bytes as they are. */
static void copy_row(const nsa_bk_tensor *src, int64_t src_row, const nsa_bk_tensor *dst, int64_t dst_row,
                     int64_t heads, int64_t D, size_t es)
{
    unsigned char *sb = nsa_cpu_base(src), *db = nsa_cpu_base(dst);
    for (int64_t g = 0; g < heads; g++)
        memcpy(db + (size_t)nsa_cpu_at(dst, dst_row, g) * es, sb + (size_t)nsa_cpu_at(src, src_row, g) * es,
               (size_t)D * es);
}

/* A dense [rows, heads, D] view of scratch buffer b. */
static nsa_bk_tensor dense(nsa_cpu_buffer *b, int64_t heads, int64_t D, nsa_dtype dt)
{
    nsa_bk_tensor t = {b, 0, heads * D, D, dt};
    return t;
}

/* A packed-rows tensor moved so that local position t reads packed row t + shift. */
static nsa_bk_tensor shifted(const nsa_bk_tensor *t, int64_t shift)
{
    nsa_bk_tensor s = *t;
    if (s.buf) s.offset += shift * s.stride_token;
    return s;
}

static void put_status(const nsa_bk_args *a, nsa_status s, int64_t seq)
{
    if (!a->dec_status.buf) return;
    int32_t *st = (int32_t *)nsa_cpu_base(&a->dec_status) + a->dec_status.offset;
    st[0] = (int32_t)s;
    st[1] = (int32_t)seq;
}

/* ---- DECODE_APPEND: the checks, then the writes */

static nsa_status fail(const nsa_bk_args *a, nsa_status s, int64_t seq)
{
    put_status(a, s, seq);
    return s; /* the message is already recorded */
}

/* Reads and checks the step's lengths and tables (nsa.h's nsa_decode); d->len holds them after. */
static nsa_status check_step(const nsa_bk_args *a, cpu_decode_plan *d)
{
    const nsa_bk_plan *p = a->plan;
    const nsa_config *c = &p->cfg;
    const nsa_decode_limits *lim = &p->lim;
    const nsa_host_api *h = nsa_cpu_host();
    const int64_t B = lim->batch, ps = lim->page_size, cps = lim->cmp_page_size;
    const int forms = c->compress != NSA_COMPRESS_EXTERNAL; /* the step writes compressed rows */
    int32_t *cu = d->len, *tk0s = d->len + B + 1;
    memcpy(cu, (int32_t *)nsa_cpu_base(&a->dec_cu_seqlens_q) + a->dec_cu_seqlens_q.offset,
           (size_t)(B + 1) * sizeof(int32_t));
    memcpy(tk0s, (int32_t *)nsa_cpu_base(&a->dec_cache_seqlens) + a->dec_cache_seqlens.offset,
           (size_t)B * sizeof(int32_t));
    if (cu[0] != 0)
        return fail(a, h->set_error(NSA_ERR_INVALID_SHAPE, "nsa_decode: cu_seqlens_q[0] = %d, but it must be 0",
                                    (int)cu[0]), 0);
    for (int64_t b = 0; b < B; b++) {
        const int64_t tq = (int64_t)cu[b + 1] - cu[b], tk0 = tk0s[b], tk = tk0 + tq;
        const char *why = NULL;
        if (tq < 0)
            why = "cu_seqlens_q decreases";
        else if (cu[b + 1] > lim->max_total_tokens)
            why = "cu_seqlens_q passes the plan's max_total_tokens";
        else if (tq > lim->max_step_tokens)
            why = "its TQ exceeds the plan's max_step_tokens";
        else if (tk0 < 0)
            why = "cache_seqlens (TK0) is negative";
        else if (tk > lim->max_context)
            why = "TK = TK0 + TQ exceeds the plan's max_context";
        else if (tq > 0 && tk > lim->max_pages * ps)
            why = "TK = TK0 + TQ does not fit its max_pages pages of page_size positions";
        else if (tq > 0 && num_cmp(c, tk) > lim->max_cmp_pages * cps)
            why = "its Nc(TK) compressed rows do not fit max_cmp_pages pages of cmp_page_size rows";
        if (why)
            return fail(a, h->set_error(NSA_ERR_INVALID_SHAPE,
                                        "nsa_decode: sequence %lld: %s (cu_seqlens_q[%lld] = %d, cu_seqlens_q[%lld] = "
                                        "%d, TQ = %lld, TK0 = %lld, TK = %lld; limits: max_step_tokens %lld, "
                                        "max_total_tokens %lld, max_context %lld, max_pages %lld x page_size %lld, "
                                        "max_cmp_pages %lld x cmp_page_size %lld)",
                                        (long long)b, why, (long long)b, (int)cu[b], (long long)(b + 1), (int)cu[b + 1],
                                        (long long)tq, (long long)tk0, (long long)tk, (long long)lim->max_step_tokens,
                                        (long long)lim->max_total_tokens, (long long)lim->max_context,
                                        (long long)lim->max_pages, (long long)ps, (long long)lim->max_cmp_pages,
                                        (long long)cps),
                        b);
        if (tq == 0) continue;
        /* every entry the step reads or writes: the pages of positions 0 .. TK - 1 and of rows 0 .. Nc(TK) - 1 */
        const int64_t np = (tk + ps - 1) / ps, ncp = (num_cmp(c, tk) + cps - 1) / cps;
        for (int64_t x = 0; x < np; x++) {
            const int32_t e = table_at(&a->dec_block_table, b, x);
            if (e < 0 || e >= lim->num_pages)
                return fail(a, h->set_error(NSA_ERR_INVALID_VALUE,
                                            "nsa_decode: block_table[%lld][%lld] = %d is outside [0, num_pages = %lld) "
                                            "(sequence %lld reads or writes positions %lld .. %lld there)",
                                            (long long)b, (long long)x, (int)e, (long long)lim->num_pages,
                                            (long long)b, (long long)(x * ps), (long long)(x * ps + ps - 1)),
                            b);
        }
        for (int64_t x = 0; x < ncp; x++) {
            const int32_t e = table_at(&a->dec_cmp_block_table, b, x);
            if (e < 0 || e >= lim->num_cmp_pages)
                return fail(a, h->set_error(NSA_ERR_INVALID_VALUE,
                                            "nsa_decode: cmp_block_table[%lld][%lld] = %d is outside [0, num_cmp_pages "
                                            "= %lld) (sequence %lld reads or writes compressed rows %lld .. %lld there)",
                                            (long long)b, (long long)x, (int)e, (long long)lim->num_cmp_pages,
                                            (long long)b, (long long)(x * cps), (long long)(x * cps + cps - 1)),
                            b);
        }
    }
    /* a page the step writes belongs to one sequence: it appears once in the
     * entries the batch's sequences use (positions 0 .. TK - 1, rows 0 .. Nc(TK) - 1) */
    memset(d->pcount, 0, (size_t)lim->num_pages * sizeof(int32_t));
    if (lim->num_cmp_pages > 0) memset(d->ccount, 0, (size_t)lim->num_cmp_pages * sizeof(int32_t));
    for (int64_t b = 0; b < B; b++) {
        const int64_t tk = (int64_t)tk0s[b] + cu[b + 1] - cu[b];
        int64_t np = (tk + ps - 1) / ps, ncp = (num_cmp(c, tk) + cps - 1) / cps;
        if (np > lim->max_pages) np = lim->max_pages; /* a TQ = 0 sequence is not held to its pages */
        if (ncp > lim->max_cmp_pages) ncp = lim->max_cmp_pages;
        for (int64_t x = 0; x < np; x++) {
            const int32_t e = table_at(&a->dec_block_table, b, x);
            if (e >= 0 && e < lim->num_pages && d->pcount[e] < INT32_MAX) d->pcount[e]++;
        }
        for (int64_t x = 0; x < ncp; x++) {
            const int32_t e = table_at(&a->dec_cmp_block_table, b, x);
            if (e >= 0 && e < lim->num_cmp_pages && d->ccount[e] < INT32_MAX) d->ccount[e]++;
        }
    }
    for (int64_t b = 0; b < B; b++) {
        const int64_t tq = (int64_t)cu[b + 1] - cu[b], tk0 = tk0s[b], tk = tk0 + tq;
        if (tq == 0) continue;
        for (int64_t x = tk0 / ps; x <= (tk - 1) / ps; x++) {
            const int32_t e = table_at(&a->dec_block_table, b, x);
            if (d->pcount[e] != 1)
                return fail(a, h->set_error(NSA_ERR_INVALID_VALUE,
                                            "nsa_decode: block_table[%lld][%lld] = %d: sequence %lld writes positions "
                                            "there, but page %d appears %d times in the batch's page tables (a page "
                                            "the step writes must belong to one sequence)",
                                            (long long)b, (long long)x, (int)e, (long long)b, (int)e, (int)d->pcount[e]),
                            b);
        }
        const int64_t nc0 = num_cmp(c, tk0), nc1 = num_cmp(c, tk);
        for (int64_t x = nc0 / cps; forms && nc1 > nc0 && x <= (nc1 - 1) / cps; x++) {
            const int32_t e = table_at(&a->dec_cmp_block_table, b, x);
            if (d->ccount[e] != 1)
                return fail(a, h->set_error(NSA_ERR_INVALID_VALUE,
                                            "nsa_decode: cmp_block_table[%lld][%lld] = %d: sequence %lld writes "
                                            "compressed rows there, but page %d appears %d times in the batch's "
                                            "compressed page tables (a page the step writes must belong to one "
                                            "sequence)",
                                            (long long)b, (long long)x, (int)e, (long long)b, (int)e, (int)d->ccount[e]),
                            b);
        }
    }
    return NSA_SUCCESS;
}

static int64_t pool_row(const nsa_bk_tensor *table, int64_t b, int64_t x, int64_t page)
{
    return (int64_t)table_at(table, b, x / page) * page + x % page;
}

nsa_status nsa_cpu_decode_append(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    (void)ctx;
    const nsa_bk_plan *p = a->plan;
    cpu_decode_plan *d = p->backend_plan;
    if (!p->decode || !d)
        return nsa_cpu_host()->set_error(NSA_ERR_INTERNAL, "cpu backend: decode_append on a plan without decode scratch");
    nsa_status s = check_step(a, d);
    if (s != NSA_SUCCESS) return s;
    const nsa_config *c = &p->cfg;
    const nsa_decode_limits *lim = &p->lim;
    const int64_t B = lim->batch, hkv = c->num_kv_heads, dk = c->head_dim_qk, dv = c->head_dim_v;
    const int64_t ps = lim->page_size, cps = lim->cmp_page_size, d_ = c->cmp_stride;
    const size_t es = nsa_dtype_size(c->dtype);
    const int32_t *cu = d->len, *tk0s = d->len + B + 1;
    for (int64_t b = 0; b < B; b++) {
        const int64_t tq = (int64_t)cu[b + 1] - cu[b], tk0 = tk0s[b], tk = tk0 + tq;
        if (tq == 0) continue;
        /* the new tokens into each distinct cache, once */
        for (int br = 0; br < 3; br++) {
            if (!a->dec_k_cache[br].buf) continue;
            int k_dup = 0, v_dup = 0;
            for (int e = 0; e < br; e++) {
                k_dup |= same_cache(&a->dec_k_cache[e], &a->dec_k_cache[br]);
                v_dup |= same_cache(&a->dec_v_cache[e], &a->dec_v_cache[br]);
            }
            for (int64_t x = tk0; x < tk; x++) {
                const int64_t row = pool_row(&a->dec_block_table, b, x, ps), in = cu[b] + x - tk0;
                if (!k_dup) copy_row(&a->k[br], in, &a->dec_k_cache[br], row, hkv, dk, es);
                if (!v_dup) copy_row(&a->v[br], in, &a->dec_v_cache[br], row, hkv, dv, es);
            }
        }
        /* the compressed blocks their arrival completes, once each, from the cached tokens */
        const int64_t nc0 = num_cmp(c, tk0), nc1 = num_cmp(c, tk);
        if (c->compress == NSA_COMPRESS_EXTERNAL || nc1 == nc0) continue;
        nsa_bk_tensor gk = dense(&d->raw_k[NSA_BRANCH_CMP], hkv, dk, c->dtype);
        nsa_bk_tensor gv = dense(&d->raw_v[NSA_BRANCH_CMP], hkv, dv, c->dtype);
        for (int64_t x = nc0 * d_; x < tk; x++) { /* positions of blocks nc0 .. nc1 - 1, at their own rows */
            const int64_t row = pool_row(&a->dec_block_table, b, x, ps);
            copy_row(&a->dec_k_cache[NSA_BRANCH_CMP], row, &gk, x, hkv, dk, es);
            copy_row(&a->dec_v_cache[NSA_BRANCH_CMP], row, &gv, x, hkv, dv, es);
        }
        for (int64_t i = nc0; i < nc1; i++)
            nsa_cpu_compress_block(a, &gk, &gv, i * d_, &a->dec_kc_cache, &a->dec_vc_cache,
                                   pool_row(&a->dec_cmp_block_table, b, i, cps), d->scratch);
    }
    put_status(a, NSA_SUCCESS, -1);
    return NSA_SUCCESS;
}

/* ---- DECODE_ATTN: per sequence, the forward's stages on its rows TK0 .. TK - 1 */

nsa_status nsa_cpu_decode_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    const nsa_bk_plan *p = a->plan;
    cpu_decode_plan *d = p->backend_plan;
    if (!p->decode || !d)
        return nsa_cpu_host()->set_error(NSA_ERR_INTERNAL, "cpu backend: decode_attn on a plan without decode scratch");
    const nsa_config *c = &p->cfg;
    const nsa_decode_limits *lim = &p->lim;
    const int64_t B = lim->batch, hkv = c->num_kv_heads, dk = c->head_dim_qk, dv = c->head_dim_v;
    const int64_t ps = lim->page_size, cps = lim->cmp_page_size;
    const size_t es = nsa_dtype_size(c->dtype);
    /* the lengths DECODE_APPEND read and checked (d->len) */
    const int32_t *cu = d->len, *tk0s = d->len + B + 1;
    nsa_status s = NSA_SUCCESS;
    for (int64_t b = 0; b < B && s == NSA_SUCCESS; b++) {
        const int64_t tq = (int64_t)cu[b + 1] - cu[b], tk0 = tk0s[b], tk = tk0 + tq;
        if (tq == 0) continue;
        const int64_t nc = num_cmp(c, tk);
        /* the one-sequence plan of the first TK tokens */
        nsa_bk_plan fp = *p;
        const int64_t cu2[2] = {0, tk}, cc2[2] = {0, nc};
        fp.decode = 0;
        fp.backend_plan = NULL;
        fp.batch = 1;
        fp.total_tokens = tk;
        fp.total_cmp = nc;
        fp.max_len = tk;
        fp.max_nc = nc;
        fp.max_ns = (tk + c->slc_block - 1) / c->slc_block;
        fp.cu_seqlens = cu2;
        fp.cu_seqlens_k = cu2;
        fp.total_keys = tk;
        fp.cu_cmp = cc2;
        fp.tok_seq = d->tok_seq;
        fp.tiles = NULL;
        fp.num_tiles = 0;
        nsa_bk_args fa;
        memset(&fa, 0, sizeof fa);
        fa.plan = &fp;
        /* the raw prefix of the branches that attend to tokens, each distinct cache once */
        for (int br = NSA_BRANCH_SLC; br <= NSA_BRANCH_WIN; br++) {
            if (!a->dec_k_cache[br].buf) continue;
            int src = br;
            for (int e = NSA_BRANCH_SLC; e < br; e++)
                if (same_cache(&a->dec_k_cache[e], &a->dec_k_cache[br]) &&
                    same_cache(&a->dec_v_cache[e], &a->dec_v_cache[br]))
                    src = e;
            fa.k[br] = dense(&d->raw_k[src], hkv, dk, c->dtype);
            fa.v[br] = dense(&d->raw_v[src], hkv, dv, c->dtype);
            if (src != br) continue;
            for (int64_t x = 0; x < tk; x++) {
                const int64_t row = pool_row(&a->dec_block_table, b, x, ps);
                copy_row(&a->dec_k_cache[br], row, &fa.k[br], x, hkv, dk, es);
                copy_row(&a->dec_v_cache[br], row, &fa.v[br], x, hkv, dv, es);
            }
        }
        /* the compressed rows 0 .. Nc(TK) - 1 */
        fa.kc = dense(&d->kc, hkv, dk, c->dtype);
        fa.vc = dense(&d->vc, hkv, dv, c->dtype);
        for (int64_t i = 0; i < nc; i++) {
            const int64_t row = pool_row(&a->dec_cmp_block_table, b, i, cps);
            copy_row(&a->dec_kc_cache, row, &fa.kc, i, hkv, dk, es);
            copy_row(&a->dec_vc_cache, row, &fa.vc, i, hkv, dv, es);
        }
        /* the packed rows: local position t is row cu[b] + t - TK0 */
        const int64_t sh = (int64_t)cu[b] - tk0;
        fa.q = shifted(&a->q, sh);
        fa.o = shifted(&a->o, sh);
        fa.indices = shifted(&a->indices, sh);
        for (int br = 0; br < 3; br++) {
            fa.gate[br] = shifted(&a->gate[br], sh);
            fa.lse[br] = shifted(&a->lse[br], sh);
            fa.o_b[br] = shifted(&a->o_b[br], sh);
        }
        s = nsa_cpu_cmp_attn_rows(ctx, &fa, tk0, tk);
        if (s == NSA_SUCCESS && c->num_selected > 0) {
            s = nsa_cpu_scores_topn_rows(ctx, &fa, tk0, tk);
            if (s == NSA_SUCCESS) s = nsa_cpu_slc_attn_rows(ctx, &fa, tk0, tk);
        }
        if (s == NSA_SUCCESS && c->window > 0) s = nsa_cpu_win_attn_rows(ctx, &fa, tk0, tk);
        if (s == NSA_SUCCESS) s = nsa_cpu_combine_rows(ctx, &fa, tk0, tk);
    }
    return s;
}
