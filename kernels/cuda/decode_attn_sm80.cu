/*
 * decode_attn_sm80.cu -- the decode step's split attention and block scores
 * on mma.sync (f16 / bf16, G <= 16, padded dims 32/32, 64/64, 128/128 or
 * 192/128; every class), beside decode.cu's fp32 kernels, which run the rest.
 *
 * Why: a new row's G query heads of one KV head are 16 rows of an m16n8k16
 * MMA (padded where G < 16), so one CTA reads each key and value of its split
 * once for the whole group; decode.cu's kernel gives each head its own warp
 * and reads K/V once per head, with the dot products on the CUDA cores.
 *
 * CTA: one (new row, KV head, split) as decode.cu (grid x rows, y KV heads,
 * z splits; DecSplit with hc = 16; a launch with two branches has the first's
 * splits, then the second's), 4 warps. The Q rows (the group's heads,
 * zero past G) go to registers. Warp w takes the split's 16-key chunks w,
 * w + 4, ...: lanes 0-15 resolve a chunk's pool rows through the page tables
 * (Keys<MODE>::row, -1 for keys a row may not see) two chunks ahead of its
 * use, so the table reads overlap the copies in flight; cp.async copies the
 * chunk's K (and V) rows into the warp's own double buffer, synchronised
 * with __syncwarp only. Then
 *   attention: S = Q K^T, one online softmax per row (warp_softmax_step, log2
 *     domain) and O += P V; the 4 warps' states merge in shared memory in warp
 *     order into the split's partial state (unnormalised o, max in natural
 *     units, sum); with ranking, S itself is stored too (DecTail::scores);
 *   block scores (PROBS, compressed keys): p = exp(scale q.k - lse_cmp) per
 *     (head, key), summed over the group's heads in a fixed lane order into
 *     pbuf (decode.cu's select kernel maps and ranks them).
 * The tail (attention, dec_tail): each CTA counts itself in (after a fence);
 * the last of its (row, KV head) merges the splits in split order, then ranks
 * the blocks or combines the branches as DecTail asks.
 * Every sum runs in a fixed order: bitwise reproducible.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>

#include "decode.h"
#include "decode_dev.cuh"
#include "tile_qk.cuh"
#include "topn.cuh"

namespace nsa_cuda {

namespace {

constexpr int DM_WARPS = 4, DM_CK = 16, DM_NB = 2; /* warps, keys per chunk, chunk buffers per warp */

/* Dev aid, compiled out unless NSA_DEC_TRACE is defined (dev/cuda/decode_trace.sh):
 * thread 0 of each CTA records the global timer (ns) at each phase into a
 * device buffer, which nsa_decode_check prints (dec_attn_sm80_trace_dump) as
 * "nsa-trace z row kvhead phase ns", z the grid's split index (the first
 * branch's splits first). Phases: 0 start, 1 keys done, 2 the split's state
 * stored, 3 last CTA (tail begins), 4 o_b merged, 5 p_cmp formed, 6 block
 * scores, 7 ranked; dec_rank_wide_kernel's: 8 start, 9 the part's block scores
 * written, 10 the last part begins ranking, 11 ranked. A record is one atomic and two stores (device printf in
 * the phases, the first form, made each phase tens of microseconds). */
#ifdef NSA_DEC_TRACE
constexpr unsigned DM_TRACE_CAP = 1u << 20;
__device__ unsigned long long dm_trace_buf[DM_TRACE_CAP][2];
__device__ unsigned dm_trace_n;
#define DM_TRACE(ph)                                                                                             \
    do {                                                                                                         \
        if (threadIdx.x == 0) {                                                                                  \
            unsigned long long ns_;                                                                              \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns_));                                            \
            const unsigned i_ = atomicAdd(&dm_trace_n, 1u);                                                      \
            if (i_ < DM_TRACE_CAP) {                                                                             \
                dm_trace_buf[i_][0] = (unsigned long long)blockIdx.z << 48 |                                    \
                                      (unsigned long long)(blockIdx.x & 0xffffffu) << 24 |                      \
                                      (unsigned long long)(blockIdx.y & 0xffffu) << 8 | (unsigned)(ph);         \
                dm_trace_buf[i_][1] = ns_;                                                                       \
            }                                                                                                    \
        }                                                                                                        \
    } while (0)
#else
#define DM_TRACE(ph) \
    do {             \
    } while (0)
#endif

/* dynamic shared memory of a kernel: Q, the warps' chunk buffers (or, after
 * them, the warps' states), and the tail's (dec_tail) arrays, which reuse it all */
constexpr size_t dm_smem(int dqkp, int dvp, bool probs)
{
    const size_t q = 2 * (size_t)16 * (dqkp + 8);
    const size_t bufs = 2 * (size_t)DM_WARPS * DM_NB * DM_CK * ((dqkp + 8) + (probs ? 0 : dvp + 8));
    const size_t states = probs ? 0 : (size_t)DM_WARPS * 16 * (dvp + 2) * 4;
    const size_t tail = probs ? 0 : (size_t)16 * DEC_SM80_MAX_SPLITS * 4 + 32 * 4 + TOPN_CAND * 8;
    const size_t body = q + (bufs > states ? bufs : states);
    return body > tail ? body : tail;
}

