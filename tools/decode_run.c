/* A decode run of the tool's problem over shuffled paged caches (see decode_run.h). */
#include "decode_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "problem.h"
#include "tool.h"

/* "what: message" for a failure that is the tool's, not a library call's */
static nsa_status fail_msg(char *err, size_t err_size, nsa_status s, const char *fmt, const char *what)
{
    snprintf(err, err_size, fmt, what);
    return s;
}

/* count elements of es bytes as a byte count, or 1 when it overflows */
static int bytes_of(int64_t count, size_t es, size_t *out)
{
    return nsa_ck_bytes(count, es, out);
}

/* A buffer of count elements of es bytes, filled with poison; registered for decode_run_free. */
static nsa_status new_buf(decode_run *d, int64_t count, size_t es, unsigned char poison, nsa_buffer **out,
                          const char *name, char *err, size_t err_size)
{
    size_t bytes;
    nsa_status s;
    if (bytes_of(count, es, &bytes))
        return fail_msg(err, err_size, NSA_ERR_INVALID_SHAPE, "decode run: the size of %s overflows 64 bits", name);
    if (d->nbufs >= DECODE_RUN_MAX_BUFS)
        return fail_msg(err, err_size, NSA_ERR_INTERNAL, "decode run: too many buffers (%s)", name);
    s = nsa_buffer_alloc(d->ctx, bytes ? bytes : 16, out);
    if (s != NSA_SUCCESS) { /* the caches of a long context may not fit: say which and how large */
        char what[96], size[32];
        snprintf(what, sizeof what, "nsa_buffer_alloc (%s, %s)", name, tool_bytes((double)bytes, size, sizeof size));
        return tool_format_error(err, err_size, what, s);
    }
    d->bufs[d->nbufs++] = *out;
    s = nsa_buffer_fill(*out, 0, poison, nsa_buffer_size(*out));
    if (s != NSA_SUCCESS)
        return tool_format_error(err, err_size, "nsa_buffer_fill", s);
    return NSA_SUCCESS;
}

/* n floats converted to dt, written at element offset off of b (staged through d->bstage) */
static nsa_status put(decode_run *d, nsa_buffer *b, int64_t off, const float *x, int64_t n, nsa_dtype dt, char *err,
                      size_t err_size)
{
    const size_t es = nsa_dtype_size(dt);
    nsa_status s;
    if (n == 0)
        return NSA_SUCCESS;
    s = nsa_convert(x, NSA_DTYPE_F32, d->bstage, dt, n);
    if (s != NSA_SUCCESS)
        return tool_format_error(err, err_size, "nsa_convert", s);
    s = nsa_buffer_write(b, (size_t)off * es, d->bstage, (size_t)n * es);
    if (s != NSA_SUCCESS)
        return tool_format_error(err, err_size, "nsa_buffer_write", s);
    return NSA_SUCCESS;
}

static nsa_tensor view(nsa_buffer *b, int64_t heads, int64_t dim)
{
    return b ? nsa_tensor_dense(b, 0, heads, dim) : (nsa_tensor){0};
}

static int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* The capacities of B sequences of at most max_len tokens (max_nc compressed
 * rows) and steps of max_step: a spare page-table column and spare pages, so
 * that the tables matter. 1 when one overflows 64 bits. */
static int limits_of(int64_t B, int64_t max_step, int64_t max_len, int64_t max_nc, int64_t page_size,
                     int64_t cmp_page_size, nsa_decode_limits *lim)
{
    lim->batch = B;
    lim->max_step_tokens = max_step;
    lim->max_context = max_len;
    lim->page_size = page_size;
    lim->cmp_page_size = cmp_page_size;
    return nsa_ck_add(ceil_div(max_len, page_size), 1, &lim->max_pages) ||
           nsa_ck_add(ceil_div(max_nc, cmp_page_size), 1, &lim->max_cmp_pages) ||
           nsa_ck_mul(B, max_step, &lim->max_total_tokens) || nsa_ck_mul(B, lim->max_pages, &lim->num_pages) ||
           nsa_ck_add(lim->num_pages, 1, &lim->num_pages) ||
           nsa_ck_mul(B, lim->max_cmp_pages, &lim->num_cmp_pages);
}

/* The start of both setups: d zeroed, the config, the inputs and the per-sequence arrays of B. */
static nsa_status start(decode_run *d, nsa_context *ctx, const nsa_config *cfg, int64_t B, const tk_inputs *in,
                        char *err, size_t err_size)
{
    size_t bytes;
    int64_t count;
    d->ctx = ctx;
    d->cfg = *cfg;
    d->in = in;
    d->B = B;
    /* len, done, in_row, cmp_base, tq (int64) and cu, tk0 (int32, B + 1 and B);
     * B beyond int32 could not be served anyway: the int32 cu_seqlens_q counts
     * the plan's B x max_step rows */
    if (B < 1 || B > INT32_MAX || nsa_ck_mul(B, 6, &count) || nsa_ck_add(count, 1, &count) ||
        nsa_ck_bytes(count, sizeof(int64_t), &bytes))
        return fail_msg(err, err_size, NSA_ERR_INVALID_SHAPE, "%s: the batch must be 1 .. 2^31 - 1 sequences",
                        "decode run");
    int64_t *a = calloc(1, bytes);
    if (!a) return fail_msg(err, err_size, NSA_ERR_OUT_OF_MEMORY, "%s: out of host memory", "decode run");
    d->len = a;
    d->done = a + B;
    d->in_row = a + 2 * B;
    d->cmp_base = a + 3 * B;
    d->tq = a + 4 * B;
    d->cu = (int32_t *)(a + 5 * B);
    d->tk0 = d->cu + B + 1;
    return NSA_SUCCESS;
}

