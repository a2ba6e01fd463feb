/*
 * slc_blk.cuh -- what the block-major selected kernels share (slc_sm80_blk.cu
 * on mma.sync, every class; slc_sm90_blk.cu on wgmma, the sm90 class): a CTA's
 * entries of the sorted inverse map and their keys, its runs, the partial
 * states' stores, and the host loop over passes (its reduce, slc_blk_reduce,
 * is compiled once, in slc_sm80_blk.cu). The algorithm is described in
 * slc_sm80_blk.cu.
 */
#ifndef NSA_KERNELS_CUDA_SLC_BLK_CUH
#define NSA_KERNELS_CUDA_SLC_BLK_CUH

#include "tile_qk.cuh"

namespace nsa_cuda {

/* Per entry of the CTA, in shared memory: its segment (-1: none), token,
 * partial row of its first head, first key row of its block (in k / v), keys
 * it may see, first head. A view of separate arrays (NSA_BLK_ENTRIES), not one
 * shared struct: the struct costs slc_blk_kernel 60 bytes of register spills
 * at 128/128 (ptxas, sm_90a). */
struct BlkEnt {
    int *seg;
    int64_t *tok, *pr, *kb;
    int *nk, *head0;
};
#define NSA_BLK_ENTRIES(se)                                                                                    \
    __shared__ int se##_seg[SBK_BM], se##_nk[SBK_BM], se##_head0[SBK_BM];                                    \
    __shared__ int64_t se##_tok[SBK_BM], se##_pr[SBK_BM], se##_kb[SBK_BM];                                   \
    const BlkEnt se = {se##_seg, se##_tok, se##_pr, se##_kb, se##_nk, se##_head0}

/* Thread tid (< E) reads entry e of the sorted map: its segment, and from the
 * entry's value alone its token, KV head and slot (so that the Q rows' copies
 * can start before the chain entry -> token's sequence -> key base is read). */
NSA_DEV void blk_entry(const BlkEnt &se, const Geom &g, int64_t t0, int64_t e, int64_t nent, int sentinel, const int *seg,
                       const int *ent, int tid, int64_t &et, int64_t &egi, int64_t &eslot)
{
    int sg = -1;
    if (e < nent) {
        sg = seg[e];
        if (sg == sentinel) sg = -1;
    }
    se.seg[tid] = sg;
    if (sg >= 0) {
        const uint32_t val = (uint32_t)ent[e], n = (uint32_t)g.n, hkv = (uint32_t)g.Hkv; /* < 2^31 a pass */
        const uint32_t q1 = val / n, tt = q1 / hkv;
        eslot = val - q1 * n;
        egi = q1 - tt * hkv;
        et = t0 + tt;
        se.tok[tid] = et;
        se.head0[tid] = (int)(egi * g.G);
        se.pr[tid] = ((int64_t)tt * g.Hq + egi * g.G) * g.n + eslot;
    }
}

/* The Q row r of the CTA's rows (entry-major, head fastest): its offset in q, -1 where absent. */
NSA_DEV int64_t blk_qrow(const BlkEnt &se, int G, int rows, int r, int64_t qst, int64_t qsh)
{
    const int i = r / G;
    return r < rows && se.seg[i] >= 0 ? se.tok[i] * qst + (se.head0[i] + r % G) * qsh : -1;
}

/* Thread tid's eligible entry: its block's first key row and the keys its token may see. */
NSA_DEV void blk_entry_keys(const BlkEnt &se, const Geom &g, const int *idx, int64_t ist, int64_t ish, int tid, int64_t et,
                            int64_t egi, int64_t eslot)
{
    const int64_t s0 = g.cu_seqlens[g.tok_seq[et]], tl = et - s0;
    const int64_t j = idx[et * ist + egi * ish + eslot];
    se.kb[tid] = s0 + j * g.ls;
    se.nk[tid] = (int)nsa_min64(g.ls, tl - j * g.ls + 1);
}

/* The end of the run that starts at entry i0 (entries of one block, consecutive): [i0, end). */
NSA_DEV int blk_run_end(const BlkEnt &se, int i0, int E)
{
    const int sg = se.seg[i0];
    int i1 = i0 + 1;
    while (i1 < E && se.seg[i1] == sg) i1++;
    return i1;
}

/* Rows [ks, ks + cnt) (cnt <= SBK_KB) of a block starting at key row kb, of KV
 * head gi: K row r to dk(r, c), V row r to dv(r, c) (16-byte chunk c), the
 * tile's other rows zero. */
template <typename T, int DQK, int DV, typename DstK, typename DstV>
NSA_DEV void blk_load_kv(const Geom &g, int64_t gi, int64_t kb, int cnt, DstK dk, DstV dv, const T *k, int64_t kst,
                         int64_t ksh, const T *v, int64_t vst, int64_t vsh, bool kvvec)
{
    constexpr int KB = SBK_KB, NT = SBK_THREADS;
    const T *kg = k + gi * ksh, *vg = v + gi * vsh;
    if (kvvec) { /* the launcher checked alignment and rs32_ok */
        load_rows_vec_to<T, KB, DQK, NT>(dk, kg + kb * kst, (int)kst, cnt, (int)g.Dqk);
        load_rows_vec_to<T, KB, DV, NT>(dv, vg + kb * vst, (int)vst, cnt, (int)g.Dv);
    } else {
        load_tile_to<T, KB, DQK, NT>(dk, kg, g.Dqk, false, [&](int r) -> int64_t { return r < cnt ? (kb + r) * kst : -1; });
        load_tile_to<T, KB, DV, NT>(dv, vg, g.Dv, false, [&](int r) -> int64_t { return r < cnt ? (kb + r) * vst : -1; });
    }
}

/* The thread's scores of a tile (keys ks + ...; the MMA's accumulator layout)
 * masked to the keys its two rows may see (vis), and their maxima. */
template <int NJ>
NSA_DEV void blk_mask(float (&s)[NJ][4], const int (&vis)[2], int ks, int lane, float (&mx)[2])
{
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = ks + j * 8 + 2 * (lane & 3) + (e & 1);
            const float x = key < vis[e >> 1] ? s[j][e] : -INFINITY;
            s[j][e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
}

/* The warp's two rows per thread of a run (vis[i] > 0: row i of the thread
 * belongs to it): their row sums completed over the quad, then o / l in the
 * dtype and (m, l) stored as the partial state of (token, head, slot). */
template <typename T, int DV>
NSA_DEV void blk_store_states(const BlkEnt &se, const Geom &g, int warp, int lane, const int (&rent)[2],
                              const int (&vis)[2], float (&oacc)[DV / 8][4], const float (&m)[2], float (&ls)[2],
                              T *part_o, float2 *part_ml)
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 1);
        ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 2);
        if (vis[i] == 0) continue;
        const int r = warp * 16 + (lane >> 2) + 8 * i;
        const int64_t pr = se.pr[rent[i]] + (int64_t)(r % (int)g.G) * g.n;
        const float inv = ls[i] > 0.f ? 1.f / ls[i] : 0.f;
        T *dst = part_o + pr * DV;
#pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            const int col = j * 8 + 2 * (lane & 3);
            *reinterpret_cast<uint32_t *>(dst + col) = Mma<T>::pack(oacc[j][2 * i] * inv, oacc[j][2 * i + 1] * inv);
        }
        if ((lane & 3) == 0) part_ml[pr] = make_float2(m[i], ls[i]);
    }
}

