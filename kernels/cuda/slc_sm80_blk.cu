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
#include "tile_qk.cuh"

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
    /* per entry of the CTA: its segment (-1: none), token, partial row of its
     * first head, first key row of its block (in k / v), keys it may see */
    __shared__ int s_seg[BM];
    __shared__ int64_t s_tok[BM], s_pr[BM], s_kb[BM];
    __shared__ int s_nk[BM], s_head0[BM];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int G = (int)g.G, E = BM / G, rows = E * G;
    const int64_t e0 = (int64_t)blockIdx.x * E;
    /* The entry's token and head come from its value alone: the Q rows' copies
     * start before the chain entry -> token's sequence -> key base is read. */
    int64_t eslot = 0, egi = 0, et = 0; /* this thread's entry (tid < E) */
    if (tid < E) {
        const int64_t e = e0 + tid;
        int sg = -1;
        if (e < nent) {
            sg = seg[e];
            if (sg == sentinel) sg = -1;
        }
        s_seg[tid] = sg;
        if (sg >= 0) {
            const uint32_t val = (uint32_t)ent[e], n = (uint32_t)g.n, hkv = (uint32_t)g.Hkv; /* < 2^31 a pass */
            const uint32_t q1 = val / n, tt = q1 / hkv;
            eslot = val - q1 * n;
            egi = q1 - tt * hkv;
            et = t0 + tt;
            s_tok[tid] = et;
            s_head0[tid] = (int)(egi * G);
            s_pr[tid] = ((int64_t)tt * g.Hq + egi * G) * g.n + eslot;
        }
    }
    __syncthreads();
    if (s_seg[0] < 0) return; /* sorted: past the last eligible entry */
    load_tile<T, BM, DQK, SQ, NT>(sQ, q, g.Dqk, qvec, [&](int r) -> int64_t {
        const int i = r / G;
        return r < rows && s_seg[i] >= 0 ? s_tok[i] * qst + (s_head0[i] + r % G) * qsh : -1;
    });
    cp_async_commit();
    if (tid < E && s_seg[tid] >= 0) {
        const int64_t s0 = g.cu_seqlens[g.tok_seq[et]], tl = et - s0;
        const int64_t j = idx[et * ist + egi * ish + eslot];
        s_kb[tid] = s0 + j * g.ls;
        s_nk[tid] = (int)nsa_min64(g.ls, tl - j * g.ls + 1);
    }
    __syncthreads(); /* s_kb, s_nk */

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

    for (int i0 = 0; i0 < E && s_seg[i0] >= 0;) {
        const int sg = s_seg[i0];
        int i1 = i0 + 1;
        while (i1 < E && s_seg[i1] == sg) i1++;
        const int nk = s_nk[i1 - 1]; /* tokens ascending in a run: the last sees the most keys */
        const int64_t kb = s_kb[i0];
        const int64_t gi = s_head0[i0] / G; /* a run's entries share (KV head, block); runs may not */
        const T *kg = k + gi * ksh, *vg = v + gi * vsh;
        /* does the warp hold rows of the run? */
        const bool mine = warp * 16 < i1 * G && warp * 16 + 16 > i0 * G;
        int vis[2];
#pragma unroll
        for (int i = 0; i < 2; i++) vis[i] = rent[i] >= i0 && rent[i] < i1 ? s_nk[rent[i]] : 0;
        for (int ks = 0; ks < nk; ks += KB) {
            const int cnt = min(KB, nk - ks);
            __syncthreads(); /* the tile's last readers are done */
            if (kvvec) {
                load_rows_vec<T, KB, DQK, SQ, NT>(sK, kg + (kb + ks) * kst, (int)kst, cnt, (int)g.Dqk);
                load_rows_vec<T, KB, DV, SV, NT>(sV, vg + (kb + ks) * vst, (int)vst, cnt, (int)g.Dv);
            } else {
                load_tile<T, KB, DQK, SQ, NT>(sK, kg, g.Dqk, false,
                                              [&](int r) -> int64_t { return r < cnt ? (kb + ks + r) * kst : -1; });
                load_tile<T, KB, DV, SV, NT>(sV, vg, g.Dv, false,
                                             [&](int r) -> int64_t { return r < cnt ? (kb + ks + r) * vst : -1; });
            }
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
            if (!mine) continue;
            float s[KB / 8][4];
#pragma unroll
            for (int j = 0; j < KB / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            warp_qk<T, DQK, KB / 8, SQ, QREG>(s, qf, sQ + warp * 16 * SQ, sK, 0, lane);
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < KB / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = ks + j * 8 + 2 * (lane & 3) + (e & 1);
                    const float x = key < vis[e >> 1] ? s[j][e] : -INFINITY;
                    s[j][e] = x;
                    mx[e >> 1] = fmaxf(mx[e >> 1], x);
                }
            warp_softmax_step(s, mx, m, ls, oacc, sl);
            warp_pv<T, DV, KB / 16, SV>(oacc, s, sV, 0, lane);
        }
        if (mine) {
            /* the run's rows of this warp: their partial states; then a fresh state */
#pragma unroll
            for (int i = 0; i < 2; i++) {
                ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 1);
                ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 2);
                if (vis[i] == 0) continue;
                const int r = warp * 16 + (lane >> 2) + 8 * i;
                const int64_t pr = s_pr[rent[i]] + (int64_t)(r % G) * g.n;
                const float inv = ls[i] > 0.f ? 1.f / ls[i] : 0.f;
                T *dst = part_o + pr * DV;
#pragma unroll
                for (int j = 0; j < DV / 8; j++) {
                    const int col = j * 8 + 2 * (lane & 3);
                    *reinterpret_cast<uint32_t *>(dst + col) = Mma<T>::pack(oacc[j][2 * i] * inv, oacc[j][2 * i + 1] * inv);
                }
                if ((lane & 3) == 0) part_ml[pr] = make_float2(m[i], ls[i]);
            }
            warp_state_init(oacc, m, ls);
        }
        i0 = i1;
    }
    cp_async_wait<0>();
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

