/*
 * stages.hip -- the HIP backend's side of the stage contract (core/backend.h):
 * which stages it runs, the per-plan tiling, and run(), which turns an
 * nsa_bk_args into kernel arguments and queues the stage's kernels on the
 * context's stream (no synchronization, no allocation).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip_backend.h"

static nsa_hip_dims dims_of_plan(const nsa_bk_plan *p)
{
    nsa_hip_dims d = nsa_hip_dims_of_config(&p->cfg);
    d.T = p->total_tokens;
    d.B = p->batch;
    d.total_cmp = p->total_cmp;
    d.max_ns = p->max_ns;
    const hip_buf *tb = (const hip_buf *)p->dev_tables;
    const int64_t *base = tb ? (const int64_t *)tb->ptr : NULL;
    d.cu_seqlens = base ? base + p->dev_cu_seqlens : NULL;
    d.cu_cmp = base ? base + p->dev_cu_cmp : NULL;
    d.tok_seq = base ? base + p->dev_tok_seq : NULL;
    return d;
}

static nsa_hip_tensor view(const nsa_bk_tensor &t) { return nsa_hip_view(t); }

/* Stage names as in messages of the core (backend.h's inline nsa_stage_name). */
static const char *stage_name(nsa_stage s) { return nsa_stage_name(s); }

static int dtype_ok(nsa_dtype d) { return d == NSA_DTYPE_F32 || d == NSA_DTYPE_F16 || d == NSA_DTYPE_BF16; }

int nsa_hip_supports(void *bctx, nsa_stage stage, const nsa_config *cfg)
{
    const hip_ctx *c = (const hip_ctx *)bctx;
    if (!dtype_ok(cfg->dtype)) return 0;
    nsa_hip_dims d = nsa_hip_dims_of_config(cfg);
    nsa_hip_tile t;
    switch (stage) {
    case NSA_STAGE_COMPRESS:
    case NSA_STAGE_SELECT_TOPN:
    case NSA_STAGE_COMBINE: return 1;
    case NSA_STAGE_CMP_ATTN:
    case NSA_STAGE_SLC_ATTN:
    case NSA_STAGE_WIN_ATTN: return nsa_hip_attn_tile(&d, c->lds_bytes, 0, &t) == 0;
    case NSA_STAGE_BLOCK_SCORES: return nsa_hip_scores_tile(&d, c->lds_bytes, 0, &t) == 0;
    case NSA_STAGE_BWD_CMP_ATTN:
    case NSA_STAGE_BWD_COMPRESS:
    case NSA_STAGE_BWD_SLC_ATTN:
    case NSA_STAGE_BWD_WIN_ATTN:
    case NSA_STAGE_BWD_STORE: return 1; /* backward.hip: any head dim (rows read from global memory) */
    case NSA_STAGE_DECODE_APPEND:
    case NSA_STAGE_DECODE_ATTN: return nsa_hip_decode_supports(c, cfg); /* decode_stages.hip */
    default: return 0; /* SCORES_TOPN (fused) is not implemented: BLOCK_SCORES + SELECT_TOPN run instead */
    }
}

