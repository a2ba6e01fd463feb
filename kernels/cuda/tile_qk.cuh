/*
 * tile_qk.cuh -- the pieces the tensor-core kernels (attn_sm80.cu,
 * attn_sm90.cu, scores_sm80.cu, scores_sm90.cu, slc_sm80.cu, slc_sm80_g16.cu)
 * share: how a CTA's 128 rows map to (token, head), the per-row visible key
 * range, one warp's S = Q K^T on a shared-memory K tile with mma.sync
 * m16n8k16, the softmax step, the masks and epilogue of the compressed /
 * window kernels, and the host-side launch helpers.
 *
 * Row mapping (attn, scores): a CTA owns `ntok` consecutive tokens of one
 * sequence and `hca` query heads of one KV group, head fastest:
 *   row r -> token t0 + r / hca, head h0 + r % hca      (r < ntok * hca)
 * With G = 16 that is 8 tokens x 16 heads: one fetch of each K/V tile serves
 * all 16 heads of the group and 8 neighbouring tokens (whose visible ranges
 * differ by at most a few keys). Rows past ntok*hca are padding: their key
 * range is empty and they are never stored.
 */
#ifndef NSA_KERNELS_CUDA_TILE_QK_CUH
#define NSA_KERNELS_CUDA_TILE_QK_CUH

#include "nsa_cuda.cuh"
#include "nsa_cuda_kernels.h"

