/*
 * nsa_decode on a backend (docs/nsa-semantics.md section 10, include/nsa.h
 * "decoding"): every row a step returns is the row of the same backend's
 * nsa_forward of the whole batch.
 *
 * Per case and dtype: a decode plan whose caches are nsa_buffers poisoned
 * (0xFF) first, page tables shuffled by a seed (pages of every sequence
 * anywhere in the pools, spare pages and columns left over); each sequence is
 * prefilled to a random length in chunks of 1..64 tokens (chunked prefill, one
 * or several steps), then decoded in steps of a random TQ in 1..16, some
 * sequences sitting a step out (TQ = 0); the host advances cache_seqlens
 * between steps, and (EXTERNAL) writes the compressed rows a step completes
 * before it. The outputs are poisoned before each step; every returned row (o,
 * the LSEs, the selected blocks) is compared with the forward's: bitwise on
 * cpu (the decode step runs the forward's own per-row functions), within the
 * parity tolerance elsewhere (a row whose selection differs, a near-tie, is left
 * to the oracle comparison); the first row past the step's rows must stay
 * poisoned. The assembled rows of the batch also go through the testkit's
 * comparison with the fp64 oracle (tk_compare: tolerances, near-tie rule): once
 * per case (f32) on cpu, in every dtype elsewhere.
 *
 * Then the checks of a step's data: each bad length or table entry gives its
 * named status (from nsa_decode on cpu; a device backend's nsa_decode returns
 * once the step is queued and nsa_decode_check gives it), writes no output row
 * and no cache entry, and nsa_decode_check and the status tensor say the same.
 *
 * A step run twice gives bitwise the same rows (determinism).
 *
 * Usage: test_decode [backend] [corpus]   (defaults: cpu small; "small" also runs
 * a few packed cases of the full corpus); NSA_TEST_CASE=<label>[,<label>...] keeps
 * only those cases of the parity run, NSA_TEST_DTYPES=<dtype>[,...] only those dtypes
 * (subsets, for Oclgrind; without f32 the f32 checks of the step, the plan and
 * determinism are left out too, so a backend forced onto a 16-bit-only kernel,
 * NSA_CUDA_FORCE=decode_attn:decode_sm80_probs say, runs its parity alone). A
 * backend that is unavailable or has no decode step (NSA_ERR_UNSUPPORTED from
 * nsa_decode_plan_create in the first listed dtype) exits 77.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

static const char *g_backend = "cpu";
static const char *g_corpus = "small";
static nsa_context *g_ctx;
static long g_cases, g_steps, g_rows, g_oracle;
static double g_worst_oracle, g_worst_fwd; /* g_worst_fwd: off cpu, worst |o - forward's| / parity tolerance */

#define MAX_STEP 64 /* the plan's max_step_tokens: prefill chunks up to 64, decode steps up to 16 */

/* ------------------------------------------------------------------ a decode run */

typedef struct dec {
    const tk_case *c;
    const tk_inputs *in;
    nsa_dtype dt, fdt;
    size_t es, fes;
    int64_t B, MT, Hq, Hkv, Dqk, Dv, n;
    int raw[3], shared_with[3]; /* raw: the branch reads raw keys; shared_with: first branch with its k, v */
    nsa_decode_limits lim;
    nsa_plan *plan;
    nsa_buffer *bufs[40];
    int nbufs;
    nsa_buffer *q, *k[3], *v[3], *gate[3], *wk, *wv, *pek, *pev, *cuq, *csl, *bt, *cbt;
    nsa_buffer *kcache[3], *vcache[3], *kcc, *vcc, *o, *lse[3], *sel, *status;
    int32_t *table, *ctable;
    int64_t len[TK_MAX_BATCH], done[TK_MAX_BATCH], cmp_base[TK_MAX_BATCH];
    nsa_decode_args args;
} dec;

static nsa_buffer *dbuf(dec *d, size_t bytes, unsigned char poison)
{
    nsa_buffer *b = NULL;
    ck_assert_int_lt(d->nbufs, 40);
    ck_assert_msg(nsa_buffer_alloc(g_ctx, bytes ? bytes : 16, &b) == NSA_SUCCESS, "alloc: %s", nsa_last_error());
    ck_assert_int_eq(nsa_buffer_fill(b, 0, poison, nsa_buffer_size(b)), NSA_SUCCESS);
    d->bufs[d->nbufs++] = b;
    return b;
}

/* n floats converted to dt, written at element offset off of b */
static void put(nsa_buffer *b, int64_t off, const float *x, int64_t n, nsa_dtype dt)
{
    if (n == 0) return;
    const size_t es = nsa_dtype_size(dt);
    void *tmp = malloc((size_t)n * es);
    ck_assert_ptr_nonnull(tmp);
    ck_assert_int_eq(nsa_convert(x, NSA_DTYPE_F32, tmp, dt, n), NSA_SUCCESS);
    ck_assert_int_eq(nsa_buffer_write(b, (size_t)off * es, tmp, (size_t)n * es), NSA_SUCCESS);
    free(tmp);
}

/* n elements of dt at element offset 0 of b, as doubles */
static double *get(nsa_buffer *b, int64_t n, nsa_dtype dt)
{
    const size_t es = nsa_dtype_size(dt);
    void *tmp = malloc((size_t)(n + 1) * es);
    double *out = malloc((size_t)(n + 1) * sizeof *out);
    ck_assert(tmp && out);
    ck_assert_int_eq(nsa_buffer_read(b, 0, tmp, (size_t)n * es), NSA_SUCCESS);
    ck_assert_int_eq(nsa_convert(tmp, dt, out, NSA_DTYPE_F64, n), NSA_SUCCESS);
    free(tmp);
    return out;
}

static nsa_tensor view(nsa_buffer *b, int64_t heads, int64_t dim)
{
    return b ? nsa_tensor_dense(b, 0, heads, dim) : (nsa_tensor){0};
}

