/*
 * combine.hip -- stage COMBINE (section 6 of docs/nsa-semantics.md):
 *   o(t, h) = g_cmp o_cmp + g_slc o_slc + g_win o_win
 * over the branches that ran (o_b[b].ptr != NULL; a disabled branch's gate is
 * not read), summed in branch order in fp32, stored in the config dtype.
 * One thread per output element.
 */
#include "tile.h"

struct nsa_hip_branches {
    nsa_hip_tensor gate[3];
    nsa_hip_tensor o_b[3];
};

template <typename T>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_combine_kernel(nsa_hip_dims dm, nsa_hip_branches br, nsa_hip_tensor o)
{
    const int64_t n = dm.T * dm.Hq * dm.Dv;
    for (int64_t e = (int64_t)blockIdx.x * NSA_HIP_THREADS + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * NSA_HIP_THREADS) {
        int64_t c = e % dm.Dv, th = e / dm.Dv, h = th % dm.Hq, t = th / dm.Hq;
        float acc = 0.0f;
#pragma unroll
        for (int b = 0; b < 3; b++) {
            if (!br.o_b[b].ptr) continue;
            float gt = ((const float *)br.gate[b].ptr)[t * br.gate[b].st + h * br.gate[b].sh];
            float ob = ((const float *)br.o_b[b].ptr)[t * br.o_b[b].st + h * br.o_b[b].sh + c];
            acc += gt * ob;
        }
        nsa_st((T *)o.ptr + t * o.st + h * o.sh + c, acc);
    }
}

hipError_t nsa_hip_combine(const nsa_hip_dims *dm, const nsa_hip_tensor gate[3], const nsa_hip_tensor o_b[3],
                           nsa_hip_tensor o, hipStream_t stream)
{
    const int64_t n = dm->T * dm->Hq * dm->Dv;
    if (n == 0) return hipSuccess;
    nsa_hip_branches br;
    for (int b = 0; b < 3; b++) {
        br.gate[b] = gate[b];
        br.o_b[b] = o_b[b];
    }
    dim3 grid(nsa_hip_grid_1d(n));
    NSA_HIP_DISPATCH(dm->dtype, nsa_hip_combine_kernel, grid, 0, stream, *dm, br, o);
    return hipGetLastError();
}
