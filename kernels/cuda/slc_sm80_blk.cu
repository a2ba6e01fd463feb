/*
 * slc_sm80_blk.cu -- the selected branch block-major on mma.sync (any G <= 64,
 * f16 / bf16, every class): K/V blocks outer, the query rows that selected
 * each block inner (the loop order of Flash Sparse Attention, arXiv
 * 2508.18224), so that a block's K/V is fetched once per 64 query rows
 * whatever G is. slc_sm80 fetches every selected block once per (token, KV
 * head) with the G heads padded to 16 rows: at G = 4 that moves 4x the bytes
 * per FLOP of G = 16, and at G = 1 the paper's 16x smaller problem moved as
 * many bytes as the paper's shape.
 *
 * Per call, in passes of at most SBK_PASS_BYTES of partial states (tiles.h):
 *  1. the inverse map of the pass's selection (slc_map_build, bwd_ref.cu):
 *     every (token, KV head, slot) whose block is eligible, keyed by (KV head,
 *     batch block) and radix-sorted stably (so a block's entries keep their
 *     tokens ascending), its value the entry's index;
 *  2. slc_blk_kernel: CTA c takes the sorted entries [c E, c E + E), E =
 *     SBK_BM / G, as E * G rows (entry-major, head fastest). A run of its
 *     entries that selected the same block shares one fetch of the block's
 *     K/V (SBK_KB keys at a time); each row's softmax over the block's keys
 *     it may see (causal: up to its own position) is stored as a partial
 *     state at (token, head, slot): m (scaled log2 domain) and l in fp32, and
 *     the normalised output o_s / l_s rounded to the call's 16-bit dtype (a
 *     convex combination of V rows: in range, its error at most 2^-9 of |V|
 *     for bf16, docs/nsa-semantics.md section 7). Rows of other runs in a
 *     warp are masked.
 *  3. slc_blk_reduce_kernel: one warp per (token, query head) merges its
 *     eligible slots' states in slot order, in fp32:
 *     o = sum 2^(m_s - M) l_s (o_s / l_s) / L.
 * Every output is summed in a fixed order: bitwise reproducible.
 *
 * Bytes per (token, query head): its Q row once per slot (n Dqk * 2) and the
 * partial state written and read (2 n (2 Dv + 8)): independent of G, where
 * slc_sm80 reads n l_s (Dqk + Dv) * 2 per (token, KV head). So slc_sm80_g16
 * (G = 16: its 8 tokens x 16 heads already amortise each fetch over 128 rows,
 * without the partial states) keeps G = 16.
 */
#include "slc_blk.cuh"