/* The plan, the caches and the step buffers of case c; 0 when the backend has no decode step. */
static int dec_make(dec *d, const tk_case *c, const tk_inputs *in, int64_t ps, int64_t cps, uint64_t seed)
{
    memset(d, 0, sizeof *d);
    d->c = c;
    d->in = in;
    const nsa_config *g = &c->cfg;
    d->dt = g->dtype;
    d->fdt = tk_float_dtype(d->dt);
    d->es = nsa_dtype_size(d->dt);
    d->fes = nsa_dtype_size(d->fdt);
    d->B = c->batch;
    d->Hq = g->num_q_heads;
    d->Hkv = g->num_kv_heads;
    d->Dqk = g->head_dim_qk;
    d->Dv = g->head_dim_v;
    d->n = g->num_selected;
    d->MT = MAX_STEP * d->B;
    int64_t max_len = 1, max_nc = 0, base = 0;
    for (int64_t b = 0; b < d->B; b++) {
        d->len[b] = c->cu_seqlens[b + 1] - c->cu_seqlens[b];
        d->cmp_base[b] = base;
        base += tk_num_cmp_blocks(g, d->len[b]);
        if (d->len[b] > max_len) max_len = d->len[b];
        if (tk_num_cmp_blocks(g, d->len[b]) > max_nc) max_nc = tk_num_cmp_blocks(g, d->len[b]);
    }
    const int on[3] = {1, d->n > 0, g->window > 0};
    for (int b = 0; b < 3; b++) {
        d->raw[b] = on[b] && !(b == NSA_BRANCH_CMP && g->compress == NSA_COMPRESS_EXTERNAL);
        d->shared_with[b] = b;
        for (int e = 0; e < b && d->raw[b]; e++)
            if (d->raw[e] && d->shared_with[e] == e && in->k[e] == in->k[b] && in->v[e] == in->v[b]) {
                d->shared_with[b] = e;
                break;
            }
    }
    nsa_decode_limits *lim = &d->lim;
    lim->batch = d->B;
    lim->max_step_tokens = MAX_STEP;
    lim->max_total_tokens = d->MT;
    lim->max_context = max_len;
    lim->page_size = ps;
    lim->max_pages = (max_len + ps - 1) / ps + 1;        /* a spare column */
    lim->num_pages = d->B * lim->max_pages + 2;          /* two pages nobody uses */
    lim->cmp_page_size = cps;
    lim->max_cmp_pages = (max_nc + cps - 1) / cps + 1;
    lim->num_cmp_pages = d->B * lim->max_cmp_pages;
    nsa_status s = nsa_decode_plan_create(g_ctx, g, lim, &d->plan);
    if (s == NSA_ERR_UNSUPPORTED) return 0;
    ck_assert_msg(s == NSA_SUCCESS, "%s: nsa_decode_plan_create: %s", c->label, nsa_last_error());
    /* tables: every sequence's pages anywhere in the pool */
    uint64_t rs = seed;
    int32_t *perm = malloc((size_t)lim->num_pages * sizeof *perm), *cperm = malloc((size_t)lim->num_cmp_pages * 4 + 4);
    d->table = malloc((size_t)(d->B * lim->max_pages) * sizeof *d->table);
    d->ctable = malloc((size_t)(d->B * lim->max_cmp_pages) * sizeof *d->ctable + 4);
    ck_assert(perm && cperm && d->table && d->ctable);
    tk_shuffle(perm, lim->num_pages, &rs);
    tk_shuffle(cperm, lim->num_cmp_pages, &rs);
    for (int64_t i = 0; i < d->B * lim->max_pages; i++) d->table[i] = perm[i];
    for (int64_t i = 0; i < d->B * lim->max_cmp_pages; i++) d->ctable[i] = cperm[i];
    free(perm);
    free(cperm);
    /* buffers */
    const int64_t pool = lim->num_pages * ps, cpool = lim->num_cmp_pages * cps, MT = d->MT;
    d->q = dbuf(d, (size_t)(MT * d->Hq * d->Dqk) * d->es, 0);
    d->o = dbuf(d, (size_t)(MT * d->Hq * d->Dv) * d->es, 0xFF);
    for (int b = 0; b < 3; b++) {
        if (on[b]) {
            d->gate[b] = dbuf(d, (size_t)(MT * d->Hq) * d->fes, 0);
            d->lse[b] = dbuf(d, (size_t)(MT * d->Hq) * d->fes, 0xFF);
        }
        if (!d->raw[b]) continue;
        if (d->shared_with[b] != b) {
            const int e = d->shared_with[b];
            d->k[b] = d->k[e];
            d->v[b] = d->v[e];
            d->kcache[b] = d->kcache[e];
            d->vcache[b] = d->vcache[e];
            continue;
        }
        d->k[b] = dbuf(d, (size_t)(MT * d->Hkv * d->Dqk) * d->es, 0);
        d->v[b] = dbuf(d, (size_t)(MT * d->Hkv * d->Dv) * d->es, 0);
        d->kcache[b] = dbuf(d, (size_t)(pool * d->Hkv * d->Dqk) * d->es, 0xFF);
        d->vcache[b] = dbuf(d, (size_t)(pool * d->Hkv * d->Dv) * d->es, 0xFF);
    }
    d->kcc = dbuf(d, (size_t)(cpool * d->Hkv * d->Dqk) * d->es, 0xFF);
    d->vcc = dbuf(d, (size_t)(cpool * d->Hkv * d->Dv) * d->es, 0xFF);
    if (d->n > 0) d->sel = dbuf(d, (size_t)(MT * d->Hkv * d->n) * 4, 0xFF);
    d->status = dbuf(d, 8, 0xFF);
    d->cuq = dbuf(d, (size_t)(d->B + 1) * 4, 0);
    d->csl = dbuf(d, (size_t)d->B * 4, 0);
    d->bt = dbuf(d, (size_t)(d->B * lim->max_pages) * 4, 0);
    d->cbt = dbuf(d, (size_t)(d->B * lim->max_cmp_pages) * 4 + 4, 0);
    ck_assert_int_eq(nsa_buffer_write(d->bt, 0, d->table, (size_t)(d->B * lim->max_pages) * 4), NSA_SUCCESS);
    ck_assert_int_eq(nsa_buffer_write(d->cbt, 0, d->ctable, (size_t)(d->B * lim->max_cmp_pages) * 4), NSA_SUCCESS);
    if (g->compress == NSA_COMPRESS_LINEAR) {
        const int64_t l = g->cmp_block;
        d->wk = dbuf(d, (size_t)(d->Hkv * l * d->Dqk * d->Dqk) * d->es, 0);
        d->wv = dbuf(d, (size_t)(d->Hkv * l * d->Dv * d->Dv) * d->es, 0);
        put(d->wk, 0, in->w_k, d->Hkv * l * d->Dqk * d->Dqk, d->dt);
        put(d->wv, 0, in->w_v, d->Hkv * l * d->Dv * d->Dv, d->dt);
        if (in->pe_k) {
            d->pek = dbuf(d, (size_t)(d->Hkv * l * d->Dqk) * d->es, 0);
            d->pev = dbuf(d, (size_t)(d->Hkv * l * d->Dv) * d->es, 0);
            put(d->pek, 0, in->pe_k, d->Hkv * l * d->Dqk, d->dt);
            put(d->pev, 0, in->pe_v, d->Hkv * l * d->Dv, d->dt);
        }
    }
    nsa_decode_args *a = &d->args;
    a->q = view(d->q, d->Hq, d->Dqk);
    a->o = view(d->o, d->Hq, d->Dv);
    for (int b = 0; b < 3; b++) {
        a->gate[b] = view(d->gate[b], d->Hq, 1);
        a->lse[b] = view(d->lse[b], d->Hq, 1);
        a->k[b] = view(d->k[b], d->Hkv, d->Dqk);
        a->v[b] = view(d->v[b], d->Hkv, d->Dv);
        a->k_cache[b] = view(d->kcache[b], d->Hkv, d->Dqk);
        a->v_cache[b] = view(d->vcache[b], d->Hkv, d->Dv);
    }
    a->w_k = view(d->wk, 1, 1);
    a->w_v = view(d->wv, 1, 1);
    a->pe_k = view(d->pek, 1, 1);
    a->pe_v = view(d->pev, 1, 1);
    a->cu_seqlens_q = view(d->cuq, 1, 1);
    a->cache_seqlens = view(d->csl, 1, 1);
    a->block_table = nsa_tensor_dense(d->bt, 0, 1, lim->max_pages);
    a->cmp_block_table = nsa_tensor_dense(d->cbt, 0, 1, lim->max_cmp_pages);
    a->kc_cache = view(d->kcc, d->Hkv, d->Dqk);
    a->vc_cache = view(d->vcc, d->Hkv, d->Dv);
    a->selected = d->sel ? nsa_tensor_dense(d->sel, 0, d->Hkv, d->n) : (nsa_tensor){0};
    a->status = view(d->status, 1, 1);
    return 1;
}

static void dec_free(dec *d)
{
    ck_assert_int_eq(nsa_plan_destroy(d->plan), NSA_SUCCESS);
    for (int i = 0; i < d->nbufs; i++) ck_assert_int_eq(nsa_buffer_free(d->bufs[i]), NSA_SUCCESS);
    free(d->table);
    free(d->ctable);
    memset(d, 0, sizeof *d);
}

/* Writes the step's inputs: tq[b] new tokens of each sequence, packed; the
 * lengths; (EXTERNAL) the compressed rows the step completes. */