/* A chunk's DM_CK rows of C 16-byte pieces (pool rows in lanes 0..DM_CK-1 of
 * `row`, -1: zero-filled) into dst (row stride S elements). Where a row's
 * pieces divide the warp, each copy takes 32 / C whole rows (contiguous
 * bytes, as coalesced as one piece per lane over the chunk) and a lane's
 * piece is fixed: one shuffle and one address per copy, no division (the
 * per-piece index arithmetic bounded the kernel: ncu showed it issue-bound
 * at 3 warps per scheduler). Rejected: two lanes per key, 32 bytes of a
 * row per lane pair and copy (fewer instructions still, but 16 rows touched
 * per copy: the compressed branch at batch 64 went from 281 to 335 us). */
template <int C, typename T>
NSA_DEV void dm_copy_rows(T *dst, int S, const T *base, int64_t st, int64_t D, int64_t row, int lane)
{
    if constexpr (32 % C == 0) {
        constexpr int RPI = 32 / C;
        static_assert(DM_CK % RPI == 0, "whole copies per chunk");
        const int pc = lane % C, r0 = lane / C;
#pragma unroll
        for (int it = 0; it < DM_CK / RPI; it++) {
            const int kr = it * RPI + r0;
            const int64_t pr = __shfl_sync(0xffffffffu, row, kr);
            const bool ok = pr >= 0 && pc * 8 < D;
            cp_async16(dst + kr * S + pc * 8, ok ? (const void *)(base + pr * st + pc * 8) : (const void *)base, ok);
        }
    } else { /* 192 dims: 24 pieces a row */
        static_assert(DM_CK * C % 32 == 0, "every lane takes part in every shuffle");
#pragma unroll 4
        for (int x = lane; x < DM_CK * C; x += 32) {
            const int kr = x / C, ch = x - kr * C;
            const int64_t pr = __shfl_sync(0xffffffffu, row, kr);
            const bool ok = pr >= 0 && ch * 8 < D;
            cp_async16(dst + kr * S + ch * 8, ok ? (const void *)(base + pr * st + ch * 8) : (const void *)base, ok);
        }
    }
}

template <int DQK, int DV, bool PROBS> constexpr size_t dm_warp_elems()
{
    return (size_t)DM_NB * DM_CK * ((DQK + 8) + (PROBS ? 0 : DV + 8));
}

template <int DV>
NSA_DEV void dm_merge_warps(const DecGeom &g, const DecSplit &sp, const DecAttnIn &a, void *smem,
                            const float (&oacc)[DV / 8][4], const float (&m)[2], float (&ls)[2], int64_t r, int64_t h0,
                            int nh, int s, int warp, int lane);

template <typename T, int DV, size_t SMEM>
NSA_DEV void dec_tail(const DecGeom &g, const DecSplit &sp, const DecAttnIn &a, const DecTail &t, void *smem, int64_t r,
                      int64_t gi, int nh);