namespace nsa_cuda {

struct TileCtx {
    int64_t t0, seq, s0, tl0; /* first global token, its sequence, sequence start, first local position */
    int ntok, hca, nrows;
    int64_t gi, h0; /* KV group, first query head */
};

NSA_DEV TileCtx tile_ctx(const Geom &g, const Tiles &tl)
{
    TileCtx c;
    const int64_t *tp = tl.tiles + 3 * (int64_t)blockIdx.x;
    c.t0 = tp[0];
    c.ntok = (int)tp[1];
    c.seq = tp[2];
    c.s0 = g.cu_seqlens[c.seq];
    c.tl0 = c.t0 - c.s0;
    c.gi = blockIdx.y / tl.nchunk;
    const int64_t chunk = blockIdx.y % tl.nchunk;
    c.h0 = c.gi * g.G + chunk * tl.hc;
    c.hca = (int)nsa_min64(tl.hc, g.G - chunk * tl.hc);
    c.nrows = c.ntok * c.hca;
    return c;
}

/* Visible key range [lo, hi] of local query position tq.
 * MODE 0: compressed blocks [0, nc(tq) - 1]; MODE 2: window [max(0, tq-w+1), tq]. */
template <int MODE> NSA_DEV void row_range(const Geom &g, int64_t tq, int64_t &lo, int64_t &hi)
{
    if (MODE == 0) {
        lo = 0;
        hi = nsa_cmp_visible(tq, g.l, g.d) - 1;
    } else {
        lo = nsa_win_start(tq, g.w);
        hi = tq;
    }
}

/* The keys a compressed / window tile reads: [klo, khi] is the union of its
 * rows' visible ranges (rows are token-major and the ranges grow with the
 * token), kbase the first key row of its sequence in k / v. */
template <int MODE> NSA_DEV void tile_keys(const Geom &g, const TileCtx &c, int64_t &klo, int64_t &khi, int64_t &kbase)
{
    const int64_t tlast = c.tl0 + c.ntok - 1;
    int64_t tmp;
    row_range<MODE>(g, c.tl0, klo, tmp);
    row_range<MODE>(g, tlast, tmp, khi);
    kbase = MODE == 0 ? g.cu_cmp[c.seq] : c.s0;
}

NSA_DEV int64_t warp_min64(int64_t v)
{
    for (int o = 16; o > 0; o >>= 1) {
        const int64_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    return v;
}
NSA_DEV int64_t warp_max64(int64_t v)
{
    for (int o = 16; o > 0; o >>= 1) {
        const int64_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* Q fragments of the warp's 16 rows (row-major, stride SQ) for k-step kk. */
template <int SQ> NSA_DEV void q_frag(uint32_t a[4], const void *sQw, int kk, int lane)
{
    const unsigned short *p = (const unsigned short *)sQw;
    ldsm_x4(a, p + (lane & 15) * SQ + kk * 16 + (lane >> 4) * 8);
}

/* All of a warp's Q fragments in registers when QREG (else warp_qk reads them
 * from shared memory itself); NK = DQK / 16, or 1 when !QREG. */
template <int SQ, bool QREG, int NK> NSA_DEV void q_frags(uint32_t (&qf)[NK][4], const void *sQw, int lane)
{
    if (QREG) {
#pragma unroll
        for (int kk = 0; kk < NK; kk++) q_frag<SQ>(qf[kk], sQw, kk, lane);
    }
}

/* Shared-memory layouts of a 16-bit K or V tile of ROWS rows x D dims: off(r, e)
 * is the element offset of row r's dims e .. e + 7 (e a multiple of 8: one
 * 16-byte chunk), elems the tile's size in elements.
 * PadTile: rows of SS elements (the dims plus a 16-byte pad, so that the 8 rows
 * of an ldmatrix fall in 8 bank groups).
 * PanelTile: the 128-byte-swizzled panels of wgmma.cuh (sw128_off): dims in
 * panels of 64, chunk c of row r at (c % 8) ^ (r % 8) in its 128-byte row,
 * which spreads an ldmatrix's 8 rows over the bank groups too. cp.async
 * reads a 32-byte L2 sector twice when its shared-memory destination
 * straddles a 32-byte boundary, so copies into PadTile rows read 1.5 sectors
 * per sector of data and copies into panels 1.0 (docs/cuda.md;
 * dev/cuda/ldgsts_l2.cu measured it). attn_sm90, scores_sm90 and slc_sm80_g16
 * (where the dims are multiples of 64) use panels. */
/* rstep(k): the offset of row r + k from row r's, where the layout makes it a
 * constant (0 where it does not) */
template <int SS, int ROWS> struct PadTile {
    static constexpr int elems = ROWS * SS;
    static constexpr int rstep(int k) { return k * SS; }
    static NSA_DEV int off(int r, int e) { return r * SS + e; }
};
template <int D, int ROWS> struct PanelTile {
    static_assert(D % 64 == 0, "PanelTile: dims in panels of 64");
    static constexpr int elems = ROWS * D;
    static constexpr int rstep(int k) { return k % 8 == 0 ? k * 64 : 0; }
    static NSA_DEV int off(int r, int e) { return (e >> 6) * ROWS * 64 + r * 64 + ((((e >> 3) & 7) ^ (r & 7)) << 3); }
};

/* s[NB8][4] += Q(16 x DQK) K^T for keys [key0, key0 + NB8*8) of the K tile
 * (row-major [key][dim] in layout L; key0 % 8 == 0). qf holds the Q fragments
 * when QREG (the Q tile is row-major with stride SQ). */
template <typename T, int DQK, int NB8, int SQ, bool QREG, typename L>
NSA_DEV void warp_qk_l(float (*s)[4], const uint32_t (*qf)[4], const T *sQw, const T *sK, int key0, int lane)
{
#pragma unroll
    for (int kk = 0; kk < DQK / 16; kk++) {
        uint32_t a[4];
        if (QREG) {
            a[0] = qf[kk][0];
            a[1] = qf[kk][1];
            a[2] = qf[kk][2];
            a[3] = qf[kk][3];
        } else {
            q_frag<SQ>(a, sQw, kk, lane);
        }
#pragma unroll
        for (int nb = 0; nb < NB8 / 2; nb++) {
            uint32_t b[4];
            ldsm_x4(b, sK + L::off(key0 + nb * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 16 + (((lane >> 3) & 1) << 3)));
            Mma<T>::run(s[2 * nb], a, b[0], b[1]);
            Mma<T>::run(s[2 * nb + 1], a, b[2], b[3]);
        }
    }
}
/* the K tile row-major with stride SQ (PadTile) */
template <typename T, int DQK, int NB8, int SQ, bool QREG>
NSA_DEV void warp_qk(float (*s)[4], const uint32_t (*qf)[4], const T *sQw, const T *sK, int key0, int lane)
{
    warp_qk_l<T, DQK, NB8, SQ, QREG, PadTile<SQ, 0>>(s, qf, sQw, sK, key0, lane);
}

/* The same for RW 16-row blocks of one warp (rows h*16 .. h*16 + 15 of sQw for
 * block h), the K tile row-major with stride SQ: each K fragment loaded feeds
 * RW MMAs (attn_sm80's r32 tile, RW 2). */
template <typename T, int DQK, int NB8, int SQ, int RW>
NSA_DEV void warp_qk_rw(float (&s)[RW][NB8][4], const T *sQw, const T *sK, int lane)
{
#pragma unroll
    for (int kk = 0; kk < DQK / 16; kk++) {
        uint32_t a[RW][4];
#pragma unroll
        for (int h = 0; h < RW; h++) q_frag<SQ>(a[h], sQw + h * 16 * SQ, kk, lane);
#pragma unroll
        for (int nb = 0; nb < NB8 / 2; nb++) {
            uint32_t b[4];
            ldsm_x4(b, sK + (nb * 16 + (lane & 7) + ((lane >> 4) << 3)) * SQ + kk * 16 + (((lane >> 3) & 1) << 3));
#pragma unroll
            for (int h = 0; h < RW; h++) {
                Mma<T>::run(s[h][2 * nb], a[h], b[0], b[1]);
                Mma<T>::run(s[h][2 * nb + 1], a[h], b[2], b[3]);
            }
        }
    }
}

/* o[DV/8][4] += P(16 x 16*KS) V for keys [key0, key0 + 16*KS) of the V tile
 * (row-major [key][dim] in layout L); p holds the probabilities as C fragments
 * of 2*KS n-tiles, rounded to the 16-bit type for the MMA (as FlashAttention
 * does; the row sums that normalise o use the fp32 values). v2.2 split P into
 * hi + lo (two MMAs) to pass a tolerance measured against the RMS of o; the
 * rounding error scales with |V|, and the testkit now says so (compare.c). */
template <typename T, int DV, int KS, typename L>
NSA_DEV void warp_pv_l(float (*o)[4], float (*p)[4], const T *sV, int key0, int lane)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t a[4];
        a[0] = Mma<T>::pack(p[2 * kk][0], p[2 * kk][1]);
        a[1] = Mma<T>::pack(p[2 * kk][2], p[2 * kk][3]);
        a[2] = Mma<T>::pack(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        a[3] = Mma<T>::pack(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
        for (int nb = 0; nb < DV / 16; nb++) {
            uint32_t b[4];
            ldsm_x4_t(b, sV + L::off(key0 + kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), nb * 16 + ((lane >> 4) << 3)));
            Mma<T>::run(o[2 * nb], a, b[0], b[1]);
            Mma<T>::run(o[2 * nb + 1], a, b[2], b[3]);
        }
    }
}
/* the V tile row-major with stride SV (PadTile) */
template <typename T, int DV, int KS, int SV>
NSA_DEV void warp_pv(float (*o)[4], float (*p)[4], const T *sV, int key0, int lane)
{
    warp_pv_l<T, DV, KS, PadTile<SV, 0>>(o, p, sV, key0, lane);
}

/* The same for RW 16-row blocks of one warp, the V tile row-major with
 * stride SV: each V fragment loaded feeds RW MMAs. */
template <typename T, int DV, int KS, int SV, int RW>
NSA_DEV void warp_pv_rw(float (&o)[RW][DV / 8][4], float (&p)[RW][2 * KS][4], const T *sV, int lane)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t a[RW][4];
#pragma unroll
        for (int h = 0; h < RW; h++) {
            a[h][0] = Mma<T>::pack(p[h][2 * kk][0], p[h][2 * kk][1]);
            a[h][1] = Mma<T>::pack(p[h][2 * kk][2], p[h][2 * kk][3]);
            a[h][2] = Mma<T>::pack(p[h][2 * kk + 1][0], p[h][2 * kk + 1][1]);
            a[h][3] = Mma<T>::pack(p[h][2 * kk + 1][2], p[h][2 * kk + 1][3]);
        }
#pragma unroll
        for (int nb = 0; nb < DV / 16; nb++) {
            uint32_t b[4];
            ldsm_x4_t(b, sV + (kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3)) * SV + nb * 16 + ((lane >> 4) << 3));
#pragma unroll
            for (int h = 0; h < RW; h++) {
                Mma<T>::run(o[h][2 * nb], a[h], b[0], b[1]);
                Mma<T>::run(o[h][2 * nb + 1], a[h], b[2], b[3]);
            }
        }
    }
}

