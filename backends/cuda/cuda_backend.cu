/*
 * cuda_backend.cu -- the CUDA backend module (libnsa_backend_cuda.so): device
 * and stream handling, buffers, per-plan preparation and the stage dispatch.
 * The kernels live in kernels/cuda (launchers in nsa_cuda_kernels.h).
 *
 * The CUDA runtime is linked statically, so the module loads on machines
 * without a driver; probe() then says why no device is usable.
 *
 * Kernel choice per plan: f16/bf16 with Dqk, Dv <= 256 run the tensor-core
 * kernels (attn_tc, scores_tc, slc_tc); f32, wider heads, or the environment
 * variable NSA_CUDA_KERNELS=ref run the reference kernels (attn_ref,
 * scores_ref). Compression, top-n and combine have one version each.
 *
 * v3 (default; NSA_CUDA_V3=0 restores the v2.2 stage list): supports() offers
 * the fused SCORES_TOPN stage on the tensor-core path (G <= 128): the block
 * scores stay in shared memory and are ranked there (scores_topn_tc). Where a
 * plan's score rows do not fit in shared memory, plan_prepare allocates a
 * private scores buffer and the stage runs scores_tc + select_topn on it.
 *
 * Memory outside the workspace, allocated once per plan in plan_prepare (never
 * in run()): the tile list of the tiled kernels, and for the tensor-core path a
 * copy of the compressed keys/values in the input type, zero padded to the
 * padded head dims (total_cmp * Hkv * (Dqk' + Dv') * 2 bytes).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include <cuda_runtime.h>

#include "backend.h"
#include "nsa_cuda_kernels.h"

using namespace nsa_cuda;

static const nsa_host_api *g_host;

#define FAIL(status, ...) g_host->set_error(status, __VA_ARGS__)

static nsa_status cuda_fail(cudaError_t e, const char *what)
{
    return FAIL(e == cudaErrorMemoryAllocation ? NSA_ERR_OUT_OF_MEMORY : NSA_ERR_DEVICE, "cuda backend: %s: %s (%s)",
                what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define CU(call, what)                                                                                         \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) return cuda_fail(e_, what);                                                     \
    } while (0)

struct CudaCtx {
    int device;
    cudaStream_t stream;
    bool own_stream;
    bool force_ref;
    bool v3;             /* NSA_CUDA_V3 (default 1): fused SCORES_TOPN */
    bool fuse_combine;   /* NSA_CUDA_FUSE_COMBINE (default 1): COMBINE in the window epilogue */
    int attn_var;        /* NSA_CUDA_ATTN_VAR: attn_tc tile variant (attn_tc.cu AttnCfg) */
    int slc_kernel;      /* NSA_CUDA_SLC: 0 auto, 1 tc, 2 mt, 3 fs, 4 fsp, 5 fsp3 (slc_fs with panel rows, three
                          * chunk buffers per warp for fsp3: Geom::slc_panel)
                          * (slc_tc.cu, slc_mt.cu, slc_fs.cu); auto: fs where it
                          * runs on an sm_90 device (measured there, v7; as fsp3 since v8), else mt for
                          * Dqk' = 192, else tc */
    bool slc_fs_auto;    /* auto picks slc_fs (sm_90: the only device it was measured on) */
    bool scores_lean;    /* NSA_CUDA_SCORES_LEAN (default 1): scores_tc's LEAN kernels for G = 16 */
    bool tma;            /* NSA_CUDA_TMA: K / V tiles of the wgmma kernels through the TMA (v8), Geom::tma */
    int scores_wt;       /* NSA_CUDA_SCORES_WT: the transposed wgmma scores kernel (v6), Geom::scores_wt */
    bool topn_rounds;    /* NSA_CUDA_TOPN=rounds: the top-n ranking by n rounds (v5), not by filtering (v6) */
    int wgmma;           /* wgmma kernels (sm_90a): bit 0 cmp_attn, 1 scores, 2 win_attn (NSA_CUDA_WGMMA) */
    int wg_bn;           /* attn_wg loop, Geom::wg_bn (NSA_CUDA_WG_BN=128|64|pipe|x2|x1; unset: -1, per branch) */
    int wg_cmp;          /* the compressed branch's attn_wg loop alone (NSA_CUDA_WG_CMP, same values), Geom::wg_cmp */
    int64_t smem_optin;  /* dynamic shared memory a kernel may opt in to (bytes) */
    unsigned ref_stages; /* bit per stage: run the reference kernel there */
    /* NSA_CUDA_PROFILE=1: events around every stage; after COMBINE the forward
     * waits for its stream and prints the stage times to stderr (debugging
     * only: this synchronizes). */
    bool profile;
    cudaEvent_t ev[2 * NSA_STAGE_COUNT];
    bool ev_used[NSA_STAGE_COUNT];
};

struct CudaBuf {
    char *ptr;
    size_t bytes;
    bool owned;
};