/* split s of one branch (MODE) of a launch */
template <typename T, int DQK, int DV, int MODE, bool PROBS>
NSA_DEV void dm_split(const DecGeom &g, const DecSplit &sp, const DecAttnIn &a, const DecTail &t, int s)
{
    constexpr int SQ = DQK + 8, SV = DV + 8;
    using LK = PadTile<SQ, 0>;
    using LV = PadTile<SV, 0>;
    extern __shared__ __align__(16) unsigned char smem_dyn[];
    T *const sQ = (T *)smem_dyn; /* [16][SQ] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    T *const wbuf = sQ + 16 * SQ + (size_t)warp * dm_warp_elems<DQK, DV, PROBS>();
    const int64_t r = blockIdx.x;
    /* before the wait (dec_pdl_wait): only the caller's inputs, which the step does not write */
    if (r >= dec_rows(g)) return;
    DM_TRACE(0);
    const int64_t gi = blockIdx.y, h0 = gi * g.G;
    const int nh = (int)g.G;
    const Keys<MODE> ks = dec_keys<MODE>(g, a, r, gi);
    const int64_t nk = ks.count(g), k_lo = (int64_t)s * sp.chunk, k_hi = nsa_min64(k_lo + sp.chunk, nk);

    /* the group's Q rows (16-byte loads where the rows allow them) */
    const bool q16 = (uintptr_t)a.q.p % 16 == 0 && a.q.st % 8 == 0 && a.q.sh % 8 == 0 && g.Dqk % 8 == 0;
    for (int c = threadIdx.x; c < 16 * (DQK / 8); c += DM_WARPS * 32) {
        const int i = c / (DQK / 8), e0 = (c % (DQK / 8)) * 8;
        const T *qr = (const T *)a.q.p + r * a.q.st + (h0 + i) * a.q.sh;
        if (q16) {
            uint4 v = make_uint4(0, 0, 0, 0);
            if (i < nh && e0 < g.Dqk) v = *(const uint4 *)(qr + e0);
            *(uint4 *)(sQ + i * SQ + e0) = v;
        } else {
#pragma unroll
            for (int x = 0; x < 8; x++) sQ[i * SQ + e0 + x] = i < nh && e0 + x < g.Dqk ? qr[e0 + x] : T(0.f);
        }
    }
    __syncthreads();
    uint32_t qf[DQK / 16][4];
    q_frags<SQ, true>(qf, sQ, lane);

    const float sl = g.scale * NSA_LOG2E;
    float oacc[DV / 8][4], m[2], ls[2];
    warp_state_init(oacc, m, ls);
    const T *K = (const T *)a.k.p + gi * a.k.sh, *V = (const T *)a.v.p + gi * a.v.sh;
    /* chunk i of this warp: keys k_lo + (warp + DM_WARPS i) DM_CK .. + DM_CK - 1 */
    auto chunk_key = [&](int i) { return k_lo + (int64_t)(warp + DM_WARPS * i) * DM_CK; };
    const int nchunks = k_hi > k_lo ? (int)((k_hi - k_lo + DM_CK - 1) / DM_CK) : 0;
    const int mine = nchunks > warp ? (nchunks - warp + DM_WARPS - 1) / DM_WARPS : 0;
    /* the pool rows of chunk i's keys (lanes 0-15; -1: none or not visible); before the wait
     * (checked = false) the compressed and window keys' rows only, through the tables' own columns */
    auto resolve = [&](int i, bool checked) -> int64_t {
        const int64_t key = chunk_key(i) + lane;
        if (i >= mine || lane >= DM_CK || key >= k_hi) return -1;
        if constexpr (MODE == 1)
            return ks.row(g, key);
        else
            return checked ? ks.row(g, key) : ks.row_unchecked(g, key);
    };
    int64_t rows_cur = -1, rows_next = -1;
    if constexpr (MODE != 1) {
        rows_cur = resolve(0, false);
        rows_next = resolve(1, false);
    }
    /* the predecessor's writes (the record, the caches, the selected indices) from here on */
    dec_pdl_wait();
    if (dec_failed(g)) return;
    if constexpr (MODE == 1) {
        rows_cur = resolve(0, true);
        rows_next = resolve(1, true);
    }
    /* PROBS: this thread's rows' lse_cmp in the log2 domain (rows past G: none) */
    float lse2[2] = {INFINITY, INFINITY};
    if (PROBS) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int hr = (lane >> 2) + 8 * i;
            if (hr < nh) lse2[i] = t.lse_cmp[r * t.lst + (h0 + hr) * t.lsh] * NSA_LOG2E;
        }
    }
    auto load = [&](int buf, int64_t row) {
        T *const dk = wbuf + (size_t)buf * DM_CK * (SQ + (PROBS ? 0 : SV));
        dm_copy_rows<DQK / 8>(dk, SQ, K, a.k.st, g.Dqk, row, lane);
        if constexpr (!PROBS) dm_copy_rows<DV / 8>(dk + DM_CK * SQ, SV, V, a.v.st, g.Dv, row, lane);
    };
    /* with ranking, this row's q.k products of the compressed keys ([key][G]) */
    float *const sstore = MODE == 0 && !PROBS && t.scores ? t.scores + (r * g.Hkv + gi) * t.max_nc * g.G : nullptr;
    /* the shuffles above need every lane: the loop bound is per warp (uniform) */
    if (mine > 0) load(0, rows_cur);
    cp_async_commit();
    for (int i = 0; i < mine; i++) {
        if (i + 1 < mine) load((i + 1) & 1, rows_next);
        cp_async_commit();
        const int64_t rows_after = resolve(i + 2, true); /* its table reads overlap the copies in flight */
        cp_async_wait<1>();
        __syncwarp();
        const int buf = i & 1;
        const T *const bk = wbuf + (size_t)buf * DM_CK * (SQ + (PROBS ? 0 : SV));
        float sc[DM_CK / 8][4];
#pragma unroll
        for (int j = 0; j < DM_CK / 8; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
        warp_qk_l<T, DQK, DM_CK / 8, SQ, true, LK>(sc, qf, sQ, bk, 0, lane);
        /* key columns this thread holds: j * 8 + 2 (lane & 3) + (e & 1); visible when its pool row is */
        bool kv[DM_CK / 8][2];
#pragma unroll
        for (int j = 0; j < DM_CK / 8; j++)
#pragma unroll
            for (int x = 0; x < 2; x++) kv[j][x] = __shfl_sync(0xffffffffu, rows_cur, j * 8 + 2 * (lane & 3) + x) >= 0;
        if (PROBS) {
            /* column sums over the group's rows: this thread's two rows, then lanes of equal lane & 3 */
            float cs[DM_CK / 8][2];
#pragma unroll
            for (int j = 0; j < DM_CK / 8; j++)
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    float p = 0.f;
#pragma unroll
                    for (int ii = 0; ii < 2; ii++)
                        if (kv[j][x] && lse2[ii] != INFINITY) p += exp2f(fmaf(sc[j][2 * ii + x], sl, -lse2[ii]));
                    cs[j][x] = p;
                }
#pragma unroll
            for (int o2 = 4; o2 < 32; o2 <<= 1)
#pragma unroll
                for (int j = 0; j < DM_CK / 8; j++)
#pragma unroll
                    for (int x = 0; x < 2; x++) cs[j][x] += __shfl_xor_sync(0xffffffffu, cs[j][x], o2);
            if (lane < 4) {
                float *prow = t.pbuf + (r * g.Hkv + gi) * t.max_nc;
                const int64_t c0 = chunk_key(i);
#pragma unroll
                for (int j = 0; j < DM_CK / 8; j++)
#pragma unroll
                    for (int x = 0; x < 2; x++) {
                        const int64_t key = c0 + j * 8 + 2 * lane + x;
                        if (key < k_hi) prow[key] = cs[j][x];
                    }
            }
        } else {
            if (sstore) {
                const int64_t c0 = chunk_key(i);
#pragma unroll
                for (int j = 0; j < DM_CK / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int hr = (lane >> 2) + 8 * (e >> 1);
                        const int64_t key = c0 + j * 8 + 2 * (lane & 3) + (e & 1);
                        if (hr < nh && key < k_hi) sstore[key * g.G + hr] = sc[j][e];
                    }
            }
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < DM_CK / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float x = kv[j][e & 1] ? sc[j][e] : -INFINITY;
                    sc[j][e] = x;
                    mx[e >> 1] = fmaxf(mx[e >> 1], x);
                }
            warp_softmax_step(sc, mx, m, ls, oacc, sl);
            warp_pv_l<T, DV, DM_CK / 16, LV>(oacc, sc, bk + DM_CK * SQ, 0, lane);
        }
        __syncwarp(); /* this buffer is refilled next */
        rows_cur = rows_next;
        rows_next = rows_after;
    }
    cp_async_wait<0>();
    DM_TRACE(1);
    if constexpr (!PROBS) {
        dm_merge_warps<DV>(g, sp, a, sQ + 16 * SQ, oacc, m, ls, r, h0, nh, s, warp, lane);
        /* the last CTA of (r, gi) to arrive merges the splits: every CTA's partial state
         * (and scores) are fenced before it counts itself in */
        __shared__ int last;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            int *const c = t.cnt + r * g.Hkv + gi;
            last = sp.ns == 1 || atomicAdd(c, 1) == sp.ns - 1;
            if (last && sp.ns > 1) *c = 0; /* every other split has counted: ready for the next step */
        }
        __syncthreads();
        DM_TRACE(2);
        if (!last) return;
        DM_TRACE(3);
        __threadfence();
        dec_tail<T, DV, dm_smem(DQK, DV, false)>(g, sp, a, t, smem_dyn, r, gi, nh);
    }
}

