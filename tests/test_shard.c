/*
 * Shards of one sequence (docs/nsa-semantics.md section 11) through the public
 * API: plans of nsa_plan_create_varlen whose queries are the last rows of their
 * keys.
 *
 *   test_shard BACKEND DTYPES CORPUS
 *
 * For every case of the corpus (cases up to 640 tokens of the full corpus) and
 * dtype, the whole batch runs forward and backward once; then for P = 2, 4, 8
 * every sequence is cut at P - 1 random places (empty shards allowed) and shard
 * p runs as one varlen plan over the batch: sequence b's queries are its rows
 * [a_b, e_b) and its keys its rows [0, e_b). Checked against the whole run:
 *   - o, the LSEs and the selection of every shard row are bitwise the whole
 *     forward's rows (each row of the function depends only on the keys below it);
 *   - the backward (the whole forward's selection and LSEs, the shard's rows of
 *     dO) gives dq and dgate rows bitwise the whole backward's;
 *   - the key-side gradients (dk, dv, dkc, dvc, dW, dpe), returned unrounded
 *     with NSA_BACKWARD_FLOAT_KEY_GRADS and summed over the shards in position
 *     order in fp64, equal the whole backward's (also NSA_BACKWARD_FLOAT_KEY_GRADS)
 *     within the backward's tolerance (tk_grad_tolerance; f64: 1e-10).
 * Every output is poisoned (0xFF) first. A backend that does not run shard
 * plans must refuse them with NSA_ERR_UNSUPPORTED: then the test checks that
 * and skips (77). Also checked: the argument rules of nsa_plan_create_varlen.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nsa.h"
#include "testkit.h"

#define SKIP 77
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

/* What a run returned, as doubles (exact for every dtype), by tk's gradient ids. */
typedef struct result {
    double *o, *lse[3];
    int32_t *sel;
    double *g[TK_G_COUNT];
    int64_t n[TK_G_COUNT];
} result;

static void result_free(result *r)
{
    free(r->o);
    free(r->sel);
    for (int b = 0; b < 3; b++) free(r->lse[b]);
    for (int i = 0; i < TK_G_COUNT; i++) free(r->g[i]);
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
    cfg.flags |= NSA_CONFIG_TRAINING;
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
        const struct {
            int id;
            const nsa_tensor *t;
            int64_t n;
            nsa_dtype dt;
        } want[] = {
            {TK_G_Q, &a.dq, T * Hq * Dk, dt},
            {TK_G_K + 0, &a.dk[0], TK * Hkv * Dk, fdt},
            {TK_G_K + 1, &a.dk[1], TK * Hkv * Dk, fdt},
            {TK_G_K + 2, &a.dk[2], TK * Hkv * Dk, fdt},
            {TK_G_V + 0, &a.dv[0], TK * Hkv * Dv, fdt},
            {TK_G_V + 1, &a.dv[1], TK * Hkv * Dv, fdt},
            {TK_G_V + 2, &a.dv[2], TK * Hkv * Dv, fdt},
            {TK_G_GATE + 0, &a.dgate[0], T * Hq, fdt},
            {TK_G_GATE + 1, &a.dgate[1], T * Hq, fdt},
            {TK_G_GATE + 2, &a.dgate[2], T * Hq, fdt},
            {TK_G_WK, &a.dw_k, Hkv * l * Dk * Dk, fdt},
            {TK_G_WV, &a.dw_v, Hkv * l * Dv * Dv, fdt},
            {TK_G_PEK, &a.dpe_k, Hkv * l * Dk, fdt},
            {TK_G_PEV, &a.dpe_v, Hkv * l * Dv, fdt},
            {TK_G_KC, &a.dkc, Nc * Hkv * Dk, fdt},
            {TK_G_VC, &a.dvc, Nc * Hkv * Dv, fdt},
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            if (!want[i].t->buffer) continue;
            int dup = 0; /* a shared gradient once, under its first branch */
            for (size_t j = 0; j < i; j++) dup |= want[j].t->buffer == want[i].t->buffer;
            if (dup) continue;
            out->g[want[i].id] = fetch(r, want[i].t, want[i].n, want[i].dt);
            out->n[want[i].id] = want[i].n;
        }
    }
    for (int i = 0; i < r->n; i++) nsa_buffer_free(r->bufs[i]);
    nsa_plan_destroy(plan);
    if (msg && msg_size) snprintf(msg, msg_size, "%s", r->msg);
    return r->st;
}

