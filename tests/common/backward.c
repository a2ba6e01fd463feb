/*
 * The backward runner and comparison (testkit.h, "backward"): uploads a case's
 * inputs, the forward's LSEs and selection and dO into dense buffers, poisons
 * every gradient (0xFF: NaN), runs nsa_backward on a training plan and reads
 * the gradients back in the fp64 reference's layout (tk_ref64); compares them
 * with tk_ref64_backward's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

#define MAX_BUFS 64

typedef struct bwd_runner {
    nsa_context *ctx;
    nsa_buffer *bufs[MAX_BUFS];
    int n;
    nsa_status st;
    char *msg;
    size_t msg_size;
} bwd_runner;

static nsa_status failed(bwd_runner *r, const char *what, nsa_status s)
{
    if (r->st == NSA_SUCCESS) {
        r->st = s;
        if (r->msg && r->msg_size)
            snprintf(r->msg, r->msg_size, "%s: %s: %s", what, nsa_status_string(s), nsa_last_error());
    }
    return s;
}

static nsa_buffer *alloc(bwd_runner *r, int64_t n, size_t es)
{
    if (r->st != NSA_SUCCESS) return NULL;
    if (r->n >= MAX_BUFS) {
        failed(r, "tk_run_backward", NSA_ERR_INTERNAL);
        return NULL;
    }
    nsa_buffer *b = NULL;
    nsa_status s = nsa_buffer_alloc(r->ctx, (size_t)(n > 0 ? n : 1) * es, &b);
    if (s != NSA_SUCCESS) {
        failed(r, "nsa_buffer_alloc", s);
        return NULL;
    }
    r->bufs[r->n++] = b;
    return b;
}

/* n floats of src converted to dt in a new buffer; a dense [., heads, dim] view. */
static nsa_tensor upload(bwd_runner *r, const void *src, nsa_dtype src_dt, int64_t n, nsa_dtype dt, int64_t heads,
                         int64_t dim)
{
    nsa_tensor t = {0};
    const size_t es = nsa_dtype_size(dt);
    nsa_buffer *b = alloc(r, n, es);
    if (!b) return t;
    void *tmp = malloc((size_t)(n > 0 ? n : 1) * es);
    if (!tmp) {
        failed(r, "malloc", NSA_ERR_OUT_OF_MEMORY);
        return t;
    }
    nsa_status s = src_dt == dt ? (memcpy(tmp, src, (size_t)n * es), NSA_SUCCESS) : nsa_convert(src, src_dt, tmp, dt, n);
    if (s == NSA_SUCCESS && n > 0) s = nsa_buffer_write(b, 0, tmp, (size_t)n * es);
    free(tmp);
    if (s != NSA_SUCCESS) {
        failed(r, "uploading an input", s);
        return t;
    }
    return nsa_tensor_dense(b, 0, heads, dim);
}

static nsa_tensor poisoned(bwd_runner *r, int64_t n, nsa_dtype dt, int64_t heads, int64_t dim)
{
    nsa_tensor t = {0};
    const size_t es = nsa_dtype_size(dt);
    nsa_buffer *b = alloc(r, n, es);
    if (!b) return t;
    nsa_status s = nsa_buffer_fill(b, 0, 0xFF, (size_t)(n > 0 ? n : 1) * es);
    if (s != NSA_SUCCESS) {
        failed(r, "nsa_buffer_fill", s);
        return t;
    }
    return nsa_tensor_dense(b, 0, heads, dim);
}

int tk_inputs_shared_kv(const tk_case *c, const tk_inputs *in)
{
    const nsa_config *g = &c->cfg;
    const int on[3] = {g->compress != NSA_COMPRESS_EXTERNAL, g->num_selected > 0, g->window > 0};
    int first = -1;
    for (int b = 0; b < 3; b++) {
        if (!on[b]) continue;
        if (first < 0) first = b;
        else if (in->k[b] != in->k[first] || in->v[b] != in->v[first]) return 0;
    }
    return 1;
}

