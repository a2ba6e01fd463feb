/*
 * decode.cu -- the decode step on the device (semantics section 10): the
 * checks of the step's lengths and page tables, the append to the paged
 * caches, the compressed rows a step completes, and the three branches of
 * every new row, split across CTAs flash-decoding style.
 *
 * Checks (dec_check): two kernels.
 *   1. per (sequence, table column): the lengths (column 0), the table
 *      entries the sequence reads or writes (range), and a count of every
 *      in-range page of every sequence (atomicAdd on int: exact);
 *   2. per (sequence, column): pages the step writes whose count is not 1;
 *      then one thread of the last CTA to arrive: the first bad sequence
 *      of (1), else of (2) (atomicMax on
 *      UINT64_MAX - b, integers: deterministic), re-walked in the cpu
 *      reference's order to name the entry; writes the record and the
 *      caller's status tensor.
 * Every later kernel reads the record's status first and returns when the
 * step failed, so a failed step writes nothing else.
 *
 * Attention (dec_attn): one CTA per (new row, KV head x chunk of hc query
 * heads, split). A split walks `chunk` consecutive keys of the row's key list
 * (compressed rows 0 .. nc(t) - 1; the selected blocks' positions, slot
 * after slot; the window) 32 at a time, one key per lane, as attn_ref.cu
 * does: the lane's logit over the whole head dim (K rows read through the
 * page table, 16 bytes at a time where aligned), a warp online-softmax step,
 * then each lane accumulates its output dims. The CTA's 4 warps take its
 * heads in turn. Each split writes its partial state (unnormalised o, max,
 * sum) to plan memory; a merge kernel combines the splits of a (row, head)
 * in split order. No float atomics anywhere: bitwise reproducible.
 *
 * Selection (dec_select): the p_cmp group sums of every visible compressed
 * row (split like the compressed branch), then one warp per (row, KV head)
 * maps them onto the eligible selection blocks (scores_ref.cu's sum order)
 * and ranks them with the forward's warp_select_row (topn.cuh): the same
 * rank keys, forced blocks and tie rule.
 */
#include <math.h>

#include "decode.h"
#include "decode_dev.cuh"
#include "nsa.h"
#include "nsa_cuda.cuh"
#include "topn.cuh"

