/*
 * scores.cu -- BLOCK_SCORES (semantics section 3): for every token t, KV group
 * g and eligible selection block j (j <= floor(t/l_s)),
 *     s(t, g, j) = sum_{h in g} sum_i overlap(i, j) / d * p_cmp(t, h, i),
 *     p_cmp(t, h, i) = exp(scale q(t,h).kc_i - lse_cmp(t, h))   for i < nc(t).
 * Eligible blocks no visible compressed block overlaps get 0.
 *
 * v1 scores_ref_kernel (every dtype): one warp per (t, g), a lane per j; for
 *    each compressed block overlapping j it recomputes the G logits in fp32
 *    (blocks shared by two j are computed twice). Readable, slow.
 * v2 scores_tc_kernel (f16 / bf16, G <= 128): the attn_tc tiling (tile_qk.cuh,
 *    rows = tokens x all G heads of a group); per K tile of BN compressed
 *    blocks: S = Q K^T on the tensor cores, P = exp2(S*scale*log2e - lse*log2e)
 *    into shared memory, a column sum over each token's G rows (the group
 *    sum), then the overlap map onto the selection blocks the tile touches,
 *    added to the CTA's score rows (in shared memory when the rows fit, written
 *    out once at the end; else in global memory, zeroed first). Every (t, j)
 *    entry is updated by one thread per tile, tiles in order: reproducible.
 *    Keys are the packed compressed rows (pack_cmp16): exact, because kc is a
 *    tensor of the call's dtype (semantics 7), so one MMA per k-step gives
 *    fp32-accurate logits of the rounded keys.
 *    With G = 16 each warp is one token and the group sum is done with warp
 *    shuffles straight from the accumulators (no probability tile in smem).
 *    v2.0 (bf16 keys, global read-modify-write per tile): 32.4 ms at T = 64k,
 *    D = 128 (H200); v2.1 (hi + lo keys, rows in shared memory): 39.6 ms --
 *    the extra MMAs cost more than the RMW saved; v2.2: shuffle group sum;
 *    v4: kc rounded to the dtype by COMPRESS, so the lo half is gone.
 * v5 (sm_90a, G = 16): the LEAN kernel with S on wgmma (WG below): 16.2 ->
 *    13.5 ms (D 128), 21.9 -> 17.7 ms (D 192) at T = 64k, H200.
 * v6 (sm_90a, G = 16, Dqk <= 128): scores_wt.cu (S^T = K Q^T) takes over
 *    where it applies; with the filtering top-n and per-tile descriptors the
 *    WG kernel here is 15.2 ms at D 192.
 * v7: scores_wt at Dqk 192 too (one K buffer, 12.1 ms); the WG kernel here
 *    runs where scores_wt refuses (NSA_CUDA_SCORES_WT=128 or 0, no fit).
 */
#include "tile_qk.cuh"
#include "scores_map.cuh"
#include "topn.cuh"
#include "wgmma.cuh"

namespace nsa_cuda {

template <typename T>
__global__ void __launch_bounds__(128) scores_ref_kernel(const Geom g, const T *q, int64_t qst, int64_t qsh,
                                                         const float *kc, int64_t kst, int64_t ksh, const float *lse,
                                                         int64_t lst, int64_t lsh, float *sc, int64_t sst,
                                                         int64_t ssh)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t pairs = g.T * g.Hkv;
    for (int64_t pr = (int64_t)blockIdx.x * 4 + warp; pr < pairs; pr += (int64_t)gridDim.x * 4) {
        const int64_t t = pr / g.Hkv, gi = pr % g.Hkv;
        const int64_t seq = g.tok_seq[t], tl = t - g.cu_seqlens[seq];
        const int64_t nc = nsa_cmp_visible(tl, g.l, g.d), cur = nsa_slc_last(tl, g.ls);
        for (int64_t j = lane; j <= cur; j += 32) {
            const int64_t i0 = nsa_cmp_first_overlapping(j, g.l, g.d, g.ls);
            const int64_t i1 = nsa_min64(nsa_cmp_last_overlapping(j, g.ls, g.d), nc - 1);
            float acc = 0.f;
            for (int64_t i = i0; i <= i1; i++) {
                const float wgt = (float)nsa_overlap(i, j, g.l, g.d, g.ls) / (float)g.d;
                const float *kr = kc + (g.cu_cmp[seq] + i) * kst + gi * ksh;
                float psum = 0.f;
                for (int64_t hh = 0; hh < g.G; hh++) {
                    const int64_t h = gi * g.G + hh;
                    const T *qr = q + t * qst + h * qsh;
                    float dot = 0.f;
                    for (int64_t e = 0; e < g.Dqk; e++) dot += to_f(qr[e]) * kr[e];
                    psum += expf(dot * g.scale - lse[t * lst + h * lsh]);
                }
                acc += wgt * psum;
            }
            sc[t * sst + gi * ssh + j] = acc;
        }
    }
}