/* grid (rows, KV heads, splits of b0 then of b1): b1 (MODE2 >= 0) is a second
 * branch run beside b0 (the window beside the compressed branch), so the
 * window's splits fill the compressed branch's last wave instead of taking
 * a launch and a tail of their own */
template <typename T, int DQK, int DV, int MODE, bool PROBS, int MODE2>
__global__ void __launch_bounds__(DM_WARPS * 32, 3) /* 3 CTAs per SM at D 128: as many as shared memory holds */
    dec_attn_sm80_kernel(const __grid_constant__ DecGeom g, const __grid_constant__ DecBranch b0,
                         const __grid_constant__ DecBranch b1)
{
    const int z = (int)blockIdx.z;
    dec_pdl_launch(); /* dm_split waits (dec_pdl_wait) once it has read the caller's inputs */
    if constexpr (MODE2 < 0)
        dm_split<T, DQK, DV, MODE, PROBS>(g, b0.sp, b0.a, b0.t, z);
    else if (z < b0.sp.ns)
        dm_split<T, DQK, DV, MODE, PROBS>(g, b0.sp, b0.a, b0.t, z);
    else
        dm_split<T, DQK, DV, MODE2, false>(g, b1.sp, b1.a, b1.t, z - b0.sp.ns);
}

/* the 4 warps' states (rows lane / 4 + 8 i), merged in warp order through shared
 * memory (smem: the warps' buffers, done with) into the split's partial state */
template <int DV>
NSA_DEV void dm_merge_warps(const DecGeom &g, const DecSplit &sp, const DecAttnIn &a, void *smem,
                            const float (&oacc)[DV / 8][4], const float (&m)[2], float (&ls)[2], int64_t r, int64_t h0,
                            int nh, int s, int warp, int lane)
{
    /* the warps' states, merged in warp order: (m, l) and o per warp in shared memory */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 1);
        ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 2);
    }
    __syncthreads(); /* every warp is done with its buffers: they hold the states now */
    float *const so = (float *)smem;            /* [warps][16][DV] */
    float *const sml = so + DM_WARPS * 16 * DV; /* [warps][16][2] */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int hr = (lane >> 2) + 8 * i;
#pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            const int col = j * 8 + 2 * (lane & 3);
            so[(warp * 16 + hr) * DV + col] = oacc[j][2 * i];
            so[(warp * 16 + hr) * DV + col + 1] = oacc[j][2 * i + 1];
        }
        if ((lane & 3) == 0) {
            sml[(warp * 16 + hr) * 2] = m[i];
            sml[(warp * 16 + hr) * 2 + 1] = ls[i];
        }
    }
    __syncthreads();
    for (int x = threadIdx.x; x < nh * DV; x += DM_WARPS * 32) {
        const int hr = x / DV, e = x % DV;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DM_WARPS; w++) M = fmaxf(M, sml[(w * 16 + hr) * 2]);
        float o = 0.f, L = 0.f;
        if (M != -INFINITY)
#pragma unroll
            for (int w = 0; w < DM_WARPS; w++) {
                const float mw = sml[(w * 16 + hr) * 2];
                if (mw == -INFINITY) continue;
                const float f = exp2f(mw - M);
                o += f * so[(w * 16 + hr) * DV + e];
                L += f * sml[(w * 16 + hr) * 2 + 1];
            }
        float *pp = a.part + ((r * g.Hq + h0 + hr) * sp.ns + s) * (g.Dv + 2);
        if (e < g.Dv) pp[e] = o;
        if (e == 0) {
            pp[g.Dv] = M == -INFINITY ? -INFINITY : M * NSA_LN2; /* natural units, as decode.cu's kernel writes */
            pp[g.Dv + 1] = L;
        }
    }
}

