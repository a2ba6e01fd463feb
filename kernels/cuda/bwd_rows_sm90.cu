/*
 * bwd_rows_sm90.cu -- the rows kernel (dq, dgate, delta) of the compressed
 * and window backward on Hopper's warpgroup MMA (sm_90a code): the same
 * tiles and formulas as bwd_sm80.cu's bwd_rows_sm80_kernel (its header has
 * them), with the products on the tensor cores of a warpgroup:
 *
 *   S = Q K^T, E = dO V^T   m64 x BN, Q / dO (the CTA's 64 rows) and the
 *                           K / V tile from 128-byte-swizzled shared memory;
 *   dq += dS K              A = scale dS from the registers that hold S (hi +
 *                           lo in bf16), K read MN-major (transposed).
 *
 * One warpgroup per 64-row tile of bwd_attn_sm80's list; K/V tiles of BN keys
 * (64; 32 at Dqk 192) double-buffered through cp.async, a CTA barrier per
 * tile; a tile that no row of the warpgroup reads is skipped as a whole (the
 * wgmma instructions are warpgroup-wide). Up to Dqk 128 one sweep, as the
 * selected rows kernel: dg = sum p e, A += (p e) K and B += p K (hi + lo in
 * f16 too), dq = scale g (A - dg B) after the last tile; at Dqk 192 (where
 * a second m64 x 192 accumulator does not fit the registers) two sweeps, as
 * the sm80 kernel: dg first, then dS and dq. Two CTAs per SM.
 */
#include "bwd_sm90.cuh"

