/*
 * scores_ref.cu -- the readable reference of BLOCK_SCORES (semantics section
 * 3), for every dtype: for every token t, KV group g and eligible selection
 * block j (j <= floor(t/l_s)),
 *     s(t, g, j) = sum_{h in g} sum_i overlap(i, j) / d * p_cmp(t, h, i),
 *     p_cmp(t, h, i) = exp(scale q(t,h).kc_i - lse_cmp(t, h))   for i < nc(t).
 * Eligible blocks no visible compressed block overlaps get 0.
 *
 * One warp per (t, g), a lane per j; for each compressed block overlapping j
 * it recomputes the G logits in fp32 (blocks shared by two j are computed
 * twice). Readable, slow.
 */
#include "nsa_cuda.cuh"
#include "nsa_cuda_kernels.h"

namespace nsa_cuda {

template <typename T>
__global__ void __launch_bounds__(128) scores_ref_kernel(const Geom g, const T *q, int64_t qst, int64_t qsh,
                                                         const float *kc, int64_t kst, int64_t ksh, const float *lse,
                                                         int64_t lst, int64_t lsh, float *sc, int64_t sst,
                                                         int64_t ssh)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t pairs = g.T * g.Hkv;
    for (int64_t pr = (int64_t)blockIdx.x * 4 + warp; pr < pairs; pr += (int64_t)gridDim.x * 4) {
        const int64_t t = pr / g.Hkv, gi = pr % g.Hkv;
        const int64_t seq = g.tok_seq[t], tl = t - g.cu_seqlens[seq];
        const int64_t nc = nsa_cmp_visible(tl, g.l, g.d), cur = nsa_slc_last(tl, g.ls);
        for (int64_t j = lane; j <= cur; j += 32) {
            const int64_t i0 = nsa_cmp_first_overlapping(j, g.l, g.d, g.ls);
            const int64_t i1 = nsa_min64(nsa_cmp_last_overlapping(j, g.ls, g.d), nc - 1);
            float acc = 0.f;
            for (int64_t i = i0; i <= i1; i++) {
                const float wgt = (float)nsa_overlap(i, j, g.l, g.d, g.ls) / (float)g.d;
                const float *kr = kc + (g.cu_cmp[seq] + i) * kst + gi * ksh;
                float psum = 0.f;
                for (int64_t hh = 0; hh < g.G; hh++) {
                    const int64_t h = gi * g.G + hh;
                    const T *qr = q + t * qst + h * qsh;
                    float dot = 0.f;
                    for (int64_t e = 0; e < g.Dqk; e++) dot += to_f(qr[e]) * kr[e];
                    psum += expf(dot * g.scale - lse[t * lst + h * lsh]);
                }
                acc += wgt * psum;
            }
            sc[t * sst + gi * ssh + j] = acc;
        }
    }
}

cudaError_t scores_ref(const Geom &g, View q, View kc, View lse, MView scores, cudaStream_t s)
{
    const int64_t pairs = g.T * g.Hkv;
    if (pairs == 0) return cudaSuccess;
    int64_t blocks = (pairs + 3) / 4;
    if (blocks > (1 << 30)) blocks = 1 << 30;
    NSA_DISPATCH_DTYPE(g.dtype, T,
                       scores_ref_kernel<T><<<(unsigned)blocks, 128, 0, s>>>(
                           g, (const T *)q.p, q.st, q.sh, (const float *)kc.p, kc.st, kc.sh, (const float *)lse.p,
                           lse.st, lse.sh, (float *)scores.p, scores.st, scores.sh));
    return cudaGetLastError();
}

} // namespace nsa_cuda
