/*
 * bwd_sm80.cu -- the backward of the three attention branches on mma.sync
 * (every sm_80+ class), f16 / bf16; bwd_ref.cu is the readable reference
 * beside it and has the same formulas (semantics section 9):
 *   p_r = exp(scale q . k_r - lse),  e_r = dO . v_r,  dg = sum_r p_r e_r,
 *   delta = g dg,  ds_r = g p_r (e_r - dg),
 *   dq = scale sum_r ds_r k_r,  dk_r += scale ds_r q,  dv_r += g p_r dO.
 *
 * Per branch two kernels, no atomics: every accumulator element is summed by
 * one thread in a fixed order, so the result is bitwise the same run to run.
 *   rows (dq, dgate, delta), query-outer, S = Q K^T and E = dO V^T on the
 *     tensor cores per key tile.
 *     compressed / window (bwd_rows_sm80_kernel): up to Dqk 128 one sweep
 *       as the selected kernel below; at 192 two sweeps over the row's keys,
 *       the first sums dg = sum p e, the second forms ds and accumulates
 *       dq += ds K. A CTA of 64 rows (tokens x heads of one KV
 *       group, head fastest, tile_qk.cuh's mapping), 4 warps of 16 rows, K/V
 *       tiles of 32 keys shared by the warps, two buffers.
 *     selected (bwd_rows_slc_sm80_kernel): one sweep, summing dg = sum p e,
 *       A = sum (p e) k and B = sum p k, then dq = scale g (A - dg B) (the
 *       same sum as scale sum g p (e - dg) k; A and B with p and p e split
 *       into hi + lo in f16 too, as the difference cancels): each block is
 *       fetched once instead of twice. One warp per (token, 16 heads of its
 *       group; 8 < G < 16 pads), Q and dO fragments in registers (at Dqk 192
 *       read from the warp's rows in shared memory, 3 warps per CTA: tiles.h
 *       bwd_slc_rows_*), the token's blocks streamed in 16-key chunks
 *       through the warp's own two buffers (__syncwarp only, as
 *       slc_sm80_g16's phase 2).
 *     selected at G <= 8 (bwd_rows_slc8_sm80_kernel): the same sweep and
 *       stream with the MMA's roles swapped, keys on the M side and the
 *       token's G heads (padded to 8, not 16) on the N side, the B fragments
 *       of p and p e transposed from the C fragments by movmatrix: half the
 *       MMAs, Q and dO in registers at every Dqk.
 *   keys (dk, dv), key-outer (bwd_keys_sm80_kernel): a CTA of 64 keys (a
 *     compressed or window key tile, or 64 keys of one selection block), 4
 *     warps of 16 keys; it walks the query rows that may read its keys
 *     (compressed: the tokens from the first that sees key 0 to the end of
 *     the sequence; window: the next w + 63 tokens; selected: the block's
 *     tokens from the inverse map) in steps of 32 rows (tokens x heads),
 *     Q / dO double-buffered, and computes S^T = K Q^T, E^T = V dO^T, then
 *     dv += (g P)^T dO and dk += dS^T Q with the probabilities taken straight
 *     from the accumulators.
 * The probabilities and dS enter their products as the input type: rounded
 * once in f16 (as FlashAttention does), split into hi + lo in bf16 for dq
 * (warp_pv_exact says why). In a bf16 call the keys kernels run as f16
 * kernels on copies of q, dO, K and V scaled by powers of two (bwd_f16.cu),
 * rounding g p and dS once; their bf16 form, with the splits, runs where the
 * scales are out of range. Everything accumulates in fp32.
 *
 * Head dims are padded with zeros to 32/32, 64/64, 128/128 or 192/128.
 */
#include <cub/cub.cuh>

#include <type_traits>

#include "bwd_common.cuh"

