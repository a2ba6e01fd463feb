/*
 * scores_map.cuh -- the overlap map of BLOCK_SCORES (semantics section 3) for
 * the tiled scores kernels (scores_sm80.cu, scores_sm90.cu): a K tile of BN
 * compressed blocks starting at key ks = kt * BN, whose group sums p[i]
 * (i < BN, 0 for blocks a token does not see) are added onto the selection
 * blocks they overlap,
 *     row[j] += sum_i overlap(ks + i, j) / d * p[i].
 *
 * MapTab (v4): when BN * d is a multiple of l_s, every K tile starts on a
 * selection-block boundary (ks * d = jlo * l_s), so entry e (= j - jlo) of
 * any tile reads the same tile columns with the same weights: f[e] first
 * column, n[e] count, w[e][*] the weights overlap / d, computed exactly as
 * overlap_entry_sum computes them. Columns past a token's nc (or past khi)
 * hold p = 0, so the table need not clip there: adding w * 0 leaves the sum
 * bitwise unchanged. Without the table each entry costs two 64-bit divisions
 * and a float division per compressed block.
 */
#ifndef NSA_KERNELS_CUDA_SCORES_MAP_CUH
#define NSA_KERNELS_CUDA_SCORES_MAP_CUH

#include "nsa_cuda.cuh"
#include "nsa_cuda_kernels.h"