static void dec_upload(dec *d, const int64_t *tq, int32_t *cu)
{
    const tk_case *c = d->c;
    const tk_inputs *in = d->in;
    const nsa_config *g = &c->cfg;
    const int64_t MT = d->MT;
    cu[0] = 0;
    for (int64_t b = 0; b < d->B; b++) cu[b + 1] = cu[b] + (int32_t)tq[b];
    float *hq = calloc((size_t)(MT * d->Hq * d->Dqk) + 1, sizeof(float));
    float *hg = calloc((size_t)(MT * d->Hq) + 1, sizeof(float));
    float *hk = calloc((size_t)(MT * d->Hkv * d->Dqk) + 1, sizeof(float));
    float *hv = calloc((size_t)(MT * d->Hkv * d->Dv) + 1, sizeof(float));
    ck_assert(hq && hg && hk && hv);
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t j = 0; j < tq[b]; j++) {
            const int64_t r = cu[b] + j, t = c->cu_seqlens[b] + d->done[b] + j;
            memcpy(hq + r * d->Hq * d->Dqk, in->q + t * d->Hq * d->Dqk, (size_t)(d->Hq * d->Dqk) * sizeof(float));
        }
    put(d->q, 0, hq, MT * d->Hq * d->Dqk, d->dt);
    for (int br = 0; br < 3; br++) {
        if (d->gate[br]) {
            for (int64_t b = 0; b < d->B; b++)
                for (int64_t j = 0; j < tq[b]; j++)
                    memcpy(hg + (cu[b] + j) * d->Hq, in->gate[br] + (c->cu_seqlens[b] + d->done[b] + j) * d->Hq,
                           (size_t)d->Hq * sizeof(float));
            put(d->gate[br], 0, hg, MT * d->Hq, d->fdt);
        }
        if (!d->raw[br] || d->shared_with[br] != br) continue;
        for (int64_t b = 0; b < d->B; b++)
            for (int64_t j = 0; j < tq[b]; j++) {
                const int64_t r = cu[b] + j, t = c->cu_seqlens[b] + d->done[b] + j;
                memcpy(hk + r * d->Hkv * d->Dqk, in->k[br] + t * d->Hkv * d->Dqk,
                       (size_t)(d->Hkv * d->Dqk) * sizeof(float));
                memcpy(hv + r * d->Hkv * d->Dv, in->v[br] + t * d->Hkv * d->Dv, (size_t)(d->Hkv * d->Dv) * sizeof(float));
            }
        put(d->k[br], 0, hk, MT * d->Hkv * d->Dqk, d->dt);
        put(d->v[br], 0, hv, MT * d->Hkv * d->Dv, d->dt);
    }
    free(hq);
    free(hg);
    free(hk);
    free(hv);
    ck_assert_int_eq(nsa_buffer_write(d->cuq, 0, cu, (size_t)(d->B + 1) * 4), NSA_SUCCESS);
    int32_t tk0[TK_MAX_BATCH];
    for (int64_t b = 0; b < d->B; b++) tk0[b] = (int32_t)d->done[b];
    ck_assert_int_eq(nsa_buffer_write(d->csl, 0, tk0, (size_t)d->B * 4), NSA_SUCCESS);
    if (g->compress != NSA_COMPRESS_EXTERNAL) return;
    const int64_t cps = d->lim.cmp_page_size;
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t i = tk_num_cmp_blocks(g, d->done[b]); i < tk_num_cmp_blocks(g, d->done[b] + tq[b]); i++) {
            const int64_t row = (int64_t)d->ctable[b * d->lim.max_cmp_pages + i / cps] * cps + i % cps;
            put(d->kcc, row * d->Hkv * d->Dqk, in->kc + (d->cmp_base[b] + i) * d->Hkv * d->Dqk, d->Hkv * d->Dqk, d->dt);
            put(d->vcc, row * d->Hkv * d->Dv, in->vc + (d->cmp_base[b] + i) * d->Hkv * d->Dv, d->Hkv * d->Dv, d->dt);
        }
}

/* Poisons the outputs (o, LSEs, selected, status). */
static void dec_poison(dec *d)
{
    nsa_buffer *out[6] = {d->o, d->lse[0], d->lse[1], d->lse[2], d->sel, d->status};
    for (int i = 0; i < 6; i++)
        if (out[i]) ck_assert_int_eq(nsa_buffer_fill(out[i], 0, 0xFF, nsa_buffer_size(out[i])), NSA_SUCCESS);
}

/* ------------------------------------------------------------------ the parity run */

/* |got - ref| within the parity tolerance (non-cpu backends) */
static int close_enough(double got, double ref, double scale, const tk_tolerance *t)
{
    if (isinf(ref) || isinf(got)) return got == ref;
    const double tol = t->o_rms * scale + t->o_rel * fabs(ref) + t->o_abs, err = fabs(got - ref);
    if (tol > 0 && err / tol > g_worst_fwd) g_worst_fwd = err / tol;
    return err <= tol;
}

/* One case in one dtype: prefill + decode the whole batch, every row against fo
 * (the forward's). Rows are gathered into dec_out (the batch's layout) for the oracle. */
