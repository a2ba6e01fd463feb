/*
 * topn.cu -- SELECT_TOPN (semantics section 3): the n highest-ranked eligible
 * selection blocks of each (token, KV group), reported in ascending order.
 *
 * One warp per (token, group). Every eligible block j gets a unique 64-bit
 * rank key (rank_key in topn.cuh, shared with the fused SCORES_TOPN kernel).
 * The n-th largest key is found by filtering on the lanes' maxima (or, where
 * that does not apply, n rounds of a warp-wide "largest key below the previous
 * one"); one ballot/popc pass then writes every block whose key is at least
 * that threshold, in ascending j, with -1 in the unused slots.
 * The ranking itself is warp_select_row (topn.cuh), shared with the fused
 * SCORES_TOPN kernel so that both paths pick bitwise the same blocks.
 */
#include "topn.cuh"

namespace nsa_cuda {

__global__ void __launch_bounds__(128) topn_kernel(const Geom g, int64_t t0, int64_t t1, const float *sc, int64_t sst,
                                                   int64_t ssh, int *out, int64_t ost, int64_t osh)
{
    __shared__ uint64_t cand[4][TOPN_CAND];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t pairs = (t1 - t0) * g.Hkv;
    for (int64_t pr = (int64_t)blockIdx.x * 4 + warp; pr < pairs; pr += (int64_t)gridDim.x * 4) {
        const int64_t r = pr / g.Hkv, gi = pr % g.Hkv, t = t0 + r;
        const int64_t tl = t - g.cu_seqlens[g.tok_seq[t]];
        warp_select_row(g, sc + r * sst + gi * ssh, tl, out + t * ost + gi * osh, lane, cand[warp]);
    }
}

cudaError_t select_topn(const Geom &g, View scores, int64_t t0, int64_t t1, MView idx, cudaStream_t s)
{
    const int64_t pairs = (t1 - t0) * g.Hkv;
    if (pairs == 0 || g.n == 0) return cudaSuccess;
    int64_t blocks = (pairs + 3) / 4;
    if (blocks > (1 << 30)) blocks = 1 << 30;
    topn_kernel<<<(unsigned)blocks, 128, 0, s>>>(g, t0, t1, (const float *)scores.p, scores.st, scores.sh, (int *)idx.p,
                                                 idx.st, idx.sh);
    return cudaGetLastError();
}

} // namespace nsa_cuda