/* A compressed key's G q.k products (si, 16-byte aligned when v4) into sv; zero past nh or when !ok */
NSA_DEV void dm_load_products(float (&sv)[16], const float *si, int nh, bool v4, bool ok)
{
    if (v4) {
#pragma unroll
        for (int z = 0; z < 4; z++) {
            const float4 v = ok && 4 * z < nh ? __ldcg((const float4 *)(si + 4 * z)) : make_float4(0.f, 0.f, 0.f, 0.f);
            sv[4 * z] = v.x;
            sv[4 * z + 1] = v.y;
            sv[4 * z + 2] = v.z;
            sv[4 * z + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int hh = 0; hh < 16; hh++) sv[hh] = ok && hh < nh ? __ldcg(si + hh) : 0.f;
    }
}

/* p_cmp's group sum of one compressed key: exp(scale q.k - lse) over the group's heads in
 * ascending order (select_kernel's order); dec_tail and dec_rank_wide share it, so both rank
 * bitwise the same scores */
NSA_DEV float dm_pcmp(const float (&sv)[16], int nh, float sl, const float *slse2)
{
    float acc2 = 0.f;
#pragma unroll
    for (int hh = 0; hh < 16; hh++)
        if (hh < nh && slse2[hh] != -INFINITY) acc2 += exp2f(fmaf(sv[hh], sl, -slse2[hh]));
    return acc2;
}

/* the block score of selection block j: p(i) of the compressed rows below nc that overlap it,
 * weighted as scores_ref weights them, in ascending i */
template <typename P>
NSA_DEV float dm_block_score(const DecGeom &g, int64_t j, int64_t nc, P p)
{
    const int64_t i0 = nsa_cmp_first_overlapping(j, g.l, g.d, g.ls);
    const int64_t i1 = nsa_min64(nsa_cmp_last_overlapping(j, g.ls, g.d), nc - 1);
    float s2 = 0.f;
    for (int64_t i = i0; i <= i1; i++) s2 += (float)nsa_overlap(i, j, g.l, g.d, g.ls) / (float)g.d * p(i);
    return s2;
}

/* the fields of Geom that warp_select_row reads */
NSA_DEV Geom dm_rank_geom(const DecGeom &g)
{
    Geom gg = {};
    gg.ls = g.ls;
    gg.n = g.n;
    gg.n_init = g.n_init;
    gg.n_local = g.n_local;
    return gg;
}

/* The last CTA of (row r, KV head gi): its heads' split states merged in
 * split order into o_b and the LSE, then the ranking or the combine. Every
 * phase keeps many independent loads in flight (one CTA does all of it).
 * Shared memory (SMEM bytes, the kernel's): f [16][ns] split factors, L and
 * lse2 per head, the ranking's candidate scratch, then p and the row of
 * block scores where they fit (else the plan's pbuf / rows). */
template <typename T, int DV, size_t SMEM>
NSA_DEV void dec_tail(const DecGeom &g, const DecSplit &sp, const DecAttnIn &a, const DecTail &t, void *smem, int64_t r,
                      int64_t gi, int nh)
{
    constexpr int NT = DM_WARPS * 32, PER = 16 * DV / NT; /* outputs per thread at nh = 16 */
    const int ns = sp.ns, tid = threadIdx.x;
    const int64_t h0 = gi * g.G, W = g.Dv + 2;
    float *const sf = (float *)smem;      /* [16][ns] */
    float *const sL = sf + 16 * ns;       /* [16] */
    float *const slse2 = sL + 16;         /* [16] the LSE in the log2 domain */
    uint64_t *const cand = (uint64_t *)(slse2 + 16); /* 8-byte aligned: 64 ns + 128 bytes in */
    float *const sfree = (float *)(cand + TOPN_CAND);
    const int64_t nfree = ((int64_t)SMEM - (int64_t)((char *)sfree - (char *)smem)) / 4;
    const float *const part = a.part + (r * g.Hq + h0) * ns * W; /* [heads][ns][Dv + 2] */
    /* 8 threads per head (lanes of one warp): the max, the factors, the sum over splits s = u (mod 8);
     * up to 32 splits every max and sum is loaded at once (one trip to L2, not two) */
    {
        const int hr = tid >> 3, u = tid & 7;
        constexpr int NR = 4;
        float M = -INFINITY, L = 0.f, mr[NR], lr[NR];
        const bool held = ns <= 8 * NR;
        auto ml = [&](int x) { return part + ((int64_t)hr * ns + x) * W + g.Dv; }; /* split x's max, then its sum */
        if (held) {
#pragma unroll
            for (int k = 0; k < NR; k++) {
                const int x = u + 8 * k;
                const bool ok = hr < nh && x < ns;
                mr[k] = ok ? __ldcg(ml(x)) : -INFINITY;
                lr[k] = ok ? __ldcg(ml(x) + 1) : 0.f;
                M = fmaxf(M, mr[k]);
            }
        } else if (hr < nh) {
            for (int x = u; x < ns; x += 8) M = fmaxf(M, __ldcg(ml(x)));
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        if (held) {
#pragma unroll
            for (int k = 0; k < NR; k++) {
                const int x = u + 8 * k;
                if (hr >= nh || x >= ns) continue;
                const float f = mr[k] == -INFINITY ? 0.f : expf(mr[k] - M);
                sf[hr * ns + x] = f;
                L += f * lr[k];
            }
        } else if (hr < nh) {
            for (int x = u; x < ns; x += 8) {
                const float mx = __ldcg(ml(x));
                const float f = mx == -INFINITY ? 0.f : expf(mx - M);
                sf[hr * ns + x] = f;
                L += f * __ldcg(ml(x) + 1);
            }
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
        if (hr < nh && u == 0) {
            sL[hr] = L;
            const float lse = L != 0.f ? M + logf(L) : -INFINITY;
            slse2[hr] = lse * NSA_LOG2E;
            if (a.lse) a.lse[r * a.lst + (h0 + hr) * a.lsh] = lse;
        }
    }
    __syncthreads();
    /* o_b: output x = tid + NT k of the [16][DV] tile; splits outer, so 4 PER loads are in flight at once */
    float acc[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) acc[k] = 0.f;
#pragma unroll 4
    for (int y = 0; y < ns; y++)
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int x = tid + NT * k, hr = x / DV, e = x % DV;
            if (hr < nh && e < g.Dv) acc[k] += __ldcg(part + ((int64_t)hr * ns + y) * W + e) * sf[hr * ns + y];
        }
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int x = tid + NT * k, hr = x / DV, e = x % DV;
        if (hr >= nh || e >= g.Dv) continue;
        const float L = sL[hr];
        a.o[r * a.ost + (h0 + hr) * a.osh + e] = L != 0.f ? acc[k] * (1.0f / L) : 0.f;
    }
    DM_TRACE(4);
    if (t.combine) {
        /* with two branches in the launch, the second of their last CTAs to arrive combines */
        if (t.nbranch > 1) {
            __shared__ int go;
            __threadfence();
            __syncthreads();
            if (tid == 0) {
                int *const c = t.bdone + r * g.Hkv + gi;
                go = atomicAdd(c, 1) == t.nbranch - 1;
                if (go) *c = 0; /* ready for the next step */
            }
            __syncthreads();
            if (!go) return; /* (no ranking in such a launch: dec_attn_sm80 refuses it) */
            __threadfence();
        }
        /* o = sum_b gate_b o_b, as decode.cu's combine kernel sums it (o_b read from L2: another CTA may
         * have written it) */
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int x = tid + NT * k, hr = x / DV, e = x % DV;
            if (hr >= nh || e >= g.Dv) continue;
            const int64_t h = h0 + hr;
            float sum = 0.f;
#pragma unroll
            for (int b = 0; b < 3; b++)
                if (t.ob[b].p)
                    sum += ((const float *)t.gate[b].p)[r * t.gate[b].st + h * t.gate[b].sh] *
                           __ldcg((const float *)t.ob[b].p + r * t.ob[b].st + h * t.ob[b].sh + e);
            ((T *)t.o)[r * t.ost + h * t.osh + e] = from_f<T>(sum);
        }
    }
    if (!t.scores || t.rank_wide) return; /* rank_wide: dec_rank_wide ranks after the launch */
    /* ranking: p(i) = sum over the group's heads of exp(scale q.k_i - lse), the block
     * scores of the eligible selection blocks (select_kernel's sums), then the top-n */
    const int64_t b = dec_row_seq(g, r), tt = g.tk0[b] + r - g.cu[b], nc = nsa_cmp_visible(tt, g.l, g.d);
    const int64_t cur = nsa_slc_last(tt, g.ls);
    const float sl = g.scale * NSA_LOG2E;
    const float *const sc = t.scores + (r * g.Hkv + gi) * t.max_nc * g.G;
    const bool in_smem = nc + cur + 1 <= nfree;
    float *const p = in_smem ? sfree : t.pbuf + (r * g.Hkv + gi) * t.max_nc;
    float *const row = in_smem ? sfree + nc : t.rows + (r * g.Hkv + gi) * g.max_ns;
    /* PK keys per thread per round, every one of their G products loaded before any
     * is summed: PK * 16 loads in flight (one key per round would make 4 to 16
     * dependent round trips to L2 per key). A key's sum runs over its heads in ascending order,
     * as select_kernel's does. */
    constexpr int PK = 4;
    const bool v4 = g.G % 4 == 0; /* a key's G products as float4 (the buffer and its rows are 16-byte aligned) */
    for (int64_t i0 = tid; i0 < nc; i0 += (int64_t)NT * PK) {
        float sv[PK][16];
#pragma unroll
        for (int u = 0; u < PK; u++) {
            const int64_t i = i0 + (int64_t)NT * u;
            dm_load_products(sv[u], sc + i * g.G, nh, v4, i < nc);
        }
#pragma unroll
        for (int u = 0; u < PK; u++) {
            const int64_t i = i0 + (int64_t)NT * u;
            const float acc2 = dm_pcmp(sv[u], nh, sl, slse2);
            if (i < nc) p[i] = acc2;
        }
    }
    __syncthreads();
    DM_TRACE(5);
    for (int64_t j = tid; j <= cur; j += NT) row[j] = dm_block_score(g, j, nc, [&](int64_t i) { return p[i]; });
    __syncthreads();
    DM_TRACE(6);
    if (tid < 32) {
        const Geom gg = dm_rank_geom(g);
        warp_select_row(gg, row, tt, t.idx + r * t.ist + gi * t.ish, tid, cand);
        DM_TRACE(7);
    }
}