namespace nsa_cuda {

namespace {

template <int DQK> constexpr int rows90_bn() { return DQK > 128 ? 32 : 64; } /* tiles.h: bwd_rows90_smem */

template <typename T, int DQK, int DV, int MODE, int BN>
__global__ void __launch_bounds__(BWD_THREADS, 2)
    bwd_rows_sm90_kernel(const Geom g, const Tiles tl, const BwdIn in, const T *__restrict__ k, int64_t kst,
                         int64_t ksh, const T *__restrict__ v, int64_t vst, int64_t vsh, int64_t kd, int64_t vd,
                         bool qvec, bool ovec, bool kvvec, float *dq, int64_t dqst, int64_t dqsh)
{
#ifdef NSA_WGMMA
    constexpr int BM = BWD_ROWS_BM, NT = BWD_THREADS;
    /* one sweep (dq = scale g (A - dg B), rows_single_step) where its second accumulator fits the
     * registers; two sweeps at Dqk 192 */
    constexpr bool ONE = DQK <= 128;
    constexpr uint32_t QB = BM * DQK * 2, OB = BM * DV * 2, KB = BN * DQK * 2, VB = BN * DV * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *const sQ = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    unsigned char *const sO = sQ + QB;
    unsigned char *const sK = sO + OB;     /* two tiles */
    unsigned char *const sV = sK + 2 * KB; /* two tiles */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const TileCtx c = tile_ctx(g, tl);
    int64_t klo, khi, kbase;
    tile_keys<MODE>(g, c, klo, khi, kbase);
    const T *kg = k + kbase * kst + c.gi * ksh;
    const T *vg = v + kbase * vst + c.gi * vsh;

    load_tile_to<T, BM, DQK, NT>([&](int r, int cc) { return (T *)(sQ + sw128_off(r, cc, BM)); }, (const T *)in.q.p,
                                 g.Dqk, qvec, [&](int r) -> int64_t {
                                     return r < c.nrows ? (c.t0 + r / c.hca) * in.q.st + (c.h0 + r % c.hca) * in.q.sh
                                                        : -1;
                                 });
    load_tile_to<T, BM, DV, NT>([&](int r, int cc) { return (T *)(sO + sw128_off(r, cc, BM)); },
                                (const T *)in.dout.p, g.Dv, ovec, [&](int r) -> int64_t {
                                    return r < c.nrows
                                               ? (c.t0 + r / c.hca) * in.dout.st + (c.h0 + r % c.hca) * in.dout.sh
                                               : -1;
                                });
    cp_async_commit();
    const int64_t nkt = khi >= klo ? (khi - klo + BN) / BN : 0;
    auto load_kv = [&](int64_t kt, int buf) {
        const int64_t ks = klo + kt * BN;
        load_tile_to<T, BN, DQK, NT>([&](int r, int cc) { return (T *)(sK + buf * KB + sw128_off(r, cc, BN)); }, kg,
                                     kd, kvvec, [&](int r) -> int64_t { return ks + r <= khi ? (ks + r) * kst : -1; });
        load_tile_to<T, BN, DV, NT>([&](int r, int cc) { return (T *)(sV + buf * VB + sw128_off(r, cc, BN)); }, vg,
                                    vd, kvvec, [&](int r) -> int64_t { return ks + r <= khi ? (ks + r) * vst : -1; });
    };

    const WarpRanges<MODE> wr(g, c, warp, lane);
    /* the warpgroup's key range: its first and last rows bound it (rows are token-major) */
    int64_t gminlo, gmaxhi, tmp;
    row_range<MODE>(g, c.tl0, gminlo, tmp);
    row_range<MODE>(g, c.tl0 + (nsa_min64(BM, c.nrows) - 1) / c.hca, tmp, gmaxhi);
    float L[2], gt[2];
    int64_t rt[2], rh[2];
    bool rv[2];
    frag_rows(in, c, warp, lane, L, gt, rt, rh, rv);
    const float sl = g.scale * NSA_LOG2E;
    const uint64_t qd = sw128_desc(smem_u32(sQ), 16), od = sw128_desc(smem_u32(sO), 16);
    float dgp[2] = {0.f, 0.f}, dg[2] = {0.f, 0.f};
    float dqa[DQK / 8][4], dqb[ONE ? DQK / 8 : 1][4];
    zero_frag(dqa);
    zero_frag(dqb);

    const int passes = dq && !ONE ? 2 : 1;
    for (int pass = 0; pass < passes; pass++) {
        if (nkt > 0) load_kv(0, 0);
        cp_async_commit();
        for (int64_t kt = 0; kt < nkt; kt++) {
            if (kt + 1 < nkt) load_kv(kt + 1, (int)((kt + 1) & 1));
            cp_async_commit();
            cp_async_wait<1>();
            fence_async_smem();
            __syncthreads();
            const int buf = (int)(kt & 1);
            const int64_t ks = klo + kt * BN;
            if (ks <= gmaxhi && ks + BN - 1 >= gminlo) {
                const uint32_t ka = smem_u32(sK + buf * KB), va = smem_u32(sV + buf * VB);
                float s[BN / 8][4], e[BN / 8][4], mx[2];
                zero_frag(s);
                zero_frag(e);
                {
                    const uint64_t kdsc = sw128_desc(ka, 16), vdsc = sw128_desc(va, 16);
                    wg_fence();
#pragma unroll
                    for (int cc = 0; cc < DQK / 16; cc++) {
                        const uint32_t off = (cc & 3) * 32; /* 16 dims into the 128-byte row */
                        wg_ss<T, BN>(s, desc_at(qd, (cc >> 2) * BM * 128 + off),
                                     desc_at(kdsc, (cc >> 2) * BN * 128 + off), cc > 0);
                    }
#pragma unroll
                    for (int cc = 0; cc < DV / 16; cc++) {
                        const uint32_t off = (cc & 3) * 32;
                        wg_ss<T, BN>(e, desc_at(od, (cc >> 2) * BM * 128 + off),
                                     desc_at(vdsc, (cc >> 2) * BN * 128 + off), cc > 0);
                    }
                    wg_commit();
                    wg_wait<0>();
                    wg_hold(s);
                    wg_hold(e);
                }
                wr.tile_max(s, ks, lane, mx); /* masks the keys outside the rows' ranges */
                if (ONE) rows_single_step(s, e, L, dgp, sl);
                else rows_sweep_step(pass, s, e, L, gt, dg, dgp, sl, g.scale);
                if (dq && (ONE || pass == 1)) {
                    /* K MN-major: 64-dim panels BN * 128 bytes apart, k-step 16 keys */
                    const uint64_t kt_ = sw128_desc(ka, BN * 128);
                    wg_fence();
                    if constexpr (ONE) {
#pragma unroll
                        for (int cc = 0; cc < BN / 16; cc++) {
                            wg_rs_wide<T, DQK, BN / 8, true>(dqb, s, cc, desc_at(kt_, cc * 16 * 128), BN * 128);
                            wg_rs_wide<T, DQK, BN / 8, true>(dqa, e, cc, desc_at(kt_, cc * 16 * 128), BN * 128);
                        }
                    } else {
#pragma unroll
                        for (int cc = 0; cc < BN / 16; cc++)
                            wg_rs_wide<T, DQK>(dqa, s, cc, desc_at(kt_, cc * 16 * 128), BN * 128);
                    }
                    wg_commit();
                    wg_wait<0>();
                    wg_hold(dqa);
                    if constexpr (ONE) wg_hold(dqb);
                }
            }
            __syncthreads(); /* the buffer is free for the next fetch */
        }
        if (pass == 0)
            rows_write_dg(in, dgp, gt, rv, dg, lane, [&](int i) { return rt[i]; }, [&](int i) { return rh[i]; });
    }
    if (dq) {
        if constexpr (ONE) rows_dq_finish(dqa, dqb, dg, gt, g.scale);
        warp_add_rows(dqa, g.Dqk, lane, [&](int i) { return rv[i] ? dq + rt[i] * dqst + rh[i] * dqsh : (float *)nullptr; });
    }
#endif
}

template <typename T, int DQK, int DV, int MODE>
cudaError_t launch_rows90(const Geom &g, const Dev &dev, const BwdTiles &bt, const BwdIn &in, View k, View v, MView dq,
                          cudaStream_t s)
{
    constexpr int BN = rows90_bn<DQK>();
    if (bt.rows.count == 0) return cudaSuccess;
    const bool qvec = vec_ok(in.q.p, in.q.st, in.q.sh, g.Dqk), ovec = vec_ok(in.dout.p, in.dout.st, in.dout.sh, g.Dv);
    /* the packed compressed rows are padded and aligned */
    const bool kvvec = MODE == 0 || (vec_ok(k.p, k.st, k.sh, g.Dqk) && vec_ok(v.p, v.st, v.sh, g.Dv));
    const int64_t kd = MODE == 0 ? DQK : g.Dqk, vd = MODE == 0 ? DV : g.Dv;
    auto kern = bwd_rows_sm90_kernel<T, DQK, DV, MODE, BN>;
    size_t smem = bwd_rows90_smem(DQK, DV);
    cudaError_t e = launch_smem(kern, dev, smem);
    if (e != cudaSuccess) return e;
    kern<<<dim3((unsigned)bt.rows.count, (unsigned)(g.Hkv * bt.rows.nchunk)), BWD_THREADS, smem, s>>>(
        g, bt.rows, in, (const T *)k.p, k.st, k.sh, (const T *)v.p, v.st, v.sh, kd, vd, qvec, ovec, kvvec,
        (float *)dq.p, dq.st, dq.sh);
    return cudaGetLastError();
}

template <typename T, int DQK, int DV>
cudaError_t rows90_t(const Geom &g, const Dev &dev, int mode, const BwdTiles &bt, const BwdIn &in, View k, View v,
                     MView dq, cudaStream_t s)
{
    if constexpr (!keys90_dims(DQK, DV)) {
        return cudaErrorInvalidValue;
    } else {
        return mode == 0 ? launch_rows90<T, DQK, DV, 0>(g, dev, bt, in, k, v, dq, s)
                         : launch_rows90<T, DQK, DV, 2>(g, dev, bt, in, k, v, dq, s);
    }
}

} // namespace

cudaError_t bwd_rows_sm90(const Geom &g, const Dev &dev, int mode, int dqkp, int dvp, const BwdTiles &bt,
                          const BwdIn &in, View k, View v, MView dq, cudaStream_t s)
{
    if (mode != 0 && mode != 2) return cudaErrorInvalidValue;
    NSA_SLC_DISPATCH(rows90_t, g, dqkp, dvp, g, dev, mode, bt, in, k, v, dq, s);
}

} // namespace nsa_cuda
