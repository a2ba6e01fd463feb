/*
 * libFuzzer target: the .npy reader of the nsa command (tools/npy.c) on
 * arbitrary bytes, as a file it is given with --inputs would be read: header
 * only, then header and data. A success must describe a buffer of exactly the
 * shape's size (every byte of it is read here, so ASan sees a short one); a
 * failure must carry a message. Any crash, sanitizer report, leak, or an
 * allocation beyond -malloc_limit_mb is a finding.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "checked.h"
#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int with_data = 0; with_data < 2; with_data++) {
        FILE *f = fmemopen((void *)data, size ? size : 1, "rb");
        npy_array a;
        char err[1024] = "";
        if (!f) return 0;
        int rc = npy_read_stream(f, (int64_t)size, "fuzz.npy", &a, with_data, err, sizeof err);
        fclose(f);
        if (rc != 0) {
            if (!err[0]) abort(); /* every refusal says why */
            continue;
        }
        int64_t count;
        size_t bytes;
        if (a.ndim < 0 || a.ndim > NPY_MAX_DIMS || nsa_ck_prod(a.shape, a.ndim, &count) || count != a.count ||
            nsa_ck_bytes(a.count, npy_type_size(a.type), &bytes) || bytes > size)
            abort(); /* a success must describe data the file really holds */
        if (with_data) {
            volatile unsigned char sink = 0;
            if (!a.data) abort();
            for (size_t i = 0; i < bytes; i++) sink ^= ((const unsigned char *)a.data)[i];
            (void)sink;
        }
        npy_free(&a);
    }
    return 0;
}