/* the launch's kernel: (0, probs) alone, 0 with the window beside it (b1 absent: splits of b0
 * alone), or 1 alone; prep sets the kernels' shared-memory opt-in (once per plan, outside any
 * capture) and launches nothing */
template <typename T, int DQK, int DV>
static cudaError_t launch_dm(const DecGeom &g, bool probs, const DecBranch &b0, const DecBranch *b1, cudaStream_t s,
                             bool prep)
{
    const size_t smem = dec_attn_sm80_smem(DQK, DV, probs);
    const DecBranch none = {};
    const dim3 grid((unsigned)g.MT, (unsigned)g.Hkv, (unsigned)(b0.sp.ns + (b1 ? b1->sp.ns : 0)));
    cudaError_t e = cudaSuccess;
    auto run = [&](auto kern) {
        if (prep) {
            if (e == cudaSuccess) e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        } else {
            if (e == cudaSuccess) e = dec_launch(g.pdl, kern, grid, DM_WARPS * 32, smem, s, g, b0, b1 ? *b1 : none);
        }
    };
    if (prep) {
        run(dec_attn_sm80_kernel<T, DQK, DV, 0, true, -1>);
        run(dec_attn_sm80_kernel<T, DQK, DV, 0, false, 2>);
        run(dec_attn_sm80_kernel<T, DQK, DV, 1, false, -1>);
        return e;
    }
    if (probs)
        run(dec_attn_sm80_kernel<T, DQK, DV, 0, true, -1>);
    else if (b0.mode == 0)
        run(dec_attn_sm80_kernel<T, DQK, DV, 0, false, 2>);
    else
        run(dec_attn_sm80_kernel<T, DQK, DV, 1, false, -1>);
    return e;
}

