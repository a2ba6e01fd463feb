/* Small public utilities: version, dtypes, host conversion, portable random numbers. */
#include <math.h>
#include <string.h>

#include "checked.h"
#include "internal.h"

#define STR2(x) #x
#define STR(x) STR2(x)

const char *nsa_version_string(void)
{
    return STR(NSA_VERSION_MAJOR) "." STR(NSA_VERSION_MINOR) "." STR(NSA_VERSION_PATCH);
}

size_t nsa_dtype_size(nsa_dtype dtype)
{
    switch (dtype) {
    case NSA_DTYPE_F32: return 4;
    case NSA_DTYPE_F16: return 2;
    case NSA_DTYPE_BF16: return 2;
    case NSA_DTYPE_I32: return 4;
    case NSA_DTYPE_F64: return 8;
    }
    return 0;
}

const char *nsa_dtype_name(nsa_dtype dtype)
{
    switch (dtype) {
    case NSA_DTYPE_F32: return "f32";
    case NSA_DTYPE_F16: return "f16";
    case NSA_DTYPE_BF16: return "bf16";
    case NSA_DTYPE_I32: return "i32";
    case NSA_DTYPE_F64: return "f64";
    }
    return "unknown";
}

nsa_tensor nsa_tensor_dense(nsa_buffer *buf, int64_t offset, int64_t heads, int64_t dim)
{
    int64_t st;
    if (nsa_ck_mul(heads, dim, &st)) st = -1; /* no such view: nsa_forward refuses the negative stride */
    return (nsa_tensor){.buffer = buf, .offset = offset, .stride_token = st, .stride_head = dim};
}

/* ---- f16 / bf16 <-> f32, round to nearest even, NaN and infinities kept */

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and a NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static uint16_t f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);      /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);     /* overflow (>= 65520) -> inf */
    if (a < 0x38800000u) {                                         /* subnormal or zero in f16 */
        /* value = a as float; f16 subnormal unit = 2^-24 */
        float v = bits_f32(a);
        float scaled = v * 16777216.0f; /* exact: power of two */
        uint32_t q = (uint32_t)scaled;  /* truncate, then round to nearest even */
        float rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t mant = a & 0x7fffffu;
    uint32_t exp = (a >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* carry may bump exponent: correct */
    return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f); /* exact */
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

/* double to float rounded to odd: the float nearest below |d| in magnitude with
 * its last bit set when d is not a float. Float has at least two more
 * significand bits than f16 and bf16, so rounding that to nearest even gives
 * the double's own rounding (one rounding, not two). */
static float f64_to_f32_odd(double d)
{
    float f = (float)d;
    if ((double)f == d || isnan(d) || isinf(f)) return f;
    uint32_t b = f32_bits(f);
    if (fabs((double)f) > fabs(d)) b -= 1u; /* one step toward zero */
    return bits_f32(b | 1u);
}

/* Every value of f32, f16 and bf16 is a double: loads are exact. */
static double load_any(const void *p, nsa_dtype dt, int64_t i)
{
    switch (dt) {
    case NSA_DTYPE_F32: return ((const float *)p)[i];
    case NSA_DTYPE_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    case NSA_DTYPE_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case NSA_DTYPE_F64: return ((const double *)p)[i];
    default: return 0.0;
    }
}

static void store_any(void *p, nsa_dtype dt, int64_t i, double v)
{
    switch (dt) {
    case NSA_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case NSA_DTYPE_F16: ((uint16_t *)p)[i] = f32_to_f16(f64_to_f32_odd(v)); break;
    case NSA_DTYPE_BF16: ((uint16_t *)p)[i] = f32_to_bf16(f64_to_f32_odd(v)); break;
    case NSA_DTYPE_F64: ((double *)p)[i] = v; break;
    default: break;
    }
}

nsa_status nsa_convert(const void *src, nsa_dtype src_dtype, void *dst, nsa_dtype dst_dtype, int64_t n)
{
    nsa_clear_error();
    if (n < 0)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_convert: n = %lld is negative", (long long)n);
    if (n > 0 && !src) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_convert: src is NULL");
    if (n > 0 && !dst) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_convert: dst is NULL");
    const nsa_dtype ok[] = {NSA_DTYPE_F32, NSA_DTYPE_F16, NSA_DTYPE_BF16, NSA_DTYPE_F64};
    int sok = 0, dok = 0;
    for (int i = 0; i < 4; i++) {
        sok |= src_dtype == ok[i];
        dok |= dst_dtype == ok[i];
    }
    if (!sok)
        return nsa_set_error(NSA_ERR_INVALID_DTYPE, "nsa_convert: src_dtype = %d is not f32, f16, bf16 or f64",
                             (int)src_dtype);
    if (!dok)
        return nsa_set_error(NSA_ERR_INVALID_DTYPE, "nsa_convert: dst_dtype = %d is not f32, f16, bf16 or f64",
                             (int)dst_dtype);
    /* of the wider dtype (4, or 8 with f64): then no element index or byte count below overflows */
    const int64_t wide = src_dtype == NSA_DTYPE_F64 || dst_dtype == NSA_DTYPE_F64 ? 8 : 4;
    size_t bytes;
    if (nsa_ck_bytes(n, wide, &bytes))
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_convert: n = %lld elements exceed the address space",
                             (long long)n);
    if (src_dtype == dst_dtype) {
        memmove(dst, src, (size_t)n * nsa_dtype_size(src_dtype));
        return NSA_SUCCESS;
    }
    for (int64_t i = 0; i < n; i++) store_any(dst, dst_dtype, i, load_any(src, src_dtype, i));
    return NSA_SUCCESS;
}

/* ---- portable counter-based generator: splitmix64's finaliser applied to a
 * combination of (seed, stream, index). Pure 64-bit integer arithmetic, so every
 * machine and compiler draws the same numbers. */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

uint64_t nsa_random_u64(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t k = mix64(seed + UINT64_C(0x9e3779b97f4a7c15));
    k = mix64(k ^ (stream * UINT64_C(0xd1b54a32d192ed03) + UINT64_C(0x632be59bd9b4e019)));
    return mix64(k + index * UINT64_C(0x9e3779b97f4a7c15));
}

nsa_status nsa_random_uniform(uint64_t seed, uint64_t stream, int64_t first, int64_t n, float lo, float hi,
                              float *out)
{
    nsa_clear_error();
    if (n < 0) return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_random_uniform: n = %lld is negative", (long long)n);
    if (first < 0)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_random_uniform: first = %lld is negative", (long long)first);
    int64_t end;
    if (nsa_ck_add(first, n, &end))
        return nsa_set_error(NSA_ERR_INVALID_VALUE,
                             "nsa_random_uniform: first = %lld plus n = %lld exceeds the largest index, 2^63 - 1",
                             (long long)first, (long long)n);
    if (n > 0 && !out) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_random_uniform: out is NULL");
    if (!isfinite(lo) || !isfinite(hi) || !(lo <= hi))
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_random_uniform: [lo, hi) = [%g, %g) is not a finite range",
                             (double)lo, (double)hi);
    for (int64_t i = 0; i < n; i++) {
        /* 24 random bits -> u in [0, 1) exactly; the product below is exact in
         * double, so fused or unfused arithmetic gives the same result. */
        double u = (double)(nsa_random_u64(seed, stream, (uint64_t)(first + i)) >> 40) * (1.0 / 16777216.0);
        float v = (float)((double)lo + ((double)hi - (double)lo) * u);
        out[i] = v < hi ? v : lo; /* rounding up to hi would break [lo, hi) */
    }
    return NSA_SUCCESS;
}
