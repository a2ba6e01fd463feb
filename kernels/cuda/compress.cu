/*
 * compress.cu -- the COMPRESS stage (semantics section 1) and the packing of
 * the compressed keys/values for the tensor-core kernels.
 *
 * Compressed row r (global, 0 .. total_cmp-1) belongs to sequence b with
 * cu_cmp[b] <= r < cu_cmp[b+1]; its local index i = r - cu_cmp[b] covers the
 * tokens cu_seqlens[b] + i*d .. + l - 1. Output kc/vc is fp32 holding values
 * rounded once to the call's dtype (semantics 7: kc/vc are tensors of that
 * dtype), so the tensor-core kernels can pack them into 16 bits exactly.
 *
 * MEAN   one CTA per (row, head), threads over dims, l rows summed in order.
 *        Memory bound: every input row is read l/d times (from L2 after the
 *        first); 2 * T * Hkv * D * 2 bytes at T = 64k, D = 128: ~0.1 ms.
 * LINEAR kc_i = sum_j (k[i*d+j] + pe[g,j]) @ W[g,j]: a CTA computes 8 rows x
 *        128 output dims of one head; per j it stages the 8 input rows (+pe)
 *        in shared memory and streams W[g,j] (coalesced along the output
 *        dim), so each W element loaded serves 8 rows. Plain fp32 FFMA;
 *        correct first (l*D*D MACs per row and head).
 * EXTERNAL  convert-copy of the caller's kc/vc (cfg dtype) to fp32.
 */
#include "nsa_cuda.cuh"
#include "nsa_cuda_kernels.h"

namespace nsa_cuda {

/* x rounded to T (nearest even) and widened back: the stored kc/vc value. */
template <typename T> NSA_DEV float round_to(float x) { return to_f(from_f<T>(x)); }

template <typename T>
__global__ void compress_mean_kernel(const Geom g, const T *src, int64_t sst, int64_t ssh, int64_t D, float *dst,
                                     int64_t dst_st, int64_t dst_sh)
{
    const int64_t pairs = g.total_cmp * g.Hkv;
    for (int64_t pr = blockIdx.x; pr < pairs; pr += gridDim.x) {
        const int64_t r = pr / g.Hkv, h = pr % g.Hkv;
        const int64_t b = find_seq(g.cu_cmp, g.B, r);
        const int64_t tok0 = g.cu_seqlens[b] + (r - g.cu_cmp[b]) * g.d;
        const T *s = src + tok0 * sst + h * ssh;
        const float inv = 1.0f / (float)g.l;
        for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
            float acc = 0.f;
            for (int64_t j = 0; j < g.l; j++) acc += to_f(s[j * sst + k]);
            dst[r * dst_st + h * dst_sh + k] = round_to<T>(acc * inv);
        }
    }
}

constexpr int LIN_ROWS = 8, LIN_THREADS = 128;

template <typename T>
__global__ void __launch_bounds__(LIN_THREADS) compress_linear_kernel(const Geom g, const T *src, int64_t sst,
                                                                      int64_t ssh, int64_t D, const T *W,
                                                                      const T *pe, float *dst, int64_t dst_st,
                                                                      int64_t dst_sh)
{
    extern __shared__ float xs[]; /* [LIN_ROWS][D] */
    const int64_t r0 = (int64_t)blockIdx.x * LIN_ROWS, h = blockIdx.y;
    const int64_t o = (int64_t)blockIdx.z * LIN_THREADS + threadIdx.x;
    __shared__ int64_t tok0[LIN_ROWS];
    if (threadIdx.x < LIN_ROWS) {
        const int64_t r = r0 + threadIdx.x;
        int64_t t = -1;
        if (r < g.total_cmp) {
            const int64_t b = find_seq(g.cu_cmp, g.B, r);
            t = g.cu_seqlens[b] + (r - g.cu_cmp[b]) * g.d;
        }
        tok0[threadIdx.x] = t;
    }
    float acc[LIN_ROWS];
#pragma unroll
    for (int rr = 0; rr < LIN_ROWS; rr++) acc[rr] = 0.f;
    for (int64_t j = 0; j < g.l; j++) {
        __syncthreads();
        for (int64_t e = threadIdx.x; e < (int64_t)LIN_ROWS * D; e += LIN_THREADS) {
            const int rr = (int)(e / D);
            const int64_t k = e % D;
            float x = 0.f;
            if (tok0[rr] >= 0) {
                x = to_f(src[(tok0[rr] + j) * sst + h * ssh + k]);
                if (pe) x += to_f(pe[(h * g.l + j) * D + k]);
            }
            xs[e] = x;
        }
        __syncthreads();
        if (o < D) {
            const T *wj = W + (h * g.l + j) * D * D + o;
            for (int64_t k = 0; k < D; k++) {
                const float w = to_f(wj[k * D]);
#pragma unroll
                for (int rr = 0; rr < LIN_ROWS; rr++) acc[rr] += xs[rr * D + k] * w;
            }
        }
    }
    if (o < D)
        for (int rr = 0; rr < LIN_ROWS; rr++)
            if (r0 + rr < g.total_cmp) dst[(r0 + rr) * dst_st + h * dst_sh + o] = round_to<T>(acc[rr]);
}