/* dec_rank_wide (decode.h): part z of (row r, KV head gi)'s selection blocks. Shared memory:
 * the part's p_cmp sums (RW_PCAP compressed rows; a part with more reads them again from the
 * products per block: the same sums), then the whole row for the ranking where it fits. */
constexpr int RW_THREADS = 128, RW_PCAP = 2048, RW_ROWCAP = 8192;

__global__ void __launch_bounds__(RW_THREADS)
    dec_rank_wide_kernel(const __grid_constant__ DecGeom g, const __grid_constant__ DecRankWide w)
{
    __shared__ float sp[RW_PCAP];
    __shared__ float srow[RW_ROWCAP];
    __shared__ float slse2[16];
    __shared__ __align__(8) uint64_t cand[TOPN_CAND];
    __shared__ int last;
    const int64_t r = blockIdx.x;
    dec_pdl_enter();
    if (dec_failed(g) || r >= dec_rows(g)) return;
    DM_TRACE(8);
    const int64_t gi = blockIdx.y, h0 = gi * g.G;
    const int tid = threadIdx.x, nh = (int)g.G;
    const int64_t b = dec_row_seq(g, r), tt = g.tk0[b] + r - g.cu[b], nc = nsa_cmp_visible(tt, g.l, g.d);
    const int64_t E = nsa_slc_last(tt, g.ls) + 1, jb = (E + w.parts - 1) / w.parts;
    const int64_t j0 = nsa_min64((int64_t)blockIdx.z * jb, E), j1 = nsa_min64(j0 + jb, E);
    const float sl = g.scale * NSA_LOG2E;
    const float *const sc = w.scores + (r * g.Hkv + gi) * w.max_nc * g.G;
    float *const row = w.rows + (r * g.Hkv + gi) * g.max_ns;
    const bool v4 = g.G % 4 == 0;
    /* the LSE as dec_tail holds it (slse2 = lse * log2 e of the lse it stored) */
    if (tid < 16) slse2[tid] = tid < nh ? w.lse_cmp[r * w.lst + (h0 + tid) * w.lsh] * NSA_LOG2E : -INFINITY;
    __syncthreads();
    if (j0 < j1) {
        const int64_t p0 = nsa_cmp_first_overlapping(j0, g.l, g.d, g.ls);
        const int64_t p1 = nsa_min64(nsa_cmp_last_overlapping(j1 - 1, g.ls, g.d), nc - 1);
        const bool cached = p1 - p0 + 1 <= RW_PCAP;
        auto pv = [&](int64_t i) {
            float sv[16];
            dm_load_products(sv, sc + i * g.G, nh, v4, true);
            return dm_pcmp(sv, nh, sl, slse2);
        };
        if (cached)
            for (int64_t i = p0 + tid; i <= p1; i += RW_THREADS) sp[i - p0] = pv(i);
        __syncthreads();
        for (int64_t j = j0 + tid; j < j1; j += RW_THREADS)
            row[j] = cached ? dm_block_score(g, j, nc, [&](int64_t i) { return sp[i - p0]; })
                            : dm_block_score(g, j, nc, pv);
    }
    /* the last part to arrive ranks the row (every part's block scores fenced before it counts in) */
    DM_TRACE(9);
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        int *const c = w.cnt + r * g.Hkv + gi;
        last = w.parts == 1 || atomicAdd(c, 1) == w.parts - 1;
        if (last && w.parts > 1) *c = 0; /* ready for the next step */
    }
    __syncthreads();
    if (!last) return;
    DM_TRACE(10);
    __threadfence();
    const float *rr = row; /* read from L2 where it does not fit: no CTA of this SM loaded it before */
    if (E <= RW_ROWCAP) {
        for (int64_t j = tid; j < E; j += RW_THREADS) srow[j] = __ldcg(row + j);
        __syncthreads();
        rr = srow;
    }
    if (tid < 32) {
        const Geom gg = dm_rank_geom(g);
        warp_select_row(gg, rr, tt, w.idx + r * w.ist + gi * w.ish, tid, cand);
        DM_TRACE(11);
    }
}

} // namespace

size_t dec_attn_sm80_smem(int dqkp, int dvp, bool probs) { return dm_smem(dqkp, dvp, probs); }

bool dec_attn_sm80_takes(int dtype, int64_t G, int dqkp, int dvp)
{
    return (dtype == 1 || dtype == 2) && G >= 1 && G <= 16 && tc_pair_dims(dqkp, dvp);
}

