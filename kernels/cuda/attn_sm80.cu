/*
 * attn_sm80.cu -- the compressed and window branches on mma.sync (every
 * sm_80+ device; the kernel of the sm80 and sm86 classes): FlashAttention-2-
 * style tiles on the tensor cores, f16 / bf16.
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
 * Tiles (tiles.h, pick_attn_sm80): "two" (BN = 32, Q fragments re-read from
 * shared memory, 128 registers, two CTAs per SM: 68 KB at D 128, 92 KB at
 * Dqk 192) where it is compiled and fits, else "one" (BN = 64, Q in
 * registers, one CTA per SM, ~230 registers: 102 KB at D 128).
 */
#include "tile_qk.cuh"

namespace nsa_cuda {

template <typename T, int DQK, int DV, int MODE, int BN, bool QREG, int MINB>
__global__ void __launch_bounds__(TC_THREADS, MINB)
    attn_sm80_kernel(const Geom g, const Tiles tl, const T *__restrict__ q, int64_t qst, int64_t qsh,
                   const T *__restrict__ k, int64_t kst, int64_t ksh, const T *__restrict__ v, int64_t vst,
                   int64_t vsh, int64_t kd, int64_t vd, bool qvec, bool kvvec, float *o, int64_t ost, int64_t osh,
                   float *lse, int64_t lst, int64_t lsh, const FuseCombine fz)
{
    constexpr int BM = TC_BM, NT = TC_THREADS;
    constexpr int SQ = DQK + 8, SV = DV + 8;
    static_assert(!QREG || DQK <= 192, "Q fragments in registers up to Dqk 192");
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

template <typename T, int DQK, int DV, int MODE, int BN, bool QREG, int MINB>
static cudaError_t launch_sm80(const Dev &dev, const Geom &g, const Tiles &tl, View q, View k, View v, MView o,
                               MView lse, cudaStream_t s, const FuseCombine &fz)
{
    return launch_attn_tiles<T, DQK, DV, MODE>(attn_sm80_kernel<T, DQK, DV, MODE, BN, QREG, MINB>, BN,
                                               attn_sm80_smem(DQK, DV, BN), dev, g, tl, q, k, v, o, lse, s, fz);
}

/* the instances: tile "one" for every padded dims, "two" for 128/128 and 192/128 (tiles.h) */
template <typename T, int DQK, int DV, int MODE>
static cudaError_t launch_sm80_dims(bool two, const Dev &dev, const Geom &g, const Tiles &tl, View q, View k, View v,
                                    MView o, MView lse, cudaStream_t s, const FuseCombine &fz)
{
    if constexpr (DV == 128) {
        if (two) return launch_sm80<T, DQK, DV, MODE, 32, false, 2>(dev, g, tl, q, k, v, o, lse, s, fz);
    }
    if (two) return cudaErrorInvalidValue;
    if constexpr (DQK > 192) return launch_sm80<T, DQK, DV, MODE, 32, false, 1>(dev, g, tl, q, k, v, o, lse, s, fz);
    else return launch_sm80<T, DQK, DV, MODE, 64, true, 1>(dev, g, tl, q, k, v, o, lse, s, fz);
}

template <typename T, int MODE>
static cudaError_t attn_sm80_t(const AttnTile &t, const Dev &dev, const Geom &g, const Tiles &tl, int dqkp, int dvp,
                               View q, View k, View v, MView o, MView lse, cudaStream_t s, const FuseCombine &fz)
{
    const AttnTile one = attn_sm80_one(dqkp), two = ATTN_SM80_TWO;
    const bool is_two = t.bn == two.bn && t.minb == two.minb && t.qreg == two.qreg;
    if (!is_two && !(t.bn == one.bn && t.minb == one.minb && t.qreg == one.qreg)) return cudaErrorInvalidValue;
    switch (dqkp * 1000 + dvp) {
    case 32032: return launch_sm80_dims<T, 32, 32, MODE>(is_two, dev, g, tl, q, k, v, o, lse, s, fz);
    case 64064: return launch_sm80_dims<T, 64, 64, MODE>(is_two, dev, g, tl, q, k, v, o, lse, s, fz);
    case 128128: return launch_sm80_dims<T, 128, 128, MODE>(is_two, dev, g, tl, q, k, v, o, lse, s, fz);
    case 192128: return launch_sm80_dims<T, 192, 128, MODE>(is_two, dev, g, tl, q, k, v, o, lse, s, fz);
    case 256256: return launch_sm80_dims<T, 256, 256, MODE>(is_two, dev, g, tl, q, k, v, o, lse, s, fz);
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