/* Is a 16-bit tensor [*, *, D] at p with strides st, sh loadable with 16-byte copies? */
inline bool vec_ok(const void *p, int64_t st, int64_t sh, int64_t D)
{
    return ((uintptr_t)p % 16) == 0 && st % 8 == 0 && sh % 8 == 0 && D % 8 == 0;
}

/* A warp's softmax state for its 16 rows: output accumulator (Dv/8 column
 * groups), reference maxima and row sums (rows lane/4 and lane/4 + 8). */
template <int NO> NSA_DEV void warp_state_init(float (&oacc)[NO][4], float (&m)[2], float (&ls)[2])
{
#pragma unroll
    for (int j = 0; j < NO; j++) oacc[j][0] = oacc[j][1] = oacc[j][2] = oacc[j][3] = 0.f;
    m[0] = m[1] = -INFINITY;
    ls[0] = ls[1] = 0.f;
}

/* Per-row maxima of an unmasked S fragment (this thread's columns). */
template <int NJ> NSA_DEV void warp_rows_max(const float (&s)[NJ][4], float (&mx)[2])
{
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
}

/* Keys of a tile (NJ * 8 of them, from key 0) at or past vis get -inf, and mx
 * gets the rows' maxima over this thread's columns (slc_sm80_g16). */