nsa_status tk_run_backward(nsa_context *ctx, const tk_case *c, const tk_inputs *in, const float *dO,
                           double *const lse[3], const int32_t *sel, tk_grads *out, char *msg, size_t msg_size)
{
    if (msg && msg_size) msg[0] = '\0';
    if (!out) return NSA_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    if (!ctx || !c || !in || !dO || !lse) return NSA_ERR_NULL_POINTER;
    bwd_runner R = {.ctx = ctx, .msg = msg, .msg_size = msg_size};
    bwd_runner *r = &R;
    const nsa_config *g = &c->cfg;
    const nsa_dtype dt = g->dtype, fdt = tk_float_dtype(dt); /* gates, LSEs, dgate */
    const int64_t T = tk_case_tokens(c), Hq = g->num_q_heads, Hkv = g->num_kv_heads, Dk = g->head_dim_qk,
                  Dv = g->head_dim_v, l = g->cmp_block, n = g->num_selected, Nc = in->total_cmp;
    const int on[3] = {1, n > 0, g->window > 0};
    const int lin = g->compress == NSA_COMPRESS_LINEAR, ext = g->compress == NSA_COMPRESS_EXTERNAL;
    const int shared = tk_inputs_shared_kv(c, in);
    out->shared = shared;

    nsa_config cfg = c->cfg;
    cfg.flags |= NSA_CONFIG_TRAINING;
    nsa_plan *plan = NULL;
    nsa_status s = nsa_plan_create(ctx, &cfg, c->cu_seqlens, c->batch, &plan);
    if (s != NSA_SUCCESS) return failed(r, "nsa_plan_create (training)", s);
    nsa_plan_info pi;
    if (nsa_plan_get_info(plan, &pi) == NSA_SUCCESS) {
        out->workspace_bytes = pi.workspace_bytes;
        out->backend_bytes = pi.backend_bytes;
        const char *p = pi.bwd_stages;
        for (int i = 0; i < pi.num_bwd_stages && i < 8; i++) {
            while (*p == ' ') p++;
            const size_t len = strcspn(p, " ");
            snprintf(out->bwd_stage[i], sizeof out->bwd_stage[i], "%.*s", (int)len, p);
            if (nsa_plan_stage_kernel(plan, pi.num_stages + i, out->bwd_kernel[i], sizeof out->bwd_kernel[i]) !=
                NSA_SUCCESS)
                snprintf(out->bwd_kernel[i], sizeof out->bwd_kernel[i], "(%s)", nsa_last_error());
            out->num_bwd = i + 1;
            p += len;
        }
    }

    nsa_backward_args a;
    memset(&a, 0, sizeof a);
    a.q = upload(r, in->q, NSA_DTYPE_F32, T * Hq * Dk, dt, Hq, Dk);
    a.dout = upload(r, dO, NSA_DTYPE_F32, T * Hq * Dv, dt, Hq, Dv);
    int first = -1;
    for (int b = 0; b < 3; b++) {
        if (!on[b]) continue;
        a.gate[b] = upload(r, in->gate[b], NSA_DTYPE_F32, T * Hq, fdt, Hq, 1);
        a.lse[b] = upload(r, lse[b], NSA_DTYPE_F64, T * Hq, fdt, Hq, 1);
        a.dgate[b] = poisoned(r, T * Hq, fdt, Hq, 1);
        if (b == NSA_BRANCH_CMP && ext) continue;
        if (shared && first >= 0) { /* one tensor for every branch: the first branch's views */
            a.k[b] = a.k[first];
            a.v[b] = a.v[first];
            a.dk[b] = a.dk[first];
            a.dv[b] = a.dv[first];
            continue;
        }
        a.k[b] = upload(r, in->k[b], NSA_DTYPE_F32, T * Hkv * Dk, dt, Hkv, Dk);
        a.v[b] = upload(r, in->v[b], NSA_DTYPE_F32, T * Hkv * Dv, dt, Hkv, Dv);
        a.dk[b] = poisoned(r, T * Hkv * Dk, dt, Hkv, Dk);
        a.dv[b] = poisoned(r, T * Hkv * Dv, dt, Hkv, Dv);
        if (first < 0) first = b;
    }
    if (n > 0 && sel) a.block_indices = upload(r, sel, NSA_DTYPE_I32, T * Hkv * n, NSA_DTYPE_I32, Hkv, n);
    a.dq = poisoned(r, T * Hq * Dk, dt, Hq, Dk);
    if (lin) {
        a.w_k = upload(r, in->w_k, NSA_DTYPE_F32, Hkv * l * Dk * Dk, dt, 1, 1);
        a.w_v = upload(r, in->w_v, NSA_DTYPE_F32, Hkv * l * Dv * Dv, dt, 1, 1);
        a.dw_k = poisoned(r, Hkv * l * Dk * Dk, dt, 1, 1);
        a.dw_v = poisoned(r, Hkv * l * Dv * Dv, dt, 1, 1);
        if (c->use_pe && in->pe_k && in->pe_v) {
            a.pe_k = upload(r, in->pe_k, NSA_DTYPE_F32, Hkv * l * Dk, dt, 1, 1);
            a.pe_v = upload(r, in->pe_v, NSA_DTYPE_F32, Hkv * l * Dv, dt, 1, 1);
            a.dpe_k = poisoned(r, Hkv * l * Dk, dt, 1, 1);
            a.dpe_v = poisoned(r, Hkv * l * Dv, dt, 1, 1);
        }
    }
    if (ext) {
        a.kc = upload(r, in->kc, NSA_DTYPE_F32, Nc * Hkv * Dk, dt, Hkv, Dk);
        a.vc = upload(r, in->vc, NSA_DTYPE_F32, Nc * Hkv * Dv, dt, Hkv, Dv);
        a.dkc = poisoned(r, Nc * Hkv * Dk, dt, Hkv, Dk);
        a.dvc = poisoned(r, Nc * Hkv * Dv, dt, Hkv, Dv);
    }
    if (r->st == NSA_SUCCESS) {
        if ((s = nsa_backward(plan, &a, NULL)) != NSA_SUCCESS) failed(r, "nsa_backward", s);
        else if ((s = nsa_context_synchronize(ctx)) != NSA_SUCCESS) failed(r, "nsa_context_synchronize", s);
    }

    if (r->st == NSA_SUCCESS && (s = tk_grads_read(c, &a, T, T, Nc, dt, out)) != NSA_SUCCESS)
        failed(r, "reading a gradient back", s);
    for (int i = 0; i < r->n; i++) nsa_buffer_free(r->bufs[i]);
    nsa_plan_destroy(plan);
    if (r->st != NSA_SUCCESS) tk_grads_free(out);
    return r->st;
}

