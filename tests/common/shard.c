/*
 * Shards of one sequence (testkit.h, "shards"; docs/nsa-semantics.md section 11):
 * a case computed as P plans of nsa_plan_create_varlen, each over the rows
 * [cut[b][p], cut[b][p+1]) of every sequence b as queries and the rows below
 * cut[b][p+1] as keys, with its outputs put back in the whole problem's rows and
 * its key-side gradients summed. Dense views, every output poisoned (0xFF).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

#define MAX_BUFS 48

/* One plan's problem on the host: rows of the dtype's values as floats (LINEAR
 * weights shared with the whole case's inputs). */
typedef struct problem {
    int64_t B, cu_q[TK_MAX_BATCH + 1], cu_k[TK_MAX_BATCH + 1], nc; /* nc: compressed rows of the keys */
    const float *q, *k[3], *v[3], *gate[3], *kc, *vc, *dO;
    const int32_t *given; /* forward: caller's indices, or NULL */
    const int32_t *sel;   /* backward: the selection */
    const double *lse[3]; /* backward: the forward's LSEs */
} problem;

/* What a run returned, as doubles (exact for every dtype); gradients by tk's ids. */
typedef struct result {
    double *o, *lse[3];
    int32_t *sel;
    tk_grads gr;
} result;

static void result_free(result *r)
{
    free(r->o);
    free(r->sel);
    for (int b = 0; b < 3; b++) free(r->lse[b]);
    tk_grads_free(&r->gr);
    memset(r, 0, sizeof *r);
}

typedef struct runner {
    nsa_context *ctx;
    nsa_buffer *bufs[MAX_BUFS];
    int n;
    nsa_status st;
    char msg[TK_MSG_MAX];
} runner;

static nsa_status fail(runner *r, const char *what, nsa_status s)
{
    if (r->st == NSA_SUCCESS && s != NSA_SUCCESS) {
        r->st = s;
        snprintf(r->msg, sizeof r->msg, "%s: %s: %s", what, nsa_status_string(s), nsa_last_error());
    }
    return s;
}

static nsa_tensor make(runner *r, int64_t n, nsa_dtype dt, int64_t heads, int64_t dim, const void *src,
                       nsa_dtype src_dt)
{
    nsa_tensor t = {0};
    if (r->st != NSA_SUCCESS) return t;
    if (r->n >= MAX_BUFS) {
        fail(r, "test_shard", NSA_ERR_INTERNAL);
        return t;
    }
    const size_t es = nsa_dtype_size(dt), bytes = (size_t)(n > 0 ? n : 1) * es;
    nsa_buffer *b = NULL;
    if (fail(r, "nsa_buffer_alloc", nsa_buffer_alloc(r->ctx, bytes, &b))) return t;
    r->bufs[r->n++] = b;
    if (src && n > 0) {
        void *tmp = malloc(bytes);
        if (!tmp) {
            fail(r, "malloc", NSA_ERR_OUT_OF_MEMORY);
            return t;
        }
        nsa_status s = src_dt == dt ? (memcpy(tmp, src, (size_t)n * es), NSA_SUCCESS) : nsa_convert(src, src_dt, tmp, dt, n);
        if (s == NSA_SUCCESS) s = nsa_buffer_write(b, 0, tmp, (size_t)n * es);
        free(tmp);
        if (fail(r, "uploading an input", s)) return t;
    } else if (fail(r, "nsa_buffer_fill", nsa_buffer_fill(b, 0, 0xFF, bytes))) { /* poisoned output */
        return t;
    }
    return nsa_tensor_dense(b, 0, heads, dim);
}

static double *fetch(runner *r, const nsa_tensor *t, int64_t n, nsa_dtype dt)
{
    if (r->st != NSA_SUCCESS || !t->buffer) return NULL;
    const size_t bytes = (size_t)(n > 0 ? n : 1) * nsa_dtype_size(dt);
    void *raw = malloc(bytes);
    double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
    nsa_status s = raw && d ? NSA_SUCCESS : NSA_ERR_OUT_OF_MEMORY;
    if (s == NSA_SUCCESS && n > 0) s = nsa_buffer_read(t->buffer, 0, raw, (size_t)n * nsa_dtype_size(dt));
    if (s == NSA_SUCCESS && n > 0) s = nsa_convert(raw, dt, d, NSA_DTYPE_F64, n);
    free(raw);
    if (fail(r, "reading an output back", s)) {
        free(d);
        return NULL;
    }
    return d;
}

