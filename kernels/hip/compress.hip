/*
 * compress.hip -- stage COMPRESS (docs/nsa-semantics.md, section 1): the
 * compressed keys/values kc, vc (f32 [total_cmp, Hkv, D]) from k/v of the
 * compressed branch. kc / vc are tensors of the call's dtype (section 7): MEAN
 * and LINEAR accumulate in f32 and round each element once, at the store, to the
 * storage type T (nearest even); the f32 workspace holds that value exactly.
 *
 * Compressed row r belongs to sequence b (cu_cmp[b] <= r < cu_cmp[b+1]) and is
 * block i = r - cu_cmp[b], covering tokens cu_seqlens[b] + i*d .. + l - 1.
 *   MEAN      one thread per output element sums its l inputs in token order.
 *   LINEAR    per KV head g a GEMM: C[r, e] = sum_kk A[r, kk] W[g, kk, e] with
 *             kk = j*D + c over l*D, A[r, kk] = k[tok(r) + j, g, c] + pe[g, j, c].
 *             32 x 64 output tiles, LDS-staged A and W in K-chunks of 16;
 *             each thread owns 2 x 4 outputs; fixed kk order.
 *   EXTERNAL  the caller's kc/vc converted to f32.
 */
#include "tile.h"

/* v rounded to the storage type T (nearest even, as nsa_st) and back to f32. */
template <typename T>
NSA_DEV float nsa_hip_round_to(float v)
{
    T t;
    nsa_st(&t, v);
    return nsa_ld(&t);
}

/* ---------------------------------------------------------------- MEAN */

template <typename T>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_mean_kernel(nsa_hip_dims dm, nsa_hip_tensor src, nsa_hip_tensor dst, int64_t D)
{
    const int64_t n = dm.total_cmp * dm.Hkv * D;
    const float inv = 1.0f / (float)dm.l;
    for (int64_t e = (int64_t)blockIdx.x * NSA_HIP_THREADS + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * NSA_HIP_THREADS) {
        int64_t c = e % D, rg = e / D, g = rg % dm.Hkv, r = rg / dm.Hkv;
        int64_t b = nsa_hip_seq_of_row(dm.cu_cmp, dm.B, r);
        int64_t tok = dm.cu_seqlens[b] + (r - dm.cu_cmp[b]) * dm.d;
        const T *p = (const T *)src.ptr + tok * src.st + g * src.sh + c;
        float s = 0.0f;
        for (int64_t j = 0; j < dm.l; j++) s += nsa_ld(p + j * src.st);
        ((float *)dst.ptr)[r * dst.st + g * dst.sh + c] = nsa_hip_round_to<T>(s * inv);
    }
}

/* ------------------------------------------------------------ EXTERNAL */

template <typename T>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_copy_kernel(nsa_hip_dims dm, nsa_hip_tensor src, nsa_hip_tensor dst, int64_t D)
{
    const int64_t n = dm.total_cmp * dm.Hkv * D;
    for (int64_t e = (int64_t)blockIdx.x * NSA_HIP_THREADS + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * NSA_HIP_THREADS) {
        int64_t c = e % D, rg = e / D, g = rg % dm.Hkv, r = rg / dm.Hkv;
        ((float *)dst.ptr)[r * dst.st + g * dst.sh + c] = nsa_ld((const T *)src.ptr + r * src.st + g * src.sh + c);
    }
}

/* -------------------------------------------------------------- LINEAR */

#define LIN_M 32 /* output rows per block */
#define LIN_N 64 /* output columns per block */
#define LIN_K 16 /* kk per LDS stage */