namespace nsa_cuda {

namespace {

constexpr int DW = 4; /* warps per CTA of the attention and merge kernels */

/* ------------------------------------------------------------------ checks */

NSA_DEV int len_reason(const DecGeom &g, int64_t b)
{
    return nsa_dec_len_reason(b, g.cu[b], g.cu[b + 1], g.tk0[b], g.MT, g.max_step, g.max_context, g.max_pages, g.ps,
                              g.max_cmp_pages, g.cps, g.l, g.d);
}

NSA_DEV void flag(unsigned long long *f, int64_t b) { atomicMax(f, ~0ull - (unsigned long long)b); }

/* phase 1 for item it = (sequence b, table column x) */
NSA_DEV void check_entry(const DecGeom &g, const DecCheckMem &m, int64_t cols, int64_t it)
{
    const int64_t b = it / cols, x = it % cols;
    if (len_reason(g, b) != NSA_DRS_OK) {
        if (x == 0) flag(&m.flags[0], b);
        return;
    }
    const int64_t tq = (int64_t)g.cu[b + 1] - g.cu[b], tk = g.tk0[b] + tq;
    const int64_t np = nsa_min64((tk + g.ps - 1) / g.ps, g.max_pages);
    const int64_t ncp = nsa_min64((dnum_cmp(g, tk) + g.cps - 1) / g.cps, g.max_cmp_pages);
    if (x < np) {
        const int e = g.bt[b * g.bt_st + x];
        const bool in = e >= 0 && e < g.num_pages;
        if (!in && tq > 0) flag(&m.flags[0], b);
        if (in) atomicAdd(&m.pcount[e], 1);
    }
    if (g.cbt && x < ncp) {
        const int e = g.cbt[b * g.cbt_st + x];
        const bool in = e >= 0 && e < g.num_cmp_pages;
        if (!in && tq > 0) flag(&m.flags[0], b);
        if (in) atomicAdd(&m.ccount[e], 1);
    }
}

/* phase 2 for item it, once every phase-1 count is in: a written page counted more than once
 * (the counts through L2: other threads' atomics made them) */
NSA_DEV void check_written(const DecGeom &g, const DecCheckMem &m, int64_t cols, int64_t it)
{
    const int64_t b = it / cols, x = it % cols;
    const int64_t tq = (int64_t)g.cu[b + 1] - g.cu[b], tk0 = g.tk0[b], tk = tk0 + tq;
    if (tq == 0) return;
    if (x >= tk0 / g.ps && x <= (tk - 1) / g.ps && __ldcg(&m.pcount[g.bt[b * g.bt_st + x]]) != 1)
        flag(&m.flags[1], b);
    const int64_t nc0 = dnum_cmp(g, tk0), nc1 = dnum_cmp(g, tk);
    if (g.compress != NSA_COMPRESS_EXTERNAL && g.cbt && nc1 > nc0 && x >= nc0 / g.cps && x <= (nc1 - 1) / g.cps &&
        __ldcg(&m.ccount[g.cbt[b * g.cbt_st + x]]) != 1)
        flag(&m.flags[1], b);
}

__global__ void check_entries_kernel(const DecGeom g, DecCheckMem m, int64_t cols)
{
    dec_pdl_enter();
    const int64_t items = g.B * cols;
    for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; it < items;
         it += (int64_t)gridDim.x * blockDim.x)
        check_entry(g, m, cols, it);
}

NSA_DEV void check_verdict(const DecGeom &g, const DecCheckMem &m);

/* Phase 2, then (the last CTA to arrive, one thread) the verdict. */
__global__ void check_shared_kernel(const DecGeom g, DecCheckMem m, int64_t cols)
{
    __shared__ bool last;
    dec_pdl_enter();
    if (m.flags[0] == 0) { /* (flags[0] is phase 1's: final since the previous kernel) */
        const int64_t items = g.B * cols;
        for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; it < items;
             it += (int64_t)gridDim.x * blockDim.x)
            check_written(g, m, cols, it);
    }
    /* count in (the memset zeroed the counter); the last CTA's first thread sees every flag */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(m.arrive, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    __threadfence();
    check_verdict(g, m);
}

/* the first bad sequence, re-walked in the cpu reference's order; writes the record and the status */
NSA_DEV void check_verdict(const DecGeom &g, const DecCheckMem &m)
{
    int rec[NSA_DR_FIELDS];
    for (int i = 0; i < NSA_DR_FIELDS; i++) rec[i] = 0;
    rec[NSA_DR_SEQ] = -1;
    /* through L2: other CTAs set flags[1] with atomics during this kernel */
    const unsigned long long f0 = __ldcg(&m.flags[0]), f1 = __ldcg(&m.flags[1]);
    if (f0 != 0 || f1 != 0) {
        const int64_t b = (int64_t)(~0ull - (f0 != 0 ? f0 : f1));
        const int64_t tq = (int64_t)g.cu[b + 1] - g.cu[b], tk0 = g.tk0[b], tk = tk0 + tq;
        rec[NSA_DR_SEQ] = (int)b;
        rec[NSA_DR_CU0] = g.cu[b];
        rec[NSA_DR_CU1] = g.cu[b + 1];
        rec[NSA_DR_TK0] = g.tk0[b];
        int reason = f0 != 0 ? len_reason(g, b) : NSA_DRS_OK;
        rec[NSA_DR_STATUS] = reason != NSA_DRS_OK ? NSA_ERR_INVALID_SHAPE : NSA_ERR_INVALID_VALUE;
        if (f0 != 0 && reason == NSA_DRS_OK) { /* the first entry out of range: pages, then compressed pages */
            const int64_t np = (tk + g.ps - 1) / g.ps, ncp = (dnum_cmp(g, tk) + g.cps - 1) / g.cps;
            for (int64_t x = 0; x < np && reason == NSA_DRS_OK; x++) {
                const int e = g.bt[b * g.bt_st + x];
                if (e < 0 || e >= g.num_pages) reason = NSA_DRS_ENTRY, rec[NSA_DR_COL] = (int)x, rec[NSA_DR_ENTRY] = e;
            }
            for (int64_t x = 0; g.cbt && x < ncp && reason == NSA_DRS_OK; x++) {
                const int e = g.cbt[b * g.cbt_st + x];
                if (e < 0 || e >= g.num_cmp_pages) reason = NSA_DRS_CMP_ENTRY, rec[NSA_DR_COL] = (int)x, rec[NSA_DR_ENTRY] = e;
            }
        } else if (f0 == 0) { /* the first written page that appears more than once */
            for (int64_t x = tk0 / g.ps; x <= (tk - 1) / g.ps && reason == NSA_DRS_OK; x++) {
                const int e = g.bt[b * g.bt_st + x];
                const int c = __ldcg(&m.pcount[e]);
                if (c != 1) reason = NSA_DRS_SHARED, rec[NSA_DR_COL] = (int)x, rec[NSA_DR_ENTRY] = e, rec[NSA_DR_COUNT] = c;
            }
            const int64_t nc0 = dnum_cmp(g, tk0), nc1 = dnum_cmp(g, tk);
            if (g.compress != NSA_COMPRESS_EXTERNAL && g.cbt && nc1 > nc0)
                for (int64_t x = nc0 / g.cps; x <= (nc1 - 1) / g.cps && reason == NSA_DRS_OK; x++) {
                    const int e = g.cbt[b * g.cbt_st + x];
                    const int c = __ldcg(&m.ccount[e]);
                    if (c != 1)
                        reason = NSA_DRS_CMP_SHARED, rec[NSA_DR_COL] = (int)x, rec[NSA_DR_ENTRY] = e, rec[NSA_DR_COUNT] = c;
                }
        }
        rec[NSA_DR_REASON] = reason;
    }
    for (int i = 0; i < NSA_DR_FIELDS; i++) g.rec[i] = rec[i];
    if (g.status) {
        g.status[0] = rec[NSA_DR_STATUS];
        g.status[1] = rec[NSA_DR_SEQ];
    }
}

/* The checks of a small step in one CTA (dec_check: every item and the check memory fit
 * it): the memory zeroed (instead of the step's memset), phase 1, phase 2 and the verdict,
 * with barriers where the two-kernel form has kernel boundaries. */
__global__ void __launch_bounds__(DEC_CHECK_ONE_THREADS) check_one_kernel(const DecGeom g, DecCheckMem m,
                                                                          int64_t cols, int64_t words)
{
    dec_pdl_enter();
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x) ((int *)m.flags)[i] = 0;
    __syncthreads();
    const int64_t items = g.B * cols;
    for (int64_t it = threadIdx.x; it < items; it += blockDim.x) check_entry(g, m, cols, it);
    __syncthreads();
    if (__ldcg(&m.flags[0]) == 0)
        for (int64_t it = threadIdx.x; it < items; it += blockDim.x) check_written(g, m, cols, it);
    __syncthreads();
    if (threadIdx.x == 0) check_verdict(g, m);
}

