/* The growing-struct rule of nsa.h: reading and filling structs whose size
 * the caller's header decided. */
#include <string.h>

#include "internal.h"

nsa_status nsa_struct_in(void *dst, size_t known, size_t first, const void *src, size_t size, const char *fn,
                         const char *arg)
{
    if (size < first)
        return nsa_set_error(NSA_ERR_VERSION_MISMATCH,
                             "%s: %s is %zu bytes, smaller than its first layout (%zu bytes): not a libnsa struct, "
                             "or built against a header older than libnsa 0.1",
                             fn, arg, size, first);
    if (size > known) {
        const unsigned char *tail = (const unsigned char *)src + known;
        for (size_t i = 0; i < size - known; i++)
            if (tail[i] != 0)
                return nsa_set_error(NSA_ERR_VERSION_MISMATCH,
                                     "%s: %s is %zu bytes (a newer libnsa header) and sets a field at byte %zu, "
                                     "past the %zu bytes this libnsa %s knows: use a libnsa as new as the header",
                                     fn, arg, size, known + i, known, nsa_version_string());
    }
    memcpy(dst, src, size < known ? size : known);
    return NSA_SUCCESS;
}

nsa_status nsa_struct_out(void *dst, size_t size, size_t first, const void *src, size_t known, const char *fn,
                          const char *arg)
{
    if (size < first)
        return nsa_set_error(NSA_ERR_VERSION_MISMATCH,
                             "%s: %s is %zu bytes, smaller than its first layout (%zu bytes)", fn, arg, size, first);
    memcpy(dst, src, size < known ? size : known);
    if (size > known) memset((unsigned char *)dst + known, 0, size - known);
    return NSA_SUCCESS;
}