template <typename T>
__global__ void compress_copy_kernel(const Geom g, const T *src, int64_t sst, int64_t ssh, int64_t D, float *dst,
                                     int64_t dst_st, int64_t dst_sh)
{
    const int64_t n = g.total_cmp * g.Hkv * D;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t k = e % D, rh = e / D, h = rh % g.Hkv, r = rh / g.Hkv;
        dst[r * dst_st + h * dst_sh + k] = to_f(src[r * sst + h * ssh + k]);
    }
}

/* The kc/vc rows (already values of T) as T, zero padded to DP dims. */
template <typename T>
__global__ void pack_cmp16_kernel(const Geom g, const float *src, int64_t sst, int64_t ssh, int64_t D, int DP,
                                  T *dst)
{
    const int64_t n = g.total_cmp * g.Hkv * DP;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t k = e % DP, rh = e / DP, h = rh % g.Hkv, r = rh / g.Hkv;
        const float x = k < D ? src[r * sst + h * ssh + k] : 0.f;
        dst[e] = from_f<T>(x);
    }
}

static unsigned grid_for(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b > (1 << 30)) b = 1 << 30;
    return (unsigned)(b > 0 ? b : 1);
}

cudaError_t compress_mean(const Geom &g, View src, int64_t D, MView dst, cudaStream_t s)
{
    const int64_t pairs = g.total_cmp * g.Hkv;
    if (pairs == 0) return cudaSuccess;
    const unsigned blocks = (unsigned)(pairs < (1 << 30) ? pairs : (1 << 30));
    const int threads = D >= 128 ? 128 : D >= 64 ? 64 : 32;
    NSA_DISPATCH_DTYPE(g.dtype, T,
                       compress_mean_kernel<T><<<blocks, threads, 0, s>>>(g, (const T *)src.p, src.st, src.sh, D,
                                                                          (float *)dst.p, dst.st, dst.sh));
    return cudaGetLastError();
}

cudaError_t compress_linear(const Geom &g, View src, int64_t D, const void *W, const void *pe, MView dst,
                            cudaStream_t s)
{
    if (g.total_cmp == 0) return cudaSuccess;
    const dim3 grid((unsigned)((g.total_cmp + LIN_ROWS - 1) / LIN_ROWS), (unsigned)g.Hkv,
                    (unsigned)((D + LIN_THREADS - 1) / LIN_THREADS));
    const size_t smem = (size_t)LIN_ROWS * D * sizeof(float);
    cudaError_t e = cudaSuccess;
    NSA_DISPATCH_DTYPE(g.dtype, T, {
        if (smem > 48 * 1024)
            e = cudaFuncSetAttribute(compress_linear_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem);
        if (e == cudaSuccess)
            compress_linear_kernel<T><<<grid, LIN_THREADS, smem, s>>>(g, (const T *)src.p, src.st, src.sh, D,
                                                                      (const T *)W, (const T *)pe,
                                                                      (float *)dst.p, dst.st, dst.sh);
    });
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}

cudaError_t compress_copy(const Geom &g, View src, int64_t D, MView dst, cudaStream_t s)
{
    const int64_t n = g.total_cmp * g.Hkv * D;
    if (n == 0) return cudaSuccess;
    NSA_DISPATCH_DTYPE(g.dtype, T,
                       compress_copy_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(g, (const T *)src.p, src.st,
                                                                               src.sh, D, (float *)dst.p,
                                                                               dst.st, dst.sh));
    return cudaGetLastError();
}

cudaError_t pack_cmp16(const Geom &g, View src, int64_t D, int DP, void *dst, cudaStream_t s)
{
    const int64_t n = g.total_cmp * g.Hkv * DP;
    if (n == 0) return cudaSuccess;
    if (g.dtype == 1)
        pack_cmp16_kernel<__half><<<grid_for(n, 256), 256, 0, s>>>(g, (const float *)src.p, src.st, src.sh, D, DP,
                                                                   (__half *)dst);
    else
        pack_cmp16_kernel<__nv_bfloat16><<<grid_for(n, 256), 256, 0, s>>>(
            g, (const float *)src.p, src.st, src.sh, D, DP, (__nv_bfloat16 *)dst);
    return cudaGetLastError();
}

} // namespace nsa_cuda