namespace nsa_cuda {

/* acc += p X for a warp's p (C fragments of KS*16 rows of the k dimension) and a
 * row-major tile X of those rows (stride SX): dq += ds K (rows kernels) and
 * dv += (g p)^T dO (keys kernel). In bf16, p is split into hi + lo, two
 * products, so the result is as if p were fp32; f16 rounds once (its 2^-12
 * passes the corpus at 0.35 of the tolerance). Rounded to bf16 once, dq, dk
 * and dv each exceed their tolerance on the full corpus, by up to 1.38x,
 * 1.39x and 2.08x (dev/precision/bwd_rounding.c: dq = sum ds k cancels,
 * sum_r ds_r = 0; dv sums the large g p of early tokens). ALL splits f16 too:
 * the single-sweep rows kernels form dq = scale g (A - dg B), which cancels as
 * sum ds k does, from A = sum (p e) k and B = sum p k (rounded once in f16,
 * 1.09x). */
template <typename T, int D, int KS, int SX, bool ALL = false>
NSA_DEV void warp_pv_exact(float (&acc)[D / 8][4], float (&p)[2 * KS][4], const T *sX, int lane)
{
    if constexpr (ALL || std::is_same<T, __nv_bfloat16>::value) {
        float lo[2 * KS][4];
#pragma unroll
        for (int j = 0; j < 2 * KS; j++)
#pragma unroll
            for (int x = 0; x < 4; x++) lo[j][x] = p[j][x] - to_f(from_f<T>(p[j][x]));
        warp_pv<T, D, KS, SX>(acc, lo, sX, 0, lane);
    }
    warp_pv<T, D, KS, SX>(acc, p, sX, 0, lane);
}

/* ------------------------------------------------------------ rows: compressed, window */

template <typename T, int DQK, int DV, int MODE>
__global__ void __launch_bounds__(BWD_THREADS)
    bwd_rows_sm80_kernel(const Geom g, const Tiles tl, const BwdIn in, const T *__restrict__ k, int64_t kst,
                         int64_t ksh, const T *__restrict__ v, int64_t vst, int64_t vsh, int64_t kd, int64_t vd,
                         bool qvec, bool ovec, bool kvvec, float *dq, int64_t dqst, int64_t dqsh)
{
    constexpr int BM = BWD_ROWS_BM, BN = BWD_ROWS_BN, NT = BWD_THREADS, SQ = DQK + 8, SV = DV + 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = (T *)smem_raw;
    T *sO = sQ + BM * SQ;
    T *sK = sO + BM * SV;
    T *sV = sK + 2 * BN * SQ;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const TileCtx c = tile_ctx(g, tl);
    int64_t klo, khi, kbase;
    tile_keys<MODE>(g, c, klo, khi, kbase);
    const T *kg = k + kbase * kst + c.gi * ksh;
    const T *vg = v + kbase * vst + c.gi * vsh;
    const T *q = (const T *)in.q.p, *dout = (const T *)in.dout.p;

    load_tile<T, BM, DQK, SQ, NT>(sQ, q, g.Dqk, qvec, [&](int r) -> int64_t {
        return r < c.nrows ? (c.t0 + r / c.hca) * in.q.st + (c.h0 + r % c.hca) * in.q.sh : -1;
    });
    load_tile<T, BM, DV, SV, NT>(sO, dout, g.Dv, ovec, [&](int r) -> int64_t {
        return r < c.nrows ? (c.t0 + r / c.hca) * in.dout.st + (c.h0 + r % c.hca) * in.dout.sh : -1;
    });
    cp_async_commit();
    const int64_t nkt = khi >= klo ? (khi - klo + BN) / BN : 0;
    auto load_kv = [&](int64_t kt, int buf) {
        const int64_t ks = klo + kt * BN;
        load_tile<T, BN, DQK, SQ, NT>(sK + buf * BN * SQ, kg, kd, kvvec,
                                      [&](int r) -> int64_t { return ks + r <= khi ? (ks + r) * kst : -1; });
        load_tile<T, BN, DV, SV, NT>(sV + buf * BN * SV, vg, vd, kvvec,
                                     [&](int r) -> int64_t { return ks + r <= khi ? (ks + r) * vst : -1; });
    };

    const WarpRanges<MODE> wr(g, c, warp, lane);
    float L[2], gt[2];
    int64_t rt[2], rh[2];
    bool rv[2];
    frag_rows(in, c, warp, lane, L, gt, rt, rh, rv);
    const float sl = g.scale * NSA_LOG2E;
    const T *sQw = sQ + warp * 16 * SQ, *sOw = sO + warp * 16 * SV;
    /* one sweep (dq = scale g (A - dg B), rows_single_step) up to Dqk 128; at 192 the second
     * accumulator would spill, and two sweeps run */
    constexpr bool ONE = DQK <= 128;
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
            __syncthreads();
            const int buf = (int)(kt & 1);
            const int64_t ks = klo + kt * BN;
            if (wr.touches(ks, BN)) {
                float s[BN / 8][4], e[BN / 8][4], mx[2];
                zero_frag(s);
                zero_frag(e);
                warp_qk<T, DQK, BN / 8, SQ, false>(s, nullptr, sQw, sK + buf * BN * SQ, 0, lane);
                wr.tile_max(s, ks, lane, mx); /* masks the keys outside the rows' ranges */
                warp_qk<T, DV, BN / 8, SV, false>(e, nullptr, sOw, sV + buf * BN * SV, 0, lane);
                if constexpr (ONE) {
                    rows_single_step(s, e, L, dgp, sl);
                    if (dq) {
                        warp_pv_exact<T, DQK, BN / 16, SQ, true>(dqb, s, sK + buf * BN * SQ, lane);
                        warp_pv_exact<T, DQK, BN / 16, SQ, true>(dqa, e, sK + buf * BN * SQ, lane);
                    }
                } else {
                    rows_sweep_step(pass, s, e, L, gt, dg, dgp, sl, g.scale);
                    if (pass == 1) warp_pv_exact<T, DQK, BN / 16, SQ>(dqa, s, sK + buf * BN * SQ, lane);
                }
            }
            __syncthreads();
        }
        if (pass == 0)
            rows_write_dg(in, dgp, gt, rv, dg, lane, [&](int i) { return rt[i]; }, [&](int i) { return rh[i]; });
    }
    if (dq) {
        if constexpr (ONE) rows_dq_finish(dqa, dqb, dg, gt, g.scale);
        warp_add_rows(dqa, g.Dqk, lane, [&](int i) { return rv[i] ? dq + rt[i] * dqst + rh[i] * dqsh : (float *)nullptr; });
    }
}

/* ------------------------------------------------------------ rows: selected */

/* The selected rows kernels' keys of one (token, KV head): chunks of KC keys of
 * each eligible selected block in slot order (cur: slot b, n when done; first
 * key ks; end of the block's visible keys hi, local), copied (cp.async) into the
 * warp's two K chunk buffers (stride DQK + 8) and two V chunk buffers. */