template <int NJ> NSA_DEV void warp_mask_keys(float (&s)[NJ][4], int vis, int lane, float (&mx)[2])
{
    mx[0] = mx[1] = -INFINITY;
    if (vis >= NJ * 8) {
        warp_rows_max(s, mx);
        return;
    }
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = j * 8 + 2 * (lane & 3) + (e & 1);
            const float x = key < vis ? s[j][e] : -INFINITY;
            s[j][e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
}

/* Completes the row sums over the quad (the 4 lanes of a row) and stores row
 * i's normalised output (fp32, the first dv columns) at orow(i) and its LSE
 * (natural log) at lsep(i) when that is not NULL; orow(i) == NULL skips row i.
 * With z.gs.p set (SLC_COMBINE) orow(i) is the row's o_cmp and each element is
 * added into it with the row's gates, gates(i) (slc_store). */
template <int NO, typename RowFn, typename LseFn, typename GateFn>
NSA_DEV void warp_store_rows(const float (&oacc)[NO][4], const float (&m)[2], float (&ls)[2], int64_t dv, int lane,
                             RowFn orow, LseFn lsep, const SlcSum &z, GateFn gates)
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 1);
        ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 2);
        float *row = orow(i);
        if (!row) continue;
        const float inv = ls[i] != 0.f ? 1.0f / ls[i] : 0.f;
        const float2 gw = gates(i);
#pragma unroll
        for (int j = 0; j < NO; j++) {
            const int col = j * 8 + 2 * (lane & 3);
            if (col < dv) slc_store(z, gw, row + col, oacc[j][2 * i] * inv);
            if (col + 1 < dv) slc_store(z, gw, row + col + 1, oacc[j][2 * i + 1] * inv);
        }
        float *lp = lsep(i);
        if (lp && (lane & 3) == 0) *lp = ls[i] != 0.f ? (m[i] + log2f(ls[i])) * NSA_LN2 : -INFINITY;
    }
}
template <int NO, typename RowFn, typename LseFn>
NSA_DEV void warp_store_rows(const float (&oacc)[NO][4], const float (&m)[2], float (&ls)[2], int64_t dv, int lane,
                             RowFn orow, LseFn lsep)
{
    const SlcSum none = {};
    warp_store_rows(oacc, m, ls, dv, lane, orow, lsep, none, [](int) { return make_float2(0.f, 0.f); });
}

/* One online-softmax step for a warp's 16-row MMA fragment (rows lane/4 and
 * lane/4 + 8). s: the NJ 8-key column groups of masked raw logits q.k (-inf
 * for masked keys); mx: their per-row maxima over this thread's columns; sl:
 * scale * log2(e) (> 0: a config scale of 0 means 1/sqrt(Dqk)), applied here
 * in one FMA per element. m is in the scaled log2 domain. On return s holds
 * p = 2^(s*sl - m), the running sum ls is updated and
 * the output accumulator oacc (NO 8-column groups) is rescaled when m moved,
 * ready for O += P V. Shared by the tile kernels (attn_sm80) and selected
 * attention (slc_sm80, slc_sm80_g16) so all keep one summation order.
 *
 * m is a reference maximum, not always the true running maximum (v4, "lazy
 * rescaling"): it moves only when a row's maximum exceeds it by more than
 * NSA_RESCALE_SLACK (log2 units), so p <= 2^SLACK and most steps skip the
 * NO*4 multiplies of oacc. softmax is the same for any reference; the final
 * o = oacc / ls and lse = m + log2(ls) use the same m. p (<= 256) keeps its
 * 8 / 11 mantissa bits when packed to bf16 / f16 for P V, and ls stays far
 * from fp32 overflow (keys * 256). */
