/*
 * scores_sm90.cu -- BLOCK_SCORES (+ SELECT_TOPN) for G = 16 on Hopper (the
 * sm90 class, sm_90a code): the product transposed, S^T = K Q^T, so that the
 * group sum over a token's 16 heads runs mostly inside each thread.
 *
 * With rows = (token, head), as in scores_sm80's G = 16 kernel, every thread
 * holds 2 heads of a column, so the sum over 16 heads takes 3 shuffles per
 * column pair, 48 per 64-key tile per warp. Here the wgmma's M is 64
 * compressed keys and its N is 64 columns = 4 tokens x 16 heads (head
 * fastest), one such product per warpgroup:
 *   A = the K tile (64 keys x Dqk), B = the warpgroup's 64 Q rows, both
 *   K-major from 128-byte-swizzled shared memory.
 * The accumulator gives thread (lane, warp w of the warpgroup) keys
 * 16w + lane/4 and +8, and, of every token, the heads 2c, 2c+1, 8+2c, 9+2c
 * (c = lane % 4). So a token's group sum is 3 adds in the thread, then a
 * reduce-scatter over the quad (6 shuffles for 4 tokens x 2 keys) leaves
 * lane c with the full sums of token c: 6 shuffles per thread per tile
 * instead of 48. The sums go to a [token][key] tile in shared memory, and
 * each warp maps one token's sums onto its score row (scores_map.cuh); the
 * rows stay in shared memory (the chooser takes this kernel only where they
 * fit) and are ranked at the end (topn.cuh), or written out when the plain
 * BLOCK_SCORES stage runs.
 *
 * CTA: the tile of scores_sm80 (8 tokens x 16 heads, tile_qk.cuh), 2
 * warpgroups (tokens 0-3 and 4-7) sharing each K tile of 64 keys. Thread 0
 * fetches the K tiles through the TMA (tma.cuh) into mbarrier-tracked
 * buffers, so no CTA barrier is left in the loop; the sums tile is double-
 * buffered by tile parity, so one warpgroup barrier per tile orders its
 * writes after the last reads of the same buffer. Without a tensor map
 * (a driver without cuTensorMapEncodeTiled) the tiles come by cp.async with a
 * CTA barrier per tile. Two K buffers at Dqk 64 / 128; one at Dqk 192, so
 * that two CTAs fit per SM (tiles.h). Numerics: p = 2^(s * scale * log2e -
 * lse * log2e) as in scores_sm80, summed in another order (the scores differ
 * by fp32 rounding; near-ties are judged as such by the parity tests).
 */
#include "scores_map.cuh"
#include "tile_qk.cuh"
#include "tma.cuh"
#include "topn.cuh"
#include "wgmma.cuh"