template <typename T, int KC, int DQK, int DV> struct SlcKeyChunks {
    struct Cur {
        int64_t b, ks, hi;
    };
    const Geom &g;
    const int *ip; /* the token's n block indices for this KV head */
    int64_t s0, tl, gi;
    const T *k, *v;
    int64_t kst, ksh, vst, vsh;
    bool kvvec;
    T *sK, *sV;
    int lane;
    NSA_DEV Cur seek(int64_t b) const
    {
        for (; b < g.n; b++) {
            const int64_t j = ip[b];
            if (j >= 0 && j * g.ls <= tl) return Cur{b, j * g.ls, nsa_min64(j * g.ls + g.ls, tl + 1)};
        }
        return Cur{g.n, 0, 0};
    }
    NSA_DEV Cur next(const Cur &u) const { return u.ks + KC < u.hi ? Cur{u.b, u.ks + KC, u.hi} : seek(u.b + 1); }
    /* The stream, double-buffered: body(buf, nv) for each chunk once it has landed in buffer buf
     * (nv of its KC keys valid); the next chunk's copy runs meanwhile. */
    template <typename Body> NSA_DEV void each(Body body) const
    {
        Cur cur = seek(0);
        int buf = 0;
        if (cur.b < g.n) load(cur, 0);
        cp_async_commit();
        while (cur.b < g.n) {
            const Cur nx = next(cur);
            if (nx.b < g.n) load(nx, buf ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
            __syncwarp();
            body(buf, (int)nsa_min64(KC, cur.hi - cur.ks));
            __syncwarp();
            cur = nx;
            buf ^= 1;
        }
    }
    NSA_DEV void load(const Cur &u, int buf) const
    {
        constexpr int SQ = DQK + 8, SV = DV + 8;
        const int64_t ks = u.ks, hi = u.hi, kb = s0 + ks;
        load_tile_by<T, KC, DQK, 32>(lane, [&](int r, int cc) { return sK + buf * KC * SQ + r * SQ + cc * 8; }, k,
                                     g.Dqk, kvvec,
                                     [&](int r) -> int64_t { return ks + r < hi ? (kb + r) * kst + gi * ksh : -1; });
        load_tile_by<T, KC, DV, 32>(lane, [&](int r, int cc) { return sV + buf * KC * SV + r * SV + cc * 8; }, v,
                                    g.Dv, kvvec,
                                    [&](int r) -> int64_t { return ks + r < hi ? (kb + r) * vst + gi * vsh : -1; });
    }
};

template <typename T, int DQK, int DV>
__global__ void __launch_bounds__(32 * bwd_slc_rows_warps(DQK))
    bwd_rows_slc_sm80_kernel(const Geom g, const BwdIn in, const T *__restrict__ k, int64_t kst, int64_t ksh,
                             const T *__restrict__ v, int64_t vst, int64_t vsh, bool qvec, bool ovec, bool kvvec,
                             float *dq, int64_t dqst, int64_t dqsh, int nch)
{
    constexpr int KC = BWD_SLC_KC, SQ = DQK + 8, SV = DV + 8, WARPS = bwd_slc_rows_warps(DQK);
    /* Q and dO fragments in registers up to Dqk 128; at 192 the sweep's two dq accumulators leave no
     * room for them (464 bytes of spills with both, 180 with dO alone) and warp_qk reads them from the
     * warp's Q and dO rows instead */
    constexpr bool QREG = DQK <= 128;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    T *sK = (T *)smem_raw + (size_t)warp * 2 * KC * (SQ + SV); /* this warp's two K chunks, then two V chunks */
    T *sV = sK + 2 * KC * SQ;
    /* the warp's Q and dO rows: past the chunk buffers where they stay, else loaded through the chunks */
    T *sQw = QREG ? sK : (T *)smem_raw + (size_t)WARPS * 2 * KC * (SQ + SV) + (size_t)warp * 16 * (SQ + SV);
    T *sOw = QREG ? sV : sQw + 16 * SQ;
    const int64_t t = (int64_t)blockIdx.x * WARPS + warp;
    if (t >= g.T) return; /* no CTA barrier below: a warp may leave */
    const int64_t gi = blockIdx.y / nch, h0 = gi * g.G + (int64_t)(blockIdx.y % nch) * 16;
    const int hca = (int)nsa_min64(16, gi * g.G + g.G - h0);
    const int64_t seq = g.tok_seq[t], s0 = g.cu_seqlens[seq], tl = t - s0;
    const T *q = (const T *)in.q.p, *dout = (const T *)in.dout.p;

    /* Q and dO of the warp's 16 rows into registers, through the chunk buffers */
    load_tile_by<T, 16, DQK, 32>(lane, [&](int r, int cc) { return sQw + r * SQ + cc * 8; }, q, g.Dqk, qvec,
                                 [&](int r) -> int64_t { return r < hca ? t * in.q.st + (h0 + r) * in.q.sh : -1; });
    load_tile_by<T, 16, DV, 32>(lane, [&](int r, int cc) { return sOw + r * SV + cc * 8; }, dout, g.Dv, ovec,
                                [&](int r) -> int64_t { return r < hca ? t * in.dout.st + (h0 + r) * in.dout.sh : -1; });
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
    uint32_t qf[QREG ? DQK / 16 : 1][4], of[QREG ? DV / 16 : 1][4];
    q_frags<SQ, QREG>(qf, sQw, lane);
    q_frags<SV, QREG>(of, sOw, lane);
    __syncwarp();

    float L[2], gt[2];
    bool rv[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = (lane >> 2) + 8 * i;
        rv[i] = r < hca;
        const int64_t h = h0 + r;
        L[i] = rv[i] ? lse2_of(((const float *)in.lse.p)[t * in.lse.st + h * in.lse.sh]) : INFINITY;
        gt[i] = rv[i] ? ((const float *)in.gate.p)[t * in.gate.st + h * in.gate.sh] : 0.f;
    }
    const float sl = g.scale * NSA_LOG2E;

    /* the token's keys: chunks of KC keys of each eligible selected block, in slot order */
    const int *ip = (const int *)in.idx.p + t * in.idx.st + gi * in.idx.sh;
    const SlcKeyChunks<T, KC, DQK, DV> kc{g, ip, s0, tl, gi, k, v, kst, ksh, vst, vsh, kvvec, sK, sV, lane};

    /* one sweep: dg = sum p e, A = sum (p e) k, B = sum p k; dq = scale g (A - dg B) */
    float dgp[2] = {0.f, 0.f}, dg[2];
    float dqa[DQK / 8][4], dqb[DQK / 8][4];
    zero_frag(dqa);
    zero_frag(dqb);
    kc.each([&](int buf, int nv) {
        float s[KC / 8][4], e[KC / 8][4], mx[2];
        zero_frag(s);
        zero_frag(e);
        warp_qk<T, DQK, KC / 8, SQ, QREG>(s, qf, sQw, sK + buf * KC * SQ, 0, lane);
        warp_mask_keys(s, nv, lane, mx);
        warp_qk<T, DV, KC / 8, SV, QREG>(e, of, sOw, sV + buf * KC * SV, 0, lane);
        rows_single_step(s, e, L, dgp, sl);
        if (dq) {
            warp_pv_exact<T, DQK, KC / 16, SQ, true>(dqb, s, sK + buf * KC * SQ, lane);
            warp_pv_exact<T, DQK, KC / 16, SQ, true>(dqa, e, sK + buf * KC * SQ, lane);
        }
    });
    rows_write_dg(in, dgp, gt, rv, dg, lane, [&](int) { return t; }, [&](int i) { return h0 + (lane >> 2) + 8 * i; });
    if (dq) {
        rows_dq_finish(dqa, dqb, dg, gt, g.scale);
        warp_add_rows(dqa, g.Dqk, lane, [&](int i) {
            return rv[i] ? dq + t * dqst + (h0 + (lane >> 2) + 8 * i) * dqsh : (float *)nullptr;
        });
    }
}

/* The selected rows kernel at G <= 8: the 16-row kernel above with the MMA's
 * roles swapped. Keys go on the M side and the warp's 8 rows (the group's G
 * heads of one token, padded to 8) on the N side: S^T = K Q^T and
 * E^T = V dO^T (m16n8k16, 16 keys x 8 rows, Q and dO as B fragments in
 * registers), then A^T += K^T (p e)^T and B^T += K^T p^T over the chunk's 16
 * keys, their B fragments the C fragments of p and p e transposed by
 * movmatrix (hi + lo, as the 16-row kernel splits them). The same sums in a
 * fixed order: dg = sum p e (this thread's keys, then the lanes of its rows),
 * dq = scale g (A - dg B). Half the 16-row kernel's MMAs where G <= 8 pads to
 * 16; the same block stream (one fetch per token and KV head). */
template <typename T, int DQK, int DV>
__global__ void __launch_bounds__(32 * BWD_SLC8_WARPS)
    bwd_rows_slc8_sm80_kernel(const Geom g, const BwdIn in, const T *__restrict__ k, int64_t kst, int64_t ksh,
                              const T *__restrict__ v, int64_t vst, int64_t vsh, bool qvec, bool ovec, bool kvvec,
                              float *dq, int64_t dqst, int64_t dqsh)
{
    constexpr int KC = BWD_SLC_KC, SQ = DQK + 8, SV = DV + 8, WARPS = BWD_SLC8_WARPS;
    static_assert(KC == 16, "a chunk is one m16 tile of keys");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    T *sK = (T *)smem_raw + (size_t)warp * 2 * KC * (SQ + SV); /* this warp's two K chunks, then two V chunks */
    T *sV = sK + 2 * KC * SQ;
    const int64_t t = (int64_t)blockIdx.x * WARPS + warp;
    if (t >= g.T) return; /* no CTA barrier below: a warp may leave */
    const int64_t gi = blockIdx.y, h0 = gi * g.G;
    const int hca = (int)g.G;
    const int64_t seq = g.tok_seq[t], s0 = g.cu_seqlens[seq], tl = t - s0;

    /* Q and dO of the warp's 8 rows (zero past G) through the chunk buffers, then as B fragments
     * (k = dims, n = rows) in registers: x4 loads of two 16-dim k-steps */
    load_tile_by<T, 8, DQK, 32>(lane, [&](int r, int cc) { return sK + r * SQ + cc * 8; }, (const T *)in.q.p, g.Dqk,
                                qvec, [&](int r) -> int64_t { return r < hca ? t * in.q.st + (h0 + r) * in.q.sh : -1; });
    load_tile_by<T, 8, DV, 32>(lane, [&](int r, int cc) { return sV + r * SV + cc * 8; }, (const T *)in.dout.p, g.Dv,
                               ovec,
                               [&](int r) -> int64_t { return r < hca ? t * in.dout.st + (h0 + r) * in.dout.sh : -1; });
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
    uint32_t qb[DQK / 16][2], ob[DV / 16][2];
#pragma unroll
    for (int k2 = 0; k2 < DQK / 32; k2++) {
        uint32_t r[4];
        ldsm_x4(r, sK + (lane & 7) * SQ + k2 * 32 + (lane >> 3) * 8);
        qb[2 * k2][0] = r[0], qb[2 * k2][1] = r[1], qb[2 * k2 + 1][0] = r[2], qb[2 * k2 + 1][1] = r[3];
    }
#pragma unroll
    for (int k2 = 0; k2 < DV / 32; k2++) {
        uint32_t r[4];
        ldsm_x4(r, sV + (lane & 7) * SV + k2 * 32 + (lane >> 3) * 8);
        ob[2 * k2][0] = r[0], ob[2 * k2][1] = r[1], ob[2 * k2 + 1][0] = r[2], ob[2 * k2 + 1][1] = r[3];
    }
    __syncwarp();

    /* this thread's two rows (columns of the C fragments): 2 (lane % 4) + j */
    float L[2], gt[2];
    bool rv[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int r = 2 * (lane & 3) + j;
        rv[j] = r < hca;
        const int64_t h = h0 + r;
        L[j] = rv[j] ? lse2_of(((const float *)in.lse.p)[t * in.lse.st + h * in.lse.sh]) : INFINITY;
        gt[j] = rv[j] ? ((const float *)in.gate.p)[t * in.gate.st + h * in.gate.sh] : 0.f;
    }
    const float sl = g.scale * NSA_LOG2E;

    const int *ip = (const int *)in.idx.p + t * in.idx.st + gi * in.idx.sh;
    const SlcKeyChunks<T, KC, DQK, DV> kc{g, ip, s0, tl, gi, k, v, kst, ksh, vst, vsh, kvvec, sK, sV, lane};
    /* B fragments of x (a keys x rows C fragment) transposed, rounded (hi) and the remainder (lo) */
    auto split_t = [](const float (&x)[4], uint32_t (&hi)[2], uint32_t (&lo)[2]) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float a = x[2 * i], b = x[2 * i + 1];
            hi[i] = movm_t(Mma<T>::pack(a, b));
            lo[i] = movm_t(Mma<T>::pack(a - to_f(from_f<T>(a)), b - to_f(from_f<T>(b))));
        }
    };

    float dgp[2] = {0.f, 0.f};
    float acca[DQK / 16][4], accb[DQK / 16][4]; /* A^T, B^T: dims x rows */
    zero_frag(acca);
    zero_frag(accb);
    kc.each([&](int buf, int nv) {
        const T *cK = sK + buf * KC * SQ, *cV = sV + buf * KC * SV;
        float s[4] = {0.f, 0.f, 0.f, 0.f}, e[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int kk = 0; kk < DQK / 16; kk++) {
            uint32_t a[4];
            ldsm_x4(a, cK + (lane & 15) * SQ + kk * 16 + (lane >> 4) * 8);
            Mma<T>::run(s, a, qb[kk][0], qb[kk][1]);
        }
#pragma unroll
        for (int kk = 0; kk < DV / 16; kk++) {
            uint32_t a[4];
            ldsm_x4(a, cV + (lane & 15) * SV + kk * 16 + (lane >> 4) * 8);
            Mma<T>::run(e, a, ob[kk][0], ob[kk][1]);
        }
        /* element x: key lane / 4 + 8 (x / 2), row 2 (lane % 4) + x % 2 */
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int j = x & 1;
            const float p = (lane >> 2) + 8 * (x >> 1) < nv ? fast_ex2(fmaf(s[x], sl, -L[j])) : 0.f;
            const float pe = p * e[x];
            dgp[j] += pe;
            s[x] = p;
            e[x] = pe;
        }
        if (dq) {
            uint32_t ph[2], pl[2], eh[2], el[2];
            split_t(s, ph, pl);
            split_t(e, eh, el);
#pragma unroll
            for (int m = 0; m < DQK / 16; m++) {
                uint32_t a[4]; /* K^T: dims m*16.. x the chunk's 16 keys */
                ldsm_x4_t(a, cK + ((lane & 7) + ((lane >> 4) << 3)) * SQ + m * 16 + (((lane >> 3) & 1) << 3));
                Mma<T>::run(acca[m], a, eh[0], eh[1]);
                Mma<T>::run(acca[m], a, el[0], el[1]);
                Mma<T>::run(accb[m], a, ph[0], ph[1]);
                Mma<T>::run(accb[m], a, pl[0], pl[1]);
            }
        }
    });
    /* dg of this thread's rows: its keys' sum, then over the 8 lanes that share lane % 4 */
    float dg[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        float x = dgp[j];
        x += __shfl_xor_sync(0xffffffffu, x, 4);
        x += __shfl_xor_sync(0xffffffffu, x, 8);
        dg[j] = x + __shfl_xor_sync(0xffffffffu, x, 16);
        if (rv[j] && lane < 4) {
            const int64_t h = h0 + 2 * lane + j;
            if (in.dgate.p) ((float *)in.dgate.p)[t * in.dgate.st + h * in.dgate.sh] = dg[j];
            ((float *)in.delta.p)[t * in.delta.st + h * in.delta.sh] = gt[j] * dg[j];
        }
    }
    if (dq) {
        /* acca element x: dim m*16 + lane / 4 + 8 (x / 2), row 2 (lane % 4) + x % 2 */
#pragma unroll
        for (int m = 0; m < DQK / 16; m++)
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int j = x & 1, dim = m * 16 + (lane >> 2) + 8 * (x >> 1);
                if (!rv[j] || dim >= g.Dqk) continue;
                float *o = dq + t * dqst + (h0 + 2 * (lane & 3) + j) * dqsh + dim;
                *o += g.scale * gt[j] * fmaf(-dg[j], accb[m][x], acca[m][x]);
            }
    }
}