#define NSA_RESCALE_SLACK 8.0f
template <int NJ, int NO>
NSA_DEV void warp_softmax_step(float (&s)[NJ][4], float (&mx)[2], float (&m)[2], float (&ls)[2],
                               float (&oacc)[NO][4], float sl)
{
    float alpha[2] = {1.f, 1.f}, mu[2], rs[2] = {0.f, 0.f};
    bool move[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2)) * sl;
        /* m == -inf: nothing seen yet; move to the first finite maximum */
        move[i] = mx[i] > m[i] + NSA_RESCALE_SLACK || (m[i] == -INFINITY && mx[i] != -INFINITY);
    }
    if (__any_sync(0xffffffffu, move[0] || move[1])) {
#pragma unroll
        for (int i = 0; i < 2; i++)
            if (move[i]) {
                alpha[i] = fast_ex2(m[i] - mx[i]); /* 0 when m was -inf */
                m[i] = mx[i];
            }
#pragma unroll
        for (int j = 0; j < NO; j++) {
            oacc[j][0] *= alpha[0];
            oacc[j][1] *= alpha[0];
            oacc[j][2] *= alpha[1];
            oacc[j][3] *= alpha[1];
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) mu[i] = m[i] == -INFINITY ? 0.f : m[i];
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = fast_ex2(fmaf(s[j][e], sl, -mu[e >> 1]));
            s[j][e] = p;
            rs[e >> 1] += p;
        }
#pragma unroll
    for (int i = 0; i < 2; i++) ls[i] = ls[i] * alpha[i] + rs[i];
}

/* A warp's 16 rows in the compressed / window tile kernels: this thread's
 * two rows' visible key ranges [lo, hi] (row lane/4 + 8i of the warp; rows
 * past nrows are empty) and the warp-wide summaries that decide whether a
 * K tile touches the warp at all (minlo..maxhi) and whether it needs masks
 * (some key of the tile outside some row's range: maxlo, minhi). */
template <int MODE> struct WarpRanges {
    int64_t lo[2], hi[2];
    int64_t minlo, maxhi, maxlo, minhi;
    bool any; /* the warp has rows */

    WarpRanges() = default;
    NSA_DEV WarpRanges(const Geom &g, const TileCtx &c, int warp, int lane)
    {
        minlo = INT64_MAX, maxhi = INT64_MIN, maxlo = INT64_MIN, minhi = INT64_MAX;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = warp * 16 + (lane >> 2) + 8 * i;
            if (r < c.nrows) {
                row_range<MODE>(g, c.tl0 + r / c.hca, lo[i], hi[i]);
                minlo = min(minlo, lo[i]);
                maxhi = max(maxhi, hi[i]);
                maxlo = max(maxlo, lo[i]);
                minhi = min(minhi, hi[i]);
            } else {
                lo[i] = 1;
                hi[i] = 0; /* empty */
            }
        }
        minlo = warp_min64(minlo);
        maxhi = warp_max64(maxhi);
        maxlo = warp_max64(maxlo);
        minhi = warp_min64(minhi);
        any = warp * 16 < c.nrows;
    }

    /* Does the tile of keys [ks, ks + bn) touch these rows? */
    NSA_DEV bool touches(int64_t ks, int bn) const { return any && ks <= maxhi && ks + bn - 1 >= minlo; }

    /* Masks the keys of the tile starting at key ks (NJ * 8 keys) that lie
     * outside this thread's rows (-inf) and leaves the rows' maxima over
     * this thread's columns in mx. Most tiles need no mask for any row. */
    template <int NJ> NSA_DEV void tile_max(float (&s)[NJ][4], int64_t ks, int lane, float (&mx)[2]) const
    {
        constexpr int BN = NJ * 8;
        mx[0] = mx[1] = -INFINITY;
        if (ks >= maxlo && ks + BN - 1 <= minhi) {
            warp_rows_max(s, mx);
            return;
        }
        /* the rows' ranges relative to the tile, clamped into int */
        int rlo[2], rhi[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            rlo[i] = (int)nsa_max64(nsa_min64(lo[i] - ks, BN), -1);
            rhi[i] = (int)nsa_max64(nsa_min64(hi[i] - ks, BN), -1);
        }
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = j * 8 + 2 * (lane & 3) + (e & 1);
                const float x = key < rlo[e >> 1] || key > rhi[e >> 1] ? -INFINITY : s[j][e];
                s[j][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
    }
};

