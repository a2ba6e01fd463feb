/* Contexts (one backend, one device, one stream/queue) and buffers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The device index asked for: the argument, else NSA_DEVICE, else 0. */
static nsa_status resolve_device(int device, int *out, const char **source)
{
    *source = "the device argument";
    if (device < 0) {
        const char *env = getenv("NSA_DEVICE");
        device = 0;
        if (env && *env) {
            char *end = NULL;
            errno = 0;
            long v = strtol(env, &end, 10);
            if (errno || *end || v < 0 || v > 1 << 20)
                return nsa_set_error(NSA_ERR_INVALID_VALUE, "NSA_DEVICE = \"%s\" is not a device index (0, 1, ...)",
                                     env);
            device = (int)v;
            *source = "NSA_DEVICE";
        }
    }
    *out = device;
    return NSA_SUCCESS;
}

typedef struct create_request {
    int device;
    const char *device_source;
    void *native_stream;
    nsa_context *ctx;
} create_request;

/* Makes a context on backend r (nsa_registry_choose calls it per listed
 * backend, in order, until one succeeds). Every failure carries a message. */
static nsa_status create_on(const nsa_registered *r, void *arg)
{
    create_request *q = arg;
    const int dev = q->device;
    if (dev >= r->device_count)
        return nsa_set_error(NSA_ERR_DEVICE_NOT_FOUND, "%s selects device %d, but backend %s has %d device(s) (0..%d)",
                             q->device_source, dev, r->name, r->device_count, r->device_count - 1);
    nsa_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return nsa_set_error(NSA_ERR_OUT_OF_MEMORY, "nsa_context_create: out of host memory");
    ctx->be = r->be;
    ctx->device = dev;
    snprintf(ctx->backend_name, sizeof ctx->backend_name, "%s", r->name);
    if (!r->be->device_name || r->be->device_name(dev, ctx->device_name, sizeof ctx->device_name) != NSA_SUCCESS)
        snprintf(ctx->device_name, sizeof ctx->device_name, "%s device %d", r->name, dev);
    int kind = strcmp(r->name, "cpu") == 0 ? NSA_DEVICE_KIND_CPU : NSA_DEVICE_KIND_GPU;
    if (r->be->device_kind && r->be->device_kind(dev, &kind) != NSA_SUCCESS)
        kind = NSA_DEVICE_KIND_OTHER;
    ctx->kind = (nsa_device_kind)kind;
    nsa_clear_error(); /* so that a failure below without a message is seen as one */
    nsa_status s = r->be->context_create(dev, q->native_stream, &ctx->bctx);
    if (s != NSA_SUCCESS) {
        free(ctx);
        return nsa_backend_error(s, r->name, "creating a context on device %d", dev);
    }
    q->ctx = ctx;
    return NSA_SUCCESS;
}

nsa_status nsa_context_create_with_stream(const char *backend, int device, void *native_stream, nsa_context **out)
{
    nsa_clear_error();
    if (!out) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_context_create: out is NULL");
    *out = NULL;
    if (device < -1)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_context_create: device = %d (use -1 for NSA_DEVICE or 0)",
                             device);
    create_request q = {.native_stream = native_stream};
    nsa_status s = resolve_device(device, &q.device, &q.device_source);
    if (s != NSA_SUCCESS) return s;
    if ((s = nsa_registry_choose(backend, create_on, &q)) != NSA_SUCCESS) return s;
    nsa_clear_error();
    nsa_log(NSA_LOG_INFO, "context: backend %s, device %d (%s)%s", q.ctx->backend_name, q.device,
            q.ctx->device_name, native_stream ? ", on the caller's stream" : "");
    *out = q.ctx;
    return NSA_SUCCESS;
}

nsa_status nsa_context_create(const char *backend, int device, nsa_context **out)
{
    return nsa_context_create_with_stream(backend, device, NULL, out);
}

nsa_status nsa_context_destroy(nsa_context *ctx)
{
    nsa_clear_error();
    if (!ctx) return NSA_SUCCESS;
    if (ctx->live_buffers || ctx->live_plans)
        return nsa_set_error(NSA_ERR_INVALID_VALUE,
                             "nsa_context_destroy: the context still has %ld buffer(s) and %ld plan(s); free them first",
                             ctx->live_buffers, ctx->live_plans);
    ctx->be->context_destroy(ctx->bctx);
    free(ctx);
    return NSA_SUCCESS;
}

nsa_status nsa_context_device_kind(const nsa_context *ctx, nsa_device_kind *kind)
{
    nsa_clear_error();
    if (!ctx) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_context_device_kind: ctx is NULL");
    if (!kind) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_context_device_kind: kind is NULL");
    *kind = ctx->kind;
    return NSA_SUCCESS;
}

const char *nsa_context_backend(const nsa_context *ctx) { return ctx ? ctx->backend_name : ""; }
const char *nsa_context_device(const nsa_context *ctx) { return ctx ? ctx->device_name : ""; }

nsa_status nsa_context_synchronize(nsa_context *ctx)
{
    nsa_clear_error();
    if (!ctx) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_context_synchronize: ctx is NULL");
    return nsa_backend_error(ctx->be->synchronize(ctx->bctx), ctx->backend_name, "synchronizing");
}

/* ---- buffers */

static nsa_status new_buffer(nsa_context *ctx, void *bbuf, size_t bytes, nsa_buffer **out)
{
    nsa_buffer *b = calloc(1, sizeof *b);
    if (!b) {
        ctx->be->buffer_free(ctx->bctx, bbuf);
        return nsa_set_error(NSA_ERR_OUT_OF_MEMORY, "out of host memory for a buffer handle");
    }
    b->ctx = ctx;
    b->bbuf = bbuf;
    b->size = bytes;
    b->root = b;
    ctx->live_buffers++;
    *out = b;
    return NSA_SUCCESS;
}