/* ---- the shards of a case */

static uint64_t g_rng = 0x5eed5a4d;

/* P shards: cut[b][0] = 0 <= cut[b][1] <= ... <= cut[b][P] = len_b */
static void random_cuts(const tk_case *c, int P, int64_t cut[TK_MAX_BATCH][9])
{
    for (int64_t b = 0; b < c->batch; b++) {
        const int64_t len = c->cu_seqlens[b + 1] - c->cu_seqlens[b];
        cut[b][0] = 0;
        cut[b][P] = len;
        for (int p = 1; p < P; p++) cut[b][p] = len ? (int64_t)(tk_splitmix64(&g_rng) % (uint64_t)(len + 1)) : 0;
        for (int i = 1; i < P; i++) /* sort the inner cuts */
            for (int j = i; j > 1 && cut[b][j - 1] > cut[b][j]; j--) {
                int64_t x = cut[b][j];
                cut[b][j] = cut[b][j - 1];
                cut[b][j - 1] = x;
            }
    }
}

/* rows [r0, r1) of an [.., w] array, appended at dst + *at */
static void take(float *dst, int64_t *at, const float *src, int64_t r0, int64_t r1, int64_t w)
{
    if (!src || r1 <= r0) return;
    memcpy(dst + *at * w, src + r0 * w, (size_t)((r1 - r0) * w) * sizeof(float));
    *at += r1 - r0;
}

typedef struct counts {
    long cases, shards, rows, fails;
    double worst; /* worst key-gradient error / tolerance */
} counts;

static int rows_equal(const double *a, const double *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (isnan(a[i]) || isnan(b[i]) || a[i] != b[i]) return 0;
    return 1;
}

