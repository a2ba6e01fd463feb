/*
 * backend.hip -- the HIP (ROCm) backend module for AMD GPUs: entry point,
 * probe, devices, contexts and buffers. The stages are in stages.hip (decode
 * plans in decode_stages.hip), the kernels in kernels/hip.
 *
 * Loads without an AMD driver or GPU: the only non-system library it needs is
 * libamdhip64; probe() then reports NSA_ERR_BACKEND_UNAVAILABLE with the HIP
 * runtime's reason ("no AMD GPU: hipGetDeviceCount: hipErrorNoDevice").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip_backend.h"

const nsa_host_api *nsa_hip_host;

nsa_status nsa_hip_fail(hipError_t e, const char *what)
{
    nsa_status s = (e == hipErrorOutOfMemory || e == hipErrorMemoryAllocation) ? NSA_ERR_OUT_OF_MEMORY
                                                                                : NSA_ERR_DEVICE;
    return nsa_hip_host->set_error(s, "hip backend: %s: %s (%s)", what, hipGetErrorString(e), hipGetErrorName(e));
}

#define HIP_TRY(call, what)                                                                                            \
    do {                                                                                                               \
        hipError_t e_ = (call);                                                                                        \
        if (e_ != hipSuccess) return nsa_hip_fail(e_, what);                                                           \
    } while (0)

/* ---------------------------------------------------------------- devices */

static nsa_status hip_probe(int *device_count, char *reason, size_t reason_size)
{
    int n = 0;
    *device_count = 0;
    hipError_t e = hipGetDeviceCount(&n);
    if (e != hipSuccess || n <= 0) {
        if (e != hipSuccess)
            snprintf(reason, reason_size, "no AMD GPU: hipGetDeviceCount: %s", hipGetErrorString(e));
        else
            snprintf(reason, reason_size, "no AMD GPU: hipGetDeviceCount found 0 devices");
        return nsa_hip_host->set_error(NSA_ERR_BACKEND_UNAVAILABLE, "hip backend: %s", reason);
    }
    int version = 0;
    if (hipRuntimeGetVersion(&version) != hipSuccess) version = 0;
    snprintf(reason, reason_size, "%d AMD GPU(s), HIP runtime %d", n, version);
    *device_count = n;
    return NSA_SUCCESS;
}

static nsa_status hip_device_name(int index, char *name, size_t size)
{
    hipDeviceProp_t p;
    HIP_TRY(hipGetDeviceProperties(&p, index), "hipGetDeviceProperties");
    const char *arch = "";
#if defined(__HIP_PLATFORM_AMD__)
    arch = p.gcnArchName;
#endif
    snprintf(name, size, "%s%s%s%s", p.name[0] ? p.name : "AMD GPU", arch[0] ? " (" : "", arch, arch[0] ? ")" : "");
    return NSA_SUCCESS;
}

/* CDNA targets with the MFMA instructions the kernels use. */
static int arch_has_mfma(const char *arch)
{
    return strncmp(arch, "gfx908", 6) == 0 || strncmp(arch, "gfx90a", 6) == 0 || strncmp(arch, "gfx94", 5) == 0;
}

/* --------------------------------------------------------------- contexts */

