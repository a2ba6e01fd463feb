/*
 * hip_backend.h -- the HIP module's private objects, shared by backend.hip
 * (runtime, devices, contexts, buffers), stages.hip (plans and run()) and
 * decode_stages.hip (decode plans: their memory, the two decode stages, the status).
 */
#ifndef NSA_BACKENDS_HIP_BACKEND_H
#define NSA_BACKENDS_HIP_BACKEND_H

#include <string.h>

#include "backend.h"
#include "nsa_hip.h" /* first: the HIP runtime header */
#include "nsa_dtype.h"

#define NSA_HIP_HIDDEN __attribute__((visibility("hidden")))

/* One device, one stream. */
struct hip_ctx {
    int device;
    hipStream_t stream;
    int own_stream;       /* 1: created here, destroyed with the context */
    size_t lds_bytes;     /* LDS (shared memory) per block */
    int wave;             /* wavefront size reported by the runtime (32 or 64) */
    int cus;              /* compute units (the decode step's splits fill about two blocks per CU) */
    int mfma;             /* CDNA matrix cores usable (and not disabled by NSA_HIP_NO_MFMA=1) */
    char arch[64];        /* gcnArchName, e.g. "gfx90a:sramecc+:xnack-" */
};

/* Device memory: owned (hipMalloc) or wrapped (the caller's pointer). */
struct hip_buf {
    char *ptr;
    size_t bytes;
    int owned;
};

/* What plan_prepare computes once per plan. */
struct hip_plan {
    nsa_hip_tile attn; /* CMP/SLC/WIN_ATTN tiling (decode plans: the portable one) */
    nsa_hip_tile scores;
    struct hip_dec *dec; /* decode plans: decode_stages.hip's memory */
};

/* The host services the core passed to nsa_backend_entry. */
NSA_HIP_HIDDEN extern const nsa_host_api *nsa_hip_host;

/* Maps a HIP error to NSA_ERR_DEVICE (or OUT_OF_MEMORY) with "what: error". */
NSA_HIP_HIDDEN nsa_status nsa_hip_fail(hipError_t e, const char *what);

/* Bytes of one element of a tensor. */
static inline size_t nsa_hip_dtype_size(nsa_dtype d)
{
    switch (d) {
    case NSA_DTYPE_F32: return 4;
    case NSA_DTYPE_F16: return 2;
    case NSA_DTYPE_BF16: return 2;
    case NSA_DTYPE_I32: return 4;
    case NSA_DTYPE_F64: return 8; /* refused by nsa_hip_supports (no f64 kernels) */
    }
    return 0;
}

/* A tensor as kernels see it (the element offset applied). */
static inline nsa_hip_tensor nsa_hip_view(const nsa_bk_tensor &t)
{
    const hip_buf *b = (const hip_buf *)t.buf;
    nsa_hip_tensor v;
    v.ptr = b ? b->ptr + (size_t)t.offset * nsa_hip_dtype_size(t.dtype) : NULL;
    v.st = t.stride_token;
    v.sh = t.stride_head;
    return v;
}

/* Shape part of the kernel arguments (enough for tiling decisions). */
static inline nsa_hip_dims nsa_hip_dims_of_config(const nsa_config *c)
{
    nsa_hip_dims d;
    memset(&d, 0, sizeof d);
    d.Hq = c->num_q_heads;
    d.Hkv = c->num_kv_heads;
    d.G = c->num_kv_heads > 0 ? c->num_q_heads / c->num_kv_heads : 1;
    d.Dqk = c->head_dim_qk;
    d.Dv = c->head_dim_v;
    d.l = c->cmp_block;
    d.d = c->cmp_stride;
    d.ls = c->slc_block;
    d.n = c->num_selected;
    d.n_init = c->num_init;
    d.n_local = c->num_local;
    d.w = c->window;
    d.scale_log2 = c->scale * 1.4426950408889634f;
    d.scale = c->scale;
    d.dtype = c->dtype == NSA_DTYPE_F16 ? NSA_DT_F16 : c->dtype == NSA_DTYPE_BF16 ? NSA_DT_BF16 : NSA_DT_F32;
    return d;
}

/* stages.hip */
/* The stage's required tensor is present (NSA_ERR_MISSING_TENSOR naming it if not). */
NSA_HIP_HIDDEN nsa_status nsa_hip_need(const nsa_bk_tensor &t, const char *name, nsa_stage stage);
NSA_HIP_HIDDEN int nsa_hip_supports(void *bctx, nsa_stage stage, const nsa_config *cfg);
NSA_HIP_HIDDEN nsa_status nsa_hip_plan_prepare(void *bctx, nsa_bk_plan *plan);
NSA_HIP_HIDDEN void nsa_hip_plan_release(void *bctx, nsa_bk_plan *plan);
NSA_HIP_HIDDEN nsa_status nsa_hip_run(void *bctx, nsa_stage stage, const nsa_bk_args *args);

/* decode_stages.hip: decode plans (semantics section 10) */
NSA_HIP_HIDDEN int nsa_hip_decode_supports(const hip_ctx *c, const nsa_config *cfg);
NSA_HIP_HIDDEN nsa_status nsa_hip_decode_prepare(const hip_ctx *c, nsa_bk_plan *plan, hip_plan *hp);
NSA_HIP_HIDDEN void nsa_hip_decode_release(hip_plan *hp);
NSA_HIP_HIDDEN nsa_status nsa_hip_decode_run(const hip_ctx *c, const nsa_bk_plan *plan, nsa_stage stage,
                                             const nsa_bk_args *a);
NSA_HIP_HIDDEN nsa_status nsa_hip_decode_status(void *bctx, const nsa_bk_plan *plan);

#endif /* NSA_BACKENDS_HIP_BACKEND_H */
