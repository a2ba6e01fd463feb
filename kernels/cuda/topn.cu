/*
 * topn.cu -- SELECT_TOPN (semantics section 3): the n highest-ranked eligible
 * selection blocks of each (token, KV group), reported in ascending order.
 *
 * One warp per (token, group). Every eligible block j gets a unique 64-bit
 * rank key (rank_key in topn.cuh, shared with the fused SCORES_TOPN kernel).
 * n rounds of a warp-wide "largest key below the previous one" find the n-th
 * largest key; one ballot/popc pass then writes every block whose key is at
 * least that threshold, in ascending j, with -1 in the unused slots.
 * When j <= 1023 the keys live in registers (32 per lane), else they are
 * recomputed from the scores each round.
 */
#include "topn.cuh"

namespace nsa_cuda {

template <bool CACHED>
__global__ void __launch_bounds__(128) topn_kernel(const Geom g, const float *sc, int64_t sst, int64_t ssh, int *out,
                                                   int64_t ost, int64_t osh)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t pairs = g.T * g.Hkv;
    for (int64_t pr = (int64_t)blockIdx.x * 4 + warp; pr < pairs; pr += (int64_t)gridDim.x * 4) {
        const int64_t t = pr / g.Hkv, gi = pr % g.Hkv;
        const int64_t tl = t - g.cu_seqlens[g.tok_seq[t]];
        const int64_t cur = nsa_slc_last(tl, g.ls), E = cur + 1;
        int *dst = out + t * ost + gi * osh;
        if (E <= g.n) {
            for (int64_t b = lane; b < g.n; b += 32) dst[b] = b < E ? (int)b : -1;
            continue;
        }
        const float *row = sc + t * sst + gi * ssh;
        auto key = [&](int64_t j) {
            return rank_key(row[j], j, nsa_slc_forced(j, tl, g.ls, g.n_init, g.n_local) != 0);
        };
        uint64_t kc[CACHED ? 32 : 1];
        if (CACHED) {
#pragma unroll
            for (int u = 0; u < 32; u++) {
                const int64_t j = (int64_t)u * 32 + lane;
                kc[u] = j < E ? key(j) : 0;
            }
        }
        uint64_t prev = ~0ull;
        for (int64_t r = 0; r < g.n; r++) {
            uint64_t best = 0;
            if (CACHED) {
#pragma unroll
                for (int u = 0; u < 32; u++)
                    if (kc[u] < prev && kc[u] > best) best = kc[u];
            } else {
                for (int64_t j = lane; j < E; j += 32) {
                    const uint64_t kj = key(j);
                    if (kj < prev && kj > best) best = kj;
                }
            }
            prev = warp_max_u64(best);
        }
        int64_t cnt = 0;
        for (int64_t base = 0; base < E; base += 32) {
            const int64_t j = base + lane;
            const bool sel = j < E && key(j) >= prev;
            const unsigned bal = __ballot_sync(0xffffffffu, sel);
            if (sel) dst[cnt + __popc(bal & ((1u << lane) - 1u))] = (int)j;
            cnt += __popc(bal);
        }
    }
}

cudaError_t select_topn(const Geom &g, View scores, MView idx, cudaStream_t s)
{
    const int64_t pairs = g.T * g.Hkv;
    if (pairs == 0 || g.n == 0) return cudaSuccess;
    int64_t blocks = (pairs + 3) / 4;
    if (blocks > (1 << 30)) blocks = 1 << 30;
    if (g.max_ns <= 1024)
        topn_kernel<true><<<(unsigned)blocks, 128, 0, s>>>(g, (const float *)scores.p, scores.st, scores.sh,
                                                           (int *)idx.p, idx.st, idx.sh);
    else
        topn_kernel<false><<<(unsigned)blocks, 128, 0, s>>>(g, (const float *)scores.p, scores.st, scores.sh,
                                                            (int *)idx.p, idx.st, idx.sh);
    return cudaGetLastError();
}

} // namespace nsa_cuda
