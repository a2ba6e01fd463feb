/*
 * slc_sm80_g16.cu -- the selected branch for G = 16 (l_s <= 64, n <= 32) on
 * mma.sync and cp.async (every sm_80+ device; the selected kernel of every
 * class): 8 consecutive tokens per CTA fetch the blocks they all selected
 * once, and each warp streams the rest of its token's blocks on its own,
 * without CTA barriers.
 *
 * Why: one CTA per token (slc_sm80) is bound by the L2 -> SM stream of K/V
 * blocks (134 GB at T = 64k at the paper's shape). The 8 tokens of a CTA lie
 * in one selection block (8 divides l_s = 64), so they all select its forced
 * blocks (the first and the two local ones): 3 of every token's 16, fetched
 * once here instead of 8 times: 3 + 8 x 13 = 107 fetches instead of 128 on
 * random inputs, more where tokens agree. The blocks are either used by every
 * warp (phase 1) or by one warp alone (phase 2), so no warp waits on
 * another's block.
 *
 * CTA: 8 warps, warp w = token t0 + w, its 16 query heads as the 16 rows of
 * mma.sync m16n8k16 (fragments of Q kept in registers).
 *   setup    every token's selected blocks as absolute key ranges; the
 *            shared set: the first token's blocks that every other (valid)
 *            token selected too (by key range: tokens of two sequences share
 *            nothing). Caller-given indices work the same way.
 *   phase 1  the shared blocks, one 64-key tile each through a CTA-wide
 *            cp.async double buffer; every warp computes its rows on all of
 *            it, keys past its own token masked.
 *   phase 2  the warp's other blocks in 16-key chunks through its own
 *            cp.async buffers (1 to 3; synchronised with __syncwarp only);
 *            the warp's list is compacted first, so the next chunk is one
 *            step (and its shared-memory reads overlap the current chunk's
 *            work).
 * One online softmax per warp over both phases (warp_softmax_step), keys in a
 * fixed order (shared blocks first, then the token's list order): results are
 * reproducible and differ from slc_sm80 only by the fp32 summation order.
 *
 * K/V tiles live in 128-byte-swizzled panels where the dims are multiples of
 * 64 (PanelTile; padded rows read 1.5x their bytes from L2, see tile_qk.cuh),
 * else in 16-byte-padded rows. Shared memory: the Q tile at the start, then
 * phase 1's tiles, then the warps' chunk buffers, in one region (tiles.h,
 * slc_sm80_g16_smem: at D 128 192 KB with three chunk buffers, 128 with two,
 * 64 with one; at Dqk 192 240 / 160 / 82); one CTA (8 warps, 212-255
 * registers) per SM.
 */
#include <type_traits>

#include "tile_qk.cuh"