struct CudaPlan {
    bool fast;      /* tensor-core kernels */
    int dqkp, dvp;  /* padded head dims of the tensor-core kernels */
    Tiles tiles;    /* tile list of attn_tc / scores_tc (device) */
    int64_t *tiles_dev;
    void *kc16, *vc16; /* packed 16-bit compressed keys / values */
    float *sc_scratch; /* v3 SCORES_TOPN when the rows do not fit in shared memory: f32 [T, Hkv, max_ns] */
};

/* ------------------------------------------------------------------ probe */

static nsa_status cu_probe(int *device_count, char *reason, size_t reason_size)
{
    *device_count = 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(reason, reason_size, "no NVIDIA driver (libcuda.so.1 not found)");
        return NSA_ERR_BACKEND_UNAVAILABLE;
    }
    dlclose(h);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver) {
        int rt = 0, drv = 0;
        cudaRuntimeGetVersion(&rt);
        cudaDriverGetVersion(&drv);
        snprintf(reason, reason_size,
                 "the NVIDIA driver (CUDA %d.%d) is older than this module's CUDA runtime %d.%d "
                 "(cudaErrorInsufficientDriver)",
                 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
        return NSA_ERR_BACKEND_UNAVAILABLE;
    }
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
        snprintf(reason, reason_size, "no CUDA device found (the driver is present)");
        return NSA_ERR_BACKEND_UNAVAILABLE;
    }
    if (e != cudaSuccess) {
        snprintf(reason, reason_size, "cudaGetDeviceCount failed: %s (%s)", cudaGetErrorName(e),
                 cudaGetErrorString(e));
        return NSA_ERR_BACKEND_UNAVAILABLE;
    }
    *device_count = n;
    snprintf(reason, reason_size, "%d CUDA device%s", n, n == 1 ? "" : "s");
    return NSA_SUCCESS;
}

static nsa_status cu_device_name(int index, char *name, size_t size)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || index < 0 || index >= n)
        return FAIL(NSA_ERR_DEVICE_NOT_FOUND, "cuda backend: no device %d (%d present)", index, n);
    cudaDeviceProp p;
    CU(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties");
    snprintf(name, size, "%s", p.name);
    return NSA_SUCCESS;
}

/* ------------------------------------------------------------------ contexts */

static nsa_status cu_context_create(int device, void *native_stream, void **bctx)
{
    int n = 0;
    CU(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    if (device < 0 || device >= n)
        return FAIL(NSA_ERR_DEVICE_NOT_FOUND, "cuda backend: no device %d (%d present)", device, n);
    cudaDeviceProp p;
    CU(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
    if (p.major < 8)
        return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: device %d (%s) is sm_%d%d; this module needs sm_80 or newer",
                    device, p.name, p.major, p.minor);
    CU(cudaSetDevice(device), "cudaSetDevice");
    CudaCtx *c = (CudaCtx *)calloc(1, sizeof *c);
    if (!c) return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: cannot allocate a context");
    c->device = device;
    const char *k = getenv("NSA_CUDA_KERNELS");
    c->force_ref = k && strcmp(k, "ref") == 0;
    /* kernel switches: each is on unless its variable is "0" (NOTES.md, v4) */
    auto on = [](const char *name) {
        const char *e = getenv(name);
        return !(e && strcmp(e, "0") == 0);
    };
    c->v3 = on("NSA_CUDA_V3");
    c->fuse_combine = on("NSA_CUDA_FUSE_COMBINE");
    c->attn_var = on("NSA_CUDA_ATTN_VAR") ? 1 : 0;
    c->scores_lean = on("NSA_CUDA_SCORES_LEAN");
    c->tma = on("NSA_CUDA_TMA");
    const char *sw = getenv("NSA_CUDA_SCORES_WT");
    c->scores_wt = !sw ? 2 : strcmp(sw, "0") == 0 ? 0 : strcmp(sw, "128") == 0 ? 1 : 2;
    const char *tn = getenv("NSA_CUDA_TOPN");
    c->topn_rounds = tn && strcmp(tn, "rounds") == 0;
    /* NSA_CUDA_WGMMA unset or all: compressed, scores and window; 0: none;
     * cmp / scores / win: that one; nowin: cmp + scores (the v5 default).
     * The probe runs only on sm_90 devices, the ones the module's sm_90a code
     * can run on. */
    const char *wv = getenv("NSA_CUDA_WGMMA");
    c->wgmma = !(wv && strcmp(wv, "0") == 0) && p.major == 9 && attn_wg_available()
                   ? (!wv                          ? 7
                      : strcmp(wv, "cmp") == 0    ? 1
                      : strcmp(wv, "scores") == 0 ? 2
                      : strcmp(wv, "win") == 0    ? 4
                      : strcmp(wv, "nowin") == 0  ? 3
                                                  : 7)
                   : 0;
    auto wg_loop = [](const char *w) {
        return !w                      ? -1
               : strcmp(w, "128") == 0  ? 128
               : strcmp(w, "64") == 0   ? 64
               : strcmp(w, "pipe") == 0 ? 0
               : strcmp(w, "x2") == 0   ? 2
               : strcmp(w, "x1") == 0   ? 1
                                        : -1;
    };
    c->wg_bn = wg_loop(getenv("NSA_CUDA_WG_BN"));
    c->wg_cmp = wg_loop(getenv("NSA_CUDA_WG_CMP"));
    const char *sv = getenv("NSA_CUDA_SLC");
    c->slc_kernel = !sv                      ? 0
                    : strcmp(sv, "tc") == 0 ? 1
                    : strcmp(sv, "mt") == 0 ? 2
                    : strcmp(sv, "fs") == 0 ? 3
                    : strcmp(sv, "fsp") == 0 ? 4
                    : strcmp(sv, "fsp3") == 0 ? 5
                                              : 0;
    c->slc_fs_auto = p.major == 9;
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        cudaGetLastError();
        optin = 0;
    }
    c->smem_optin = (int64_t)optin - 4096; /* margin for the kernels' static shared memory (scores_tc: 2.9 KB) */
    /* NSA_CUDA_REF=cmp_attn,win_attn,...: reference kernels for those stages only
     * (bisecting a tensor-core kernel against its reference) */
    const char *rs = getenv("NSA_CUDA_REF");
    for (int i = 0; rs && i < NSA_STAGE_COUNT; i++)
        if (strstr(rs, nsa_stage_name((nsa_stage)i))) c->ref_stages |= 1u << i;
    const char *prof = getenv("NSA_CUDA_PROFILE");
    if (prof && *prof && strcmp(prof, "0") != 0) {
        c->profile = true;
        for (int i = 0; i < 2 * NSA_STAGE_COUNT && c->profile; i++)
            if (cudaEventCreate(&c->ev[i]) != cudaSuccess) c->profile = false;
    }
    if (native_stream) {
        c->stream = (cudaStream_t)native_stream;
    } else {
        cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            free(c);
            return cuda_fail(e, "cudaStreamCreateWithFlags");
        }
        c->own_stream = true;
    }
    *bctx = c;
    return NSA_SUCCESS;
}

