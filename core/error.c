/* Status names and the per-thread last-error message. */
#include <stdio.h>

#include "internal.h"

static _Thread_local char last_message[2048];

nsa_status nsa_set_error(nsa_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    return status;
}

void nsa_clear_error(void) { last_message[0] = '\0'; }

nsa_status nsa_backend_error(nsa_status status, const char *backend, const char *fmt, ...)
{
    if (status == NSA_SUCCESS || last_message[0]) return status;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return nsa_set_error(status, "backend %s failed %s (%s) and gave no reason", backend, what,
                         nsa_status_string(status));
}

const char *nsa_last_error(void) { return last_message; }

const char *nsa_status_string(nsa_status status)
{
    switch (status) {
    case NSA_SUCCESS: return "NSA_SUCCESS";
    case NSA_ERR_NULL_POINTER: return "NSA_ERR_NULL_POINTER";
    case NSA_ERR_INVALID_VALUE: return "NSA_ERR_INVALID_VALUE";
    case NSA_ERR_INVALID_CONFIG: return "NSA_ERR_INVALID_CONFIG";
    case NSA_ERR_INVALID_SHAPE: return "NSA_ERR_INVALID_SHAPE";
    case NSA_ERR_INVALID_STRIDE: return "NSA_ERR_INVALID_STRIDE";
    case NSA_ERR_INVALID_DTYPE: return "NSA_ERR_INVALID_DTYPE";
    case NSA_ERR_BUFFER_TOO_SMALL: return "NSA_ERR_BUFFER_TOO_SMALL";
    case NSA_ERR_MISSING_TENSOR: return "NSA_ERR_MISSING_TENSOR";
    case NSA_ERR_OUT_OF_MEMORY: return "NSA_ERR_OUT_OF_MEMORY";
    case NSA_ERR_BACKEND_UNAVAILABLE: return "NSA_ERR_BACKEND_UNAVAILABLE";
    case NSA_ERR_DEVICE_NOT_FOUND: return "NSA_ERR_DEVICE_NOT_FOUND";
    case NSA_ERR_UNSUPPORTED: return "NSA_ERR_UNSUPPORTED";
    case NSA_ERR_VERSION_MISMATCH: return "NSA_ERR_VERSION_MISMATCH";
    case NSA_ERR_KERNEL_BUILD: return "NSA_ERR_KERNEL_BUILD";
    case NSA_ERR_DEVICE: return "NSA_ERR_DEVICE";
    case NSA_ERR_WRONG_CONTEXT: return "NSA_ERR_WRONG_CONTEXT";
    case NSA_ERR_IO: return "NSA_ERR_IO";
    case NSA_ERR_INTERNAL: return "NSA_ERR_INTERNAL";
    }
    return "NSA_ERR_UNKNOWN_STATUS";
}

const nsa_host_api nsa_host = {
    .api_version = NSA_BACKEND_API_VERSION,
    .set_error = nsa_set_error,
    .log = nsa_log,
    .setting = nsa_setting,
};