/* One case, one dtype: the whole run, then P = 2, 4, 8 shards. */
static int check_case(nsa_context *ctx, const tk_case *c, counts *ct)
{
    char desc[256], msg[TK_MSG_MAX];
    tk_case_describe(c, desc, sizeof desc);
    const nsa_config *g = &c->cfg;
    const nsa_dtype dt = g->dtype;
    const int64_t B = c->batch, T = tk_case_tokens(c), Hq = g->num_q_heads, Hkv = g->num_kv_heads,
                  Dk = g->head_dim_qk, Dv = g->head_dim_v, n = g->num_selected, l = g->cmp_block;
    const int on[3] = {1, n > 0, g->window > 0};
    tk_inputs in;
    float *dO = NULL;
    if (tk_inputs_make(c, &in) != NSA_SUCCESS || tk_dout_make(c, c->seed, 7, &dO) != NSA_SUCCESS) {
        printf("FAIL %s: inputs\n", desc);
        tk_inputs_free(&in);
        return 0;
    }
    problem W = {.B = B, .nc = in.total_cmp, .q = in.q, .kc = in.kc, .vc = in.vc, .dO = dO};
    memcpy(W.cu_q, c->cu_seqlens, sizeof W.cu_q);
    memcpy(W.cu_k, c->cu_seqlens, sizeof W.cu_k);
    for (int b = 0; b < 3; b++) W.k[b] = in.k[b], W.v[b] = in.v[b], W.gate[b] = in.gate[b];
    W.given = c->fixed_indices && n > 0 ? in.given : NULL;
    result wf = {0}, wb = {0};
    int ok = 1;
    if (run(ctx, c, &in, &W, 1, &wf, msg, sizeof msg) != NSA_SUCCESS) {
        printf("FAIL %s: whole forward: %s\n", desc, msg);
        ok = 0;
    }
    for (int b = 0; b < 3 && ok; b++) W.lse[b] = wf.lse[b];
    W.sel = wf.sel;
    if (ok && run(ctx, c, &in, &W, 0, &wb, msg, sizeof msg) != NSA_SUCCESS) {
        printf("FAIL %s: whole backward: %s\n", desc, msg);
        ok = 0;
    }
    double rms_do = 0;
    for (int64_t e = 0; e < T * Hq * Dv; e++) rms_do += (double)dO[e] * dO[e];
    rms_do = T ? sqrt(rms_do / (double)(T * Hq * Dv)) : 0;
    /* the whole sequence's compressed-row offsets */
    int64_t cc[TK_MAX_BATCH + 1] = {0};
    for (int64_t b = 0; b < B; b++) cc[b + 1] = cc[b] + tk_num_cmp_blocks(g, c->cu_seqlens[b + 1] - c->cu_seqlens[b]);

    const int64_t wq = Hq * Dk, wk = Hkv * Dk, wv = Hkv * Dv, wo = Hq * Dv, wsel = Hkv * n;
    float *sq = malloc((size_t)(T + 1) * (size_t)wq * 4), *sdo = malloc((size_t)(T + 1) * (size_t)wo * 4);
    float *sk[3], *sv[3], *sg[3];
    float *skc = malloc((size_t)(in.total_cmp + 1) * (size_t)wk * 4), *svc = malloc((size_t)(in.total_cmp + 1) * (size_t)wv * 4);
    int32_t *sgiven = malloc((size_t)(T + 1) * (size_t)(wsel + 1) * 4), *ssel = malloc((size_t)(T + 1) * (size_t)(wsel + 1) * 4);
    double *slse[3];
    double *sum[TK_G_COUNT] = {0};
    for (int b = 0; b < 3; b++) {
        sk[b] = malloc((size_t)(T + 1) * (size_t)wk * 4);
        sv[b] = malloc((size_t)(T + 1) * (size_t)wv * 4);
        sg[b] = malloc((size_t)(T + 1) * (size_t)Hq * 4);
        slse[b] = malloc((size_t)(T + 1) * (size_t)Hq * sizeof(double));
    }
    for (int i = 0; i < TK_G_COUNT; i++) sum[i] = calloc((size_t)(wb.n[i] + 1), sizeof(double));

    static const int Ps[3] = {2, 4, 8};
    for (int pi = 0; pi < 3 && ok; pi++) {
        const int P = Ps[pi];
        int64_t cut[TK_MAX_BATCH][9];
        random_cuts(c, P, cut);
        for (int i = 0; i < TK_G_COUNT; i++)
            if (wb.n[i]) memset(sum[i], 0, (size_t)wb.n[i] * sizeof(double));
        for (int p = 0; p < P && ok; p++) {
            /* shard p: sequence b's rows [cut[b][p], cut[b][p+1]) as queries, [0, cut[b][p+1]) as keys */
            problem S = {.B = B, .q = sq, .kc = skc, .vc = svc, .dO = sdo, .given = W.given ? sgiven : NULL};
            int64_t aq = 0, ac = 0, ado = 0, ag = 0, a3[3] = {0}, av[3] = {0}, ags[3] = {0}, al[3] = {0};
            for (int64_t b = 0; b < B; b++) {
                const int64_t s0 = c->cu_seqlens[b], r0 = s0 + cut[b][p], r1 = s0 + cut[b][p + 1];
                const int64_t nck = tk_num_cmp_blocks(g, cut[b][p + 1]);
                S.cu_q[b + 1] = S.cu_q[b] + (r1 - r0);
                S.cu_k[b + 1] = S.cu_k[b] + (r1 - s0);
                take(sq, &aq, in.q, r0, r1, wq);
                take(sdo, &ado, dO, r0, r1, wo);
                for (int br = 0; br < 3; br++) {
                    take(sk[br], &a3[br], in.k[br], s0, r1, wk);
                    take(sv[br], &av[br], in.v[br], s0, r1, wv);
                    take(sg[br], &ags[br], in.gate[br], r0, r1, Hq);
                    if (wf.lse[br] && r1 > r0) {
                        memcpy(slse[br] + al[br] * Hq, wf.lse[br] + r0 * Hq, (size_t)((r1 - r0) * Hq) * sizeof(double));
                        al[br] += r1 - r0;
                    }
                }
                if (in.kc) {
                    int64_t ac2 = ac;
                    take(skc, &ac, in.kc, cc[b], cc[b] + nck, wk);
                    take(svc, &ac2, in.vc, cc[b], cc[b] + nck, wv);
                } else {
                    ac += nck;
                }
                if (n > 0 && r1 > r0) {
                    if (W.given) memcpy(sgiven + ag * wsel, in.given + r0 * wsel, (size_t)((r1 - r0) * wsel) * 4);
                    memcpy(ssel + ag * wsel, wf.sel + r0 * wsel, (size_t)((r1 - r0) * wsel) * 4);
                    ag += r1 - r0;
                }
            }
            S.nc = ac;
            for (int br = 0; br < 3; br++) {
                /* the inputs' sharing of k / v between branches, kept */
                S.k[br] = in.k[br] ? (in.k[br] == in.k[0] && br ? S.k[0] : sk[br]) : NULL;
                S.v[br] = in.v[br] ? (in.v[br] == in.v[0] && br ? S.v[0] : sv[br]) : NULL;
                S.gate[br] = in.gate[br] ? sg[br] : NULL;
                S.lse[br] = wf.lse[br] ? slse[br] : NULL;
            }
            S.sel = ssel;
            result sf = {0}, sb = {0};
            ct->shards++;
            if (run(ctx, c, &in, &S, 1, &sf, msg, sizeof msg) != NSA_SUCCESS ||
                run(ctx, c, &in, &S, 0, &sb, msg, sizeof msg) != NSA_SUCCESS) {
                printf("FAIL %s P=%d shard %d: %s\n", desc, P, p, msg);
                ok = 0;
            }
            /* the shard's rows against the whole run's */
            int64_t row = 0;
            for (int64_t b = 0; b < B && ok; b++) {
                const int64_t r0 = c->cu_seqlens[b] + cut[b][p], r1 = c->cu_seqlens[b] + cut[b][p + 1];
                for (int64_t t = r0; t < r1 && ok; t++, row++) {
                    const char *bad = NULL;
                    if (!rows_equal(sf.o + row * wo, wf.o + t * wo, wo)) bad = "o";
                    for (int br = 0; br < 3 && !bad; br++)
                        if (on[br] && !rows_equal(sf.lse[br] + row * Hq, wf.lse[br] + t * Hq, Hq)) bad = "lse";
                    if (!bad && n > 0 && memcmp(sf.sel + row * wsel, wf.sel + t * wsel, (size_t)wsel * 4)) bad = "selection";
                    if (!bad && !rows_equal(sb.g[TK_G_Q] + row * wq, wb.g[TK_G_Q] + t * wq, wq)) bad = "dq";
                    for (int br = 0; br < 3 && !bad; br++)
                        if (on[br] && !rows_equal(sb.g[TK_G_GATE + br] + row * Hq, wb.g[TK_G_GATE + br] + t * Hq, Hq))
                            bad = "dgate";
                    if (bad) {
                        printf("FAIL %s P=%d shard %d: %s of row %lld (sequence %lld, position %lld) differs from "
                               "the whole run's\n",
                               desc, P, p, bad, (long long)t, (long long)b, (long long)(t - c->cu_seqlens[b]));
                        ok = 0;
                    }
                    ct->rows++;
                }
            }
            /* key-side parts, summed in position order */
            int64_t kr = 0, cr = 0;
            for (int64_t b = 0; b < B && ok; b++) {
                const int64_t s0 = c->cu_seqlens[b], r1 = s0 + cut[b][p + 1], nck = tk_num_cmp_blocks(g, cut[b][p + 1]);
                for (int i = TK_G_K; i < TK_G_GATE; i++) {
                    if (!sb.g[i]) continue;
                    const int64_t w = i < TK_G_V ? wk : wv;
                    for (int64_t e = 0; e < (r1 - s0) * w; e++) sum[i][s0 * w + e] += sb.g[i][kr * w + e];
                }
                for (int i = TK_G_KC; i <= TK_G_VC; i++) {
                    if (!sb.g[i]) continue;
                    const int64_t w = i == TK_G_KC ? wk : wv;
                    for (int64_t e = 0; e < nck * w; e++) sum[i][cc[b] * w + e] += sb.g[i][cr * w + e];
                }
                kr += r1 - s0;
                cr += nck;
            }
            for (int i = TK_G_WK; i <= TK_G_PEV && ok; i++)
                for (int64_t e = 0; sb.g[i] && e < sb.n[i]; e++) sum[i][e] += sb.g[i][e];
            result_free(&sf);
            result_free(&sb);
        }
        /* the sums against the whole backward's */
        double rms_tol, rel_tol;
        tk_grad_tolerance(dt, &rms_tol, &rel_tol);
        for (int i = TK_G_K; i < TK_G_COUNT && ok; i++) {
            if (i >= TK_G_GATE && i < TK_G_WK) continue;
            if (!wb.g[i]) continue;
            double ss = 0;
            for (int64_t e = 0; e < wb.n[i]; e++) ss += wb.g[i][e] * wb.g[i][e];
            /* the scale of tk_compare_grads: the tensor's rms, at least 0.1 rms(dO) (dpe: times
             * sqrt(compressed rows), as it sums dkc over them and their sum nearly cancels) */
            double scale = wb.n[i] ? sqrt(ss / (double)wb.n[i]) : 0, floor = 0.1 * rms_do;
            if (i == TK_G_PEK || i == TK_G_PEV) floor *= sqrt((double)in.total_cmp);
            if (scale < floor) scale = floor;
            for (int64_t e = 0; e < wb.n[i]; e++) {
                const double ref = wb.g[i][e], err = fabs(sum[i][e] - ref);
                const double tol = rms_tol * scale + rel_tol * fabs(ref);
                if (!(err <= tol)) {
                    printf("FAIL %s P=%d: the shards' %s[%lld] sum to %.17g, the whole backward gives %.17g "
                           "(tolerance %.3g)\n",
                           desc, P, tk_ref64_name(i), (long long)e, sum[i][e], ref, tol);
                    ok = 0;
                    break;
                }
                if (tol > 0 && err / tol > ct->worst) ct->worst = err / tol;
            }
        }
    }
    (void)l;
    for (int b = 0; b < 3; b++) free(sk[b]), free(sv[b]), free(sg[b]), free(slse[b]);
    for (int i = 0; i < TK_G_COUNT; i++) free(sum[i]);
    free(sq), free(sdo), free(skc), free(svc), free(sgiven), free(ssel);
    result_free(&wf);
    result_free(&wb);
    free(dO);
    tk_inputs_free(&in);
    ct->cases++;
    if (!ok) ct->fails++;
    return ok;
}