static nsa_status setup(decode_run *d, int64_t max_step, int64_t page_size, int64_t cmp_page_size, uint64_t seed,
                        char *err, size_t err_size);

nsa_status decode_run_setup(nsa_context *ctx, const tk_case *c, const tk_inputs *in, int64_t max_step,
                            int64_t page_size, int64_t cmp_page_size, uint64_t seed, decode_run *d, char *err,
                            size_t err_size)
{
    nsa_status s;
    memset(d, 0, sizeof *d);
    if (c->fixed_indices && c->cfg.num_selected > 0)
        return fail_msg(err, err_size, NSA_ERR_INVALID_VALUE,
                        "%s: a decode step has no block_indices argument (it selects blocks itself)",
                        "block_indices.npy");
    if ((s = start(d, ctx, &c->cfg, c->batch, in, err, err_size)) != NSA_SUCCESS) return s;
    int64_t base = 0;
    for (int64_t b = 0; b < d->B; b++) {
        d->len[b] = c->cu_seqlens[b + 1] - c->cu_seqlens[b];
        d->in_row[b] = c->cu_seqlens[b];
        d->cmp_base[b] = base;
        base += tk_num_cmp_blocks(&d->cfg, d->len[b]);
    }
    return setup(d, max_step, page_size, cmp_page_size, seed, err, err_size);
}

nsa_status decode_run_setup_step(nsa_context *ctx, const nsa_config *cfg, int64_t B, int64_t context, int64_t tq,
                                 const tk_inputs *in, int64_t page_size, int64_t cmp_page_size, uint64_t seed,
                                 decode_run *d, char *err, size_t err_size)
{
    nsa_status s;
    int64_t len, rows;
    memset(d, 0, sizeof *d);
    if (context < 0 || tq < 1 || nsa_ck_add(context, tq, &len) || nsa_ck_mul(B, tq, &rows) || rows != in->tokens)
        return fail_msg(err, err_size, NSA_ERR_INVALID_VALUE,
                        "%s: a step needs context >= 0, tq >= 1 and inputs of B x tq tokens", "decode run");
    if ((s = start(d, ctx, cfg, B, in, err, err_size)) != NSA_SUCCESS) return s;
    for (int64_t b = 0; b < B; b++) {
        d->len[b] = len;
        d->in_row[b] = b * tq - context;
    }
    d->fill_context = context;
    return setup(d, tq, page_size, cmp_page_size, seed, err, err_size);
}

