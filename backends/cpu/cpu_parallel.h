/*
 * A tiny parallel-for over a range of work items (tokens, or compressed rows).
 *
 * Determinism: every output element is computed wholly by one call of the
 * range function, in a fixed order that does not depend on which thread runs
 * it or on the thread count; threads only decide *who* computes a chunk.
 */
#ifndef NSA_CPU_PARALLEL_H
#define NSA_CPU_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_backend.h"

/* Computes items [begin, end). scratch: scratch_bytes of this thread's own
 * memory (64-byte aligned, contents unspecified), or NULL if none was asked. */
typedef void (*nsa_cpu_range_fn)(void *user, int64_t begin, int64_t end, void *scratch);

/* Thread count for a new context: NSA_CPU_THREADS if set, else the number of
 * online CPUs (1 when built with NSA_CPU_NO_THREADS). Returns NSA_SUCCESS, or
 * NSA_ERR_INVALID_VALUE (recorded) when NSA_CPU_THREADS is not a positive integer. */
NSA_CPU_INTERNAL nsa_status nsa_cpu_thread_count(int *threads);

/* Runs fn over [0, count) in chunks of `grain` items (0: chosen here) on up
 * to `threads` threads, the calling one included; returns when all are done.
 * Fails only with NSA_ERR_OUT_OF_MEMORY (recorded) when the scratch cannot be
 * allocated, before any item ran. A thread that cannot be started just leaves
 * its share to the others. */
NSA_CPU_INTERNAL nsa_status nsa_cpu_parallel_for(int threads, int64_t count, int64_t grain,
                                                 size_t scratch_bytes, nsa_cpu_range_fn fn, void *user);

/* Bytes of n doubles, rounded up to 64 so that scratch parts stay aligned;
 * for summing a stage's scratch layout. */
static inline size_t nsa_cpu_doubles(int64_t n)
{
    size_t b = (size_t)(n > 0 ? n : 0) * sizeof(double);
    return (b + 63u) & ~(size_t)63u;
}

#endif