static nsa_status hip_context_create(int device, void *native_stream, void **out)
{
    HIP_TRY(hipSetDevice(device), "hipSetDevice");
    hipDeviceProp_t p;
    HIP_TRY(hipGetDeviceProperties(&p, device), "hipGetDeviceProperties");
    hip_ctx *c = (hip_ctx *)calloc(1, sizeof *c);
    if (!c) return nsa_hip_host->set_error(NSA_ERR_OUT_OF_MEMORY, "hip backend: out of host memory for a context");
    c->device = device;
    c->lds_bytes = p.sharedMemPerBlock;
    c->wave = p.warpSize;
    c->cus = p.multiProcessorCount > 0 ? p.multiProcessorCount : 1;
#if defined(__HIP_PLATFORM_AMD__)
    snprintf(c->arch, sizeof c->arch, "%s", p.gcnArchName);
#endif
    const char *no_mfma = getenv("NSA_HIP_NO_MFMA");
    c->mfma = arch_has_mfma(c->arch) && c->wave == 64 && !(no_mfma && strcmp(no_mfma, "1") == 0);
#ifdef NSA_HIP_MFMA_EMULATED /* test builds that emulate the MFMA instruction on another GPU */
    c->mfma = !(no_mfma && strcmp(no_mfma, "1") == 0);
#endif
    if (native_stream) {
        c->stream = (hipStream_t)native_stream;
    } else {
        hipError_t e = hipStreamCreateWithFlags(&c->stream, hipStreamNonBlocking);
        if (e != hipSuccess) {
            free(c);
            return nsa_hip_fail(e, "hipStreamCreateWithFlags");
        }
        c->own_stream = 1;
    }
    *out = c;
    return NSA_SUCCESS;
}

static void hip_context_destroy(void *bctx)
{
    hip_ctx *c = (hip_ctx *)bctx;
    if (!c) return;
    if (hipSetDevice(c->device) == hipSuccess && c->own_stream) {
        (void)hipStreamSynchronize(c->stream);
        (void)hipStreamDestroy(c->stream);
    }
    free(c);
}

static nsa_status hip_synchronize(void *bctx)
{
    hip_ctx *c = (hip_ctx *)bctx;
    HIP_TRY(hipSetDevice(c->device), "hipSetDevice");
    HIP_TRY(hipStreamSynchronize(c->stream), "hipStreamSynchronize");
    return NSA_SUCCESS;
}

/* ---------------------------------------------------------------- buffers */

static nsa_status hip_buffer_alloc(void *bctx, size_t bytes, void **out)
{
    hip_ctx *c = (hip_ctx *)bctx;
    HIP_TRY(hipSetDevice(c->device), "hipSetDevice");
    hip_buf *b = (hip_buf *)calloc(1, sizeof *b);
    if (!b) return nsa_hip_host->set_error(NSA_ERR_OUT_OF_MEMORY, "hip backend: out of host memory for a buffer");
    void *p = NULL;
    hipError_t e = hipMalloc(&p, bytes ? bytes : 1);
    if (e != hipSuccess) {
        free(b);
        (void)hipGetLastError(); /* clear the sticky error of a failed allocation */
        return nsa_hip_host->set_error(NSA_ERR_OUT_OF_MEMORY, "hip backend: hipMalloc of %zu bytes on device %d: %s",
                                       bytes, c->device, hipGetErrorString(e));
    }
    b->ptr = (char *)p;
    b->bytes = bytes;
    b->owned = 1;
    *out = b;
    return NSA_SUCCESS;
}

static nsa_status hip_buffer_wrap(void *bctx, void *handle, size_t offset, size_t bytes, void **out)
{
    (void)bctx;
    if (!handle) return nsa_hip_host->set_error(NSA_ERR_NULL_POINTER, "hip backend: nsa_buffer_wrap: handle is NULL");
    hip_buf *b = (hip_buf *)calloc(1, sizeof *b);
    if (!b) return nsa_hip_host->set_error(NSA_ERR_OUT_OF_MEMORY, "hip backend: out of host memory for a buffer");
    b->ptr = (char *)handle + offset;
    b->bytes = bytes;
    b->owned = 0;
    *out = b;
    return NSA_SUCCESS;
}

static void hip_buffer_free(void *bctx, void *bbuf)
{
    hip_ctx *c = (hip_ctx *)bctx;
    hip_buf *b = (hip_buf *)bbuf;
    if (!b) return;
    if (b->owned && hipSetDevice(c->device) == hipSuccess) (void)hipFree(b->ptr);
    free(b);
}

