/*
 * slc_sm90_blk.cu -- slc_sm80_blk's block-major selected attention on
 * Hopper's warpgroup MMA (the sm90 class, sm_90a code): the same CTAs of
 * SBK_BM rows over the sorted inverse map, the same runs, masks, online
 * softmax and partial states (slc_blk.cuh), with the CTA's four warps one
 * warpgroup whose two products read their operands from shared memory:
 *
 *   S = Q K^T   one m64n64k16 wgmma per 16 dims, Q and K in 128-byte-swizzled
 *               panels (cp.async writes each 16-byte chunk to its swizzled
 *               place);
 *   O += P V    one m64nDVk16 wgmma per 16 keys, P from the registers that
 *               hold S (rounded to the input type, as slc_sm80_blk's), V
 *               MN-major (transposed by the MMA).
 *
 * slc_sm80_blk spends most of its issue slots and its short-scoreboard stalls
 * on the fragments' ldmatrix loads and its dependent HMMA chains (ncu, H100,
 * 2026-12-07: about 2440 instructions per warp, 128 of them HMMA); here the
 * tensor cores read the operands themselves. A warpgroup's wgmma is collective,
 * so every warp computes each run of the CTA (slc_sm80_blk skips the warps
 * without rows in it); rows of other runs are masked as in slc_sm80_blk.
 * Only the fp32 summation order inside the MMAs may differ from slc_sm80_blk;
 * measured, the outputs were bitwise equal at every shape compared
 * (docs/cuda-results.md, 2026-12-08).
 */
#include "slc_blk.cuh"
#include "wgmma.cuh"