/* Host side: dynamic shared memory a launch asks for. smem is what the
 * kernel uses; under NSA_CUDA_TARGET (dev.emulate) it is raised so that no
 * more CTAs of the kernel fit on one SM of this device than fit on one SM of
 * the emulated class (counting the kernel's static shared memory and the
 * runtime's reserve per CTA). Sets the kernel's opt-in to the result. */
template <typename Kernel> static cudaError_t launch_smem(Kernel kern, const Dev &dev, size_t &smem)
{
    if (dev.emulate) {
        cudaFuncAttributes fa;
        cudaError_t e = cudaFuncGetAttributes(&fa, kern);
        if (e != cudaSuccess) return e;
        const int64_t stat = (int64_t)fa.sharedSizeBytes;
        const int64_t per = (int64_t)smem + stat + dev.reserved;
        const int64_t n = dev.class_smem_sm / per; /* CTAs per SM on the class (>= 1: the chooser checked) */
        if (n >= 1) {
            const int64_t want = dev.device_smem_sm / (n + 1) + 1 - stat - dev.reserved;
            if (want > (int64_t)smem) smem = (size_t)want;
        }
    }
    return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
}

/* Host side: launches a compressed / window tile kernel (attn_sm80_kernel and
 * attn_sm90_kernel take the same arguments, attn_sm90_kernel one more: extra)
 * on one CTA of `threads` per tile, K/V tiles of BN keys, smem bytes of
 * dynamic shared memory. */
template <typename T, int DQK, int DV, int MODE, typename Kernel, typename... Extra>
static cudaError_t launch_attn_tiles(Kernel kern, int BN, int threads, size_t smem, const Dev &dev, const Geom &g, const Tiles &tl,
                                     View q, View k, View v, MView o, MView lse, cudaStream_t s,
                                     const FuseCombine &fz, const Extra &...extra)
{
    static_assert(sizeof(T) == 2, "tensor-core path: 16-bit storage");
    cudaError_t e = launch_smem(kern, dev, smem);
    if (e != cudaSuccess) return e;
    const bool qvec = vec_ok(q.p, q.st, q.sh, g.Dqk);
    /* the packed compressed rows are padded and aligned: always vector loads */
    const bool kvvec = (MODE == 0 || (vec_ok(k.p, k.st, k.sh, g.Dqk) && vec_ok(v.p, v.st, v.sh, g.Dv))) &&
                       rs32_ok(k.st, BN) && rs32_ok(v.st, BN);
    const int64_t kd = MODE == 0 ? DQK : g.Dqk, vd = MODE == 0 ? DV : g.Dv;
    const dim3 grid((unsigned)tl.count, (unsigned)(g.Hkv * tl.nchunk));
    kern<<<grid, threads, smem, s>>>(g, tl, (const T *)q.p, q.st, q.sh, (const T *)k.p, k.st, k.sh,
                                    (const T *)v.p, v.st, v.sh, kd, vd, qvec, kvvec, (float *)o.p, o.st, o.sh,
                                    (float *)lse.p, lse.st, lse.sh, fz, extra...);
    return cudaGetLastError();
}

/* Host side: the fused COMBINE of a window launch (fzp may be NULL: none),
 * with FuseCombine::pair set from the tensors' alignment. */
inline FuseCombine fuse_combine_args(const Geom &g, int mode, const FuseCombine *fzp)
{
    FuseCombine fz = {};
    if (!fzp || mode != 2) return fz;
    fz = *fzp;
    /* element pairs (col, col + 1) at even col: 8 bytes of fp32, 4 of the output type */
    auto even = [](const void *p, int64_t st, int64_t sh, size_t align) {
        return !p || ((uintptr_t)p % align == 0 && st % 2 == 0 && sh % 2 == 0);
    };
    fz.pair = g.Dv % 2 == 0 && even(fz.ob[0].p, fz.ob[0].st, fz.ob[0].sh, 8) &&
              even(fz.ob[1].p, fz.ob[1].st, fz.ob[1].sh, 8) && even(fz.out.p, fz.out.st, fz.out.sh, 4);
    return fz;
}

