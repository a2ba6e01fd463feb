/*
 * cuda_backend.cu -- the CUDA backend module (libnsa_backend_cuda.so): probe,
 * device and stream handling, buffers and the vtable. The kernel chooser is
 * choose.cc, plan preparation cuda_plan.cu, the stage dispatch cuda_run.cu;
 * the kernels live in kernels/cuda (launchers in nsa_cuda_kernels.h).
 * docs/cuda.md describes the design.
 *
 * The CUDA runtime is linked statically, so the module loads on machines
 * without a driver; probe() then says why no device is usable.
 *
 * Environment (read once per context, in cu_context_create):
 *   NSA_CUDA_TARGET   sm80 | sm86 | sm89 | sm90: plan as that device class
 *                     (its kernels, its shared-memory limits and per-SM
 *                     occupancy) on a device that can stand in for it.
 *   NSA_CUDA_FORCE    ref | stage:kernel,...: force kernels (choose.h).
 *   NSA_CUDA_PROFILE  1: per-stage times and kernels on stderr.
 *   NSA_CUDA_SCORE_ROWS_MAX, NSA_CUDA_SLC_PASS_MAX  bytes: plan-memory bounds
 *                     (score rows of an unfused SCORES_TOPN; slc_sm80_blk's states per pass).
 *   NSA_CUDA_SLC_COMBINE  0 | 1 | auto: the core's fused SLC_COMBINE never, wherever
 *                     the selected branch is on, or (auto) where the selected kernel
 *                     is not slc_sm80_g16 (offers_slc_combine, choose.h).
 * Any other NSA_CUDA_* variable is refused with a message: the kernel
 * switches of earlier versions are gone, and a script that still sets one
 * would otherwise measure something other than it says.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_internal.h"
#include "decode.h"

extern char **environ;

namespace nsa_cuda {

const nsa_host_api *g_host;

nsa_status cuda_fail(cudaError_t e, const char *what)
{
    return FAIL(e == cudaErrorMemoryAllocation ? NSA_ERR_OUT_OF_MEMORY : NSA_ERR_DEVICE, "cuda backend: %s: %s (%s)",
                what, cudaGetErrorName(e), cudaGetErrorString(e));
}

} // namespace nsa_cuda

using namespace nsa_cuda;

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

/* A positive byte count from the environment variable name, if set; false
 * (with the message set) when it is not one. */
static bool env_bytes(const char *name, int64_t *out)
{
    const char *s = getenv(name);
    if (!s || !*s) return true;
    char *end = NULL;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (errno || *end || v < 1) {
        FAIL(NSA_ERR_INVALID_VALUE, "cuda backend: %s=\"%s\" is not a positive number of bytes", name, s);
        return false;
    }
    *out = v;
    return true;
}

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
    /* no NSA_CUDA_* variable but the six this version reads */
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "NSA_CUDA_", 9) != 0) continue;
        const char *eq = strchr(*e, '=');
        const size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        const char *known[] = {"NSA_CUDA_TARGET", "NSA_CUDA_FORCE", "NSA_CUDA_PROFILE", "NSA_CUDA_SCORE_ROWS_MAX",
                               "NSA_CUDA_SLC_PASS_MAX", "NSA_CUDA_SLC_COMBINE"};
        bool ok = false;
        for (const char *k : known) ok = ok || (strlen(k) == len && strncmp(*e, k, len) == 0);
        if (!ok)
            return FAIL(NSA_ERR_INVALID_VALUE,
                        "cuda backend: the environment sets %.*s, which this version does not read (its variables are "
                        "NSA_CUDA_TARGET, NSA_CUDA_FORCE, NSA_CUDA_PROFILE, NSA_CUDA_SCORE_ROWS_MAX, NSA_CUDA_SLC_PASS_MAX and "
                        "NSA_CUDA_SLC_COMBINE; kernel switches of earlier versions "
                        "are gone: NSA_CUDA_FORCE=stage:kernel forces a kernel, docs/cuda.md); unset it",
                        (int)len, *e);
    }
    int optin = 0, per_sm = 0, reserved = 0;
    CU(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
    CU(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device), "cudaDeviceGetAttribute");
    CU(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device), "cudaDeviceGetAttribute");
    const Cls dcls = device_class(p.major, p.minor, optin, p.major == 9 && sm90a_available());
    Limits lim = {dcls, optin, per_sm};
    char msg[512];
    const char *tv = getenv("NSA_CUDA_TARGET");
    Cls tcls = dcls;
    if (tv && *tv && !parse_target(tv, dcls, &tcls, msg, sizeof msg))
        return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: device %d (%s, sm_%d%d): %s", device, p.name, p.major,
                    p.minor, msg);
    const bool emulate = tcls != dcls;
    if (emulate) lim = class_limits(tcls);
    Force force;
    if (!parse_force(getenv("NSA_CUDA_FORCE"), &force, msg, sizeof msg))
        return FAIL(NSA_ERR_INVALID_VALUE, "cuda backend: %s", msg);

    int64_t score_rows_max = (int64_t)1 << 30, slc_pass_max = SBK_PASS_BYTES;
    if (!env_bytes("NSA_CUDA_SCORE_ROWS_MAX", &score_rows_max) || !env_bytes("NSA_CUDA_SLC_PASS_MAX", &slc_pass_max))
        return NSA_ERR_INVALID_VALUE;

    int slc_combine = -1;
    const char *sc = getenv("NSA_CUDA_SLC_COMBINE");
    if (sc && *sc && strcmp(sc, "auto") != 0) {
        if (strcmp(sc, "0") != 0 && strcmp(sc, "1") != 0)
            return FAIL(NSA_ERR_INVALID_VALUE, "cuda backend: NSA_CUDA_SLC_COMBINE = '%.40s': it takes 0 (the plain "
                        "selected stage), 1 (fused wherever the selected branch is on) or auto", sc);
        slc_combine = sc[0] - '0';
    }

    CudaCtx *c = (CudaCtx *)calloc(1, sizeof *c);
    if (!c) return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: cannot allocate a context");
    c->slc_combine = slc_combine;
    c->score_rows_max = score_rows_max;
    c->slc_pass_max = slc_pass_max;
    c->device = device;
    c->device_cls = dcls;
    c->lim = lim;
    c->dev = Dev{lim.smem_sm, per_sm, reserved, emulate};
    c->pdl = dec_pdl_available(p.major);
    c->force = force;
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
    cu_stage_kernel,
    cu_decode_status,
    0, /* shards: the kernels take query rows as positions of their own keys (no shard plans yet) */
};

extern "C" NSA_BACKEND_EXPORT const int nsa_backend_api_version = NSA_BACKEND_API_VERSION;

extern "C" NSA_BACKEND_EXPORT const nsa_backend *nsa_backend_entry(const nsa_host_api *host)
{
    g_host = host;
    return &g_backend;
}