nsa_status nsa_hip_plan_prepare(void *bctx, nsa_bk_plan *plan)
{
    const hip_ctx *c = (const hip_ctx *)bctx;
    hip_plan *hp = (hip_plan *)calloc(1, sizeof *hp);
    if (!hp) return nsa_hip_host->set_error(NSA_ERR_OUT_OF_MEMORY, "hip backend: out of host memory for a plan");
    if (plan->decode) { /* decode plans have no token tables: decode_stages.hip */
        nsa_status s = nsa_hip_decode_prepare(c, plan, hp);
        if (s != NSA_SUCCESS) {
            nsa_hip_decode_release(hp);
            free(hp);
            return s;
        }
        plan->backend_plan = hp;
        return NSA_SUCCESS;
    }
    nsa_hip_dims d = dims_of_plan(plan);
    /* matrix-core tiles on CDNA where they fit, else the portable ones */
    if (!c->mfma || nsa_hip_attn_tile(&d, c->lds_bytes, 1, &hp->attn) != 0)
        (void)nsa_hip_attn_tile(&d, c->lds_bytes, 0, &hp->attn);
    if (!c->mfma || nsa_hip_scores_tile(&d, c->lds_bytes, 1, &hp->scores) != 0)
        (void)nsa_hip_scores_tile(&d, c->lds_bytes, 0, &hp->scores);
    if (hp->attn.rows == 0 || hp->scores.rows == 0) {
        free(hp);
        return nsa_hip_host->set_error(NSA_ERR_UNSUPPORTED,
                                       "hip backend: head dims Dqk = %lld, Dv = %lld do not fit the %zu bytes of LDS "
                                       "of this device even with one head and one key per block",
                                       (long long)d.Dqk, (long long)d.Dv, c->lds_bytes);
    }
    if (d.T > 0 && (!d.cu_seqlens || !d.cu_cmp || !d.tok_seq)) {
        free(hp);
        return nsa_hip_host->set_error(NSA_ERR_INTERNAL, "hip backend: the plan has no device tables");
    }
    plan->backend_plan = hp;
    return NSA_SUCCESS;
}

void nsa_hip_plan_release(void *bctx, nsa_bk_plan *plan)
{
    (void)bctx;
    hip_plan *hp = (hip_plan *)plan->backend_plan;
    if (hp) nsa_hip_decode_release(hp);
    free(hp);
    plan->backend_plan = NULL;
}

/* The stage's required tensors are present (the core checks; this guards the
 * device against a NULL pointer if it ever did not). */
nsa_status nsa_hip_need(const nsa_bk_tensor &t, const char *name, nsa_stage stage)
{
    if (t.buf) return NSA_SUCCESS;
    return nsa_hip_host->set_error(NSA_ERR_MISSING_TENSOR, "hip backend: stage %s needs tensor %s", stage_name(stage),
                                   name);
}

static nsa_status need(const nsa_bk_tensor &t, const char *name, nsa_stage stage)
{
    return nsa_hip_need(t, name, stage);
}

