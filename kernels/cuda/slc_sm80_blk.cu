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

cudaError_t slc_sm80_blk(const Geom &g, const Dev &dev, int dqkp, int dvp, View q, View k, View v, View idx, MView o,
                         MView lse, const SlcSum &z, SlcMap &map, int64_t pass_tokens, void *part_o, float *part_ml,
                         cudaStream_t s)
{
    if (g.T == 0) return cudaSuccess;
    if (g.G < 1 || g.G > SBK_BM || pass_tokens < 1) return cudaErrorInvalidValue;
    NSA_SLC_DISPATCH(launch_blk, g, dqkp, dvp, dev, g, q, k, v, idx, o, lse, z, map, pass_tokens, part_o, part_ml, s);
}

} // namespace nsa_cuda