unsigned grid_for(int64_t items, int threads)
{
    int64_t b = (items + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > (1 << 20)) b = 1 << 20;
    return (unsigned)b;
}

/* ------------------------------------------------------------------ append and compress */

/* The compressed row (if any) whose block ends at new position x of sequence b,
 * for KV head h: fp32 sums in the forward's order, rounded once. Position p of
 * the block: the step's input row cu[b] + p - tk0[b] where p >= tk0[b] (the
 * append of this launch writes it to the cache), else the cached row. */
template <typename T>
NSA_DEV void compress_row(const DecGeom &g, const DecCompress &cp, int64_t b, int64_t h, int64_t x)
{
    if (x + 1 < g.l || (x + 1 - g.l) % g.d != 0) return; /* no block ends at x */
    const int64_t i = (x + 1 - g.l) / g.d, crow = dec_crow(g, b, i), tk0 = g.tk0[b], r0 = g.cu[b];
    for (int kv = 0; kv < 2; kv++) {
        const DecCache src = kv ? cp.vraw : cp.kraw, dst = kv ? cp.vc : cp.kc;
        const DecIn in = kv ? cp.vin : cp.kin;
        const int64_t D = kv ? g.Dv : g.Dqk;
        const T *W = (const T *)(kv ? cp.wv : cp.wk), *pe = (const T *)(kv ? cp.pev : cp.pek);
        auto rowp = [&](int64_t j) {
            const int64_t p = i * g.d + j;
            return p >= tk0 ? (const T *)in.p + (r0 + p - tk0) * in.st + h * in.sh
                            : (const T *)src.p + dec_prow(g, b, p) * src.st + h * src.sh;
        };
        T *out = (T *)dst.p + crow * dst.st + h * dst.sh;
        for (int64_t o = threadIdx.x; o < D; o += blockDim.x) {
            float acc = 0.f;
            if (g.compress == NSA_COMPRESS_MEAN) {
                for (int64_t j = 0; j < g.l; j++) acc += to_f(rowp(j)[o]);
                acc *= 1.0f / (float)g.l;
            } else {
                for (int64_t j = 0; j < g.l; j++) {
                    const T *xr = rowp(j);
                    const T *wj = W + (h * g.l + j) * D * D + o;
                    const T *pj = pe ? pe + (h * g.l + j) * D : nullptr;
                    for (int64_t k = 0; k < D; k++) {
                        float xv = to_f(xr[k]);
                        if (pj) xv += to_f(pj[k]);
                        acc += xv * to_f(wj[k * D]);
                    }
                }
            }
            out[o] = from_f<T>(acc);
        }
    }
}

