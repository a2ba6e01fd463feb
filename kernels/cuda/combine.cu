/*
 * combine.cu -- COMBINE (semantics section 6): o = g_cmp o_cmp + g_slc o_slc +
 * g_win o_win, summed in that fixed order in fp32 (acc = 0, then one fmaf per
 * term), stored in the cfg dtype. A branch whose o_b is absent (off) is skipped
 * and its gate is not read. After SLC_COMBINE (cmp_sum) o_cmp already holds the
 * first two terms' sum, made by the same fmafs: the sum resumes from it.
 * One thread per output element; memory bound (reads 3 fp32 partials, writes
 * one element).
 */
#include "nsa_cuda.cuh"
#include "nsa_cuda_kernels.h"

namespace nsa_cuda {

struct CombineArgs {
    const float *gate[3];
    int64_t gst[3], gsh[3];
    const float *ob[3];
    int64_t ost[3], osh[3];
    bool cmp_sum;
};

template <typename T>
__global__ void combine_kernel(const Geom g, const CombineArgs a, T *o, int64_t st, int64_t sh)
{
    const int64_t n = g.T * g.Hq * g.Dv;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t k = e % g.Dv, th = e / g.Dv, h = th % g.Hq, t = th / g.Hq;
        float acc = 0.f;
#pragma unroll
        for (int b = 0; b < 3; b++) {
            if (!a.ob[b]) continue;
            const float x = a.ob[b][t * a.ost[b] + h * a.osh[b] + k];
            acc = b == 0 && a.cmp_sum ? x : fmaf(a.gate[b][t * a.gst[b] + h * a.gsh[b]], x, acc);
        }
        o[t * st + h * sh + k] = from_f<T>(acc);
    }
}

cudaError_t combine(const Geom &g, const View gate[3], const View ob[3], bool cmp_sum, MView o, cudaStream_t s)
{
    const int64_t n = g.T * g.Hq * g.Dv;
    if (n == 0) return cudaSuccess;
    CombineArgs a;
    a.cmp_sum = cmp_sum;
    for (int b = 0; b < 3; b++) {
        a.ob[b] = cmp_sum && b == 1 ? nullptr : (const float *)ob[b].p;
        a.ost[b] = ob[b].st;
        a.osh[b] = ob[b].sh;
        a.gate[b] = a.ob[b] && !(cmp_sum && b == 0) ? (const float *)gate[b].p : nullptr;
        a.gst[b] = gate[b].st;
        a.gsh[b] = gate[b].sh;
    }
    int64_t blocks = (n + 255) / 256;
    if (blocks > (1 << 30)) blocks = 1 << 30;
    NSA_DISPATCH_DTYPE(g.dtype, T, combine_kernel<T><<<(unsigned)blocks, 256, 0, s>>>(g, a, (T *)o.p, o.st, o.sh));
    return cudaGetLastError();
}

} // namespace nsa_cuda