static void cu_context_destroy(void *bctx)
{
    CudaCtx *c = (CudaCtx *)bctx;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->own_stream) {
        cudaStreamSynchronize(c->stream);
        cudaStreamDestroy(c->stream);
    }
    if (c->profile)
        for (int i = 0; i < 2 * NSA_STAGE_COUNT; i++) cudaEventDestroy(c->ev[i]);
    free(c);
}

static nsa_status cu_synchronize(void *bctx)
{
    CudaCtx *c = (CudaCtx *)bctx;
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    CU(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    return NSA_SUCCESS;
}

/* ------------------------------------------------------------------ buffers */

static nsa_status cu_buffer_alloc(void *bctx, size_t bytes, void **bbuf)
{
    CudaCtx *c = (CudaCtx *)bctx;
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    CudaBuf *b = (CudaBuf *)calloc(1, sizeof *b);
    if (!b) return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: cannot allocate a buffer record");
    if (bytes > 0) {
        cudaError_t e = cudaMalloc((void **)&b->ptr, bytes);
        if (e != cudaSuccess) {
            free(b);
            cudaGetLastError(); /* clear the sticky-free allocation error */
            return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: cudaMalloc of %zu bytes failed: %s", bytes,
                        cudaGetErrorString(e));
        }
    }
    b->bytes = bytes;
    b->owned = true;
    *bbuf = b;
    return NSA_SUCCESS;
}

static nsa_status cu_buffer_wrap(void *bctx, void *handle, size_t offset, size_t bytes, void **bbuf)
{
    CudaCtx *c = (CudaCtx *)bctx;
    if (!handle) return FAIL(NSA_ERR_NULL_POINTER, "cuda backend: cannot wrap a NULL device pointer");
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, handle);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return FAIL(NSA_ERR_INVALID_VALUE, "cuda backend: %p is not a pointer CUDA knows: %s", handle,
                    cudaGetErrorString(e));
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return FAIL(NSA_ERR_INVALID_VALUE,
                    "cuda backend: %p is not device memory (nsa_buffer_wrap takes a cudaMalloc'ed pointer)", handle);
    CudaBuf *b = (CudaBuf *)calloc(1, sizeof *b);
    if (!b) return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: cannot allocate a buffer record");
    b->ptr = (char *)handle + offset;
    b->bytes = bytes;
    b->owned = false;
    *bbuf = b;
    return NSA_SUCCESS;
}

static void cu_buffer_free(void *bctx, void *bbuf)
{
    CudaCtx *c = (CudaCtx *)bctx;
    CudaBuf *b = (CudaBuf *)bbuf;
    if (!b) return;
    if (b->owned && b->ptr) {
        cudaSetDevice(c->device);
        cudaFree(b->ptr);
    }
    free(b);
}

static nsa_status range_check(const CudaBuf *b, size_t offset, size_t bytes, const char *what)
{
    if (offset > b->bytes || bytes > b->bytes - offset)
        return FAIL(NSA_ERR_BUFFER_TOO_SMALL, "cuda backend: %s of %zu bytes at offset %zu passes the end of a %zu-byte buffer",
                    what, bytes, offset, b->bytes);
    return NSA_SUCCESS;
}