/* Host side: launches selected-attention kernel slc_sm80_g16_kernel, `tok`
 * consecutive tokens of one KV group per CTA. */
template <typename T, typename Kernel>
static cudaError_t launch_slc_tokens(Kernel kern, int tok, int threads, size_t smem, const Dev &dev, const Geom &g,
                                     View q, View k, View v, View idx, MView o, MView lse, const SlcSum &z,
                                     cudaStream_t s)
{
    static_assert(sizeof(T) == 2, "tensor-core path: 16-bit storage");
    cudaError_t e = launch_smem(kern, dev, smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)((g.T + tok - 1) / tok), (unsigned)g.Hkv);
    kern<<<grid, threads, smem, s>>>(g, (const T *)q.p, q.st, q.sh, (const T *)k.p, k.st, k.sh, (const T *)v.p, v.st,
                                     v.sh, vec_ok(q.p, q.st, q.sh, g.Dqk), (const int *)idx.p, idx.st, idx.sh,
                                     (float *)o.p, o.st, o.sh, (float *)lse.p, lse.st, lse.sh, z);
    return cudaGetLastError();
}

/* `return FN<T, DQK, DV>(args...)` for the call's 16-bit dtype and the padded
 * dims 32/32, 64/64, 128/128 or 192/128 (the launcher of slc_sm80_g16). */
#define NSA_SLC_DIMS(FN, T, dqkp, dvp, ...)                                                                      \
    switch ((dqkp) * 1000 + (dvp)) {                                                                             \
    case 32032: return FN<T, 32, 32>(__VA_ARGS__);                                                               \
    case 64064: return FN<T, 64, 64>(__VA_ARGS__);                                                               \
    case 128128: return FN<T, 128, 128>(__VA_ARGS__);                                                            \
    case 192128: return FN<T, 192, 128>(__VA_ARGS__);                                                            \
    default: return cudaErrorInvalidValue;                                                                       \
    }
#define NSA_SLC_DISPATCH(FN, g, dqkp, dvp, ...)                                                                  \
    do {                                                                                                         \
        if ((g).dtype == 1) { NSA_SLC_DIMS(FN, __half, dqkp, dvp, __VA_ARGS__) }                                 \
        if ((g).dtype == 2) { NSA_SLC_DIMS(FN, __nv_bfloat16, dqkp, dvp, __VA_ARGS__) }                          \
        return cudaErrorInvalidValue;                                                                            \
    } while (0)

/* `return FN<T, MODE>(args...)` for the call's 16-bit dtype (g.dtype 1 f16,
 * 2 bf16) and branch mode (0 compressed, 2 window): the launchers of attn_sm80
 * and attn_sm90. */
#define NSA_ATTN_DISPATCH(FN, g, mode, ...)                                                                      \
    do {                                                                                                         \
        if ((g).dtype == 1)                                                                                      \
            return (mode) == 0 ? FN<__half, 0>(__VA_ARGS__) : FN<__half, 2>(__VA_ARGS__);                        \
        if ((g).dtype == 2)                                                                                      \
            return (mode) == 0 ? FN<__nv_bfloat16, 0>(__VA_ARGS__) : FN<__nv_bfloat16, 2>(__VA_ARGS__);          \
        return cudaErrorInvalidValue;                                                                            \
    } while (0)

/* The end of the compressed / window tile kernels (attn_sm80, attn_sm90): stores
 * the warp's 16 rows (o, lse), or for the window branch with fz.out set
 * computes COMBINE in place: the combine kernel's sum, term by term. */
