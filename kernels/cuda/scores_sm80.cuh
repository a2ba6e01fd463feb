/*
 * scores_sm80.cuh -- BLOCK_SCORES (semantics section 3; scores_ref.cu is the
 * readable version) and the fused SCORES_TOPN on mma.sync (every sm_80+
 * device), f16 / bf16, G <= 128:
 *     s(t, g, j) = sum_{h in g} sum_i overlap(i, j) / d * p_cmp(t, h, i),
 *     p_cmp(t, h, i) = exp(scale q(t,h).kc_i - lse_cmp(t, h))   for i < nc(t).
 *
 * The attn_sm80 tiling (tile_qk.cuh, rows = tokens x heads of a group);
 * per K tile of BN compressed blocks: S = Q K^T on the tensor cores,
 * P = exp2(S*scale*log2e - lse*log2e), the group sum over each token's G rows,
 * then the overlap map (scores_map.cuh) onto the selection blocks the tile
 * touches, added to the CTA's score rows (in shared memory when they fit
 * beside the tiles, written out once at the end, or ranked there for
 * SCORES_TOPN; else in global memory, zeroed first). Every (t, j) entry is
 * updated by one thread per tile, tiles in order: reproducible. Keys are the
 * packed compressed rows (pack_cmp16): exact, because kc is a tensor of the
 * call's dtype (semantics 7), so one MMA per k-step gives fp32-accurate
 * logits of the rounded keys.
 *
 * Three kernels from one template (GP: query rows per token in a warp):
 *   scores_sm80_g16 (GP 16, scores_sm80.cu): each warp is one token, its 16
 *       rows that token's heads: the group sum is done by shuffles straight
 *       from the accumulators, the warp maps its own row, so the K-tile loop
 *       has one CTA barrier (the double buffer; two with one K buffer); no
 *       probability tile, registers capped at 128: two CTAs per SM. Up to
 *       Dqk 192 the warp's Q fragments live in registers and the Q tile is
 *       only their staging area: the K tiles (in 128-byte-swizzled panels
 *       where Dqk is a multiple of 64), the group sums and the score rows
 *       take its place, so two CTAs of 64-key tiles with two buffers fit the
 *       A100's 164 KB at D 128 (the Q tile re-read per K tile had left room
 *       for one 32-key buffer). There the product is transposed, S^T = K Q^T
 *       (keys as MMA rows, the 16 heads as two 8-column blocks), so a key's
 *       group sum is 4 values in a thread and 2 shuffles within its quad
 *       (16 shuffles per 64-key tile instead of 48).
 *   scores_sm80_kq (GP 1, 2, 4, 8: G < 16 padded up to GP; scores_sm80_kq.cu):
 *       the same loop with 16 / GP tokens per warp, so the MMA's 16 columns
 *       are full at any G and the product's cost follows Hkv x GP, not a
 *       128-row tile's worth of probabilities per token: a token's GP
 *       columns are summed in the thread (GP 2), then over 1 or 2 quad
 *       shuffles (GP 4, 8); GP 1 needs no sum. Padding heads load as zero
 *       rows with lse = +inf, so their p is 0. The warp maps its tokens'
 *       rows with its lanes over (token, entry) pairs.
 *   scores_sm80 (GP 0, scores_sm80.cu): the probabilities go to a shared tile
 *       [128][BN+4], a CTA-wide column sum over each token's heads, then the
 *       map; three barriers per tile. For G > 16 and padded Dqk 256 at G < 16.
 * Tiles: tiles.h (pick_scores_sm80).
 */
#ifndef NSA_KERNELS_CUDA_SCORES_SM80_CUH
#define NSA_KERNELS_CUDA_SCORES_SM80_CUH

#include <type_traits>

#include "tile_qk.cuh"
#include "scores_map.cuh"
#include "topn.cuh"

