/* NumPy .npy reading and writing (see npy.h for what is accepted). */
#include "npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checked.h"

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

size_t npy_type_size(npy_type type)
{
    switch (type) {
    case NPY_F32: return 4;
    case NPY_F16: return 2;
    case NPY_BF16: return 2;
    case NPY_I32: return 4;
    case NPY_I64: return 8;
    case NPY_F64: return 8;
    }
    return 0;
}

const char *npy_type_descr(npy_type type)
{
    switch (type) {
    case NPY_F32: return "<f4";
    case NPY_F16: return "<f2";
    case NPY_BF16: return "<u2";
    case NPY_I32: return "<i4";
    case NPY_I64: return "<i8";
    case NPY_F64: return "<f8";
    }
    return "?";
}

char *npy_shape_string(int ndim, const int64_t *shape, char *buf, size_t size)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < size)
        snprintf(buf + used, size - used, ndim == 1 ? ",)" : ")");
    return buf;
}

static int fail(char *err, size_t err_size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && err_size)
        vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
    return -1;
}

/* Finds the value that follows 'key': in a header dict; NULL if absent. */
static const char *dict_value(const char *header, const char *key)
{
    char pat[32];
    const char *p;
    snprintf(pat, sizeof pat, "'%s'", key);
    p = strstr(header, pat);
    if (!p) {
        snprintf(pat, sizeof pat, "\"%s\"", key);
        p = strstr(header, pat);
    }
    if (!p)
        return NULL;
    p += strlen(pat);
    while (*p == ' ')
        p++;
    if (*p != ':')
        return NULL;
    p++;
    while (*p == ' ')
        p++;
    return p;
}

static int parse_descr(const char *v, npy_type *type)
{
    char d[16];
    size_t n = 0;
    char q;
    if (!v || (*v != '\'' && *v != '"'))
        return -1;
    q = *v++;
    while (*v && *v != q && n + 1 < sizeof d)
        d[n++] = *v++;
    d[n] = '\0';
    if (*v != q)
        return -1;
    if (d[0] == '=')
        d[0] = '<';
    if (strcmp(d, "<f4") == 0) *type = NPY_F32;
    else if (strcmp(d, "<f2") == 0) *type = NPY_F16;
    else if (strcmp(d, "<u2") == 0) *type = NPY_BF16;
    else if (strcmp(d, "<i4") == 0) *type = NPY_I32;
    else if (strcmp(d, "<i8") == 0) *type = NPY_I64;
    else if (strcmp(d, "<f8") == 0) *type = NPY_F64;
    else return -1;
    return 0;
}

static int parse_shape(const char *v, npy_array *a)
{
    int ndim = 0;
    if (!v || *v != '(')
        return -1;
    v++;
    for (;;) {
        char *end;
        long long x;
        while (*v == ' ' || *v == ',')
            v++;
        if (*v == ')')
            break;
        if (ndim >= NPY_MAX_DIMS)
            return -1;
        errno = 0;
        x = strtoll(v, &end, 10);
        if (errno || end == v || x < 0)
            return -1;
        if (*end == 'L')
            end++;
        a->shape[ndim++] = (int64_t)x;
        v = end;
    }
    a->ndim = ndim;
    if (nsa_ck_prod(a->shape, ndim, &a->count))
        return -2; /* more elements than int64 counts */
    return 0;
}

/* The reader proper: f holds `size` bytes in all, the file `name`. Every size
 * the header declares is checked against the bytes the file really has before
 * anything is allocated for it. */