nsa_status tk_grads_read(const tk_case *c, const nsa_backward_args *a, int64_t T, int64_t TK, int64_t Nc,
                         nsa_dtype key_dt, tk_grads *out)
{
    const nsa_config *g = &c->cfg;
    const nsa_dtype dt = g->dtype, fdt = tk_float_dtype(dt);
    const int64_t Hq = g->num_q_heads, Hkv = g->num_kv_heads, Dk = g->head_dim_qk, Dv = g->head_dim_v,
                  l = g->cmp_block;
    const struct {
        int id;
        const nsa_tensor *t;
        int64_t n;
        nsa_dtype dt;
    } want[] = {
        {TK_G_Q, &a->dq, T * Hq * Dk, dt},
        {TK_G_K + 0, &a->dk[0], TK * Hkv * Dk, key_dt},
        {TK_G_K + 1, &a->dk[1], TK * Hkv * Dk, key_dt},
        {TK_G_K + 2, &a->dk[2], TK * Hkv * Dk, key_dt},
        {TK_G_V + 0, &a->dv[0], TK * Hkv * Dv, key_dt},
        {TK_G_V + 1, &a->dv[1], TK * Hkv * Dv, key_dt},
        {TK_G_V + 2, &a->dv[2], TK * Hkv * Dv, key_dt},
        {TK_G_GATE + 0, &a->dgate[0], T * Hq, fdt},
        {TK_G_GATE + 1, &a->dgate[1], T * Hq, fdt},
        {TK_G_GATE + 2, &a->dgate[2], T * Hq, fdt},
        {TK_G_WK, &a->dw_k, Hkv * l * Dk * Dk, key_dt},
        {TK_G_WV, &a->dw_v, Hkv * l * Dv * Dv, key_dt},
        {TK_G_PEK, &a->dpe_k, Hkv * l * Dk, key_dt},
        {TK_G_PEV, &a->dpe_v, Hkv * l * Dv, key_dt},
        {TK_G_KC, &a->dkc, Nc * Hkv * Dk, key_dt},
        {TK_G_VC, &a->dvc, Nc * Hkv * Dv, key_dt},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const int id = want[i].id;
        if (!want[i].t->buffer) continue;
        int dup = 0;
        for (size_t j = 0; j < i; j++) dup |= want[j].t->buffer == want[i].t->buffer;
        if (dup) continue;
        const int64_t cnt = want[i].n;
        const size_t bytes = (size_t)cnt * nsa_dtype_size(want[i].dt);
        out->t[id] = malloc((size_t)(cnt > 0 ? cnt : 1) * sizeof(double));
        out->raw[id] = malloc(bytes ? bytes : 1);
        if (!out->t[id] || !out->raw[id]) return NSA_ERR_OUT_OF_MEMORY;
        out->n[id] = cnt;
        out->raw_bytes[id] = bytes;
        /* as doubles: exact for every dtype */
        nsa_status s;
        if (cnt > 0 && ((s = nsa_buffer_read(want[i].t->buffer, 0, out->raw[id], bytes)) != NSA_SUCCESS ||
                        (s = nsa_convert(out->raw[id], want[i].dt, out->t[id], NSA_DTYPE_F64, cnt)) != NSA_SUCCESS))
            return s;
    }
    return NSA_SUCCESS;
}