namespace nsa_cuda {

/* s[mb][nb] += K Q^T for keys mb*16 .. mb*16 + 15 of the K tile (layout L)
 * and heads nb*8 .. nb*8 + 7 of the warp's token: accumulator element e of
 * s[mb][nb] is key mb*16 + lane/4 + 8 (e/2), head nb*8 + 2 (lane%4) + e%2.
 * qb: Q as the B operand, from the row-major Q tile (q_frags_b). ka: the
 * lane's ldmatrix addresses in the tile (kqt_lane_addrs), so that each of
 * the tile's MB x DQK/16 loads is one of these registers plus a constant. */
template <typename T, int DQK, int MB, typename L>
NSA_DEV void warp_kqt(float (&s)[MB][2][4], const uint32_t (&qb)[DQK / 16][4], const uint32_t (&ka)[4])
{
#pragma unroll
    for (int kk = 0; kk < DQK / 16; kk++)
#pragma unroll
        for (int mb = 0; mb < MB; mb++) {
            uint32_t a[4];
            ldsm_x4_a(a, ka[kk & 3] + (uint32_t)(L::off(mb * 16, (kk >> 2) * 64) * sizeof(T)));
            Mma<T>::run(s[mb][0], a, qb[kk][0], qb[kk][1]);
            Mma<T>::run(s[mb][1], a, qb[kk][2], qb[kk][3]);
        }
}
/* Lane addresses of warp_kqt's loads in the tile at sK: element (lane % 16,
 * j * 16 + 8 (lane / 16)) for j < 4. The load of (mb, kk) reads
 * off(mb * 16 + lane % 16, kk * 16 + 8 (lane / 16)), which is this address
 * for j = kk % 4 plus off(mb * 16, 64 (kk / 4)): additive for PadTile, and
 * for PanelTile because rows mb * 16 keep row % 8 and columns 64 (kk / 4)
 * keep the column chunk % 8 that its swizzle XORs. */
template <typename T, typename L> NSA_DEV void kqt_lane_addrs(uint32_t (&ka)[4], const T *sK, int lane)
{
#pragma unroll
    for (int j = 0; j < 4; j++) ka[j] = smem_u32(sK + L::off(lane & 15, j * 16 + ((lane >> 4) << 3)));
}
/* The warp's 16 Q rows (stride SQ) as warp_kqt's B fragments: per k-step,
 * heads 0-7 dims 0-7 and 8-15, then heads 8-15 (the K-tile pattern of warp_qk_l). */
template <int SQ, int NK> NSA_DEV void q_frags_b(uint32_t (&qb)[NK][4], const void *sQw, int lane)
{
    const unsigned short *p = (const unsigned short *)sQw;
#pragma unroll
    for (int kk = 0; kk < NK; kk++)
        ldsm_x4(qb[kk], p + ((lane & 7) + ((lane >> 4) << 3)) * SQ + kk * 16 + (((lane >> 3) & 1) << 3));
}

/* FUSED (SCORES_TOPN): the score rows stay in shared memory (accw > 0 is
 * required) and each warp then ranks one token's row (warp_select_row, the
 * same keys as topn_kernel) and writes its n indices; sc is not touched. */
/* NB: K tile buffers, 2 or (G16 only) 1: a CTA then waits for its own fetch
 * while the other CTA on the SM computes (the sm86 class's 100 KB per SM fits
 * two CTAs only so, tiles.h). */
template <typename T, int DQK, int BN, bool FUSED, int GP, int NB = 2, bool RING = false>
__global__ void __launch_bounds__(TC_THREADS, GP > 0 ? 2 : 1)
    scores_sm80_kernel(const Geom g, const Tiles tl, const T *__restrict__ q, int64_t qst, int64_t qsh,
                     const T *__restrict__ k, int64_t kst, int64_t ksh, bool qvec,
                     const float *lse, int64_t lst, int64_t lsh, float *sc, int64_t sst, int64_t ssh, int accw,
                     int *idx, int64_t ist, int64_t ish)
{
    constexpr int BM = TC_BM, NT = TC_THREADS;
    constexpr int SQ = DQK + 8, SP = BN + 4; /* SQ: row stride of the Q tile (and of padded K tiles) */
    /* KQ: a transposed kernel (scores_sm80_g16 at GP 16, scores_sm80_kq below):
     * GP query rows per token (the group padded to a power of two), TPW tokens
     * per warp, each warp owning its tokens' rows */
    constexpr bool KQ = GP > 0, G16 = GP == 16;
    constexpr int TPW = KQ ? 16 / GP : 1, SCW = KQ ? scores_kq_sumw(GP, BN) : BN, GPD = KQ ? GP : 16;
    /* QREG: the Q fragments in registers. ALIAS (KQ): the Q tile is only
     * their staging area, the K tiles, sums and rows take its place after */
    constexpr bool QREG = KQ ? scores_g16_qreg(DQK) : DQK <= 192;
    constexpr bool ALIAS = KQ && QREG, PANEL = KQ && scores_g16_panel(DQK);
    constexpr bool TRANS = ALIAS; /* S^T = K Q^T (warp_kqt) */
    static_assert(GP == 0 || GP == 1 || GP == 2 || GP == 4 || GP == 8 || GP == 16, "GP: 0 or a power of two <= 16");
    static_assert(G16 || !KQ || TRANS, "scores_sm80_kq holds Q in registers (padded Dqk <= 192)");
    /* STREAM: scores_sm80_kq's SCORES_TOPN ranks each token's blocks as the
     * tiles complete them (topn.cuh, TopnStream; accw is the ring's width) */
    constexpr bool STREAM = RING;
    static_assert(!RING || (FUSED && KQ && !G16), "the ring: scores_sm80_kq's SCORES_TOPN");
    using KL = typename std::conditional<PANEL, PanelTile<(PANEL ? DQK : 64), BN>, PadTile<SQ, BN>>::type;
    constexpr int KT = KL::elems; /* elements of one K tile */
    static_assert(NB == 2 || (NB == 1 && KQ), "one K buffer in the transposed loop only");
    static_assert(NB * KT * 2 >= (TC_THREADS / 32) * TOPN_CAND * 8, "the ranking's scratch fits the K tiles");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* panels start on a 128-byte boundary (tiles.h counts the 128 bytes for every G16 layout) */
    unsigned char *base = KQ ? smem_raw + ((128 - (smem_u32(smem_raw) & 127)) & 127) : smem_raw;
    T *sQ = (T *)base;
    T *sK = ALIAS ? sQ : sQ + BM * SQ;        /* [NB][KT] keys */
    float *sP = (float *)(sK + NB * KT);      /* [BM][SP] probabilities (not KQ) */
    float *sC = sP + (KQ ? 0 : BM * SP);      /* [tokens][SCW] group sums */
    float *sAcc = sC + (KQ ? BM / GPD : BM) * SCW; /* [tokens][accw] score rows (accw > 0), or the ring's state */
    const TopnStream ts(sAcc, BM / GPD, accw, (int)g.n);
    __shared__ int64_t sNc[TC_BM];            /* nc(t) of the tile's tokens */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const TileCtx c = tile_ctx(g, tl);
    const int64_t tlast = c.tl0 + c.ntok - 1;
    const int64_t khi = nsa_cmp_visible(tlast, g.l, g.d) - 1;
    const T *kg = k + g.cu_cmp[c.seq] * kst + c.gi * ksh;
    /* row of token t0 + tok at scg + tok * sst (unused when FUSED: sc may be NULL) */
    float *scg = FUSED ? nullptr : sc + (c.t0 - tl.row0) * sst + c.gi * ssh;

    /* Q tile row r: head r % per of token r / per (KQ: padding heads absent, loaded as zeros) */
    const int per = KQ ? GP : c.hca;
    auto qrow = [&](int r) -> int64_t {
        const int tok = r / per, hh = r % per;
        return tok < c.ntok && hh < c.hca ? (c.t0 + tok) * qst + (c.h0 + hh) * qsh : -1;
    };
    load_tile<T, BM, DQK, SQ, NT>(sQ, q, g.Dqk, qvec, qrow);
    cp_async_commit();
    const T *sQw = sQ + warp * 16 * SQ;
    uint32_t qf[QREG ? DQK / 16 : 1][4];
    if (ALIAS) { /* the fragments out of the staging area before the K tiles overwrite it */
        cp_async_wait<0>();
        __syncthreads();
        q_frags_b<SQ>(qf, sQw, lane);
        __syncthreads();
    }
    const int64_t nkt = khi >= 0 ? (khi + BN) / BN : 0;
    /* KADDR: every thread copies the same 16-byte column of rows kr0, kr0 + KRS, ... of each K
     * tile, and the layout moves by a constant per KRS rows, so the copies' addresses are worked
     * out once here, not per tile (they were about 100 instructions of each tile's loop head) */
    constexpr int CPR = DQK / 8, KRS = NT / CPR;
    constexpr bool KADDR = NT % CPR == 0 && (BN * CPR) % NT == 0 && KL::rstep(KRS) != 0;
    const int kr0 = tid / CPR;
    const int koff = kr0 * (int)kst + (tid % CPR) * 8;
    const uint32_t kdst = smem_u32(sK + KL::off(kr0, (tid % CPR) * 8));
    auto load_k = [&](int64_t kt, int buf) {
        const int64_t ks = kt * BN;
        const int nv = (int)nsa_min64(BN, khi - ks + 1);
        /* packed rows: aligned, kst = Hkv * DQK (the launcher checks rs32_ok) */
        const T *tb = kg + ks * kst;
        if constexpr (KADDR) {
            const uint32_t d = kdst + (uint32_t)(buf * KT * sizeof(T));
            const T *src = tb + koff;
            if (nv == BN) { /* every tile but the last: no row past khi */
#pragma unroll
                for (int i = 0; i < BN * CPR / NT; i++)
                    cp_async16_a(d + (uint32_t)(KL::rstep(i * KRS) * sizeof(T)), src + i * KRS * (int)kst, true);
            } else {
#pragma unroll
                for (int i = 0; i < BN * CPR / NT; i++) {
                    const bool ok = kr0 + i * KRS < nv;
                    cp_async16_a(d + (uint32_t)(KL::rstep(i * KRS) * sizeof(T)), ok ? src + i * KRS * (int)kst : tb, ok);
                }
            }
        } else {
            T *dst = sK + buf * KT;
            load_rows_vec_to<T, BN, DQK, NT>([&](int r, int cc) { return dst + KL::off(r, cc * 8); }, tb, (int)kst, nv,
                                             DQK);
        }
    };
    if (nkt > 0) load_k(0, 0);
    cp_async_commit();

    /* the overlap map as a table (scores_map.cuh) where the tiles are periodic */
    __shared__ MapTab sTab;
    const int tab_ne = KQ ? map_tab_entries(g, BN) : 0;
    const int64_t tab_per = ((int64_t)BN * g.d) / g.ls; /* selection blocks per periodic tile */
    map_tab_build(sTab, g, BN, tab_ne, tid);
    /* rows in global memory (accw 0) stored a whole periodic tile at a time
     * (map_tile_rows's carry, [2][tokens][MAP_CARRY] at sAcc) */
    const bool carry = KQ && !G16 && !FUSED && accw == 0 && map_carry_ok(tab_ne, tab_per);

    /* zero the eligible part of every token's scores row */
    const int64_t width = nsa_slc_last(tlast, g.ls) + 1;
    if (STREAM) { /* every ring slot 0, every kept set empty */
        for (int e = tid; e < BM / GPD * accw; e += NT) ts.ring[e] = 0.f;
        for (int e = tid; e < BM / GPD; e += NT) {
            ts.thr[e] = 0;
            ts.cnt[2 * e] = ts.cnt[2 * e + 1] = 0;
        }
    } else if (FUSED || accw > 0) {
        for (int e = tid; e < c.ntok * accw; e += NT) sAcc[e] = 0.f;
    } else {
        /* rows in plan memory: the eligible entries the whole periodic tiles do not store (with the
         * carry they store [0, whole tiles x tab_per) of every token's row, map_tile_rows), a warp per
         * token (the flat loop's 64-bit division per entry, over every entry, cost more than the map) */
        const int64_t z0 = carry ? (khi + 1) / BN * tab_per : 0;
        for (int tok = warp; tok < c.ntok; tok += NT / 32) {
            const int64_t jend = nsa_slc_last(c.tl0 + tok, g.ls) + 1;
            for (int64_t j = z0 + lane; j < jend; j += 32) scg[tok * sst + j] = 0.f;
        }
    }

    for (int tok = tid; tok < c.ntok; tok += NT) sNc[tok] = nsa_cmp_visible(c.tl0 + tok, g.l, g.d);
    const bool g16 = G16 || c.hca == 16; /* one token per warp */
    int64_t hi[2];
    float lse2[2];
    int64_t wmaxhi = INT64_MIN, wminhi = INT64_MAX;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = warp * 16 + (lane >> 2) + 8 * i;
        if (r < c.nrows) {
            const int64_t tq = c.tl0 + r / c.hca;
            hi[i] = nsa_cmp_visible(tq, g.l, g.d) - 1;
            lse2[i] = lse[(c.t0 + r / c.hca) * lst + (c.h0 + r % c.hca) * lsh] * NSA_LOG2E;
            wmaxhi = max(wmaxhi, hi[i]);
            wminhi = min(wminhi, hi[i]);
        } else {
            hi[i] = -1;
            lse2[i] = 0.f;
        }
    }
    wmaxhi = warp_max64(wmaxhi);
    wminhi = warp_min64(wminhi);
    const bool warp_rows = KQ ? warp * TPW < c.ntok : warp * 16 < c.nrows;
    /* TRANS: the thread's four columns nb*8 + 2 (lane%4) + e are head col % GP
     * of the warp's token col / GP: their lse (+inf for a padding head or an
     * absent token, so that p = 2^-inf = 0) and their token's last visible
     * key; whi: the warp's last visible key */
    float lseh[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
    int64_t hiv[2][2] = {{-1, -1}, {-1, -1}}, whi = -1;
    if (TRANS && warp_rows) {
#pragma unroll
        for (int nb = 0; nb < 2; nb++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = nb * 8 + 2 * (lane & 3) + e, tok = warp * TPW + col / GPD, hh = col % GPD;
                if (tok < c.ntok) hiv[nb][e] = nsa_cmp_visible(c.tl0 + tok, g.l, g.d) - 1;
                lseh[nb][e] = tok < c.ntok && hh < c.hca ? lse[(c.t0 + tok) * lst + (c.h0 + hh) * lsh] * NSA_LOG2E
                                                         : INFINITY;
            }
        whi = nsa_cmp_visible(c.tl0 + min(warp * TPW + TPW, c.ntok) - 1, g.l, g.d) - 1;
    }
    /* KQ: every token's score row is owned by its warp (group sum by
     * shuffles, overlap map by the warp's lanes), so one barrier per K tile
     * suffices (the double buffer) and warps overlap their phases */
    constexpr bool wown = KQ;

    /* entry e (selection block jlo + e) of token tok for the K tile starting
     * at ks: the same arithmetic in either loop below */
    auto overlap_entry = [&](int tok, int e, int64_t ks, int64_t jlo) {
        const int64_t j = jlo + e;
        float acc;
        if (!overlap_entry_sum(g, j, ks, BN, sNc[tok], sC + tok * BN, acc)) return;
        if (FUSED || accw > 0)
            sAcc[tok * accw + j] += acc;
        else
            scg[tok * sst + j] += acc;
    };

    if (!ALIAS) { /* Q has landed (K tile 0 may still be in flight) */
        cp_async_wait<1>();
        __syncthreads();
        q_frags<SQ, QREG>(qf, sQw, lane);
    }
    /* ALIAS: the loop's first barrier orders the zeroed rows and the map
     * table before their first use */
    const float sl = g.scale * NSA_LOG2E;
    uint32_t ka0[4] = {0, 0, 0, 0}; /* TRANS: warp_kqt's lane addresses in K buffer 0 */
    if (TRANS) kqt_lane_addrs<T, KL>(ka0, sK, lane);

    for (int64_t kt = 0; kt < nkt; kt++) {
        if (wown) {
            if (NB == 1 && kt > 0) { /* every warp is done with tile kt - 1: refill the one buffer */
                __syncthreads();
                load_k(kt, 0);
                cp_async_commit();
            }
            /* tile kt has landed; every warp is done with tile kt - 1, whose
             * buffer the next load reuses */
            cp_async_wait<0>();
            __syncthreads();
            if (NB == 2) {
                if (kt + 1 < nkt) load_k(kt + 1, (int)((kt + 1) & 1));
                cp_async_commit();
            }
        } else {
            if (kt + 1 < nkt) load_k(kt + 1, (int)((kt + 1) & 1));
            cp_async_commit();
            cp_async_wait<1>();
            __syncthreads();
        }
        const int buf = NB == 2 ? (int)(kt & 1) : 0;
        const int64_t ks = kt * BN;
        if constexpr (TRANS) {
            float st[BN / 16][2][4];
#pragma unroll
            for (int mb = 0; mb < BN / 16; mb++)
#pragma unroll
                for (int nb = 0; nb < 2; nb++) st[mb][nb][0] = st[mb][nb][1] = st[mb][nb][2] = st[mb][nb][3] = 0.f;
            float *sCw = sC + warp * TPW * SCW; /* the group sums of the warp's tokens */
            if (warp_rows) {
                if (ks <= whi) {
                    uint32_t ka[4];
#pragma unroll
                    for (int j = 0; j < 4; j++) ka[j] = ka0[j] + (uint32_t)(buf * KT * sizeof(T));
                    warp_kqt<T, DQK, BN / 16, KL>(st, qf, ka);
                }
                /* the tile's last visible key per column, as an int in [-1, BN]: keys are 0 .. BN - 1, so the
                 * 32-bit test keeps the 64-bit one's answer */
                int lim[2][2];
#pragma unroll
                for (int nb = 0; nb < 2; nb++)
#pragma unroll
                    for (int e = 0; e < 2; e++) lim[nb][e] = (int)nsa_max64(nsa_min64(hiv[nb][e] - ks, BN), -1);
                /* where this lane's sums go: key (lane / 4) + mb * 16 + 8 h of its column's token. Every lane of
                 * a token's group stores (the shuffles leave the same sum in each: float addition commutes), so
                 * no lane branches around its store */
                float *const dst0 = sCw + (lane >> 2);
#pragma unroll
                for (int mb = 0; mb < BN / 16; mb++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int key = mb * 16 + (lane >> 2) + 8 * h;
                        /* p = 2^(s*scale*log2e - lse*log2e) (keys past the token's last give 0), summed over
                         * the heads of each token: in the thread, then over the lanes of the quad holding it */
                        auto p = [&](int nb, int e) { return fast_ex2(fmaf(st[mb][nb][2 * h + e], sl, -lseh[nb][e])); };
                        if constexpr (GP == 16) {
                            float v = p(0, 0);
                            v += p(0, 1);
                            v += p(1, 0);
                            v += p(1, 1);
                            v = key <= lim[0][0] ? v : 0.f;
                            v += __shfl_xor_sync(0xffffffffu, v, 1);
                            v += __shfl_xor_sync(0xffffffffu, v, 2);
                            dst0[mb * 16 + 8 * h] = v;
                        } else if constexpr (GP == 1) {
#pragma unroll
                            for (int nb = 0; nb < 2; nb++)
#pragma unroll
                                for (int e = 0; e < 2; e++)
                                    dst0[(nb * 8 + 2 * (lane & 3) + e) * SCW + mb * 16 + 8 * h] =
                                        key <= lim[nb][e] ? p(nb, e) : 0.f;
                        } else {
#pragma unroll
                            for (int nb = 0; nb < 2; nb++) {
                                float v = p(nb, 0) + p(nb, 1);
                                if (GP >= 4) v += __shfl_xor_sync(0xffffffffu, v, 1);
                                if (GP >= 8) v += __shfl_xor_sync(0xffffffffu, v, 2);
                                dst0[((nb * 8 + 2 * (lane & 3)) / GPD) * SCW + mb * 16 + 8 * h] = key <= lim[nb][0] ? v : 0.f;
                            }
                        }
                    }
            }
            /* the warp's tokens' rows: their sums were written by this warp's lanes */
            __syncwarp();
            if (warp_rows) {
                const int tok0 = warp * TPW, ntw = min(TPW, c.ntok - tok0);
                map_tile_rows<TPW>(g, sTab, tab_ne, tab_per, BN, kt, khi, ntw, sNc + tok0, sCw, SCW,
                                   FUSED || accw > 0 ? sAcc + (int64_t)tok0 * accw : scg + tok0 * sst,
                                   FUSED || accw > 0 ? (int64_t)accw : sst, STREAM ? (int64_t)accw - 1 : -1, lane,
                                   carry ? sAcc + tok0 * MAP_CARRY : nullptr);
                if (STREAM && kt + 1 < nkt) {
                    /* blocks before the next tile's first are complete: rank them */
                    __syncwarp();
                    const int64_t j0 = nsa_slc_first_overlapped(ks, g.d, g.ls),
                                  j1 = nsa_slc_first_overlapped(ks + BN, g.d, g.ls);
                    for (int x = 0; x < ntw; x++) stream_offer(ts, g, tok0 + x, c.tl0 + tok0 + x, j0, j1, lane);
                }
            }
        } else {
            float s[BN / 8][4];
#pragma unroll
            for (int j = 0; j < BN / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            if (warp_rows) {
                if (ks <= wmaxhi) warp_qk_l<T, DQK, BN / 8, SQ, QREG, KL>(s, qf, sQw, sK + buf * KT, 0, lane);
                const bool full = ks + BN - 1 <= wminhi;
                /* p = 2^(s*scale*log2e - lse*log2e); keys past the row's nc give 0 */
                if (full) {
#pragma unroll
                    for (int j = 0; j < BN / 8; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[j][e] = fast_ex2(fmaf(s[j][e], sl, -lse2[e >> 1]));
                } else {
                    const int64_t lim0 = hi[0] - ks, lim1 = hi[1] - ks;
#pragma unroll
                    for (int j = 0; j < BN / 8; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int col = j * 8 + 2 * (lane & 3) + (e & 1);
                            const float p = fast_ex2(fmaf(s[j][e], sl, -lse2[e >> 1]));
                            s[j][e] = col <= ((e >> 1) ? lim1 : lim0) ? p : 0.f;
                        }
                }
                if (!g16) {
#pragma unroll
                    for (int j = 0; j < BN / 8; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            sP[(warp * 16 + (lane >> 2) + 8 * (e >> 1)) * SP + j * 8 + 2 * (lane & 3) + (e & 1)] = s[j][e];
                }
                if (g16) {
                    /* the warp's 16 rows are the 16 heads of token `warp`: column
                     * sums by shuffles (rows g and g+8, then over g) */
#pragma unroll
                    for (int j = 0; j < BN / 8; j++)
#pragma unroll
                        for (int b = 0; b < 2; b++) {
                            float v = s[j][b] + s[j][2 + b];
                            v += __shfl_xor_sync(0xffffffffu, v, 4);
                            v += __shfl_xor_sync(0xffffffffu, v, 8);
                            v += __shfl_xor_sync(0xffffffffu, v, 16);
                            if (lane < 4) sC[warp * BN + j * 8 + 2 * lane + b] = v;
                        }
                }
            }
            if (wown) {
                /* token `warp`'s row: sC[warp] was written by this warp's lanes 0..3 */
                __syncwarp();
                if (warp_rows)
                    map_tile_row(g, sTab, tab_ne, tab_per, BN, kt, khi, sNc[warp], sC + warp * BN,
                                 FUSED || accw > 0 ? sAcc + warp * accw : scg + warp * sst, lane);
                continue;
            }
            __syncthreads();
            if (!g16) {
                /* group sum over each token's heads */
                for (int e = tid; e < c.ntok * BN; e += NT) {
                    const int tok = e / BN, col = e % BN;
                    const float *pp = sP + tok * c.hca * SP + col;
                    float acc = 0.f;
                    for (int hh = 0; hh < c.hca; hh++) acc += pp[hh * SP];
                    sC[e] = acc;
                }
                __syncthreads();
            }
            /* overlap map onto the selection blocks this tile touches */
            const int64_t last = nsa_min64(ks + BN - 1, khi);
            const int64_t jlo = nsa_slc_first_overlapped(ks, g.d, g.ls);
            const int nj = (int)(nsa_slc_last_overlapped(last, g.l, g.d, g.ls) - jlo + 1);
            for (int e = tid; e < c.ntok * nj; e += NT) overlap_entry(e / nj, e % nj, ks, jlo);
            __syncthreads();
        }
    }
    if (carry && warp_rows && nkt > 0 && map_tile_whole(tab_ne, nkt - 1, BN, khi)) { /* the last tile's carry */
        const int tok0 = warp * TPW;
        map_tile_carry_flush(tab_ne, tab_per, nkt, min(TPW, c.ntok - tok0), sAcc + tok0 * MAP_CARRY,
                             scg + tok0 * sst, sst, lane);
    }
    cp_async_wait<0>();
    __syncthreads(); /* the rows are complete (the G16 loop ends without a barrier) */
    if (STREAM) {
        /* the blocks from the last tile's first to each token's own, then the kept sets out */
        const int64_t j0 = nkt > 0 ? nsa_slc_first_overlapped((nkt - 1) * BN, g.d, g.ls) : 0;
        for (int x = 0; x < TPW; x++) {
            const int tok = warp * TPW + x;
            if (tok >= c.ntok) break;
            const int64_t tl = c.tl0 + tok;
            stream_offer(ts, g, tok, tl, j0, nsa_slc_last(tl, g.ls) + 1, lane);
            stream_emit(ts, g, tok, idx + (c.t0 + tok) * ist + c.gi * ish, lane);
        }
    } else if (FUSED) {
        /* sAcc holds exactly the values the plain path stores in the scores
         * buffer (same arithmetic, same order), so the ranking matches it;
         * the K tiles' memory is free now and holds the ranking's scratch */
        uint64_t *cand = (uint64_t *)sK + warp * TOPN_CAND;
        for (int tok = warp; tok < c.ntok; tok += NT / 32)
            warp_select_row(g, sAcc + tok * accw, c.tl0 + tok, idx + (c.t0 + tok) * ist + c.gi * ish, lane, cand);
    } else if (accw > 0) {
        store_score_rows(g, sAcc, accw, scg, sst, c.ntok, c.tl0, width, tid, NT);
    }
}

/* ring: a SCORES_TOPN call (idx set) on the ring (ScoresTile.ring; GP 4 and 8) */
template <typename T, int DQK, int BN, int GP, int NB = 2>
static cudaError_t launch_sm80(const Dev &dev, bool rows_smem, bool ring, const Geom &g, const Tiles &tl, View q,
                               View kc, View lse, MView sc, MView idx, cudaStream_t s)
{
    static_assert(sizeof(T) == 2, "tensor-core path: 16-bit storage");
    constexpr bool HAS_RING = GP == 4 || GP == 8; /* the instances (tiles.h, scores_kq_ring_pays) */
    const bool fused = idx.p != nullptr;
    ring = ring && fused;
    if ((fused && !rows_smem) || (ring && (!HAS_RING || g.n < 1 || g.n > scores_kq_ring_max_n)) ||
        (GP > 0 && (scores_kq_gp(g.G) != GP || tl.qt != TC_BM / (GP > 0 ? GP : 1) || tl.hc != g.G)) ||
        tl.nchunk != 1 || !rs32_ok(kc.st, BN))
        return cudaErrorInvalidValue;
    const int rw = ring ? scores_kq_ring(BN, g.l, g.d, g.ls) : 0;
    /* rows in plan memory: stored a tile at a time with the carry (scores_map.cuh; the stage 5-10 % faster at
     * 64k than read-add-write, rows bitwise equal, H100 2026-12-07) */
    const bool carry = GP > 0 && GP < 16 && !fused && !rows_smem;
    const size_t rows = ring ? scores_kq_ring_smem(tl.qt, rw, g.n)
                        : rows_smem ? scores_rows_smem(tl.qt, g.max_ns)
                        : carry ? 2 * (size_t)TC_BM * MAP_CARRY * sizeof(float) : 0;
    size_t smem = GP > 0 ? scores_sm80_kq_smem(DQK, BN, NB, GP, rows) : scores_sm80_smem(DQK, BN) + rows;
    const int accw = ring ? rw : rows_smem ? (int)g.max_ns : 0;
    auto kern = fused ? scores_sm80_kernel<T, DQK, BN, true, GP, NB> : scores_sm80_kernel<T, DQK, BN, false, GP, NB>;
    if constexpr (HAS_RING)
        if (ring) kern = scores_sm80_kernel<T, DQK, BN, true, GP, NB, true>;
    cudaError_t e = launch_smem(kern, dev, smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)tl.count, (unsigned)g.Hkv);
    kern<<<grid, TC_THREADS, smem, s>>>(g, tl, (const T *)q.p, q.st, q.sh, (const T *)kc.p, kc.st, kc.sh,
                                        vec_ok(q.p, q.st, q.sh, g.Dqk), (const float *)lse.p, lse.st, lse.sh,
                                        (float *)sc.p, sc.st, sc.sh, accw, (int *)idx.p, idx.st, idx.sh);
    return cudaGetLastError();
}

/* the instances (tiles.h, pick_scores_sm80): BN 64 up to Dqk 128, 32 for
 * wider heads, and half that from Dqk 64 up; G16 also with one K buffer of
 * the smaller tile; scores_sm80_kq up to padded Dqk 192 */
template <typename T, int DQK, int GP>
static cudaError_t scores_sm80_dims(int bn, int nb, const Dev &dev, bool rows_smem, bool ring, const Geom &g,
                                    const Tiles &tl, View q, View kc, View lse, MView sc, MView idx, cudaStream_t s)
{
    constexpr int B0 = DQK > 128 ? 32 : 64, B1 = DQK >= 64 ? B0 / 2 : B0;
    if constexpr (GP > 0 && GP < 16 && !scores_g16_qreg(DQK)) {
        return cudaErrorInvalidValue;
    } else {
        if (nb == 1) {
            if constexpr (GP == 16)
                if (bn == B1) return launch_sm80<T, DQK, B1, GP, 1>(dev, rows_smem, ring, g, tl, q, kc, lse, sc, idx, s);
            return cudaErrorInvalidValue;
        }
        if (nb != 2) return cudaErrorInvalidValue;
        if (bn == B0) return launch_sm80<T, DQK, B0, GP>(dev, rows_smem, ring, g, tl, q, kc, lse, sc, idx, s);
        if constexpr (B1 != B0)
            if (bn == B1) return launch_sm80<T, DQK, B1, GP>(dev, rows_smem, ring, g, tl, q, kc, lse, sc, idx, s);
        return cudaErrorInvalidValue;
    }
}

/* one kernel family (GP: 0 scores_sm80, 16 scores_sm80_g16, 1 .. 8 scores_sm80_kq) */
template <int GP>
cudaError_t scores_sm80_gp(const Geom &g, const Dev &dev, const ScoresTile &tile, bool rows_smem, const Tiles &tl,
                           int dqkp, View q, View kc, View lse, MView sc, MView idx, cudaStream_t s)
{
    auto dims = [&](auto tag) -> cudaError_t {
        using T = decltype(tag);
        switch (dqkp) {
        case 32: return scores_sm80_dims<T, 32, GP>(tile.bn, tile.nb, dev, rows_smem, tile.ring, g, tl, q, kc, lse, sc, idx, s);
        case 64: return scores_sm80_dims<T, 64, GP>(tile.bn, tile.nb, dev, rows_smem, tile.ring, g, tl, q, kc, lse, sc, idx, s);
        case 128: return scores_sm80_dims<T, 128, GP>(tile.bn, tile.nb, dev, rows_smem, tile.ring, g, tl, q, kc, lse, sc, idx, s);
        case 192: return scores_sm80_dims<T, 192, GP>(tile.bn, tile.nb, dev, rows_smem, tile.ring, g, tl, q, kc, lse, sc, idx, s);
        case 256: return scores_sm80_dims<T, 256, GP>(tile.bn, tile.nb, dev, rows_smem, tile.ring, g, tl, q, kc, lse, sc, idx, s);
        default: return cudaErrorInvalidValue;
        }
    };
    if (g.dtype == 1) return dims(__half());
    if (g.dtype == 2) return dims(__nv_bfloat16());
    return cudaErrorInvalidValue;
}

/* scores_sm80_kq.cu: GP 1, 2, 4, 8 (their own file: the instances compile in parallel) */
cudaError_t scores_sm80_kq(int gp, const Geom &g, const Dev &dev, const ScoresTile &tile, bool rows_smem,
                           const Tiles &tl, int dqkp, View q, View kc, View lse, MView sc, MView idx, cudaStream_t s);

} // namespace nsa_cuda

#endif