namespace nsa_cuda {

template <typename T, int DQK, int DV>
__global__ void __launch_bounds__(SBK_THREADS, SBK_MIN_CTAS)
    slc_blk_sm90_kernel(const Geom g, int64_t t0, int64_t nent, int sentinel, const int *seg, const int *ent,
                        const T *q, int64_t qst, int64_t qsh, const T *k, int64_t kst, int64_t ksh, const T *v,
                        int64_t vst, int64_t vsh, bool qvec, bool kvvec, const int *idx, int64_t ist, int64_t ish,
                        T *part_o, float2 *part_ml)
{
#ifdef NSA_WGMMA
    constexpr int NT = SBK_THREADS, BM = SBK_BM, KB = SBK_KB;
    static_assert(NT == 128 && BM == 64, "one warpgroup of 64 rows");
    constexpr uint32_t QB = BM * DQK * 2, KBY = KB * DQK * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* swizzle atoms need 1024-byte alignment; the launcher added 1 KB */
    unsigned char *const sQ = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    unsigned char *const sK = sQ + QB;
    unsigned char *const sV = sK + KBY;
    NSA_BLK_ENTRIES(se);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int G = (int)g.G, E = BM / G, rows = E * G;
    int64_t eslot = 0, egi = 0, et = 0; /* this thread's entry (tid < E) */
    if (tid < E) blk_entry(se, g, t0, (int64_t)blockIdx.x * E + tid, nent, sentinel, seg, ent, tid, et, egi, eslot);
    __syncthreads();
    if (se.seg[0] < 0) return; /* sorted: past the last eligible entry */
    load_tile_to<T, BM, DQK, NT>([&](int r, int c) { return (T *)(sQ + sw128_off(r, c, BM)); }, q, g.Dqk, qvec,
                                 [&](int r) { return blk_qrow(se, G, rows, r, qst, qsh); });
    cp_async_commit();
    if (tid < E && se.seg[tid] >= 0) blk_entry_keys(se, g, idx, ist, ish, tid, et, egi, eslot);
    __syncthreads(); /* se.kb, se.nk */
    auto kdst = [&](int r, int c) { return (T *)(sK + sw128_off(r, c, KB)); };
    auto vdst = [&](int r, int c) { return (T *)(sV + sw128_off(r, c, KB)); };

    const float sl = g.scale * NSA_LOG2E;
    float oacc[DV / 8][4], m[2], ls[2];
    warp_state_init(oacc, m, ls);
    /* this thread's two rows (lane / 4 + 8 i of the warp) and their entries */
    int rent[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = warp * 16 + (lane >> 2) + 8 * i;
        rent[i] = r < rows ? r / G : BM;
    }
    const uint64_t qd = sw128_desc(smem_u32(sQ), 16), kd = sw128_desc(smem_u32(sK), 16),
                   vd = sw128_desc(smem_u32(sV), KB * 128);

    for (int i0 = 0; i0 < E && se.seg[i0] >= 0;) {
        const int i1 = blk_run_end(se, i0, E);
        const int nk = se.nk[i1 - 1]; /* tokens ascending in a run: the last sees the most keys */
        const int64_t kb = se.kb[i0];
        const int64_t gi = se.head0[i0] / G; /* a run's entries share (KV head, block); runs may not */
        int vis[2];
#pragma unroll
        for (int i = 0; i < 2; i++) vis[i] = rent[i] >= i0 && rent[i] < i1 ? se.nk[rent[i]] : 0;
        for (int ks = 0; ks < nk; ks += KB) {
            __syncthreads(); /* the tile's last readers are done */
            blk_load_kv<T, DQK, DV>(g, gi, kb + ks, min(KB, nk - ks), kdst, vdst, k, kst, ksh, v, vst, vsh, kvvec);
            cp_async_commit();
            cp_async_wait<0>();
            fence_async_smem();
            __syncthreads();
            float s[KB / 8][4];
            wg_qk<T, KB, DQK, BM>(s, qd, kd);
            wg_wait<0>();
            wg_hold(s);
            float mx[2];
            blk_mask(s, vis, ks, lane, mx);
            warp_softmax_step(s, mx, m, ls, oacc, sl);
            wg_pv<T, DV, KB>(oacc, s, vd);
            wg_wait<0>();
            wg_hold(oacc);
        }
        /* the run's rows of each warp: their partial states; then a fresh state */
        blk_store_states<T, DV>(se, g, warp, lane, rent, vis, oacc, m, ls, part_o, part_ml);
        warp_state_init(oacc, m, ls);
        i0 = i1;
    }
    cp_async_wait<0>();
#endif
}

template <typename T, int DQK, int DV>
static cudaError_t launch_blk_sm90(const Dev &dev, const Geom &g, View q, View k, View v, View idx, MView o,
                                   MView lse, const SlcSum &z, SlcMap &map, int64_t pass_tokens, void *part_o,
                                   float *part_ml, cudaStream_t s)
{
    return blk_launch<T, DV>(slc_blk_sm90_kernel<T, DQK, DV>, slc_sm90_blk_smem(DQK, DV), dev, g, q, k, v, idx, o, lse,
                             z, map, pass_tokens, part_o, part_ml, s);
}

template <typename T>
static cudaError_t slc_sm90_blk_t(const Dev &dev, const Geom &g, int dqkp, int dvp, View q, View k, View v, View idx,
                                  MView o, MView lse, const SlcSum &z, SlcMap &map, int64_t pass_tokens, void *part_o,
                                  float *part_ml, cudaStream_t s)
{
    switch (dqkp * 1000 + dvp) {
    case 64064:
        return launch_blk_sm90<T, 64, 64>(dev, g, q, k, v, idx, o, lse, z, map, pass_tokens, part_o, part_ml, s);
    case 128128:
        return launch_blk_sm90<T, 128, 128>(dev, g, q, k, v, idx, o, lse, z, map, pass_tokens, part_o, part_ml, s);
    case 192128:
        return launch_blk_sm90<T, 192, 128>(dev, g, q, k, v, idx, o, lse, z, map, pass_tokens, part_o, part_ml, s);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t slc_sm90_blk(const Geom &g, const Dev &dev, int dqkp, int dvp, View q, View k, View v, View idx, MView o,
                         MView lse, const SlcSum &z, SlcMap &map, int64_t pass_tokens, void *part_o, float *part_ml,
                         cudaStream_t s)
{
    if (g.T == 0) return cudaSuccess;
    if (g.G < 1 || g.G > SBK_BM || pass_tokens < 1 || !slc_sm90_blk_takes(g.G, dqkp, dvp)) return cudaErrorInvalidValue;
    if (g.dtype == 1) return slc_sm90_blk_t<__half>(dev, g, dqkp, dvp, q, k, v, idx, o, lse, z, map, pass_tokens, part_o, part_ml, s);
    if (g.dtype == 2)
        return slc_sm90_blk_t<__nv_bfloat16>(dev, g, dqkp, dvp, q, k, v, idx, o, lse, z, map, pass_tokens, part_o,
                                            part_ml, s);
    return cudaErrorInvalidValue;
}

} // namespace nsa_cuda