nsa_status nsa_hip_run(void *bctx, nsa_stage stage, const nsa_bk_args *a)
{
    const hip_ctx *c = (const hip_ctx *)bctx;
    const nsa_bk_plan *p = a->plan;
    const hip_plan *hp = (const hip_plan *)p->backend_plan;
    if (p->total_tokens == 0) return NSA_SUCCESS;
    if (!hp) return nsa_hip_host->set_error(NSA_ERR_INTERNAL, "hip backend: run() on a plan that was not prepared");
    hipError_t e = hipSetDevice(c->device);
    if (e != hipSuccess) return nsa_hip_fail(e, "hipSetDevice");
    if (p->decode) return nsa_hip_decode_run(c, p, stage, a); /* decode_stages.hip */

    const nsa_hip_dims d = dims_of_plan(p);
    const nsa_hip_tensor none = {NULL, 0, 0};
    const int C = NSA_BRANCH_CMP, S = NSA_BRANCH_SLC, W = NSA_BRANCH_WIN;
    nsa_status s;
    switch (stage) {
    case NSA_STAGE_COMPRESS:
        if ((s = need(a->kc, "kc", stage)) || (s = need(a->vc, "vc", stage))) return s;
        if (p->cfg.compress == NSA_COMPRESS_EXTERNAL) {
            if ((s = need(a->kc_in, "kc_in", stage)) || (s = need(a->vc_in, "vc_in", stage))) return s;
            e = nsa_hip_compress_copy(&d, view(a->kc_in), view(a->kc), d.Dqk, c->stream);
            if (e == hipSuccess) e = nsa_hip_compress_copy(&d, view(a->vc_in), view(a->vc), d.Dv, c->stream);
        } else if (p->cfg.compress == NSA_COMPRESS_LINEAR) {
            if ((s = need(a->k[C], "k[cmp]", stage)) || (s = need(a->v[C], "v[cmp]", stage)) ||
                (s = need(a->w_k, "w_k", stage)) || (s = need(a->w_v, "w_v", stage)))
                return s;
            e = nsa_hip_compress_linear(&d, view(a->k[C]), view(a->w_k), view(a->pe_k), view(a->kc), d.Dqk, c->stream);
            if (e == hipSuccess)
                e = nsa_hip_compress_linear(&d, view(a->v[C]), view(a->w_v), view(a->pe_v), view(a->vc), d.Dv,
                                            c->stream);
        } else {
            if ((s = need(a->k[C], "k[cmp]", stage)) || (s = need(a->v[C], "v[cmp]", stage))) return s;
            e = nsa_hip_compress_mean(&d, view(a->k[C]), view(a->kc), d.Dqk, c->stream);
            if (e == hipSuccess) e = nsa_hip_compress_mean(&d, view(a->v[C]), view(a->vc), d.Dv, c->stream);
        }
        break;
    case NSA_STAGE_CMP_ATTN:
        if ((s = need(a->q, "q", stage)) || (s = need(a->kc, "kc", stage)) || (s = need(a->vc, "vc", stage)) ||
            (s = need(a->o_b[C], "o_b[cmp]", stage)) || (s = need(a->lse[C], "lse[cmp]", stage)))
            return s;
        e = nsa_hip_attention(&d, NSA_HIP_CMP, &hp->attn, view(a->q), view(a->kc), view(a->vc), none,
                              view(a->o_b[C]), view(a->lse[C]), c->stream);
        break;
    case NSA_STAGE_BLOCK_SCORES:
        if ((s = need(a->q, "q", stage)) || (s = need(a->kc, "kc", stage)) || (s = need(a->lse[C], "lse[cmp]", stage)) ||
            (s = need(a->scores, "scores", stage)))
            return s;
        e = nsa_hip_block_scores(&d, &hp->scores, view(a->q), view(a->kc), view(a->lse[C]), view(a->scores),
                                 c->stream);
        break;
    case NSA_STAGE_SELECT_TOPN:
        if ((s = need(a->scores, "scores", stage)) || (s = need(a->indices, "indices", stage))) return s;
        e = nsa_hip_select_topn(&d, view(a->scores), view(a->indices), c->stream);
        break;
    case NSA_STAGE_SLC_ATTN:
        if ((s = need(a->q, "q", stage)) || (s = need(a->k[S], "k[slc]", stage)) || (s = need(a->v[S], "v[slc]", stage)) ||
            (s = need(a->indices, "indices", stage)) || (s = need(a->o_b[S], "o_b[slc]", stage)))
            return s;
        e = nsa_hip_attention(&d, NSA_HIP_SLC, &hp->attn, view(a->q), view(a->k[S]), view(a->v[S]), view(a->indices),
                              view(a->o_b[S]), view(a->lse[S]), c->stream);
        break;
    case NSA_STAGE_WIN_ATTN:
        if ((s = need(a->q, "q", stage)) || (s = need(a->k[W], "k[win]", stage)) || (s = need(a->v[W], "v[win]", stage)) ||
            (s = need(a->o_b[W], "o_b[win]", stage)))
            return s;
        e = nsa_hip_attention(&d, NSA_HIP_WIN, &hp->attn, view(a->q), view(a->k[W]), view(a->v[W]), none,
                              view(a->o_b[W]), view(a->lse[W]), c->stream);
        break;
    case NSA_STAGE_COMBINE: {
        if ((s = need(a->o, "o", stage))) return s;
        nsa_hip_tensor gate[3], ob[3];
        for (int b = 0; b < 3; b++) {
            ob[b] = view(a->o_b[b]);
            gate[b] = ob[b].ptr ? view(a->gate[b]) : none;
            if (ob[b].ptr && !gate[b].ptr)
                return nsa_hip_host->set_error(NSA_ERR_MISSING_TENSOR, "hip backend: stage combine needs gate[%d]", b);
        }
        e = nsa_hip_combine(&d, gate, ob, view(a->o), c->stream);
        break;
    }
    case NSA_STAGE_BWD_CMP_ATTN:
    case NSA_STAGE_BWD_SLC_ATTN:
    case NSA_STAGE_BWD_WIN_ATTN: {
        const int b = stage == NSA_STAGE_BWD_CMP_ATTN ? C : stage == NSA_STAGE_BWD_SLC_ATTN ? S : W;
        const nsa_bk_tensor &k = b == C ? a->kc : a->k[b], &v = b == C ? a->vc : a->v[b];
        if ((s = need(a->q, "q", stage)) || (s = need(a->dout, "dout", stage)) || (s = need(a->lse[b], "lse", stage)) ||
            (s = need(a->gate[b], "gate", stage)) || (s = need(a->delta, "delta", stage)) ||
            (s = need(k, "k", stage)) || (s = need(v, "v", stage)) ||
            (b == S && (s = need(a->indices, "indices", stage))))
            return s;
        const nsa_hip_bwd_in in = {view(a->q),       view(a->dout),     view(a->lse[b]), view(a->gate[b]),
                                   b == S ? view(a->indices) : none, view(a->dgate[b]), view(a->delta)};
        e = nsa_hip_bwd_attention(&d, b == C ? NSA_HIP_CMP : b == S ? NSA_HIP_SLC : NSA_HIP_WIN, &in, view(k), view(v),
                                  view(a->dq_acc), view(b == C ? a->dkc_acc : a->dk_acc[b]),
                                  view(b == C ? a->dvc_acc : a->dv_acc[b]), c->stream);
        break;
    }
    case NSA_STAGE_BWD_COMPRESS: {
        if (p->total_cmp == 0 || p->cfg.compress == NSA_COMPRESS_EXTERNAL) return NSA_SUCCESS;
        const int lin = p->cfg.compress == NSA_COMPRESS_LINEAR;
        if ((s = need(a->dkc_acc, "dkc_acc", stage)) || (s = need(a->dvc_acc, "dvc_acc", stage)) ||
            (lin && ((s = need(a->w_k, "w_k", stage)) || (s = need(a->w_v, "w_v", stage)))) ||
            (lin && (a->dw_k_acc.buf || a->dw_v_acc.buf) &&
             ((s = need(a->k[C], "k[cmp]", stage)) || (s = need(a->v[C], "v[cmp]", stage)))))
            return s;
        e = nsa_hip_bwd_compress(&d, lin, d.Dqk, view(a->dkc_acc), view(a->k[C]), view(a->w_k), view(a->pe_k),
                                 view(a->dk_acc[C]), view(a->dw_k_acc), view(a->dpe_k_acc), c->stream);
        if (e == hipSuccess)
            e = nsa_hip_bwd_compress(&d, lin, d.Dv, view(a->dvc_acc), view(a->v[C]), view(a->w_v), view(a->pe_v),
                                     view(a->dv_acc[C]), view(a->dw_v_acc), view(a->dpe_v_acc), c->stream);
        break;
    }
    case NSA_STAGE_BWD_STORE:
        for (int i = 0; i < a->num_store && e == hipSuccess; i++) {
            const nsa_bk_store &st = a->store[i];
            if ((s = need(st.acc, "acc", stage)) || (s = need(st.out, "out", stage))) return s;
            e = nsa_hip_bwd_store(st.out.dtype == NSA_DTYPE_F16 ? NSA_DT_F16 : st.out.dtype == NSA_DTYPE_BF16 ? NSA_DT_BF16
                                                                                                          : NSA_DT_F32,
                                  view(st.acc), view(st.out), st.rows, st.heads, st.dim, c->stream);
        }
        break;
    default:
        return nsa_hip_host->set_error(NSA_ERR_UNSUPPORTED, "hip backend: stage %s is not implemented",
                                       stage_name(stage));
    }
    if (e != hipSuccess) {
        char what[96];
        snprintf(what, sizeof what, "launching stage %s", stage_name(stage));
        return nsa_hip_fail(e, what);
    }
    return NSA_SUCCESS;
}
