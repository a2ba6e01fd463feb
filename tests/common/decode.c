/*
 * A paged KV cache on the host and a decode step computed from it, for the tests
 * of docs/nsa-semantics.md section 10 (decoding and chunked prefill).
 *
 * The cache is laid out as section 10 says: pools of pages [num_pages *
 * page_size][Hkv][D] for the raw k_b, v_b of each branch (one pool where the
 * inputs share a tensor between branches) and a pool of compressed rows with its
 * own page size; per sequence a page table, shuffled by the seed, so a sequence's
 * pages lie anywhere in the pool. Appending tokens copies their k, v from the
 * case's inputs into the pages and forms each compressed block once, when its
 * last token arrives, from the cached tokens (tk_compress_row, the oracle's own
 * formula). A step's rows are the oracle run on the sequence's cached prefix, read
 * back through the page tables, with the compressed rows taken from the compressed
 * cache (as EXTERNAL rows): so comparing them with the oracle of the whole batch
 * checks the paging, the incremental compression and section 10's claim that a
 * prefix's rows are the forward's rows.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

#define IDX3(a, b, c, B, C) (((a) * (B) + (b)) * (C) + (c))

void tk_paged_free(tk_paged *pc)
{
    for (int b = 0; b < 3; b++) {
        if (pc->k[b] && (b == 0 || pc->k[b] != pc->k[0])) free(pc->k[b]);
        if (pc->v[b] && (b == 0 || pc->v[b] != pc->v[0])) free(pc->v[b]);
    }
    free(pc->kc);
    free(pc->vc);
    free(pc->table);
    free(pc->ctable);
    free(pc->len);
    free(pc->nc);
    memset(pc, 0, sizeof *pc);
}

void tk_shuffle(int32_t *p, int64_t n, uint64_t *s)
{
    for (int64_t i = 0; i < n; i++) p[i] = (int32_t)i;
    for (int64_t i = n - 1; i > 0; i--) {
        const int64_t j = (int64_t)(tk_splitmix64(s) % (uint64_t)(i + 1));
        const int32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

nsa_status tk_paged_make(const tk_case *c, const tk_inputs *in, int64_t page_size, int64_t cpage_size,
                         uint64_t seed, tk_paged *pc)
{
    memset(pc, 0, sizeof *pc);
    if (!c || !in || page_size < 1 || cpage_size < 1) return NSA_ERR_INVALID_VALUE;
    const nsa_config *g = &c->cfg;
    const int64_t Hkv = g->num_kv_heads, Dqk = g->head_dim_qk, Dv = g->head_dim_v, B = c->batch;
    int64_t max_len = 0, max_nc = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = c->cu_seqlens[b + 1] - c->cu_seqlens[b];
        if (len > max_len) max_len = len;
        if (tk_num_cmp_blocks(g, len) > max_nc) max_nc = tk_num_cmp_blocks(g, len);
    }
    pc->page_size = page_size;
    pc->cpage_size = cpage_size;
    pc->max_pages = (max_len + page_size - 1) / page_size;
    pc->max_cpages = (max_nc + cpage_size - 1) / cpage_size;
    pc->num_pages = B * pc->max_pages;
    pc->num_cpages = B * pc->max_cpages;
    const int64_t rows = pc->num_pages * page_size + 1, crows = pc->num_cpages * cpage_size + 1;
    pc->table = malloc((size_t)(B * pc->max_pages + 1) * sizeof *pc->table);
    pc->ctable = malloc((size_t)(B * pc->max_cpages + 1) * sizeof *pc->ctable);
    pc->len = calloc((size_t)B, sizeof *pc->len);
    pc->nc = calloc((size_t)B, sizeof *pc->nc);
    pc->kc = malloc((size_t)(crows * Hkv * Dqk) * sizeof *pc->kc);
    pc->vc = malloc((size_t)(crows * Hkv * Dv) * sizeof *pc->vc);
    int ok = pc->table && pc->ctable && pc->len && pc->nc && pc->kc && pc->vc;
    for (int b = 0; b < 3 && ok; b++) {
        if (!in->k[b]) continue;
        pc->k[b] = b > 0 && in->k[b] == in->k[0] ? pc->k[0] : malloc((size_t)(rows * Hkv * Dqk) * sizeof(float));
        pc->v[b] = b > 0 && in->v[b] == in->v[0] ? pc->v[0] : malloc((size_t)(rows * Hkv * Dv) * sizeof(float));
        ok = pc->k[b] && pc->v[b];
    }
    if (!ok) {
        tk_paged_free(pc);
        return NSA_ERR_OUT_OF_MEMORY;
    }
    /* every page of the pools once, in a shuffled order, across the sequences */
    uint64_t s = seed;
    tk_shuffle(pc->table, pc->num_pages, &s);
    tk_shuffle(pc->ctable, pc->num_cpages, &s);
    /* poison: a value read before it was written shows in the comparison */
    for (int b = 0; b < 3; b++) {
        if (!pc->k[b] || (b > 0 && pc->k[b] == pc->k[0])) continue;
        for (int64_t e = 0; e < rows * Hkv * Dqk; e++) pc->k[b][e] = NAN;
        for (int64_t e = 0; e < rows * Hkv * Dv; e++) pc->v[b][e] = NAN;
    }
    for (int64_t e = 0; e < crows * Hkv * Dqk; e++) pc->kc[e] = NAN;
    for (int64_t e = 0; e < crows * Hkv * Dv; e++) pc->vc[e] = NAN;
    return NSA_SUCCESS;
}