/* The plan, the page tables and the buffers, once d's sequences are set. */
static nsa_status setup(decode_run *d, int64_t max_step, int64_t page_size, int64_t cmp_page_size, uint64_t seed,
                        char *err, size_t err_size)
{
    nsa_status s;
    nsa_context *ctx = d->ctx;
    const tk_inputs *in = d->in;
    const nsa_config *g = &d->cfg;
    if (max_step < 1 || page_size < 1 || cmp_page_size < 1)
        return fail_msg(err, err_size, NSA_ERR_INVALID_VALUE, "%s: the step and page sizes must be >= 1",
                        "decode run");
    d->dt = g->dtype;
    d->fdt = tk_float_dtype(d->dt);
    d->es = nsa_dtype_size(d->dt);
    d->fes = nsa_dtype_size(d->fdt);
    d->Hq = g->num_q_heads;
    d->Hkv = g->num_kv_heads;
    d->Dqk = g->head_dim_qk;
    d->Dv = g->head_dim_v;
    d->n = g->num_selected;
    int64_t max_len = 1, max_nc = 0;
    for (int64_t b = 0; b < d->B; b++) {
        if (d->len[b] > max_len) max_len = d->len[b];
        if (tk_num_cmp_blocks(g, d->len[b]) > max_nc) max_nc = tk_num_cmp_blocks(g, d->len[b]);
    }
    d->on[0] = 1;
    d->on[1] = d->n > 0;
    d->on[2] = g->window > 0;
    for (int b = 0; b < 3; b++) {
        d->raw[b] = d->on[b] && !(b == NSA_BRANCH_CMP && g->compress == NSA_COMPRESS_EXTERNAL);
        d->shared_with[b] = b;
        for (int e = 0; e < b && d->raw[b]; e++)
            if (d->raw[e] && d->shared_with[e] == e && in->k[e] == in->k[b] && in->v[e] == in->v[b]) {
                d->shared_with[b] = e;
                break;
            }
    }
    nsa_decode_limits *lim = &d->lim;
    if (limits_of(d->B, max_step, max_len, max_nc, page_size, cmp_page_size, lim))
        return fail_msg(err, err_size, NSA_ERR_INVALID_SHAPE, "%s: the capacities overflow 64 bits", "decode run");
    if (lim->max_total_tokens > INT32_MAX || max_len > INT32_MAX)
        return fail_msg(err, err_size, NSA_ERR_INVALID_SHAPE,
                        "%s: a step's rows (batch x step) and a sequence's length must fit the int32 step lengths "
                        "(cu_seqlens_q, cache_seqlens)", "decode run");
    s = nsa_decode_plan_create(ctx, g, lim, &d->plan);
    if (s != NSA_SUCCESS)
        return tool_format_error(err, err_size, "nsa_decode_plan_create", s);
    s = nsa_plan_get_info(d->plan, &d->info);
    if (s != NSA_SUCCESS)
        return tool_format_error(err, err_size, "nsa_plan_get_info", s);
    /* the library has checked every cache and table size of lim in 64 bits: the
     * products below fit; they are checked again where they become byte counts */
    const int64_t MT = lim->max_total_tokens, pool = lim->num_pages * page_size;
    const int64_t cpool = lim->num_cmp_pages * cmp_page_size;
    int64_t wide = d->Hq * (d->Dqk > d->Dv ? d->Dqk : d->Dv);
    if (d->Hkv * d->n > wide) wide = d->Hkv * d->n;
    int64_t stage_elems;
    size_t hbytes, bbytes;
    if (nsa_ck_mul(MT, wide, &stage_elems) || bytes_of(stage_elems, sizeof(float), &hbytes) ||
        bytes_of(stage_elems, sizeof(double), &bbytes))
        return fail_msg(err, err_size, NSA_ERR_INVALID_SHAPE, "%s: the step's host staging overflows 64 bits",
                        "decode run");
    d->hstage = malloc(hbytes ? hbytes : 1);
    d->bstage = malloc(bbytes ? bbytes : 1);
    size_t tbytes, ctbytes, pbytes, cpbytes;
    int64_t tcount = d->B * lim->max_pages, ctcount = d->B * lim->max_cmp_pages;
    if (bytes_of(tcount, 4, &tbytes) || bytes_of(ctcount, 4, &ctbytes) || bytes_of(lim->num_pages, 4, &pbytes) ||
        bytes_of(lim->num_cmp_pages, 4, &cpbytes))
        return fail_msg(err, err_size, NSA_ERR_INVALID_SHAPE, "%s: the page tables overflow 64 bits", "decode run");
    d->table = malloc(tbytes + 4);
    d->ctable = malloc(ctbytes + 4);
    int32_t *perm = malloc(pbytes + 4), *cperm = malloc(cpbytes + 4);
    if (!d->hstage || !d->bstage || !d->table || !d->ctable || !perm || !cperm) {
        free(perm);
        free(cperm);
        return fail_msg(err, err_size, NSA_ERR_OUT_OF_MEMORY, "%s: out of host memory", "decode run");
    }
    /* page tables: every sequence's pages anywhere in the pools */
    uint64_t rs = seed;
    tk_shuffle(perm, lim->num_pages, &rs);
    tk_shuffle(cperm, lim->num_cmp_pages, &rs);
    memcpy(d->table, perm, tbytes);
    memcpy(d->ctable, cperm, ctbytes);
    free(perm);
    free(cperm);

    /* NB: a registered buffer of count elements (count -1: overflowed, refused by new_buf) */
#define NB(count, es, poison, out, name)                                                                  \
    do {                                                                                                 \
        s = new_buf(d, (count), (es), (poison), (out), (name), err, err_size);                           \
        if (s != NSA_SUCCESS) return s;                                                                  \
    } while (0)
    int64_t cnt;
#define PROD3(a, b, c_) (nsa_ck_mul((a), (b), &cnt) || nsa_ck_mul(cnt, (c_), &cnt) ? (int64_t)-1 : cnt)
    NB(PROD3(MT, d->Hq, d->Dqk), d->es, 0, &d->q, "q");
    NB(PROD3(MT, d->Hq, d->Dv), d->es, 0xFF, &d->o, "o");
    for (int b = 0; b < 3; b++) {
        if (d->on[b]) {
            NB(PROD3(MT, d->Hq, 1), d->fes, 0, &d->gate[b], "gate");
            NB(PROD3(MT, d->Hq, 1), d->fes, 0xFF, &d->lse[b], "lse");
        }
        if (!d->raw[b] || d->shared_with[b] != b) continue;
        NB(PROD3(MT, d->Hkv, d->Dqk), d->es, 0, &d->k[b], "k");
        NB(PROD3(MT, d->Hkv, d->Dv), d->es, 0, &d->v[b], "v");
    }
    nsa_buffer *kcache[3] = {0}, *vcache[3] = {0};
    for (int b = 0; b < 3; b++) {
        if (!d->raw[b]) continue;
        if (d->shared_with[b] != b) {
            const int e = d->shared_with[b];
            d->k[b] = d->k[e];
            d->v[b] = d->v[e];
            kcache[b] = kcache[e];
            vcache[b] = vcache[e];
            continue;
        }
        NB(PROD3(pool, d->Hkv, d->Dqk), d->es, 0xFF, &kcache[b], "k_cache");
        NB(PROD3(pool, d->Hkv, d->Dv), d->es, 0xFF, &vcache[b], "v_cache");
    }
    NB(PROD3(cpool, d->Hkv, d->Dqk), d->es, 0xFF, &d->kcc, "kc_cache");
    NB(PROD3(cpool, d->Hkv, d->Dv), d->es, 0xFF, &d->vcc, "vc_cache");
    if (d->n > 0) NB(PROD3(MT, d->Hkv, d->n), 4, 0xFF, &d->sel, "selected");
    NB(d->B + 1, 4, 0, &d->cuq, "cu_seqlens_q");
    NB(d->B, 4, 0, &d->csl, "cache_seqlens");
    NB(tcount, 4, 0, &d->bt, "block_table");
    NB(ctcount + 1, 4, 0, &d->cbt, "cmp_block_table");
    s = nsa_buffer_write(d->bt, 0, d->table, tbytes);
    if (s == NSA_SUCCESS) s = nsa_buffer_write(d->cbt, 0, d->ctable, ctbytes);
    if (s != NSA_SUCCESS) return tool_format_error(err, err_size, "nsa_buffer_write (page tables)", s);
    nsa_buffer *wk = NULL, *wv = NULL, *pek = NULL, *pev = NULL;
    const int64_t l = g->cmp_block;
    if (g->compress == NSA_COMPRESS_LINEAR) {
        /* the weights through the staging rows: converted a row of D x D at a time */
        struct { nsa_buffer **b; const float *src; int64_t rows, width; const char *name; } w[4] = {
            {&wk, in->w_k, d->Hkv * l * d->Dqk, d->Dqk, "w_k"}, {&wv, in->w_v, d->Hkv * l * d->Dv, d->Dv, "w_v"},
            {&pek, in->pe_k, d->Hkv * l, d->Dqk, "pe_k"}, {&pev, in->pe_v, d->Hkv * l, d->Dv, "pe_v"}};
        for (int i = 0; i < 4; i++) {
            if (!w[i].src) continue;
            NB(PROD3(w[i].rows, w[i].width, 1), d->es, 0, w[i].b, w[i].name);
            for (int64_t r = 0; r < w[i].rows; r++)
                if ((s = put(d, *w[i].b, r * w[i].width, w[i].src + r * w[i].width, w[i].width, d->dt, err,
                             err_size)) != NSA_SUCCESS)
                    return s;
        }
    }
#undef PROD3
#undef NB
    if (d->info.workspace_bytes > 0) {
        s = nsa_buffer_alloc(ctx, d->info.workspace_bytes, &d->workspace);
        if (s != NSA_SUCCESS) return tool_format_error(err, err_size, "nsa_buffer_alloc (workspace)", s);
    }
    nsa_decode_args *a = &d->args;
    a->q = view(d->q, d->Hq, d->Dqk);
    a->o = view(d->o, d->Hq, d->Dv);
    for (int b = 0; b < 3; b++) {
        a->gate[b] = view(d->gate[b], d->Hq, 1);
        a->lse[b] = view(d->lse[b], d->Hq, 1);
        a->k[b] = view(d->k[b], d->Hkv, d->Dqk);
        a->v[b] = view(d->v[b], d->Hkv, d->Dv);
        a->k_cache[b] = view(kcache[b], d->Hkv, d->Dqk);
        a->v_cache[b] = view(vcache[b], d->Hkv, d->Dv);
    }
    a->w_k = view(wk, l * d->Dqk, d->Dqk);
    a->w_v = view(wv, l * d->Dv, d->Dv);
    a->pe_k = view(pek, l, d->Dqk);
    a->pe_v = view(pev, l, d->Dv);
    a->cu_seqlens_q = view(d->cuq, 1, 1);
    a->cache_seqlens = view(d->csl, 1, 1);
    a->block_table = nsa_tensor_dense(d->bt, 0, 1, lim->max_pages);
    a->cmp_block_table = nsa_tensor_dense(d->cbt, 0, 1, lim->max_cmp_pages);
    a->kc_cache = view(d->kcc, d->Hkv, d->Dqk);
    a->vc_cache = view(d->vcc, d->Hkv, d->Dv);
    a->selected = d->sel ? nsa_tensor_dense(d->sel, 0, d->Hkv, d->n) : (nsa_tensor){0};
    return NSA_SUCCESS;
}

