/*
 * cuda_internal.h -- what the CUDA backend's files share: the context (the
 * device, its stream, the class its plans are made for), buffers, the
 * per-plan record (the chooser's choice and what it allocated), and the entry
 * points of cuda_plan.cu and cuda_run.cu that cuda_backend.cu puts in the
 * vtable.
 */
#ifndef NSA_BACKENDS_CUDA_INTERNAL_H
#define NSA_BACKENDS_CUDA_INTERNAL_H

#include <cuda_runtime.h>

#include "backend.h"
#include "choose.h"
#include "nsa_cuda_kernels.h"

namespace nsa_cuda {

extern const nsa_host_api *g_host;

#define FAIL(status, ...) ::nsa_cuda::g_host->set_error(status, __VA_ARGS__)

nsa_status cuda_fail(cudaError_t e, const char *what);

#define CU(call, what)                                                                                         \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) return ::nsa_cuda::cuda_fail(e_, what);                                         \
    } while (0)

struct CudaCtx {
    int device;
    cudaStream_t stream;
    bool own_stream;
    Cls device_cls; /* what the device is */
    Limits lim;     /* the class plans are made for: the device's, or NSA_CUDA_TARGET's */
    Dev dev;        /* shared memory per SM of both, for the launchers (emulation) */
    bool pdl;       /* decode steps launch with programmatic dependent launch (dec_pdl_available) */
    Force force;    /* NSA_CUDA_FORCE */
    int64_t score_rows_max; /* NSA_CUDA_SCORE_ROWS_MAX: the most bytes of an unfused SCORES_TOPN's rows (1 GiB) */
    int64_t slc_pass_max;   /* NSA_CUDA_SLC_PASS_MAX: the most bytes of slc_sm80_blk's partial states per pass (1 GiB) */
    int slc_combine;        /* NSA_CUDA_SLC_COMBINE: 0 never, 1 always, -1 auto (offers_slc_combine) */
    /* NSA_CUDA_PROFILE=1: events around every stage; after COMBINE the forward
     * waits for its stream and prints the stage times and kernels to stderr
     * (for measuring only: this synchronizes). */
    bool profile;
    cudaEvent_t ev[2 * NSA_STAGE_COUNT];
    bool ev_used[NSA_STAGE_COUNT];
    char ran[NSA_STAGE_COUNT][96]; /* the kernel each stage ran, for the profile */
};

struct CudaBuf {
    char *ptr;
    size_t bytes;
    bool owned;
};

/* Memory a plan owns outside the workspace, allocated once in plan_prepare
 * (never in run()). */
/* one chunk of the SCORES_TOPN stage: tiles [off, off + count) of
 * sc_tiles_dev cover tokens [t0, t1) */
struct ScoreChunk {
    int64_t off, count, t0, t1;
};

struct CudaPlan {
    Choice ch;
    bool scores_topn;  /* the core planned the fused SCORES_TOPN stage */
    Tiles tiles;       /* tile list of the tiled kernels (tiles.tiles on the device) */
    int64_t *tiles_dev;
    Tiles sc_tiles;    /* the scores kernel's tile list: tiles, or its own where ch.sc_tokens is set */
    int64_t *sc_own_dev;
    void *kc16, *vc16; /* compressed keys / values in the input type, padded to dqkp / dvp */
    float *sc_rows;    /* SCORES_TOPN whose rows do not fit in shared memory: f32 [rows, Hkv, max_ns] */
    ScoreChunk *sc_chunks; /* and when [T, Hkv, max_ns] exceeds score_rows_max: the chunks (host) */
    int64_t n_sc_chunks;   /* 0: one pass over p->tiles, rows = T */
    int64_t *sc_tiles_dev; /* the chunks' tiles, chunk after chunk, heavy first within each */
    SlcMap slc_map;    /* the inverse map's memory: training plans (all tokens), slc_sm80_blk (a pass's) */
    int64_t blk_pass;  /* slc_sm80_blk: tokens per pass */
    void *blk_o;           /* and one pass's partial states: o_s / l_s in the 16-bit dtype */
    float *blk_ml;         /* and their (m, l) */
    BwdTiles bwd;      /* training plans on bwd_attn_sm80: its work lists (on the device) */
    /* bf16 training plans on bwd_attn_sm80: the keys kernels' f16 copies (bwd_f16.cu) of q
     * [T, Hq, dq8], dO [T, Hq, dv8] and a branch's keys / values (k16, v16: [T, Hkv, dq8 / dv8],
     * or the compressed rows [total_cmp, Hkv, dqkp / dvp]), and their scale block */
    void *q16, *o16, *k16, *v16;
    F16Scale *f16s;
    int dq8, dv8;
    int64_t *bwd_dev[4]; /* their lists: rows tiles, compressed and window key items, compressed reduce items */
    size_t bytes;        /* all of the above (nsa_plan_info.backend_bytes) */
    bool has_slc_map;
    struct CudaDec *dec; /* decode plans: cuda_decode.cu's memory */
};

int cu_supports(void *bctx, nsa_stage stage, const nsa_config *cfg);
nsa_status cu_plan_prepare(void *bctx, nsa_bk_plan *plan);
void cu_plan_release(void *bctx, nsa_bk_plan *plan);
nsa_status cu_stage_kernel(void *bctx, const nsa_bk_plan *plan, nsa_stage stage, char *name, size_t size);
nsa_status cu_run(void *bctx, nsa_stage stage, const nsa_bk_args *args);

/* cuda_decode.cu: decode plans (semantics 10) */
nsa_status decode_prepare(CudaCtx *c, nsa_bk_plan *plan, CudaPlan *p);
void decode_release(CudaPlan *p);
void decode_describe(const CudaPlan *p, nsa_stage stage, char *buf, size_t size);
nsa_status decode_run(CudaCtx *c, const CudaPlan *p, nsa_stage stage, const nsa_bk_args *a);
nsa_status cu_decode_status(void *bctx, const nsa_bk_plan *plan);

} // namespace nsa_cuda

#endif