cudaError_t dec_attn_sm80_prepare(int dtype, int dqkp, int dvp)
{
    if (!dec_attn_sm80_takes(dtype, 1, dqkp, dvp)) return cudaErrorInvalidValue;
    Geom gg = {};
    gg.dtype = dtype;
    const DecGeom g = {};
    const DecBranch b = {};
    NSA_SLC_DISPATCH(launch_dm, gg, dqkp, dvp, g, false, b, nullptr, (cudaStream_t) nullptr, true);
}

template <typename T, int DQK, int DV>
static cudaError_t occupancy_dims(const DecGeom &, int *ctas)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas, dec_attn_sm80_kernel<T, DQK, DV, 0, false, 2>,
                                                         DM_WARPS * 32, dm_smem(DQK, DV, false));
}

cudaError_t dec_attn_sm80_ctas_per_sm(int dtype, int dqkp, int dvp, int *ctas)
{
    *ctas = 0;
    if (!dec_attn_sm80_takes(dtype, 1, dqkp, dvp)) return cudaErrorInvalidValue;
    Geom gg = {};
    gg.dtype = dtype;
    const DecGeom g = {};
    NSA_SLC_DISPATCH(occupancy_dims, gg, dqkp, dvp, g, ctas);
}

/* what a branch of a launch must hold (the kernels' tails rely on it) */
static bool branch_ok(const DecBranch &b, bool probs)
{
    if (b.sp.hc != 16 || b.sp.ns < 0) return false;
    if (probs) return b.mode == 0 && b.t.pbuf && b.t.lse_cmp;
    if (!b.t.cnt || b.sp.ns > DEC_SM80_MAX_SPLITS || (b.t.scores && (b.mode != 0 || !b.t.idx))) return false;
    if (b.t.combine && b.t.nbranch > 1 && (!b.t.bdone || b.t.scores)) return false;
    return b.mode >= 0 && b.mode <= 2;
}

cudaError_t dec_attn_sm80(const DecGeom &g, bool probs, int dqkp, int dvp, const DecBranch &b0, const DecBranch *b1,
                          cudaStream_t s)
{
    if (g.MT == 0) return cudaSuccess; /* s may be the legacy default stream (0): a caller's choice */
    /* b0 alone: the compressed or the selected branch; with b1: the window beside the compressed one */
    if (!dec_attn_sm80_takes(g.dtype, g.G, dqkp, dvp) || !branch_ok(b0, probs) || (!b1 && b0.mode == 2) ||
        (b1 && (probs || b0.mode != 0 || b1->mode != 2 || !branch_ok(*b1, false) || b1->t.cnt == b0.t.cnt ||
                (b1->t.combine && b1->t.nbranch != 2))))
        return cudaErrorInvalidValue;
    Geom gg = {};
    gg.dtype = g.dtype;
    NSA_SLC_DISPATCH(launch_dm, gg, dqkp, dvp, g, probs, b0, b1, s, false);
}

#ifdef NSA_DEC_TRACE
void dec_attn_sm80_trace_dump()
{
    unsigned n = 0;
    if (cudaMemcpyFromSymbol(&n, dm_trace_n, sizeof n) != cudaSuccess) return;
    n = n < DM_TRACE_CAP ? n : DM_TRACE_CAP;
    unsigned long long(*buf)[2] = (unsigned long long(*)[2])malloc((size_t)n * sizeof *buf + 1);
    if (buf && cudaMemcpyFromSymbol(buf, dm_trace_buf, (size_t)n * sizeof *buf) == cudaSuccess)
        for (unsigned i = 0; i < n; i++)
            printf("nsa-trace %u %u %u %u %llu\n", (unsigned)(buf[i][0] >> 48), (unsigned)(buf[i][0] >> 24) & 0xffffffu,
                   (unsigned)(buf[i][0] >> 8) & 0xffffu, (unsigned)buf[i][0] & 0xffu, buf[i][1]);
    free(buf);
    const unsigned zero = 0;
    cudaMemcpyToSymbol(dm_trace_n, &zero, sizeof zero);
}
#endif

cudaError_t dec_rank_wide(const DecGeom &g, const DecRankWide &w, cudaStream_t s)
{
    if (w.parts < 1 || w.parts > 65535 || g.MT < 1 || g.Hkv > 65535) return cudaErrorInvalidValue;
    return dec_launch(g.pdl, dec_rank_wide_kernel, dim3((unsigned)g.MT, (unsigned)g.Hkv, (unsigned)w.parts),
                      RW_THREADS, 0, s, g, w);
}

int dec_rank_wide_parts(int64_t MT, int64_t Hkv, int64_t max_ns, int64_t l, int64_t d, int64_t ls, int sms, bool force)
{
    const int64_t rows = MT * Hkv;
    if (rows <= 0 || max_ns < 1 || d <= 0 || ls <= 0 || (!force && 2 * rows > sms)) return 0;
    /* a part of jb blocks reads at most (jb l_s + l) / d + 2 compressed rows: jb <= jmax keeps them
     * in shared memory */
    const int64_t jmax = ((int64_t)(RW_PCAP - 2) * d - l) / ls;
    if (jmax < 1) return 0;
    const int64_t parts = std::max<int64_t>({std::min<int64_t>(sms / rows, max_ns), (max_ns + jmax - 1) / jmax,
                                             force ? 2 : 0});
    return parts >= 2 && parts <= 65535 ? (int)parts : 0;
}

} // namespace nsa_cuda