/* one CTA per (new row, KV head): the row into every distinct cache, then the
 * compressed row its position completes */
template <typename T>
__global__ void append_kernel(const DecGeom g, const __grid_constant__ DecAppend ap,
                              const __grid_constant__ DecCompress cp)
{
    dec_pdl_enter();
    if (dec_failed(g)) return;
    const int64_t rows = dec_rows(g), pairs = rows * g.Hkv;
    for (int64_t pr = blockIdx.x; pr < pairs; pr += gridDim.x) {
        const int64_t r = pr / g.Hkv, h = pr % g.Hkv, b = dec_row_seq(g, r);
        const int64_t x = g.tk0[b] + r - g.cu[b], row = dec_prow(g, b, x);
        for (int c = 0; c < ap.n; c++) {
            const T *sp = (const T *)ap.src[c].p + r * ap.src[c].st + h * ap.src[c].sh;
            T *dp = (T *)ap.dst[c].p + row * ap.dst[c].st + h * ap.dst[c].sh;
            for (int64_t e = threadIdx.x; e < ap.D[c]; e += blockDim.x) dp[e] = sp[e];
        }
        if (cp.kc.p) compress_row<T>(g, cp, b, h, x);
    }
}

/* ------------------------------------------------------------------ attention */

/* dot of the staged q (floats) with D elements of row kr; VEC: 16-byte loads */
template <typename T, bool VEC> NSA_DEV float dot_row(const float *sq, const T *kr, int64_t D)
{
    float dot = 0.f;
    if (VEC) {
        constexpr int VE = 16 / sizeof(T);
        for (int64_t e = 0; e < D; e += VE) {
            union {
                uint4 u;
                T x[VE];
            } w;
            w.u = *reinterpret_cast<const uint4 *>(kr + e);
#pragma unroll
            for (int k = 0; k < VE; k++) dot += sq[e + k] * to_f(w.x[k]);
        }
    } else {
        for (int64_t e = 0; e < D; e++) dot += sq[e] * to_f(kr[e]);
    }
    return dot;
}