cudaError_t scores_ref(const Geom &g, View q, View kc, View lse, MView scores, cudaStream_t s)
{
    const int64_t pairs = g.T * g.Hkv;
    if (pairs == 0) return cudaSuccess;
    int64_t blocks = (pairs + 3) / 4;
    if (blocks > (1 << 30)) blocks = 1 << 30;
    NSA_DISPATCH_DTYPE(g.dtype, T,
                       scores_ref_kernel<T><<<(unsigned)blocks, 128, 0, s>>>(
                           g, (const T *)q.p, q.st, q.sh, (const float *)kc.p, kc.st, kc.sh, (const float *)lse.p,
                           lse.st, lse.sh, (float *)scores.p, scores.st, scores.sh));
    return cudaGetLastError();
}

template <int DQK> struct ScBn {
    static constexpr int value = DQK > 128 ? 32 : 64;
};

/* FUSED (v3, SCORES_TOPN): the score rows stay in shared memory (accw > 0 is
 * required) and each warp then ranks one token's row (warp_select_row, the
 * same keys as topn_kernel) and writes its n indices; sc is not touched. */
/* LEAN (v4, G = 16 with the v3 loop, the host decides): only the one-token-
 * per-warp path is compiled, the probability tile sP is dropped and sC holds
 * 8 rows, Q fragments are re-read from shared memory, and registers are
 * capped at 128 so that two CTAs (16 warps) fit per SM where the score rows
 * are small enough. */
/* WG (v5, with LEAN, where the device runs sm_90a code): S = Q K^T on the
 * warpgroup MMA (wgmma.cuh) from 128-byte-swizzled Q and K tiles (row stride
 * DQK, no padding); everything after S is the LEAN code, on the same K tiles
 * (BN = 32 for Dqk 192 keeps two CTAs per SM there too). The ranking sees
 * the same scores up to the fp32 summation order inside the MMA. */