static nsa_status check_range(const hip_buf *b, size_t offset, size_t bytes, const char *what)
{
    if (offset > b->bytes || bytes > b->bytes - offset)
        return nsa_hip_host->set_error(NSA_ERR_BUFFER_TOO_SMALL,
                                       "hip backend: %s of %zu bytes at offset %zu passes the end of a %zu-byte buffer",
                                       what, bytes, offset, b->bytes);
    return NSA_SUCCESS;
}

static nsa_status hip_buffer_write(void *bctx, void *bbuf, size_t offset, const void *src, size_t bytes)
{
    hip_ctx *c = (hip_ctx *)bctx;
    hip_buf *b = (hip_buf *)bbuf;
    nsa_status s = check_range(b, offset, bytes, "write");
    if (s != NSA_SUCCESS || bytes == 0) return s;
    HIP_TRY(hipSetDevice(c->device), "hipSetDevice");
    HIP_TRY(hipMemcpyAsync(b->ptr + offset, src, bytes, hipMemcpyHostToDevice, c->stream), "hipMemcpyAsync (write)");
    HIP_TRY(hipStreamSynchronize(c->stream), "hipStreamSynchronize (write)");
    return NSA_SUCCESS;
}

static nsa_status hip_buffer_read(void *bctx, void *bbuf, size_t offset, void *dst, size_t bytes)
{
    hip_ctx *c = (hip_ctx *)bctx;
    hip_buf *b = (hip_buf *)bbuf;
    nsa_status s = check_range(b, offset, bytes, "read");
    if (s != NSA_SUCCESS || bytes == 0) return s;
    HIP_TRY(hipSetDevice(c->device), "hipSetDevice");
    HIP_TRY(hipMemcpyAsync(dst, b->ptr + offset, bytes, hipMemcpyDeviceToHost, c->stream), "hipMemcpyAsync (read)");
    HIP_TRY(hipStreamSynchronize(c->stream), "hipStreamSynchronize (read)");
    return NSA_SUCCESS;
}

static nsa_status hip_buffer_fill(void *bctx, void *bbuf, size_t offset, unsigned char value, size_t bytes)
{
    hip_ctx *c = (hip_ctx *)bctx;
    hip_buf *b = (hip_buf *)bbuf;
    nsa_status s = check_range(b, offset, bytes, "fill");
    if (s != NSA_SUCCESS || bytes == 0) return s;
    HIP_TRY(hipSetDevice(c->device), "hipSetDevice");
    HIP_TRY(hipMemsetAsync(b->ptr + offset, value, bytes, c->stream), "hipMemsetAsync");
    HIP_TRY(hipStreamSynchronize(c->stream), "hipStreamSynchronize (fill)");
    return NSA_SUCCESS;
}

/* ------------------------------------------------------------------ entry */

static const nsa_backend hip_backend = {
    NSA_BACKEND_API_VERSION,
    "hip",
    hip_probe,
    hip_device_name,
    hip_context_create,
    hip_context_destroy,
    hip_synchronize,
    hip_buffer_alloc,
    hip_buffer_wrap,
    hip_buffer_free,
    hip_buffer_write,
    hip_buffer_read,
    hip_buffer_fill,
    nsa_hip_supports,
    0, /* query_tile: the kernels walk tokens themselves */
    1, /* wants_device_tables: cu_seqlens, cu_cmp, tok_seq on the device */
    nsa_hip_plan_prepare,
    nsa_hip_plan_release,
    nsa_hip_run,
    nullptr, /* device_kind: every device is a GPU */
    nullptr, /* stage_kernel: the stage's own name */
    nsa_hip_decode_status, /* decode_stages.hip: the checks of the last step, read back */
    0, /* shards: the kernels take query rows as positions of their own keys (no shard plans yet) */
};

extern "C" {
NSA_BACKEND_EXPORT extern const int nsa_backend_api_version;
const int nsa_backend_api_version = NSA_BACKEND_API_VERSION;

NSA_BACKEND_EXPORT const nsa_backend *nsa_backend_entry(const nsa_host_api *host)
{
    if (!host) return NULL;
    nsa_hip_host = host;
    return &hip_backend;
}
}