/* decode_run_fill: each pool's rows are copied from a table of at most
 * FILL_TABLE_VALUES drawn values (one row when a row is wider), and written
 * FILL_WRITE_BYTES at a time (one row when a row is larger). Streams of the
 * seed from FILL_STREAM on, two per pool (the values, the pages' first rows),
 * clear of the testkit's (below 32). */
#define FILL_TABLE_VALUES ((int64_t)1 << 22)
#define FILL_WRITE_BYTES ((int64_t)16 << 20)
#define FILL_STREAM 64

/* positions rows of width values into buf (rows of es bytes each, checked when
 * the pool was sized): position x, slot x % page_size of page x / page_size,
 * gets row (first + x % page_size) % rows of the table, first drawn for its page */
static nsa_status fill_pool(decode_run *d, nsa_buffer *buf, int64_t positions, int64_t page_size, int64_t width,
                            float lo, float hi, uint64_t seed, uint64_t stream, char *err, size_t err_size)
{
    if (!buf || positions == 0) return NSA_SUCCESS;
    const size_t rb = (size_t)width * d->es;
    int64_t rows = width < FILL_TABLE_VALUES ? FILL_TABLE_VALUES / width : 1;
    if (rows > positions) rows = positions;
    const int64_t per_write = (int64_t)rb < FILL_WRITE_BYTES ? FILL_WRITE_BYTES / (int64_t)rb : 1;
    float *drawn = malloc((size_t)(rows * width) * sizeof(float));
    unsigned char *table = malloc((size_t)rows * rb), *chunk = malloc((size_t)per_write * rb);
    nsa_status s = NSA_SUCCESS;
    if (!drawn || !table || !chunk) {
        s = fail_msg(err, err_size, NSA_ERR_OUT_OF_MEMORY, "%s: out of host memory", "decode run: fill");
    } else if ((s = nsa_random_uniform(seed, stream, 0, rows * width, lo, hi, drawn)) != NSA_SUCCESS) {
        tool_format_error(err, err_size, "nsa_random_uniform", s);
    } else if ((s = nsa_convert(drawn, NSA_DTYPE_F32, table, d->dt, rows * width)) != NSA_SUCCESS) {
        tool_format_error(err, err_size, "nsa_convert", s);
    }
    free(drawn);
    int64_t page = -1, first = 0;
    for (int64_t x0 = 0; x0 < positions && s == NSA_SUCCESS; x0 += per_write) {
        const int64_t n = positions - x0 < per_write ? positions - x0 : per_write;
        for (int64_t i = 0; i < n; i++) {
            const int64_t x = x0 + i;
            if (x / page_size != page) {
                page = x / page_size;
                first = (int64_t)(nsa_random_u64(seed, stream + 1, (uint64_t)page) % (uint64_t)rows);
            }
            memcpy(chunk + (size_t)i * rb, table + (size_t)((first + x % page_size) % rows) * rb, rb);
        }
        if ((s = nsa_buffer_write(buf, (size_t)x0 * rb, chunk, (size_t)n * rb)) != NSA_SUCCESS)
            tool_format_error(err, err_size, "nsa_buffer_write (cache fill)", s);
    }
    free(table);
    free(chunk);
    return s;
}