/* pool row of sequence b's position x (raw) or compressed row i */
static int64_t raw_row(const tk_paged *pc, int64_t b, int64_t x)
{
    return (int64_t)pc->table[b * pc->max_pages + x / pc->page_size] * pc->page_size + x % pc->page_size;
}
static int64_t cmp_row(const tk_paged *pc, int64_t b, int64_t i)
{
    return (int64_t)pc->ctable[b * pc->max_cpages + i / pc->cpage_size] * pc->cpage_size + i % pc->cpage_size;
}

nsa_status tk_paged_append(const tk_case *c, const tk_inputs *in, tk_paged *pc, int64_t b, int64_t tq)
{
    const nsa_config *g = &c->cfg;
    const int64_t Hkv = g->num_kv_heads, Dqk = g->head_dim_qk, Dv = g->head_dim_v;
    const int64_t l = g->cmp_block, d = g->cmp_stride;
    const int64_t base = c->cu_seqlens[b], len = c->cu_seqlens[b + 1] - base;
    const int64_t tk0 = pc->len[b], tk = tk0 + tq;
    if (b < 0 || b >= c->batch || tq < 0 || tk > len) return NSA_ERR_INVALID_VALUE;
    for (int64_t x = tk0; x < tk; x++)
        for (int br = 0; br < 3; br++) {
            if (!pc->k[br] || (br > 0 && pc->k[br] == pc->k[0] && pc->v[br] == pc->v[0])) continue;
            memcpy(pc->k[br] + raw_row(pc, b, x) * Hkv * Dqk, in->k[br] + (base + x) * Hkv * Dqk,
                   (size_t)(Hkv * Dqk) * sizeof(float));
            memcpy(pc->v[br] + raw_row(pc, b, x) * Hkv * Dv, in->v[br] + (base + x) * Hkv * Dv,
                   (size_t)(Hkv * Dv) * sizeof(float));
        }
    pc->len[b] = tk;
    /* the compressed blocks whose last token arrived: Nc(tk0) .. Nc(tk) - 1, once each */
    const int64_t nc1 = tk_num_cmp_blocks(g, tk);
    int64_t cmp_base = 0;
    for (int64_t s = 0; s < b; s++) cmp_base += tk_num_cmp_blocks(g, c->cu_seqlens[s + 1] - c->cu_seqlens[s]);
    const float **rows = malloc((size_t)l * sizeof *rows);
    double *tmp = malloc((size_t)(Dqk > Dv ? Dqk : Dv) * sizeof *tmp);
    if (!rows || !tmp) {
        free((void *)rows);
        free(tmp);
        return NSA_ERR_OUT_OF_MEMORY;
    }
    for (int64_t i = pc->nc[b]; i < nc1; i++)
        for (int kv = 0; kv < 2; kv++) {
            const int64_t D = kv == 0 ? Dqk : Dv;
            float *dst = (kv == 0 ? pc->kc : pc->vc) + cmp_row(pc, b, i) * Hkv * D;
            const float *pool = kv == 0 ? pc->k[NSA_BRANCH_CMP] : pc->v[NSA_BRANCH_CMP];
            for (int64_t j = 0; j < l && g->compress != NSA_COMPRESS_EXTERNAL; j++)
                rows[j] = pool + raw_row(pc, b, i * d + j) * Hkv * D; /* cached token i*d + j */
            for (int64_t h = 0; h < Hkv; h++) {
                if (g->compress == NSA_COMPRESS_EXTERNAL) { /* given by the caller */
                    const float *ext = (kv == 0 ? in->kc : in->vc) + IDX3(cmp_base + i, h, 0, Hkv, D);
                    for (int64_t x = 0; x < D; x++) dst[h * D + x] = ext[x];
                    continue;
                }
                tk_compress_row(c, in, kv, h, rows, tmp);
                for (int64_t x = 0; x < D; x++) dst[h * D + x] = (float)tmp[x]; /* exact: rounded to the dtype */
            }
        }
    pc->nc[b] = nc1;
    free((void *)rows);
    free(tmp);
    return NSA_SUCCESS;
}

