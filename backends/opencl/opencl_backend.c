/*
 * opencl_backend.c: the OpenCL backend module (libnsa_backend_opencl.so): entry point,
 * probe, devices, contexts and buffers. Stages are in stages.c, the program build and
 * binary cache in program.c, LINEAR compression (CLBlast) in compress_linear.c, the
 * device code in kernels/opencl/<idea>.cl (embedded at build time by embed_cl.py).
 *
 * Targets any OpenCL 1.2 device; needs no extension (no cl_khr_fp16: f16 goes through
 * vload_half / vstore_half_rte, bf16 through bit operations).
 *
 * Devices: the device index is a flat index over every platform's devices, in the
 * order clGetPlatformIDs returns the platforms and, inside a platform, the order
 * clGetDeviceIDs(CL_DEVICE_TYPE_ALL) returns the devices, keeping GPU, accelerator
 * and CPU devices (custom devices are skipped). NSA_OPENCL_PLATFORM=<substring>
 * keeps only the platforms whose name contains it (case-insensitive).
 *
 * What blocks and what does not:
 *   buffer_write, buffer_read   blocking (clEnqueue{Write,Read}Buffer with CL_TRUE);
 *                               ordered after all work queued before them
 *   buffer_fill                 blocking (waits for the fill's event)
 *   buffer_alloc / wrap / free  no queue work (clCreateBuffer / clRetain / clRelease)
 *   run (every stage)           only enqueues kernels and CLBlast GEMMs; never waits
 *   synchronize                 clFinish on the context's queue
 *   plan_prepare                may build programs (blocking compile, or a binary-cache
 *                               load) and allocate plan scratch; queues nothing
 * With a caller's queue (context_create's native_stream, a cl_command_queue) the
 * backend uses that queue's context and device and retains both while it lives. An
 * out-of-order queue is supported by a barrier after every command the backend queues.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opencl_internal.h"

const nsa_host_api *ocl_host;

/* ------------------------------------------------------------------ devices */

static int platform_selected(cl_platform_id p)
{
    const char *want = getenv("NSA_OPENCL_PLATFORM");
    if (!want || !*want) return 1;
    char name[256] = {0};
    if (clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof name - 1, name, NULL) != CL_SUCCESS) return 0;
    return strcasestr(name, want) != NULL;
}

/* Walks the flat device list. With index >= 0 stops there and returns its device in
 * *dev (and platform); always returns the number of devices seen (-1 if the platform
 * query itself failed, with *err set). */
static int walk_devices(int index, cl_platform_id *plat, cl_device_id *dev, cl_int *err,
                        cl_uint *nplatforms)
{
    cl_uint np = 0;
    *err = clGetPlatformIDs(0, NULL, &np);
    if (nplatforms) *nplatforms = np;
    if (*err != CL_SUCCESS) return -1;
    if (np == 0) return 0;
    cl_platform_id *ps = malloc(np * sizeof *ps);
    if (!ps) { *err = CL_OUT_OF_HOST_MEMORY; return -1; }
    *err = clGetPlatformIDs(np, ps, NULL);
    if (*err != CL_SUCCESS) { free(ps); return -1; }
    int seen = 0;
    for (cl_uint i = 0; i < np; ++i) {
        if (!platform_selected(ps[i])) continue;
        cl_uint nd = 0;
        if (clGetDeviceIDs(ps[i], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0) continue;
        cl_device_id *ds = malloc(nd * sizeof *ds);
        if (!ds) continue;
        if (clGetDeviceIDs(ps[i], CL_DEVICE_TYPE_ALL, nd, ds, NULL) == CL_SUCCESS) {
            for (cl_uint j = 0; j < nd; ++j) {
                cl_device_type type = 0;
                clGetDeviceInfo(ds[j], CL_DEVICE_TYPE, sizeof type, &type, NULL);
                if (!(type & (CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR | CL_DEVICE_TYPE_CPU)))
                    continue;
                if (seen == index) {
                    if (plat) *plat = ps[i];
                    if (dev) *dev = ds[j];
                    free(ds);
                    free(ps);
                    return seen + 1;
                }
                ++seen;
            }
        }
        free(ds);
    }
    free(ps);
    return seen;
}

static nsa_status ocl_probe(int *device_count, char *reason, size_t reason_size)
{
    cl_int err;
    cl_uint np = 0;
    const int n = walk_devices(-1, NULL, NULL, &err, &np);
    if (device_count) *device_count = n > 0 ? n : 0;
    const char *filter = getenv("NSA_OPENCL_PLATFORM");
    if (n < 0) {
        if (err == -1001)
            snprintf(reason, reason_size, "clGetPlatformIDs: -1001 (ICD loader found no platforms)");
        else
            snprintf(reason, reason_size, "clGetPlatformIDs: %d (%s)", (int)err, ocl_error_name(err));
    } else if (np == 0) {
        snprintf(reason, reason_size, "no OpenCL platform found");
    } else if (n == 0) {
        snprintf(reason, reason_size, "no OpenCL device found on %u platform(s)%s%s%s", np,
                 filter && *filter ? " matching NSA_OPENCL_PLATFORM='" : "",
                 filter && *filter ? filter : "", filter && *filter ? "'" : "");
    } else {
        snprintf(reason, reason_size, "OpenCL: %d device(s) on %u platform(s); LINEAR compression: %s", n, np,
                 ocl_linear_engine());
        return NSA_SUCCESS;
    }
    return OCL_ERR(NSA_ERR_BACKEND_UNAVAILABLE, "opencl: %s", reason);
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    size_t i = 0;
    while (s[i] && isspace((unsigned char)s[i])) ++i;
    if (i) memmove(s, s + i, n - i + 1);
}

static nsa_status find_device(int index, cl_platform_id *plat, cl_device_id *dev)
{
    cl_int err;
    const int n = walk_devices(index, plat, dev, &err, NULL);
    if (n < 0) return ocl_fail(err, "clGetPlatformIDs");
    if (index < 0 || n <= index) /* not found: n is the number of devices */
        return OCL_ERR(NSA_ERR_DEVICE_NOT_FOUND, "opencl: device %d out of range (%d device(s)%s)", index, n,
                       getenv("NSA_OPENCL_PLATFORM") ? " matching NSA_OPENCL_PLATFORM" : "");
    return NSA_SUCCESS;
}

static nsa_status ocl_device_name(int index, char *name, size_t size)
{
    cl_platform_id plat;
    cl_device_id dev;
    nsa_status s = find_device(index, &plat, &dev);
    if (s != NSA_SUCCESS) return s;
    char buf[256] = {0};
    cl_int err = clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof buf - 1, buf, NULL);
    if (err != CL_SUCCESS) return ocl_fail(err, "clGetDeviceInfo(CL_DEVICE_NAME)");
    trim(buf);
    snprintf(name, size, "%s", buf);
    return NSA_SUCCESS;
}