nsa_status decode_run_fill(decode_run *d, uint64_t seed, char *err, size_t err_size)
{
    const nsa_decode_args *a = &d->args;
    const int64_t pool = d->lim.num_pages * d->lim.page_size, cpool = d->lim.num_cmp_pages * d->lim.cmp_page_size;
    nsa_status s = NSA_SUCCESS;
    for (int b = 0; b < 3 && s == NSA_SUCCESS; b++) {
        if (!d->raw[b] || d->shared_with[b] != b) continue;
        s = fill_pool(d, a->k_cache[b].buffer, pool, d->lim.page_size, d->Hkv * d->Dqk, -2.0f, 2.0f, seed,
                      FILL_STREAM + 4 * b, err, err_size);
        if (s == NSA_SUCCESS)
            s = fill_pool(d, a->v_cache[b].buffer, pool, d->lim.page_size, d->Hkv * d->Dv, -1.0f, 1.0f, seed,
                          FILL_STREAM + 4 * b + 2, err, err_size);
    }
    if (s == NSA_SUCCESS)
        s = fill_pool(d, d->kcc, cpool, d->lim.cmp_page_size, d->Hkv * d->Dqk, -2.0f, 2.0f, seed, FILL_STREAM + 12,
                      err, err_size);
    if (s == NSA_SUCCESS)
        s = fill_pool(d, d->vcc, cpool, d->lim.cmp_page_size, d->Hkv * d->Dv, -1.0f, 1.0f, seed, FILL_STREAM + 14,
                      err, err_size);
    if (s != NSA_SUCCESS) return s;
    for (int64_t b = 0; b < d->B; b++) d->done[b] = d->fill_context;
    d->filled = 1;
    return NSA_SUCCESS;
}

int decode_run_step_memory(const nsa_config *cfg, int64_t B, int64_t context, int64_t tq, int64_t page_size,
                           int64_t cmp_page_size, int64_t *cache_bytes, int64_t *host_bytes)
{
    const int64_t Hq = cfg->num_q_heads, Hkv = cfg->num_kv_heads, Dqk = cfg->head_dim_qk, Dv = cfg->head_dim_v;
    const int64_t n = cfg->num_selected, es = (int64_t)nsa_dtype_size(cfg->dtype);
    /* one raw cache serves every branch that reads raw keys, as one k and v tensor does */
    const int raw = cfg->compress != NSA_COMPRESS_EXTERNAL || n > 0 || cfg->window > 0;
    nsa_decode_limits lim;
    int64_t len, pool, cpool, row, raw_b, cmp_b, in_row, wide, stage;
    if (nsa_ck_add(context, tq, &len) ||
        limits_of(B, tq, len, tk_num_cmp_blocks(cfg, len), page_size, cmp_page_size, &lim) ||
        nsa_ck_mul(lim.num_pages, page_size, &pool) || nsa_ck_mul(lim.num_cmp_pages, cmp_page_size, &cpool) ||
        nsa_ck_add(Dqk, Dv, &row) || nsa_ck_mul(row, Hkv, &row) || nsa_ck_mul(row, es, &row) ||
        nsa_ck_mul(raw ? pool : 0, row, &raw_b) || nsa_ck_mul(cpool, row, &cmp_b) ||
        nsa_ck_add(raw_b, cmp_b, cache_bytes))
        return 1;
    /* host, per step row: q, k, v and three gates as f32 (tk_inputs), and the
     * staging of the widest row as f32 and as f64 (decode_run_setup's bound) */
    int64_t hq_d, gates, sel;
    return nsa_ck_mul(Hq, Dqk > Dv ? Dqk : Dv, &wide) || nsa_ck_mul(Hkv, n, &sel) ||
           nsa_ck_mul(wide > sel ? wide : sel, 12, &stage) || nsa_ck_mul(Hq, Dqk, &hq_d) ||
           nsa_ck_mul(Hq, 3, &gates) || nsa_ck_add(hq_d, row / es, &in_row) || nsa_ck_add(in_row, gates, &in_row) ||
           nsa_ck_mul(in_row, 4, &in_row) || nsa_ck_add(in_row, stage, &in_row) ||
           nsa_ck_mul(in_row, lim.max_total_tokens, host_bytes);
}

/* The step's rows of a per-token input (width elements a row) gathered from the
 * case's host tensor src into the packed rows of b. */
static nsa_status put_rows(decode_run *d, nsa_buffer *b, const float *src, int64_t width, nsa_dtype dt, char *err,
                           size_t err_size)
{
    for (int64_t s = 0; s < d->B; s++)
        for (int64_t j = 0; j < d->tq[s]; j++) {
            const int64_t r = d->cu[s] + j, t = d->in_row[s] + d->done[s] + j;
            memcpy(d->hstage + r * width, src + t * width, (size_t)width * sizeof(float));
        }
    return put(d, b, 0, d->hstage, (int64_t)d->cu[d->B] * width, dt, err, err_size);
}

