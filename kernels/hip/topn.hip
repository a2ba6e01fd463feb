/*
 * topn.hip -- stage SELECT_TOPN (section 3 of docs/nsa-semantics.md): per
 * (token t, KV group g), the n eligible selection blocks of highest rank,
 * written ascending and -1 padded. One block per (t, g); the ranking is
 * topn.h's (shared with the decode step).
 */
#include "topn.h"

__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_topn_kernel(nsa_hip_dims dm, int64_t t0, nsa_hip_tensor scores, nsa_hip_tensor idx)
{
    __shared__ nsa_hip_topn_lds sh;
    const int64_t t = t0 + blockIdx.x, g = blockIdx.y;
    const int64_t tq = t - dm.cu_seqlens[dm.tok_seq[t]];
    nsa_hip_topn_row((const float *)scores.ptr + t * scores.st + g * scores.sh, tq, dm.ls, dm.n, dm.n_init,
                     dm.n_local, (int *)idx.ptr + t * idx.st + g * idx.sh, sh);
}

#define NSA_HIP_TOKENS_PER_LAUNCH ((int64_t)1 << 23)

hipError_t nsa_hip_select_topn(const nsa_hip_dims *dm, nsa_hip_tensor scores, nsa_hip_tensor idx, hipStream_t stream)
{
    for (int64_t t0 = 0; t0 < dm->T; t0 += NSA_HIP_TOKENS_PER_LAUNCH) {
        dim3 grid((unsigned)nsa_min64(dm->T - t0, NSA_HIP_TOKENS_PER_LAUNCH), (unsigned)dm->Hkv);
        nsa_hip_topn_kernel<<<grid, NSA_HIP_THREADS, 0, stream>>>(*dm, t0, scores, idx);
        hipError_t e = hipGetLastError();
        if (e != hipSuccess) return e;
    }
    return hipSuccess;
}
