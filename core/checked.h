/*
 * Checked 64-bit size arithmetic: the one copy that the core, the nsa tool, the
 * testkit and the fuzzers share.
 *
 * Every size product and offset sum that comes from a caller, a flag or a file
 * goes through these before it is used or allocated. Each returns 1 when the
 * exact result does not fit (then *out is unspecified and must not be used),
 * else 0 with the result in *out. No undefined behaviour for any input.
 *
 * Header-only and dependent on <stdint.h> and <stddef.h> alone, so that code
 * which may include only public headers (tools/, tests/common, tests/fuzz) can
 * include it too: its meson.build adds core/ to the include path for this one
 * header, which is not part of the library's API and declares no library symbol.
 */
#ifndef NSA_CORE_CHECKED_H
#define NSA_CORE_CHECKED_H

#include <stddef.h>
#include <stdint.h>

#if !defined(__GNUC__) && !defined(__clang__)
#error "core/checked.h needs __builtin_*_overflow (gcc or clang)"
#endif

/* a * b */
static inline int nsa_ck_mul(int64_t a, int64_t b, int64_t *out) { return __builtin_mul_overflow(a, b, out); }

/* a + b */
static inline int nsa_ck_add(int64_t a, int64_t b, int64_t *out) { return __builtin_add_overflow(a, b, out); }

/* a - b */
static inline int nsa_ck_sub(int64_t a, int64_t b, int64_t *out) { return __builtin_sub_overflow(a, b, out); }

/* The product of n factors (1 for n = 0). Overflow in any partial product is
 * reported, even if a later factor is 0: sizes are validated one bound at a time. */
static inline int nsa_ck_prod(const int64_t *factors, int n, int64_t *out)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        if (__builtin_mul_overflow(p, factors[i], &p)) return 1;
    *out = p;
    return 0;
}

/* count elements of esize bytes as a byte count that fits both int64_t and
 * size_t; count < 0 is reported as overflow too (it is never a size). */
static inline int nsa_ck_bytes(int64_t count, size_t esize, size_t *out)
{
    int64_t b;
    if (count < 0 || esize > (size_t)INT64_MAX || __builtin_mul_overflow(count, (int64_t)esize, &b)) return 1;
    if ((uint64_t)b > (uint64_t)SIZE_MAX) return 1;
    *out = (size_t)b;
    return 0;
}

#endif /* NSA_CORE_CHECKED_H */
