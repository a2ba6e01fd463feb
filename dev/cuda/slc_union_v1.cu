/*
 * dev/cuda/slc_union_v1.cu -- experiment v1 for issue 14 (rejected): the
 * selected branch by token tiles over the union of their blocks. Not built;
 * it builds and runs as kernels/cuda/slc_sm80_union.cu at commit 13f0211
 * (with SlcUnion, sun_* and pick_slc_sm80_union in tiles.h, the K_SLC_SM80_UNION
 * chooser entry and its test_cuda_choose checks there).
 *
 * Idea: short sequences make the selection dense (at T = 8192, l_s = 64,
 * n = 16 a token at position t selects 16 of t / 64 blocks), so the tokens of
 * a tile select mostly the same blocks. A CTA of W warps takes 16 / GP tokens
 * per warp (GP: G rounded up to a power of two), sorts its (block, token)
 * entries in shared memory (bitonic), walks the union of the blocks once
 * through a CTA-wide cp.async double buffer, and keeps every row's softmax
 * state in registers: one fetch per block per tile, no partial states in
 * global memory (slc_sm80_blk's cost), no per-token streams (slc_sm80_g16's).
 *
 * Correct (H200, 2026-12-03): the full parity corpus as sm90 / sm80 / sm86
 * with it chosen for every G <= 16, nsa run against the cpu backend at
 * T = 8192 (G 7, 4, 1, 16 at Dqk 192, 12 packed, 24 / 2 packed, sm80, sm86),
 * 20 processes one hash, memcheck and racecheck 0 errors.
 *
 * Measured (H200, bf16, D 128, paper parameters, NSA_CUDA_PROFILE slc_attn ms,
 * W = 8 / W = 4 warps per CTA; the product's kernel in the same session):
 *
 *   Hq/Hkv   T = 8192       16384        32768         65536        product at 8k / 32k / 64k
 *   28/4     2.27 / 2.42    6.26 / 6.18  15.9 / 14.5   37.3 / 32.1  blk 2.03 / 8.50 / 17.1
 *   32/8     2.75 / 3.06    8.33 / 8.93  23.6 / 23.2   60.7 / 55.2  blk 2.39 / 9.91 / 19.9
 *   4/4      0.72 (4 w)     2.05         6.10          17.3         blk 0.45 / 1.67 / 3.3
 *   64/4     3.47 / 3.44    8.64 / 7.94  20.1 / 17.4   44.1 / 36.6  g16 1.76 / 7.42 / 15.0
 *
 * Why it loses: every union block costs the CTA a barrier-bounded step in
 * which only the warps whose tokens chose the block compute (at G 16 about 2
 * of 8), and a warp computes all 16 MMA rows when any of its tokens chose the
 * block (at G 1, 16 tokens per warp, about a quarter of the rows are live).
 * Whatever is tried next for short sequences must keep the warps' streams
 * independent (slc_sm80_g16's phase 2) or gather the live rows.
 */
#include <stdlib.h>

#include <type_traits>

#include "tile_qk.cuh"

