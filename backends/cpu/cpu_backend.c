/*
 * cpu_backend.c: the cpu reference backend's vtable (core/backend.h).
 *
 * One "device": the host, run by a thread pool of NSA_CPU_THREADS threads
 * (default: the online CPUs). Buffers are host memory; copies are memcpy.
 * Stages run synchronously, so synchronize() has nothing to wait for.
 *
 * Set NSA_CPU_NO_FUSED=1 in the environment to make supports() refuse the
 * fused SCORES_TOPN and WIN_COMBINE stages, so the plain BLOCK_SCORES +
 * SELECT_TOPN and WIN_ATTN + COMBINE paths run (each gives bitwise the same
 * result as its fused stage; the switch exists to check that).
 */
#include "cpu_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_dtype.h"
#include "cpu_parallel.h"

static const nsa_host_api *g_host;

const nsa_host_api *nsa_cpu_host(void)
{
    return g_host;
}

nsa_status nsa_cpu_need(const nsa_bk_tensor *t, const char *stage, const char *name, int float_ok,
                        int i32_ok)
{
    if (!t->buf)
        return g_host->set_error(NSA_ERR_MISSING_TENSOR, "cpu backend: stage %s needs tensor %s, which is absent",
                                 stage, name);
    if ((float_ok && nsa_cpu_is_float(t->dtype)) || (i32_ok && t->dtype == NSA_DTYPE_I32))
        return NSA_SUCCESS;
    return g_host->set_error(NSA_ERR_UNSUPPORTED, "cpu backend: stage %s: tensor %s has dtype %d, expected %s",
                             stage, name, (int)t->dtype, float_ok ? "f32, f16, bf16 or f64" : "i32");
}

/* ---- device */

static nsa_status cpu_probe(int *device_count, char *reason, size_t reason_size)
{
    if (device_count)
        *device_count = 1;
    if (reason && reason_size)
        snprintf(reason, reason_size, "built in");
    return NSA_SUCCESS;
}

static nsa_status cpu_device_name(int index, char *name, size_t size)
{
    if (index != 0)
        return g_host->set_error(NSA_ERR_DEVICE_NOT_FOUND, "cpu backend has one device (0), not %d", index);
    int threads = 1;
    nsa_status st = nsa_cpu_thread_count(&threads);
    if (st != NSA_SUCCESS)
        return st;
    if (name && size)
        snprintf(name, size, "pthreads x%d", threads);
    return NSA_SUCCESS;
}

/* ---- contexts: the thread-pool setting */