template <typename T, int DQK, bool FUSED, bool LEAN, bool WG = false>
__global__ void __launch_bounds__(TC_THREADS, LEAN ? 2 : 1)
    scores_tc_kernel(const Geom g, const Tiles tl, const T *__restrict__ q, int64_t qst, int64_t qsh,
                     const T *__restrict__ k, int64_t kst, int64_t ksh, bool qvec,
                     const float *lse, int64_t lst, int64_t lsh, float *sc, int64_t sst, int64_t ssh, int accw,
                     int *idx, int64_t ist, int64_t ish)
{
    static_assert(!WG || (LEAN && DQK % 64 == 0), "the wgmma path is LEAN with 64-element panels");
    constexpr int BM = TC_BM, NT = TC_THREADS, BN = ScBn<DQK>::value;
    constexpr int SQ = WG ? DQK : DQK + 8, SP = BN + 4; /* SQ: row stride of the Q / K tiles */
    constexpr bool QREG = !LEAN && DQK <= 192;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* WG: swizzle atoms need 1024-byte alignment (the launcher added 1 KB) */
    T *sQ = (T *)(smem_raw + (WG ? (1024u - (smem_u32(smem_raw) & 1023u)) & 1023u : 0u));
    T *sK = sQ + BM * SQ;                    /* [2][BN][SQ] keys */
    float *sP = (float *)(sK + 2 * BN * SQ); /* [BM][SP] probabilities (not LEAN) */
    float *sC = sP + (LEAN ? 0 : BM * SP);    /* [tokens][BN] group sums */
    float *sAcc = sC + (LEAN ? BM / 16 : BM) * BN; /* [tokens][accw] score rows (accw > 0) */
    __shared__ int64_t sNc[TC_BM];            /* nc(t) of the tile's tokens */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const TileCtx c = tile_ctx(g, tl);
    const int64_t tlast = c.tl0 + c.ntok - 1;
    const int64_t khi = nsa_cmp_visible(tlast, g.l, g.d) - 1;
    const T *kg = k + g.cu_cmp[c.seq] * kst + c.gi * ksh;
    /* row of token t0 + tok at scg + tok * sst (unused when FUSED: sc may be NULL) */
    float *scg = FUSED ? nullptr : sc + c.t0 * sst + c.gi * ssh;

    auto qrow = [&](int r) -> int64_t {
        return r < c.nrows ? (c.t0 + r / c.hca) * qst + (c.h0 + r % c.hca) * qsh : -1;
    };
    if (WG)
        load_tile_to<T, BM, DQK, NT>([&](int r, int cc) { return (T *)((unsigned char *)sQ + sw128_off(r, cc, BM)); },
                                     q, g.Dqk, qvec, qrow);
    else
        load_tile<T, BM, DQK, SQ, NT>(sQ, q, g.Dqk, qvec, qrow);
    cp_async_commit();
    const int64_t nkt = khi >= 0 ? (khi + BN) / BN : 0;
    auto load_k = [&](int64_t kt, int buf) {
        const int64_t ks = kt * BN;
        const int nv = (int)nsa_min64(BN, khi - ks + 1);
        /* packed rows: aligned, kst = Hkv * DQK (the launcher checks rs32_ok) */
        if (WG)
            load_rows_vec_to<T, BN, DQK, NT>(
                [&](int r, int cc) { return (T *)((unsigned char *)(sK + buf * BN * SQ) + sw128_off(r, cc, BN)); },
                kg + ks * kst, (int)kst, nv, DQK);
        else
            load_rows_vec<T, BN, DQK, SQ, NT>(sK + buf * BN * SQ, kg + ks * kst, (int)kst, nv, DQK);
    };
    if (nkt > 0) load_k(0, 0);
    cp_async_commit();

    /* zero the eligible part of every token's scores row */
    const int64_t width = nsa_slc_last(tlast, g.ls) + 1;
    if (FUSED || accw > 0) {
        for (int e = tid; e < c.ntok * accw; e += NT) sAcc[e] = 0.f;
    } else {
        for (int64_t e = tid; e < (int64_t)c.ntok * width; e += NT) {
            const int64_t tok = e / width, j = e % width;
            if (j <= nsa_slc_last(c.tl0 + tok, g.ls)) scg[tok * sst + j] = 0.f;
        }
    }

    for (int tok = tid; tok < c.ntok; tok += NT) sNc[tok] = nsa_cmp_visible(c.tl0 + tok, g.l, g.d);
    const bool g16 = LEAN || c.hca == 16; /* one token per warp */
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
    const bool warp_rows = warp * 16 < c.nrows;
    /* WG: the warpgroup's last row has its largest key range (rows are
     * token-major); the MMA runs when any of its rows sees the tile */
    int64_t gmaxhi = -1;
    if (WG && (warp >> 2) * 64 < c.nrows)
        gmaxhi = nsa_cmp_visible(c.tl0 + (int)min((warp >> 2) * 64 + 63, c.nrows - 1) / c.hca, g.l, g.d) - 1;
    /* v3 with G = 16: every token's score row is owned by its warp (group sum
     * by shuffles, overlap map by the warp's lanes), so one barrier per K
     * tile suffices (the double buffer) and warps overlap their phases */
    const bool wown = LEAN || (g.v3 && g16);

    /* v4: the overlap map as a table (scores_map.cuh) where the tiles are periodic */
    __shared__ MapTab sTab;
    const int tab_ne = wown ? map_tab_entries(g, BN) : 0;
    const int64_t tab_per = ((int64_t)BN * g.d) / g.ls; /* selection blocks per periodic tile */
    map_tab_build(sTab, g, BN, tab_ne, tid);

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

    cp_async_wait<1>();
    __syncthreads();
    const T *sQw = sQ + warp * 16 * SQ;
    uint32_t qf[QREG ? DQK / 16 : 1][4];
    q_frags<SQ, QREG>(qf, sQw, lane);
    const float sl = g.scale * NSA_LOG2E;

    for (int64_t kt = 0; kt < nkt; kt++) {
        if (wown) {
            /* tile kt has landed; every warp is done with tile kt - 1, whose
             * buffer the next load reuses */
            cp_async_wait<0>();
            if (WG) fence_async_smem();
            __syncthreads();
            if (kt + 1 < nkt) load_k(kt + 1, (int)((kt + 1) & 1));
            cp_async_commit();
        } else {
            if (kt + 1 < nkt) load_k(kt + 1, (int)((kt + 1) & 1));
            cp_async_commit();
            cp_async_wait<1>();
            __syncthreads();
        }
        const int buf = (int)(kt & 1);
        const int64_t ks = kt * BN;
        float s[BN / 8][4];
#pragma unroll
        for (int j = 0; j < BN / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        if constexpr (WG) {
#ifdef NSA_WGMMA
            if (ks <= gmaxhi) { /* all four warps of the warpgroup, rows or not */
                const uint64_t qd = sw128_desc(smem_u32(sQ) + (warp >> 2) * 64 * 128, 16),
                               kd = sw128_desc(smem_u32(sK + buf * BN * SQ), 16);
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < DQK / 16; kk++)
                    wg_ss<T, BN>(s, desc_at(qd, (kk >> 2) * BM * 128 + (kk & 3) * 32),
                                 desc_at(kd, (kk >> 2) * BN * 128 + (kk & 3) * 32), kk > 0);
                wg_commit();
                wg_wait<0>();
                wg_hold(s);
            }
#endif
        }
        if (warp_rows) {
            if (!WG && ks <= wmaxhi) warp_qk<T, DQK, BN / 8, SQ, QREG>(s, qf, sQw, sK + buf * BN * SQ, 0, lane);
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
    cp_async_wait<0>();
    __syncthreads(); /* the rows are complete (the v3 loop ends without a barrier) */
    if (FUSED) {
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

/* Shared memory of scores_tc_kernel without the score rows, and the rows'
 * bytes; the rows live in shared memory when they fit beside the tiles. */
static size_t scores_smem_base(int dqkp, bool lean = false, bool wg = false)
{
    const int BN = dqkp > 128 ? 32 : 64; /* ScBn */
    if (wg) /* unpadded swizzled tiles, 1 KB for their alignment */
        return 1024 + 2 * (size_t)(TC_BM * dqkp + 2 * BN * dqkp) + sizeof(float) * (size_t)(TC_BM / 16 * BN);
    const size_t tiles = 2 * (size_t)(TC_BM * (dqkp + 8) + 2 * BN * (dqkp + 8));
    if (lean) return tiles + sizeof(float) * (size_t)(TC_BM / 16 * BN);
    return tiles + sizeof(float) * (size_t)(TC_BM * (BN + 4) + TC_BM * BN);
}
static bool rows_fit(size_t base, size_t acc) { return acc <= 64 * 1024 && base + acc <= 220 * 1024; }

size_t scores_tc_smem(int dqkp) { return scores_smem_base(dqkp); }

bool scores_topn_fits(int dqkp, int qt, int64_t max_ns, int64_t smem_optin)
{
    if (dqkp <= 0 || max_ns <= 0 || max_ns > (1 << 20)) return false;
    const size_t base = scores_smem_base(dqkp), acc = sizeof(float) * (size_t)qt * (size_t)max_ns;
    return rows_fit(base, acc) && (int64_t)(base + acc) <= smem_optin;
}

template <typename T, int DQK>
static cudaError_t launch_scores(const Geom &g, const Tiles &tl, View q, View kc, View lse, MView sc,
                                 MView idx, cudaStream_t s)
{
    static_assert(sizeof(T) == 2, "tensor-core path: 16-bit storage");
    const bool lean = g.scores_lean && g.G == 16 && g.v3 && tl.nchunk == 1 && tl.qt == TC_BM / 16;
    constexpr bool wg_dims = DQK % 64 == 0 && DQK <= 192;
    const bool wg = wg_dims && lean && (g.wgmma & 2);
    size_t smem = scores_smem_base(DQK, lean, wg);
    /* score rows in shared memory when they fit beside the tiles */
    const size_t acc = sizeof(float) * (size_t)tl.qt * (size_t)g.max_ns;
    int accw = 0;
    if (rows_fit(smem, acc) && (int64_t)(smem + acc) <= g.smem_optin) {
        accw = (int)g.max_ns;
        smem += acc;
    }
    if (!rs32_ok(kc.st, ScBn<DQK>::value)) return cudaErrorInvalidValue;
    const bool fused = idx.p != nullptr;
    if (fused && accw == 0) return cudaErrorInvalidConfiguration; /* the backend checks scores_topn_fits first */
    /* v6: the transposed product (scores_wt.cu) where it runs; it refuses
     * (cudaErrorInvalidConfiguration) what it does not cover */
    if (wg && g.scores_wt) {
        const cudaError_t ew = scores_wt(g, tl, DQK, q, kc, lse, sc, idx, s);
        if (ew != cudaErrorInvalidConfiguration) return ew;
    }
    auto kern = fused ? (lean ? scores_tc_kernel<T, DQK, true, true> : scores_tc_kernel<T, DQK, true, false>)
                      : (lean ? scores_tc_kernel<T, DQK, false, true> : scores_tc_kernel<T, DQK, false, false>);
    if constexpr (wg_dims)
        if (wg) kern = fused ? scores_tc_kernel<T, DQK, true, true, true> : scores_tc_kernel<T, DQK, false, true, true>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)tl.count, (unsigned)g.Hkv);
    kern<<<grid, TC_THREADS, smem, s>>>(g, tl, (const T *)q.p, q.st, q.sh, (const T *)kc.p, kc.st,
                                        kc.sh, vec_ok(q.p, q.st, q.sh, g.Dqk), (const float *)lse.p, lse.st, lse.sh,
                                        (float *)sc.p, sc.st, sc.sh, accw, (int *)idx.p, idx.st, idx.sh);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t scores_tc_t(const Geom &g, const Tiles &tl, int dqkp, View q, View kc, View lse,
                               MView sc, MView idx, cudaStream_t s)
{
    switch (dqkp) {
    case 32: return launch_scores<T, 32>(g, tl, q, kc, lse, sc, idx, s);
    case 64: return launch_scores<T, 64>(g, tl, q, kc, lse, sc, idx, s);
    case 128: return launch_scores<T, 128>(g, tl, q, kc, lse, sc, idx, s);
    case 192: return launch_scores<T, 192>(g, tl, q, kc, lse, sc, idx, s);
    case 256: return launch_scores<T, 256>(g, tl, q, kc, lse, sc, idx, s);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t scores_tc(const Geom &g, const Tiles &tl, int dqkp, View q, View kc, View lse, MView sc,
                      cudaStream_t s)
{
    if (tl.count == 0) return cudaSuccess;
    if (tl.nchunk != 1) return cudaErrorInvalidValue;
    const MView noidx = {nullptr, 0, 0};
    if (g.dtype == 1) return scores_tc_t<__half>(g, tl, dqkp, q, kc, lse, sc, noidx, s);
    if (g.dtype == 2) return scores_tc_t<__nv_bfloat16>(g, tl, dqkp, q, kc, lse, sc, noidx, s);
    return cudaErrorInvalidValue;
}

cudaError_t scores_topn_tc(const Geom &g, const Tiles &tl, int dqkp, View q, View kc, View lse,
                           MView idx, cudaStream_t s)
{
    if (tl.count == 0 || g.n == 0) return cudaSuccess;
    if (tl.nchunk != 1 || !idx.p) return cudaErrorInvalidValue;
    const MView nosc = {nullptr, 0, 0};
    if (g.dtype == 1) return scores_tc_t<__half>(g, tl, dqkp, q, kc, lse, nosc, idx, s);
    if (g.dtype == 2) return scores_tc_t<__nv_bfloat16>(g, tl, dqkp, q, kc, lse, nosc, idx, s);
    return cudaErrorInvalidValue;
}

} // namespace nsa_cuda