namespace nsa_cuda {

/* K / V tiles in shared memory: 128-byte-swizzled panels (PANEL) or 16-byte-padded rows */
template <bool PANEL, int D, int ROWS>
using SuTile = typename std::conditional<PANEL, PanelTile<D, ROWS>, PadTile<D + 8, ROWS>>::type;

template <typename T, int DQK, int DV, bool PANEL>
__global__ void __launch_bounds__(32 * SUN_MAXW, 1)
    slc_sm80_union_kernel(const Geom g, int gp, int ne, const T *__restrict__ q, int64_t qst, int64_t qsh,
                          const T *__restrict__ k, int64_t kst, int64_t ksh, const T *__restrict__ v, int64_t vst,
                          int64_t vsh, bool qvec, const int *idx, int64_t ist, int64_t ish, float *o, int64_t ost,
                          int64_t osh, float *lse, int64_t lst, int64_t lsh)
{
    constexpr int KB = SUN_KB, SQ = DQK + 8;
    using LK = SuTile<PANEL, DQK, KB>;
    using LV = SuTile<PANEL, DV, KB>;
    static_assert(LK::elems == sun_tile_elems(PANEL, DQK, KB) && LV::elems == sun_tile_elems(PANEL, DV, KB),
                  "the layout slc_sm80_union_smem (tiles.h) sizes");
    extern __shared__ __align__(16) unsigned char smem_dyn[];
    const int nt = (int)blockDim.x, W = nt >> 5, tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int tpw = 16 / gp, tt = W * tpw, mw = (tt + 31) >> 5, n = (int)g.n;
    /* the union list, then the region (panels on a 128-byte boundary) holding the
     * sort keys and the Q rows first, the two K/V buffers after */
    int64_t *const u_kb = (int64_t *)smem_dyn;       /* [ne] first key row of union block u */
    int *const u_cnt = (int *)(u_kb + ne);           /* [ne] keys to fetch */
    uint32_t *const u_mask = (uint32_t *)(u_cnt + ne); /* [ne][mw] tokens of the tile that selected it */
    unsigned char *const rbase = (unsigned char *)(u_mask + (size_t)ne * mw);
    unsigned char *const region = PANEL ? rbase + ((128u - (smem_u32(rbase) & 127u)) & 127u) : rbase;
    unsigned long long *const keys = (unsigned long long *)region; /* [ne] */
    T *const sQ = (T *)(keys + ne);                                 /* [W * 16][SQ] */
    T *const sK = (T *)region;                                      /* 2 K tiles (LK), then 2 V tiles (LV) */
    T *const sV = sK + 2 * LK::elems;
    __shared__ int s_wsum[SUN_MAXW], s_nu;

    const int64_t t0 = (int64_t)blockIdx.x * tt, gi = blockIdx.y, h0 = gi * g.G;
    const int G = (int)g.G;

    /* the keys: entry e = (token e / n, slot e % n) */
    for (int e = tid; e < ne; e += nt) {
        unsigned long long key = ~0ull;
        const int tok = e / n, slot = e - tok * n;
        const int64_t t = t0 + tok;
        if (tok < tt && t < g.T) {
            const int64_t s0 = g.cu_seqlens[g.tok_seq[t]], tl = t - s0;
            const int64_t j = idx[t * ist + gi * ish + slot];
            if (j >= 0 && j <= nsa_slc_last(tl, g.ls)) key = ((unsigned long long)(s0 + j * g.ls) << 8) | (unsigned)tok;
        }
        keys[e] = key;
    }
    for (int e = tid; e < ne * mw; e += nt) u_mask[e] = 0u;
    /* the warps' Q rows: row r of warp w = token w tpw + r / gp, head r % gp (none past G) */
    const int qchunks = DQK / 8;
    for (int c = tid; c < W * 16 * qchunks; c += nt) {
        const int r = c / qchunks, ch = c - r * qchunks, w = r >> 4, rr = r & 15;
        const int64_t t = t0 + w * tpw + rr / gp;
        const int hh = rr % gp;
        const bool row = t < g.T && hh < G;
        const int64_t off = row ? t * qst + (h0 + hh) * qsh : 0;
        T *dst = sQ + r * SQ + ch * 8;
        if (qvec) {
            const bool ok = row && ch * 8 < g.Dqk;
            cp_async16(dst, ok ? (const void *)(q + off + ch * 8) : (const void *)q, ok);
        } else {
#pragma unroll
            for (int x = 0; x < 8; x++) {
                const int col = ch * 8 + x;
                dst[x] = row && col < g.Dqk ? q[off + col] : T(0.f);
            }
        }
    }
    cp_async_commit();
    __syncthreads();

    /* bitonic sort of the keys (ne a power of two), ascending */
    for (int kk = 2; kk <= ne; kk <<= 1) {
        for (int j = kk >> 1; j > 0; j >>= 1) {
            for (int i = tid; i < ne; i += nt) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const unsigned long long a = keys[i], b = keys[ixj];
                    if ((a > b) == ((i & kk) == 0)) {
                        keys[i] = b;
                        keys[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
    }

    /* the union: entry e starts a run when its block differs from entry e - 1's;
     * each thread takes a contiguous chunk of entries, the runs counted by a
     * scan over the threads */
    const int per = (ne + nt - 1) / nt, e0 = tid * per, e1 = min(ne, e0 + per);
    auto head = [&](int e) { return keys[e] != ~0ull && (e == 0 || (keys[e] >> 8) != (keys[e - 1] >> 8)); };
    int cnt = 0;
    for (int e = e0; e < e1; e++) cnt += head(e) ? 1 : 0;
    int incl = cnt;
#pragma unroll
    for (int o2 = 1; o2 < 32; o2 <<= 1) {
        const int x = __shfl_up_sync(0xffffffffu, incl, o2);
        if (lane >= o2) incl += x;
    }
    if (lane == 31) s_wsum[warp] = incl;
    __syncthreads();
    int base = incl - cnt;
    for (int w = 0; w < warp; w++) base += s_wsum[w];
    if (tid == nt - 1) s_nu = base + cnt;
    /* the union index of entry e's run: base counts the runs that start before e0, so an
     * entry before the chunk's first head belongs to run base - 1 */
    int u = base - 1;
    for (int e = e0; e < e1; e++) {
        const unsigned long long key = keys[e];
        if (key == ~0ull) break;
        if (head(e)) {
            u++;
            u_kb[u] = (int64_t)(key >> 8);
        }
        const int tok = (int)(key & 255u);
        atomicOr(&u_mask[u * mw + (tok >> 5)], 1u << (tok & 31));
        if (e + 1 == ne || (keys[e + 1] >> 8) != (key >> 8)) /* the run's last (largest) token */
            u_cnt[u] = (int)nsa_min64(g.ls, t0 + tok - (int64_t)(key >> 8) + 1);
    }
    cp_async_wait<0>();
    __syncthreads();
    const int nu = s_nu;
    uint32_t qf[DQK / 16][4];
    q_frags<SQ, true>(qf, sQ + warp * 16 * SQ, lane);
    __syncthreads(); /* the region is the K/V buffers' now */

    /* this thread's rows (lane / 4 + 8 i of the warp): token within the warp, and whether the row is one */
    int rtok[2];
    bool rok[2];
    int64_t rt[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = (lane >> 2) + 8 * i;
        rtok[i] = r / gp;
        rt[i] = t0 + warp * tpw + rtok[i];
        rok[i] = rt[i] < g.T && r % gp < G;
    }
    const int wword = (warp * tpw) >> 5, wshift = (warp * tpw) & 31;
    const uint32_t wbits = tpw == 32 ? 0xffffffffu : (1u << tpw) - 1u;
    const T *kg = k + gi * ksh, *vg = v + gi * vsh;
    const float sl = g.scale * NSA_LOG2E;
    float oacc[DV / 8][4], m[2], ls[2];
    warp_state_init(oacc, m, ls);

    auto load = [&](int uu, int buf) {
        const int64_t kb = u_kb[uu];
        const int c = u_cnt[uu];
        T *const dk = sK + buf * LK::elems, *const dv = sV + buf * LV::elems;
        const T *const bk = kg + kb * kst, *const bv = vg + kb * vst;
        constexpr int CK = DQK / 8, CV = DV / 8;
        for (int x = tid; x < KB * (CK + CV); x += nt) {
            if (x < KB * CK) {
                const int r = x / CK, ch = x - r * CK;
                const bool ok = r < c && ch * 8 < g.Dqk;
                cp_async16(dk + LK::off(r, ch * 8), bk + (ok ? r * kst + ch * 8 : 0), ok);
            } else {
                const int y = x - KB * CK, r = y / CV, ch = y - r * CV;
                const bool ok = r < c && ch * 8 < g.Dv;
                cp_async16(dv + LV::off(r, ch * 8), bv + (ok ? r * vst + ch * 8 : 0), ok);
            }
        }
    };
    if (nu > 0) load(0, 0);
    cp_async_commit();
    for (int uu = 0; uu < nu; uu++) {
        if (uu + 1 < nu) load(uu + 1, (uu + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const uint32_t wm = (u_mask[uu * mw + wword] >> wshift) & wbits;
        if (wm) {
            const int buf = uu & 1;
            const int64_t kb = u_kb[uu];
            const int c = u_cnt[uu];
            int vis[2]; /* keys of the block row i sees: none unless its token selected the block */
#pragma unroll
            for (int i = 0; i < 2; i++)
                vis[i] = rok[i] && ((wm >> rtok[i]) & 1u) ? (int)nsa_min64(c, rt[i] - kb + 1) : 0;
            float s[KB / 8][4];
#pragma unroll
            for (int j = 0; j < KB / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            warp_qk_l<T, DQK, KB / 8, SQ, true, LK>(s, qf, sQ, sK + buf * LK::elems, 0, lane);
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < KB / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = j * 8 + 2 * (lane & 3) + (e & 1);
                    const float x = key < vis[e >> 1] ? s[j][e] : -INFINITY;
                    s[j][e] = x;
                    mx[e >> 1] = fmaxf(mx[e >> 1], x);
                }
            warp_softmax_step(s, mx, m, ls, oacc, sl);
            warp_pv_l<T, DV, KB / 16, LV>(oacc, s, sV + buf * LV::elems, 0, lane);
        }
        __syncthreads(); /* the buffer is refilled next */
    }
    cp_async_wait<0>();

    warp_store_rows(
        oacc, m, ls, g.Dv, lane,
        [&](int i) { return rok[i] ? o + rt[i] * ost + (h0 + ((lane >> 2) + 8 * i) % gp) * osh : (float *)nullptr; },
        [&](int i) {
            return rok[i] && lse ? lse + rt[i] * lst + (h0 + ((lane >> 2) + 8 * i) % gp) * lsh : (float *)nullptr;
        });
}

template <typename T, int DQK, int DV>
static cudaError_t launch_union(const SlcUnion &t0, const Dev &dev, const Geom &g, View q, View k, View v, View idx,
                                MView o, MView lse, cudaStream_t s)
{
    static_assert(sizeof(T) == 2, "tensor-core path: 16-bit storage");
    constexpr bool PANEL = DQK % 64 == 0 && DV % 64 == 0;
    auto kern = slc_sm80_union_kernel<T, DQK, DV, PANEL>;
    SlcUnion t = t0;
    if (const char *ev = getenv("NSAX_UNION_WARPS")) { /* the measurement's warps per CTA */
        const int w = atoi(ev);
        if (w >= 1 && w <= SUN_MAXW && w * (16 / t.gp) * g.n <= SUN_MAXNE) t.warps = w;
    }
    size_t smem = slc_sm80_union_smem(DQK, DV, t.warps, t.gp, g.n);
    cudaError_t e = launch_smem(kern, dev, smem);
    if (e != cudaSuccess) return e;
    const int tt = t.warps * (16 / t.gp), ne = sun_entries(tt, g.n);
    const dim3 grid((unsigned)((g.T + tt - 1) / tt), (unsigned)g.Hkv);
    kern<<<grid, 32 * t.warps, smem, s>>>(g, t.gp, ne, (const T *)q.p, q.st, q.sh, (const T *)k.p, k.st, k.sh,
                                          (const T *)v.p, v.st, v.sh, vec_ok(q.p, q.st, q.sh, g.Dqk),
                                          (const int *)idx.p, idx.st, idx.sh, (float *)o.p, o.st, o.sh,
                                          (float *)lse.p, lse.st, lse.sh);
    return cudaGetLastError();
}

cudaError_t slc_sm80_union(const Geom &g, const Dev &dev, const SlcUnion &tile, int dqkp, int dvp, View q, View k,
                           View v, View idx, MView o, MView lse, cudaStream_t s)
{
    if (g.T == 0) return cudaSuccess;
    if (!tile.ok || !slc_sm80_union_takes(g.G, g.ls, g.n, dqkp, dvp) || tile.gp != sun_gp(g.G) ||
        !slc_sm80_g16_loads(g, k, v))
        return cudaErrorInvalidValue;
    NSA_SLC_DISPATCH(launch_union, g, dqkp, dvp, tile, dev, g, q, k, v, idx, o, lse, s);
}

} // namespace nsa_cuda