template <typename T, int MODE, bool VEC>
__global__ void __launch_bounds__(DW * 32) attn_kernel(const DecGeom g, const DecSplit sp, const DecAttnIn a)
{
    extern __shared__ float sm[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t r = blockIdx.x;
    dec_pdl_enter();
    if (dec_failed(g) || r >= dec_rows(g)) return;
    const int nhc = (int)((g.G + sp.hc - 1) / sp.hc);
    const int64_t gi = blockIdx.y / nhc, h0 = gi * g.G + (int64_t)(blockIdx.y % nhc) * sp.hc;
    const int64_t h1 = nsa_min64(h0 + sp.hc, (gi + 1) * g.G);
    const int s = blockIdx.z;
    float *sq = sm + warp * (g.Dqk + g.Dv + 32), *so = sq + g.Dqk, *spr = so + g.Dv;
    int64_t *srow = (int64_t *)(sm + DW * (g.Dqk + g.Dv + 32)) + warp * 32;
    const Keys<MODE> ks = dec_keys<MODE>(g, a, r, gi);
    const int64_t nk = ks.count(g), k_lo = (int64_t)s * sp.chunk, k_hi = nsa_min64(k_lo + sp.chunk, nk);
    const T *K = (const T *)a.k.p, *V = (const T *)a.v.p;
    for (int64_t h = h0 + warp; h < h1; h += DW) {
        const T *qr = (const T *)a.q.p + r * a.q.st + h * a.q.sh;
        for (int64_t e = lane; e < g.Dqk; e += 32) sq[e] = to_f(qr[e]) * g.scale;
        for (int64_t e = lane; e < g.Dv; e += 32) so[e] = 0.f;
        __syncwarp();
        float m = -INFINITY, lsum = 0.f;
        for (int64_t c0 = k_lo; c0 < k_hi; c0 += 32) {
            const int64_t key = c0 + lane;
            const int64_t row = key < k_hi ? ks.row(g, key) : -1;
            float sv = -INFINITY;
            if (row >= 0) sv = dot_row<T, VEC>(sq, K + row * a.k.st + gi * a.k.sh, g.Dqk);
            const float mnew = fmaxf(m, warp_max(sv));
            if (mnew == -INFINITY) continue; /* no visible key yet (uniform over the warp) */
            const float alpha = expf(m - mnew); /* m = -inf -> 0 */
            const float p = row >= 0 ? expf(sv - mnew) : 0.f;
            lsum = lsum * alpha + warp_sum(p);
            m = mnew;
            spr[lane] = p;
            srow[lane] = row;
            __syncwarp();
            const int cnt = (int)nsa_min64(k_hi - c0, 32);
            for (int64_t e = lane; e < g.Dv; e += 32) {
                float acc = so[e] * alpha;
                for (int kk = 0; kk < cnt; kk++)
                    if (srow[kk] >= 0) acc += spr[kk] * to_f(V[srow[kk] * a.v.st + gi * a.v.sh + e]);
                so[e] = acc;
            }
            __syncwarp();
        }
        float *pp = a.part + ((r * g.Hq + h) * sp.ns + s) * (g.Dv + 2);
        for (int64_t e = lane; e < g.Dv; e += 32) pp[e] = so[e];
        if (lane == 0) {
            pp[g.Dv] = m;
            pp[g.Dv + 1] = lsum;
        }
        __syncwarp();
    }
}

/* the splits of one (row, head), in split order: o_b and the LSE */
__global__ void __launch_bounds__(DW * 32) merge_kernel(const DecGeom g, const DecSplit sp, const DecAttnIn a)
{
    dec_pdl_enter();
    if (dec_failed(g)) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t pairs = dec_rows(g) * g.Hq;
    for (int64_t pr = (int64_t)blockIdx.x * DW + warp; pr < pairs; pr += (int64_t)gridDim.x * DW) {
        const int64_t r = pr / g.Hq, h = pr % g.Hq;
        const float *pp = a.part + (r * g.Hq + h) * sp.ns * (g.Dv + 2);
        float M = -INFINITY;
        for (int s = 0; s < sp.ns; s++) M = fmaxf(M, pp[s * (g.Dv + 2) + g.Dv]);
        float L = 0.f;
        if (M != -INFINITY)
            for (int s = 0; s < sp.ns; s++) {
                const float ms = pp[s * (g.Dv + 2) + g.Dv];
                if (ms != -INFINITY) L += pp[s * (g.Dv + 2) + g.Dv + 1] * expf(ms - M);
            }
        const float inv = L != 0.f ? 1.0f / L : 0.f;
        float *o = a.o + r * a.ost + h * a.osh;
        for (int64_t e = lane; e < g.Dv; e += 32) {
            float acc = 0.f;
            if (L != 0.f)
                for (int s = 0; s < sp.ns; s++) {
                    const float ms = pp[s * (g.Dv + 2) + g.Dv];
                    if (ms != -INFINITY) acc += pp[s * (g.Dv + 2) + e] * expf(ms - M);
                }
            o[e] = acc * inv;
        }
        if (a.lse && lane == 0) a.lse[r * a.lst + h * a.lsh] = L != 0.f ? M + logf(L) : -INFINITY;
    }
}

/* ------------------------------------------------------------------ selection */

/* p(t, g, i) = sum_{h in g} exp(scale q.kc_i - lse_cmp(t, h)) for the split's visible rows i */
template <typename T>
__global__ void __launch_bounds__(128) probs_kernel(const DecGeom g, const DecSplit sp, DecIn q, DecCache kc,
                                                    DecIn lse, float *pbuf, int64_t max_nc)
{
    const int64_t r = blockIdx.x, gi = blockIdx.y;
    dec_pdl_enter();
    if (dec_failed(g) || r >= dec_rows(g)) return;
    const int64_t b = dec_row_seq(g, r), t = g.tk0[b] + r - g.cu[b], nc = nsa_cmp_visible(t, g.l, g.d);
    const int64_t k_lo = (int64_t)blockIdx.z * sp.chunk, k_hi = nsa_min64(k_lo + sp.chunk, nc);
    for (int64_t i = k_lo + threadIdx.x; i < k_hi; i += blockDim.x) {
        const T *kr = (const T *)kc.p + dec_crow(g, b, i) * kc.st + gi * kc.sh;
        float psum = 0.f;
        for (int64_t hh = 0; hh < g.G; hh++) {
            const int64_t h = gi * g.G + hh;
            const T *qr = (const T *)q.p + r * q.st + h * q.sh;
            float dot = 0.f;
            for (int64_t e = 0; e < g.Dqk; e++) dot += to_f(qr[e]) * to_f(kr[e]);
            psum += expf(dot * g.scale - ((const float *)lse.p)[r * lse.st + h * lse.sh]);
        }
        pbuf[(r * g.Hkv + gi) * max_nc + i] = psum;
    }
}

__global__ void __launch_bounds__(128) select_kernel(const DecGeom dg, const float *pbuf, int64_t max_nc, float *rows,
                                                     int *idx, int64_t ist, int64_t ish)
{
    __shared__ uint64_t cand[4][TOPN_CAND];
    dec_pdl_enter();
    if (dec_failed(dg)) return;
    Geom g = {};
    g.ls = dg.ls;
    g.n = dg.n;
    g.n_init = dg.n_init;
    g.n_local = dg.n_local;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t pairs = dec_rows(dg) * dg.Hkv;
    for (int64_t pr = (int64_t)blockIdx.x * 4 + warp; pr < pairs; pr += (int64_t)gridDim.x * 4) {
        const int64_t r = pr / dg.Hkv, gi = pr % dg.Hkv, b = dec_row_seq(dg, r);
        const int64_t t = dg.tk0[b] + r - dg.cu[b], nc = nsa_cmp_visible(t, dg.l, dg.d), cur = nsa_slc_last(t, dg.ls);
        const float *p = pbuf + (r * dg.Hkv + gi) * max_nc;
        float *row = rows + (r * dg.Hkv + gi) * dg.max_ns;
        for (int64_t j = lane; j <= cur; j += 32) {
            const int64_t i0 = nsa_cmp_first_overlapping(j, dg.l, dg.d, dg.ls);
            const int64_t i1 = nsa_min64(nsa_cmp_last_overlapping(j, dg.ls, dg.d), nc - 1);
            float acc = 0.f;
            for (int64_t i = i0; i <= i1; i++)
                acc += (float)nsa_overlap(i, j, dg.l, dg.d, dg.ls) / (float)dg.d * p[i];
            row[j] = acc;
        }
        __syncwarp();
        warp_select_row(g, row, t, idx + r * ist + gi * ish, lane, cand[warp]);
        __syncwarp();
    }
}

/* ------------------------------------------------------------------ combine */

template <typename T>
__global__ void combine_kernel(const DecGeom g, DecIn g0, DecIn g1, DecIn g2, DecIn o0, DecIn o1, DecIn o2, T *o,
                               int64_t ost, int64_t osh)
{
    dec_pdl_enter();
    if (dec_failed(g)) return;
    const int64_t n = dec_rows(g) * g.Hq * g.Dv;
    const DecIn gate[3] = {g0, g1, g2}, ob[3] = {o0, o1, o2};
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t k = e % g.Dv, th = e / g.Dv, h = th % g.Hq, t = th / g.Hq;
        float acc = 0.f;
#pragma unroll
        for (int b = 0; b < 3; b++)
            if (ob[b].p)
                acc += ((const float *)gate[b].p)[t * gate[b].st + h * gate[b].sh] *
                       ((const float *)ob[b].p)[t * ob[b].st + h * ob[b].sh + k];
        o[t * ost + h * osh + k] = from_f<T>(acc);
    }
}

} // namespace

