/*
 * attn_tc.cu -- version 2 of the compressed and window branches:
 * FlashAttention-2-style tiles on the tensor cores (sm_80+, f16 / bf16).
 *
 * CTA = 8 warps, 128 query rows (tile_qk.cuh: tokens x heads of one KV
 * group, head fastest), each warp 16 rows. The CTA walks the union of its
 * rows' visible key ranges in tiles of BN keys, K/V double-buffered in shared
 * memory with cp.async; per tile each warp computes S = Q K^T (mma.sync
 * m16n8k16, fp32 accumulation), masks keys outside its rows' ranges, does the
 * online-softmax update in fp32 (exp2 with the scale folded in) and adds
 * P V with P taken straight from the accumulator registers (rounded to the
 * input type). Head dims are padded with zeros to DQK/DV (32, 64, 128, 192,
 * 256), so any Dqk, Dv <= 256 runs here, odd ones included.
 *
 *   compressed (MODE 0): keys = compressed rows, pre-packed to the input type
 *                        (pack_cmp16), row visible iff i < nc(t).
 *   window     (MODE 2): keys = tokens max(0, t-w+1) .. t of the sequence.
 *
 * Shared memory (D = 128, BN = 64): Q 34 KB + K 2x17 KB + V 2x17 KB = 102 KB,
 * one CTA (8 warps) per SM. Register budget: o 64 + s 32 + q 32 floats.
 *
 * Measured speeds: backends/cuda/NOTES.md.
 */
#include "tile_qk.cuh"