namespace nsa_cuda {

constexpr int SFS_THREADS = 32 * SFS_TOK; /* SFS_TOK, SFS_KB, SFS_CK, SFS_MAXN: tiles.h */

/* K / V tiles in shared memory: 128-byte-swizzled panels (PANEL) or 16-byte-padded rows */
template <bool PANEL, int D, int ROWS>
using FsTile = typename std::conditional<PANEL, PanelTile<D, ROWS>, PadTile<D + 8, ROWS>>::type;

/* One warp copies rows [0, ROWS) x dims [0, DP) of a 16-bit K/V chunk into
 * shared memory (layout L): row r < nvalid from base + r * rs, the rest and
 * dims >= D zero (load_rows_vec for one warp instead of the CTA). */
template <typename T, int ROWS, int DP, typename L>
NSA_DEV void warp_load_rows(T *dst, const T *base, int rs, int nvalid, int D, int lane)
{
    constexpr int CPR = DP / 8, N = ROWS * CPR;
#pragma unroll
    for (int i = 0; i < (N + 31) / 32; i++) {
        const int x = lane + 32 * i;
        if (N % 32 != 0 && x >= N) break;
        const int r = x / CPR, c = x - (x / CPR) * CPR;
        const bool ok = r < nvalid && c * 8 < D;
        cp_async16(dst + L::off(r, c * 8), base + (ok ? r * rs + c * 8 : 0), ok);
    }
}

template <typename T, int DQK, int DV, bool PANEL, int NS>
__global__ void __launch_bounds__(SFS_THREADS, 1)
    slc_sm80_g16_kernel(const Geom g, const T *__restrict__ q, int64_t qst, int64_t qsh, const T *__restrict__ k,
                  int64_t kst, int64_t ksh, const T *__restrict__ v, int64_t vst, int64_t vsh, bool qvec,
                  const int *idx, int64_t ist, int64_t ish, float *o, int64_t ost, int64_t osh, float *lse,
                  int64_t lst, int64_t lsh, const SlcSum z)
{
    constexpr int NT = SFS_THREADS, TOK = SFS_TOK, KB = SFS_KB, CK = SFS_CK, SQ = DQK + 8;
    static_assert(NS == 1 || NS == 2 || (NS == 3 && PANEL), "one or two chunk buffers, or three in panels");
    using LK1 = FsTile<PANEL, DQK, KB>; /* phase 1 tiles */
    using LV1 = FsTile<PANEL, DV, KB>;
    using LK2 = FsTile<PANEL, DQK, CK>; /* phase 2 chunks */
    using LV2 = FsTile<PANEL, DV, CK>;
    static_assert(LK1::elems == sfs_tile_elems(PANEL, DQK, KB) && LV1::elems == sfs_tile_elems(PANEL, DV, KB) &&
                      LK2::elems == sfs_tile_elems(PANEL, DQK, CK) && LV2::elems == sfs_tile_elems(PANEL, DV, CK),
                  "the layout slc_sm80_g16_smem (tiles.h) sizes");
    extern __shared__ __align__(16) unsigned char smem_dyn[];
    /* PANEL: the region starts on a 128-byte boundary (the launcher added 128
     * bytes), so that every 32-byte sector a cp.async writes is an aligned one.
     * The dynamic region follows 3728 bytes of static shared memory here, so it
     * starts 16 bytes into a sector, where any layout reads 2 L2 sectors per
     * data sector (dev/cuda/ldgsts_l2.cu). */
    unsigned char *const smem_raw = PANEL ? smem_dyn + ((128u - (smem_u32(smem_dyn) & 127u)) & 127u) : smem_dyn;
    T *const sQ = (T *)smem_raw;           /* [TOK * 16][SQ], until the fragments are in registers */
    T *const sK1 = (T *)smem_raw;          /* phase 1: 2 K tiles (LK1) */
    T *const sV1 = sK1 + 2 * LK1::elems;   /*          2 V tiles (LV1) */
    __shared__ int64_t sKa[TOK][SFS_MAXN]; /* absolute first key of token tok's block b, -1: none */
    __shared__ int sVis[TOK][SFS_MAXN];    /* its keys at or before the token */
    __shared__ int64_t sSh[SFS_MAXN];      /* the shared blocks (first key) */
    __shared__ int sShCnt[SFS_MAXN];       /* keys to fetch: the largest vis */
    __shared__ unsigned char sIsSh[TOK][SFS_MAXN]; /* token tok's block b is a shared one */
    __shared__ int s_nsh;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t t0 = (int64_t)blockIdx.x * TOK, gi = blockIdx.y, h0 = gi * 16;
    const int n = (int)g.n;

    for (int c = tid; c < TOK * SFS_MAXN; c += NT) {
        const int tok = c / SFS_MAXN, b = c % SFS_MAXN;
        const int64_t t = t0 + tok;
        int64_t ka = -1;
        int vis = 0;
        if (b < n && t < g.T) {
            const int64_t s0 = g.cu_seqlens[g.tok_seq[t]], tl = t - s0;
            const int64_t j = idx[t * ist + gi * ish + b];
            if (j >= 0 && j <= nsa_slc_last(tl, g.ls)) {
                ka = s0 + j * g.ls;
                vis = (int)nsa_min64(g.ls, tl + 1 - j * g.ls);
            }
        }
        sKa[tok][b] = ka;
        sVis[tok][b] = vis;
    }
    load_tile<T, TOK * 16, DQK, SQ, NT>(sQ, q, g.Dqk, qvec, [&](int r) -> int64_t {
        const int64_t t = t0 + r / 16;
        return t < g.T ? t * qst + (h0 + r % 16) * qsh : -1;
    });
    cp_async_commit();
    __syncthreads();
    if (warp == 0) { /* lane b: entry b of token 0, shared when every valid token has its block */
        const int64_t ka = lane < n ? sKa[0][lane] : -1;
        bool sh = ka >= 0;
        int cnt = sh ? sVis[0][lane] : 0;
        for (int tok = 1; tok < TOK; tok++) {
            if (t0 + tok >= g.T) break;
            bool found = false;
            for (int b = 0; b < n; b++)
                if (sKa[tok][b] == ka) {
                    found = true;
                    cnt = max(cnt, sVis[tok][b]);
                }
            sh = sh && found;
        }
        const unsigned bal = __ballot_sync(0xffffffffu, sh);
        if (sh) {
            const int pos = __popc(bal & ((1u << lane) - 1u));
            sSh[pos] = ka;
            sShCnt[pos] = cnt;
        }
        if (lane == 0) s_nsh = __popc(bal);
    }
    __syncthreads();
    const int nsh = s_nsh;
    for (int c = tid; c < TOK * SFS_MAXN; c += NT) {
        const int64_t ka = sKa[c / SFS_MAXN][c % SFS_MAXN];
        bool shared = false;
        for (int u = 0; u < nsh; u++) shared = shared || (ka >= 0 && sSh[u] == ka);
        sIsSh[c / SFS_MAXN][c % SFS_MAXN] = shared;
    }
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[DQK / 16][4];
    q_frags<SQ, true>(qf, sQ + warp * 16 * SQ, lane);
    __syncthreads(); /* the region is phase 1's now */

    const int64_t t = t0 + warp;
    const bool live = t < g.T;
    const T *kg = k + gi * ksh, *vg = v + gi * vsh;
    const float sl = g.scale * NSA_LOG2E;
    float oacc[DV / 8][4], m[2], ls[2];
    warp_state_init(oacc, m, ls);

    /* phase 1 */
    auto load1 = [&](int u, int buf) {
        const int64_t ka = sSh[u];
        const int cnt = sShCnt[u];
        T *const dk = sK1 + buf * LK1::elems, *const dv = sV1 + buf * LV1::elems;
        load_rows_vec_to<T, KB, DQK, NT>([&](int r, int c) { return dk + LK1::off(r, c * 8); }, kg + ka * kst, (int)kst,
                                         cnt, (int)g.Dqk);
        load_rows_vec_to<T, KB, DV, NT>([&](int r, int c) { return dv + LV1::off(r, c * 8); }, vg + ka * vst, (int)vst,
                                        cnt, (int)g.Dv);
    };
    if (nsh > 0) load1(0, 0);
    cp_async_commit();
    for (int u = 0; u < nsh; u++) {
        if (u + 1 < nsh) load1(u + 1, (u + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const int buf = u & 1;
        if (live) {
            /* keys of the block at or before the token (>= 1: it selected the block); the
             * block has l_s <= KB keys, rows past the fetched count are zero */
            const int vis = (int)nsa_min64(g.ls, t + 1 - sSh[u]);
            float s[KB / 8][4];
#pragma unroll
            for (int j = 0; j < KB / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            warp_qk_l<T, DQK, KB / 8, SQ, true, LK1>(s, qf, sQ, sK1 + buf * LK1::elems, 0, lane);
            float mx[2];
            warp_mask_keys(s, vis, lane, mx);
            warp_softmax_step(s, mx, m, ls, oacc, sl);
            warp_pv_l<T, DV, KB / 16, LV1>(oacc, s, sV1 + buf * LV1::elems, 0, lane);
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads(); /* phase 1's tiles are done with: the region is the warps' chunk buffers now */

    /* phase 2: this warp alone */
    T *const wK = (T *)smem_raw + warp * NS * (LK2::elems + LV2::elems); /* NS K chunks (LK2) */
    T *const wV = wK + NS * LK2::elems;                                 /* NS V chunks (LV2) */
    /* the warp's list compacted in place to its other blocks (not shared, not
     * empty), in list order: entries 0 .. cnt-1 of its rows of sKa / sVis */
    int cnt;
    {
        const int64_t ka = lane < n ? sKa[warp][lane] : -1;
        const int vis = lane < n ? sVis[warp][lane] : 0;
        const bool keep = live && ka >= 0 && !(lane < n && sIsSh[warp][lane]);
        const unsigned bal = __ballot_sync(0xffffffffu, keep);
        cnt = __popc(bal);
        __syncwarp();
        if (keep) {
            const int pos = __popc(bal & ((1u << lane) - 1u));
            sKa[warp][pos] = ka;
            sVis[warp][pos] = vis;
        }
        __syncwarp();
    }
    /* a chunk: keys x .. x + CK - 1 of entry i (first key ka, vis keys); i == cnt: past the end */
    struct Chunk {
        int64_t ka;
        int i, x, vis;
    };
    auto entry = [&](int i) {
        Chunk c;
        c.i = i;
        c.x = 0;
        c.ka = i < cnt ? sKa[warp][i] : 0;
        c.vis = i < cnt ? sVis[warp][i] : 0;
        return c;
    };
    auto next = [&](Chunk c) {
        if (c.i >= cnt) return c;
        c.x += CK;
        return c.x < c.vis ? c : entry(c.i + 1);
    };
    auto load2 = [&](const Chunk &c, int buf) {
        const int64_t ka = c.ka + c.x;
        const int nv = min(CK, c.vis - c.x);
        warp_load_rows<T, CK, DQK, LK2>(wK + buf * LK2::elems, kg + ka * kst, (int)kst, nv, (int)g.Dqk, lane);
        warp_load_rows<T, CK, DV, LV2>(wV + buf * LV2::elems, vg + ka * vst, (int)vst, nv, (int)g.Dv, lane);
    };
    /* q[u]: chunk ci + u (u < NS), in buffer (ci + u) % NS; NS - 1 are in flight
     * while chunk ci is computed */
    Chunk qc[NS];
    qc[0] = entry(0);
#pragma unroll
    for (int u = 1; u < NS; u++) qc[u] = next(qc[u - 1]);
#pragma unroll
    for (int u = 0; u < NS - 1; u++) {
        if (qc[u].i < cnt) load2(qc[u], u);
        cp_async_commit();
    }
    int buf = 0, lbuf = NS - 1; /* buffers of chunks ci and ci + NS - 1 */
    while (qc[0].i < cnt) {
        if (qc[NS - 1].i < cnt) load2(qc[NS - 1], lbuf); /* its buffer held chunk ci - 1, done with */
        cp_async_commit();
        const Chunk after = next(qc[NS - 1]); /* its shared-memory reads overlap this chunk's work */
        cp_async_wait<NS - 1>();
        __syncwarp(); /* every lane's copies of this chunk are visible to the warp */
        float s[CK / 8][4];
#pragma unroll
        for (int j = 0; j < CK / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        warp_qk_l<T, DQK, CK / 8, SQ, true, LK2>(s, qf, sQ, wK + buf * LK2::elems, 0, lane);
        float mx[2];
        warp_mask_keys(s, min(CK, qc[0].vis - qc[0].x), lane, mx);
        warp_softmax_step(s, mx, m, ls, oacc, sl);
        warp_pv_l<T, DV, CK / 16, LV2>(oacc, s, wV + buf * LV2::elems, 0, lane);
        __syncwarp(); /* this chunk's buffer is refilled next */
#pragma unroll
        for (int u = 0; u < NS - 1; u++) qc[u] = qc[u + 1];
        qc[NS - 1] = after;
        buf = buf + 1 == NS ? 0 : buf + 1;
        lbuf = lbuf + 1 == NS ? 0 : lbuf + 1;
    }
    cp_async_wait<0>();

    if (!live) return;
    warp_store_rows(
        oacc, m, ls, g.Dv, lane, [&](int i) { return o + t * ost + (h0 + (lane >> 2) + 8 * i) * osh; },
        [&](int i) { return lse ? lse + t * lst + (h0 + (lane >> 2) + 8 * i) * lsh : (float *)nullptr; }, z,
        [&](int i) { return slc_sum_gates(z, t, h0 + (lane >> 2) + 8 * i); });
}

bool slc_sm80_g16_loads(const Geom &g, View k, View v)
{
    return vec_ok(k.p, k.st, k.sh, g.Dqk) && vec_ok(v.p, v.st, v.sh, g.Dv) && rs32_ok(k.st, SFS_KB) &&
           rs32_ok(v.st, SFS_KB);
}

template <typename T, int DQK, int DV, bool PANEL, int NS>
static cudaError_t launch_g16(const Dev &dev, const Geom &g, View q, View k, View v, View idx, MView o, MView lse,
                              const SlcSum &z, cudaStream_t s)
{
    return launch_slc_tokens<T>(slc_sm80_g16_kernel<T, DQK, DV, PANEL, NS>, SFS_TOK, SFS_THREADS,
                                slc_sm80_g16_smem(DQK, DV, PANEL, NS), dev, g, q, k, v, idx, o, lse, z, s);
}

/* the instances: panels (1, 2 or 3 buffers) where the dims are multiples of 64, padded rows (1 or 2) elsewhere */
template <typename T, int DQK, int DV>
static cudaError_t launch_g16_tile(const SlcTile &t, const Dev &dev, const Geom &g, View q, View k, View v, View idx,
                                   MView o, MView lse, const SlcSum &z, cudaStream_t s)
{
    if constexpr (DQK % 64 == 0 && DV % 64 == 0) {
        if (!t.panel) return cudaErrorInvalidValue;
        switch (t.ns) {
        case 3: return launch_g16<T, DQK, DV, true, 3>(dev, g, q, k, v, idx, o, lse, z, s);
        case 2: return launch_g16<T, DQK, DV, true, 2>(dev, g, q, k, v, idx, o, lse, z, s);
        case 1: return launch_g16<T, DQK, DV, true, 1>(dev, g, q, k, v, idx, o, lse, z, s);
        default: return cudaErrorInvalidValue;
        }
    } else {
        if (t.panel || (t.ns != 2 && t.ns != 1)) return cudaErrorInvalidValue;
        return t.ns == 2 ? launch_g16<T, DQK, DV, false, 2>(dev, g, q, k, v, idx, o, lse, z, s)
                         : launch_g16<T, DQK, DV, false, 1>(dev, g, q, k, v, idx, o, lse, z, s);
    }
}

cudaError_t slc_sm80_g16(const Geom &g, const Dev &dev, const SlcTile &tile, int dqkp, int dvp, View q, View k, View v,
                         View idx, MView o, MView lse, const SlcSum &z, cudaStream_t s)
{
    if (g.T == 0) return cudaSuccess;
    if (!tile.ok || !slc_sm80_g16_takes(g.G, g.ls, g.n, dqkp, dvp) || !slc_sm80_g16_loads(g, k, v))
        return cudaErrorInvalidValue;
    NSA_SLC_DISPATCH(launch_g16_tile, g, dqkp, dvp, tile, dev, g, q, k, v, idx, o, lse, z, s);
}

} // namespace nsa_cuda