/* Forward (fwd = 1; fills o, lse, sel) or backward (fwd = 0; fills g) of pr. */
static nsa_status run(nsa_context *ctx, const tk_case *c, const tk_inputs *in, const problem *pr, int fwd,
                      result *out, char *msg, size_t msg_size)
{
    runner R = {.ctx = ctx};
    runner *r = &R;
    const nsa_config *g = &c->cfg;
    const nsa_dtype dt = g->dtype, fdt = tk_float_dtype(dt), F = NSA_DTYPE_F32;
    const int64_t B = pr->B, T = pr->cu_q[B], TK = pr->cu_k[B], Nc = pr->nc, Hq = g->num_q_heads,
                  Hkv = g->num_kv_heads, Dk = g->head_dim_qk, Dv = g->head_dim_v, l = g->cmp_block,
                  n = g->num_selected;
    const int on[3] = {1, n > 0, g->window > 0};
    const int lin = g->compress == NSA_COMPRESS_LINEAR, ext = g->compress == NSA_COMPRESS_EXTERNAL;
    const int shared = tk_inputs_shared_kv(c, in);
    nsa_config cfg = c->cfg;
    if (!fwd) cfg.flags |= NSA_CONFIG_TRAINING;
    nsa_plan *plan = NULL;
    fail(r, "nsa_plan_create_varlen", nsa_plan_create_varlen(ctx, &cfg, pr->cu_q, pr->cu_k, B, &plan));
    nsa_plan_info pi;
    if (r->st == NSA_SUCCESS && !fail(r, "nsa_plan_get_info", nsa_plan_get_info(plan, &pi)) &&
        (pi.total_tokens != T || pi.total_keys != TK || pi.total_cmp_blocks != Nc)) {
        r->st = NSA_ERR_INTERNAL;
        snprintf(r->msg, sizeof r->msg, "nsa_plan_get_info: total_tokens %lld, total_keys %lld, total_cmp_blocks %lld; "
                 "expected %lld, %lld, %lld", (long long)pi.total_tokens, (long long)pi.total_keys,
                 (long long)pi.total_cmp_blocks, (long long)T, (long long)TK, (long long)Nc);
    }
    nsa_tensor q = make(r, T * Hq * Dk, dt, Hq, Dk, pr->q, F), k[3] = {{0}}, v[3] = {{0}}, gate[3] = {{0}};
    int first = -1;
    for (int b = 0; b < 3; b++) {
        if (!on[b]) continue;
        gate[b] = make(r, T * Hq, fdt, Hq, 1, pr->gate[b], F);
        if (b == NSA_BRANCH_CMP && ext) continue;
        if (shared && first >= 0) {
            k[b] = k[first];
            v[b] = v[first];
            continue;
        }
        k[b] = make(r, TK * Hkv * Dk, dt, Hkv, Dk, pr->k[b], F);
        v[b] = make(r, TK * Hkv * Dv, dt, Hkv, Dv, pr->v[b], F);
        if (first < 0) first = b;
    }
    nsa_tensor wk = {0}, wv = {0}, pek = {0}, pev = {0}, kc = {0}, vc = {0};
    if (lin) {
        wk = make(r, Hkv * l * Dk * Dk, dt, 1, 1, in->w_k, F);
        wv = make(r, Hkv * l * Dv * Dv, dt, 1, 1, in->w_v, F);
        if (c->use_pe) {
            pek = make(r, Hkv * l * Dk, dt, 1, 1, in->pe_k, F);
            pev = make(r, Hkv * l * Dv, dt, 1, 1, in->pe_v, F);
        }
    }
    if (ext && Nc > 0) {
        kc = make(r, Nc * Hkv * Dk, dt, Hkv, Dk, pr->kc, F);
        vc = make(r, Nc * Hkv * Dv, dt, Hkv, Dv, pr->vc, F);
    }
    if (fwd) {
        nsa_forward_args a;
        memset(&a, 0, sizeof a);
        a.q = q;
        for (int b = 0; b < 3; b++) {
            a.k[b] = k[b];
            a.v[b] = v[b];
            a.gate[b] = gate[b];
            if (on[b]) a.lse[b] = make(r, T * Hq, fdt, Hq, 1, NULL, F);
        }
        a.w_k = wk, a.w_v = wv, a.pe_k = pek, a.pe_v = pev, a.kc = kc, a.vc = vc;
        if (n > 0 && pr->given)
            a.block_indices = make(r, T * Hkv * n, NSA_DTYPE_I32, Hkv, n, pr->given, NSA_DTYPE_I32);
        else if (n > 0)
            a.selected = make(r, T * Hkv * n, NSA_DTYPE_I32, Hkv, n, NULL, NSA_DTYPE_I32);
        a.o = make(r, T * Hq * Dv, dt, Hq, Dv, NULL, F);
        if (r->st == NSA_SUCCESS && !fail(r, "nsa_forward", nsa_forward(plan, &a, NULL)))
            fail(r, "nsa_context_synchronize", nsa_context_synchronize(ctx));
        out->o = fetch(r, &a.o, T * Hq * Dv, dt);
        for (int b = 0; b < 3; b++)
            if (on[b]) out->lse[b] = fetch(r, &a.lse[b], T * Hq, fdt);
        if (n > 0 && r->st == NSA_SUCCESS) {
            out->sel = malloc((size_t)(T > 0 ? T : 1) * (size_t)(Hkv * n) * sizeof(int32_t));
            if (!out->sel) fail(r, "malloc", NSA_ERR_OUT_OF_MEMORY);
            else if (pr->given) memcpy(out->sel, pr->given, (size_t)(T * Hkv * n) * sizeof(int32_t));
            else if (T > 0) fail(r, "reading the selection back", nsa_buffer_read(a.selected.buffer, 0, out->sel,
                                                                                  (size_t)(T * Hkv * n) * 4));
        }
    } else {
        nsa_backward_args a;
        memset(&a, 0, sizeof a);
        a.flags = NSA_BACKWARD_FLOAT_KEY_GRADS;
        a.q = q;
        a.dout = make(r, T * Hq * Dv, dt, Hq, Dv, pr->dO, F);
        for (int b = 0; b < 3; b++) {
            a.k[b] = k[b];
            a.v[b] = v[b];
            a.gate[b] = gate[b];
            if (!on[b]) continue;
            a.lse[b] = make(r, T * Hq, fdt, Hq, 1, pr->lse[b], NSA_DTYPE_F64);
            a.dgate[b] = make(r, T * Hq, fdt, Hq, 1, NULL, F);
            if (!k[b].buffer) continue;
            if (shared && b != first) {
                a.dk[b] = a.dk[first];
                a.dv[b] = a.dv[first];
            } else {
                a.dk[b] = make(r, TK * Hkv * Dk, fdt, Hkv, Dk, NULL, F);
                a.dv[b] = make(r, TK * Hkv * Dv, fdt, Hkv, Dv, NULL, F);
            }
        }
        a.w_k = wk, a.w_v = wv, a.pe_k = pek, a.pe_v = pev, a.kc = kc, a.vc = vc;
        if (n > 0) a.block_indices = make(r, T * Hkv * n, NSA_DTYPE_I32, Hkv, n, pr->sel, NSA_DTYPE_I32);
        a.dq = make(r, T * Hq * Dk, dt, Hq, Dk, NULL, F);
        if (lin) {
            a.dw_k = make(r, Hkv * l * Dk * Dk, fdt, 1, 1, NULL, F);
            a.dw_v = make(r, Hkv * l * Dv * Dv, fdt, 1, 1, NULL, F);
            if (c->use_pe) {
                a.dpe_k = make(r, Hkv * l * Dk, fdt, 1, 1, NULL, F);
                a.dpe_v = make(r, Hkv * l * Dv, fdt, 1, 1, NULL, F);
            }
        }
        if (ext && Nc > 0) {
            a.dkc = make(r, Nc * Hkv * Dk, fdt, Hkv, Dk, NULL, F);
            a.dvc = make(r, Nc * Hkv * Dv, fdt, Hkv, Dv, NULL, F);
        }
        if (r->st == NSA_SUCCESS && !fail(r, "nsa_backward", nsa_backward(plan, &a, NULL)))
            fail(r, "nsa_context_synchronize", nsa_context_synchronize(ctx));
        if (r->st == NSA_SUCCESS)
            fail(r, "reading the gradients back", tk_grads_read(c, &a, T, TK, Nc, fdt, &out->gr));
    }
    for (int i = 0; i < r->n; i++) nsa_buffer_free(r->bufs[i]);
    nsa_plan_destroy(plan);
    if (msg && msg_size) snprintf(msg, msg_size, "%s", r->msg);
    return r->st;
}

