/*
 * Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0 are
 * read; 1.0 is written: the headers written here are always short).
 *
 * Element types: '<f4' (float32), '<f2' (float16), '<f8' (float64), '<i4', '<i8',
 * and '<u2'.
 * NumPy has no bfloat16, so the nsa command stores bf16 as '<u2' holding the raw
 * 16 bits (the upper half of the float32 pattern): a '<u2' file given where a
 * float tensor is expected is read as bf16 bits. The command WRITES float outputs
 * as '<f4' (every f16/bf16 value is exact in f32), and as '<f8' in an f64 run, so
 * its outputs load in numpy without any conversion or loss.
 *
 * Only C order (fortran_order False) and little-endian data are accepted ('|' is
 * accepted for one-byte types, '=' is taken as little-endian); anything else is
 * refused with a message naming the file.
 *
 * Files are untrusted input: the header's length and shape are checked against
 * the file's real size before anything is allocated for them, and the data must
 * be exactly what the shape says (a truncated file, or bytes after the data, is
 * refused with a message). Only regular files are read.
 */
#ifndef NSA_TOOLS_NPY_H
#define NSA_TOOLS_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define NPY_MAX_DIMS 8

typedef enum npy_type {
    NPY_F32 = 0, /* '<f4' */
    NPY_F16 = 1, /* '<f2' */
    NPY_BF16 = 2,/* '<u2' raw bf16 bits */
    NPY_I32 = 3, /* '<i4' */
    NPY_I64 = 4, /* '<i8' */
    NPY_F64 = 5  /* '<f8' */
} npy_type;

typedef struct npy_array {
    npy_type type;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    int64_t count;   /* product of shape (1 for a 0-d array) */
    void *data;      /* count * npy_type_size(type) bytes, malloc'ed */
} npy_array;

size_t npy_type_size(npy_type type);
const char *npy_type_descr(npy_type type); /* "<f4" */

/* Reads path into *out (free with npy_free). Returns 0, or -1 with a message
 * naming the file in err. */
int npy_read(const char *path, npy_array *out, char *err, size_t err_size);

/* As npy_read, but reads only the header: type, ndim, shape, count; data = NULL.
 * The shape is still checked against the file's size. */
int npy_read_header(const char *path, npy_array *out, char *err, size_t err_size);

/* The reader on an open stream positioned at the magic, which holds size bytes
 * in all (the fuzzer reads from memory with it); name is used in messages.
 * with_data: 0 for the header only. */
int npy_read_stream(FILE *f, int64_t size, const char *name, npy_array *out, int with_data, char *err,
                    size_t err_size);

/* Writes ndim dims of data (C order). Returns 0, or -1 with a message in err. */
int npy_write(const char *path, npy_type type, int ndim, const int64_t *shape, const void *data,
              char *err, size_t err_size);

void npy_free(npy_array *a);

/* "(4096, 64, 192)" into buf; returns buf. */
char *npy_shape_string(int ndim, const int64_t *shape, char *buf, size_t size);

#endif /* NSA_TOOLS_NPY_H */
