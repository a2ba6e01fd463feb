/*
 * hip_backend.h -- the HIP module's private objects, shared by backend.hip
 * (runtime, devices, contexts, buffers) and stages.hip (plans and run()).
 */
#ifndef NSA_BACKENDS_HIP_BACKEND_H
#define NSA_BACKENDS_HIP_BACKEND_H

#include "backend.h"
#include "nsa_hip.h"

#define NSA_HIP_HIDDEN __attribute__((visibility("hidden")))

/* One device, one stream. */
struct hip_ctx {
    int device;
    hipStream_t stream;
    int own_stream;       /* 1: created here, destroyed with the context */
    size_t lds_bytes;     /* LDS (shared memory) per block */
    int wave;             /* wavefront size reported by the runtime (32 or 64) */
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
    nsa_hip_tile attn; /* CMP/SLC/WIN_ATTN tiling */
    nsa_hip_tile scores;
};

/* The host services the core passed to nsa_backend_entry. */
NSA_HIP_HIDDEN extern const nsa_host_api *nsa_hip_host;

/* Maps a HIP error to NSA_ERR_DEVICE (or OUT_OF_MEMORY) with "what: error". */
NSA_HIP_HIDDEN nsa_status nsa_hip_fail(hipError_t e, const char *what);

/* stages.hip */
NSA_HIP_HIDDEN int nsa_hip_supports(void *bctx, nsa_stage stage, const nsa_config *cfg);
NSA_HIP_HIDDEN nsa_status nsa_hip_plan_prepare(void *bctx, nsa_bk_plan *plan);
NSA_HIP_HIDDEN void nsa_hip_plan_release(void *bctx, nsa_bk_plan *plan);
NSA_HIP_HIDDEN nsa_status nsa_hip_run(void *bctx, nsa_stage stage, const nsa_bk_args *args);

#endif /* NSA_BACKENDS_HIP_BACKEND_H */
