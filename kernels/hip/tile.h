/*
 * tile.h -- device helpers shared by the HIP kernels: LDS tiles of query rows
 * and key rows, the score tile (q . k for every row/key pair), the online
 * softmax step and the portable P V update of the attention kernels (the
 * forward's and the decode step's), block-wide scans through LDS, and the
 * row -> sequence lookup.
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

/* SLC: does the key chunk [k0, k0 + nk) of a selected-block list (slot =
 * key / ls; sel[slot] a block or -1) hold any key at or before tq? Uniform
 * over the block: every thread computes the same answer from the same
 * indices. */
NSA_DEV bool nsa_hip_slc_chunk_live(int64_t ls, int64_t k0, int nk, int64_t tq, const int *sel)
{
    for (int64_t slot = k0 / ls; slot <= (k0 + nk - 1) / ls; slot++) {
        int64_t j = sel[slot];
        int64_t first = k0 > slot * ls ? k0 - slot * ls : 0;
        if (j >= 0 && j * ls + first <= tq) return true;
    }
    return false;
}

/* The online-softmax step of a score tile Ps[R][ldp] over TK keys (log2
 * domain), one thread per row r < R, keys in order: the row's running max
 * m_r[r] and sum l_r[r] take the chunk, a_r[r] gets the rescale factor of the
 * earlier accumulators and Ps the chunk's unnormalised probabilities. Padding
 * rows (r >= rows) and rows with nothing visible yet get p = 0, alpha = 1. A
 * NaN logit wins the maximum (fmaxf would drop it, and a row of NaN logits
 * would pass for "nothing visible"): semantics 7, non-finite inputs. The
 * caller synchronizes before reading Ps or a_r. */
NSA_DEV void nsa_hip_softmax_step(float *Ps, int ldp, int R, int rows, int TK, float *m_r, float *l_r, float *a_r)
{
    const int tid = threadIdx.x;
    if (tid >= R) return;
    float *p = Ps + tid * ldp;
    float mo = m_r[tid], mx = mo;
    for (int kk = 0; kk < TK; kk++) mx = (p[kk] > mx || p[kk] != p[kk]) ? p[kk] : mx;
    if (tid >= rows || mx == nsa_neg_inf()) {
        for (int kk = 0; kk < TK; kk++) p[kk] = 0.0f;
        a_r[tid] = 1.0f;
        return;
    }
    float sum = 0.0f;
    for (int kk = 0; kk < TK; kk++) {
        float e = exp2f(p[kk] - mx); /* -inf -> 0 */
        p[kk] = e;
        sum += e;
    }
    float alpha = exp2f(mo - mx); /* mo = -inf -> 0 */
    a_r[tid] = alpha;
    l_r[tid] = l_r[tid] * alpha + sum;
    m_r[tid] = mx;
}

/* The portable P V update: the outputs e = tid + j * NSA_HIP_THREADS (row
 * e / DVC, column e % DVC of the rows x dvc block) in acc[j] are rescaled by
 * their row's alpha and take sum_kk P[row][kk] V[kk][column] (FMAs in key
 * order). N: the accumulators per thread. */
template <int N>
NSA_DEV void nsa_hip_pv_step(float (&acc)[N], const float *Ps, int ldp, const float *Vs, int ldv, const float *a_r,
                             int rows, int DVC, int dvc, int TK)
{
#pragma unroll
    for (int j = 0; j < N; j++) {
        int e = threadIdx.x + j * NSA_HIP_THREADS;
        int r = e / DVC, c = e - r * DVC;
        if (r < rows && c < dvc) {
            const float *p = Ps + r * ldp;
            float s = 0.0f;
            for (int kk = 0; kk < TK; kk++) s = fmaf(p[kk], Vs[kk * ldv + c], s);
            acc[j] = acc[j] * a_r[r] + s;
        }
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