static void run_case(const tk_case *c, const tk_inputs *in, const tk_output *fo, int64_t ps, int64_t cps,
                     uint64_t seed, tk_output *dec_out)
{
    dec d;
    if (!dec_make(&d, c, in, ps, cps, seed)) {
        ck_abort_msg("%s: the backend decoded before and now refuses", c->label);
    }
    const int bitwise = strcmp(g_backend, "cpu") == 0;
    const tk_tolerance tol = tk_tolerance_for(d.dt);
    const int64_t T = tk_case_tokens(c), Hq = d.Hq, Hkv = d.Hkv, Dv = d.Dv, n = d.n;
    double scale = 0;
    for (int64_t e = 0; e < T * Hq * Dv; e++) scale += fo->o_d[e] * fo->o_d[e];
    scale = T > 0 ? sqrt(scale / (double)(T * Hq * Dv)) : 1;
    if (scale < 0.3) scale = 0.3; /* |V| ~ 0.58 rms: the parity scale's V term, roughly */
    int64_t prefill[TK_MAX_BATCH];
    uint64_t rs = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t b = 0; b < d.B; b++) prefill[b] = (int64_t)(tk_splitmix64(&rs) % (uint64_t)(d.len[b] + 1));
    for (;;) {
        int64_t tq[TK_MAX_BATCH], any = 0;
        for (int64_t b = 0; b < d.B; b++) {
            const int64_t left = d.len[b] - d.done[b];
            if (d.done[b] < prefill[b])
                tq[b] = 1 + (int64_t)(tk_splitmix64(&rs) % MAX_STEP);
            else
                tq[b] = tk_splitmix64(&rs) % 5 == 0 ? 0 : 1 + (int64_t)(tk_splitmix64(&rs) % 16);
            if (d.done[b] < prefill[b] && tq[b] > prefill[b] - d.done[b]) tq[b] = prefill[b] - d.done[b];
            if (tq[b] > left) tq[b] = left;
            any |= tq[b] > 0;
        }
        if (!any) {
            int64_t b0 = -1;
            for (int64_t b = 0; b < d.B; b++)
                if (d.done[b] < d.len[b]) b0 = b;
            if (b0 < 0) break;
            tq[b0] = 1;
        }
        int32_t cu[TK_MAX_BATCH + 1];
        dec_upload(&d, tq, cu);
        dec_poison(&d);
        nsa_status s = nsa_decode(d.plan, &d.args, NULL);
        ck_assert_msg(s == NSA_SUCCESS, "%s %s: nsa_decode: %s: %s", c->label, nsa_dtype_name(d.dt),
                      nsa_status_string(s), nsa_last_error());
        ck_assert_int_eq(nsa_decode_check(d.plan), NSA_SUCCESS);
        int32_t st[2];
        ck_assert_int_eq(nsa_buffer_read(d.status, 0, st, 8), NSA_SUCCESS);
        ck_assert_msg(st[0] == 0 && st[1] == -1, "status tensor (%d, %d)", st[0], st[1]);
        const int64_t rows = cu[d.B];
        double *o = get(d.o, d.MT * Hq * Dv, d.dt);
        double *lse[3] = {0};
        for (int br = 0; br < 3; br++)
            if (d.lse[br]) lse[br] = get(d.lse[br], d.MT * Hq, d.fdt);
        int32_t *sel = NULL;
        if (n > 0) {
            sel = malloc((size_t)(d.MT * Hkv * n) * 4);
            ck_assert_int_eq(nsa_buffer_read(d.sel, 0, sel, (size_t)(d.MT * Hkv * n) * 4), NSA_SUCCESS);
        }
        for (int64_t b = 0; b < d.B; b++)
            for (int64_t j = 0; j < tq[b]; j++) {
                const int64_t r = cu[b] + j, t = c->cu_seqlens[b] + d.done[b] + j;
                /* off cpu a row whose selection differs from the forward's (a near-tie)
                 * is left to the oracle comparison, which has the near-tie rule */
                const int same_sel = n == 0 || memcmp(sel + r * Hkv * n, fo->sel + t * Hkv * n,
                                                      (size_t)(Hkv * n) * 4) == 0;
                for (int64_t e = 0; e < Hq * Dv; e++) {
                    const double got = o[r * Hq * Dv + e], ref = fo->o_d[t * Hq * Dv + e];
                    ck_assert_msg(bitwise ? memcmp(&got, &ref, sizeof got) == 0
                                          : !same_sel || close_enough(got, ref, scale, &tol),
                                  "%s %s: sequence %lld position %lld (TK0 %lld, TQ %lld): o[%lld] = %.17g, the "
                                  "forward's %.17g",
                                  c->label, nsa_dtype_name(d.dt), (long long)b, (long long)(d.done[b] + j),
                                  (long long)d.done[b], (long long)tq[b], (long long)e, got, ref);
                    dec_out->o_d[t * Hq * Dv + e] = got;
                    dec_out->o[t * Hq * Dv + e] = (float)got;
                }
                for (int br = 0; br < 3; br++) {
                    if (!lse[br]) continue;
                    for (int64_t h = 0; h < Hq; h++) {
                        const double got = lse[br][r * Hq + h], ref = fo->lse_d[br][t * Hq + h];
                        ck_assert_msg(bitwise ? memcmp(&got, &ref, sizeof got) == 0
                                              : (!same_sel || got == ref ||
                                                 fabs(got - ref) <= tol.lse_abs + tol.lse_rel * fabs(ref)),
                                      "%s %s: sequence %lld position %lld: lse[%d][head %lld] = %.17g, the forward's "
                                      "%.17g",
                                      c->label, nsa_dtype_name(d.dt), (long long)b, (long long)(d.done[b] + j), br,
                                      (long long)h, got, ref);
                        dec_out->lse_d[br][t * Hq + h] = got;
                        dec_out->lse[br][t * Hq + h] = (float)got;
                    }
                }
                if (n > 0) {
                    /* bitwise on cpu; elsewhere the oracle comparison judges near-ties */
                    if (bitwise)
                        ck_assert_msg(memcmp(sel + r * Hkv * n, fo->sel + t * Hkv * n, (size_t)(Hkv * n) * 4) == 0,
                                      "%s %s: sequence %lld position %lld: selected blocks differ from the forward's",
                                      c->label, nsa_dtype_name(d.dt), (long long)b, (long long)(d.done[b] + j));
                    memcpy(dec_out->sel + t * Hkv * n, sel + r * Hkv * n, (size_t)(Hkv * n) * 4);
                }
            }
        /* the row after the step's rows stays poisoned */
        if (rows < d.MT) ck_assert_msg(isnan(o[rows * Hq * Dv]), "%s: o row %lld past the step was written", c->label,
                                       (long long)rows);
        free(o);
        for (int br = 0; br < 3; br++) free(lse[br]);
        free(sel);
        for (int64_t b = 0; b < d.B; b++) {
            d.done[b] += tq[b];
            g_rows += tq[b];
        }
        g_steps++;
    }
    dec_free(&d);
}