template <typename T, int MODE, int NO>
NSA_DEV void attn_epilogue(const Geom &g, const TileCtx &c, int warp, int lane, float (&oacc)[NO][4], float (&m)[2],
                           float (&ls)[2], float *o, int64_t ost, int64_t osh, float *lse, int64_t lst, int64_t lsh,
                           const FuseCombine &fz)
{
    constexpr int DV = NO * 8;
    /* row i of this thread: r = warp*16 + lane/4 + 8i -> (token, head) */
    auto row_th = [&](int i, int64_t &t, int64_t &h) {
        const int r = warp * 16 + (lane >> 2) + 8 * i;
        t = c.t0 + r / c.hca;
        h = c.h0 + r % c.hca;
        return r < c.nrows;
    };
    if (MODE == 2 && fz.out.p) {
        /* fused COMBINE: the combine kernel's sum, term by term */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 1);
            ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 2);
            int64_t t, h;
            if (!row_th(i, t, h)) continue;
            const float inv = ls[i] != 0.f ? 1.0f / ls[i] : 0.f;
            const float *oc = (const float *)fz.ob[0].p, *os = fz.cmp_sum ? nullptr : (const float *)fz.ob[1].p;
            const float gc = oc && !fz.cmp_sum ? ((const float *)fz.gate[0].p)[t * fz.gate[0].st + h * fz.gate[0].sh]
                                               : 0.f;
            const float gs = os ? ((const float *)fz.gate[1].p)[t * fz.gate[1].st + h * fz.gate[1].sh] : 0.f;
            const float gw = ((const float *)fz.gate[2].p)[t * fz.gate[2].st + h * fz.gate[2].sh];
            if (oc) oc += t * fz.ob[0].st + h * fz.ob[0].sh;
            if (os) os += t * fz.ob[1].st + h * fz.ob[1].sh;
            T *orow = (T *)fz.out.p + t * fz.out.st + h * fz.out.sh;
            /* v6: the partials of 4 column groups are loaded before any of
             * their outputs is stored (pairs where fz.pair allows), so their
             * latencies overlap; one at a time they were most of this
             * kernel's stalls (ncu, T = 32k: long scoreboard 46 %) */
            constexpr int JC = 4;
#pragma unroll
            for (int j0 = 0; j0 < DV / 8; j0 += JC) {
                float2 pc[JC], ps[JC];
#pragma unroll
                for (int jj = 0; jj < JC; jj++) {
                    const int col = (j0 + jj) * 8 + 2 * (lane & 3);
                    pc[jj] = ps[jj] = make_float2(0.f, 0.f);
                    if (fz.pair && col + 1 < g.Dv) {
                        if (oc) pc[jj] = __ldg(reinterpret_cast<const float2 *>(oc + col));
                        if (os) ps[jj] = __ldg(reinterpret_cast<const float2 *>(os + col));
                    } else {
                        if (oc && col < g.Dv) pc[jj].x = __ldg(oc + col);
                        if (oc && col + 1 < g.Dv) pc[jj].y = __ldg(oc + col + 1);
                        if (os && col < g.Dv) ps[jj].x = __ldg(os + col);
                        if (os && col + 1 < g.Dv) ps[jj].y = __ldg(os + col + 1);
                    }
                }
#pragma unroll
                for (int jj = 0; jj < JC; jj++) {
                    const int j = j0 + jj, col = j * 8 + 2 * (lane & 3);
                    float r[2];
#pragma unroll
                    for (int u = 0; u < 2; u++) { /* the combine kernel's sum, term by term */
                        float acc = 0.f;
                        if (oc) acc = fz.cmp_sum ? (u ? pc[jj].y : pc[jj].x) : fmaf(gc, u ? pc[jj].y : pc[jj].x, acc);
                        if (os) acc = fmaf(gs, u ? ps[jj].y : ps[jj].x, acc);
                        acc = fmaf(gw, oacc[j][2 * i + u] * inv, acc);
                        r[u] = acc;
                    }
                    if (fz.pair && col + 1 < g.Dv) {
                        T two[2] = {from_f<T>(r[0]), from_f<T>(r[1])};
                        *reinterpret_cast<uint32_t *>(orow + col) = *reinterpret_cast<const uint32_t *>(two);
                    } else {
                        if (col < g.Dv) orow[col] = from_f<T>(r[0]);
                        if (col + 1 < g.Dv) orow[col + 1] = from_f<T>(r[1]);
                    }
                }
            }
            if (lse && (lane & 3) == 0)
                lse[t * lst + h * lsh] = ls[i] != 0.f ? (m[i] + log2f(ls[i])) * NSA_LN2 : -INFINITY;
        }
    } else {
        warp_store_rows(
            oacc, m, ls, g.Dv, lane,
            [&](int i) {
                int64_t t, h;
                return row_th(i, t, h) ? o + t * ost + h * osh : (float *)nullptr;
            },
            [&](int i) {
                int64_t t, h;
                return lse && row_th(i, t, h) ? lse + t * lst + h * lsh : (float *)nullptr;
            });
    }
}

} // namespace nsa_cuda

#endif
