/*
 * Element types of the cpu reference: f32, f16 (IEEE binary16), bf16 and f64.
 *
 * Loads are exact (every f16/bf16/f32/f64 value is a double). f64 stores are
 * the double itself, so an f64 call rounds nowhere on its way to o. Stores round to
 * nearest, ties to even. A double is rounded to f16/bf16 in one correct step:
 * it is first rounded to float with round-to-odd, which keeps a sticky bit, and
 * float has at least two more significand bits than f16 (11) and bf16 (8), so
 * the second rounding (to nearest even) gives the same result as rounding the
 * double directly.
 *
 * The stage loops call the row helpers (one dtype switch per row) instead of
 * nsa_convert, which is a public API call with argument checks.
 */
#ifndef NSA_CPU_DTYPE_H
#define NSA_CPU_DTYPE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_backend.h"

static inline uint32_t nsa_cpu_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float nsa_cpu_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- f16 */

static inline float nsa_cpu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in float */
        float mag = (float)man * 0x1p-24f;
        return nsa_cpu_bits_f32(sign | nsa_cpu_f32_bits(mag));
    }
    if (exp == 31) /* inf or NaN (payload kept) */
        return nsa_cpu_bits_f32(sign | 0x7f800000u | (man << 13));
    return nsa_cpu_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t nsa_cpu_f32_to_f16(float f)
{
    uint32_t x = nsa_cpu_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: stays a quiet NaN */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 (halfway above 65504) and inf: inf */
        return (uint16_t)(sign | 0x7c00u);
    uint32_t e = ax >> 23; /* biased float exponent */
    if (ax < 0x38800000u) {
        /* below 2^-14: an f16 subnormal (units of 2^-24) or zero */
        if (e < 102) /* below 2^-25 (2^-25 itself ties to 0) */
            return sign;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14 .. 24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((e - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++; /* a carry into the exponent is the correct next value */
    return (uint16_t)(sign | r);
}

/* ---- bf16 */

static inline float nsa_cpu_bf16_to_f32(uint16_t b)
{
    return nsa_cpu_bits_f32((uint32_t)b << 16);
}

static inline uint16_t nsa_cpu_f32_to_bf16(float f)
{
    uint32_t x = nsa_cpu_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: stays a quiet NaN */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---- double to float with round-to-odd (the first of the two steps above) */

static inline float nsa_cpu_f64_to_f32_odd(double d)
{
    float f = (float)d;
    if ((double)f == d || isnan(d) || isinf(f))
        return f;
    uint32_t b = nsa_cpu_f32_bits(f);
    if (fabs((double)f) > fabs(d))
        b -= 1u; /* one step toward zero: the truncated value */
    return nsa_cpu_bits_f32(b | 1u);
}

static inline uint16_t nsa_cpu_f64_to_f16(double d)
{
    return nsa_cpu_f32_to_f16(nsa_cpu_f64_to_f32_odd(d));
}

static inline uint16_t nsa_cpu_f64_to_bf16(double d)
{
    return nsa_cpu_f32_to_bf16(nsa_cpu_f64_to_f32_odd(d));
}

/* ---- rows: n contiguous elements starting at element `off` of `base` */

/* 1 for f32, f16, bf16, f64. */
static inline int nsa_cpu_is_float(nsa_dtype dt)
{
    return dt == NSA_DTYPE_F32 || dt == NSA_DTYPE_F16 || dt == NSA_DTYPE_BF16 || dt == NSA_DTYPE_F64;
}

/* ---- scalars of the call's float type (gates, LSEs, dgate, workspace rows:
 * f32, or f64 in an f64 call; backend.h's nsa_bk_float_dtype) */

/* element `at` (an element offset) of an f32 or f64 tensor */
static inline double nsa_cpu_fget(const nsa_bk_tensor *t, int64_t at)
{
    return t->dtype == NSA_DTYPE_F64 ? ((const double *)nsa_cpu_base(t))[at]
                                     : (double)((const float *)nsa_cpu_base(t))[at];
}

/* element `at` of an f32 or f64 tensor = x (rounded once to float for f32) */
static inline void nsa_cpu_fset(const nsa_bk_tensor *t, int64_t at, double x)
{
    if (t->dtype == NSA_DTYPE_F64)
        ((double *)nsa_cpu_base(t))[at] = x;
    else
        ((float *)nsa_cpu_base(t))[at] = (float)x;
}

/* NSA_SUCCESS when t (present, or absent and optional) has the call's float
 * type; else an error recorded with set_error naming the stage and tensor. */
NSA_CPU_INTERNAL nsa_status nsa_cpu_need_float(const nsa_bk_args *a, const nsa_bk_tensor *t, const char *stage,
                                               const char *name, int optional, nsa_status wrong);

/* sum_i x[i] * y[i] in double, in a fixed order that does not depend on
 * the data or the thread: four interleaved partial sums (i mod 4), added as
 * (s0 + s1) + (s2 + s3), then the tail. The four chains let the CPU overlap
 * the additions (a single chain is latency bound) and keep results bitwise
 * reproducible. */
static inline double nsa_cpu_dot(const double *x, const double *y, int64_t n)
{
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += x[i] * y[i];
        s1 += x[i + 1] * y[i + 1];
        s2 += x[i + 2] * y[i + 2];
        s3 += x[i + 3] * y[i + 3];
    }
    double s = (s0 + s1) + (s2 + s3);
    for (; i < n; i++)
        s += x[i] * y[i];
    return s;
}

/* out[i] = x[off + i] */
NSA_CPU_INTERNAL void nsa_cpu_load_row(const void *base, nsa_dtype dt, int64_t off, int64_t n,
                                       double *out);
/* acc[i] += a * row[off + i] */
NSA_CPU_INTERNAL void nsa_cpu_axpy_row(double a, const void *base, nsa_dtype dt, int64_t off, int64_t n,
                                       double *acc);
/* row[off + i] = round(x[i]) */
NSA_CPU_INTERNAL void nsa_cpu_store_row(const double *x, void *base, nsa_dtype dt, int64_t off,
                                        int64_t n);

#endif