/* rows [r0, r1) of an [.., w] array, appended at dst + *at */
static void take(float *dst, int64_t *at, const float *src, int64_t r0, int64_t r1, int64_t w)
{
    if (!src || r1 <= r0) return;
    memcpy(dst + *at * w, src + r0 * w, (size_t)((r1 - r0) * w) * sizeof(float));
    *at += r1 - r0;
}


void tk_shard_cuts(const tk_case *c, int P, uint64_t *rng, int64_t (*cut)[TK_MAX_SHARDS + 1])
{
    for (int64_t b = 0; b < c->batch; b++) {
        const int64_t len = c->cu_seqlens[b + 1] - c->cu_seqlens[b];
        cut[b][0] = 0;
        cut[b][P] = len;
        for (int p = 1; p < P; p++)
            cut[b][p] = !rng ? len * p / P : len ? (int64_t)(tk_splitmix64(rng) % (uint64_t)(len + 1)) : 0;
        for (int i = 1; i < P; i++) /* sort the inner cuts */
            for (int j = i; j > 1 && cut[b][j - 1] > cut[b][j]; j--) {
                int64_t x = cut[b][j];
                cut[b][j] = cut[b][j - 1];
                cut[b][j - 1] = x;
            }
    }
}

/* a malloc'ed array of n (at least 1) elements of size es, or NULL */
static void *alloc_n(int64_t n, size_t es) { return malloc((size_t)(n > 0 ? n : 1) * es); }