namespace nsa_cuda {

/* Partial states: row pr = ((t - t0) Hq + h) n + slot of part_o (DV elements
 * of T: o_s / l_s) and part_ml (m, l). */
/* Rejected: the unnormalised o_s in fp32 (until 2026-12-06): twice the bytes of
 * the state that binds the kernel and its reduce. */
template <typename T, int DQK, int DV>
__global__ void __launch_bounds__(SBK_THREADS, SBK_MIN_CTAS)
    slc_blk_kernel(const Geom g, int64_t t0, int64_t nent, int sentinel, const int *seg, const int *ent, const T *q,
                   int64_t qst, int64_t qsh, const T *k, int64_t kst, int64_t ksh, const T *v, int64_t vst, int64_t vsh,
                   bool qvec, bool kvvec, const int *idx, int64_t ist, int64_t ish, T *part_o, float2 *part_ml)
{
    constexpr int NT = SBK_THREADS, BM = SBK_BM, KB = SBK_KB, SQ = DQK + 8, SV = DV + 8;
    /* a warp's Q fragments feed one K tile per run (l_s <= 64): re-read from
     * shared memory rather than held, so that four CTAs fit per SM by registers */
    constexpr bool QREG = false;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = (T *)smem_raw;
    T *sK = sQ + BM * SQ;
    T *sV = sK + KB * SQ;
    NSA_BLK_ENTRIES(se);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int G = (int)g.G, E = BM / G, rows = E * G;
    int64_t eslot = 0, egi = 0, et = 0; /* this thread's entry (tid < E) */
    if (tid < E) blk_entry(se, g, t0, (int64_t)blockIdx.x * E + tid, nent, sentinel, seg, ent, tid, et, egi, eslot);
    __syncthreads();
    if (se.seg[0] < 0) return; /* sorted: past the last eligible entry */
    load_tile<T, BM, DQK, SQ, NT>(sQ, q, g.Dqk, qvec, [&](int r) { return blk_qrow(se, G, rows, r, qst, qsh); });
    cp_async_commit();
    if (tid < E && se.seg[tid] >= 0) blk_entry_keys(se, g, idx, ist, ish, tid, et, egi, eslot);
    __syncthreads(); /* se.kb, se.nk */
    auto kdst = [&](int r, int c) { return sK + r * SQ + c * 8; };
    auto vdst = [&](int r, int c) { return sV + r * SV + c * 8; };

    const float sl = g.scale * NSA_LOG2E;
    uint32_t qf[1][4]; /* unused: !QREG */
    float oacc[DV / 8][4], m[2], ls[2];
    warp_state_init(oacc, m, ls);
    /* this thread's two rows (lane / 4 + 8 i of the warp) and their entries */
    int rent[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = warp * 16 + (lane >> 2) + 8 * i;
        rent[i] = r < rows ? r / G : BM;
    }

    for (int i0 = 0; i0 < E && se.seg[i0] >= 0;) {
        const int i1 = blk_run_end(se, i0, E);
        const int nk = se.nk[i1 - 1]; /* tokens ascending in a run: the last sees the most keys */
        const int64_t kb = se.kb[i0];
        const int64_t gi = se.head0[i0] / G; /* a run's entries share (KV head, block); runs may not */
        /* does the warp hold rows of the run? */
        const bool mine = warp * 16 < i1 * G && warp * 16 + 16 > i0 * G;
        int vis[2];
#pragma unroll
        for (int i = 0; i < 2; i++) vis[i] = rent[i] >= i0 && rent[i] < i1 ? se.nk[rent[i]] : 0;
        for (int ks = 0; ks < nk; ks += KB) {
            __syncthreads(); /* the tile's last readers are done */
            blk_load_kv<T, DQK, DV>(g, gi, kb + ks, min(KB, nk - ks), kdst, vdst, k, kst, ksh, v, vst, vsh, kvvec);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
            if (!mine) continue;
            float s[KB / 8][4];
#pragma unroll
            for (int j = 0; j < KB / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            warp_qk<T, DQK, KB / 8, SQ, QREG>(s, qf, sQ + warp * 16 * SQ, sK, 0, lane);
            float mx[2];
            blk_mask(s, vis, ks, lane, mx);
            warp_softmax_step(s, mx, m, ls, oacc, sl);
            warp_pv<T, DV, KB / 16, SV>(oacc, s, sV, 0, lane);
        }
        if (mine) { /* the run's rows of this warp: their partial states; then a fresh state */
            blk_store_states<T, DV>(se, g, warp, lane, rent, vis, oacc, m, ls, part_o, part_ml);
            warp_state_init(oacc, m, ls);
        }
        i0 = i1;
    }
    cp_async_wait<0>();
}

template <typename T, int DQK, int DV>
static cudaError_t launch_blk(const Dev &dev, const Geom &g, View q, View k, View v, View idx, MView o, MView lse,
                              const SlcSum &z, SlcMap &map, int64_t pass_tokens, void *part_o, float *part_ml, cudaStream_t s)
{
    return blk_launch<T, DV>(slc_blk_kernel<T, DQK, DV>, slc_sm80_blk_smem(DQK, DV), dev, g, q, k, v, idx, o, lse, z, map,
                             pass_tokens, part_o, part_ml, s);
}

/* One warp per (token, query head) of the pass: the slots' partial states
 * merged in slot order. The lanes fetch the slots' indices and (m, l) at once;
 * the sums then run over the slots in order (L, and each column's o). */
constexpr int SBK_RED_WARPS = 4;
template <typename T, int DV>
__global__ void __launch_bounds__(SBK_RED_WARPS * 32)
    slc_blk_reduce_kernel(const Geom g, int64_t t0, int64_t t1, const int *idx, int64_t ist, int64_t ish,
                          const T *part_o, const float2 *part_ml, float *o, int64_t ost, int64_t osh, float *lse,
                          int64_t lst, int64_t lsh, const SlcSum z)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * SBK_RED_WARPS + warp;
    if (row >= (t1 - t0) * g.Hq) return;
    const int64_t tt = row / g.Hq, h = row % g.Hq, t = t0 + tt, gi = h / g.G;
    const int64_t tl = t - g.cu_seqlens[g.tok_seq[t]];
    const int *ir = idx + t * ist + gi * ish;
    const int64_t pr0 = row * g.n;
    auto eligible = [&](int64_t s) {
        if (s >= g.n) return false;
        const int64_t j = ir[s];
        return j >= 0 && j * g.ls <= tl;
    };
    float M = -INFINITY;
    for (int64_t s0 = 0; s0 < g.n; s0 += 32)
        if (eligible(s0 + lane)) M = fmaxf(M, part_ml[pr0 + s0 + lane].x);
    for (int o2 = 16; o2 > 0; o2 >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o2));
    const float Mu = M == -INFINITY ? 0.f : M;
    float L = 0.f;
    constexpr int NC = (DV + 127) / 128; /* float4 column groups per lane */
    float4 acc[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int64_t s0 = 0; s0 < g.n; s0 += 32) {
        const bool ok = eligible(s0 + lane);
        float fl = 0.f;
        if (ok) {
            const float2 ml = part_ml[pr0 + s0 + lane];
            fl = ml.y * exp2f(ml.x - Mu);
        }
        const unsigned okm = __ballot_sync(0xffffffffu, ok);
        const int cnt = (int)nsa_min64(32, g.n - s0);
#pragma unroll 4
        for (int u = 0; u < cnt; u++) {
            const float flu = __shfl_sync(0xffffffffu, fl, u); /* the slot's weight 2^(m_s - M) l_s */
            if (!((okm >> u) & 1u)) continue;
            L += flu;
            const T *src = part_o + (pr0 + s0 + u) * DV;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int col = c * 128 + 4 * lane;
                if (col < DV) {
                    const uint2 x = __ldcs(reinterpret_cast<const uint2 *>(src + col)); /* read once: streaming */
                    const T *e = reinterpret_cast<const T *>(&x);
                    acc[c].x += flu * to_f(e[0]);
                    acc[c].y += flu * to_f(e[1]);
                    acc[c].z += flu * to_f(e[2]);
                    acc[c].w += flu * to_f(e[3]);
                }
            }
        }
    }
    const float inv = L != 0.f ? 1.0f / L : 0.f;
    float *orow = o + t * ost + h * osh;
    const float2 gw = slc_sum_gates(z, t, h);
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int col = c * 128 + 4 * lane;
        const float r[4] = {acc[c].x * inv, acc[c].y * inv, acc[c].z * inv, acc[c].w * inv};
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (col + u < g.Dv) slc_store(z, gw, orow + col + u, r[u]);
    }
    if (lse && lane == 0) lse[t * lst + h * lsh] = L != 0.f ? (M + log2f(L)) * NSA_LN2 : -INFINITY;
}