/* ------------------------------------------------------------ keys (dk, dv) */

template <typename T, int DQK, int DV, int MODE>
__global__ void __launch_bounds__(BWD_THREADS)
    bwd_keys_sm80_kernel(const Geom g, const int64_t *ktiles, const BwdIn in, const T *__restrict__ k, int64_t kst,
                         int64_t ksh, const T *__restrict__ v, int64_t vst, int64_t vsh, int64_t kd, int64_t vd,
                         bool qvec, bool ovec, bool kvvec, float *dk, int64_t dkst, int64_t dksh, float *dv,
                         int64_t dvst, int64_t dvsh, const int *mlist, const int *moff, const int64_t *blk_off,
                         int64_t nb, int nsub, const int *choff, const int *sloff, int64_t nitems, int64_t cs,
                         float *scratch, const float *ks, int role)
{
    KeysFactors kf;
    if (!kf.load(ks, role)) return;
    constexpr int KN = BWD_KEYS_BN, KM = BWD_KEYS_BM, NT = BWD_THREADS, SQ = DQK + 8, SV = DV + 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sK = (T *)smem_raw;
    T *sV = sK + KN * SQ;
    T *sQ = sV + KN * SV;     /* two steps of KM rows */
    T *sO = sQ + 2 * KM * SQ; /* dO, two steps */
    int64_t *sT = (int64_t *)(sO + 2 * KM * SV); /* [2][KM] per row: local token (-1: none), lse, gate, delta */
    float *sL = (float *)(sT + 2 * KM);
    float *sG = sL + 2 * KM, *sD = sG + 2 * KM;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* the CTA's keys [k0, k0 + nk) (local to sequence b; global row kbase + key) and its queries
     * [r0, r1): global tokens (compressed, window) or entries of the inverse map (selected) */
    int64_t gi, b, k0, nk, kbase, r0, r1;
    int64_t c = 0, nch = 1, slot = -1; /* chunk c of the item's nch; scratch slot of a split item's chunk */
    if (MODE == 1) {
        /* chunk blockIdx.x of the list the plan's chunk counts (slc_chunks_kernel) and their scan made */
        const int64_t x = blockIdx.x;
        if (x >= choff[nitems]) return;
        int64_t lo = 0, hi = nitems - 1; /* the last item whose first chunk is <= x */
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (choff[mid] <= x) lo = mid;
            else hi = mid - 1;
        }
        c = x - choff[lo];
        nch = choff[lo + 1] - choff[lo];
        slot = nch > 1 ? sloff[lo] + c : -1;
        const int64_t sg = lo / nsub, J = sg % nb;
        gi = sg / nb;
        b = find_seq(blk_off, g.B, J);
        const int64_t s0 = g.cu_seqlens[b], len = g.cu_seqlens[b + 1] - s0, j = J - blk_off[b];
        k0 = j * g.ls + (lo % nsub) * KN;
        nk = nsa_min64(KN, nsa_min64(j * g.ls + g.ls, len) - k0);
        kbase = s0;
        int64_t e0 = moff[sg], e1 = moff[sg + 1];
        r1 = e1;
        while (e0 < e1) { /* the first entry whose token may read key k0 */
            const int64_t mid = (e0 + e1) / 2;
            if (mlist[mid] < s0 + k0) e0 = mid + 1;
            else e1 = mid;
        }
        r0 = e0;
    } else {
        const KeysItem it = keys_item<MODE>(g, ktiles);
        gi = it.gi, b = it.b, k0 = it.k0, nk = it.nk, kbase = it.kbase, r0 = it.r0, r1 = it.r1, c = it.c, nch = it.nch;
        slot = it.slot;
    }
    const int64_t s0 = g.cu_seqlens[b];
    const int64_t nrows = r1 > r0 ? (r1 - r0) * g.G : 0, nsteps = (nrows + KM - 1) / KM;
    /* this chunk's steps; a split item's chunk writes its partial sums (zeros if it has no rows) */
    const int64_t st0 = nch > 1 ? nsa_min64(c * cs, nsteps) : 0, st1 = nch > 1 ? nsa_min64(st0 + cs, nsteps) : nsteps;
    if (slot < 0 && (nk <= 0 || st1 <= st0)) return; /* nothing reads these keys: their gradients stay as they are */
    load_tile<T, KN, DQK, SQ, NT>(sK, k + (kbase + k0) * kst + gi * ksh, kd, kvvec,
                                  [&](int r) -> int64_t { return r < nk ? r * kst : -1; });
    load_tile<T, KN, DV, SV, NT>(sV, v + (kbase + k0) * vst + gi * vsh, vd, kvvec,
                                 [&](int r) -> int64_t { return r < nk ? r * vst : -1; });
    /* reader i of the CTA's list: its global token */
    auto tok = [&](int64_t i) -> int64_t { return MODE == 1 ? (int64_t)mlist[r0 + i] : r0 + i; };
    const SmallDiv gd(g.G);
    auto load_step = [&](int64_t st, int buf) {
        keys_load_step<T, KM, DQK, DV, NT>(
            g, in, st * KM, nrows, gi, s0, gd, qvec, ovec,
            [&](int r, int cc) { return sQ + buf * KM * SQ + r * SQ + cc * 8; },
            [&](int r, int cc) { return sO + buf * KM * SV + r * SV + cc * 8; }, tok, sT + buf * KM, sL + buf * KM,
            sG + buf * KM, sD + buf * KM);
    };
    if (st0 < st1) load_step(st0, 0);
    cp_async_commit();

    const float sl = g.scale * NSA_LOG2E * kf.lmul;
    const T *sKw = sK + warp * 16 * SQ, *sVw = sV + warp * 16 * SV;
    const KeyRows<MODE> kr(g, k0, nk, warp, lane);
    float dka[DQK / 8][4], dva[DV / 8][4];
    zero_frag(dka);
    zero_frag(dva);
    const bool warp_has_keys = warp * 16 < nk;

    for (int64_t st = st0; st < st1; st++) {
        if (st + 1 < st1) load_step(st + 1, (int)((st + 1 - st0) & 1));
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const int buf = (int)((st - st0) & 1);
        if (warp_has_keys) {
            const T *sQb = sQ + buf * KM * SQ, *sOb = sO + buf * KM * SV;
            const float *L = sL + buf * KM, *G = sG + buf * KM, *D = sD + buf * KM;
            const int64_t *tq = sT + buf * KM;
            float s[KM / 8][4], e[KM / 8][4];
            zero_frag(s);
            zero_frag(e);
            warp_qk<T, DQK, KM / 8, SQ, false>(s, nullptr, sKw, sQb, 0, lane);
            warp_qk<T, DV, KM / 8, SV, false>(e, nullptr, sVw, sOb, 0, lane);
            keys_step_probs(s, e, kr.lo, kr.hi, tq, L, G, D, sl, g.scale, kf.emul, kf.gmul, lane);
            warp_pv_exact<T, DV, KM / 16, SV>(dva, s, sOb, lane);
            warp_pv_exact<T, DQK, KM / 16, SQ>(dka, e, sQb, lane);
        }
        __syncthreads();
    }
    if (role == KEYS_ROLE_F16) {
        scale_frag(dka, kf.dkmul);
        scale_frag(dva, kf.dvmul);
    }
    keys_store(g, dka, dva, kr.kv, kr.kk, slot, kbase, gi, warp, lane, scratch, dk, dkst, dksh, dv, dvst, dvsh);
}