void tk_grads_free(tk_grads *g)
{
    if (!g) return;
    for (int i = 0; i < TK_G_COUNT; i++) {
        free(g->t[i]);
        free(g->raw[i]);
        g->t[i] = NULL;
        g->raw[i] = NULL;
        g->n[i] = 0;
    }
}

void tk_ref64_sum_shared(tk_ref64 *ref)
{
    for (int kv = 0; kv < 2; kv++) {
        const int base = kv ? TK_G_V : TK_G_K;
        int first = -1;
        for (int b = 0; b < 3; b++) {
            if (!ref->t[base + b] || ref->n[base + b] == 0) continue;
            if (first < 0) {
                first = b;
                continue;
            }
            for (int64_t e = 0; e < ref->n[base + b]; e++) ref->t[base + first][e] += ref->t[base + b][e];
            ref->n[base + b] = 0;
        }
    }
}

void tk_grad_tolerance(nsa_dtype dt, double *rms_tol, double *rel_tol)
{
    if (dt == NSA_DTYPE_F64) {
        *rms_tol = *rel_tol = 1e-10;
        return;
    }
    *rms_tol = dt == NSA_DTYPE_F32 ? 3e-4 : 1e-2;
    *rel_tol = dt == NSA_DTYPE_F32 ? 3e-4 : dt == NSA_DTYPE_F16 ? 4e-3 : 1.6e-2;
}

int tk_compare_grads(const tk_case *c, const tk_grads *got, const tk_ref64 *ref, double rms_do, int64_t total_cmp,
                     tk_grad_verdict *v)
{
    memset(v, 0, sizeof *v);
    v->pass = 1;
    double rt, lt;
    tk_grad_tolerance(c->cfg.dtype, &rt, &lt);
    for (int i = 0; i < TK_G_COUNT && v->pass; i++) {
        if (!ref->t[i] || ref->n[i] == 0) continue;
        if (!got->t[i] || got->n[i] != ref->n[i]) {
            v->pass = 0;
            snprintf(v->msg, sizeof v->msg, "%s: the backend returned no %s", c->label, tk_ref64_name(i));
            break;
        }
        const int64_t n = ref->n[i];
        double rms = 0.0;
        for (int64_t e = 0; e < n; e++) rms += ref->t[i][e] * ref->t[i][e];
        rms = sqrt(rms / (double)n);
        /* a (nearly) zero gradient is judged on dO's scale; dpe sums every compressed
         * row of the batch, and for keys that sum is 0 (softmax is shift invariant),
         * so its error grows as sqrt(rows) */
        double floor = 0.1 * rms_do;
        if (i == TK_G_PEK || i == TK_G_PEV) floor *= sqrt((double)(total_cmp > 1 ? total_cmp : 1));
        if (rms < floor) rms = floor;
        for (int64_t e = 0; e < n; e++) {
            const double a = got->t[i][e], b = ref->t[i][e];
            const double err = fabs(a - b), tol = rt * rms + lt * fabs(b) + 1e-30;
            if (err / tol > v->worst || a != a) v->worst = a != a ? INFINITY : err / tol;
            if (!(err <= tol)) {
                v->pass = 0;
                snprintf(v->msg, sizeof v->msg, "%s: %s[%lld] = %.9g, reference %.9g (|diff| %.3g > tolerance %.3g)",
                         c->label, tk_ref64_name(i), (long long)e, a, b, err, tol);
                break;
            }
        }
        v->elements += n;
    }
    return v->pass;
}

nsa_status tk_dout_make(const tk_case *c, uint64_t seed, uint64_t stream, float **out)
{
    *out = NULL;
    const int64_t no = tk_case_tokens(c) * c->cfg.num_q_heads * c->cfg.head_dim_v;
    float *d = malloc((size_t)(no + 1) * sizeof *d);
    void *tmp = malloc((size_t)(no + 1) * 2);
    nsa_status s = d && tmp ? nsa_random_uniform(seed, stream, 0, no, -1.0f, 1.0f, d) : NSA_ERR_OUT_OF_MEMORY;
    /* f16 / bf16: rounded to the dtype; f32 values are f32 and f64 values already */
    if (s == NSA_SUCCESS && c->cfg.dtype != NSA_DTYPE_F32 && c->cfg.dtype != NSA_DTYPE_F64 &&
        (s = nsa_convert(d, NSA_DTYPE_F32, tmp, c->cfg.dtype, no)) == NSA_SUCCESS)
        s = nsa_convert(tmp, c->cfg.dtype, d, NSA_DTYPE_F32, no);
    free(tmp);
    if (s != NSA_SUCCESS) {
        free(d);
        return s;
    }
    *out = d;
    return NSA_SUCCESS;
}