/* ------------------------------------------------------------------ launchers */

bool dec_pdl_available(int major)
{
    if (major < 9) return false;
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, check_shared_kernel) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return fa.ptxVersion >= 90;
}

bool dec_check_one_fits(int64_t batch, int64_t cols, size_t bytes)
{
    cols = nsa_max64(cols, 1);
    return batch >= 1 && batch <= DEC_CHECK_ONE_ITEMS / cols && bytes % 4 == 0 && bytes <= DEC_CHECK_ONE_BYTES;
}

cudaError_t dec_check(const DecGeom &g, const DecCheckMem &m, size_t bytes, bool one, cudaStream_t s)
{
    const int64_t cols = nsa_max64(nsa_max64(g.max_pages, g.max_cmp_pages), 1);
    if (one) { /* the step's first kernel: a plain launch */
        if (!dec_check_one_fits(g.B, cols, bytes)) return cudaErrorInvalidValue;
        check_one_kernel<<<1, DEC_CHECK_ONE_THREADS, 0, s>>>(g, m, cols, (int64_t)(bytes / 4));
        return cudaGetLastError();
    }
    /* the first kernel follows the step's memset: a plain launch */
    check_entries_kernel<<<grid_for(g.B * cols, 256), 256, 0, s>>>(g, m, cols);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = dec_launch(g.pdl, check_shared_kernel, grid_for(g.B * cols, 256), 256, 0, s, g, m, cols);
    return e;
}