/* The split items' partial sums added to dk, dv: for each key row and dim, the
 * chunks in order (c = 0, 1, ...), then once to the accumulator. MODE 0: the
 * plan's list of split compressed tiles (k0, keys, sequence, chunks, first slot)
 * x KV heads; MODE 1: every selected item (those with one chunk return). */
template <int MODE>
__global__ void __launch_bounds__(BWD_THREADS)
    bwd_keys_reduce_kernel(const Geom g, const int64_t *red, const int *choff, const int *sloff,
                           const int64_t *blk_off, int64_t nb, int nsub, const float *scratch, float *dk,
                           int64_t dkst, int64_t dksh, float *dv, int64_t dvst, int64_t dvsh)
{
    int64_t gi, row0, nk, nch, slot0, hs;
    if (MODE == 1) {
        const int64_t i = blockIdx.x;
        nch = choff[i + 1] - choff[i];
        if (nch <= 1) return;
        slot0 = sloff[i];
        hs = 1;
        const int64_t sg = i / nsub, J = sg % nb;
        gi = sg / nb;
        const int64_t b = find_seq(blk_off, g.B, J);
        const int64_t s0 = g.cu_seqlens[b], len = g.cu_seqlens[b + 1] - s0, j = J - blk_off[b];
        const int64_t k0 = j * g.ls + (i % nsub) * BWD_KEYS_BN;
        nk = nsa_min64(BWD_KEYS_BN, nsa_min64(j * g.ls + g.ls, len) - k0);
        row0 = s0 + k0;
    } else {
        const int64_t *r = red + 5 * (int64_t)blockIdx.x;
        gi = blockIdx.y;
        row0 = g.cu_cmp[r[2]] + r[0];
        nk = r[1];
        nch = r[3];
        slot0 = r[4];
        hs = g.Hkv;
    }
    const int64_t W = g.Dqk + g.Dv;
    for (int64_t e = threadIdx.x; e < nk * W; e += blockDim.x) {
        const int64_t key = e / W, col = e % W;
        float acc = 0.f;
        for (int64_t c = 0; c < nch; c++) acc += scratch[(((slot0 + c) * hs + (MODE == 1 ? 0 : gi)) * BWD_KEYS_BN + key) * W + col];
        if (col < g.Dqk) {
            if (dk) dk[(row0 + key) * dkst + gi * dksh + col] += acc;
        } else if (dv) {
            dv[(row0 + key) * dvst + gi * dvsh + col - g.Dqk] += acc;
        }
    }
}

