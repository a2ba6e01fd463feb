/*
 * attn_sm80.cu -- the compressed and window branches on mma.sync (every
 * sm_80+ device; the kernel of the sm80 and sm86 classes): FlashAttention-2-
 * style tiles on the tensor cores, f16 / bf16.
 *
 * CTA = 128 query rows (tile_qk.cuh: tokens x heads of one KV group, head
 * fastest): 8 warps of 16 rows, or 4 warps of 32 (two 16-row blocks). The
 * CTA walks the union of its rows' visible key ranges in tiles of BN keys, K/V
 * double-buffered in shared memory with cp.async, one CTA barrier per tile (the
 * fetch of tile kt + 1 is issued after it, into the buffer tile kt - 1 left);
 * per tile each warp computes S = Q K^T (mma.sync
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
 * Tiles (tiles.h, pick_attn_sm80): "r32" (4 warps of 32 rows: two 16-row
 * MMA blocks share every K / V fragment; BN = 32 at D 128, 16 at Dqk 192, Q
 * re-read from shared memory, two CTAs per SM: 68 / 71 KB) where two fit per
 * SM (the compressed branch; the window at Dqk 192), else "two" (8 warps of 16 rows, BN = 32, Q from shared memory, 128
 * registers: 68 KB at D 128, 92 KB at Dqk 192) where it fits, else "one"
 * (BN = 64, Q in registers, one CTA per SM, ~230 registers: 102 KB at D 128).
 */
#include "tile_qk.cuh"