/* ---- argument rules of nsa_plan_create_varlen */

static int expect(nsa_status got, nsa_status want, const char *what, const char *needle)
{
    if (got == want && (!needle || strstr(nsa_last_error(), needle))) return 1;
    printf("FAIL %s: %s (%s), expected %s%s%s\n", what, nsa_status_string(got), nsa_last_error(),
           nsa_status_string(want), needle ? " naming " : "", needle ? needle : "");
    return 0;
}

static int check_arguments(nsa_context *ctx, int shards)
{
    nsa_config cfg;
    nsa_config_init(&cfg);
    cfg.dtype = NSA_DTYPE_F32;
    cfg.num_q_heads = 4, cfg.num_kv_heads = 2, cfg.head_dim_qk = 16, cfg.head_dim_v = 8;
    nsa_plan *plan = NULL;
    int ok = 1;
    const int64_t q2[3] = {0, 10, 30}, k2[3] = {0, 50, 90}, kshort[3] = {0, 5, 90}, kdown[3] = {0, 50, 40};
    const int64_t kbig[3] = {0, 50, (INT64_C(1) << 40) + 1}, q0[3] = {1, 10, 30};
    ok &= expect(nsa_plan_create_varlen(ctx, &cfg, NULL, k2, 2, &plan), NSA_ERR_NULL_POINTER, "cu_seqlens_q NULL",
                 "cu_seqlens_q");
    ok &= expect(nsa_plan_create_varlen(ctx, &cfg, q0, k2, 2, &plan), NSA_ERR_INVALID_SHAPE, "cu_seqlens_q[0] = 1",
                 "cu_seqlens_q[0]");
    ok &= expect(nsa_plan_create_varlen(ctx, &cfg, q2, kdown, 2, &plan), NSA_ERR_INVALID_SHAPE,
                 "decreasing cu_seqlens_k", "cu_seqlens_k decreases");
    ok &= expect(nsa_plan_create_varlen(ctx, &cfg, q2, kbig, 2, &plan), NSA_ERR_INVALID_SHAPE,
                 "2^40 + 1 keys", "2^40");
    ok &= expect(nsa_plan_create_varlen(ctx, &cfg, q2, kshort, 2, &plan), NSA_ERR_INVALID_SHAPE,
                 "more queries than keys", "sequence 0 has 10 queries");
    ok &= expect(plan ? NSA_ERR_INTERNAL : NSA_SUCCESS, NSA_SUCCESS, "no plan after a refusal", NULL);
    /* cu_seqlens_k NULL, or equal to cu_seqlens_q: a plan of nsa_plan_create on every backend */
    if (expect(nsa_plan_create_varlen(ctx, &cfg, q2, NULL, 2, &plan), NSA_SUCCESS, "cu_seqlens_k NULL", NULL)) {
        nsa_plan_info pi;
        nsa_plan_get_info(plan, &pi);
        if (pi.total_keys != 30 || pi.total_tokens != 30) {
            printf("FAIL cu_seqlens_k NULL: total_keys %lld, total_tokens %lld\n", (long long)pi.total_keys,
                   (long long)pi.total_tokens);
            ok = 0;
        }
        nsa_plan_destroy(plan);
        plan = NULL;
    } else {
        ok = 0;
    }
    nsa_status s = nsa_plan_create_varlen(ctx, &cfg, q2, k2, 2, &plan);
    if (shards) {
        if (expect(s, NSA_SUCCESS, "a shard plan", NULL)) {
            nsa_plan_info pi;
            nsa_plan_get_info(plan, &pi);
            /* keys 50 and 40 long: Nc = (50 - 32) / 16 + 1 = 2 and (40 - 32) / 16 + 1 = 1 */
            if (pi.total_keys != 90 || pi.total_tokens != 30 || pi.total_cmp_blocks != 3 || pi.max_slc_blocks != 1) {
                printf("FAIL shard plan info: total_keys %lld, total_tokens %lld, total_cmp_blocks %lld, "
                       "max_slc_blocks %lld (expected 90, 30, 3, 1)\n",
                       (long long)pi.total_keys, (long long)pi.total_tokens, (long long)pi.total_cmp_blocks,
                       (long long)pi.max_slc_blocks);
                ok = 0;
            }
            nsa_plan_destroy(plan);
        } else {
            ok = 0;
        }
    } else {
        ok &= expect(s, NSA_ERR_UNSUPPORTED, "a shard plan on a backend without shards", nsa_context_backend(ctx));
    }
    return ok;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: test_shard BACKEND DTYPES CORPUS\n");
        return 2;
    }
    nsa_context *ctx = NULL;
    nsa_status s = nsa_context_create(argv[1], 0, &ctx);
    if (s != NSA_SUCCESS) {
        printf("SKIP backend %s: %s\n", argv[1], nsa_last_error());
        return SKIP;
    }
    /* does the backend run shard plans? */
    nsa_config probe;
    nsa_config_init(&probe);
    probe.dtype = NSA_DTYPE_F32;
    nsa_plan *pp = NULL;
    const int64_t pq[2] = {0, 1}, pk[2] = {0, 2};
    s = nsa_plan_create_varlen(ctx, &probe, pq, pk, 1, &pp);
    const int shards = s == NSA_SUCCESS;
    nsa_plan_destroy(pp);
    int ok = check_arguments(ctx, shards);
    if (!shards) {
        nsa_context_destroy(ctx);
        printf("%s: the backend refuses shard plans (NSA_ERR_UNSUPPORTED, checked); %s\n", argv[1],
               ok ? "skipped" : "FAILED");
        return ok ? SKIP : 1;
    }
    tk_case *cases = NULL;
    const int nc = tk_corpus(argv[3], &cases);
    if (nc < 0) {
        fprintf(stderr, "unknown corpus %s\n", argv[3]);
        nsa_context_destroy(ctx);
        return 2;
    }
    char dts[64];
    snprintf(dts, sizeof dts, "%s", argv[2]);
    for (char *tok = strtok(dts, ","); tok; tok = strtok(NULL, ",")) {
        nsa_dtype dt = !strcmp(tok, "f32") ? NSA_DTYPE_F32 : !strcmp(tok, "f16") ? NSA_DTYPE_F16
                       : !strcmp(tok, "bf16") ? NSA_DTYPE_BF16 : !strcmp(tok, "f64") ? NSA_DTYPE_F64 : (nsa_dtype)-1;
        if ((int)dt < 0) {
            fprintf(stderr, "unknown dtype %s\n", tok);
            ok = 0;
            continue;
        }
        counts ct = {0};
        for (int i = 0; i < nc; i++) {
            tk_case c = cases[i];
            if (tk_case_tokens(&c) > 640 || c.rows > 0) continue; /* the full corpus's small cases */
            tk_case_set_dtype(&c, dt);
            ok &= check_case(ctx, &c, &ct);
        }
        printf("%s %s: %ld cases, %ld shards, %ld shard rows bitwise as the whole run, key gradients' sums worst "
               "%.3g of tolerance, %ld failed\n",
               argv[1], tok, ct.cases, ct.shards, ct.rows, ct.worst, ct.fails);
    }
    free(cases);
    nsa_context_destroy(ctx);
    return ok ? 0 : 1;
}
