/*
 * nsa bench --decode: the time of one decode step (nsa_decode, docs/nsa-semantics.md
 * section 10) over sweeps of the batch B, the context (tokens already cached per
 * sequence) and TQ (new tokens per sequence and step), with the GB/s of the bytes
 * the step must read and a dense-decode baseline by the same backend; the caches
 * are filled with seeded values (default) or prefilled by decode steps. See
 * bench_decode.c and `nsa bench --help`.
 */
#ifndef NSA_TOOLS_BENCH_DECODE_H
#define NSA_TOOLS_BENCH_DECODE_H

#include <stdint.h>

#include "config_flags.h"
#include "nsa.h"

#define BENCH_DECODE_MAX_LIST 16

/* How a point's caches reach the context (--fill, the choices' order) */
enum { BENCH_FILL_RANDOM = 0, BENCH_FILL_STEPS = 1 };
extern const char *const bench_decode_fill_choices; /* "random|steps" */

typedef struct bench_decode_opts {
    const config_flags *cf;
    int64_t batch[BENCH_DECODE_MAX_LIST], context[BENCH_DECODE_MAX_LIST], tq[BENCH_DECODE_MAX_LIST];
    int nbatch, ncontext, ntq;
    int fill;
    int64_t chunk, page_size, cmp_page_size;
    int warmup, iters, no_dense, json;
    double peak_gbps;     /* 0: unknown */
} bench_decode_opts;

/* The defaults of the sweep lists left empty (n* == 0), sized for the device. */
void bench_decode_defaults(bench_decode_opts *o, int on_cpu);

/* Checks the lists (after bench_decode_defaults) and the sizes: B >= 1 (at
 * most TK_MAX_BATCH with --fill steps), context >= 0, TQ >= 1, every context +
 * TQ and B x TQ within the int32 step lengths, --chunk and the page sizes >= 1.
 * Prints a message naming the flag and returns 2 on the first bad value, else 0. */
int bench_decode_check(const bench_decode_opts *o);

/* Runs the sweep on ctx and prints the table (or one JSON object). Returns the
 * tool's exit code: 0, 1 when a point's full configuration failed (its message
 * is printed and the sweep goes on), 2 for a bad case. */
int bench_decode(nsa_context *ctx, const bench_decode_opts *o);

#endif /* NSA_TOOLS_BENCH_DECODE_H */