namespace nsa_cuda {

constexpr int S90_BN = 64;        /* keys per tile: the M of one wgmma */
constexpr int S90_SC = S90_BN + 8; /* row stride (floats) of the sums tile: the 4 lanes of a quad write 4 rows */

/* barrier of warpgroup wg's 128 threads (named barriers 1 and 2; 0 is __syncthreads) */
NSA_DEV void wg_bar(int wg)
{
    if (wg == 0)
        asm volatile("bar.sync 1, 128;\n" ::: "memory");
    else
        asm volatile("bar.sync 2, 128;\n" ::: "memory");
}

/* two CTAs per SM (101 KB of shared memory at T = 64k for Dqk 128) */
template <typename T, int DQK, bool FUSED, int NB, bool TMA>
__global__ void __launch_bounds__(TC_THREADS, 2)
    scores_sm90_kernel(const Geom g, const Tiles tl, const T *__restrict__ q, int64_t qst, int64_t qsh,
                     const T *__restrict__ k, int64_t kst, int64_t ksh, bool qvec, const float *lse, int64_t lst,
                     int64_t lsh, float *sc, int64_t sst, int64_t ssh, int accw, int *idx, int64_t ist, int64_t ish,
                     const __grid_constant__ TmaKV tm)
{
#ifdef NSA_WGMMA
    constexpr int BM = TC_BM, NT = TC_THREADS, BN = S90_BN, NTOK = TC_BM / 16;
    constexpr uint32_t QB = BM * DQK * 2, KB = BN * DQK * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* swizzle atoms need 1024-byte alignment; the launcher added 1 KB */
    unsigned char *const sQ = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    unsigned char *const sK = sQ + QB;                 /* [NB][BN][DQK] */
    float *const sC0 = (float *)(sK + NB * KB);        /* [2][NTOK][S90_SC] group sums of the tile */
    float *const sAcc = sC0 + 2 * NTOK * S90_SC;        /* [NTOK][accw] score rows */
    __shared__ MapTab sTab;
    __shared__ __align__(8) uint64_t full[NB], empty[NB]; /* TMA: tile landed / every warp done with it */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2, wq = warp & 3;
    const TileCtx c = tile_ctx(g, tl); /* hca == 16: rows = token * 16 + head */
    const int64_t tlast = c.tl0 + c.ntok - 1;
    const int64_t khi = nsa_cmp_visible(tlast, g.l, g.d) - 1;
    const int64_t g_row0 = g.cu_cmp[c.seq];
    const T *kg = k + g_row0 * kst + c.gi * ksh;

    load_tile_to<T, BM, DQK, NT>([&](int r, int cc) { return (T *)(sQ + sw128_off(r, cc, BM)); }, q, g.Dqk, qvec,
                                 [&](int r) -> int64_t {
                                     return r < c.nrows ? (c.t0 + r / 16) * qst + (c.h0 + r % 16) * qsh : -1;
                                 });
    cp_async_commit();
    const int64_t nkt = khi >= 0 ? (khi + BN) / BN : 0;
    auto load_k = [&](int64_t kt, int buf) {
        const int64_t ks = kt * BN;
        if constexpr (TMA) { /* thread 0 only */
            mbar_expect_tx(&full[buf], tma_tile_bytes<BN, DQK>());
            tma_tile<BN, DQK>(sK + buf * KB, &tm.k, &full[buf], (int)c.gi, g_row0 + ks);
        } else {
            const int nv = (int)nsa_min64(BN, khi - ks + 1);
            load_rows_vec_to<T, BN, DQK, NT>(
                [&](int r, int cc) { return (T *)(sK + buf * KB + sw128_off(r, cc, BN)); }, kg + ks * kst, (int)kst,
                nv, DQK);
        }
    };
    if constexpr (TMA) {
        if (tid == 0) {
            for (int b = 0; b < NB; b++) {
                mbar_init(&full[b], 1);
                mbar_init(&empty[b], NT / 32);
            }
            mbar_init_fence();
            for (int b = 0; b < NB && b < nkt; b++) load_k(b, b);
        }
    } else {
        if (nkt > 0) load_k(0, 0);
        cp_async_commit();
    }

    /* the score rows start at 0 */
    for (int e = tid; e < c.ntok * accw; e += NT) sAcc[e] = 0.f;
    const int tab_ne = map_tab_entries(g, BN);
    const int64_t tab_per = ((int64_t)BN * g.d) / g.ls; /* selection blocks per periodic tile */
    map_tab_build(sTab, g, BN, tab_ne, tid);

    /* this thread's columns: heads 2c + {0, 1} (j even) and 8 + 2c + {0, 1}
     * (j odd) of tokens 4 wg + j / 2; lse2[u][x] for x = (j & 1) * 2 + e % 2 */
    const int cq = lane & 3;
    float lse2[4][4];
    int64_t hi[4]; /* last visible key of each of the warpgroup's tokens, -1 when absent */
    int64_t wminhi = INT64_MAX, wmaxhi = -1;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int tok = wg * 4 + u;
        const bool ok = tok < c.ntok;
        hi[u] = ok ? nsa_cmp_visible(c.tl0 + tok, g.l, g.d) - 1 : -1;
        if (ok) wminhi = min(wminhi, hi[u]);
        wmaxhi = max(wmaxhi, hi[u]);
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int h = (x >> 1) * 8 + 2 * cq + (x & 1);
            lse2[u][x] = ok ? lse[(c.t0 + tok) * lst + (c.h0 + h) * lsh] * NSA_LOG2E : 0.f;
        }
    }
    /* the token this warp maps, and the token whose sums this lane gathers */
    const int mtok = wg * 4 + wq;
    const int64_t mnc = mtok < c.ntok ? nsa_cmp_visible(c.tl0 + mtok, g.l, g.d) : 0;
    float *const mrow = sAcc + mtok * accw;
    const float sl = g.scale * NSA_LOG2E;
    const uint64_t qd = sw128_desc(smem_u32(sQ) + wg * 64 * 128, 16); /* the warpgroup's 64 rows of every panel */

    if constexpr (TMA) { /* Q (cp.async) and the barriers' initialisation are visible */
        cp_async_wait<0>();
        fence_async_smem();
        __syncthreads();
    }
    for (int64_t kt = 0; kt < nkt; kt++) {
        const int buf = NB == 2 ? (int)(kt & 1) : 0;
        float *const sC = sC0 + (TMA ? (int)(kt & 1) : 0) * NTOK * S90_SC;
        if constexpr (TMA) {
            /* thread 0 refills the buffer of tile kt - 1 once every warp is done with it: tile kt (one buffer)
             * or tile kt + 1 (two) */
            const int64_t nt = NB == 1 ? kt : kt + 1;
            if (tid == 0 && kt > 0 && nt < nkt) {
                const int b = (int)((kt - 1) % NB);
                mbar_wait(&empty[b], (uint32_t)(((kt - 1) / NB) & 1));
                load_k(nt, b);
            }
            mbar_wait(&full[buf], (uint32_t)((kt / NB) & 1));
        } else {
            if (NB == 1 && kt > 0) { /* every warp is done with tile kt - 1: refill the one buffer */
                __syncthreads();
                load_k(kt, 0);
                cp_async_commit();
            }
            /* tile kt has landed; every warp is done with tile kt - 1 (its buffer
             * and the sums tile) */
            cp_async_wait<0>();
            fence_async_smem();
            __syncthreads();
            if (NB == 2) {
                if (kt + 1 < nkt) load_k(kt + 1, (int)((kt + 1) & 1));
                cp_async_commit();
            }
        }
        const int64_t ks = kt * BN;
        if (ks > wmaxhi) { /* no token of the warpgroup sees this tile (uniform over it) */
            if (TMA && lane == 0) mbar_arrive(&empty[buf]);
            continue;
        }

        float s[8][4];
        const uint64_t kd = sw128_desc(smem_u32(sK + buf * KB), 16);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < DQK / 16; kk++) {
            const uint32_t off = (kk & 3) * 32; /* 16 dims into the 128-byte row */
            wg_ss<T, 64>(s, desc_at(kd, (kk >> 2) * BN * 128 + off), desc_at(qd, (kk >> 2) * BM * 128 + off), kk > 0);
        }
        wg_commit();
        wg_wait<0>();
        wg_hold(s);
        if (TMA) {
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[buf]); /* this warp's reads of the tile are complete */
        }

        /* p = 2^(s*scale*log2e - lse*log2e); keys a token does not see give 0 */
        const int key0 = 16 * wq + (lane >> 2); /* this thread's keys: ks + key0 (+ 8) */
        if (ks + BN - 1 <= wminhi) {
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[j][e] = fast_ex2(fmaf(s[j][e], sl, -lse2[j >> 1][(j & 1) * 2 + (e & 1)]));
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int64_t lim = hi[j >> 1] - ks;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float p = fast_ex2(fmaf(s[j][e], sl, -lse2[j >> 1][(j & 1) * 2 + (e & 1)]));
                    s[j][e] = key0 + 8 * (e >> 1) <= lim ? p : 0.f;
                }
            }
        }
        /* v[r][u]: this thread's 4 heads of token u at key key0 + 8r */
        float v[2][4];
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                v[r][u] = (s[2 * u][2 * r] + s[2 * u][2 * r + 1]) + (s[2 * u + 1][2 * r] + s[2 * u + 1][2 * r + 1]);
        /* reduce-scatter over the quad: after xor 1 lane keeps tokens of its
         * parity (u = 2 pr + (c & 1)), after xor 2 token c alone */
        const bool b1 = cq & 1, b2 = cq & 2;
        float w1[2][2];
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int pr = 0; pr < 2; pr++) {
                const float keep = b1 ? v[r][2 * pr + 1] : v[r][2 * pr];
                const float send = b1 ? v[r][2 * pr] : v[r][2 * pr + 1];
                w1[r][pr] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
            }
        float *const crow = sC + (wg * 4 + cq) * S90_SC;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float keep = b2 ? w1[r][1] : w1[r][0];
            const float send = b2 ? w1[r][0] : w1[r][1];
            crow[key0 + 8 * r] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
        }
        wg_bar(wg); /* the warpgroup's sums are in sC */
        if (mtok < c.ntok && ks < mnc)
            map_tile_row(g, sTab, tab_ne, tab_per, BN, kt, khi, mnc, sC + mtok * S90_SC, mrow, lane);
    }
    __syncthreads(); /* the rows are complete (and, with TMA, every issued tile has landed: each was waited for) */
    if (FUSED) { /* the K tiles' memory holds the ranking's scratch */
        uint64_t *cand = (uint64_t *)sK + warp * TOPN_CAND;
        for (int tok = warp; tok < c.ntok; tok += NT / 32)
            warp_select_row(g, sAcc + tok * accw, c.tl0 + tok, idx + (c.t0 + tok) * ist + c.gi * ish, lane, cand);
    } else {
        store_score_rows(g, sAcc, accw, sc + (c.t0 - tl.row0) * sst + c.gi * ssh, sst, c.ntok, c.tl0,
                         nsa_slc_last(tlast, g.ls) + 1, tid, NT);
    }