/* Chunk counts of the selected keys kernel's items (KV head, batch block, 64-key
 * sub-tile): ceil(steps / cs) for the block's readers (0: none), and the scratch
 * slots of split items; [nitems] = 0, so their exclusive scans end with the totals. */
__global__ void slc_chunks_kernel(const Geom g, const int *moff, int nsub, int64_t cs, int64_t nitems, int *nch,
                                  int *nsl)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i <= nitems; i += (int64_t)gridDim.x * blockDim.x) {
        int n = 0;
        if (i < nitems) {
            const int64_t sg = i / nsub, steps = bwd_steps(moff[sg + 1] - moff[sg], g.G);
            n = (int)((steps + cs - 1) / cs);
        }
        nch[i] = n;
        nsl[i] = n > 1 ? n : 0;
    }
}

/* ------------------------------------------------------------ launch */

/* The keys kernel of a branch (wgmma for the compressed and window branches
 * where keys90) on k, v, in.q, in.dout of type T, in the role `role`
 * (KeysFactors) */
template <typename T, int DQK, int DV>
static cudaError_t keys_launch(const Geom &g, const Dev &dev, int mode, const BwdTiles &bt, const BwdIn &in, View k,
                               View v, MView dk, MView dv, const SlcMap *map, bool keys90, dim3 grid,
                               const int64_t *kt, int64_t cs, int nsub, int64_t nitems, const float *ks, int role,
                               cudaStream_t s)
{
    if (keys90 && mode != 1) /* the same items and scratch on wgmma */
        return bwd_keys_sm90(g, dev, mode, DQK, DV, bt, in, k, v, dk, dv, ks, role, s);
    const bool qvec = vec_ok(in.q.p, in.q.st, in.q.sh, g.Dqk), ovec = vec_ok(in.dout.p, in.dout.st, in.dout.sh, g.Dv);
    const bool kvvec = mode == 0 || (vec_ok(k.p, k.st, k.sh, g.Dqk) && vec_ok(v.p, v.st, v.sh, g.Dv));
    const int64_t kd = mode == 0 ? DQK : g.Dqk, vd = mode == 0 ? DV : g.Dv;
    auto kern = mode == 0   ? bwd_keys_sm80_kernel<T, DQK, DV, 0>
                : mode == 1 ? bwd_keys_sm80_kernel<T, DQK, DV, 1>
                            : bwd_keys_sm80_kernel<T, DQK, DV, 2>;
    size_t smem = bwd_sm80_smem(DQK, DV);
    cudaError_t e = launch_smem(kern, dev, smem);
    if (e != cudaSuccess) return e;
    kern<<<grid, BWD_THREADS, smem, s>>>(g, kt, in, (const T *)k.p, k.st, k.sh, (const T *)v.p, v.st, v.sh, kd, vd,
                                         qvec, ovec, kvvec, (float *)dk.p, dk.st, dk.sh, (float *)dv.p, dv.st, dv.sh,
                                         map ? map->list_out : nullptr, map ? map->off : nullptr,
                                         map ? map->blk_off : nullptr, map ? map->nb : 0, nsub, bt.slc_choff,
                                         bt.slc_sloff, nitems, cs, bt.scratch, ks, role);
    return cudaGetLastError();
}