cudaError_t dec_append(const DecGeom &g, const DecAppend &ap, const DecCompress &cp, cudaStream_t s)
{
    if (ap.n == 0 && !cp.kc.p) return cudaSuccess;
    if (ap.n < 0 || ap.n > 6) return cudaErrorInvalidValue;
    const unsigned grid = grid_for(g.MT * g.Hkv, 1);
    NSA_DISPATCH_DTYPE(g.dtype, T, return dec_launch(g.pdl, append_kernel<T>, grid, 128, 0, s, g, ap, cp));
    return cudaErrorInvalidValue;
}

size_t dec_attn_smem(int64_t Dqk, int64_t Dv) { return (size_t)DW * ((Dqk + Dv + 32) * 4 + 32 * 8); }

/* the merge of a branch's splits into o_b and its LSE */
static cudaError_t dec_merge(const DecGeom &g, const DecSplit &sp, const DecAttnIn &a, cudaStream_t s)
{
    if (g.MT == 0) return cudaSuccess;
    return dec_launch(g.pdl, merge_kernel, grid_for(g.MT * g.Hq, DW), DW * 32, 0, s, g, sp, a);
}

template <typename T, int MODE>
static cudaError_t attn_t(const DecGeom &g, const DecSplit &sp, const DecAttnIn &a, cudaStream_t s)
{
    const int nhc = (int)((g.G + sp.hc - 1) / sp.hc);
    const dim3 grid((unsigned)g.MT, (unsigned)(g.Hkv * nhc), (unsigned)sp.ns);
    const size_t smem = dec_attn_smem(g.Dqk, g.Dv);
    /* 16-byte K loads: aligned base, strides and head dim */
    const int64_t ve = 16 / (int64_t)sizeof(T);
    const bool vec = ((uintptr_t)a.k.p % 16) == 0 && a.k.st % ve == 0 && a.k.sh % ve == 0 && g.Dqk % ve == 0;
    cudaError_t e = vec ? dec_launch(g.pdl, attn_kernel<T, MODE, true>, grid, DW * 32, smem, s, g, sp, a)
                        : dec_launch(g.pdl, attn_kernel<T, MODE, false>, grid, DW * 32, smem, s, g, sp, a);
    if (e != cudaSuccess) return e;
    return dec_merge(g, sp, a, s);
}