nsa_status tk_run_shards(nsa_context *ctx, const tk_case *c, const tk_inputs *in, int P,
                         const int64_t (*cut)[TK_MAX_SHARDS + 1], const float *dO, double *const lse[3],
                         const int32_t *sel, tk_output *fwd, tk_grads *grads, char *msg, size_t msg_size)
{
    if (msg && msg_size) msg[0] = '\0';
    const int backward = dO != NULL;
    if (backward ? !grads : !fwd) return NSA_ERR_NULL_POINTER;
    if (fwd) memset(fwd, 0, sizeof *fwd);
    if (grads) memset(grads, 0, sizeof *grads);
    if (P < 1 || P > TK_MAX_SHARDS || (backward && (!lse || (c->cfg.num_selected > 0 && !sel)))) return NSA_ERR_INVALID_VALUE;
    const nsa_config *g = &c->cfg;
    const int64_t B = c->batch, T = tk_case_tokens(c), Hq = g->num_q_heads, Hkv = g->num_kv_heads,
                  Dk = g->head_dim_qk, Dv = g->head_dim_v, n = g->num_selected;
    const int on[3] = {1, n > 0, g->window > 0};
    const int64_t wq = Hq * Dk, wk = Hkv * Dk, wv = Hkv * Dv, wo = Hq * Dv, wsel = Hkv * n;
    int64_t cc[TK_MAX_BATCH + 1] = {0}; /* the whole problem's compressed-row offsets */
    for (int64_t b = 0; b < B; b++) cc[b + 1] = cc[b] + tk_num_cmp_blocks(g, c->cu_seqlens[b + 1] - c->cu_seqlens[b]);
    const int32_t *given = c->fixed_indices && n > 0 ? in->given : NULL;
    nsa_status st = NSA_SUCCESS;

    /* shard inputs, gathered (at most the whole problem's rows) */
    float *sq = alloc_n(T * wq, 4), *sdo = alloc_n(T * wo, 4), *sk[3] = {0}, *sv[3] = {0}, *sg[3] = {0};
    float *skc = alloc_n(in->total_cmp * wk, 4), *svc = alloc_n(in->total_cmp * wv, 4);
    int32_t *sgiven = alloc_n(T * wsel, 4), *ssel = alloc_n(T * wsel, 4);
    double *slse[3] = {0};
    int ok = sq && sdo && skc && svc && sgiven && ssel;
    for (int b = 0; b < 3; b++) {
        sk[b] = alloc_n(T * wk, 4), sv[b] = alloc_n(T * wv, 4), sg[b] = alloc_n(T * Hq, 4);
        slse[b] = alloc_n(T * Hq, sizeof(double));
        ok &= sk[b] && sv[b] && sg[b] && slse[b];
    }
    if (!ok) st = NSA_ERR_OUT_OF_MEMORY;
    if (!backward && ok) { /* the whole problem's forward outputs */
        fwd->tokens = T;
        ok = (fwd->o = alloc_n(T * wo, 4)) && (fwd->o_d = alloc_n(T * wo, sizeof(double)));
        for (int b = 0; b < 3 && ok; b++)
            if (on[b]) ok = (fwd->lse[b] = alloc_n(T * Hq, 4)) && (fwd->lse_d[b] = alloc_n(T * Hq, sizeof(double)));
        if (ok && n > 0 && !given) ok = (fwd->sel = alloc_n(T * wsel, 4)) != NULL;
        if (!ok) st = NSA_ERR_OUT_OF_MEMORY;
    }
    if (backward) grads->shared = tk_inputs_shared_kv(c, in);

    for (int p = 0; p < P && st == NSA_SUCCESS; p++) {
        problem S = {.B = B, .q = sq, .kc = skc, .vc = svc, .dO = sdo, .given = given ? sgiven : NULL, .sel = ssel};
        int64_t aq = 0, ac = 0, ado = 0, ag = 0, a3[3] = {0}, av[3] = {0}, ags[3] = {0}, al = 0;
        for (int64_t b = 0; b < B; b++) {
            const int64_t s0 = c->cu_seqlens[b], r0 = s0 + cut[b][p], r1 = s0 + cut[b][p + 1];
            const int64_t nck = tk_num_cmp_blocks(g, cut[b][p + 1]);
            S.cu_q[b + 1] = S.cu_q[b] + (r1 - r0);
            S.cu_k[b + 1] = S.cu_k[b] + (r1 - s0);
            take(sq, &aq, in->q, r0, r1, wq);
            if (backward) take(sdo, &ado, dO, r0, r1, wo);
            for (int br = 0; br < 3; br++) {
                take(sk[br], &a3[br], in->k[br], s0, r1, wk);
                take(sv[br], &av[br], in->v[br], s0, r1, wv);
                take(sg[br], &ags[br], in->gate[br], r0, r1, Hq);
                if (backward && lse[br] && r1 > r0)
                    memcpy(slse[br] + al * Hq, lse[br] + r0 * Hq, (size_t)((r1 - r0) * Hq) * sizeof(double));
            }
            if (in->kc) {
                int64_t ac2 = ac;
                take(skc, &ac, in->kc, cc[b], cc[b] + nck, wk);
                take(svc, &ac2, in->vc, cc[b], cc[b] + nck, wv);
            } else {
                ac += nck;
            }
            if (n > 0 && r1 > r0) {
                if (given) memcpy(sgiven + ag * wsel, given + r0 * wsel, (size_t)((r1 - r0) * wsel) * 4);
                if (backward) memcpy(ssel + ag * wsel, sel + r0 * wsel, (size_t)((r1 - r0) * wsel) * 4);
                ag += r1 - r0;
            }
            al += r1 - r0;
        }
        S.nc = ac;
        for (int br = 0; br < 3; br++) { /* the inputs' sharing of k / v between branches, kept */
            S.k[br] = in->k[br] ? (br && in->k[br] == in->k[0] ? S.k[0] : sk[br]) : NULL;
            S.v[br] = in->v[br] ? (br && in->v[br] == in->v[0] ? S.v[0] : sv[br]) : NULL;
            S.gate[br] = in->gate[br] ? sg[br] : NULL;
            S.lse[br] = backward && lse[br] ? slse[br] : NULL;
        }
        result R = {0};
        char m[TK_MSG_MAX];
        st = run(ctx, c, in, &S, !backward, &R, m, sizeof m);
        if (st != NSA_SUCCESS) {
            if (msg && msg_size) snprintf(msg, msg_size, "shard %d of %d: %s", p, P, m);
            result_free(&R);
            break;
        }
        /* the shard's rows into the whole problem's, its key-side parts added */
        int64_t row = 0, kr = 0, cr = 0;
        for (int64_t b = 0; b < B; b++) {
            const int64_t s0 = c->cu_seqlens[b], r0 = s0 + cut[b][p], r1 = s0 + cut[b][p + 1];
            const int64_t nck = tk_num_cmp_blocks(g, cut[b][p + 1]), nr = r1 - r0;
            if (!backward) {
                for (int64_t e = 0; e < nr * wo; e++) {
                    fwd->o_d[r0 * wo + e] = R.o[row * wo + e];
                    fwd->o[r0 * wo + e] = (float)R.o[row * wo + e];
                }
                for (int br = 0; br < 3; br++)
                    for (int64_t e = 0; on[br] && e < nr * Hq; e++) {
                        fwd->lse_d[br][r0 * Hq + e] = R.lse[br][row * Hq + e];
                        fwd->lse[br][r0 * Hq + e] = (float)R.lse[br][row * Hq + e];
                    }
                if (fwd->sel && nr) memcpy(fwd->sel + r0 * wsel, R.sel + row * wsel, (size_t)(nr * wsel) * 4);
            } else {
                for (int i = 0; i < TK_G_COUNT; i++) {
                    if (!R.gr.t[i]) continue;
                    const int query = i == TK_G_Q || (i >= TK_G_GATE && i < TK_G_WK);
                    const int key = i >= TK_G_K && i < TK_G_GATE, comp = i == TK_G_KC || i == TK_G_VC;
                    const int64_t w = i == TK_G_Q ? wq : query ? Hq : key ? (i < TK_G_V ? wk : wv)
                                      : comp ? (i == TK_G_KC ? wk : wv) : 0;
                    if (!grads->t[i]) { /* first sight: the whole problem's tensor, zeroed */
                        grads->n[i] = query || key ? T * w : comp ? in->total_cmp * w : R.gr.n[i];
                        if (!(grads->t[i] = calloc((size_t)(grads->n[i] + 1), sizeof(double)))) {
                            st = NSA_ERR_OUT_OF_MEMORY;
                            break;
                        }
                    }
                    double *dst = grads->t[i];
                    const double *src = R.gr.t[i];
                    if (query) /* complete rows */
                        memcpy(dst + r0 * w, src + row * w, (size_t)(nr * w) * sizeof(double));
                    else if (key) /* the parts of the key rows below r1 */
                        for (int64_t e = 0; e < (r1 - s0) * w; e++) dst[s0 * w + e] += src[kr * w + e];
                    else if (comp)
                        for (int64_t e = 0; e < nck * w; e++) dst[cc[b] * w + e] += src[cr * w + e];
                    else if (b == 0) /* weights: once per shard */
                        for (int64_t e = 0; e < R.gr.n[i]; e++) dst[e] += src[e];
                }
            }
            row += nr;
            kr += r1 - s0;
            cr += nck;
        }
        result_free(&R);
    }
    for (int b = 0; b < 3; b++) free(sk[b]), free(sv[b]), free(sg[b]), free(slse[b]);
    free(sq), free(sdo), free(skc), free(svc), free(sgiven), free(ssel);
    if (st != NSA_SUCCESS) {
        if (msg && msg_size && !msg[0]) snprintf(msg, msg_size, "tk_run_shards: %s", nsa_status_string(st));
        if (fwd) tk_output_free(fwd);
        if (grads) tk_grads_free(grads);
    }
    return st;
}