#endif
}

template <typename T, int DQK, int NB>
static cudaError_t launch_sm90(const Dev &dev, const Geom &g, const Tiles &tl, View q, View kc, View lse, MView sc,
                               MView idx, cudaStream_t s)
{
    size_t smem = scores_sm90_g16_smem(DQK, NB) + scores_rows_smem(tl.qt, g.max_ns);
    if (g.G != 16 || tl.nchunk != 1 || tl.qt != TC_BM / 16 || !rs32_ok(kc.st, S90_BN)) return cudaErrorInvalidValue;
    /* the packed compressed keys [total_cmp][Hkv][DQK] through the TMA where the map can be made */
    TmaKV tm = {};
    tm.ok = tma_map_rows(&tm.k, kc.p, g.total_cmp, g.Hkv, DQK, kc.st, kc.sh, S90_BN);
    const bool fused = idx.p != nullptr;
    auto kern = fused ? (tm.ok ? scores_sm90_kernel<T, DQK, true, NB, true> : scores_sm90_kernel<T, DQK, true, NB, false>)
                      : (tm.ok ? scores_sm90_kernel<T, DQK, false, NB, true> : scores_sm90_kernel<T, DQK, false, NB, false>);
    cudaError_t e = launch_smem(kern, dev, smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)tl.count, (unsigned)g.Hkv);
    kern<<<grid, TC_THREADS, smem, s>>>(g, tl, (const T *)q.p, q.st, q.sh, (const T *)kc.p, kc.st, kc.sh,
                                        vec_ok(q.p, q.st, q.sh, g.Dqk), (const float *)lse.p, lse.st, lse.sh,
                                        (float *)sc.p, sc.st, sc.sh, (int)g.max_ns, (int *)idx.p, idx.st, idx.sh, tm);
    return cudaGetLastError();
}

cudaError_t scores_sm90_g16(const Geom &g, const Dev &dev, const ScoresTile &tile, const Tiles &tl, int dqkp, View q,
                            View kc, View lse, MView sc, MView idx, cudaStream_t s)
{
    if (tl.count == 0 || (idx.p && g.n == 0)) return cudaSuccess;
    if (g.dtype != 1 && g.dtype != 2) return cudaErrorInvalidValue;
    const ScoresTile want = pick_scores_sm90_g16(dqkp, 0, INT64_MAX);
    if (tile.bn != want.bn || tile.nb != want.nb) return cudaErrorInvalidValue;
#define NSA_SM90(DQK, NB)                                                                                        \
    return g.dtype == 1 ? launch_sm90<__half, DQK, NB>(dev, g, tl, q, kc, lse, sc, idx, s)                         \
                        : launch_sm90<__nv_bfloat16, DQK, NB>(dev, g, tl, q, kc, lse, sc, idx, s)
    switch (dqkp) {
    case 64: NSA_SM90(64, 2);
    case 128: NSA_SM90(128, 2);
    case 192: NSA_SM90(192, 1);
    default: return cudaErrorInvalidValue;
    }
#undef NSA_SM90
}

} // namespace nsa_cuda