nsa_status tk_paged_rows(const tk_case *c, const tk_inputs *in, const tk_paged *pc, int64_t b, int64_t t0,
                         int64_t t1, tk_oracle *rows)
{
    memset(rows, 0, sizeof *rows);
    const nsa_config *g = &c->cfg;
    const int64_t Hq = g->num_q_heads, Hkv = g->num_kv_heads, Dqk = g->head_dim_qk, Dv = g->head_dim_v;
    const int64_t base = c->cu_seqlens[b], tk = pc->len[b], n = g->num_selected;
    if (t0 < 0 || t1 > tk || t0 > t1) return NSA_ERR_INVALID_VALUE;
    /* the prefix as a one-sequence case whose compressed rows are given (EXTERNAL) */
    tk_case p = *c;
    p.batch = 1;
    p.cu_seqlens[0] = 0;
    p.cu_seqlens[1] = tk;
    p.cfg.compress = NSA_COMPRESS_EXTERNAL;
    p.rows = 0; /* every row: the step's rows [t0, t1) need not be in the case's sample */
    tk_inputs x;
    memset(&x, 0, sizeof x);
    x.dtype = in->dtype;
    x.tokens = tk;
    const int64_t nc = pc->nc[b];
    x.total_cmp = nc;
    x.q = in->q + base * Hq * Dqk;
    for (int br = 0; br < 3; br++)
        x.gate[br] = in->gate[br] ? in->gate[br] + base * Hq : NULL;
    x.given = in->given ? in->given + base * Hkv * n : NULL;
    float *buf[8] = {0};
    int nb = 0, ok = 1;
    for (int br = 0; br < 3 && ok; br++) { /* k, v through the page table */
        if (!pc->k[br]) continue;
        if (br > 0 && pc->k[br] == pc->k[0]) {
            x.k[br] = x.k[0];
            x.v[br] = x.v[0];
            continue;
        }
        float *k = buf[nb++] = malloc((size_t)(tk * Hkv * Dqk + 1) * sizeof *k);
        float *v = buf[nb++] = malloc((size_t)(tk * Hkv * Dv + 1) * sizeof *v);
        if (!(ok = k && v)) break;
        for (int64_t t = 0; t < tk; t++) {
            memcpy(k + t * Hkv * Dqk, pc->k[br] + raw_row(pc, b, t) * Hkv * Dqk, (size_t)(Hkv * Dqk) * sizeof *k);
            memcpy(v + t * Hkv * Dv, pc->v[br] + raw_row(pc, b, t) * Hkv * Dv, (size_t)(Hkv * Dv) * sizeof *v);
        }
        x.k[br] = k;
        x.v[br] = v;
    }
    float *kc = ok ? (buf[nb++] = malloc((size_t)(nc * Hkv * Dqk + 1) * sizeof *kc)) : NULL;
    float *vc = ok ? (buf[nb++] = malloc((size_t)(nc * Hkv * Dv + 1) * sizeof *vc)) : NULL;
    nsa_status s = NSA_ERR_OUT_OF_MEMORY;
    if (ok && kc && vc) {
        for (int64_t i = 0; i < nc; i++) {
            memcpy(kc + i * Hkv * Dqk, pc->kc + cmp_row(pc, b, i) * Hkv * Dqk, (size_t)(Hkv * Dqk) * sizeof *kc);
            memcpy(vc + i * Hkv * Dv, pc->vc + cmp_row(pc, b, i) * Hkv * Dv, (size_t)(Hkv * Dv) * sizeof *vc);
        }
        x.kc = kc;
        x.vc = vc;
        tk_oracle full;
        s = tk_oracle_run(&p, &x, c->fixed_indices ? x.given : NULL, &full);
        if (s == NSA_SUCCESS) { /* keep rows t0 .. t1 - 1 (as rows 0 .. t1 - t0 - 1) */
            const int64_t m = t1 - t0;
            rows->tokens = m;
            rows->o = malloc((size_t)(m * Hq * Dv + 1) * sizeof *rows->o);
            int good = rows->o != NULL;
            if (good) memcpy(rows->o, full.o + t0 * Hq * Dv, (size_t)(m * Hq * Dv) * sizeof *rows->o);
            for (int br = 0; br < 3 && good; br++) {
                if (!full.lse[br]) continue;
                rows->lse[br] = malloc((size_t)(m * Hq + 1) * sizeof *rows->lse[br]);
                if ((good = rows->lse[br] != NULL))
                    memcpy(rows->lse[br], full.lse[br] + t0 * Hq, (size_t)(m * Hq) * sizeof *rows->lse[br]);
            }
            if (good && full.sel) {
                rows->sel = malloc((size_t)(m * Hkv * n + 1) * sizeof *rows->sel);
                if ((good = rows->sel != NULL))
                    memcpy(rows->sel, full.sel + t0 * Hkv * n, (size_t)(m * Hkv * n) * sizeof *rows->sel);
            }
            tk_oracle_free(&full);
            if (!good) {
                tk_oracle_free(rows);
                s = NSA_ERR_OUT_OF_MEMORY;
            }
        }
    }
    for (int i = 0; i < nb; i++) free(buf[i]);
    return s;
}