nsa_status decode_run_stage(decode_run *d, const int64_t *tq, char *err, size_t err_size)
{
    const nsa_config *g = &d->cfg;
    const tk_inputs *in = d->in;
    nsa_status s;
    int64_t rows = 0;
    d->cu[0] = 0;
    for (int64_t b = 0; b < d->B; b++) {
        if (tq[b] < 0 || tq[b] > d->lim.max_step_tokens || tq[b] > d->len[b] - d->done[b])
            return fail_msg(err, err_size, NSA_ERR_INTERNAL, "%s: a step longer than the plan or the sequence",
                            "decode run");
        d->tq[b] = tq[b];
        rows += tq[b];
        d->cu[b + 1] = (int32_t)rows;
    }
    if ((s = put_rows(d, d->q, in->q, d->Hq * d->Dqk, d->dt, err, err_size)) != NSA_SUCCESS) return s;
    for (int br = 0; br < 3; br++) {
        if (d->gate[br] && (s = put_rows(d, d->gate[br], in->gate[br], d->Hq, d->fdt, err, err_size)) != NSA_SUCCESS)
            return s;
        if (!d->raw[br] || d->shared_with[br] != br) continue;
        if ((s = put_rows(d, d->k[br], in->k[br], d->Hkv * d->Dqk, d->dt, err, err_size)) != NSA_SUCCESS ||
            (s = put_rows(d, d->v[br], in->v[br], d->Hkv * d->Dv, d->dt, err, err_size)) != NSA_SUCCESS)
            return s;
    }
    for (int64_t b = 0; b < d->B; b++) d->tk0[b] = (int32_t)d->done[b];
    if ((s = nsa_buffer_write(d->cuq, 0, d->cu, (size_t)(d->B + 1) * 4)) != NSA_SUCCESS ||
        (s = nsa_buffer_write(d->csl, 0, d->tk0, (size_t)d->B * 4)) != NSA_SUCCESS)
        return tool_format_error(err, err_size, "nsa_buffer_write (step lengths)", s);
    /* EXTERNAL: the caller writes the compressed rows the step completes (after
     * decode_run_fill they hold its values already, as every row of the pool does) */
    if (g->compress != NSA_COMPRESS_EXTERNAL || d->filled) return NSA_SUCCESS;
    const int64_t cps = d->lim.cmp_page_size, wk = d->Hkv * d->Dqk, wv = d->Hkv * d->Dv;
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t i = tk_num_cmp_blocks(g, d->done[b]); i < tk_num_cmp_blocks(g, d->done[b] + tq[b]); i++) {
            const int64_t row = (int64_t)d->ctable[b * d->lim.max_cmp_pages + i / cps] * cps + i % cps;
            if ((s = put(d, d->kcc, row * wk, in->kc + (d->cmp_base[b] + i) * wk, wk, d->dt, err, err_size)) !=
                    NSA_SUCCESS ||
                (s = put(d, d->vcc, row * wv, in->vc + (d->cmp_base[b] + i) * wv, wv, d->dt, err, err_size)) !=
                    NSA_SUCCESS)
                return s;
        }
    return NSA_SUCCESS;
}

nsa_status decode_run_step(decode_run *d, char *err, size_t err_size) { return decode_run_steps(d, 1, err, err_size); }

nsa_status decode_run_steps(decode_run *d, int count, char *err, size_t err_size)
{
    for (int i = 0; i < count; i++) {
        const nsa_status s = nsa_decode(d->plan, &d->args, d->workspace);
        if (s != NSA_SUCCESS) return tool_format_error(err, err_size, "nsa_decode", s);
    }
    const nsa_status s = nsa_decode_check(d->plan);
    if (s != NSA_SUCCESS) return tool_format_error(err, err_size, "nsa_decode_check", s);
    return NSA_SUCCESS;
}

/* rows of width elements of type dt read from b into bstage; then each step row
 * converted into the problem's row of f32 dst and f64 dst_d (either may be NULL)
 * and copied raw into raw (may be NULL) */
static nsa_status gather_rows(decode_run *d, nsa_buffer *b, int64_t width, nsa_dtype dt, float *dst, double *dst_d,
                              unsigned char *raw, const char *what, char *err, size_t err_size)
{
    const size_t es = nsa_dtype_size(dt);
    const int64_t rows = d->cu[d->B];
    nsa_status s;
    if (rows == 0 || width == 0) return NSA_SUCCESS;
    s = nsa_buffer_read(b, 0, d->bstage, (size_t)(rows * width) * es);
    if (s != NSA_SUCCESS) return tool_format_error(err, err_size, what, s);
    const unsigned char *src = d->bstage;
    for (int64_t q = 0; q < d->B; q++)
        for (int64_t j = 0; j < d->tq[q]; j++) {
            const int64_t r = d->cu[q] + j, t = d->in_row[q] + d->done[q] + j;
            const void *row = src + (size_t)(r * width) * es;
            if (raw) memcpy(raw + (size_t)(t * width) * es, row, (size_t)width * es);
            if ((dst && (s = nsa_convert(row, dt, dst + t * width, NSA_DTYPE_F32, width)) != NSA_SUCCESS) ||
                (dst_d && (s = nsa_convert(row, dt, dst_d + t * width, NSA_DTYPE_F64, width)) != NSA_SUCCESS))
                return tool_format_error(err, err_size, "nsa_convert", s);
        }
    return NSA_SUCCESS;
}