static nsa_status ocl_device_kind(int index, int *kind)
{
    cl_platform_id plat;
    cl_device_id dev;
    nsa_status s = find_device(index, &plat, &dev);
    if (s != NSA_SUCCESS) return s;
    cl_device_type type = 0;
    cl_int err = clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    if (err != CL_SUCCESS) return ocl_fail(err, "clGetDeviceInfo(CL_DEVICE_TYPE)");
    *kind = (type & CL_DEVICE_TYPE_GPU) ? NSA_DEVICE_KIND_GPU
            : (type & CL_DEVICE_TYPE_CPU) ? NSA_DEVICE_KIND_CPU
                                          : NSA_DEVICE_KIND_OTHER;
    return NSA_SUCCESS;
}

/* ------------------------------------------------------------------ contexts */

static nsa_status query_device(ocl_context *c)
{
    cl_int err = clGetDeviceInfo(c->device, CL_DEVICE_TYPE, sizeof c->type, &c->type, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(c->device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof c->max_wg, &c->max_wg, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(c->device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof c->local_mem, &c->local_mem, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(c->device, CL_DEVICE_NAME, sizeof c->device_name - 1, c->device_name, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(c->device, CL_DRIVER_VERSION, sizeof c->driver_version - 1, c->driver_version,
                              NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(c->device, CL_DEVICE_PLATFORM, sizeof c->platform, &c->platform, NULL);
    if (err == CL_SUCCESS)
        err = clGetPlatformInfo(c->platform, CL_PLATFORM_VERSION, sizeof c->platform_version - 1,
                                c->platform_version, NULL);
    if (err != CL_SUCCESS) return ocl_fail(err, "clGetDeviceInfo");
    trim(c->device_name);
    return NSA_SUCCESS;
}

static void ocl_context_destroy(void *bctx)
{
    ocl_context *c = bctx;
    if (!c) return;
    if (c->queue) clFinish(c->queue);
    for (int i = 0; i < 3; ++i) ocl_program_release(&c->programs[i]);
    if (c->used_clblast) ocl_linear_forget(c);
    if (c->queue) clReleaseCommandQueue(c->queue);
    if (c->context) clReleaseContext(c->context);
    free(c);
}

static nsa_status ocl_context_create(int device, void *native_stream, void **bctx)
{
    ocl_context *c = calloc(1, sizeof *c);
    if (!c) return OCL_ERR(NSA_ERR_OUT_OF_MEMORY, "opencl: out of host memory for a context");
    cl_int err;
    nsa_status s;
    if (native_stream) {
        cl_command_queue q = (cl_command_queue)native_stream;
        cl_command_queue_properties props = 0;
        err = clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof c->context, &c->context, NULL);
        if (err == CL_SUCCESS) err = clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof c->device, &c->device, NULL);
        if (err == CL_SUCCESS) err = clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
        if (err != CL_SUCCESS) {
            c->context = NULL;
            free(c);
            return OCL_ERR(NSA_ERR_INVALID_VALUE,
                           "opencl: native_stream is not a valid cl_command_queue (clGetCommandQueueInfo: %d %s)",
                           (int)err, ocl_error_name(err));
        }
        clRetainCommandQueue(q);
        clRetainContext(c->context);
        c->queue = q;
        c->out_of_order = (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;
        if ((s = query_device(c)) != NSA_SUCCESS) goto fail;
    } else {
        cl_platform_id plat;
        if ((s = find_device(device, &plat, &c->device)) != NSA_SUCCESS) goto fail;
        cl_context_properties cp[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plat, 0};
        c->context = clCreateContext(cp, 1, &c->device, NULL, NULL, &err);
        if (err != CL_SUCCESS) { c->context = NULL; s = ocl_fail(err, "clCreateContext"); goto fail; }
        c->queue = clCreateCommandQueue(c->context, c->device, 0, &err);
        if (err != CL_SUCCESS) { c->queue = NULL; s = ocl_fail(err, "clCreateCommandQueue"); goto fail; }
        if ((s = query_device(c)) != NSA_SUCCESS) goto fail;
    }
    *bctx = c;
    return NSA_SUCCESS;
fail:
    ocl_context_destroy(c);
    return s;
}

static nsa_status ocl_synchronize(void *bctx)
{
    ocl_context *c = bctx;
    cl_int err = clFinish(c->queue);
    return err == CL_SUCCESS ? NSA_SUCCESS : ocl_fail(err, "clFinish");
}

nsa_status ocl_order(ocl_context *c)
{
    if (!c->out_of_order) return NSA_SUCCESS;
    cl_int err = clEnqueueBarrierWithWaitList(c->queue, 0, NULL, NULL);
    return err == CL_SUCCESS ? NSA_SUCCESS : ocl_fail(err, "clEnqueueBarrierWithWaitList");
}

/* ------------------------------------------------------------------ buffers */

static nsa_status ocl_buffer_alloc(void *bctx, size_t bytes, void **bbuf)
{
    ocl_context *c = bctx;
    ocl_buffer *b = calloc(1, sizeof *b);
    if (!b) return OCL_ERR(NSA_ERR_OUT_OF_MEMORY, "opencl: out of host memory for a buffer");
    cl_int err;
    /* OpenCL has no empty buffers: a 0-byte request gets a 1-byte cl_mem. */
    b->mem = clCreateBuffer(c->context, CL_MEM_READ_WRITE, bytes ? bytes : 1, NULL, &err);
    if (err != CL_SUCCESS) {
        free(b);
        if (err == CL_INVALID_BUFFER_SIZE || err == CL_MEM_OBJECT_ALLOCATION_FAILURE ||
            err == CL_OUT_OF_RESOURCES || err == CL_OUT_OF_HOST_MEMORY)
            return OCL_ERR(NSA_ERR_OUT_OF_MEMORY, "opencl: clCreateBuffer(%zu bytes) on %s: %d (%s)", bytes,
                           c->device_name, (int)err, ocl_error_name(err));
        return ocl_fail(err, "clCreateBuffer");
    }
    b->size = bytes;
    b->owned = 1;
    *bbuf = b;
    return NSA_SUCCESS;
}

static nsa_status ocl_buffer_wrap(void *bctx, void *handle, size_t offset, size_t bytes, void **bbuf)
{
    ocl_context *c = bctx;
    cl_mem m = (cl_mem)handle;
    cl_context mc = NULL;
    size_t msize = 0;
    cl_int err = clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof mc, &mc, NULL);
    if (err == CL_SUCCESS) err = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof msize, &msize, NULL);
    if (err != CL_SUCCESS)
        return OCL_ERR(NSA_ERR_INVALID_VALUE, "opencl: handle is not a valid cl_mem (clGetMemObjectInfo: %d %s)",
                       (int)err, ocl_error_name(err));
    if (mc != c->context)
        return OCL_ERR(NSA_ERR_WRONG_CONTEXT, "opencl: the cl_mem belongs to another cl_context than this "
                                              "context's");
    if (offset > msize || bytes > msize - offset)
        return OCL_ERR(NSA_ERR_BUFFER_TOO_SMALL,
                       "opencl: offset %zu + bytes %zu reaches past the end of the cl_mem (%zu bytes)", offset,
                       bytes, msize);
    ocl_buffer *b = calloc(1, sizeof *b);
    if (!b) return OCL_ERR(NSA_ERR_OUT_OF_MEMORY, "opencl: out of host memory for a buffer");
    clRetainMemObject(m);
    b->mem = m;
    b->offset = offset;
    b->size = bytes;
    b->owned = 0;
    *bbuf = b;
    return NSA_SUCCESS;
}

static void ocl_buffer_free(void *bctx, void *bbuf)
{
    (void)bctx;
    ocl_buffer *b = bbuf;
    if (!b) return;
    if (b->mem) clReleaseMemObject(b->mem); /* the wrap's retain, or the allocation */
    free(b);
}

static nsa_status check_range(const ocl_buffer *b, size_t offset, size_t bytes, const char *what)
{
    if (offset > b->size || bytes > b->size - offset)
        return OCL_ERR(NSA_ERR_BUFFER_TOO_SMALL, "opencl: %s of %zu bytes at offset %zu passes the buffer's end (%zu bytes)",
                       what, bytes, offset, b->size);
    return NSA_SUCCESS;
}

static nsa_status ocl_buffer_write(void *bctx, void *bbuf, size_t offset, const void *src, size_t bytes)
{
    ocl_context *c = bctx;
    ocl_buffer *b = bbuf;
    nsa_status s = check_range(b, offset, bytes, "write");
    if (s != NSA_SUCCESS || bytes == 0) return s;
    cl_int err = clEnqueueWriteBuffer(c->queue, b->mem, CL_TRUE, b->offset + offset, bytes, src, 0, NULL, NULL);
    if (err != CL_SUCCESS) return ocl_fail(err, "clEnqueueWriteBuffer");
    return ocl_order(c);
}

static nsa_status ocl_buffer_read(void *bctx, void *bbuf, size_t offset, void *dst, size_t bytes)
{
    ocl_context *c = bctx;
    ocl_buffer *b = bbuf;
    nsa_status s = check_range(b, offset, bytes, "read");
    if (s != NSA_SUCCESS || bytes == 0) return s;
    /* On an out-of-order queue, wait for everything queued before first. */
    if (c->out_of_order && (s = ocl_order(c)) != NSA_SUCCESS) return s;
    cl_int err = clEnqueueReadBuffer(c->queue, b->mem, CL_TRUE, b->offset + offset, bytes, dst, 0, NULL, NULL);
    return err == CL_SUCCESS ? NSA_SUCCESS : ocl_fail(err, "clEnqueueReadBuffer");
}

static nsa_status ocl_buffer_fill(void *bctx, void *bbuf, size_t offset, unsigned char value, size_t bytes)
{
    ocl_context *c = bctx;
    ocl_buffer *b = bbuf;
    nsa_status s = check_range(b, offset, bytes, "fill");
    if (s != NSA_SUCCESS || bytes == 0) return s;
    if (c->out_of_order && (s = ocl_order(c)) != NSA_SUCCESS) return s;
    cl_event ev;
    cl_int err = clEnqueueFillBuffer(c->queue, b->mem, &value, 1, b->offset + offset, bytes, 0, NULL, &ev);
    if (err != CL_SUCCESS) return ocl_fail(err, "clEnqueueFillBuffer");
    err = clWaitForEvents(1, &ev);
    clReleaseEvent(ev);
    if (err != CL_SUCCESS) return ocl_fail(err, "clWaitForEvents(fill)");
    return ocl_order(c);
}

/* ------------------------------------------------------------------ entry */

static const nsa_backend ocl_backend = {
    .api_version = NSA_BACKEND_API_VERSION,
    .name = "opencl",
    .probe = ocl_probe,
    .device_name = ocl_device_name,
    .device_kind = ocl_device_kind,
    .context_create = ocl_context_create,
    .context_destroy = ocl_context_destroy,
    .synchronize = ocl_synchronize,
    .buffer_alloc = ocl_buffer_alloc,
    .buffer_wrap = ocl_buffer_wrap,
    .buffer_free = ocl_buffer_free,
    .buffer_write = ocl_buffer_write,
    .buffer_read = ocl_buffer_read,
    .buffer_fill = ocl_buffer_fill,
    .supports = ocl_supports,
    .query_tile = 0,
    .wants_device_tables = 1,
    .plan_prepare = ocl_plan_prepare,
    .plan_release = ocl_plan_release,
    .run = ocl_run,
    .stage_kernel = ocl_stage_kernel,
    .decode_status = ocl_decode_status,
    .shards = 1, /* every stage takes query rows at an offset of their keys; bwd_store_f32 */
};

NSA_BACKEND_EXPORT const int nsa_backend_api_version = NSA_BACKEND_API_VERSION;

NSA_BACKEND_EXPORT const nsa_backend *nsa_backend_entry(const nsa_host_api *host)
{
    ocl_host = host;
    return &ocl_backend;
}