namespace nsa_cuda {

/* VAR 0: BN = 64 keys per tile (32 for Dqk > 192), Q fragments held in
 * registers, one CTA per SM (~230 registers). VAR 1 (Dv <= 128, the default
 * there): BN = 32 and Q fragments re-read from shared memory, so that two
 * CTAs (16 warps) fit per SM (128 registers). H200, T = 64k, bf16, D = 128:
 * cmp 19.7 -> 19.4 ms, window (with the fused combine) 10.6 -> 7.9 ms.
 * NSA_CUDA_ATTN_VAR=0 selects VAR 0 everywhere. */
template <int DQK, int VAR> struct AttnCfg {
    static constexpr int BN = VAR ? 32 : TcBn<DQK>::value;
    static constexpr bool QREG = VAR ? false : DQK <= 192;
    static constexpr int MINB = VAR ? 2 : 1;
};

template <typename T, int DQK, int DV, int MODE, int VAR>
__global__ void __launch_bounds__(TC_THREADS, AttnCfg<DQK, VAR>::MINB)
    attn_tc_kernel(const Geom g, const Tiles tl, const T *__restrict__ q, int64_t qst, int64_t qsh,
                   const T *__restrict__ k, int64_t kst, int64_t ksh, const T *__restrict__ v, int64_t vst,
                   int64_t vsh, int64_t kd, int64_t vd, bool qvec, bool kvvec, float *o, int64_t ost, int64_t osh,
                   float *lse, int64_t lst, int64_t lsh, const FuseCombine fz)
{
    constexpr int BM = TC_BM, NT = TC_THREADS, BN = AttnCfg<DQK, VAR>::BN;
    constexpr int SQ = DQK + 8, SV = DV + 8;
    constexpr bool QREG = AttnCfg<DQK, VAR>::QREG;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = (T *)smem_raw;
    T *sK = sQ + BM * SQ;
    T *sV = sK + 2 * BN * SQ;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const TileCtx c = tile_ctx(g, tl);
    int64_t klo, khi, kbase;
    tile_keys<MODE>(g, c, klo, khi, kbase);
    const T *kg = k + kbase * kst + c.gi * ksh;
    const T *vg = v + kbase * vst + c.gi * vsh;

    load_tile<T, BM, DQK, SQ, NT>(sQ, q, g.Dqk, qvec, [&](int r) -> int64_t {
        return r < c.nrows ? (c.t0 + r / c.hca) * qst + (c.h0 + r % c.hca) * qsh : -1;
    });
    cp_async_commit();
    const int64_t nkt = khi >= klo ? (khi - klo + BN) / BN : 0;
    auto load_kv = [&](int64_t kt, int buf) {
        const int64_t ks = klo + kt * BN;
        if (kvvec) { /* the launcher checked alignment and rs32_ok */
            const int nv = (int)nsa_min64(BN, khi - ks + 1);
            load_rows_vec<T, BN, DQK, SQ, NT>(sK + buf * BN * SQ, kg + ks * kst, (int)kst, nv, (int)kd);
            load_rows_vec<T, BN, DV, SV, NT>(sV + buf * BN * SV, vg + ks * vst, (int)vst, nv, (int)vd);
        } else {
            load_tile<T, BN, DQK, SQ, NT>(sK + buf * BN * SQ, kg, kd, false,
                                          [&](int r) -> int64_t { return ks + r <= khi ? (ks + r) * kst : -1; });
            load_tile<T, BN, DV, SV, NT>(sV + buf * BN * SV, vg, vd, false,
                                         [&](int r) -> int64_t { return ks + r <= khi ? (ks + r) * vst : -1; });
        }
    };
    if (nkt > 0) load_kv(0, 0);
    cp_async_commit();

    const WarpRanges<MODE> wr(g, c, warp, lane);
    cp_async_wait<1>();
    __syncthreads();
    const T *sQw = sQ + warp * 16 * SQ;
    uint32_t qf[QREG ? DQK / 16 : 1][4];
    q_frags<SQ, QREG>(qf, sQw, lane);

    const float sl = g.scale * NSA_LOG2E;
    float oacc[DV / 8][4], m[2], ls[2];
    warp_state_init(oacc, m, ls);

    for (int64_t kt = 0; kt < nkt; kt++) {
        if (kt + 1 < nkt) load_kv(kt + 1, (int)((kt + 1) & 1));
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const int buf = (int)(kt & 1);
        const int64_t ks = klo + kt * BN;
        if (wr.any && ks <= wr.maxhi && ks + BN - 1 >= wr.minlo) {
            float s[BN / 8][4];
#pragma unroll
            for (int j = 0; j < BN / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            warp_qk<T, DQK, BN / 8, SQ, QREG>(s, qf, sQw, sK + buf * BN * SQ, 0, lane);

            float mx[2];
            wr.tile_max(s, ks, lane, mx);
            warp_softmax_step(s, mx, m, ls, oacc, sl);
            warp_pv<T, DV, BN / 16, SV>(oacc, s, sV + buf * BN * SV, 0, lane);
        }
        __syncthreads();
    }

    attn_epilogue<T, MODE>(g, c, warp, lane, oacc, m, ls, o, ost, osh, lse, lst, lsh, fz);
}

static size_t attn_tc_smem_bn(int dqkp, int dvp, int BN)
{
    return 2 * (size_t)(TC_BM * (dqkp + 8) + 2 * BN * (dqkp + 8) + 2 * BN * (dvp + 8));
}

size_t attn_tc_smem(int dqkp, int dvp, int mode)
{
    const int BN = dqkp > 192 ? 32 : 64; /* TcBn: VAR 0, the larger of the two */
    (void)mode;
    return 2 * (size_t)(TC_BM * (dqkp + 8) + 2 * BN * (dqkp + 8) + 2 * BN * (dvp + 8));
}

template <typename T, int DQK, int DV, int MODE, int VAR>
static cudaError_t launch_tc(const Geom &g, const Tiles &tl, View q, View k, View v, MView o,
                             MView lse, cudaStream_t s, const FuseCombine &fz)
{
    constexpr int BN = AttnCfg<DQK, VAR>::BN;
    return launch_attn_tiles<T, DQK, DV, MODE>(attn_tc_kernel<T, DQK, DV, MODE, VAR>, BN,
                                               attn_tc_smem_bn(DQK, DV, BN), g, tl, q, k, v, o, lse, s, fz);
}

template <typename T, int MODE>
static cudaError_t attn_tc_t(const Geom &g, const Tiles &tl, int dqkp, int dvp, View q, View k, View v, MView o,
                             MView lse, cudaStream_t s, const FuseCombine &fz)
{
    switch (dqkp * 1000 + dvp) {
    case 32032: return launch_tc<T, 32, 32, MODE, 0>(g, tl, q, k, v, o, lse, s, fz);
    case 64064: return launch_tc<T, 64, 64, MODE, 0>(g, tl, q, k, v, o, lse, s, fz);
    case 128128:
        return g.attn_var == 1 ? launch_tc<T, 128, 128, MODE, 1>(g, tl, q, k, v, o, lse, s, fz)
                               : launch_tc<T, 128, 128, MODE, 0>(g, tl, q, k, v, o, lse, s, fz);
    case 192128:
        return g.attn_var == 1 ? launch_tc<T, 192, 128, MODE, 1>(g, tl, q, k, v, o, lse, s, fz)
                               : launch_tc<T, 192, 128, MODE, 0>(g, tl, q, k, v, o, lse, s, fz);
    case 256256: return launch_tc<T, 256, 256, MODE, 0>(g, tl, q, k, v, o, lse, s, fz);
    default: return cudaErrorInvalidValue;
    }
}

void tc_dims(int64_t dqk, int64_t dv, int *dqkp, int *dvp)
{
    *dqkp = *dvp = 0;
    if (dqk > 256 || dv > 256) return;
    if (dqk > 128 && dqk <= 192 && dv <= 128) {
        *dqkp = 192;
        *dvp = 128;
        return;
    }
    const int64_t m = dqk > dv ? dqk : dv;
    const int p = m <= 32 ? 32 : m <= 64 ? 64 : m <= 128 ? 128 : 256;
    *dqkp = *dvp = p;
}

cudaError_t attn_tc(const Geom &g, int mode, const Tiles &tl, int dqkp, int dvp, View q, View k, View v, MView o,
                    MView lse, cudaStream_t s, const FuseCombine *fzp)
{
    if (tl.count == 0) return cudaSuccess;
    FuseCombine fz = {};
    if (fzp && mode == 2) {
        fz = *fzp;
        /* element pairs (col, col + 1) at even col: 8 bytes of fp32, 4 of the output type */
        auto even = [](const void *p, int64_t st, int64_t sh, size_t align) {
            return !p || ((uintptr_t)p % align == 0 && st % 2 == 0 && sh % 2 == 0);
        };
        fz.pair = g.Dv % 2 == 0 && even(fz.ob[0].p, fz.ob[0].st, fz.ob[0].sh, 8) &&
                  even(fz.ob[1].p, fz.ob[1].st, fz.ob[1].sh, 8) && even(fz.out.p, fz.out.st, fz.out.sh, 4);
    }
    /* Hopper: both branches on wgmma (attn_wg.cu). The window branch went
     * there once attn_wg ran two CTAs per SM: H200, T = 64k, D = 128: 7.2 ms
     * here (VAR 1), 8.9 on one attn_wg CTA per SM, 5.5 on two. */
    const size_t wsm = attn_wg_smem(dqkp, dvp, attn_wg_loop(g, mode));
    if ((g.wgmma & (mode == 0 ? 1 : 4)) && wsm > 0 && (int64_t)wsm <= g.smem_optin)
        return attn_wg(g, mode, tl, dqkp, dvp, q, k, v, o, lse, s, fz);
    NSA_ATTN_DISPATCH(attn_tc_t, g, mode, g, tl, dqkp, dvp, q, k, v, o, lse, s, fz);
}

} // namespace nsa_cuda
