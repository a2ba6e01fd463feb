/*
 * compress.cl: everything of the COMPRESS stage that is not a GEMM (semantics
 * section 1). Compressed row r of sequence b (r = cu_cmp[b] + i) covers the tokens
 * cu_seqlens[b] + i*d .. + l - 1. Outputs kc / vc are f32 [total_cmp, Hkv, D] holding
 * values of the storage type: kc / vc are tensors of the call's dtype (semantics
 * section 7), so MEAN and LINEAR round each element once, to nearest even, to nsa_t.
 *
 *   compress_mean   MEAN: the average of the l rows (f32 sum in token order, / l),
 *                   rounded to nsa_t.
 *   convert_rows    EXTERNAL: convert-copy of the caller's kc / vc to f32.
 *   stage_heads     LINEAR: k [T, Hkv, D] -> f32 head-major [Hkv, T, D], so that the l/d
 *                   sub-blocks of d tokens of every compressed block are plain row-major
 *                   matrices with leading dimension d*D for the CLBlast GEMMs.
 *   convert_dense   LINEAR: W / pe (contiguous, storage type) -> f32.
 *   fill_rows       LINEAR: kc[r, g, :] = bias[g, :] (pe @ W, or 0 when bias is NULL),
 *                   the C matrix the GEMMs then accumulate into with beta = 1.
 *   round_rows      LINEAR: kc[r, g, :] rounded to nsa_t in place, after the GEMMs
 *                   (not launched for f32, where it changes nothing).
 *   compress_linear LINEAR without CLBlast: one work-item per output element,
 *                   sum_j sum_e (x[tok0 + j, g, e] + pe[g, j, e]) W[g, j, e, c] in f32
 *                   (j, then e, in order), rounded to nsa_t. Plain FMA, l * D per
 *                   element: correct and portable, not fast.
 *
 * All are element-wise: global id e = first + get_global_id(0) over `total` elements
 * (launches are split into pieces, `first` is the piece's start), guarded e < total.
 */

