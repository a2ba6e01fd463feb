/*
 * dtype.cl: loads and stores of the storage type (cfg.dtype), arithmetic in f32.
 *
 * The program is built once per dtype with -DNSA_DTYPE=0 (f32), 1 (f16) or 2 (bf16).
 * Nothing here needs cl_khr_fp16 (neither PoCL nor NVIDIA's OpenCL has it):
 *   f16  -> a `half *` may be declared without the extension and is accessed only through
 *           vload_half / vstore_half_rte (round to nearest even);
 *   bf16 -> stored as ushort, converted with bit operations (round to nearest even,
 *           NaN stays a quiet NaN).
 *
 * Every kernel takes its tensors as (pointer, element offset, strides) and computes
 * element indices in 64 bits (long): T * H * D passes 2^31 at about 64k tokens.
 */
#ifndef NSA_DTYPE
#error "build with -DNSA_DTYPE=0|1|2"
#endif

#define NSA_F32 0
#define NSA_F16 1
#define NSA_BF16 2

#if NSA_DTYPE == NSA_F32
typedef float nsa_t;
#elif NSA_DTYPE == NSA_F16
typedef half nsa_t;
#elif NSA_DTYPE == NSA_BF16
typedef ushort nsa_t;
#else
#error "unknown NSA_DTYPE"
#endif

inline float bf16_to_f32(ushort b)
{
    return as_float((uint)b << 16);
}

inline ushort f32_to_bf16(float f)
{
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)      /* NaN: keep the sign, force quiet */
        return (ushort)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);          /* round to nearest, ties to even */
    return (ushort)(u >> 16);
}

/* Element i of a storage-type array, as f32. */
inline float ld(const __global nsa_t *p, long i)
{
#if NSA_DTYPE == NSA_F32
    return p[i];
#elif NSA_DTYPE == NSA_F16
    return vload_half((size_t)i, p);
#else
    return bf16_to_f32(p[i]);
#endif
}

/* Stores x (f32) as element i of a storage-type array, rounding to nearest even. */
inline void st(__global nsa_t *p, long i, float x)
{
#if NSA_DTYPE == NSA_F32
    p[i] = x;
#elif NSA_DTYPE == NSA_F16
    vstore_half_rte(x, (size_t)i, p);
#else
    p[i] = f32_to_bf16(x);
#endif
}

/* Rows and positions (core/backend.h, nsa_bk_plan): sequence b's query rows
 * tab[cu_seq + b] .. tab[cu_seq + b + 1] - 1 are the last positions of its key rows
 * tab[cu_k + b] .. tab[cu_k + b + 1] - 1 (cu_k == cu_seq but for the plans of
 * nsa_plan_create_varlen with fewer queries than keys). The position of query row t: */
inline long q_pos(const __global long *tab, long cu_seq, long cu_k, long b, long t)
{
    return t - tab[cu_seq + b + 1] + (tab[cu_k + b + 1] - tab[cu_k + b]);
}

/* The sequence of key row r (tok_seq maps query rows, which are the key rows when
 * cu_k == cu_seq): the last b < B with tab[cu_k + b] <= r. */
inline long key_seq(const __global long *tab, long cu_seq, long cu_k, long tok_seq, long B, long r)
{
    if (cu_k == cu_seq) return tab[tok_seq + r];
    long lo = 0, hi = B - 1;
    while (lo < hi) {
        const long mid = lo + (hi - lo + 1) / 2;
        if (tab[cu_k + mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}
