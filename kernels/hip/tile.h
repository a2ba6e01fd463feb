/*
 * tile.h -- device helpers shared by the HIP kernels: LDS tiles of query rows
 * and key rows, the score tile (q . k for every row/key pair), block-wide
 * scans through LDS, and the row -> sequence lookup.
 *
 * Nothing here depends on the wave size: every cross-thread step goes through
 * LDS and __syncthreads(), so wave32 and wave64 targets run the same code.
 * Every sum is evaluated in one fixed order (deterministic results).
 */
#ifndef NSA_KERNELS_HIP_TILE_H
#define NSA_KERNELS_HIP_TILE_H

#include "nsa_hip.h" /* first: the HIP runtime header defines __device__ & co. */
#include "nsa_blocks.h"
#include "nsa_dtype.h"

#define NSA_LOG2E 1.4426950408889634f
#define NSA_LN2 0.6931471805599453f

/* -inf without <cmath> constants that differ between toolchains. */
NSA_DEV float nsa_neg_inf(void) { return -__int_as_float(0x7f800000); }

/* Sequence b of compressed row r: the last b with cu_cmp[b] <= r (skips empty
 * sequences, whose offsets repeat). r < cu_cmp[B]. */
NSA_DEV int64_t nsa_hip_seq_of_row(const int64_t *cu_cmp, int64_t B, int64_t r)
{
    int64_t lo = 0, hi = B;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (cu_cmp[mid] <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Qs[r][c] = q[t, h0 + r, c] * scale for r < rows and c < D; 0 for the
 * padding rows rows <= r < R and columns D <= c < dpad. Row stride ldq
 * (padded against LDS bank conflicts). */
template <typename T>
NSA_DEV void nsa_hip_load_q(float *Qs, int ldq, nsa_hip_tensor q, int64_t t, int64_t h0, int rows, int R,
                            int64_t D, int dpad, float scale)
{
    const T *base = (const T *)q.ptr + t * q.st + h0 * q.sh;
    const int n = R * dpad;
    for (int i = threadIdx.x; i < n; i += NSA_HIP_THREADS) {
        int r = i / dpad, c = i - r * dpad;
        Qs[r * ldq + c] = (r < rows && c < D) ? nsa_ld(base + r * q.sh + c) * scale : 0.0f;
    }
}

/* Xs[k][c] = x[krow[k], g, c0 + c] for c < cols; 0 where krow[k] < 0 and in
 * the padding columns cols <= c < cpad. */
template <typename T>
NSA_DEV void nsa_hip_load_keys(float *Xs, int ldx, nsa_hip_tensor x, const int64_t *krow, int nk, int64_t g,
                               int64_t c0, int cols, int cpad)
{
    const T *base = (const T *)x.ptr + g * x.sh + c0;
    const int n = nk * cpad;
    for (int i = threadIdx.x; i < n; i += NSA_HIP_THREADS) {
        int k = i / cpad, c = i - k * cpad;
        int64_t row = krow[k];
        Xs[k * ldx + c] = (row >= 0 && c < cols) ? nsa_ld(base + row * x.st + c) : 0.0f;
    }
}

/* Ss[r][k] = Qs[r] . Ks[k] over D, or -inf where krow[k] < 0 (rows < R). */
NSA_DEV void nsa_hip_score_tile(float *Ss, int lds, const float *Qs, int ldq, const float *Ks, int ldk,
                                const int64_t *krow, int R, int nk, int D)
{
    const int n = R * nk;
    for (int i = threadIdx.x; i < n; i += NSA_HIP_THREADS) {
        int r = i / nk, k = i - r * nk;
        float s = nsa_neg_inf();
        if (krow[k] >= 0) {
            const float *qr = Qs + r * ldq, *kr = Ks + k * ldk;
            s = 0.0f;
            for (int c = 0; c < D; c++) s = fmaf(qr[c], kr[c], s);
        }
        Ss[r * lds + k] = s;
    }
}

/* Exclusive prefix sum of one int per thread over the block, in thread order
 * (Hillis-Steele through buf[NSA_HIP_THREADS]). *total gets the block sum.
 * Every thread must call it. */
NSA_DEV int nsa_hip_block_scan(int v, int *buf, int *total)
{
    const int tid = threadIdx.x;
    buf[tid] = v;
    __syncthreads();
    for (int off = 1; off < NSA_HIP_THREADS; off <<= 1) {
        int x = tid >= off ? buf[tid - off] : 0;
        __syncthreads();
        buf[tid] += x;
        __syncthreads();
    }
    int incl = buf[tid];
    *total = buf[NSA_HIP_THREADS - 1];
    __syncthreads();
    return incl - v;
}

/* Grid of blocks for n elements, one per thread, capped (kernels loop). */
static inline unsigned nsa_hip_grid_1d(int64_t n)
{
    int64_t b = (n + NSA_HIP_THREADS - 1) / NSA_HIP_THREADS;
    if (b > 65535 * 16) b = 65535 * 16;
    return (unsigned)(b > 0 ? b : 1);
}

/* Launches KERNEL<storage type of dtype>. */
#define NSA_HIP_DISPATCH(dtype, KERNEL, GRID, LDS, STREAM, ...)                                                 \
    do {                                                                                                        \
        if ((dtype) == NSA_DT_F16)                                                                              \
            KERNEL<nsa_f16_s><<<GRID, NSA_HIP_THREADS, LDS, STREAM>>>(__VA_ARGS__);                            \
        else if ((dtype) == NSA_DT_BF16)                                                                        \
            KERNEL<nsa_bf16_s><<<GRID, NSA_HIP_THREADS, LDS, STREAM>>>(__VA_ARGS__);                           \
        else                                                                                                    \
            KERNEL<float><<<GRID, NSA_HIP_THREADS, LDS, STREAM>>>(__VA_ARGS__);                                \
    } while (0)

#endif /* NSA_KERNELS_HIP_TILE_H */
