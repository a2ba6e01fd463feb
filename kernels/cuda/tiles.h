/*
 * tiles.h -- the tile sizes of the CUDA tensor-core kernels and the shared
 * memory each asks for: one function per kernel family that picks its tile
 * for a shape and a shared-memory limit, and the formulas its launcher uses.
 *
 * Plain C++ (no CUDA header): the kernels' launchers and the backend's
 * chooser (backends/cuda/choose.cc) both include it, so the choice made when
 * a plan is prepared and the launch agree by construction, and the chooser is
 * tested on machines without a GPU (tests/test_cuda_choose.cc).
 *
 * Limits are bytes of dynamic shared memory one CTA may ask for; the
 * chooser passes the device class's opt-in less SMEM_STATIC_MARGIN (the
 * kernels' static shared memory, at most 3.7 KB: slc_sm80_g16's lists).
 * Rejected tile choices stay as one-line comments with the reason and the
 * measurement (H200, T = 64k, bf16; docs/cuda-results.md has the runs).
 */
#ifndef NSA_KERNELS_CUDA_TILES_H
#define NSA_KERNELS_CUDA_TILES_H

#include <stddef.h>
#include <stdint.h>

#include "nsa_blocks.h" /* NSA_HD: bwd_steps is shared with the device */

namespace nsa_cuda {

constexpr int TC_BM = 128;      /* query rows per CTA of the tiled kernels: tokens x heads of one KV group */
constexpr int TC_THREADS = 256; /* 8 warps x 16 rows */
constexpr int64_t SMEM_STATIC_MARGIN = 4096;

/* Padded head dims of the tensor-core kernels for (Dqk, Dv): 32/32, 64/64,
 * 128/128, 192/128 or 256/256; 0/0 when the heads are wider (reference kernels). */
inline void tc_dims(int64_t dqk, int64_t dv, int *dqkp, int *dvp)
{
    *dqkp = *dvp = 0;
    if (dqk < 1 || dv < 1 || dqk > 256 || dv > 256) return;
    if (dqk > 128 && dqk <= 192 && dv <= 128) {
        *dqkp = 192;
        *dvp = 128;
        return;
    }
    const int64_t m = dqk > dv ? dqk : dv;
    const int p = m <= 32 ? 32 : m <= 64 ? 64 : m <= 128 ? 128 : 256;
    *dqkp = *dvp = p;
}
/* The padded pairs the per-dims instances of the selected, backward and
 * decode kernels cover (NSA_SLC_DIMS): 32/32, 64/64, 128/128 and 192/128. */
inline bool tc_pair_dims(int dqkp, int dvp)
{
    return (dqkp == dvp && (dqkp == 32 || dqkp == 64 || dqkp == 128)) || (dqkp == 192 && dvp == 128);
}

/* Token tile of the tiled kernels for group size G: hc heads x qt tokens = 128 rows. */
inline int tile_heads(int64_t G) { return (int)(G < TC_BM ? G : TC_BM); }
inline int tile_tokens(int64_t G) { return TC_BM / tile_heads(G); }

/* ------------------------------------------------------------ attention (compressed, window)
 * attn_sm80 (mma.sync, cp.async; every sm_80+ device) and attn_sm90 (wgmma, TMA). */
struct AttnTile {
    int bn;    /* keys per K/V tile; 0: no tile fits */
    int minb;  /* CTAs per SM the kernel is compiled for: 2 caps registers at 65536 / (2 x threads) */
    bool qreg; /* attn_sm80: Q fragments held in registers (else re-read from shared memory) */
    int rw;    /* attn_sm80: 16-row blocks per warp (1: 8 warps of 16 rows; 2: 4 warps of 32 rows) */
};
inline int attn_threads(const AttnTile &t) { return TC_THREADS / (t.rw > 1 ? t.rw : 1); }

constexpr size_t attn_sm80_smem(int dqk, int dv, int bn)
{
    return 2 * (size_t)(TC_BM * (dqk + 8) + 2 * bn * (dqk + 8) + 2 * bn * (dv + 8));
}
/* 1 KB for the swizzle atoms' 1024-byte alignment; two K/V buffers */
constexpr size_t attn_sm90_smem(int dqk, int dv, int bn) { return 1024 + 2 * (size_t)(TC_BM * dqk + 2 * bn * (dqk + dv)); }

/* The attn_sm80 tiles, compiled for Dv 128 (D 128 and Dqk 192) unless said:
 * "r32" (4 warps of 32 rows, BN 32 at D 128 and 16 at Dqk 192, Q from shared
 * memory, two CTAs per SM): every K and V fragment a warp loads feeds two
 * MMA row blocks, half the shared-memory reads per MMA of the 16-row warps
 * (FlashAttention-2's layout); taken for the compressed branch, and the
 * window at Dqk 192, where two CTAs fit per SM (A100: 68 KB at D 128, 71 KB
 * at Dqk 192).
 * "two" (8 warps of 16 rows, BN 32, Q from shared memory, 128 registers, two
 * CTAs per SM where they fit: the sm86 class runs one).
 * "one" (every padded dims; BN 64, 32 for Dqk 256; Q in registers, one CTA
 * per SM, ~230 registers). Two against one, H200, D 128: cmp 19.7 -> 19.4 ms,
 * window 10.6 -> 7.9 (v4). */
constexpr AttnTile ATTN_SM80_ONE_64 = {64, 1, true, 1}, ATTN_SM80_ONE_32 = {32, 1, false, 1},
                   ATTN_SM80_TWO = {32, 2, false, 1}, ATTN_SM80_R32_32 = {32, 2, false, 2},
                   ATTN_SM80_R32_16 = {16, 2, false, 2};
inline AttnTile attn_sm80_one(int dqkp) { return dqkp > 192 ? ATTN_SM80_ONE_32 : ATTN_SM80_ONE_64; }
inline AttnTile attn_sm80_r32(int dqkp) { return dqkp > 128 ? ATTN_SM80_R32_16 : ATTN_SM80_R32_32; }
inline bool attn_sm80_takes(int dqkp, int dvp)
{
    return (dqkp == dvp && (dqkp == 32 || dqkp == 64 || dqkp == 128 || dqkp == 256)) || (dqkp == 192 && dvp == 128);
}
/* mode: 0 compressed, 2 window; per_sm: the class's shared memory per SM (0:
 * do not ask for two CTAs); each CTA also holds its static shared memory and
 * the runtime's 1 KB. r32 against two as the sm80 class, T = 64k: compressed
 * 18.86 -> 17.13 ms at D 128, 32.64 -> 27.24 at Dqk 192 (two fits one CTA
 * there); window 11.32 -> 9.20 at Dqk 192 but 6.17 -> 6.56 at D 128, where
 * two keeps its 16 warps per SM. */
inline AttnTile pick_attn_sm80(int mode, int dqkp, int dvp, int64_t limit, int64_t per_sm)
{
    const AttnTile none = {0, 0, false, 1};
    if (!attn_sm80_takes(dqkp, dvp)) return none;
    if (dvp == 128 && per_sm > 0 && (mode == 0 || dqkp > 128)) {
        const AttnTile r32 = attn_sm80_r32(dqkp);
        const int64_t b = (int64_t)attn_sm80_smem(dqkp, dvp, r32.bn);
        if (b <= limit && 2 * (b + SMEM_STATIC_MARGIN + 1024) <= per_sm) return r32;
    }
    if (dvp == 128 && (int64_t)attn_sm80_smem(dqkp, dvp, ATTN_SM80_TWO.bn) <= limit) return ATTN_SM80_TWO;
    const AttnTile one = attn_sm80_one(dqkp);
    return (int64_t)attn_sm80_smem(dqkp, dvp, one.bn) <= limit ? one : none;
}

/* attn_sm90, dims 64/64, 128/128, 192/128. Compressed branch: one CTA of
 * 128-key tiles, two buffers (9.7 / 10.9 ms at D 128 / Dqk 192 against two
 * CTAs of 64/32-key tiles 10.0 / 14.3, and one buffer of 64 keys on two CTAs
 * 10.2 / 12.4). Window branch: two CTAs per SM of 64-key tiles, 32 at
 * Dqk 192 (3.9 / 4.8 ms; one buffer of 64 keys 4.4 / 5.2, one CTA of 128 keys
 * 5.6 / 6.0): a window CTA sees about 9 tiles, too few for one CTA per SM to
 * hide its barrier and fetch. Rejected loops: the QK product of tile kt+1
 * overlapped with tile kt's softmax in one warpgroup (13.9 / 16.5 ms for the
 * compressed branch against 13.1 / 15.1, v5: the CTA barrier per tile
 * remained); a producer warpgroup with FA3's ping-pong (compiled, never run).
 */
inline bool attn_sm90_takes(int dqkp, int dvp)
{
    return (dqkp == 64 && dvp == 64) || (dqkp == 128 && dvp == 128) || (dqkp == 192 && dvp == 128);
}
inline AttnTile pick_attn_sm90(int mode, int dqkp, int dvp, int64_t limit)
{
    const AttnTile none = {0, 0, false, 1};
    if (!attn_sm90_takes(dqkp, dvp)) return none;
    const AttnTile t = mode == 0 ? AttnTile{128, 1, false, 1} : AttnTile{dqkp > 128 ? 32 : 64, 2, false, 1};
    return (int64_t)attn_sm90_smem(dqkp, dvp, t.bn) <= limit ? t : none;
}

/* ------------------------------------------------------------ block scores (+ top-n)
 * scores_sm80 (any G <= 128, mma.sync), scores_sm80_g16 (G = 16: one token per
 * warp, group sum by shuffles, no probability tile, two CTAs per SM),
 * scores_sm80_kq (G < 16: the same with 16 / gp tokens per warp) and
 * scores_sm90_g16 (G = 16: S^T = K Q^T on wgmma, K tiles through the TMA).
 * Each CTA keeps its tokens' score rows in shared memory where they fit
 * (then the top-n ranking runs in the same kernel: SCORES_TOPN), else in
 * global memory (the plan's scores buffer; SELECT_TOPN ranks them). */
struct ScoresTile {
    int bn;    /* compressed keys per K tile; 0: no tile fits */
    int nb;    /* K tile buffers */
    bool rows; /* the CTA's score rows fit in shared memory beside the tiles */
    bool ring; /* scores_sm80_kq's SCORES_TOPN: a ring of partial scores per token, ranked as tiles complete them */
};

inline size_t scores_rows_smem(int qt, int64_t max_ns) { return sizeof(float) * (size_t)qt * (size_t)max_ns; }

/* without the score rows: Q and two K tiles in padded rows, the probability
 * tile [BM][BN + 4] and the group sums [BM][BN] */
constexpr size_t scores_sm80_smem(int dqk, int bn)
{
    return 2 * (size_t)(TC_BM * (dqk + 8) + 2 * bn * (dqk + 8)) + sizeof(float) * (size_t)(TC_BM * (bn + 4) + TC_BM * bn);
}
/* The transposed kernels, S^T = K Q^T with 16 query rows per warp as the
 * MMA's columns: scores_sm80_g16 (G = 16, one token per warp) and
 * scores_sm80_kq (G < 16: the group padded to gp, a power of two, and 16 / gp
 * tokens per warp, so a CTA holds TC_BM / gp tokens). No probability tile.
 * Where Q fits in registers (padded Dqk <= 192; scores_sm80_kq needs it) the
 * Q tile is only a staging area for its fragments, so the K tiles, the group
 * sums of the CTA's tokens (rows of bn floats at G = 16, bn + 4 below: the
 * lanes of a quad write four tokens' sums at once) and the score rows (rows:
 * their bytes, 0 when they are in global memory) take its place afterwards;
 * K tiles in 128-byte-swizzled panels where Dqk is a multiple of 64 (+128 for
 * their alignment), else 16-byte-padded rows. */
constexpr bool scores_g16_qreg(int dqk) { return dqk <= 192; }
constexpr bool scores_g16_panel(int dqk) { return dqk % 64 == 0; }
constexpr int scores_kq_gp(int64_t G) { return G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : G <= 8 ? 8 : 16; }
constexpr int scores_kq_tokens(int64_t G) { return TC_BM / scores_kq_gp(G); }
constexpr int scores_kq_sumw(int gp, int bn) { return gp == 16 ? bn : bn + 4; }
constexpr size_t scores_sm80_kq_smem(int dqk, int bn, int nb, int gp, size_t rows)
{
    const size_t q = 2 * (size_t)TC_BM * (size_t)(dqk + 8);
    const size_t after = 2 * (size_t)nb * (size_t)bn * (size_t)(scores_g16_panel(dqk) ? dqk : dqk + 8) +
                         sizeof(float) * (size_t)(TC_BM / gp * scores_kq_sumw(gp, bn)) + rows;
    return 128 + (scores_g16_qreg(dqk) ? (q > after ? q : after) : q + after);
}
/* scores_sm80_kq's streaming ranking (topn.cuh, TopnStream): ring slots per
 * token, a power of two that holds the selection blocks one K tile of bn keys
 * touches (((bn - 1) d + l - 1) / l_s + 2 at most) and the span from the last
 * tile's first block to the token's own ((l + bn d) / l_s + 3 at most); and
 * the bytes of the tokens' states (n <= 32 kept keys each). */
inline int scores_kq_ring(int bn, int64_t l, int64_t d, int64_t ls)
{
    const int64_t need = (l + (int64_t)bn * d) / ls + 4;
    int rw = 2;
    while (rw < need) rw *= 2;
    return rw;
}
constexpr int scores_kq_ring_max_n = 32;
inline size_t scores_kq_ring_smem(int tokens, int rw, int64_t n)
{
    return (size_t)tokens * (4 * (size_t)rw + 8 * (size_t)n + 8 * 32 + 8 + 8);
}
constexpr size_t scores_sm80_g16_smem(int dqk, int bn, int nb, size_t rows)
{
    return scores_sm80_kq_smem(dqk, bn, nb, 16, rows);
}
/* 1 KB of swizzle alignment, Q and nb K tiles of 64 keys unpadded, two sums tiles [8][72] */
constexpr size_t scores_sm90_g16_smem(int dqk, int nb)
{
    return 1024 + 2 * (size_t)(TC_BM * dqk + nb * 64 * dqk) + sizeof(float) * (size_t)(2 * (TC_BM / 16) * 72);
}

/* scores_sm80 (gp 0) and the transposed kernels (gp: 16 for scores_sm80_g16,
 * scores_kq_gp(G) for scores_sm80_kq): BN 64 for Dqk <= 128, 32 for wider
 * heads, half that from Dqk 64 up where it does not fit. Where a CTA's rows
 * live, best first (rows: their bytes, scores_rows_smem; per_sm: the class's
 * shared memory per SM, 0: do not ask for two CTAs; ring: scores_sm80_kq's
 * streaming ranking where it may run, else NULL):
 *   1. whole rows in shared memory with two CTAs per SM (transposed kernels:
 *      G 7 at 64k, 16 tokens' rows of 64 KB: 8.06 ms for the stage);
 *   2. gp 4: rows in global memory (the plan's buffer, then topn) with two
 *      CTAs per SM (Hq 32 / Hkv 8 at 64k, H100: the forward 38.8 ms against
 *      40.2 with the ring, whose stage took 16.2 ms; 2026-12-06);
 *   2b. gp 8: the ring, two CTAs per SM if they fit (at G 7 it took 10.9
 *      against 8.06 for 1., so it only comes after; rows in global memory
 *      there cost 3.4 ms more than 1. at 64k, Hq 28 / Hkv 4);
 *   3. whole rows in shared memory, one CTA (the transposed kernels: rows in
 *      shared memory beat a larger K tile with rows in global memory; v2.0 of
 *      the G 16 kernel kept them in global memory and took 32 ms at 64k);
 *   4. rows in global memory (the plan's buffer, then topn): the general
 *      kernel keeps its larger tile so (G 4 at 64k: 83.0 ms against 84.3 for
 *      32-key tiles with the rows in shared memory, one run each).
 * The sm86 class needs the smaller tiles (the general kernel's probability
 * and sums tiles of 128 rows are 66 KB at BN 64). */
inline bool scores_sm80_takes(int dqkp) { return dqkp == 32 || dqkp == 64 || dqkp == 128 || dqkp == 192 || dqkp == 256; }
inline bool scores_sm80_kq_takes(int64_t G, int dqkp) { return G >= 1 && G < 16 && scores_sm80_takes(dqkp) && scores_g16_qreg(dqkp); }
struct ScoresRing { /* scores_sm80_kq ranking as it goes (SCORES_TOPN, 1 <= n <= 32) */
    int tokens;
    int64_t l, d, ls, n;
};
/* The ring where it has won: G 5..8 (2 tokens per warp). At G 4 (4 tokens per
 * warp) rows in global memory with two CTAs per SM beat it (the forward at
 * Hq 32 / Hkv 8, 64k: 38.8 against 40.2 ms); at G 1 (16 tokens per warp) its
 * per-tile ranking cost 7.43 ms against 4.62 for the stage at Hq = Hkv = 4. */
inline bool scores_kq_ring_pays(int gp) { return gp == 8; }
inline ScoresTile pick_scores_sm80(int gp, int dqkp, size_t rows, int64_t limit, int64_t per_sm,
                                   const ScoresRing *ring = nullptr)
{
    const ScoresTile none = {0, 0, false, false};
    if (!scores_sm80_takes(dqkp)) return none;
    const bool kq = gp > 0;
    const int first = dqkp > 128 ? 32 : 64, last = dqkp >= 64 ? first / 2 : first;
    /* the candidates, best first: two K buffers of each size, then (G16) one buffer of the smaller */
    const ScoresTile cand[3] = {{first, 2, true, false}, {last, 2, true, false}, {last, 1, true, false}};
    const int nc = gp == 16 ? 3 : 2;
    enum { NONE, ROWS, RING };
    /* bytes of a candidate with nothing, its whole rows or its ring beside the tiles */
    auto bytes = [&](const ScoresTile &t, int with) {
        const size_t r = with == RING ? scores_kq_ring_smem(ring->tokens, scores_kq_ring(t.bn, ring->l, ring->d, ring->ls),
                                                            ring->n)
                         : with == ROWS ? rows
                                        : 0;
        return (int64_t)(kq ? scores_sm80_kq_smem(dqkp, t.bn, t.nb, gp, r) : scores_sm80_smem(dqkp, t.bn) + r);
    };
    /* two CTAs per SM: each also holds its static shared memory and the runtime's 1 KB */
    auto two = [&](const ScoresTile &t, int with) { return 2 * (bytes(t, with) + SMEM_STATIC_MARGIN + 1024) <= per_sm; };
    if (kq && per_sm > 0)
        for (int i = 0; i < nc; i++)
            if (two(cand[i], ROWS)) return cand[i];
    if (kq && gp == 4 && per_sm > 0)
        for (int i = 0; i < nc; i++)
            if (two(cand[i], NONE)) return ScoresTile{cand[i].bn, cand[i].nb, false, false};
    if (kq && ring) {
        for (int i = 0; per_sm > 0 && i < nc; i++)
            if (two(cand[i], RING)) return ScoresTile{cand[i].bn, cand[i].nb, true, true};
        for (int i = 0; i < nc; i++)
            if (bytes(cand[i], RING) <= limit) return ScoresTile{cand[i].bn, cand[i].nb, true, true};
    }
    for (int i = 0; kq && i < nc; i++)
        if (bytes(cand[i], ROWS) <= limit) return cand[i];
    for (int i = 0; i < 2; i++)
        if (bytes(cand[i], NONE) <= limit) return ScoresTile{cand[i].bn, 2, bytes(cand[i], ROWS) <= limit, false};
    return none;
}
/* scores_sm90_g16, padded Dqk 64 / 128 / 192. Its score rows must be in shared
 * memory (rows: their bytes). Two K buffers at Dqk <= 128; one at 192, so
 * that two CTAs fit per SM (12.1 ms at 64k; two buffers, one CTA: 20.5). */
inline ScoresTile pick_scores_sm90_g16(int dqkp, size_t rows, int64_t limit)
{
    const ScoresTile none = {0, 0, false, false};
    if (dqkp != 64 && dqkp != 128 && dqkp != 192) return none;
    const ScoresTile t = {64, dqkp == 192 ? 1 : 2, true, false};
    return (int64_t)(scores_sm90_g16_smem(dqkp, t.nb) + rows) <= limit ? t : none;
}

/* ------------------------------------------------------------ selected attention
 * slc_sm80 (one CTA per token and 16 query heads, any G; 64-key sub-tiles
 * streamed by 4 warps) and slc_sm80_g16 (G = 16, l_s <= 64, n <= 32: the 8
 * tokens of a CTA fetch the blocks they all selected once, then each warp
 * streams its token's other blocks in 16-key chunks). */
constexpr int SLC_KB = 64;
inline size_t slc_sm80_smem(int dqkp, int dvp, int64_t n, int64_t ls)
{
    const int64_t nsubmax = n * ((ls + SLC_KB - 1) / SLC_KB);
    const size_t tiles = 2 * (size_t)(16 * (dqkp + 8) + 2 * SLC_KB * (dqkp + 8) + 2 * SLC_KB * (dvp + 8)) +
                         (size_t)nsubmax * (sizeof(int64_t) + sizeof(int));
    const size_t merge = 2 * (size_t)(16 * (dqkp + 8)) + sizeof(float) * (size_t)(192 + 64 * dvp);
    return merge > tiles ? merge : tiles;
}
inline bool slc_sm80_takes(int dqkp, int dvp) { return attn_sm80_takes(dqkp, dvp); }

struct SlcTile {
    bool ok;    /* a tile fits */
    bool panel; /* K/V in 128-byte-swizzled panels (dims multiples of 64), else 16-byte-padded rows */
    int ns;     /* chunk buffers per warp: 3 where they fit (panels only), else 2, else 1 */
};
constexpr int SFS_TOK = 8, SFS_KB = 64, SFS_CK = 16, SFS_MAXN = 32;
/* elements of a K or V tile of `rows` rows x d dims: panels are unpadded */
constexpr size_t sfs_tile_elems(bool panel, int d, int rows) { return (size_t)rows * (panel ? d : d + 8); }
/* the Q tile, phase 1's two K/V tiles and the warps' chunk buffers share one
 * region (each in turn); panels start on a 128-byte boundary (+128) */
constexpr size_t slc_sm80_g16_smem(int dqk, int dv, bool panel, int ns)
{
    const size_t q = 2 * (size_t)SFS_TOK * 16 * (dqk + 8);
    const size_t p1 = 2 * 2 * (sfs_tile_elems(panel, dqk, SFS_KB) + sfs_tile_elems(panel, dv, SFS_KB));
    const size_t p2 = 2 * (size_t)SFS_TOK * ns * (sfs_tile_elems(panel, dqk, SFS_CK) + sfs_tile_elems(panel, dv, SFS_CK));
    const size_t m = q > p1 ? q : p1;
    return (panel ? 128 : 0) + (m > p2 ? m : p2);
}
inline bool slc_sm80_g16_takes(int64_t G, int64_t ls, int64_t n, int dqkp, int dvp)
{
    return G == 16 && ls <= SFS_KB && n >= 1 && n <= SFS_MAXN && tc_pair_dims(dqkp, dvp);
}
/* Panels wherever the dims allow: 16-byte-padded rows made cp.async read 1.5
 * L2 sectors per data sector (slc_attn 19.3 -> 15.2 ms at D 128 in panels);
 * three chunk buffers where they fit (15.2 -> 14.9; three padded buffers,
 * when rows were padded, measured slower: 19.9 against 19.2), else two, else
 * one (the sm80 class at Dqk 192 and the sm86 class: each warp then waits for
 * its own chunk while the other seven compute; slc_sm80, the alternative,
 * took 46 ms at 64k there against 15-21 for this kernel on the H200). */
inline SlcTile pick_slc_sm80_g16(int64_t G, int64_t ls, int64_t n, int dqkp, int dvp, int64_t limit)
{
    SlcTile t = {false, dqkp % 64 == 0 && dvp % 64 == 0, 0};
    if (!slc_sm80_g16_takes(G, ls, n, dqkp, dvp)) return t;
    for (int ns = t.panel ? 3 : 2; ns >= 1 && !t.ok; ns--)
        if ((int64_t)slc_sm80_g16_smem(dqkp, dvp, t.panel, ns) <= limit) {
            t.ns = ns;
            t.ok = true;
        }
    return t;
}


/* slc_sm80_blk (block-major, any G <= 64): a CTA takes SBK_BM / G consecutive
 * entries of the selection's inverse map (each a (token, KV head, slot) that
 * selected one block) as SBK_BM rows of G heads each, fetches each block's
 * K/V once for its entries and writes their partial softmax states; a reduce
 * kernel merges a row's slots. Its shared memory: the Q rows and one K/V tile
 * of SBK_KB keys (52 KB at 128/128, 69 KB at 192/128: every class). */
constexpr int SBK_THREADS = 128, SBK_BM = 64, SBK_KB = 64, SBK_MIN_CTAS = 4;
/* Rejected: 128 rows and 8 warps per CTA, two CTAs per SM (same registers): with the early Q copies
 * still 5-10 % slower than 64 rows without them, G = 7, 4, 1, T = 8k to 64k (H100, 2026-12-06). */
/* Rejected: two or more 64-row chunks per CTA, the next chunk's Q copied during this one's tile
 * (dev/cuda/slc_blk_prefetch_v2.patch, slc_blk_chunks_v1.patch): 0-3 % slower (H100, 2026-12-06). */
constexpr size_t slc_sm80_blk_smem(int dqkp, int dvp)
{
    return 2 * ((size_t)(SBK_BM + SBK_KB) * (dqkp + 8) + (size_t)SBK_KB * (dvp + 8));
}
inline bool slc_sm80_blk_takes(int64_t G, int dqkp, int dvp)
{
    return G >= 1 && G <= SBK_BM && dvp <= 128 && attn_sm80_takes(dqkp, dvp);
}
/* slc_sm90_blk (the sm90 class): slc_sm80_blk's CTAs with both products on one
 * warpgroup's wgmma, Q and the K/V tile in 128-byte-swizzled panels (1 KB for
 * their alignment): 50 KB at 128/128, four CTAs per SM; 66 KB at 192/128. */
constexpr size_t slc_sm90_blk_smem(int dqkp, int dvp)
{
    return 1024 + 2 * ((size_t)(SBK_BM + SBK_KB) * dqkp + (size_t)SBK_KB * dvp);
}
inline bool slc_sm90_blk_takes(int64_t G, int dqkp, int dvp)
{
    return G >= 1 && G <= SBK_BM && attn_sm90_takes(dqkp, dvp);
}
/* Partial states of one pass (o_s / l_s in the 16-bit dtype, DV' columns, and
 * fp32 m, l per (token, head, slot): sbk_state_bytes(DV')) take at most
 * max_bytes of plan memory (default SBK_PASS_BYTES, NSA_CUDA_SLC_PASS_MAX); a
 * longer batch runs in passes of as many tokens as fit (and whose map entries
 * stay below 2^31), at least one (at 64k,
 * Hq 32, n 16, D 128: 8.9 GB in 9 passes). */
constexpr int64_t sbk_state_bytes(int dvp) { return (int64_t)dvp * 2 + 8; }
constexpr int64_t SBK_PASS_BYTES = (int64_t)1 << 30;
inline int64_t slc_sm80_blk_pass_tokens(int64_t T, int64_t Hq, int64_t n, int dvp, int64_t max_bytes)
{
    const int64_t per = Hq * n * sbk_state_bytes(dvp); /* bytes per token */
    int64_t tc = per > 0 ? max_bytes / per : T;
    /* a pass's map entries (tokens x Hkv x n <= tokens x Hq x n) are int32 lists and values */
    const int64_t ent_tokens = Hq * n > 0 ? (((int64_t)1 << 31) - 1) / (Hq * n) : T;
    if (tc > ent_tokens) tc = ent_tokens;
    if (tc < 1) tc = 1;
    return tc < T ? tc : T;
}

/* Rejected: token tiles walking the union of their blocks with the rows' states
 * in registers (dev/cuda/slc_union_v1.cu): 1.1-2x slower than slc_sm80_blk and
 * slc_sm80_g16 at T = 8k to 64k; warps idle at each block's barrier, masked rows. */

/* ------------------------------------------------------------ backward (bwd_sm80.cu)
 * Two kernels per branch on mma.sync, 4 warps each (every class):
 *   rows: 64 query rows per CTA (compressed, window: tokens x heads of one KV
 *         group, as the forward's tiles but 64 rows; selected: one warp per
 *         token and 16 heads), K/V in tiles of 32 keys (selected: 16-key
 *         chunks per warp), two buffers each: dq, dgate, delta.
 *   keys: 64 keys per CTA (a compressed / window key tile, or a selection
 *         block, 64 keys at a time), the query rows that read them in steps
 *         of 32, two buffers: dk, dv, each element summed by one thread.
 * The three kernels ask for the same shared memory: 256 (Dqk' + Dv' + 16)
 * bytes (86 KB at 192/128, 70 KB at 128/128), so every class takes them. */
constexpr int BWD_THREADS = 128, BWD_ROWS_BM = 64, BWD_ROWS_BN = 32, BWD_SLC_KC = 16, BWD_KEYS_BN = 64,
              BWD_KEYS_BM = 32;
constexpr size_t bwd_sm80_smem(int dqk, int dv)
{
    /* rows: Q, dO of 64 rows + two K/V tiles of 32; keys: K/V of 64 + two Q/dO steps of 32 (+ their
     * per-row values); selected rows: 4 warps x two K/V chunks of 16 */
    return 2 * (size_t)(BWD_ROWS_BM + 2 * BWD_ROWS_BN) * (size_t)(dqk + 8 + dv + 8) + 2 * BWD_KEYS_BM * 24;
}
/* The selected rows kernel (one sweep, two dq accumulators): warps per CTA and its shared memory,
 * each warp's two K/V chunks of 16 keys and, at Dqk 192 (Q and dO read from shared memory), its
 * 16 Q and dO rows. 3 warps at Dqk 192 (97 KB; 4 would pass the sm86 class's 99 KB), 4 below. */
constexpr int bwd_slc_rows_warps(int dqk) { return dqk > 128 ? 3 : 4; }
constexpr size_t bwd_slc_rows_smem(int dqk, int dv)
{
    return (size_t)bwd_slc_rows_warps(dqk) * 2 *
           (2 * BWD_SLC_KC * (size_t)(dqk + 8 + dv + 8) + (dqk > 128 ? 16 * (size_t)(dqk + 8 + dv + 8) : 0));
}
static_assert(bwd_slc_rows_smem(128, 128) <= bwd_sm80_smem(128, 128) &&
                  bwd_slc_rows_smem(64, 64) <= bwd_sm80_smem(64, 64) && bwd_slc_rows_smem(32, 32) <= bwd_sm80_smem(32, 32),
              "the selected rows kernel fits where the other backward kernels do");
/* The selected rows kernel for a group of G heads: 16 rows (bwd_rows_slc_sm80_kernel, G > 8: the
 * group in chunks of 16 heads) or 8 (bwd_rows_slc8_sm80_kernel, G <= 8: keys on the MMA's M side,
 * the heads on its N side, so a group pads to 8 rows instead of 16: half the MMAs). The 8-row
 * kernel's CTA: 4 warps, each with two K/V chunks of 16 keys (Q and dO in registers at every Dqk):
 * 86 KB at 192/128, 70 KB at 128/128. */
constexpr int BWD_SLC8_WARPS = 4;
constexpr int bwd_slc_rows(int64_t G) { return G <= 8 ? 8 : 16; }
constexpr size_t bwd_slc8_rows_smem(int dqk, int dv)
{
    return (size_t)BWD_SLC8_WARPS * 2 * (2 * BWD_SLC_KC * (size_t)(dqk + 8 + dv + 8));
}
/* Steps of BWD_KEYS_BM rows that `readers` tokens x G heads take in the keys kernel. */
NSA_HD int64_t bwd_steps(int64_t readers, int64_t G) { return (readers * G + BWD_KEYS_BM - 1) / BWD_KEYS_BM; }
/* A reader list longer than cs steps is split into ceil(steps / cs) chunks; cs is
 * chosen so that a plan's items make about BWD_CHUNK_TARGET chunks (never fewer
 * than BWD_CHUNK_MIN steps each). The first compressed tiles and the forced
 * selection blocks are read by every later token, 32x the average at 64k. The
 * floor is low (16 steps, 512 rows) so that the parity corpus's longer cases
 * split too and the chunked path is checked there; the scratch stays bounded
 * (test_cuda_choose), since cs >= est / BWD_CHUNK_TARGET wherever it matters. */
constexpr int64_t BWD_CHUNK_TARGET = 1024, BWD_CHUNK_MIN = 16;
inline int64_t bwd_chunk_steps(int64_t total_steps, int64_t target)
{
    const int64_t t = target > 0 ? target : 1, cs = (total_steps + t - 1) / t;
    return cs > BWD_CHUNK_MIN ? cs : BWD_CHUNK_MIN;
}
/* The selected branch's chunks are counted on the device from the inverse map;
 * the plan sizes the grid and the scratch for any counts of `entries` (T Hkv n)
 * map entries over `items` items (KV heads x batch blocks x nsub 64-key
 * sub-tiles, each counting its whole block's readers). Every item's steps are
 * <= cnt G / BM + 1 and sum to at most est = entries G nsub / BM + items, so
 * sum ceil(steps / cs) <= est / cs + items (grid), and an item split into
 * n > 1 chunks has steps > (n - 1) cs >= n cs / 2, so the split items' chunks
 * (scratch slots) sum to at most 2 est / cs. test_cuda_choose checks both on
 * adversarial counts. */
struct BwdSlcChunks {
    int64_t cs, grid, slots;
};
inline BwdSlcChunks bwd_slc_chunks(int64_t entries, int64_t G, int64_t items, int64_t nsub)
{
    const double est = (double)entries * (double)G * (double)nsub / BWD_KEYS_BM + (double)items;
    BwdSlcChunks c;
    c.cs = bwd_chunk_steps((int64_t)est + 1, BWD_CHUNK_TARGET);
    c.grid = (int64_t)(est / (double)c.cs) + items + 1;
    c.slots = (int64_t)(2.0 * est / (double)c.cs) + 2;
    return c;
}
inline bool bwd_sm80_takes(int dqkp, int dvp, int64_t limit)
{
    return tc_pair_dims(dqkp, dvp) && (int64_t)bwd_sm80_smem(dqkp, dvp) <= limit &&
           (int64_t)bwd_slc_rows_smem(dqkp, dvp) <= limit && (int64_t)bwd_slc8_rows_smem(dqkp, dvp) <= limit;
}
/* bwd_keys_sm90.cu (the compressed and window keys kernel on wgmma, class
 * sm90): one warpgroup of 64 keys, Q / dO steps of 64 rows (32 at Dqk 192),
 * 128-byte-swizzled panels of 64 dims, so the padded dims 64/64, 128/128 and
 * 192/128 (32 is narrower than a panel: bwd_sm80 keeps it). */
constexpr bool keys90_dims(int dqkp, int dvp)
{
    return (dqkp == dvp && (dqkp == 64 || dqkp == 128)) || (dqkp == 192 && dvp == 128);
}
constexpr size_t bwd_keys90_smem(int dqkp, int dvp)
{
    /* 1 KB for the swizzle atoms' alignment; K, V of 64 keys; two steps of Q, dO; per row of a step: token, lse,
     * gate, delta */
    return 1024 + 2 * (size_t)BWD_KEYS_BN * (size_t)(dqkp + dvp) +
           2 * 2 * (size_t)(dqkp > 128 ? 32 : 64) * (size_t)(dqkp + dvp) + 2 * (size_t)(dqkp > 128 ? 32 : 64) * 20;
}
/* bwd_rows_sm90.cu: Q and dO of the 64-row tile, two K/V tiles of 64 keys (32 at Dqk 192) */
constexpr size_t bwd_rows90_smem(int dqkp, int dvp)
{
    return 1024 + 2 * (size_t)BWD_ROWS_BM * (size_t)(dqkp + dvp) + 2 * 2 * (size_t)(dqkp > 128 ? 32 : 64) * (size_t)(dqkp + dvp);
}
inline bool bwd_sm90_takes(int dqkp, int dvp, int64_t limit)
{
    return keys90_dims(dqkp, dvp) && (int64_t)bwd_keys90_smem(dqkp, dvp) <= limit &&
           (int64_t)bwd_rows90_smem(dqkp, dvp) <= limit && bwd_sm80_takes(dqkp, dvp, limit);
}

} // namespace nsa_cuda

#endif
