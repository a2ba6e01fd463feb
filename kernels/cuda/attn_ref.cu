/*
 * attn_ref.cu -- the three attention branches, readable: the reference, and
 * the kernel for f32 inputs and for head dims the tensor-core kernels do not
 * take (> 256).
 *
 * One warp per (token, query head). The keys the row sees come as contiguous
 * segments (compressed: [0, nc(t)); window: [max(0, t-w+1), t]; selected: one
 * segment per selected block, cut at t). Each segment is walked 32 keys at a
 * time, one key per lane: the lane computes its logit over the whole head dim
 * (q is staged, pre-scaled, in shared memory), the warp does an online-softmax
 * step, and then every lane accumulates its own output dims over the 32 keys.
 * Plain fp32 FFMA, fixed orders everywhere, so results are reproducible.
 *
 * Speed: not tuned; the readable reference beside the tensor-core kernels
 * (docs/cuda.md), and the kernel of f32 plans.
 */
#include "nsa_cuda.cuh"
#include "nsa_cuda_kernels.h"

namespace nsa_cuda {

constexpr int REF_WARPS = 4;

template <typename T, typename KV, int MODE>
__global__ void __launch_bounds__(REF_WARPS * 32)
    attn_ref_kernel(const Geom g, const T *q, int64_t qst, int64_t qsh, const KV *k, int64_t kst, int64_t ksh,
                    const KV *v, int64_t vst, int64_t vsh, const int *idx, int64_t ist, int64_t ish, float *o,
                    int64_t ost, int64_t osh, float *lse, int64_t lst, int64_t lsh, const SlcSum z)
{
    extern __shared__ float sm[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *sq = sm + warp * (g.Dqk + g.Dv + 32); /* q * scale */
    float *so = sq + g.Dqk;                      /* output accumulator */
    float *sp = so + g.Dv;                       /* the 32 probabilities of a step */
    const int64_t rows = g.T * g.Hq;
    for (int64_t row = (int64_t)blockIdx.x * REF_WARPS + warp; row < rows; row += (int64_t)gridDim.x * REF_WARPS) {
        const int64_t t = row / g.Hq, h = row % g.Hq, gi = h / g.G;
        const int64_t seq = g.tok_seq[t], s0 = g.cu_seqlens[seq], tl = t - s0;
        for (int64_t e = lane; e < g.Dqk; e += 32) sq[e] = to_f(q[t * qst + h * qsh + e]) * g.scale;
        for (int64_t e = lane; e < g.Dv; e += 32) so[e] = 0.f;
        __syncwarp();
        float m = -INFINITY, lsum = 0.f;

        /* keys [lo, hi) of the segment; key x lives at row (base + x) */
        auto segment = [&](int64_t lo, int64_t hi, int64_t base) {
            for (int64_t c0 = lo; c0 < hi; c0 += 32) {
                const int64_t key = c0 + lane;
                const bool valid = key < hi;
                float sv = -INFINITY;
                if (valid) {
                    const KV *kr = k + (base + key) * kst + gi * ksh;
                    float dot = 0.f;
                    for (int64_t e = 0; e < g.Dqk; e++) dot += sq[e] * to_f(kr[e]);
                    sv = dot;
                }
                const float mnew = fmaxf(m, warp_max(sv)); /* finite: lane 0 is valid */
                const float alpha = expf(m - mnew);        /* m = -inf -> 0 */
                const float p = valid ? expf(sv - mnew) : 0.f;
                lsum = lsum * alpha + warp_sum(p);
                m = mnew;
                sp[lane] = p;
                __syncwarp();
                const int cnt = (int)(hi - c0 < 32 ? hi - c0 : 32);
                for (int64_t e = lane; e < g.Dv; e += 32) {
                    float acc = so[e] * alpha;
                    const KV *vr = v + (base + c0) * vst + gi * vsh + e;
                    for (int kk = 0; kk < cnt; kk++) acc += sp[kk] * to_f(vr[kk * vst]);
                    so[e] = acc;
                }
                __syncwarp();
            }
        };

        if (MODE == 0) {
            segment(0, nsa_cmp_visible(tl, g.l, g.d), g.cu_cmp[seq]);
        } else if (MODE == 2) {
            segment(nsa_win_start(tl, g.w), tl + 1, s0);
        } else {
            for (int64_t b = 0; b < g.n; b++) {
                const int64_t j = idx[t * ist + gi * ish + b];
                if (j < 0 || j * g.ls > tl) continue;
                segment(j * g.ls, nsa_min64((j + 1) * g.ls, tl + 1), s0);
            }
        }
        const float inv = lsum != 0.f ? 1.0f / lsum : 0.f;
        const float2 gw = slc_sum_gates(z, t, h); /* SLC_COMBINE (mode 1 only): into o_cmp's term */
        for (int64_t e = lane; e < g.Dv; e += 32) slc_store(z, gw, o + t * ost + h * osh + e, so[e] * inv);
        if (lse && lane == 0) lse[t * lst + h * lsh] = lsum != 0.f ? m + logf(lsum) : -INFINITY;
        __syncwarp();
    }
}

template <typename T, typename KV, int MODE>
static cudaError_t launch_ref(const Geom &g, View q, View k, View v, View idx, MView o, MView lse, const SlcSum &z,
                              cudaStream_t s)
{
    const int64_t rows = g.T * g.Hq;
    if (rows == 0) return cudaSuccess;
    int64_t blocks = (rows + REF_WARPS - 1) / REF_WARPS;
    if (blocks > (1 << 30)) blocks = 1 << 30;
    const size_t smem = (size_t)REF_WARPS * (g.Dqk + g.Dv + 32) * sizeof(float);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(attn_ref_kernel<T, KV, MODE>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    attn_ref_kernel<T, KV, MODE><<<(unsigned)blocks, REF_WARPS * 32, smem, s>>>(
        g, (const T *)q.p, q.st, q.sh, (const KV *)k.p, k.st, k.sh, (const KV *)v.p, v.st, v.sh,
        (const int *)idx.p, idx.st, idx.sh, (float *)o.p, o.st, o.sh, (float *)lse.p, lse.st, lse.sh, z);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t attn_ref_t(const Geom &g, int mode, View q, View k, View v, View idx, MView o, MView lse,
                              const SlcSum &z, cudaStream_t s)
{
    const SlcSum none = {};
    if (mode == 0) return launch_ref<T, float, 0>(g, q, k, v, idx, o, lse, none, s);
    if (mode == 1) return launch_ref<T, T, 1>(g, q, k, v, idx, o, lse, z, s);
    return launch_ref<T, T, 2>(g, q, k, v, idx, o, lse, none, s);
}

cudaError_t attn_ref(const Geom &g, int mode, View q, View k, View v, View idx, MView o, MView lse, cudaStream_t s,
                     const SlcSum &z)
{
    NSA_DISPATCH_DTYPE(g.dtype, T, return attn_ref_t<T>(g, mode, q, k, v, idx, o, lse, z, s));
    return cudaErrorInvalidValue;
}

} // namespace nsa_cuda
