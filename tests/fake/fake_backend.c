/*
 * Fake backend modules for test_loader.c, one source built five ways:
 *   FAKE_UNAVAILABLE  a well-formed module whose probe reports its vendor
 *                     runtime missing (libnsa_backend_fake.so)
 *   FAKE_BAD_VERSION  exports a wrong nsa_backend_api_version (libnsa_backend_fakever.so)
 *   FAKE_NO_ENTRY     exports the version but not nsa_backend_entry
 *                     (libnsa_backend_fakenoentry.so)
 *   FAKE_CTX_FAILS    probes one device, but its context_create fails and
 *                     leaves no message (libnsa_backend_fakectx.so, in failing/)
 *   FAKE_FUNC_VERSION its nsa_backend_api_version is a function at an odd
 *                     address, not an int (libnsa_backend_fakefunc.so, in failing/)
 *   FAKE_PLANS        probes one device and creates contexts, so that plans can
 *                     be made on it; no supports() (the core's default: every
 *                     plain stage, every dtype but f64), no memory, runs nothing
 *                     (libnsa_backend_fakeplan.so, in failing/)
 * They include core/backend.h: it is the module interface.
 */
#include <stdio.h>

#include "backend.h"

#define FAKE_REASON "fake vendor runtime libfakert.so.1 not found"

#if defined(FAKE_BAD_VERSION)
NSA_BACKEND_EXPORT const int nsa_backend_api_version = NSA_BACKEND_API_VERSION + 1000;
#elif defined(FAKE_FUNC_VERSION)
/* A 4-byte function one byte past a 16-byte boundary: reading it as an int
 * would be a misaligned load (and meaningless). */
__asm__(".text\n"
        ".p2align 4\n"
        ".byte 0x90\n"
        ".globl nsa_backend_api_version\n"
        ".type nsa_backend_api_version, @function\n"
        "nsa_backend_api_version:\n"
        "ret\n"
        ".byte 0x90, 0x90, 0x90\n"
        ".size nsa_backend_api_version, 4\n");
#else
NSA_BACKEND_EXPORT const int nsa_backend_api_version = NSA_BACKEND_API_VERSION;
#endif

#if !defined(FAKE_NO_ENTRY)
static const nsa_host_api *host;

static nsa_status probe(int *device_count, char *reason, size_t reason_size)
{
#if defined(FAKE_CTX_FAILS) || defined(FAKE_PLANS)
    *device_count = 1;
    snprintf(reason, reason_size, "fake device present");
    return NSA_SUCCESS;
#else
    *device_count = 0;
    snprintf(reason, reason_size, "%s", FAKE_REASON);
    return NSA_ERR_BACKEND_UNAVAILABLE;
#endif
}

static nsa_status unavailable(void)
{
    return host->set_error(NSA_ERR_BACKEND_UNAVAILABLE, "%s", FAKE_REASON);
}

static nsa_status device_name(int index, char *name, size_t size)
{
    (void)index, (void)name, (void)size;
#if defined(FAKE_PLANS)
    snprintf(name, size, "fake device");
    return NSA_SUCCESS;
#else
    return unavailable();
#endif
}
static nsa_status context_create(int device, void *native_stream, void **bctx)
{
    (void)device, (void)native_stream, (void)bctx;
#if defined(FAKE_PLANS)
    *bctx = (void *)&host; /* any non-NULL handle: it holds nothing */
    return NSA_SUCCESS;
#elif defined(FAKE_CTX_FAILS)
    return NSA_ERR_DEVICE; /* and no host->set_error: the core must name it */
#else
    return unavailable();
#endif
}
static void context_destroy(void *bctx) { (void)bctx; }
static nsa_status synchronize(void *bctx)
{
    (void)bctx;
    return unavailable();
}
static nsa_status buffer_alloc(void *bctx, size_t bytes, void **bbuf)
{
    (void)bctx, (void)bytes, (void)bbuf;
    return unavailable();
}
static nsa_status buffer_wrap(void *bctx, void *handle, size_t offset, size_t bytes, void **bbuf)
{
    (void)bctx, (void)handle, (void)offset, (void)bytes, (void)bbuf;
    return unavailable();
}
static void buffer_free(void *bctx, void *bbuf) { (void)bctx, (void)bbuf; }
static nsa_status buffer_write(void *bctx, void *bbuf, size_t offset, const void *src, size_t bytes)
{
    (void)bctx, (void)bbuf, (void)offset, (void)src, (void)bytes;
    return unavailable();
}
static nsa_status buffer_read(void *bctx, void *bbuf, size_t offset, void *dst, size_t bytes)
{
    (void)bctx, (void)bbuf, (void)offset, (void)dst, (void)bytes;
    return unavailable();
}
static nsa_status buffer_fill(void *bctx, void *bbuf, size_t offset, unsigned char value, size_t bytes)
{
    (void)bctx, (void)bbuf, (void)offset, (void)value, (void)bytes;
    return unavailable();
}
static nsa_status run(void *bctx, nsa_stage stage, const nsa_bk_args *args)
{
    (void)bctx, (void)stage, (void)args;
    return unavailable();
}

static const nsa_backend fake = {
    .api_version = NSA_BACKEND_API_VERSION,
    .name = "fake",
    .probe = probe,
    .device_name = device_name,
    .context_create = context_create,
    .context_destroy = context_destroy,
    .synchronize = synchronize,
    .buffer_alloc = buffer_alloc,
    .buffer_wrap = buffer_wrap,
    .buffer_free = buffer_free,
    .buffer_write = buffer_write,
    .buffer_read = buffer_read,
    .buffer_fill = buffer_fill,
    .supports = NULL,
    .run = run,
};

NSA_BACKEND_EXPORT const nsa_backend *nsa_backend_entry(const nsa_host_api *h)
{
    host = h;
    return &fake;
}
#endif