/* Sequence of global compressed row r: the largest b < batch with cu_cmp[b] <= r. */
inline long seq_of_row(const __global long *cu_cmp, long batch, long r)
{
    long lo = 0, hi = batch - 1;
    while (lo < hi) {
        const long mid = (lo + hi + 1) / 2;
        if (cu_cmp[mid] <= r) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* First token of global compressed row r: cu_seqlens[b] + (r - cu_cmp[b]) * d. */
inline long row_first_token(const __global long *tab, long cu_seq_at, long cu_cmp_at, long batch, long d, long r)
{
    const long b = seq_of_row(tab + cu_cmp_at, batch, r);
    return tab[cu_seq_at + b] + (r - tab[cu_cmp_at + b]) * d;
}

/* x rounded to the storage type (nearest even) and back to f32. f16 goes through
 * vstore_half_rte / vload_half on a private ushort, as a half variable would need
 * cl_khr_fp16. */
inline float round_nsa(float x)
{
#if NSA_DTYPE == NSA_F32
    return x;
#elif NSA_DTYPE == NSA_F16
    ushort h;
    vstore_half_rte(x, 0, (__private half *)&h);
    return vload_half(0, (const __private half *)&h);
#else
    return bf16_to_f32(f32_to_bf16(x));
#endif
}

__kernel void compress_mean(const __global nsa_t *x, long x_off, long x_st, long x_sh,
                            __global float *y, long y_off, long y_st, long y_sh,
                            const __global long *tab, long cu_seq_at, long cu_cmp_at, long batch,
                            long Hkv, long D, long l, long d, long total, long first)
{
    const long e = first + (long)get_global_id(0);
    if (e >= total) return;
    const long c = e % D, rg = e / D, g = rg % Hkv, r = rg / Hkv;
    const long tok0 = row_first_token(tab, cu_seq_at, cu_cmp_at, batch, d, r);
    float s = 0.0f;
    for (long j = 0; j < l; ++j)
        s += ld(x, x_off + (tok0 + j) * x_st + g * x_sh + c);
    y[y_off + r * y_st + g * y_sh + c] = round_nsa(s / (float)l);
}

__kernel void convert_rows(const __global nsa_t *x, long x_off, long x_st, long x_sh,
                           __global float *y, long y_off, long y_st, long y_sh,
                           long Hkv, long D, long total, long first)
{
    const long e = first + (long)get_global_id(0);
    if (e >= total) return;
    const long c = e % D, rg = e / D, g = rg % Hkv, r = rg / Hkv;
    y[y_off + r * y_st + g * y_sh + c] = ld(x, x_off + r * x_st + g * x_sh + c);
}

__kernel void stage_heads(const __global nsa_t *x, long x_off, long x_st, long x_sh,
                          __global float *y, long y_off,
                          long T, long Hkv, long D, long total, long first)
{
    const long e = first + (long)get_global_id(0);
    if (e >= total) return;
    const long c = e % D, tg = e / D, g = tg % Hkv, t = tg / Hkv;
    y[y_off + (g * T + t) * D + c] = ld(x, x_off + t * x_st + g * x_sh + c);
}

__kernel void convert_dense(const __global nsa_t *x, long x_off, __global float *y, long y_off,
                            long total, long first)
{
    const long e = first + (long)get_global_id(0);
    if (e >= total) return;
    y[y_off + e] = ld(x, x_off + e);
}

__kernel void fill_rows(__global float *y, long y_off, long y_st, long y_sh,
                        const __global float *bias, int has_bias,
                        long Hkv, long D, long total, long first)
{
    const long e = first + (long)get_global_id(0);
    if (e >= total) return;
    const long c = e % D, rg = e / D, g = rg % Hkv, r = rg / Hkv;
    y[y_off + r * y_st + g * y_sh + c] = has_bias ? bias[g * D + c] : 0.0f;
}

__kernel void round_rows(__global float *y, long y_off, long y_st, long y_sh,
                         long Hkv, long D, long total, long first)
{
    const long e = first + (long)get_global_id(0);
    if (e >= total) return;
    const long c = e % D, rg = e / D, g = rg % Hkv, r = rg / Hkv;
    const long i = y_off + r * y_st + g * y_sh + c;
    y[i] = round_nsa(y[i]);
}

/* LINEAR: s plus one token row's part of output element c, sum_e (x[xr + e] +
 * pe[pr + e]) W[wr + e * D] in plain FMA, e in order (compress_linear, and the
 * decode step's decode_compress, which reads the rows from a paged cache). */
inline float linear_add_row(float s, const __global nsa_t *x, long xr, const __global nsa_t *w, long wr,
                            const __global nsa_t *pe, long pr, int has_pe, long D)
{
    for (long k = 0; k < D; ++k) {
        const float xv = ld(x, xr + k) + (has_pe ? ld(pe, pr + k) : 0.0f);
        s = fma(xv, ld(w, wr + k * D), s);
    }
    return s;
}

__kernel void compress_linear(const __global nsa_t *x, long x_off, long x_st, long x_sh,
                              const __global nsa_t *w, long w_off, const __global nsa_t *pe, long pe_off, int has_pe,
                              __global float *y, long y_off, long y_st, long y_sh,
                              const __global long *tab, long cu_seq_at, long cu_cmp_at, long batch,
                              long Hkv, long D, long l, long d, long total, long first)
{
    const long e = first + (long)get_global_id(0);
    if (e >= total) return;
    const long c = e % D, rg = e / D, g = rg % Hkv, r = rg / Hkv;
    const long tok0 = row_first_token(tab, cu_seq_at, cu_cmp_at, batch, d, r);
    float s = 0.0f;
    for (long j = 0; j < l; ++j)
        s = linear_add_row(s, x, x_off + (tok0 + j) * x_st + g * x_sh, w, w_off + (g * l + j) * D * D + c, pe,
                           pe_off + (g * l + j) * D, has_pe, D);
    y[y_off + r * y_st + g * y_sh + c] = round_nsa(s);
}