/* Is label in the comma list? */
static int in_list(const char *list, const char *label)
{
    for (const char *p = list; *p;) {
        const size_t len = strcspn(p, ",");
        if (len == strlen(label) && strncmp(p, label, len) == 0) return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}

static int64_t case_max_len(const tk_case *c)
{
    int64_t m = 0;
    for (int64_t b = 0; b < c->batch; b++)
        if (c->cu_seqlens[b + 1] - c->cu_seqlens[b] > m) m = c->cu_seqlens[b + 1] - c->cu_seqlens[b];
    return m;
}

/* The cases: the named corpus, and with "small" a few packed cases of the full one
 * (several sequences, ragged lengths, each compression mode, G up to 16). */
static int pick_cases(tk_case **out)
{
    tk_case *base = NULL, *full = NULL;
    int nb = tk_corpus(g_corpus, &base);
    ck_assert_int_ge(nb, 0);
    int nf = strcmp(g_corpus, "small") == 0 ? tk_corpus("full", &full) : 0;
    tk_case *all = malloc((size_t)(nb + 20) * sizeof *all);
    ck_assert_ptr_nonnull(all);
    int n = 0;
    for (int i = 0; i < nb; i++)
        if (strcmp(g_corpus, "small") == 0 || case_max_len(&base[i]) <= 400) all[n++] = base[i];
    const char *only = getenv("NSA_TEST_CASE");
    int per_mode[3] = {0}, big_g = 0, distinct = 0; /* distinct: one k, v per branch (three caches) */
    for (int i = 0; i < nf && n < nb + 20; i++) {
        const tk_case *c = &full[i];
        const int64_t G = c->cfg.num_q_heads / c->cfg.num_kv_heads;
        if (c->batch < 2 || tk_case_tokens(c) > 2000 || case_max_len(c) > 1000) continue;
        int want = per_mode[c->cfg.compress] < 5 || (G >= 8 && !big_g) ||
                   (c->layout == TK_LAYOUT_DISTINCT && distinct < 2);
        if (!want) continue;
        per_mode[c->cfg.compress]++;
        big_g |= G >= 8;
        distinct += c->layout == TK_LAYOUT_DISTINCT;
        all[n++] = *c;
        if (getenv("NSA_TEST_VERBOSE")) {
            char desc[256];
            printf("decode: full-corpus case %s\n", tk_case_describe(c, desc, sizeof desc));
        }
    }
    free(base);
    free(full);
    /* NSA_TEST_CASE=<label>[,<label>...]: only the cases with these labels (a subset, e.g. for Oclgrind) */
    if (only && *only) {
        int kept = 0;
        for (int i = 0; i < n; i++)
            if (in_list(only, all[i].label)) all[kept++] = all[i];
        n = kept;
    }
    *out = all;
    return n;
}

static void run_dtype(nsa_dtype dt)
{
    /* NSA_TEST_DTYPES=f32,bf16 ...: the parity run in those dtypes only (a subset, for Oclgrind) */
    const char *dts = getenv("NSA_TEST_DTYPES");
    if (dts && *dts && !in_list(dts, nsa_dtype_name(dt))) return;
    tk_case *cases = NULL;
    const int nc = pick_cases(&cases);
    const int64_t pages[3][2] = {{3, 2}, {16, 1}, {1, 5}};
    for (int ci = 0; ci < nc; ci++) {
        tk_case c = cases[ci];
        c.fixed_indices = 0; /* a decode step selects its own blocks */
        tk_case_set_dtype(&c, dt);
        tk_inputs in;
        ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
        tk_output fo;
        char msg[1024];
        nsa_status s = tk_run(g_ctx, &c, &in, &fo, msg, sizeof msg);
        ck_assert_msg(s == NSA_SUCCESS, "%s: the forward: %s", c.label, msg);
        const int64_t T = tk_case_tokens(&c), Hq = c.cfg.num_q_heads, Dv = c.cfg.head_dim_v;
        const int64_t n = c.cfg.num_selected, Hkv = c.cfg.num_kv_heads;
        tk_output got;
        memset(&got, 0, sizeof got);
        got.tokens = T;
        got.o = malloc((size_t)(T * Hq * Dv + 1) * sizeof(float));
        got.o_d = malloc((size_t)(T * Hq * Dv + 1) * sizeof(double));
        for (int b = 0; b < 3; b++)
            if (fo.lse_d[b]) {
                got.lse[b] = malloc((size_t)(T * Hq + 1) * sizeof(float));
                got.lse_d[b] = malloc((size_t)(T * Hq + 1) * sizeof(double));
            }
        if (n > 0) got.sel = malloc((size_t)(T * Hkv * n + 1) * 4);
        const int pl = ci % 3;
        run_case(&c, &in, &fo, pages[pl][0], pages[pl][1], (uint64_t)(ci + 1) * 7919u + (uint64_t)dt, &got);
        if (dt == NSA_DTYPE_F32 || strcmp(g_backend, "cpu") != 0) { /* the oracle: once per case on cpu */
            tk_oracle ref;
            ck_assert_int_eq(tk_oracle_run(&c, &in, NULL, &ref), NSA_SUCCESS);
            tk_verdict v;
            int pass = tk_compare(&c, &in, &ref, &got, &v);
            ck_assert_msg(pass, "%s: decode rows against the oracle: %s", c.label, v.msg);
            if (v.o_ratio > g_worst_oracle) g_worst_oracle = v.o_ratio;
            g_oracle++;
            tk_oracle_free(&ref);
        }
        tk_output_free(&got);
        tk_output_free(&fo);
        tk_inputs_free(&in);
        g_cases++;
    }
    free(cases);
}

START_TEST(decode_f32) { run_dtype(NSA_DTYPE_F32); }
END_TEST
START_TEST(decode_f16) { run_dtype(NSA_DTYPE_F16); }
END_TEST
START_TEST(decode_bf16) { run_dtype(NSA_DTYPE_BF16); }
END_TEST
START_TEST(decode_f64)
{
    nsa_config cfg;
    nsa_config_init(&cfg);
    cfg.dtype = NSA_DTYPE_F64;
    nsa_decode_limits lim = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    nsa_plan *p = NULL;
    if (nsa_decode_plan_create(g_ctx, &cfg, &lim, &p) == NSA_ERR_UNSUPPORTED) {
        ck_assert_str_ne(g_backend, "cpu");
        printf("decode-%s: f64 refused (%s): skipped\n", g_backend, nsa_last_error());
        return;
    }
    ck_assert_int_eq(nsa_plan_destroy(p), NSA_SUCCESS);
    run_dtype(NSA_DTYPE_F64);
}
END_TEST

/* ------------------------------------------------------------------ the step's data checks */

/* A two-sequence batch prefilled to 20 and 9 tokens, ready for a step of 3 + 2 tokens. */
static tk_case small_case(void)
{
    tk_case c;
    memset(&c, 0, sizeof c);
    snprintf(c.label, sizeof c.label, "decode-checks");
    nsa_config_init(&c.cfg);
    c.cfg.num_q_heads = 4;
    c.cfg.num_kv_heads = 2;
    c.cfg.head_dim_qk = 8;
    c.cfg.head_dim_v = 4;
    c.cfg.cmp_block = 4;
    c.cfg.cmp_stride = 2;
    c.cfg.slc_block = 4;
    c.cfg.num_selected = 3;
    c.cfg.num_init = 1;
    c.cfg.num_local = 1;
    c.cfg.window = 5;
    c.cfg.dtype = NSA_DTYPE_F32;
    c.batch = 2;
    c.cu_seqlens[1] = 40;
    c.cu_seqlens[2] = 60;
    c.seed = 99;
    return c;
}

typedef struct bad_step {
    const char *what;
    nsa_status want;
    const char *needle;
} bad_step;

/* Runs a step the mutation made bad: named status, nothing written, the same from nsa_decode_check. */
static void expect_refused(dec *d, const bad_step *bs, int64_t bad_seq)
{
    const int64_t psz = d->lim.page_size;
    /* a cache entry the good step would write: sequence 0's position done[0] */
    const int64_t row = (int64_t)d->table[d->done[0] / psz] * psz + d->done[0] % psz;
    float before[64], after[64];
    const size_t kbytes = (size_t)(d->Hkv * d->Dqk) * 4;
    ck_assert_int_eq(nsa_buffer_read(d->kcache[NSA_BRANCH_SLC], (size_t)row * kbytes, before, kbytes), NSA_SUCCESS);
    dec_poison(d);
    nsa_status s = nsa_decode(d->plan, &d->args, NULL);
    /* cpu checks before it returns; a device step is queued, and nsa_decode_check tells */
    if (s == NSA_SUCCESS && strcmp(g_backend, "cpu") != 0) s = nsa_decode_check(d->plan);
    ck_assert_msg(s == bs->want, "%s: nsa_decode returned %s (%s), expected %s", bs->what, nsa_status_string(s),
                  nsa_last_error(), nsa_status_string(bs->want));
    ck_assert_msg(strstr(nsa_last_error(), bs->needle), "%s: message '%s' lacks '%s'", bs->what, nsa_last_error(),
                  bs->needle);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", nsa_last_error());
    ck_assert_int_eq(nsa_decode_check(d->plan), bs->want);
    ck_assert_str_eq(nsa_last_error(), msg);
    int32_t st[2];
    ck_assert_int_eq(nsa_buffer_read(d->status, 0, st, 8), NSA_SUCCESS);
    ck_assert_msg(st[0] == (int32_t)bs->want && st[1] == bad_seq, "%s: status tensor (%d, %d), expected (%d, %lld)",
                  bs->what, st[0], st[1], (int)bs->want, (long long)bad_seq);
    ck_assert_int_eq(nsa_buffer_read(d->kcache[NSA_BRANCH_SLC], (size_t)row * kbytes, after, kbytes), NSA_SUCCESS);
    ck_assert_msg(memcmp(before, after, kbytes) == 0, "%s: the refused step wrote a cache entry", bs->what);
    float o0;
    ck_assert_int_eq(nsa_buffer_read(d->o, 0, &o0, 4), NSA_SUCCESS);
    ck_assert_msg(isnan(o0), "%s: the refused step wrote an output row", bs->what);
}

START_TEST(step_checks)
{
    tk_case c = small_case();
    tk_inputs in;
    ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
    dec d;
    if (!dec_make(&d, &c, &in, 4, 2, 5)) {
        tk_inputs_free(&in);
        return;
    }
    /* prefill 20 and 9 tokens */
    int64_t tq[2] = {20, 9};
    int32_t cu[3];
    dec_upload(&d, tq, cu);
    ck_assert_msg(nsa_decode(d.plan, &d.args, NULL) == NSA_SUCCESS, "%s", nsa_last_error());
    d.done[0] = 20;
    d.done[1] = 9;
    tq[0] = 3;
    tq[1] = 2;
    dec_upload(&d, tq, cu);
    const nsa_decode_limits L = d.lim;
    int32_t w[4];
    /* cu_seqlens_q: not starting at 0, decreasing, past max_total_tokens, TQ above max_step_tokens */
    const struct {
        int32_t cu[3];
        const char *needle;
        int64_t seq;
    } cus[] = {{{1, 3, 5}, "cu_seqlens_q[0] = 1", 0},
               {{0, 3, 2}, "sequence 1: cu_seqlens_q decreases", 1},
               {{0, 3, (int32_t)L.max_total_tokens + 1}, "passes the plan's max_total_tokens", 1},
               {{0, MAX_STEP + 1, MAX_STEP + 2}, "exceeds the plan's max_step_tokens", 0}};
    for (size_t i = 0; i < sizeof cus / sizeof cus[0]; i++) {
        ck_assert_int_eq(nsa_buffer_write(d.cuq, 0, cus[i].cu, 12), NSA_SUCCESS);
        bad_step bs = {"cu_seqlens_q", NSA_ERR_INVALID_SHAPE, cus[i].needle};
        expect_refused(&d, &bs, cus[i].seq);
    }
    ck_assert_int_eq(nsa_buffer_write(d.cuq, 0, cu, 12), NSA_SUCCESS);
    /* TK0 < 0; TK > max_context */
    w[0] = 20;
    w[1] = -1;
    ck_assert_int_eq(nsa_buffer_write(d.csl, 0, w, 8), NSA_SUCCESS);
    bad_step neg = {"TK0 < 0", NSA_ERR_INVALID_SHAPE, "sequence 1: cache_seqlens (TK0) is negative"};
    expect_refused(&d, &neg, 1);
    w[1] = (int32_t)L.max_context - 1;
    ck_assert_int_eq(nsa_buffer_write(d.csl, 0, w, 8), NSA_SUCCESS);
    bad_step ctx = {"TK > max_context", NSA_ERR_INVALID_SHAPE, "exceeds the plan's max_context"};
    expect_refused(&d, &ctx, 1);
    w[0] = 20;
    w[1] = 9;
    ck_assert_int_eq(nsa_buffer_write(d.csl, 0, w, 8), NSA_SUCCESS);
    /* a page-table entry out of range: the page of sequence 1's new positions, and one it only reads */
    const int32_t good1 = d.table[L.max_pages + 2], good0 = d.table[0];
    int32_t bad = (int32_t)L.num_pages;
    ck_assert_int_eq(nsa_buffer_write(d.bt, (size_t)(L.max_pages + 2) * 4, &bad, 4), NSA_SUCCESS);
    bad_step pg = {"block_table entry", NSA_ERR_INVALID_VALUE, "block_table[1][2] = "};
    expect_refused(&d, &pg, 1);
    ck_assert_int_eq(nsa_buffer_write(d.bt, (size_t)(L.max_pages + 2) * 4, &good1, 4), NSA_SUCCESS);
    bad = -1;
    ck_assert_int_eq(nsa_buffer_write(d.bt, 0, &bad, 4), NSA_SUCCESS);
    bad_step pg0 = {"block_table entry read", NSA_ERR_INVALID_VALUE, "block_table[0][0] = -1"};
    expect_refused(&d, &pg0, 0);
    ck_assert_int_eq(nsa_buffer_write(d.bt, 0, &good0, 4), NSA_SUCCESS);
    /* a compressed page entry out of range (sequence 0: rows 0 .. Nc(23) - 1 = 9) */
    const int32_t cgood = d.ctable[1];
    bad = (int32_t)L.num_cmp_pages + 7;
    ck_assert_int_eq(nsa_buffer_write(d.cbt, 4, &bad, 4), NSA_SUCCESS);
    bad_step cpg = {"cmp_block_table entry", NSA_ERR_INVALID_VALUE, "cmp_block_table[0][1] = "};
    expect_refused(&d, &cpg, 0);
    ck_assert_int_eq(nsa_buffer_write(d.cbt, 4, &cgood, 4), NSA_SUCCESS);
    /* a page sequence 1 writes (its positions 9, 10: page column 2) that sequence 0 reads too */
    ck_assert_int_eq(nsa_buffer_write(d.bt, 0, &good1, 4), NSA_SUCCESS);
    bad_step shared = {"a written page in two tables", NSA_ERR_INVALID_VALUE, "appears 2 times"};
    expect_refused(&d, &shared, 1);
    ck_assert_int_eq(nsa_buffer_write(d.bt, 0, &good0, 4), NSA_SUCCESS);
    /* a compressed page the step writes, shared (sequence 0 forms rows 9, 10: page column 4) */
    const int32_t c4 = d.ctable[4];
    ck_assert_int_eq(nsa_buffer_write(d.cbt, (size_t)L.max_cmp_pages * 4, &c4, 4), NSA_SUCCESS);
    bad_step cshared = {"a written compressed page in two tables", NSA_ERR_INVALID_VALUE,
                        "cmp_block_table[0][4]"};
    expect_refused(&d, &cshared, 0);
    ck_assert_int_eq(nsa_buffer_write(d.cbt, (size_t)L.max_cmp_pages * 4, &d.ctable[L.max_cmp_pages], 4),
                     NSA_SUCCESS);
    /* after all that, the good step runs and a later nsa_decode_check says so */
    dec_poison(&d);
    ck_assert_msg(nsa_decode(d.plan, &d.args, NULL) == NSA_SUCCESS, "%s", nsa_last_error());
    ck_assert_int_eq(nsa_decode_check(d.plan), NSA_SUCCESS);
    dec_free(&d);
    tk_inputs_free(&in);
}
END_TEST

/* TK above max_pages * page_size, Nc(TK) above max_cmp_pages * cmp_page_size:
 * a plan whose tables are narrower than its max_context. */
START_TEST(step_checks_capacity)
{
    tk_case c = small_case();
    tk_inputs in;
    ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
    for (int which = 0; which < 2; which++) {
        dec d;
        if (!dec_make(&d, &c, &in, 4, 2, 11)) break;
        /* remake the plan with narrower tables over the same buffers */
        ck_assert_int_eq(nsa_plan_destroy(d.plan), NSA_SUCCESS);
        nsa_decode_limits lim = d.lim;
        if (which == 0) lim.max_pages = 2;     /* 8 positions */
        else lim.max_cmp_pages = 1;            /* 2 compressed rows: Nc(TK) <= 2, TK <= 7 */
        ck_assert_int_eq(nsa_decode_plan_create(g_ctx, &c.cfg, &lim, &d.plan), NSA_SUCCESS);
        d.lim = lim;
        int64_t tq[2] = {9, 0};
        int32_t cu[3];
        dec_upload(&d, tq, cu);
        bad_step bs = {which ? "Nc(TK) too large" : "TK too large", NSA_ERR_INVALID_SHAPE,
                       which ? "compressed rows do not fit" : "does not fit its max_pages pages"};
        expect_refused(&d, &bs, 0);
        dec_free(&d);
    }
    tk_inputs_free(&in);
}
END_TEST

/* The same step twice (it rewrites the same cache entries with the same bits):
 * o, the LSEs and the selected blocks are bitwise the same, on every backend. */
static unsigned char *read_all(nsa_buffer *b)
{
    const size_t n = nsa_buffer_size(b);
    unsigned char *p = malloc(n);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(nsa_buffer_read(b, 0, p, n), NSA_SUCCESS);
    return p;
}

START_TEST(determinism)
{
    tk_case c = small_case();
    tk_inputs in;
    ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
    for (int dt = 0; dt < 2; dt++) {
        tk_case_set_dtype(&c, dt ? NSA_DTYPE_BF16 : NSA_DTYPE_F32);
        dec d;
        if (!dec_make(&d, &c, &in, 4, 2, 17)) break;
        int64_t tq[2] = {26, 9};
        int32_t cu[3];
        dec_upload(&d, tq, cu);
        ck_assert_msg(nsa_decode(d.plan, &d.args, NULL) == NSA_SUCCESS, "%s", nsa_last_error());
        d.done[0] = 26;
        d.done[1] = 9;
        tq[0] = 7;
        tq[1] = 5;
        dec_upload(&d, tq, cu);
        nsa_buffer *out[5] = {d.o, d.lse[0], d.lse[1], d.lse[2], d.sel};
        unsigned char *first[5] = {0};
        for (int run = 0; run < 2; run++) {
            dec_poison(&d);
            ck_assert_msg(nsa_decode(d.plan, &d.args, NULL) == NSA_SUCCESS, "%s", nsa_last_error());
            ck_assert_int_eq(nsa_decode_check(d.plan), NSA_SUCCESS);
            for (int i = 0; i < 5; i++) {
                if (!out[i]) continue;
                unsigned char *now = read_all(out[i]);
                if (run == 0) {
                    first[i] = now;
                    continue;
                }
                ck_assert_msg(memcmp(first[i], now, nsa_buffer_size(out[i])) == 0,
                              "%s: output %d of the same step differs between two runs", nsa_dtype_name(d.dt), i);
                free(now);
                free(first[i]);
            }
        }
        dec_free(&d);
    }
    tk_inputs_free(&in);
}
END_TEST

/* ------------------------------------------------------------------ plans and arguments */

START_TEST(plan_kinds)
{
    tk_case c = small_case();
    tk_inputs in;
    ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
    dec d;
    if (!dec_make(&d, &c, &in, 4, 2, 3)) {
        tk_inputs_free(&in);
        return;
    }
    nsa_plan_info info;
    ck_assert_int_eq(nsa_plan_get_info(d.plan, &info), NSA_SUCCESS);
    ck_assert_str_eq(info.stages, "decode_append decode_attn");
    ck_assert_int_eq(info.num_stages, 2);
    ck_assert_int_eq(info.batch, 2);
    ck_assert_int_eq(info.total_tokens, d.MT);
    ck_assert(info.workspace_bytes > 0);
    /* a caller workspace of that size serves; one byte less does not */
    nsa_buffer *ws = NULL, *small = NULL;
    ck_assert_int_eq(nsa_buffer_alloc(g_ctx, info.workspace_bytes, &ws), NSA_SUCCESS);
    ck_assert_int_eq(nsa_buffer_alloc(g_ctx, info.workspace_bytes - 1, &small), NSA_SUCCESS);
    int64_t tq[2] = {5, 3};
    int32_t cu[3];
    dec_upload(&d, tq, cu);
    ck_assert_int_eq(nsa_decode(d.plan, &d.args, small), NSA_ERR_BUFFER_TOO_SMALL);
    ck_assert_msg(nsa_decode(d.plan, &d.args, ws) == NSA_SUCCESS, "%s", nsa_last_error());
    /* the growing-struct rule for nsa_decode_args: a larger struct is read when its
     * tail is zero and refused when it sets a byte there; a smaller one is refused */
    struct {
        nsa_decode_args args;
        int64_t extra[2];
    } big;
    memset(&big, 0, sizeof big);
    big.args = d.args;
    ck_assert_msg(nsa_decode_sized(d.plan, &big.args, sizeof big, NULL) == NSA_SUCCESS, "%s", nsa_last_error());
    big.extra[1] = 1;
    ck_assert_int_eq(nsa_decode_sized(d.plan, &big.args, sizeof big, NULL), NSA_ERR_VERSION_MISMATCH);
    ck_assert_int_eq(nsa_decode_sized(d.plan, &d.args, sizeof d.args - 8, NULL), NSA_ERR_VERSION_MISMATCH);
    ck_assert_ptr_nonnull(strstr(nsa_last_error(), "args"));
    /* nsa_forward / nsa_backward on a decode plan, nsa_decode on a forward plan */
    nsa_forward_args fa;
    memset(&fa, 0, sizeof fa);
    ck_assert_int_eq(nsa_forward(d.plan, &fa, NULL), NSA_ERR_INVALID_VALUE);
    ck_assert_ptr_nonnull(strstr(nsa_last_error(), "decode plan"));
    nsa_backward_args ba;
    memset(&ba, 0, sizeof ba);
    ck_assert_int_eq(nsa_backward(d.plan, &ba, NULL), NSA_ERR_INVALID_VALUE);
    ck_assert_ptr_nonnull(strstr(nsa_last_error(), "decode plan"));
    nsa_plan *fp = NULL;
    const int64_t cu64[2] = {0, 10};
    ck_assert_int_eq(nsa_plan_create(g_ctx, &c.cfg, cu64, 1, &fp), NSA_SUCCESS);
    ck_assert_int_eq(nsa_decode(fp, &d.args, NULL), NSA_ERR_INVALID_VALUE);
    ck_assert_ptr_nonnull(strstr(nsa_last_error(), "nsa_decode_plan_create"));
    ck_assert_int_eq(nsa_decode_check(fp), NSA_ERR_INVALID_VALUE);
    ck_assert_int_eq(nsa_plan_destroy(fp), NSA_SUCCESS);
    /* aliasing: an output over a cache, two overlapping caches that are not one view,
     * one cache for two branches whose new keys differ */
    nsa_decode_args a = d.args;
    a.lse[NSA_BRANCH_WIN] = nsa_tensor_dense(d.kcache[NSA_BRANCH_SLC], 0, d.Hq, 1);
    ck_assert_int_eq(nsa_decode(d.plan, &a, NULL), NSA_ERR_INVALID_VALUE);
    ck_assert_ptr_nonnull(strstr(nsa_last_error(), "args->lse[win]"));
    a = d.args;
    a.gate[NSA_BRANCH_WIN] = nsa_tensor_dense(d.kcache[NSA_BRANCH_SLC], 0, d.Hq, 1); /* an input in a cache */
    ck_assert_int_eq(nsa_decode(d.plan, &a, NULL), NSA_ERR_INVALID_VALUE);
    ck_assert_ptr_nonnull(strstr(nsa_last_error(), "args->gate[win]"));
    a = d.args;
    a.v_cache[NSA_BRANCH_WIN] = nsa_tensor_dense(d.kcache[NSA_BRANCH_SLC], 0, d.Hkv, d.Dv); /* overlaps k's */
    ck_assert_int_eq(nsa_decode(d.plan, &a, NULL), NSA_ERR_INVALID_VALUE);
    ck_assert_ptr_nonnull(strstr(nsa_last_error(), "overlaps"));
    a = d.args;
    a.k[NSA_BRANCH_WIN] = nsa_tensor_dense(d.q, 0, d.Hkv, d.Dqk); /* other keys, one cache */
    ck_assert_int_eq(nsa_decode(d.plan, &a, NULL), NSA_ERR_INVALID_VALUE);
    ck_assert_ptr_nonnull(strstr(nsa_last_error(), "one cache holds one tensor"));
    /* a missing cache, a table of the wrong dtype */
    a = d.args;
    a.v_cache[NSA_BRANCH_SLC].buffer = NULL;
    a.v_cache[NSA_BRANCH_WIN].buffer = NULL;
    ck_assert_int_eq(nsa_decode(d.plan, &a, NULL), NSA_ERR_MISSING_TENSOR);
    ck_assert_ptr_nonnull(strstr(nsa_last_error(), "args->v_cache[slc]"));
    a = d.args;
    a.block_table.buffer = d.kcc;
    a.block_table.offset = 0;
    a.block_table.stride_token = (int64_t)(nsa_buffer_size(d.kcc) / 4);
    ck_assert_int_eq(nsa_decode(d.plan, &a, NULL), NSA_ERR_BUFFER_TOO_SMALL);
    ck_assert_ptr_nonnull(strstr(nsa_last_error(), "args->block_table"));
    ck_assert_int_eq(nsa_buffer_free(ws), NSA_SUCCESS);
    ck_assert_int_eq(nsa_buffer_free(small), NSA_SUCCESS);
    dec_free(&d);
    tk_inputs_free(&in);
}
END_TEST

START_TEST(plan_limits)
{
    tk_case c = small_case();
    const nsa_decode_limits good = {2, 8, 16, 64, 4, 40, 16, 2, 40, 16};
    nsa_plan *p = NULL;
    nsa_status s = nsa_decode_plan_create(g_ctx, &c.cfg, &good, &p);
    if (s == NSA_ERR_UNSUPPORTED) return;
    ck_assert_msg(s == NSA_SUCCESS, "%s", nsa_last_error());
    ck_assert_int_eq(nsa_plan_destroy(p), NSA_SUCCESS);
    /* each capacity out of range, and sizes that overflow 64 bits (refused before allocating) */
    struct {
        int field;
        int64_t value;
        nsa_status want;
        const char *needle;
    } bad[] = {
        {0, 0, NSA_ERR_INVALID_VALUE, "lim->batch"},
        {1, 0, NSA_ERR_INVALID_VALUE, "lim->max_step_tokens"},
        {2, 4, NSA_ERR_INVALID_VALUE, "max_total_tokens = 4 is below"},
        {3, -5, NSA_ERR_INVALID_VALUE, "lim->max_context"},
        {4, 0, NSA_ERR_INVALID_VALUE, "lim->page_size"},
        {5, 0, NSA_ERR_INVALID_VALUE, "lim->num_pages"},
        {5, INT64_C(1) << 32, NSA_ERR_INVALID_VALUE, "lim->num_pages"},
        {7, 0, NSA_ERR_INVALID_VALUE, "lim->cmp_page_size"},
        {8, -1, NSA_ERR_INVALID_VALUE, "lim->num_cmp_pages"},
        {4, INT64_C(1) << 40, NSA_ERR_INVALID_SHAPE, "64 bits"}, /* num_pages 40 x 2^40 x Hkv x D */
        {6, INT64_C(1) << 40, NSA_ERR_INVALID_SHAPE, "64 bits"}, /* with page_size 2^40 below */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nsa_decode_limits lim = good;
        int64_t *f = &lim.batch;
        f[bad[i].field] = bad[i].value;
        if (i == sizeof bad / sizeof bad[0] - 1) lim.page_size = INT64_C(1) << 40;
        if (bad[i].field == 4 && bad[i].value == INT64_C(1) << 40) lim.num_pages = INT64_C(1) << 30;
        s = nsa_decode_plan_create(g_ctx, &c.cfg, &lim, &p);
        ck_assert_msg(s == bad[i].want, "limit %zu: %s (%s)", i, nsa_status_string(s), nsa_last_error());
        ck_assert_msg(strstr(nsa_last_error(), bad[i].needle), "limit %zu: '%s' lacks '%s'", i, nsa_last_error(),
                      bad[i].needle);
        ck_assert_ptr_null(p);
    }
    /* training flag, NULLs */
    nsa_config t = c.cfg;
    t.flags = NSA_CONFIG_TRAINING;
    ck_assert_int_eq(nsa_decode_plan_create(g_ctx, &t, &good, &p), NSA_ERR_INVALID_VALUE);
    ck_assert_int_eq(nsa_decode_plan_create(g_ctx, &c.cfg, NULL, &p), NSA_ERR_NULL_POINTER);
    ck_assert_int_eq(nsa_decode_plan_create(g_ctx, NULL, &good, &p), NSA_ERR_NULL_POINTER);
    ck_assert_int_eq(nsa_decode_plan_create(NULL, &c.cfg, &good, &p), NSA_ERR_NULL_POINTER);
    ck_assert_int_eq(nsa_decode_check(NULL), NSA_ERR_NULL_POINTER);
    /* the growing-struct rule: a smaller struct than the first layout is refused;
     * a larger one is read when its tail is zero, refused when it sets a byte there */
    struct {
        nsa_decode_limits lim;
        int64_t extra;
    } big = {good, 0};
    ck_assert_int_eq(nsa_decode_plan_create_sized(g_ctx, &c.cfg, sizeof(nsa_config), &big.lim, sizeof big, &p),
                     NSA_SUCCESS);
    ck_assert_int_eq(nsa_plan_destroy(p), NSA_SUCCESS);
    big.extra = 1;
    ck_assert_int_eq(nsa_decode_plan_create_sized(g_ctx, &c.cfg, sizeof(nsa_config), &big.lim, sizeof big, &p),
                     NSA_ERR_VERSION_MISMATCH);
    ck_assert_int_eq(nsa_decode_plan_create_sized(g_ctx, &c.cfg, sizeof(nsa_config), &good, sizeof good - 8, &p),
                     NSA_ERR_VERSION_MISMATCH);
    ck_assert_ptr_nonnull(strstr(nsa_last_error(), "lim"));
}
END_TEST

int main(int argc, char **argv)
{
    if (argc > 1) g_backend = argv[1];
    if (argc > 2) g_corpus = argv[2];
    if (nsa_context_create(g_backend, 0, &g_ctx) != NSA_SUCCESS) {
        printf("decode-%s: SKIPPED (no context: %s)\n", g_backend, nsa_last_error());
        return 77;
    }
    /* NSA_TEST_DTYPES without f32: the parity run in those dtypes alone, probed in the first */
    const char *dts = getenv("NSA_TEST_DTYPES");
    const int only_parity = dts && *dts && !in_list(dts, "f32");
    nsa_config cfg;
    nsa_config_init(&cfg);
    cfg.dtype = NSA_DTYPE_F32;
    if (only_parity) {
        const nsa_dtype cand[] = {NSA_DTYPE_F16, NSA_DTYPE_BF16, NSA_DTYPE_F64};
        const size_t first = strcspn(dts, ",");
        int known = 0;
        for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
            const char *nm = nsa_dtype_name(cand[i]);
            if (strlen(nm) == first && strncmp(dts, nm, first) == 0) {
                cfg.dtype = cand[i];
                known = 1;
            }
        }
        if (!known) {
            printf("decode-%s: NSA_TEST_DTYPES=%s: the first entry is not f32, f16, bf16 or f64\n", g_backend, dts);
            nsa_context_destroy(g_ctx);
            return 1;
        }
    }
    const nsa_decode_limits lim = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    nsa_plan *p = NULL;
    nsa_status s = nsa_decode_plan_create(g_ctx, &cfg, &lim, &p);
    if (s == NSA_ERR_UNSUPPORTED) {
        printf("decode-%s: SKIPPED (%s)\n", g_backend, nsa_last_error());
        nsa_context_destroy(g_ctx);
        return 77;
    }
    if (s != NSA_SUCCESS) {
        printf("decode-%s: nsa_decode_plan_create failed: %s\n", g_backend, nsa_last_error());
        return 1;
    }
    nsa_plan_destroy(p);
    Suite *su = suite_create("decode");
    TCase *tc = tcase_create("decode");
    tcase_set_timeout(tc, 0);
    tcase_add_test(tc, decode_f32);
    tcase_add_test(tc, decode_f16);
    tcase_add_test(tc, decode_bf16);
    tcase_add_test(tc, decode_f64);
    if (!only_parity) {
        tcase_add_test(tc, step_checks);
        tcase_add_test(tc, step_checks_capacity);
        tcase_add_test(tc, determinism);
        tcase_add_test(tc, plan_kinds);
        tcase_add_test(tc, plan_limits);
    }
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    char fwd[64] = " (bitwise)";
    if (strcmp(g_backend, "cpu") != 0) snprintf(fwd, sizeof fwd, " (worst o %.3g of the parity tolerance)", g_worst_fwd);
    printf("decode-%s: %ld case runs, %ld steps, %ld rows equal to the forward's%s; %ld cases against the oracle "
           "(worst o %.3g of the tolerance): %s\n",
           g_backend, g_cases, g_steps, g_rows, fwd, g_oracle, g_worst_oracle, failed ? "FAIL" : "PASS");
    nsa_context_destroy(g_ctx);
    return failed ? 1 : 0;
}