template <typename T, int DQK, int DV>
static cudaError_t launch_blk(const Dev &dev, const Geom &g, View q, View k, View v, View idx, MView o, MView lse,
                              const SlcSum &z, SlcMap &map, int64_t pass_tokens, void *part_o, float *part_ml, cudaStream_t s)
{
    static_assert(sizeof(T) == 2, "tensor-core path: 16-bit storage");
    size_t smem = slc_sm80_blk_smem(DQK, DV);
    cudaError_t e = launch_smem(slc_blk_kernel<T, DQK, DV>, dev, smem);
    if (e != cudaSuccess) return e;
    const bool qvec = vec_ok(q.p, q.st, q.sh, g.Dqk);
    const bool kvvec = vec_ok(k.p, k.st, k.sh, g.Dqk) && vec_ok(v.p, v.st, v.sh, g.Dv) && rs32_ok(k.st, SBK_KB) &&
                       rs32_ok(v.st, SBK_KB);
    const int E = (int)(SBK_BM / g.G);
    const int sentinel = (int)(g.Hkv * map.nb);
    for (int64_t t0 = 0; t0 < g.T; t0 += pass_tokens) {
        const int64_t t1 = nsa_min64(g.T, t0 + pass_tokens), nent = (t1 - t0) * g.Hkv * g.n;
        if ((e = slc_map_build(g, idx, map, t0, t1, true, s)) != cudaSuccess) return e;
        const int64_t ctas = (nent + E - 1) / E;
        slc_blk_kernel<T, DQK, DV><<<(unsigned)ctas, SBK_THREADS, smem, s>>>(
            g, t0, nent, sentinel, map.seg_out, map.list_out, (const T *)q.p, q.st, q.sh, (const T *)k.p, k.st, k.sh,
            (const T *)v.p, v.st, v.sh, qvec, kvvec, (const int *)idx.p, idx.st, idx.sh, (T *)part_o, (float2 *)part_ml);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        const int64_t rows = (t1 - t0) * g.Hq;
        slc_blk_reduce_kernel<T, DV><<<(unsigned)((rows + SBK_RED_WARPS - 1) / SBK_RED_WARPS), SBK_RED_WARPS * 32, 0, s>>>(
            g, t0, t1, (const int *)idx.p, idx.st, idx.sh, (const T *)part_o, (const float2 *)part_ml, (float *)o.p, o.st, o.sh,
            (float *)lse.p, lse.st, lse.sh, z);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    return cudaSuccess;
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