static nsa_status cpu_context_create(int device, void *native_stream, void **bctx)
{
    (void)native_stream; /* no stream on the host */
    if (device != 0)
        return g_host->set_error(NSA_ERR_DEVICE_NOT_FOUND, "cpu backend has one device (0), not %d", device);
    int threads = 1;
    nsa_status st = nsa_cpu_thread_count(&threads);
    if (st != NSA_SUCCESS)
        return st;
    nsa_cpu_context *ctx = malloc(sizeof *ctx);
    if (!ctx)
        return g_host->set_error(NSA_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate a context");
    ctx->threads = threads;
    *bctx = ctx;
    return NSA_SUCCESS;
}

static void cpu_context_destroy(void *bctx)
{
    free(bctx);
}

static nsa_status cpu_synchronize(void *bctx)
{
    (void)bctx; /* every stage has finished when run() returns */
    return NSA_SUCCESS;
}

/* ---- buffers: host memory */

static nsa_status cpu_buffer_alloc(void *bctx, size_t bytes, void **bbuf)
{
    (void)bctx;
    if (bytes > SIZE_MAX - 64u)
        return g_host->set_error(NSA_ERR_OUT_OF_MEMORY, "cpu backend: %zu bytes is too large", bytes);
    nsa_cpu_buffer *b = malloc(sizeof *b);
    if (!b)
        return g_host->set_error(NSA_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate a buffer record");
    /* aligned_alloc wants a multiple of the alignment; 0 bytes still gets a block */
    size_t rounded = bytes == 0 ? 64u : (bytes + 63u) & ~(size_t)63u;
    void *mem = aligned_alloc(64, rounded);
    if (!mem) {
        free(b);
        return g_host->set_error(NSA_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate %zu bytes of host memory",
                                 bytes);
    }
    b->ptr = mem;
    b->bytes = bytes;
    b->owned = mem;
    *bbuf = b;
    return NSA_SUCCESS;
}

static nsa_status cpu_buffer_wrap(void *bctx, void *handle, size_t offset, size_t bytes, void **bbuf)
{
    (void)bctx;
    if (!handle)
        return g_host->set_error(NSA_ERR_NULL_POINTER, "cpu backend: cannot wrap a NULL host pointer");
    nsa_cpu_buffer *b = malloc(sizeof *b);
    if (!b)
        return g_host->set_error(NSA_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate a buffer record");
    b->ptr = (unsigned char *)handle + offset;
    b->bytes = bytes;
    b->owned = NULL; /* the caller's memory */
    *bbuf = b;
    return NSA_SUCCESS;
}

static void cpu_buffer_free(void *bctx, void *bbuf)
{
    (void)bctx;
    nsa_cpu_buffer *b = bbuf;
    if (!b)
        return;
    free(b->owned);
    free(b);
}

static nsa_status cpu_check_range(const nsa_cpu_buffer *b, size_t offset, size_t bytes, const char *what)
{
    if (offset > b->bytes || bytes > b->bytes - offset)
        return g_host->set_error(NSA_ERR_BUFFER_TOO_SMALL,
                                 "cpu backend: %s of %zu bytes at offset %zu passes the end of a %zu-byte buffer",
                                 what, bytes, offset, b->bytes);
    return NSA_SUCCESS;
}

static nsa_status cpu_buffer_write(void *bctx, void *bbuf, size_t offset, const void *src, size_t bytes)
{
    (void)bctx;
    nsa_cpu_buffer *b = bbuf;
    nsa_status st = cpu_check_range(b, offset, bytes, "write");
    if (st == NSA_SUCCESS && bytes)
        memcpy(b->ptr + offset, src, bytes);
    return st;
}

static nsa_status cpu_buffer_read(void *bctx, void *bbuf, size_t offset, void *dst, size_t bytes)
{
    (void)bctx;
    nsa_cpu_buffer *b = bbuf;
    nsa_status st = cpu_check_range(b, offset, bytes, "read");
    if (st == NSA_SUCCESS && bytes)
        memcpy(dst, b->ptr + offset, bytes);
    return st;
}

static nsa_status cpu_buffer_fill(void *bctx, void *bbuf, size_t offset, unsigned char value, size_t bytes)
{
    (void)bctx;
    nsa_cpu_buffer *b = bbuf;
    nsa_status st = cpu_check_range(b, offset, bytes, "fill");
    if (st == NSA_SUCCESS && bytes)
        memset(b->ptr + offset, value, bytes);
    return st;
}

/* ---- stages */

static int cpu_supports(void *bctx, nsa_stage stage, const nsa_config *cfg)
{
    (void)bctx;
    if (!cfg || !nsa_cpu_is_float(cfg->dtype))
        return 0;
    if (cfg->compress != NSA_COMPRESS_MEAN && cfg->compress != NSA_COMPRESS_LINEAR &&
        cfg->compress != NSA_COMPRESS_EXTERNAL)
        return 0;
    /* SLC_COMBINE: no; COMBINE sums the three terms in double, and a partial sum
     * stored in the float type between the stages would round it once more */
    if (stage == NSA_STAGE_SLC_COMBINE)
        return 0;
    if (stage == NSA_STAGE_SCORES_TOPN || stage == NSA_STAGE_WIN_COMBINE) {
        const char *off = getenv("NSA_CPU_NO_FUSED");
        return !(off && *off && strcmp(off, "0") != 0);
    }
    return (int)stage >= 0 && stage < NSA_STAGE_COUNT;
}

static nsa_status cpu_run(void *bctx, nsa_stage stage, const nsa_bk_args *args)
{
    const nsa_cpu_context *ctx = bctx;
    if (!ctx || !args || !args->plan)
        return g_host->set_error(NSA_ERR_INTERNAL, "cpu backend: run() without a context, arguments or plan");
    switch (stage) {
    case NSA_STAGE_COMPRESS:
        return nsa_cpu_compress(ctx, args);
    case NSA_STAGE_CMP_ATTN:
        return nsa_cpu_cmp_attn(ctx, args);
    case NSA_STAGE_BLOCK_SCORES:
        return nsa_cpu_block_scores(ctx, args);
    case NSA_STAGE_SELECT_TOPN:
        return nsa_cpu_select_topn(ctx, args);
    case NSA_STAGE_SLC_ATTN:
        return nsa_cpu_slc_attn(ctx, args);
    case NSA_STAGE_WIN_ATTN:
        return nsa_cpu_win_attn(ctx, args);
    case NSA_STAGE_COMBINE:
        return nsa_cpu_combine(ctx, args);
    case NSA_STAGE_SCORES_TOPN:
        return nsa_cpu_scores_topn(ctx, args);
    case NSA_STAGE_BWD_CMP_ATTN:
        return nsa_cpu_bwd_cmp_attn(ctx, args);
    case NSA_STAGE_BWD_COMPRESS:
        return nsa_cpu_bwd_compress(ctx, args);
    case NSA_STAGE_BWD_SLC_ATTN:
        return nsa_cpu_bwd_slc_attn(ctx, args);
    case NSA_STAGE_BWD_WIN_ATTN:
        return nsa_cpu_bwd_win_attn(ctx, args);
    case NSA_STAGE_BWD_STORE:
        return nsa_cpu_bwd_store(ctx, args);
    case NSA_STAGE_DECODE_APPEND:
        return nsa_cpu_decode_append(ctx, args);
    case NSA_STAGE_DECODE_ATTN:
        return nsa_cpu_decode_attn(ctx, args);
    case NSA_STAGE_WIN_COMBINE:
        return nsa_cpu_win_combine(ctx, args);
    default:
        return g_host->set_error(NSA_ERR_UNSUPPORTED, "cpu backend: unknown stage %d", (int)stage);
    }
}

static const nsa_backend cpu_backend = {
    .api_version = NSA_BACKEND_API_VERSION,
    .name = "cpu",
    .probe = cpu_probe,
    .device_name = cpu_device_name,
    .context_create = cpu_context_create,
    .context_destroy = cpu_context_destroy,
    .synchronize = cpu_synchronize,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_wrap = cpu_buffer_wrap,
    .buffer_free = cpu_buffer_free,
    .buffer_write = cpu_buffer_write,
    .buffer_read = cpu_buffer_read,
    .buffer_fill = cpu_buffer_fill,
    .supports = cpu_supports,
    .query_tile = 0,          /* no tile list: stages split tokens themselves */
    .wants_device_tables = 0, /* the host tables in nsa_bk_plan are our memory */
    .plan_prepare = nsa_cpu_plan_prepare, /* decode plans: the step's gather scratch */
    .plan_release = nsa_cpu_plan_release,
    .run = cpu_run,
    .shards = 1,              /* queries at an offset of their keys, float key gradients */
};

const nsa_backend *nsa_cpu_backend(const nsa_host_api *host)
{
    g_host = host;
    return &cpu_backend;
}