namespace nsa_cuda {

/* MAP_WS: an entry's weights' stride, odd so that lanes reading the same weight of
 * different entries hit different banks (at 8 the entries e, e + 4, ... of a round shared
 * a bank: up to 5-way conflicts at the paper's 17 entries) */
constexpr int MAP_E = 48, MAP_I = 8, MAP_WS = MAP_I + 1;

struct MapTab { /* lives in shared memory */
    float w[MAP_E * MAP_WS];
    int f[MAP_E], n[MAP_E];
};

/* Entries of a periodic tile of BN keys, or 0 where the table does not apply
 * (then map_tile_row takes the arithmetic path). Uniform over the CTA. */
NSA_DEV int map_tab_entries(const Geom &g, int BN)
{
    const int64_t ne = ((int64_t)(BN - 1) * g.d + g.l - 1) / g.ls + 1;
    const bool ok = ((int64_t)BN * g.d) % g.ls == 0 && ne <= MAP_E && (g.ls + g.l - 2) / g.d + 2 <= MAP_I;
    return ok ? (int)ne : 0;
}

/* Threads 0 .. ne-1 fill the table (a barrier must follow before it is read).
 * The tile rows that overlap entry j = tid are one run, from the first to the
 * last compressed block overlapping j (nsa_blocks.h), so only that run is
 * tried: at most MAP_I rows instead of all BN. (v8: the loop over all 64 rows
 * is a chain of ~2000 dependent instructions on warp 0 that every CTA's
 * first barrier waits for; ncu put a fifth of scores_sm90's stall samples at
 * that barrier, T = 32k.) Same rows, order and weights as the loop over every
 * row (checked for every l, d, l_s with l, l_s multiples of d up to 128 / 256
 * and BN = 32, 64, 128 where the table applies). */
NSA_DEV void map_tab_build(MapTab &t, const Geom &g, int BN, int ne, int tid)
{
    if (tid >= ne) return;
    const int64_t r0 = nsa_max64(nsa_cmp_first_overlapping(tid, g.l, g.d, g.ls), 0);
    const int64_t r1 = nsa_min64(nsa_cmp_last_overlapping(tid, g.ls, g.d), BN - 1);
    int f = -1, n = 0;
    for (int64_t r = r0; r <= r1 && n < MAP_I; r++) {
        const int64_t ov = nsa_overlap(r, tid, g.l, g.d, g.ls);
        if (ov > 0) {
            if (f < 0) f = (int)r;
            t.w[tid * MAP_WS + n++] = (float)ov / (float)g.d;
        }
    }
    t.f[tid] = f < 0 ? 0 : f;
    t.n[tid] = n;
}

/* Entry j (selection block) of the tile starting at ks, the arithmetic way,
 * for a token that sees nc compressed blocks; false when no visible block of
 * the tile overlaps j. */
NSA_DEV bool overlap_entry_sum(const Geom &g, int64_t j, int64_t ks, int BN, int64_t nc, const float *p, float &acc)
{
    const int64_t i0 = nsa_max64(nsa_cmp_first_overlapping(j, g.l, g.d, g.ls), ks);
    const int64_t i1 = nsa_min64(nsa_min64(nsa_cmp_last_overlapping(j, g.ls, g.d), ks + BN - 1), nc - 1);
    if (i0 > i1) return false;
    acc = 0.f;
    for (int64_t i = i0; i <= i1; i++) acc += (float)nsa_overlap(i, j, g.l, g.d, g.ls) / (float)g.d * p[i - ks];
    return true;
}

/* One warp adds K tile kt's map for TPW tokens (at most; ntok of them
 * present) into their score rows: token x sees nc[x] compressed blocks, its
 * BN group sums are p + x * pst and its row is row + x * rst, entry j at
 * j & rmask (-1: the whole row; a ring's width - 1); khi: the last
 * key the CTA's tokens see; per: BN * d / l_s, the selection blocks a
 * periodic tile advances by. The lanes take (token, entry) pairs. A token
 * that sees no key of the tile is skipped: its sums there are 0, and adding
 * 0 leaves its row bitwise unchanged.
 *
 * Carry (car set; rows in global memory): a whole periodic tile's entries
 * e < per are complete once this tile has added to them (the next tile starts
 * at selection block (kt + 1) per), so they are stored, not read, added and
 * written back; the ne - per <= MAP_CARRY entries the next tile shares stay
 * in car (shared memory, [2][tokens][MAP_CARRY], the half kt & 1 written and
 * the other read) and join that tile's own sums there: carry + acc, the same
 * additions in the same order as row = (0 + carry) + acc. Every token takes
 * part (a token that sees none of the tile has p = 0 there: acc = 0), so the
 * carry is never dropped. A tile that is not a whole periodic one first
 * stores the pending carry (map_tile_carry_flush) and adds as before; the
 * caller flushes after the last tile. */
constexpr int MAP_CARRY = 2;
NSA_DEV bool map_carry_ok(int ne, int64_t per) { return ne > 0 && ne - per >= 0 && ne - per <= MAP_CARRY && ne - per <= per; }
/* the half of car tile kt writes (the other one holds tile kt - 1's carry) */
NSA_DEV float *map_carry_half(float *car, int64_t kt) { return car + (kt & 1) * TC_BM * MAP_CARRY; }

/* The carry the whole periodic tile kt - 1 left into its entries' places in
 * the rows (which hold 0 there): before a tile that is not a whole periodic
 * one (map_tile_rows), and after the last tile. A __syncwarp must follow
 * before the lanes read those rows. */
NSA_DEV void map_tile_carry_flush(int ne, int64_t per, int64_t kt, int ntok, float *car, float *row, int64_t rst,
                                  int lane)
{
    const int nshare = ne - (int)per;
    const float *cin = map_carry_half(car, kt + 1);
    for (int x = lane; x < ntok * nshare; x += 32) {
        const int tok = x / nshare, e = x % nshare;
        row[tok * rst + kt * per + e] = cin[tok * MAP_CARRY + e];
    }
}

/* K tile kt is a whole periodic one (the table applies and every key of it lies at or
 * below khi) */
NSA_DEV bool map_tile_whole(int ne, int64_t kt, int BN, int64_t khi) { return ne > 0 && kt * BN + BN - 1 <= khi; }

/* Rejected: the lanes over entries rather than (token, entry) pairs with the carry, the shared
 * entry rebuilt from the tile's last two group sums (dev/cuda/scores_map_rounds_v2.patch): bitwise
 * the same and 2 rounds instead of 3 at G 4, but no faster (3 % slower at G 1; H100, 2026-12-07). */
template <int TPW>
NSA_DEV void map_tile_rows(const Geom &g, const MapTab &t, int ne, int64_t per, int BN, int64_t kt, int64_t khi,
                           int ntok, const int64_t *nc, const float *p, int pst, float *row, int64_t rst,
                           int64_t rmask, int lane, float *car = nullptr)
{
    const int64_t ks = kt * BN;
    int64_t jlo;
    int nj;
    const bool whole = map_tile_whole(ne, kt, BN, khi);
    if (whole) { /* a whole periodic tile: no divisions */
        jlo = kt * per;
        nj = ne;
    } else {
        const int64_t last = nsa_min64(ks + BN - 1, khi);
        jlo = nsa_slc_first_overlapped(ks, g.d, g.ls);
        nj = (int)(nsa_slc_last_overlapped(last, g.l, g.d, g.ls) - jlo + 1);
    }
    if (car && !whole && kt > 0) { /* a partial last tile: the previous (whole) tile's carry into the rows first */
        map_tile_carry_flush(ne, per, kt, ntok, car, row, rst, lane);
        __syncwarp();
    }
    const bool carry = car != nullptr && whole;
    const int nshare = ne - (int)per;
    const float *cin = carry ? map_carry_half(car, kt + 1) : nullptr;
    float *cout = carry ? map_carry_half(car, kt) : nullptr;
    /* the lane's pair (tok, e) = (x / nj, x % nj), stepped with x by 32 (32 = sq nj + sr): two
     * divisions per call instead of one per pair */
    const int dj = TPW == 1 || nj < 1 ? 1 : nj;
    const int sq = 32 / dj, sr = 32 - sq * dj;
    int xt = TPW == 1 ? 0 : lane / dj, xe = TPW == 1 ? lane : lane - xt * dj;
    for (int x = lane; x < (TPW == 1 ? nj : ntok * nj); x += 32) {
        const int tok = xt, e = xe;
        if (TPW == 1) {
            xe += 32;
        } else {
            xt += sq;
            xe += sr;
            if (xe >= dj) {
                xe -= dj;
                xt++;
            }
        }
        if (!carry && ks >= nc[tok]) continue;
        const float *pt = p + tok * pst;
        float *r = row + tok * rst;
        if (ne > 0) {
            const float *w = t.w + e * MAP_WS, *cc = pt + t.f[e];
            const int n = t.n[e];
            float acc = 0.f;
            if (n <= 5) { /* the paper's l, d, l_s: 5 or fewer, unrolled and predicated (the loop's
                             remainder branches were a third of a pair's instructions) */
#pragma unroll
                for (int k = 0; k < 5; k++)
                    if (k < n) acc = fmaf(w[k], cc[k], acc);
            } else {
                for (int k = 0; k < n; k++) acc = fmaf(w[k], cc[k], acc);
            }
            if (carry) {
                if (e < nshare) acc = (kt > 0 ? cin[tok * MAP_CARRY + e] : 0.f) + acc;
                if (e >= per)
                    cout[tok * MAP_CARRY + e - per] = acc;
                else
                    r[jlo + e] = acc;
            } else {
                r[(jlo + e) & rmask] += acc;
            }
        } else {
            float acc;
            if (overlap_entry_sum(g, jlo + e, ks, BN, nc[tok], pt, acc)) r[(jlo + e) & rmask] += acc;
        }
    }
}

/* The same for one token (nc visible blocks; p its BN group sums). */
NSA_DEV void map_tile_row(const Geom &g, const MapTab &t, int ne, int64_t per, int BN, int64_t kt, int64_t khi,
                          int64_t nc, const float *p, float *row, int lane)
{
    map_tile_rows<1>(g, t, ne, per, BN, kt, khi, 1, &nc, p, 0, row, 0, -1, lane);
}

/* The CTA's score rows (sAcc, row stride accw) out to the scores buffer, token
 * tok's row at dst + tok * sst: the eligible entries j <= floor(t / l_s) only;
 * width is the last token's count of them. */
NSA_DEV void store_score_rows(const Geom &g, const float *sAcc, int accw, float *dst, int64_t sst, int ntok,
                              int64_t tl0, int64_t width, int tid, int nt)
{
    for (int64_t e = tid; e < (int64_t)ntok * width; e += nt) {
        const int tok = (int)(e / width);
        const int64_t j = e % width;
        if (j <= nsa_slc_last(tl0 + tok, g.ls)) dst[tok * sst + j] = sAcc[tok * accw + j];
    }
}

} // namespace nsa_cuda

#endif