bool dec_rows16(const DecCache &c, int64_t D)
{
    return c.p && ((uintptr_t)c.p % 16) == 0 && c.st % 8 == 0 && c.sh % 8 == 0 && D % 8 == 0;
}

cudaError_t dec_attn(const DecGeom &g, int mode, const DecSplit &sp, const DecAttnIn &a, cudaStream_t s)
{
    if (g.MT == 0) return cudaSuccess;
    NSA_DISPATCH_DTYPE(g.dtype, T,
                       return mode == 0   ? attn_t<T, 0>(g, sp, a, s)
                              : mode == 1 ? attn_t<T, 1>(g, sp, a, s)
                                          : attn_t<T, 2>(g, sp, a, s));
    return cudaErrorInvalidValue;
}

cudaError_t dec_select(const DecGeom &g, const DecSplit &sp, DecIn q, DecCache kc, DecIn lse_cmp, float *pbuf,
                       int64_t max_nc, float *rows, int *idx, int64_t ist, int64_t ish, cudaStream_t s)
{
    if (max_nc > 0) {
        const dim3 grid((unsigned)g.MT, (unsigned)g.Hkv, (unsigned)sp.ns);
        cudaError_t e = cudaErrorInvalidValue;
        NSA_DISPATCH_DTYPE(g.dtype, T,
                           e = dec_launch(g.pdl, probs_kernel<T>, grid, 128, 0, s, g, sp, q, kc, lse_cmp, pbuf, max_nc));
        if (e != cudaSuccess) return e;
    }
    return dec_rank(g, pbuf, max_nc, rows, idx, ist, ish, s);
}

cudaError_t dec_rank(const DecGeom &g, const float *pbuf, int64_t max_nc, float *rows, int *idx, int64_t ist,
                     int64_t ish, cudaStream_t s)
{
    if (g.MT == 0) return cudaSuccess;
    return dec_launch(g.pdl, select_kernel, grid_for(g.MT * g.Hkv, 4), 128, 0, s, g, pbuf, max_nc, rows, idx, ist,
                      ish);
}

cudaError_t dec_combine(const DecGeom &g, const DecIn gate[3], const DecIn ob[3], void *o, int64_t ost, int64_t osh,
                        cudaStream_t s)
{
    const unsigned grid = grid_for(g.MT * g.Hq * g.Dv, 256);
    NSA_DISPATCH_DTYPE(g.dtype, T,
                       return dec_launch(g.pdl, combine_kernel<T>, grid, 256, 0, s, g, gate[0], gate[1], gate[2], ob[0],
                                         ob[1], ob[2], (T *)o, ost, osh));
    return cudaErrorInvalidValue;
}

} // namespace nsa_cuda