template <typename T>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_linear_kernel(nsa_hip_dims dm, nsa_hip_tensor src, nsa_hip_tensor w, nsa_hip_tensor pe,
                          nsa_hip_tensor dst, int64_t D)
{
    __shared__ float As[LIN_M][LIN_K + 1];
    __shared__ float Ws[LIN_K][LIN_N];
    __shared__ int64_t tok[LIN_M];

    const int tid = threadIdx.x;
    const int64_t col_tiles = (D + LIN_N - 1) / LIN_N;
    const int64_t g = blockIdx.y / col_tiles;
    const int64_t n0 = (blockIdx.y % col_tiles) * LIN_N;
    const int64_t r0 = (int64_t)blockIdx.x * LIN_M;
    const int64_t K = dm.l * D;
    const T *wg = (const T *)w.ptr + g * K * D;             /* W[g] as [l*D, D] */
    const T *peg = pe.ptr ? (const T *)pe.ptr + g * K : 0; /* pe[g] as [l*D] */

    if (tid < LIN_M) {
        int64_t r = r0 + tid;
        int64_t t = -1;
        if (r < dm.total_cmp) {
            int64_t b = nsa_hip_seq_of_row(dm.cu_cmp, dm.B, r);
            t = dm.cu_seqlens[b] + (r - dm.cu_cmp[b]) * dm.d;
        }
        tok[tid] = t;
    }
    const int ty = tid / 16, tx = tid % 16; /* rows 2*ty, 2*ty+1; columns tx + 16*m */
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    __syncthreads();

    for (int64_t k0 = 0; k0 < K; k0 += LIN_K) {
        for (int i = tid; i < LIN_M * LIN_K; i += NSA_HIP_THREADS) {
            int m = i / LIN_K, kk = i % LIN_K;
            int64_t kg = k0 + kk, t = tok[m];
            float a = 0.0f;
            if (t >= 0 && kg < K) {
                int64_t j = kg / D, c = kg - j * D;
                a = nsa_ld((const T *)src.ptr + (t + j) * src.st + g * src.sh + c);
                if (peg) a += nsa_ld(peg + kg);
            }
            As[m][kk] = a;
        }
        for (int i = tid; i < LIN_K * LIN_N; i += NSA_HIP_THREADS) {
            int kk = i / LIN_N, nn = i % LIN_N;
            int64_t kg = k0 + kk, col = n0 + nn;
            Ws[kk][nn] = (kg < K && col < D) ? nsa_ld(wg + kg * D + col) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < LIN_K; kk++) {
            float a0 = As[2 * ty][kk], a1 = As[2 * ty + 1][kk];
            for (int m = 0; m < 4; m++) {
                float b = Ws[kk][tx + 16 * m];
                acc[0][m] = fmaf(a0, b, acc[0][m]);
                acc[1][m] = fmaf(a1, b, acc[1][m]);
            }
        }
        __syncthreads();
    }
    for (int i = 0; i < 2; i++) {
        int64_t r = r0 + 2 * ty + i;
        if (r >= dm.total_cmp) continue;
        for (int m = 0; m < 4; m++) {
            int64_t col = n0 + tx + 16 * m;
            if (col < D) ((float *)dst.ptr)[r * dst.st + g * dst.sh + col] = nsa_hip_round_to<T>(acc[i][m]);
        }
    }
}

/* ------------------------------------------------------------ launchers */

hipError_t nsa_hip_compress_mean(const nsa_hip_dims *dm, nsa_hip_tensor src, nsa_hip_tensor dst, int64_t D,
                                 hipStream_t stream)
{
    int64_t n = dm->total_cmp * dm->Hkv * D;
    if (n == 0) return hipSuccess;
    dim3 grid(nsa_hip_grid_1d(n));
    NSA_HIP_DISPATCH(dm->dtype, nsa_hip_mean_kernel, grid, 0, stream, *dm, src, dst, D);
    return hipGetLastError();
}

hipError_t nsa_hip_compress_copy(const nsa_hip_dims *dm, nsa_hip_tensor src, nsa_hip_tensor dst, int64_t D,
                                 hipStream_t stream)
{
    int64_t n = dm->total_cmp * dm->Hkv * D;
    if (n == 0) return hipSuccess;
    dim3 grid(nsa_hip_grid_1d(n));
    NSA_HIP_DISPATCH(dm->dtype, nsa_hip_copy_kernel, grid, 0, stream, *dm, src, dst, D);
    return hipGetLastError();
}

hipError_t nsa_hip_compress_linear(const nsa_hip_dims *dm, nsa_hip_tensor src, nsa_hip_tensor w, nsa_hip_tensor pe,
                                   nsa_hip_tensor dst, int64_t D, hipStream_t stream)
{
    if (dm->total_cmp == 0) return hipSuccess;
    dim3 grid((unsigned)((dm->total_cmp + LIN_M - 1) / LIN_M), (unsigned)(dm->Hkv * ((D + LIN_N - 1) / LIN_N)));
    NSA_HIP_DISPATCH(dm->dtype, nsa_hip_linear_kernel, grid, 0, stream, *dm, src, w, pe, dst, D);
    return hipGetLastError();
}