nsa_status decode_run_gather(decode_run *d, tk_output *out, char *err, size_t err_size)
{
    nsa_status s = gather_rows(d, d->o, d->Hq * d->Dv, d->dt, out->o, out->o_d, out->o_raw, "nsa_buffer_read (o)",
                               err, err_size);
    for (int br = 0; br < 3 && s == NSA_SUCCESS; br++)
        if (d->lse[br] && out->lse[br])
            s = gather_rows(d, d->lse[br], d->Hq, d->fdt, out->lse[br], out->lse_d[br], NULL,
                            "nsa_buffer_read (lse)", err, err_size);
    if (s == NSA_SUCCESS && d->sel && out->sel)
        s = gather_rows(d, d->sel, d->Hkv * d->n, NSA_DTYPE_I32, NULL, NULL, (unsigned char *)out->sel,
                        "nsa_buffer_read (selected)", err, err_size);
    return s;
}

void decode_run_advance(decode_run *d)
{
    for (int64_t b = 0; b < d->B; b++) {
        d->done[b] += d->tq[b];
        d->tq[b] = 0;
    }
}

nsa_status decode_run_output_alloc(const decode_run *d, tk_output *out, char *err, size_t err_size)
{
    const int64_t T = d->in->tokens;
    size_t ob, od, oraw, lb, ld, sb;
    memset(out, 0, sizeof *out);
    out->tokens = T;
    snprintf(out->stages, sizeof out->stages, "%s", d->info.stages);
    if (bytes_of(T * d->Hq * d->Dv, sizeof(float), &ob) || bytes_of(T * d->Hq * d->Dv, sizeof(double), &od) ||
        bytes_of(T * d->Hq * d->Dv, d->es, &oraw) || bytes_of(T * d->Hq, sizeof(float), &lb) ||
        bytes_of(T * d->Hq, sizeof(double), &ld) || bytes_of(T * d->Hkv * d->n, 4, &sb))
        return fail_msg(err, err_size, NSA_ERR_INVALID_SHAPE, "%s: the outputs' sizes overflow 64 bits",
                        "decode run");
    out->o = malloc(ob + 4);
    out->o_d = malloc(od + 8);
    out->o_raw = malloc(oraw + 8);
    out->o_raw_bytes = oraw;
    int bad = !out->o || !out->o_d || !out->o_raw;
    for (int br = 0; br < 3 && !bad; br++)
        if (d->lse[br]) {
            out->lse[br] = malloc(lb + 4);
            out->lse_d[br] = malloc(ld + 8);
            bad = !out->lse[br] || !out->lse_d[br];
        }
    if (!bad && d->n > 0) {
        out->sel = malloc(sb + 4);
        bad = !out->sel;
    }
    if (bad) {
        problem_output_free(out);
        return fail_msg(err, err_size, NSA_ERR_OUT_OF_MEMORY, "%s: out of host memory", "decode run");
    }
    for (int64_t e = 0; e < T * d->Hq * d->Dv; e++) {
        out->o[e] = NAN;
        out->o_d[e] = NAN;
    }
    memset(out->o_raw, 0xFF, oraw);
    for (int br = 0; br < 3; br++)
        for (int64_t e = 0; out->lse[br] && e < T * d->Hq; e++) {
            out->lse[br][e] = NAN;
            out->lse_d[br][e] = NAN;
        }
    if (out->sel) memset(out->sel, 0xFF, sb);
    return NSA_SUCCESS;
}

/* the prefill of a sequence of len tokens: half of it for prefill < 0 */
static int64_t prefill_of(int64_t prefill, int64_t len)
{
    return prefill < 0 ? len / 2 : prefill < len ? prefill : len;
}

/* Steps of up to most tokens per sequence until each has reached its target
 * (phase 0: its prefill, 1: its length); each step timed, and its rows
 * gathered into out when out is given. times (may be NULL) receives the step
 * times; *nsteps, *sum_s, *rows are incremented. */
static nsa_status run_phase(decode_run *d, int phase, int64_t prefill, int64_t most, const char *label,
                            tk_output *out, double *times, int64_t *nsteps, double *sum_s, int64_t *rows, char *err,
                            size_t err_size)
{
    int64_t *steps = malloc((size_t)d->B * sizeof *steps); /* B <= INT32_MAX: start() */
    nsa_status s = NSA_SUCCESS;
    if (!steps) return fail_msg(err, err_size, NSA_ERR_OUT_OF_MEMORY, "%s: out of host memory", "decode run");
    for (;;) {
        int any = 0;
        for (int64_t b = 0; b < d->B; b++) {
            const int64_t end = phase == 0 ? prefill_of(prefill, d->len[b]) : d->len[b];
            steps[b] = end - d->done[b] < most ? end - d->done[b] : most;
            if (steps[b] < 0) steps[b] = 0;
            any |= steps[b] > 0;
        }
        if (!any) break;
        tool_progress("%s: %s step %lld", label, phase == 0 ? "prefill" : "decode", (long long)(*nsteps + 1));
        if ((s = decode_run_stage(d, steps, err, err_size)) != NSA_SUCCESS) break;
        const double t0 = tool_now();
        s = decode_run_step(d, err, err_size);
        const double t = tool_now() - t0;
        if (s == NSA_SUCCESS && out) s = decode_run_gather(d, out, err, err_size);
        if (s != NSA_SUCCESS) break;
        decode_run_advance(d);
        for (int64_t b = 0; b < d->B; b++) *rows += steps[b];
        if (times) times[*nsteps] = t;
        ++*nsteps;
        *sum_s += t;
    }
    tool_progress_end();
    free(steps);
    return s;
}

nsa_status decode_run_prefill(decode_run *d, int64_t prefill, int64_t chunk, const char *label, int64_t *steps,
                              double *seconds, char *err, size_t err_size)
{
    int64_t rows = 0;
    *steps = 0;
    *seconds = 0;
    if (chunk < 1 || chunk > d->lim.max_step_tokens)
        return fail_msg(err, err_size, NSA_ERR_INTERNAL, "%s: a prefill chunk outside the plan", "decode run");
    return run_phase(d, 0, prefill, chunk, label, NULL, NULL, steps, seconds, &rows, err, err_size);
}