template <typename T, int DQK, int DV>
static cudaError_t bwd_sm80_t(const Geom &g, const Dev &dev, int mode, const BwdTiles &bt, const BwdIn &in, View k,
                              View v, MView dq, MView dk, MView dv, const SlcMap *map, bool keys90,
                              const BwdF16 &f16, cudaStream_t s)
{
    if (g.T == 0) return cudaSuccess;
    size_t smem = bwd_sm80_smem(DQK, DV);
    const bool qvec = vec_ok(in.q.p, in.q.st, in.q.sh, g.Dqk), ovec = vec_ok(in.dout.p, in.dout.st, in.dout.sh, g.Dv);
    /* the packed compressed rows are padded and aligned */
    const bool kvvec = mode == 0 || (vec_ok(k.p, k.st, k.sh, g.Dqk) && vec_ok(v.p, v.st, v.sh, g.Dv));
    const int64_t kd = mode == 0 ? DQK : g.Dqk, vd = mode == 0 ? DV : g.Dv;
    const T *kp = (const T *)k.p, *vp = (const T *)v.p;
    cudaError_t e;
    /* rows */
    if (mode == 1 && bwd_slc_rows(g.G) == 8) {
        auto kern = bwd_rows_slc8_sm80_kernel<T, DQK, DV>;
        size_t rsmem = bwd_slc8_rows_smem(DQK, DV);
        if ((e = launch_smem(kern, dev, rsmem)) != cudaSuccess) return e;
        const dim3 grid((unsigned)((g.T + BWD_SLC8_WARPS - 1) / BWD_SLC8_WARPS), (unsigned)g.Hkv);
        kern<<<grid, 32 * BWD_SLC8_WARPS, rsmem, s>>>(g, in, kp, k.st, k.sh, vp, v.st, v.sh, qvec, ovec, kvvec,
                                                      (float *)dq.p, dq.st, dq.sh);
    } else if (mode == 1) {
        auto kern = bwd_rows_slc_sm80_kernel<T, DQK, DV>;
        constexpr int W = bwd_slc_rows_warps(DQK);
        size_t rsmem = bwd_slc_rows_smem(DQK, DV);
        if ((e = launch_smem(kern, dev, rsmem)) != cudaSuccess) return e;
        const int nch = (int)((g.G + 15) / 16);
        const dim3 grid((unsigned)((g.T + W - 1) / W), (unsigned)(g.Hkv * nch));
        kern<<<grid, 32 * W, rsmem, s>>>(g, in, kp, k.st, k.sh, vp, v.st, v.sh, qvec, ovec, kvvec, (float *)dq.p,
                                             dq.st, dq.sh, nch);
    } else if (keys90) { /* the same tiles on wgmma */
        if ((e = bwd_rows_sm90(g, dev, mode, DQK, DV, bt, in, k, v, dq, s)) != cudaSuccess) return e;
    } else if (bt.rows.count > 0) {
        auto kern = mode == 0 ? bwd_rows_sm80_kernel<T, DQK, DV, 0> : bwd_rows_sm80_kernel<T, DQK, DV, 2>;
        if ((e = launch_smem(kern, dev, smem)) != cudaSuccess) return e;
        const dim3 grid((unsigned)bt.rows.count, (unsigned)(g.Hkv * bt.rows.nchunk));
        kern<<<grid, BWD_THREADS, smem, s>>>(g, bt.rows, in, kp, k.st, k.sh, vp, v.st, v.sh, kd, vd, qvec, ovec,
                                             kvvec, (float *)dq.p, dq.st, dq.sh);
    }
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    /* keys */
    if (!dk.p && !dv.p) return cudaSuccess;
    dim3 grid;
    int nsub = 1;
    const int64_t *kt = nullptr;
    int64_t cs = 0, nitems = 0;
    if (mode == 1) {
        if (!map) return cudaErrorInvalidValue; /* the selected branch needs the inverse map */
        nsub = bt.slc_nsub;
        nitems = g.Hkv * map->nb * nsub;
        cs = bt.slc_cs;
        slc_chunks_kernel<<<(unsigned)nsa_min64((nitems + 256) / 256, 65535), 256, 0, s>>>(g, map->off, nsub, cs, nitems,
                                                                                         bt.slc_nch, bt.slc_nsl);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        size_t bytes = bt.slc_tmp_bytes;
        if ((e = cub::DeviceScan::ExclusiveSum(bt.slc_tmp, bytes, bt.slc_nch, bt.slc_choff, (int)(nitems + 1), s)) !=
            cudaSuccess)
            return e;
        bytes = bt.slc_tmp_bytes;
        if ((e = cub::DeviceScan::ExclusiveSum(bt.slc_tmp, bytes, bt.slc_nsl, bt.slc_sloff, (int)(nitems + 1), s)) !=
            cudaSuccess)
            return e;
        grid = dim3((unsigned)bt.slc_grid, 1);
    } else {
        const int64_t n = mode == 0 ? bt.n_cmp : bt.n_win;
        if (n == 0) return cudaSuccess;
        kt = mode == 0 ? bt.kt_cmp : bt.kt_win;
        cs = mode == 0 ? bt.cmp_cs : 0;
        grid = dim3((unsigned)n, (unsigned)g.Hkv);
    }
    if (f16.ks) { /* bf16 with the f16 copies: both kernels queued, one runs (KeysFactors) */
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            Geom gh = g;
            gh.dtype = 1;
            BwdIn inh = in;
            inh.q = f16.q;
            inh.dout = f16.dout;
            if ((e = keys_launch<__half, DQK, DV>(gh, dev, mode, bt, inh, f16.k, f16.v, dk, dv, map, keys90, grid, kt,
                                                  cs, nsub, nitems, f16.ks, KEYS_ROLE_F16, s)) != cudaSuccess)
                return e;
        }
        if ((e = keys_launch<T, DQK, DV>(g, dev, mode, bt, in, k, v, dk, dv, map, keys90, grid, kt, cs, nsub, nitems,
                                         f16.ks, KEYS_ROLE_BF16, s)) != cudaSuccess)
            return e;
    } else if ((e = keys_launch<T, DQK, DV>(g, dev, mode, bt, in, k, v, dk, dv, map, keys90, grid, kt, cs, nsub,
                                            nitems, nullptr, KEYS_ROLE_ONLY, s)) != cudaSuccess) {
        return e;
    }
    /* the split items' partial sums, in chunk order */
    if (mode == 1) {
        bwd_keys_reduce_kernel<1><<<(unsigned)nitems, BWD_THREADS, 0, s>>>(
            g, nullptr, bt.slc_choff, bt.slc_sloff, map->blk_off, map->nb, nsub, bt.scratch, (float *)dk.p, dk.st,
            dk.sh, (float *)dv.p, dv.st, dv.sh);
    } else if (mode == 0 && bt.n_red_cmp > 0) {
        bwd_keys_reduce_kernel<0><<<dim3((unsigned)bt.n_red_cmp, (unsigned)g.Hkv), BWD_THREADS, 0, s>>>(
            g, bt.red_cmp, nullptr, nullptr, nullptr, 0, 1, bt.scratch, (float *)dk.p, dk.st, dk.sh, (float *)dv.p,
            dv.st, dv.sh);
    }
    return cudaGetLastError();
}

size_t bwd_slc_scan_bytes(int64_t items)
{
    size_t b = 0;
    cub::DeviceScan::ExclusiveSum(nullptr, b, (const int *)nullptr, (int *)nullptr, (int)(items + 1));
    return b;
}

cudaError_t bwd_attn_sm80(const Geom &g, const Dev &dev, int mode, int dqkp, int dvp, const BwdTiles &bt,
                          const BwdIn &in, View k, View v, MView dq, MView dk, MView dv, const SlcMap *map,
                          bool keys90, const BwdF16 &f16, cudaStream_t s)
{
    NSA_SLC_DISPATCH(bwd_sm80_t, g, dqkp, dvp, g, dev, mode, bt, in, k, v, dq, dk, dv, map, keys90, f16, s);
}

} // namespace nsa_cuda