namespace nsa_cuda {

template <typename T, int DQK, int DV, int MODE, int BN, bool QREG, int MINB, int RW>
__global__ void __launch_bounds__(TC_THREADS / RW, MINB)
    attn_sm80_kernel(const Geom g, const Tiles tl, const T *__restrict__ q, int64_t qst, int64_t qsh,
                   const T *__restrict__ k, int64_t kst, int64_t ksh, const T *__restrict__ v, int64_t vst,
                   int64_t vsh, int64_t kd, int64_t vd, bool qvec, bool kvvec, float *o, int64_t ost, int64_t osh,
                   float *lse, int64_t lst, int64_t lsh, const FuseCombine fz)
{
    constexpr int BM = TC_BM, NT = TC_THREADS / RW;
    constexpr int SQ = DQK + 8, SV = DV + 8;
    static_assert(!QREG || (DQK <= 192 && RW == 1), "Q fragments in registers up to Dqk 192, 16-row warps");
    static_assert(RW == 1 || RW == 2, "16 or 32 rows per warp");
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

    /* the warp's 16-row blocks: block h is the CTA's 16-row block warp * RW + h */
    WarpRanges<MODE> wr[RW];
#pragma unroll
    for (int h = 0; h < RW; h++) wr[h] = WarpRanges<MODE>(g, c, warp * RW + h, lane);
    cp_async_wait<1>();
    __syncthreads();
    const T *sQw = sQ + warp * RW * 16 * SQ;
    uint32_t qf[QREG ? DQK / 16 : 1][4];
    q_frags<SQ, QREG>(qf, sQw, lane);

    const float sl = g.scale * NSA_LOG2E;
    float oacc[RW][DV / 8][4], m[RW][2], ls[RW][2];
#pragma unroll
    for (int h = 0; h < RW; h++) warp_state_init(oacc[h], m[h], ls[h]);

    for (int64_t kt = 0; kt < nkt; kt++) {
        /* tile kt has landed, and every warp is done with tile kt - 1, whose
         * buffer the fetch of tile kt + 1 (overlapping this tile's work) reuses:
         * one CTA barrier per tile */
        cp_async_wait<0>();
        __syncthreads();
        if (kt + 1 < nkt) load_kv(kt + 1, (int)((kt + 1) & 1));
        cp_async_commit();
        const int buf = (int)(kt & 1);
        const int64_t ks = klo + kt * BN;
        bool touch = false;
#pragma unroll
        for (int h = 0; h < RW; h++) touch = touch || wr[h].touches(ks, BN);
        if (touch) {
            float s[RW][BN / 8][4];
#pragma unroll
            for (int h = 0; h < RW; h++)
#pragma unroll
                for (int j = 0; j < BN / 8; j++) s[h][j][0] = s[h][j][1] = s[h][j][2] = s[h][j][3] = 0.f;
            if constexpr (RW == 1) warp_qk<T, DQK, BN / 8, SQ, QREG>(s[0], qf, sQw, sK + buf * BN * SQ, 0, lane);
            else warp_qk_rw<T, DQK, BN / 8, SQ, RW>(s, sQw, sK + buf * BN * SQ, lane);
#pragma unroll
            for (int h = 0; h < RW; h++) {
                float mx[2];
                wr[h].tile_max(s[h], ks, lane, mx);
                warp_softmax_step(s[h], mx, m[h], ls[h], oacc[h], sl);
            }
            if constexpr (RW == 1) warp_pv<T, DV, BN / 16, SV>(oacc[0], s[0], sV + buf * BN * SV, 0, lane);
            else warp_pv_rw<T, DV, BN / 16, SV, RW>(oacc, s, sV + buf * BN * SV, lane);
        }
    }

#pragma unroll
    for (int h = 0; h < RW; h++)
        attn_epilogue<T, MODE>(g, c, warp * RW + h, lane, oacc[h], m[h], ls[h], o, ost, osh, lse, lst, lsh, fz);
}

template <typename T, int DQK, int DV, int MODE, int BN, bool QREG, int MINB, int RW = 1>
static cudaError_t launch_sm80(const Dev &dev, const Geom &g, const Tiles &tl, View q, View k, View v, MView o,
                               MView lse, cudaStream_t s, const FuseCombine &fz)
{
    return launch_attn_tiles<T, DQK, DV, MODE>(attn_sm80_kernel<T, DQK, DV, MODE, BN, QREG, MINB, RW>, BN,
                                               TC_THREADS / RW, attn_sm80_smem(DQK, DV, BN), dev, g, tl, q, k, v, o,
                                               lse, s, fz);
}

enum class Sm80Tile { none, one, two, r32 };

/* the instances: tile "one" for every padded dims, "two" and "r32" for 128/128 and 192/128 (tiles.h) */
template <typename T, int DQK, int DV, int MODE>
static cudaError_t launch_sm80_dims(Sm80Tile t, const Dev &dev, const Geom &g, const Tiles &tl, View q, View k,
                                    View v, MView o, MView lse, cudaStream_t s, const FuseCombine &fz)
{
    if constexpr (DV == 128) {
        constexpr int BN32 = DQK == 128 ? ATTN_SM80_R32_32.bn : ATTN_SM80_R32_16.bn;
        if (t == Sm80Tile::r32)
            return launch_sm80<T, DQK, DV, MODE, BN32, false, 2, 2>(dev, g, tl, q, k, v, o, lse, s, fz);
        if (t == Sm80Tile::two) return launch_sm80<T, DQK, DV, MODE, 32, false, 2>(dev, g, tl, q, k, v, o, lse, s, fz);
    }
    if (t != Sm80Tile::one) return cudaErrorInvalidValue;
    if constexpr (DQK > 192) return launch_sm80<T, DQK, DV, MODE, 32, false, 1>(dev, g, tl, q, k, v, o, lse, s, fz);
    else return launch_sm80<T, DQK, DV, MODE, 64, true, 1>(dev, g, tl, q, k, v, o, lse, s, fz);
}

template <typename T, int MODE>
static cudaError_t attn_sm80_t(const AttnTile &t, const Dev &dev, const Geom &g, const Tiles &tl, int dqkp, int dvp,
                               View q, View k, View v, MView o, MView lse, cudaStream_t s, const FuseCombine &fz)
{
    auto same = [&](const AttnTile &u) { return t.bn == u.bn && t.minb == u.minb && t.qreg == u.qreg && t.rw == u.rw; };
    const Sm80Tile which = same(attn_sm80_r32(dqkp))   ? Sm80Tile::r32
                           : same(ATTN_SM80_TWO)       ? Sm80Tile::two
                           : same(attn_sm80_one(dqkp)) ? Sm80Tile::one
                                                       : Sm80Tile::none;
    if (which == Sm80Tile::none) return cudaErrorInvalidValue;
    switch (dqkp * 1000 + dvp) {
    case 32032: return launch_sm80_dims<T, 32, 32, MODE>(which, dev, g, tl, q, k, v, o, lse, s, fz);
    case 64064: return launch_sm80_dims<T, 64, 64, MODE>(which, dev, g, tl, q, k, v, o, lse, s, fz);
    case 128128: return launch_sm80_dims<T, 128, 128, MODE>(which, dev, g, tl, q, k, v, o, lse, s, fz);
    case 192128: return launch_sm80_dims<T, 192, 128, MODE>(which, dev, g, tl, q, k, v, o, lse, s, fz);
    case 256256: return launch_sm80_dims<T, 256, 256, MODE>(which, dev, g, tl, q, k, v, o, lse, s, fz);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t attn_sm80(const Geom &g, const Dev &dev, const AttnTile &tile, int mode, const Tiles &tl, int dqkp,
                      int dvp, View q, View k, View v, MView o, MView lse, cudaStream_t s, const FuseCombine *fzp)
{
    if (tl.count == 0) return cudaSuccess;
    const FuseCombine fz = fuse_combine_args(g, mode, fzp);
    NSA_ATTN_DISPATCH(attn_sm80_t, g, mode, tile, dev, g, tl, dqkp, dvp, q, k, v, o, lse, s, fz);
}

} // namespace nsa_cuda
