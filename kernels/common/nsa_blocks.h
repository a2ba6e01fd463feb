/*
 * nsa_blocks.h -- the per-query block arithmetic of docs/nsa-semantics.md,
 * shared by the CUDA and HIP device code (and usable from host C/C++).
 *
 * Header-only, no dependencies beyond <stdint.h>. Every function works on
 * LOCAL positions (t counted from the start of the query's sequence) and is
 * 64-bit throughout. NSA_HD makes each function callable from host and device
 * code under nvcc / hipcc and is empty for a plain C or C++ compiler.
 *
 * Names (semantics section in brackets):
 *   l, d      compression block length and stride (d divides l)     [1]
 *   ls        selection block length (l <= ls, d divides ls)         [3]
 *   compressed block i covers tokens [i*d, i*d + l - 1]
 *   selection  block j covers tokens [j*ls, (j+1)*ls - 1]
 */
#ifndef NSA_KERNELS_COMMON_NSA_BLOCKS_H
#define NSA_KERNELS_COMMON_NSA_BLOCKS_H

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
#define NSA_HD __host__ __device__ __forceinline__
#elif defined(__cplusplus)
#define NSA_HD inline
#else
#define NSA_HD static inline
#endif

/* ceil(a / b) for a >= 0, b > 0. */
NSA_HD int64_t nsa_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

NSA_HD int64_t nsa_min64(int64_t a, int64_t b) { return a < b ? a : b; }
NSA_HD int64_t nsa_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Nc: compressed blocks of a sequence of T tokens, floor((T - l) / d) + 1 if T >= l. [1] */
NSA_HD int64_t nsa_num_cmp_blocks(int64_t T, int64_t l, int64_t d)
{
    return T >= l ? (T - l) / d + 1 : 0;
}

/* nc(t): compressed blocks visible to the query at local position t, i.e. the
 * blocks i with i*d + l - 1 <= t.  Equals nsa_num_cmp_blocks(t + 1, l, d). [2] */
NSA_HD int64_t nsa_cmp_visible(int64_t t, int64_t l, int64_t d)
{
    return t + 1 >= l ? (t + 1 - l) / d + 1 : 0;
}

/* Ns: selection blocks of a sequence of T tokens, ceil(T / ls). [3] */
NSA_HD int64_t nsa_num_slc_blocks(int64_t T, int64_t ls) { return nsa_ceil_div(T, ls); }

/* Last eligible selection block of the query at t: floor(t / ls) (its own block). [3] */
NSA_HD int64_t nsa_slc_last(int64_t t, int64_t ls) { return t / ls; }

/* Is selection block j forced for the query at t?  j < n_init, or one of the
 * n_local blocks ending at the query's own block. Only meaningful for eligible
 * j (j <= t / ls). [3] */
NSA_HD int nsa_slc_forced(int64_t j, int64_t t, int64_t ls, int64_t n_init, int64_t n_local)
{
    int64_t cur = t / ls;
    return j < n_init || (j <= cur && j > cur - n_local);
}

/* First token of the sliding window of the query at t: max(0, t - w + 1). [5] */
NSA_HD int64_t nsa_win_start(int64_t t, int64_t w) { return t - w + 1 > 0 ? t - w + 1 : 0; }

/* Tokens shared by compressed block i and selection block j (0 if disjoint). [3] */
NSA_HD int64_t nsa_overlap(int64_t i, int64_t j, int64_t l, int64_t d, int64_t ls)
{
    int64_t lo = nsa_max64(i * d, j * ls);
    int64_t hi = nsa_min64(i * d + l, (j + 1) * ls); /* exclusive */
    return hi > lo ? hi - lo : 0;
}

/* First compressed block overlapping selection block j (may exceed the last
 * existing block; clamp with Nc or nc(t) yourself): the smallest i >= 0 with
 * i*d + l - 1 >= j*ls. [3] */
NSA_HD int64_t nsa_cmp_first_overlapping(int64_t j, int64_t l, int64_t d, int64_t ls)
{
    int64_t a = j * ls - l + 1; /* need i*d >= a */
    return a > 0 ? nsa_ceil_div(a, d) : 0;
}

/* Last compressed block overlapping selection block j: the largest i with
 * i*d <= (j+1)*ls - 1. Clamp to nc(t) - 1 yourself. [3] */
NSA_HD int64_t nsa_cmp_last_overlapping(int64_t j, int64_t ls, int64_t d)
{
    return ((j + 1) * ls - 1) / d;
}

/* First and last selection blocks overlapped by compressed block i (the
 * scatter form of the same mapping: block i contributes overlap(i, j) / d of
 * its probability to each j in [first, last]). [3] */
NSA_HD int64_t nsa_slc_first_overlapped(int64_t i, int64_t d, int64_t ls) { return (i * d) / ls; }
NSA_HD int64_t nsa_slc_last_overlapped(int64_t i, int64_t l, int64_t d, int64_t ls)
{
    return (i * d + l - 1) / ls;
}

#endif /* NSA_KERNELS_COMMON_NSA_BLOCKS_H */