int npy_read_stream(FILE *f, int64_t size, const char *name, npy_array *out, int with_data, char *err,
                    size_t err_size)
{
    unsigned char pre[8];
    uint32_t hlen;
    int64_t data_at;
    char *header = NULL;
    const char *v;
    size_t bytes;
    char shp[256];
    int rc;
    memset(out, 0, sizeof *out);
    if (size < 0)
        return fail(err, err_size, "%s: the size of the file is unknown", name);
    if (fread(pre, 1, 8, f) != 8 || memcmp(pre, npy_magic, 6) != 0)
        return fail(err, err_size, "%s: not a .npy file (bad magic)", name);
    if (pre[6] == 1) {
        unsigned char l2[2];
        if (fread(l2, 1, 2, f) != 2)
            goto truncated;
        hlen = (uint32_t)l2[0] | ((uint32_t)l2[1] << 8);
        data_at = 10 + (int64_t)hlen;
    } else if (pre[6] == 2 || pre[6] == 3) {
        unsigned char l4[4];
        if (fread(l4, 1, 4, f) != 4)
            goto truncated;
        hlen = (uint32_t)l4[0] | ((uint32_t)l4[1] << 8) | ((uint32_t)l4[2] << 16) |
               ((uint32_t)l4[3] << 24);
        data_at = 12 + (int64_t)hlen;
    } else {
        return fail(err, err_size, "%s: unsupported .npy format version %d.%d", name, pre[6], pre[7]);
    }
    if (data_at > size)
        return fail(err, err_size, "%s: header length %u reaches past the end of the %lld-byte file", name, hlen,
                    (long long)size);
    header = malloc((size_t)hlen + 1);
    if (!header)
        return fail(err, err_size, "%s: out of memory", name);
    if (fread(header, 1, hlen, f) != hlen) {
        free(header);
        goto truncated;
    }
    header[hlen] = '\0';
    while (hlen > 0 && (header[hlen - 1] == ' ' || header[hlen - 1] == '\n'))
        header[--hlen] = '\0'; /* padding: keeps messages short */

    v = dict_value(header, "descr");
    if (parse_descr(v, &out->type) != 0) {
        fail(err, err_size,
             "%s: unsupported dtype in header '%.200s' (accepted: <f4 <f2 <f8 <u2(bf16 bits) <i4 <i8, "
             "little-endian)",
             name, header);
        goto bad;
    }
    v = dict_value(header, "fortran_order");
    if (!v || strncmp(v, "False", 5) != 0) {
        fail(err, err_size, "%s: only C-order arrays are accepted (fortran_order must be False)", name);
        goto bad;
    }
    v = dict_value(header, "shape");
    if ((rc = parse_shape(v, out)) != 0) {
        if (rc == -2)
            fail(err, err_size, "%s: the shape %s has more elements than 2^63 - 1", name,
                 npy_shape_string(out->ndim, out->shape, shp, sizeof shp));
        else
            fail(err, err_size, "%s: cannot parse the shape in header '%.200s'", name, header);
        goto bad;
    }
    free(header);
    header = NULL;
    /* the data must be exactly what the shape says: no more, no less */
    if (nsa_ck_bytes(out->count, npy_type_size(out->type), &bytes) || (uint64_t)bytes > (uint64_t)(size - data_at))
        return fail(err, err_size,
                    "%s: the header's shape %s of %s needs %lld elements, but the file has only %lld bytes of data "
                    "(truncated, or the header lies)",
                    name, npy_shape_string(out->ndim, out->shape, shp, sizeof shp), npy_type_descr(out->type),
                    (long long)out->count, (long long)(size - data_at));
    if ((int64_t)bytes < size - data_at)
        return fail(err, err_size, "%s: %lld bytes follow the data of shape %s of %s (trailing garbage, or the "
                    "header understates the shape)",
                    name, (long long)(size - data_at - (int64_t)bytes),
                    npy_shape_string(out->ndim, out->shape, shp, sizeof shp), npy_type_descr(out->type));
    if (!with_data)
        return 0;

    out->data = malloc(bytes ? bytes : 1);
    if (!out->data)
        return fail(err, err_size, "%s: out of memory for %zu bytes", name, bytes);
    if (bytes && fread(out->data, 1, bytes, f) != bytes) {
        npy_free(out);
        goto truncated;
    }
    return 0;

truncated:
    return fail(err, err_size, "%s: file is truncated", name);
bad:
    free(header);
    return -1;
}

static int read_file(const char *path, npy_array *out, int with_data, char *err, size_t err_size)
{
    struct stat st;
    FILE *f = fopen(path, "rb");
    int rc;
    memset(out, 0, sizeof *out);
    if (!f)
        return fail(err, err_size, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return fail(err, err_size, "%s: not a regular file", path);
    }
    rc = npy_read_stream(f, (int64_t)st.st_size, path, out, with_data, err, err_size);
    fclose(f);
    return rc;
}

int npy_read(const char *path, npy_array *out, char *err, size_t err_size)
{
    return read_file(path, out, 1, err, err_size);
}

int npy_read_header(const char *path, npy_array *out, char *err, size_t err_size)
{
    return read_file(path, out, 0, err, err_size);
}

int npy_write(const char *path, npy_type type, int ndim, const int64_t *shape, const void *data,
              char *err, size_t err_size)
{
    char dict[512];
    char shp[256];
    char header[640];
    size_t dlen, total, pre_len, pad;
    int64_t count = 1;
    size_t bytes;
    FILE *f;
    unsigned char pre[12];

    if (ndim < 0 || ndim > NPY_MAX_DIMS)
        return fail(err, err_size, "%s: %d dimensions (at most %d)", path, ndim, NPY_MAX_DIMS);
    if (nsa_ck_prod(shape, ndim, &count) || nsa_ck_bytes(count, npy_type_size(type), &bytes))
        return fail(err, err_size, "%s: the shape's byte count overflows", path);
    npy_shape_string(ndim, shape, shp, sizeof shp);
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
             npy_type_descr(type), shp);
    dlen = strlen(dict);
    /* version 1.0: 6 magic + 2 version + 2 length; pad with spaces and '\n' to 64 */
    pre_len = 10;
    total = pre_len + dlen + 1;
    pad = (64 - total % 64) % 64;
    memcpy(header, dict, dlen);
    memset(header + dlen, ' ', pad);
    header[dlen + pad] = '\n';
    dlen += pad + 1;

    memcpy(pre, npy_magic, 6);
    pre[6] = 1;
    pre[7] = 0;
    pre[8] = (unsigned char)(dlen & 0xff);
    pre[9] = (unsigned char)((dlen >> 8) & 0xff);

    f = fopen(path, "wb");
    if (!f)
        return fail(err, err_size, "%s: cannot create: %s", path, strerror(errno));
    if (fwrite(pre, 1, pre_len, f) != pre_len || fwrite(header, 1, dlen, f) != dlen ||
        (bytes && fwrite(data, 1, bytes, f) != bytes)) {
        fclose(f);
        return fail(err, err_size, "%s: write failed: %s", path, strerror(errno));
    }
    if (fclose(f) != 0)
        return fail(err, err_size, "%s: close failed: %s", path, strerror(errno));
    return 0;
}

void npy_free(npy_array *a)
{
    if (!a)
        return;
    free(a->data);
    a->data = NULL;
    a->count = 0;
    a->ndim = 0;
}
