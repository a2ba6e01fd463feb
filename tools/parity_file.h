/*
 * The file of `nsa parity --save FILE` / `--compare FILE`: every case's outputs
 * of every backend that ran, so runs on different machines (a cpu-only laptop,
 * an NVIDIA box, an AMD box) can be compared with the same tolerance and
 * near-tie rule without the machines ever meeting.
 *
 * Format (all integers little-endian; floats IEEE-754 binary32, little-endian):
 *   file    := "NSAPRTY1" record*                       (8-byte magic, then records to EOF)
 *   record  := u32 0x31524352 ("RCR1")
 *              str label, str backend, str device, str libnsa version
 *              i64 hq hkv dqk dv l d ls n n_init n_local w   (the nsa_config fields)
 *              f32 scale, i32 compress, i32 dtype
 *              i64 batch, i64 cu_seqlens[batch + 1], u64 seed
 *              i32 fixed_indices, i32 use_pe, i32 layout
 *              i32 status          (nsa_status of the run; not 0: no tensors follow)
 *              i64 T
 *              u32 present         (bit 0: o, 1: lse_cmp, 2: lse_slc, 3: lse_win, 4: selected)
 *              f32 o[T, Hq, Dv]    (as f32 even for f16/bf16 runs: exact)
 *              f32 lse_b[T, Hq]    for each present branch b, in order cmp, slc, win
 *              i32 selected[T, Hkv, n]
 *   str     := u16 length, that many bytes (no terminator)
 * The inputs are not stored: they are re-drawn from the seed with the library's
 * portable generator, which gives the same numbers on every machine.
 *
 * The reader treats the file as untrusted input: every count is computed with
 * checked 64-bit arithmetic and bounded by the bytes left in the file before
 * anything is allocated for it; a corrupt record is an error naming why.
 */
#ifndef NSA_TOOLS_PARITY_FILE_H
#define NSA_TOOLS_PARITY_FILE_H

#include <stdio.h>

#include "nsa.h"
#include "testkit.h"

typedef struct parity_record {
    char backend[32];
    char device[NSA_NAME_MAX];
    char version[32];
    tk_case c;
    nsa_status status;
    tk_output out; /* o, lse, sel (tokens set); empty when status != NSA_SUCCESS */
} parity_record;

/* Creates path and writes the magic. Returns the stream or NULL (message in err). */
FILE *parity_file_create(const char *path, char *err, size_t err_size);

/* Appends one record. Returns 0 or -1 (message in err). */
int parity_file_write(FILE *f, const char *backend, const char *device, const tk_case *c,
                      nsa_status status, const tk_output *out, char *err, size_t err_size);

/* Reads every record of path. Returns the count (>= 0) with *recs malloc'ed
 * (free with parity_records_free), or -1 (message in err). */
int parity_file_read(const char *path, parity_record **recs, char *err, size_t err_size);
/* The same on an open stream at the file's magic that holds size bytes in all
 * (the fuzzer reads from memory with it); name is used in messages. */
int parity_file_read_stream(FILE *f, int64_t size, const char *name, parity_record **recs, char *err,
                            size_t err_size);
void parity_records_free(parity_record *recs, int count);

/* The record of case c (same label, dtype, config, batch and seed) made by
 * backend (NULL: the first of a backend other than avoid, else the first of
 * any), or NULL. *mismatch is set to 1
 * when a record with that label and dtype exists but its case differs (the
 * corpus changed between the two versions). */
const parity_record *parity_file_find(const parity_record *recs, int count, const tk_case *c,
                                      const char *backend, const char *avoid, int *mismatch);

#endif /* NSA_TOOLS_PARITY_FILE_H */