static nsa_status cu_buffer_write(void *bctx, void *bbuf, size_t offset, const void *src, size_t bytes)
{
    CudaCtx *c = (CudaCtx *)bctx;
    CudaBuf *b = (CudaBuf *)bbuf;
    nsa_status s = range_check(b, offset, bytes, "write");
    if (s || bytes == 0) return s;
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    CU(cudaMemcpyAsync(b->ptr + offset, src, bytes, cudaMemcpyHostToDevice, c->stream), "cudaMemcpyAsync (write)");
    CU(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize (write)");
    return NSA_SUCCESS;
}

static nsa_status cu_buffer_read(void *bctx, void *bbuf, size_t offset, void *dst, size_t bytes)
{
    CudaCtx *c = (CudaCtx *)bctx;
    CudaBuf *b = (CudaBuf *)bbuf;
    nsa_status s = range_check(b, offset, bytes, "read");
    if (s || bytes == 0) return s;
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    CU(cudaMemcpyAsync(dst, b->ptr + offset, bytes, cudaMemcpyDeviceToHost, c->stream), "cudaMemcpyAsync (read)");
    CU(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize (read)");
    return NSA_SUCCESS;
}

static nsa_status cu_buffer_fill(void *bctx, void *bbuf, size_t offset, unsigned char value, size_t bytes)
{
    CudaCtx *c = (CudaCtx *)bctx;
    CudaBuf *b = (CudaBuf *)bbuf;
    nsa_status s = range_check(b, offset, bytes, "fill");
    if (s || bytes == 0) return s;
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    CU(cudaMemsetAsync(b->ptr + offset, value, bytes, c->stream), "cudaMemsetAsync");
    CU(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize (fill)");
    return NSA_SUCCESS;
}

/* ------------------------------------------------------------------ plans */

/* Will plans of this config on this context run the fused SCORES_TOPN stage?
 * (v3 on, tensor-core path, one head chunk per KV group, and no reference
 * kernel asked for any part of the selection.) */
/* The tensor-core kernels' shared memory fits this device (a plan whose
 * kernels do not fit runs the reference kernels: A100 and sm_86/89 have less
 * opt-in shared memory than Hopper). */
static bool tc_fits(const CudaCtx *c, const nsa_config *cfg)
{
    int dqkp = 0, dvp = 0;
    tc_dims(cfg->head_dim_qk, cfg->head_dim_v, &dqkp, &dvp);
    if (dqkp <= 0) return false;
    size_t need = attn_tc_smem(dqkp, dvp, 0);
    need = std::max(need, attn_tc_smem(dqkp, dvp, 2));
    need = std::max(need, scores_tc_smem(dqkp));
    if (cfg->num_selected > 0) need = std::max(need, slc_tc_smem(dqkp, dvp, cfg->num_selected, cfg->slc_block));
    return (int64_t)need <= c->smem_optin;
}

static bool fused_topn(const CudaCtx *c, const nsa_config *cfg)
{
    const unsigned sel = (1u << NSA_STAGE_BLOCK_SCORES) | (1u << NSA_STAGE_SELECT_TOPN) | (1u << NSA_STAGE_SCORES_TOPN);
    int dqkp = 0, dvp = 0;
    tc_dims(cfg->head_dim_qk, cfg->head_dim_v, &dqkp, &dvp);
    return c && c->v3 && !c->force_ref && !(c->ref_stages & sel) && cfg->dtype != NSA_DTYPE_F32 && dqkp > 0 &&
           cfg->num_kv_heads > 0 && cfg->num_q_heads / cfg->num_kv_heads <= 128 && tc_fits(c, cfg);
}

static int cu_supports(void *bctx, nsa_stage stage, const nsa_config *cfg)
{
    if (stage == NSA_STAGE_SCORES_TOPN) return fused_topn((const CudaCtx *)bctx, cfg) ? 1 : 0;
    return stage >= NSA_STAGE_COMPRESS && stage <= NSA_STAGE_COMBINE;
}

static void cu_plan_release(void *bctx, nsa_bk_plan *plan)
{
    CudaCtx *c = (CudaCtx *)bctx;
    CudaPlan *p = (CudaPlan *)plan->backend_plan;
    if (!p) return;
    cudaSetDevice(c->device);
    if (p->tiles_dev) cudaFree(p->tiles_dev);
    if (p->kc16) cudaFree(p->kc16);
    if (p->vc16) cudaFree(p->vc16);
    if (p->sc_scratch) cudaFree(p->sc_scratch);
    free(p);
    plan->backend_plan = NULL;
}

static nsa_status cu_plan_prepare(void *bctx, nsa_bk_plan *plan)
{
    CudaCtx *c = (CudaCtx *)bctx;
    const nsa_config *cfg = &plan->cfg;
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    CudaPlan *p = (CudaPlan *)calloc(1, sizeof *p);
    if (!p) return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: cannot allocate a plan record");
    plan->backend_plan = p;
    tc_dims(cfg->head_dim_qk, cfg->head_dim_v, &p->dqkp, &p->dvp);
    p->fast = !c->force_ref && cfg->dtype != NSA_DTYPE_F32 && p->dqkp > 0 && tc_fits(c, cfg);
    if (!p->fast) return NSA_SUCCESS;

    /* tiles of qt tokens x hc heads (128 rows), heavy (late) tiles first */
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    const int hc = (int)(G < 128 ? G : 128);
    const int qt = 128 / hc;
    std::vector<int64_t> t;
    try {
        for (int64_t b = 0; b < plan->batch; b++) {
            const int64_t s0 = plan->cu_seqlens[b], len = plan->cu_seqlens[b + 1] - s0;
            for (int64_t lt = 0; lt < len; lt += qt) {
                t.push_back(s0 + lt);
                t.push_back(std::min<int64_t>(qt, len - lt));
                t.push_back(b);
            }
        }
    } catch (...) {
        cu_plan_release(bctx, plan);
        return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory for the tile list");
    }
    const int64_t count = (int64_t)t.size() / 3;
    std::vector<int64_t> order(count), sorted(t.size());
    for (int64_t i = 0; i < count; i++) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return t[3 * a] - plan->cu_seqlens[t[3 * a + 2]] > t[3 * b] - plan->cu_seqlens[t[3 * b + 2]];
    });
    for (int64_t i = 0; i < count; i++)
        for (int k = 0; k < 3; k++) sorted[3 * i + k] = t[3 * order[i] + k];
    cudaError_t e = cudaSuccess;
    if (count > 0) {
        e = cudaMalloc((void **)&p->tiles_dev, sorted.size() * sizeof(int64_t));
        if (e == cudaSuccess)
            e = cudaMemcpy(p->tiles_dev, sorted.data(), sorted.size() * sizeof(int64_t), cudaMemcpyHostToDevice);
    }
    const size_t rows = (size_t)plan->total_cmp * (size_t)cfg->num_kv_heads;
    if (e == cudaSuccess && rows > 0) {
        e = cudaMalloc(&p->kc16, rows * p->dqkp * 2);
        if (e == cudaSuccess) e = cudaMalloc(&p->vc16, rows * p->dvp * 2);
    }
    /* v3 SCORES_TOPN whose score rows do not fit in shared memory: a private
     * scores buffer (the bytes the core reserves for the unfused stages) */
    if (e == cudaSuccess && fused_topn(c, cfg) && cfg->num_selected > 0 && plan->total_tokens > 0 &&
        !scores_topn_fits(p->dqkp, qt, plan->max_ns, c->smem_optin)) {
        const size_t bytes = (size_t)plan->total_tokens * (size_t)cfg->num_kv_heads * (size_t)plan->max_ns * 4;
        e = cudaMalloc((void **)&p->sc_scratch, bytes);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        cu_plan_release(bctx, plan);
        return cuda_fail(e, "plan_prepare (tile list / packed compressed rows / scores)");
    }
    p->tiles.tiles = p->tiles_dev;
    p->tiles.count = count;
    p->tiles.qt = qt;
    p->tiles.hc = hc;
    p->tiles.nchunk = (int)((G + hc - 1) / hc);
    return NSA_SUCCESS;
}

/* ------------------------------------------------------------------ run */

static size_t esize(nsa_dtype d) { return d == NSA_DTYPE_F16 || d == NSA_DTYPE_BF16 ? 2 : 4; }

static View view(const nsa_bk_tensor &t)
{
    View v = {NULL, t.stride_token, t.stride_head};
    if (t.buf) v.p = ((CudaBuf *)t.buf)->ptr + (size_t)t.offset * esize(t.dtype);
    return v;
}
static MView mview(const nsa_bk_tensor &t)
{
    MView v = {NULL, t.stride_token, t.stride_head};
    if (t.buf) v.p = ((CudaBuf *)t.buf)->ptr + (size_t)t.offset * esize(t.dtype);
    return v;
}

static Geom geom(const nsa_bk_plan *pl)
{
    const nsa_config &c = pl->cfg;
    Geom g = {};
    g.T = pl->total_tokens;
    g.B = pl->batch;
    g.Hq = c.num_q_heads;
    g.Hkv = c.num_kv_heads;
    g.G = c.num_q_heads / c.num_kv_heads;
    g.Dqk = c.head_dim_qk;
    g.Dv = c.head_dim_v;
    g.l = c.cmp_block;
    g.d = c.cmp_stride;
    g.ls = c.slc_block;
    g.n = c.num_selected;
    g.n_init = c.num_init;
    g.n_local = c.num_local;
    g.w = c.window;
    g.total_cmp = pl->total_cmp;
    g.max_ns = pl->max_ns;
    g.scale = c.scale;
    g.dtype = (int)c.dtype;
    g.v3 = 0;
    const int64_t *tab = (const int64_t *)((CudaBuf *)pl->dev_tables)->ptr;
    g.cu_seqlens = tab + pl->dev_cu_seqlens;
    g.cu_cmp = tab + pl->dev_cu_cmp;
    g.tok_seq = tab + pl->dev_tok_seq;
    return g;
}

static nsa_status need(const nsa_bk_tensor &t, nsa_stage st, const char *name)
{
    if (t.buf) return NSA_SUCCESS;
    return FAIL(NSA_ERR_MISSING_TENSOR, "cuda backend: stage %s needs tensor %s, which is absent", nsa_stage_name(st),
                name);
}

#define NEED(t, name)                                                                                          \
    do {                                                                                                       \
        nsa_status s_ = need(t, stage, name);                                                                  \
        if (s_) return s_;                                                                                     \
    } while (0)

/* Does WIN_ATTN write the final o itself (COMBINE folded into its epilogue)?
 * Both stages ask, with the same arguments, so they agree: tensor-core path
 * for both stages, the window branch on, o given, and every enabled branch's
 * gate present (else COMBINE runs and reports the missing gate). */
static bool win_combines(const CudaCtx *c, const CudaPlan *p, const nsa_bk_args *a)
{
    const unsigned both = (1u << NSA_STAGE_WIN_ATTN) | (1u << NSA_STAGE_COMBINE);
    if (!c->fuse_combine || !p->fast || (c->ref_stages & both) || !a->o.buf || !a->o_b[NSA_BRANCH_WIN].buf)
        return false;
    for (int b = 0; b < 3; b++)
        if (a->o_b[b].buf && !a->gate[b].buf) return false;
    return true;
}

static nsa_status cu_run(void *bctx, nsa_stage stage, const nsa_bk_args *a)
{
    CudaCtx *c = (CudaCtx *)bctx;
    if (!c || !a || !a->plan) return FAIL(NSA_ERR_INTERNAL, "cuda backend: run() without a context, arguments or plan");
    const nsa_bk_plan *pl = a->plan;
    const CudaPlan *p = (const CudaPlan *)pl->backend_plan;
    if (!p || !pl->dev_tables) return FAIL(NSA_ERR_INTERNAL, "cuda backend: plan was not prepared");
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    Geom g = geom(pl);
    g.v3 = c->v3 ? 1 : 0;
    g.smem_optin = c->smem_optin;
    g.attn_var = c->attn_var;
    g.scores_lean = c->scores_lean ? 1 : 0;
    g.scores_wt = c->scores_wt;
    g.topn_rounds = c->topn_rounds ? 1 : 0;
    /* auto on sm_90: slc_fs with panel rows and three chunk buffers where they fit (fsp3, v8: 19.3 -> 14.9 ms at
     * 64k, D 128); NSA_CUDA_SLC=fs keeps v7's padded rows */
    g.slc_panel = c->slc_kernel == 4 ? 1 : c->slc_kernel == 5 || (c->slc_kernel == 0 && c->slc_fs_auto) ? 2 : 0;
    g.wgmma = c->wgmma;
    g.wg_bn = c->wg_bn;
    g.wg_cmp = c->wg_cmp;
    g.tma = c->tma ? 1 : 0;
    const cudaStream_t s = c->stream;
    const View none = {NULL, 0, 0};
    cudaError_t e = cudaSuccess;
    const View kc16 = {p->kc16, g.Hkv * p->dqkp, p->dqkp}, vc16 = {p->vc16, g.Hkv * p->dvp, p->dvp};
    const bool fast = p->fast && !(c->ref_stages & (1u << stage));
    const bool prof = c->profile && stage >= 0 && stage < NSA_STAGE_COUNT;
    if (prof) cudaEventRecord(c->ev[2 * stage], s);

    switch (stage) {
    case NSA_STAGE_COMPRESS:
        NEED(a->kc, "kc");
        NEED(a->vc, "vc");
        if (pl->cfg.compress == NSA_COMPRESS_MEAN) {
            NEED(a->k[NSA_BRANCH_CMP], "k[cmp]");
            NEED(a->v[NSA_BRANCH_CMP], "v[cmp]");
            e = compress_mean(g, view(a->k[NSA_BRANCH_CMP]), g.Dqk, mview(a->kc), s);
            if (e == cudaSuccess) e = compress_mean(g, view(a->v[NSA_BRANCH_CMP]), g.Dv, mview(a->vc), s);
        } else if (pl->cfg.compress == NSA_COMPRESS_LINEAR) {
            NEED(a->k[NSA_BRANCH_CMP], "k[cmp]");
            NEED(a->v[NSA_BRANCH_CMP], "v[cmp]");
            NEED(a->w_k, "w_k");
            NEED(a->w_v, "w_v");
            if (g.Dqk > 1024 || g.Dv > 1024)
                return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: LINEAR compression supports head dims up to 1024");
            e = compress_linear(g, view(a->k[NSA_BRANCH_CMP]), g.Dqk, view(a->w_k).p, view(a->pe_k).p, mview(a->kc), s);
            if (e == cudaSuccess)
                e = compress_linear(g, view(a->v[NSA_BRANCH_CMP]), g.Dv, view(a->w_v).p, view(a->pe_v).p,
                                    mview(a->vc), s);
        } else {
            NEED(a->kc_in, "kc_in");
            NEED(a->vc_in, "vc_in");
            e = compress_copy(g, view(a->kc_in), g.Dqk, mview(a->kc), s);
            if (e == cudaSuccess) e = compress_copy(g, view(a->vc_in), g.Dv, mview(a->vc), s);
        }
        break;
    case NSA_STAGE_CMP_ATTN:
        NEED(a->q, "q");
        NEED(a->o_b[NSA_BRANCH_CMP], "o_b[cmp]");
        NEED(a->lse[NSA_BRANCH_CMP], "lse[cmp]");
        if (g.total_cmp > 0) {
            NEED(a->kc, "kc");
            NEED(a->vc, "vc");
        }
        if (fast) {
            e = pack_cmp16(g, view(a->kc), g.Dqk, p->dqkp, p->kc16, s);
            if (e == cudaSuccess) e = pack_cmp16(g, view(a->vc), g.Dv, p->dvp, p->vc16, s);
            if (e == cudaSuccess)
                e = attn_tc(g, 0, p->tiles, p->dqkp, p->dvp, view(a->q), kc16, vc16,
                            mview(a->o_b[NSA_BRANCH_CMP]), mview(a->lse[NSA_BRANCH_CMP]), s);
        } else {
            e = attn_ref(g, 0, view(a->q), view(a->kc), view(a->vc), none, mview(a->o_b[NSA_BRANCH_CMP]),
                         mview(a->lse[NSA_BRANCH_CMP]), s);
        }
        break;
    case NSA_STAGE_BLOCK_SCORES:
        NEED(a->q, "q");
        NEED(a->lse[NSA_BRANCH_CMP], "lse[cmp]");
        NEED(a->scores, "scores");
        if (g.total_cmp > 0) NEED(a->kc, "kc");
        if (fast && p->tiles.nchunk == 1) {
            e = pack_cmp16(g, view(a->kc), g.Dqk, p->dqkp, p->kc16, s);
            if (e == cudaSuccess)
                e = scores_tc(g, p->tiles, p->dqkp, view(a->q), kc16, view(a->lse[NSA_BRANCH_CMP]),
                              mview(a->scores), s);
        } else {
            e = scores_ref(g, view(a->q), view(a->kc), view(a->lse[NSA_BRANCH_CMP]), mview(a->scores), s);
        }
        break;
    case NSA_STAGE_SCORES_TOPN:
        NEED(a->q, "q");
        NEED(a->lse[NSA_BRANCH_CMP], "lse[cmp]");
        NEED(a->indices, "indices");
        if (g.total_cmp > 0) NEED(a->kc, "kc");
        if (!p->fast || p->tiles.nchunk != 1)
            return FAIL(NSA_ERR_INTERNAL, "cuda backend: stage scores_topn planned without the tensor-core path");
        e = pack_cmp16(g, view(a->kc), g.Dqk, p->dqkp, p->kc16, s);
        if (e == cudaSuccess && p->sc_scratch) {
            const MView sc = {p->sc_scratch, g.Hkv * g.max_ns, g.max_ns};
            const View scv = {p->sc_scratch, g.Hkv * g.max_ns, g.max_ns};
            e = scores_tc(g, p->tiles, p->dqkp, view(a->q), kc16, view(a->lse[NSA_BRANCH_CMP]), sc, s);
            if (e == cudaSuccess) e = select_topn(g, scv, mview(a->indices), s);
        } else if (e == cudaSuccess) {
            e = scores_topn_tc(g, p->tiles, p->dqkp, view(a->q), kc16, view(a->lse[NSA_BRANCH_CMP]),
                               mview(a->indices), s);
        }
        break;
    case NSA_STAGE_SELECT_TOPN:
        NEED(a->scores, "scores");
        NEED(a->indices, "indices");
        e = select_topn(g, view(a->scores), mview(a->indices), s);
        break;
    case NSA_STAGE_SLC_ATTN:
        NEED(a->q, "q");
        NEED(a->k[NSA_BRANCH_SLC], "k[slc]");
        NEED(a->v[NSA_BRANCH_SLC], "v[slc]");
        NEED(a->indices, "indices");
        NEED(a->o_b[NSA_BRANCH_SLC], "o_b[slc]");
        if (fast && (c->slc_kernel >= 3 || (c->slc_kernel == 0 && c->slc_fs_auto)) &&
            slc_fs_ok(g, p->dqkp, p->dvp, view(a->k[NSA_BRANCH_SLC]), view(a->v[NSA_BRANCH_SLC])))
            e = slc_fs(g, p->dqkp, p->dvp, view(a->q), view(a->k[NSA_BRANCH_SLC]), view(a->v[NSA_BRANCH_SLC]),
                       view(a->indices), mview(a->o_b[NSA_BRANCH_SLC]), mview(a->lse[NSA_BRANCH_SLC]), s);
        else if (fast && (c->slc_kernel == 2 || (c->slc_kernel == 0 && p->dqkp == 192)) &&
            slc_mt_ok(g, p->dqkp, p->dvp, view(a->k[NSA_BRANCH_SLC]), view(a->v[NSA_BRANCH_SLC])))
            e = slc_mt(g, p->dqkp, p->dvp, view(a->q), view(a->k[NSA_BRANCH_SLC]), view(a->v[NSA_BRANCH_SLC]),
                       view(a->indices), mview(a->o_b[NSA_BRANCH_SLC]), mview(a->lse[NSA_BRANCH_SLC]), s);
        else if (fast)
            e = slc_tc(g, p->dqkp, p->dvp, view(a->q), view(a->k[NSA_BRANCH_SLC]), view(a->v[NSA_BRANCH_SLC]),
                       view(a->indices), mview(a->o_b[NSA_BRANCH_SLC]), mview(a->lse[NSA_BRANCH_SLC]), s);
        else
            e = attn_ref(g, 1, view(a->q), view(a->k[NSA_BRANCH_SLC]), view(a->v[NSA_BRANCH_SLC]), view(a->indices),
                         mview(a->o_b[NSA_BRANCH_SLC]), mview(a->lse[NSA_BRANCH_SLC]), s);
        break;
    case NSA_STAGE_WIN_ATTN:
        NEED(a->q, "q");
        NEED(a->k[NSA_BRANCH_WIN], "k[win]");
        NEED(a->v[NSA_BRANCH_WIN], "v[win]");
        NEED(a->o_b[NSA_BRANCH_WIN], "o_b[win]");
        if (fast) {
            FuseCombine fz = {};
            if (win_combines(c, p, a)) {
                for (int b = 0; b < 3; b++) fz.gate[b] = a->o_b[b].buf ? view(a->gate[b]) : none;
                fz.ob[0] = view(a->o_b[NSA_BRANCH_CMP]);
                fz.ob[1] = view(a->o_b[NSA_BRANCH_SLC]);
                fz.out = mview(a->o);
            }
            e = attn_tc(g, 2, p->tiles, p->dqkp, p->dvp, view(a->q), view(a->k[NSA_BRANCH_WIN]),
                        view(a->v[NSA_BRANCH_WIN]), mview(a->o_b[NSA_BRANCH_WIN]), mview(a->lse[NSA_BRANCH_WIN]), s,
                        &fz);
        } else
            e = attn_ref(g, 2, view(a->q), view(a->k[NSA_BRANCH_WIN]), view(a->v[NSA_BRANCH_WIN]), none,
                         mview(a->o_b[NSA_BRANCH_WIN]), mview(a->lse[NSA_BRANCH_WIN]), s);
        break;
    case NSA_STAGE_COMBINE: {
        NEED(a->o, "o");
        View gate[3], ob[3];
        for (int b = 0; b < 3; b++) {
            ob[b] = view(a->o_b[b]);
            gate[b] = view(a->gate[b]);
            if (ob[b].p && !gate[b].p)
                return FAIL(NSA_ERR_MISSING_TENSOR, "cuda backend: stage combine: branch %d is on but its gate is absent", b);
        }
        if (!win_combines(c, p, a)) e = combine(g, gate, ob, mview(a->o), s); /* else WIN_ATTN wrote o */
        break;
    }
    default:
        return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: stage %s is not implemented", nsa_stage_name(stage));
    }
    if (e != cudaSuccess) return cuda_fail(e, nsa_stage_name(stage));
    if (prof) {
        cudaEventRecord(c->ev[2 * stage + 1], s);
        c->ev_used[stage] = true;
        if (stage == NSA_STAGE_COMBINE) {
            cudaEventSynchronize(c->ev[2 * stage + 1]);
            fprintf(stderr, "nsa-cuda profile (%s, %s, T=%lld):", p->fast ? "tensor cores" : "reference",
                    c->v3 ? "v3" : "v2.2", (long long)g.T);
            float total = 0.f;
            for (int i = 0; i < NSA_STAGE_COUNT; i++) {
                if (!c->ev_used[i]) continue;
                float ms = 0.f;
                cudaEventElapsedTime(&ms, c->ev[2 * i], c->ev[2 * i + 1]);
                total += ms;
                fprintf(stderr, " %s %.3f", nsa_stage_name((nsa_stage)i), ms);
                c->ev_used[i] = false;
            }
            fprintf(stderr, " | sum %.3f ms\n", total);
        }
    }
    return NSA_SUCCESS;
}

/* ------------------------------------------------------------------ entry */

static nsa_backend g_backend = {
    NSA_BACKEND_API_VERSION,
    "cuda",
    cu_probe,
    cu_device_name,
    cu_context_create,
    cu_context_destroy,
    cu_synchronize,
    cu_buffer_alloc,
    cu_buffer_wrap,
    cu_buffer_free,
    cu_buffer_write,
    cu_buffer_read,
    cu_buffer_fill,
    cu_supports,
    0, /* query_tile: the module makes its own tile list (the shape depends on G) */
    1, /* wants_device_tables */
    cu_plan_prepare,
    cu_plan_release,
    cu_run,
    nullptr, /* device_kind: every device is a GPU */
};

extern "C" NSA_BACKEND_EXPORT const int nsa_backend_api_version = NSA_BACKEND_API_VERSION;

extern "C" NSA_BACKEND_EXPORT const nsa_backend *nsa_backend_entry(const nsa_host_api *host)
{
    g_host = host;
    return &g_backend;
}