nsa_status nsa_buffer_alloc(nsa_context *ctx, size_t bytes, nsa_buffer **out)
{
    nsa_clear_error();
    if (!out) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_buffer_alloc: out is NULL");
    *out = NULL;
    if (!ctx) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_buffer_alloc: ctx is NULL");
    if (bytes == 0) return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_buffer_alloc: bytes is 0");
    if (bytes > (size_t)INT64_MAX)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_buffer_alloc: bytes = %zu is too large", bytes);
    void *bbuf = NULL;
    nsa_status s = ctx->be->buffer_alloc(ctx->bctx, bytes, &bbuf);
    if (s != NSA_SUCCESS) return nsa_backend_error(s, ctx->backend_name, "allocating %zu bytes", bytes);
    return new_buffer(ctx, bbuf, bytes, out);
}

nsa_status nsa_buffer_wrap(nsa_context *ctx, void *handle, size_t offset, size_t bytes, nsa_buffer **out)
{
    nsa_clear_error();
    if (!out) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_buffer_wrap: out is NULL");
    *out = NULL;
    if (!ctx) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_buffer_wrap: ctx is NULL");
    if (!handle) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_buffer_wrap: handle is NULL");
    if (bytes == 0) return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_buffer_wrap: bytes is 0");
    if (bytes > (size_t)INT64_MAX || offset > (size_t)INT64_MAX - bytes)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_buffer_wrap: offset %zu + bytes %zu overflows", offset, bytes);
    if (!ctx->be->buffer_wrap)
        return nsa_set_error(NSA_ERR_UNSUPPORTED, "nsa_buffer_wrap: backend %s cannot wrap caller memory",
                             ctx->backend_name);
    void *bbuf = NULL;
    nsa_status s = ctx->be->buffer_wrap(ctx->bctx, handle, offset, bytes, &bbuf);
    if (s != NSA_SUCCESS) return nsa_backend_error(s, ctx->backend_name, "wrapping %zu bytes", bytes);
    if ((s = new_buffer(ctx, bbuf, bytes, out)) != NSA_SUCCESS) return s;
    (*out)->root = handle; /* buffers wrapping one handle are one allocation (aliasing checks) */
    (*out)->base = (int64_t)offset;
    return NSA_SUCCESS;
}

static nsa_status check_range(const nsa_buffer *buf, size_t offset, size_t bytes, const char *fn)
{
    if (offset > buf->size || bytes > buf->size - offset)
        return nsa_set_error(NSA_ERR_BUFFER_TOO_SMALL, "%s: offset %zu + bytes %zu exceeds the buffer's %zu bytes", fn,
                             offset, bytes, buf->size);
    return NSA_SUCCESS;
}

nsa_status nsa_buffer_write(nsa_buffer *buf, size_t offset, const void *src, size_t bytes)
{
    nsa_clear_error();
    if (!buf) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_buffer_write: buf is NULL");
    if (!src && bytes) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_buffer_write: src is NULL");
    nsa_status s = check_range(buf, offset, bytes, "nsa_buffer_write");
    if (s != NSA_SUCCESS || bytes == 0) return s;
    s = buf->ctx->be->buffer_write(buf->ctx->bctx, buf->bbuf, offset, src, bytes);
    return nsa_backend_error(s, buf->ctx->backend_name, "writing %zu bytes to a buffer", bytes);
}

nsa_status nsa_buffer_read(const nsa_buffer *buf, size_t offset, void *dst, size_t bytes)
{
    nsa_clear_error();
    if (!buf) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_buffer_read: buf is NULL");
    if (!dst && bytes) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_buffer_read: dst is NULL");
    nsa_status s = check_range(buf, offset, bytes, "nsa_buffer_read");
    if (s != NSA_SUCCESS || bytes == 0) return s;
    s = buf->ctx->be->buffer_read(buf->ctx->bctx, buf->bbuf, offset, dst, bytes);
    return nsa_backend_error(s, buf->ctx->backend_name, "reading %zu bytes from a buffer", bytes);
}

nsa_status nsa_buffer_fill(nsa_buffer *buf, size_t offset, unsigned char value, size_t bytes)
{
    nsa_clear_error();
    if (!buf) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_buffer_fill: buf is NULL");
    nsa_status s = check_range(buf, offset, bytes, "nsa_buffer_fill");
    if (s != NSA_SUCCESS || bytes == 0) return s;
    s = buf->ctx->be->buffer_fill(buf->ctx->bctx, buf->bbuf, offset, value, bytes);
    return nsa_backend_error(s, buf->ctx->backend_name, "filling %zu bytes of a buffer", bytes);
}

void nsa_buffer_mark_internal(nsa_buffer *buf)
{
    if (buf && !buf->internal) {
        buf->internal = 1;
        buf->ctx->live_buffers--;
    }
}

size_t nsa_buffer_size(const nsa_buffer *buf) { return buf ? buf->size : 0; }

void nsa_buffer_release(nsa_buffer *buf)
{
    if (!buf) return;
    buf->ctx->be->buffer_free(buf->ctx->bctx, buf->bbuf);
    if (!buf->internal) buf->ctx->live_buffers--;
    free(buf);
}

nsa_status nsa_buffer_free(nsa_buffer *buf)
{
    nsa_clear_error();
    nsa_buffer_release(buf);
    return NSA_SUCCESS;
}