/* slc_sm80_blk.cu: the pass's reduce, one warp per (token, query head) of
 * tokens [t0, t1) merging its slots' partial states (dvp: their columns) into
 * o and lse; both block-major kernels launch it. */
cudaError_t slc_blk_reduce(const Geom &g, int dvp, int64_t t0, int64_t t1, View idx, const void *part_o,
                           const float *part_ml, MView o, MView lse, const SlcSum &z, cudaStream_t s);

/* A block-major launch: per pass of tokens [t0, t1), the pass's map built,
 * the attention kernel kern (slc_blk_kernel or slc_blk_sm90_kernel) over its
 * sorted entries in CTAs of SBK_BM / G, then the reduce into o and lse. */
template <typename T, int DV, typename Kernel>
static cudaError_t blk_launch(Kernel kern, size_t smem, const Dev &dev, const Geom &g, View q, View k, View v, View idx,
                              MView o, MView lse, const SlcSum &z, SlcMap &map, int64_t pass_tokens, void *part_o,
                              float *part_ml, cudaStream_t s)
{
    static_assert(sizeof(T) == 2, "tensor-core path: 16-bit storage");
    cudaError_t e = launch_smem(kern, dev, smem);
    if (e != cudaSuccess) return e;
    const bool qvec = vec_ok(q.p, q.st, q.sh, g.Dqk);
    const bool kvvec = vec_ok(k.p, k.st, k.sh, g.Dqk) && vec_ok(v.p, v.st, v.sh, g.Dv) && rs32_ok(k.st, SBK_KB) &&
                       rs32_ok(v.st, SBK_KB);
    const int E = (int)(SBK_BM / g.G);
    const int sentinel = (int)(g.Hkv * map.nb);
    for (int64_t t0 = 0; t0 < g.T; t0 += pass_tokens) {
        const int64_t t1 = nsa_min64(g.T, t0 + pass_tokens), nent = (t1 - t0) * g.Hkv * g.n;
        if ((e = slc_map_build(g, idx, map, t0, t1, true, s)) != cudaSuccess) return e;
        kern<<<(unsigned)((nent + E - 1) / E), SBK_THREADS, smem, s>>>(
            g, t0, nent, sentinel, map.seg_out, map.list_out, (const T *)q.p, q.st, q.sh, (const T *)k.p, k.st, k.sh,
            (const T *)v.p, v.st, v.sh, qvec, kvvec, (const int *)idx.p, idx.st, idx.sh, (T *)part_o, (float2 *)part_ml);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        if ((e = slc_blk_reduce(g, DV, t0, t1, idx, part_o, part_ml, o, lse, z, s)) != cudaSuccess) return e;
    }
    return cudaSuccess;
}

} // namespace nsa_cuda

#endif