template <typename T, int DV>
static cudaError_t reduce_t(const Geom &g, int64_t t0, int64_t t1, View idx, const void *part_o, const float *part_ml,
                            MView o, MView lse, const SlcSum &z, cudaStream_t s)
{
    const int64_t rows = (t1 - t0) * g.Hq;
    slc_blk_reduce_kernel<T, DV><<<(unsigned)((rows + SBK_RED_WARPS - 1) / SBK_RED_WARPS), SBK_RED_WARPS * 32, 0, s>>>(
        g, t0, t1, (const int *)idx.p, idx.st, idx.sh, (const T *)part_o, (const float2 *)part_ml, (float *)o.p, o.st,
        o.sh, (float *)lse.p, lse.st, lse.sh, z);
    return cudaGetLastError();
}
template <typename T>
static cudaError_t reduce_dv(const Geom &g, int dvp, int64_t t0, int64_t t1, View idx, const void *part_o,
                             const float *part_ml, MView o, MView lse, const SlcSum &z, cudaStream_t s)
{
    switch (dvp) {
    case 32: return reduce_t<T, 32>(g, t0, t1, idx, part_o, part_ml, o, lse, z, s);
    case 64: return reduce_t<T, 64>(g, t0, t1, idx, part_o, part_ml, o, lse, z, s);
    case 128: return reduce_t<T, 128>(g, t0, t1, idx, part_o, part_ml, o, lse, z, s);
    default: return cudaErrorInvalidValue;
    }
}
cudaError_t slc_blk_reduce(const Geom &g, int dvp, int64_t t0, int64_t t1, View idx, const void *part_o,
                           const float *part_ml, MView o, MView lse, const SlcSum &z, cudaStream_t s)
{
    if (g.dtype == 1) return reduce_dv<__half>(g, dvp, t0, t1, idx, part_o, part_ml, o, lse, z, s);
    if (g.dtype == 2) return reduce_dv<__nv_bfloat16>(g, dvp, t0, t1, idx, part_o, part_ml, o, lse, z, s);
    return cudaErrorInvalidValue;
}

cudaError_t slc_sm80_blk(const Geom &g, const Dev &dev, int dqkp, int dvp, View q, View k, View v, View idx, MView o,
                         MView lse, const SlcSum &z, SlcMap &map, int64_t pass_tokens, void *part_o, float *part_ml,
                         cudaStream_t s)
{
    if (g.T == 0) return cudaSuccess;
    if (g.G < 1 || g.G > SBK_BM || pass_tokens < 1) return cudaErrorInvalidValue;
    NSA_SLC_DISPATCH(launch_blk, g, dqkp, dvp, dev, g, q, k, v, idx, o, lse, z, map, pass_tokens, part_o, part_ml, s);
}

} // namespace nsa_cuda