nsa_status decode_run_all(decode_run *d, int64_t prefill, int64_t chunk, int64_t tq, const char *label,
                          tk_output *out, decode_stats *st, char *err, size_t err_size)
{
    nsa_status s;
    int64_t max_decode = 0;
    memset(st, 0, sizeof *st);
    st->step_median_s = st->step_min_s = NAN;
    if (chunk < 1 || tq < 1 || chunk > d->lim.max_step_tokens || tq > d->lim.max_step_tokens)
        return fail_msg(err, err_size, NSA_ERR_INTERNAL, "%s: step sizes outside the plan", "decode run");
    s = decode_run_output_alloc(d, out, err, err_size);
    if (s != NSA_SUCCESS) return s;
    for (int64_t b = 0; b < d->B; b++) {
        const int64_t k = ceil_div(d->len[b] - prefill_of(prefill, d->len[b]), tq);
        if (k > max_decode) max_decode = k;
    }
    size_t tb;
    if (bytes_of(max_decode, sizeof(double), &tb))
        return fail_msg(err, err_size, NSA_ERR_INVALID_SHAPE, "%s: too many steps", "decode run");
    double *times = malloc(tb + sizeof(double));
    if (!times) return fail_msg(err, err_size, NSA_ERR_OUT_OF_MEMORY, "%s: out of host memory", "decode run");
    s = run_phase(d, 0, prefill, chunk, label, out, NULL, &st->prefill_steps, &st->prefill_s, &st->rows, err,
                  err_size);
    if (s == NSA_SUCCESS)
        s = run_phase(d, 1, prefill, tq, label, out, times, &st->decode_steps, &st->decode_s, &st->rows, err,
                      err_size);
    if (s == NSA_SUCCESS && st->decode_steps > 0) {
        st->step_min_s = times[0];
        for (int64_t i = 1; i < st->decode_steps; i++)
            if (times[i] < st->step_min_s) st->step_min_s = times[i];
        st->step_median_s = tool_median(times, (int)st->decode_steps);
    }
    free(times);
    return s;
}

void decode_run_free(decode_run *d)
{
    if (!d) return;
    nsa_buffer_free(d->workspace);
    for (int i = 0; i < d->nbufs; i++) nsa_buffer_free(d->bufs[i]);
    nsa_plan_destroy(d->plan);
    free(d->len); /* the per-sequence arrays' one allocation */
    free(d->table);
    free(d->ctable);
    free(d->hstage);
    free(d->bstage);
    memset(d, 0, sizeof *d);
}

/* distinct marks in m[0 .. n-1] */
static int64_t count_marks(const unsigned char *m, int64_t n)
{
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += m[i];
    return k;
}

double decode_run_step_bytes(const decode_run *d, const int32_t *sel)
{
    const nsa_config *g = &d->cfg;
    const double es = (double)d->es, kv = (double)(d->Dqk + d->Dv) * es;
    const int64_t ls = g->slc_block, w = g->window, n = d->n;
    /* one shared cache for selection and window: a token both read counts once */
    const int shared = d->raw[1] && d->raw[2] && d->shared_with[2] == d->shared_with[1];
    double bytes = 0;
    int64_t maxk = 1;
    for (int64_t b = 0; b < d->B; b++)
        if (d->done[b] + d->tq[b] > maxk) maxk = d->done[b] + d->tq[b];
    unsigned char *ms = calloc((size_t)maxk, 1), *mw = calloc((size_t)maxk, 1);
    if (!ms || !mw) {
        free(ms);
        free(mw);
        return NAN;
    }
    int distinct_raw = 0;
    for (int br = 0; br < 3; br++) distinct_raw += d->raw[br] && d->shared_with[br] == br;
    for (int64_t b = 0; b < d->B; b++) {
        const int64_t TQ = d->tq[b], TK0 = d->done[b], TK = TK0 + TQ;
        if (TQ == 0) continue;
        /* the new tokens: q, the gates of the enabled branches, k and v of each distinct raw tensor */
        bytes += (double)(TQ * d->Hq * d->Dqk) * es;
        bytes += (double)(TQ * d->Hq * (d->on[0] + d->on[1] + d->on[2])) * (double)d->fes;
        bytes += (double)(TQ * d->Hkv * distinct_raw) * kv;
        /* the compressed rows of the whole context */
        bytes += (double)(tk_num_cmp_blocks(g, TK) * d->Hkv) * kv;
        for (int64_t h = 0; h < d->Hkv; h++) {
            memset(ms, 0, (size_t)TK);
            memset(mw, 0, (size_t)TK);
            unsigned char *mwin = shared ? ms : mw;
            for (int64_t j = 0; j < TQ; j++) {
                const int64_t t = TK0 + j, r = d->cu[b] + j;
                for (int64_t i = 0; n > 0 && sel && i < n; i++) {
                    const int64_t blk = sel[(r * d->Hkv + h) * n + i];
                    if (blk < 0) continue;
                    for (int64_t x = blk * ls; x < blk * ls + ls && x <= t; x++) ms[x] = 1;
                }
                for (int64_t x = w > 0 ? (t - w + 1 > 0 ? t - w + 1 : 0) : t + 1; x <= t; x++) mwin[x] = 1;
            }
            bytes += (double)count_marks(ms, TK) * kv;
            if (!shared) bytes += (double)count_marks(mw, TK) * kv;
        }
    }
    free(ms);
    free(mw);
    return bytes;
}
