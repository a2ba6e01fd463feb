/*
 * decode.hip -- the decode step on the device (docs/nsa-semantics.md section
 * 10): the checks of the step's lengths and page tables, the append to the
 * paged caches, the compressed rows a step completes, and the three branches
 * of every new row, split across blocks flash-decoding style. The HIP port of
 * kernels/cuda/decode.cu: the same checks, record and merge order, with every
 * cross-thread step through LDS and __syncthreads() (no wave-size
 * assumption: wave32 and wave64 run the same code) and the forward's own tile
 * arithmetic (tile.h, topn.h), so a row of one split is computed as the
 * forward's portable kernels compute it.
 *
 * Packed row r < cu[B] of the step belongs to sequence b (cu[b] <= r <
 * cu[b + 1]) at local position t = TK0_b + r - cu[b]; position x of sequence
 * b lives in pool row bt[b][x / ps] * ps + x % ps of a raw cache, compressed
 * row i in cbt[b][i / cps] * cps + i % cps of the compressed caches.
 *
 * Checks (nsa_hip_dec_check): three kernels, as CUDA's.
 *   1. per (sequence, table column): the lengths (column 0), the range of the
 *      entries the sequence reads or writes, and a count of every in-range
 *      page of every sequence (integer atomicAdd: exact);
 *   2. per (sequence, column): pages the step writes whose count is not 1;
 *   3. one thread: the first bad sequence of (1), else of (2) (integer
 *      atomicMax on UINT64_MAX - b: deterministic), re-walked in the cpu
 *      reference's order to name the entry; writes the record and the
 *      caller's status tensor.
 * Append: element-wise, bits as they are. Compress: element-wise over (row,
 * KV head, column) for the rows that end a compressed block, the forward's
 * sums (compress.hip: MEAN in token order, LINEAR FMAs in kk = j * D + c
 * order), rounded once to the dtype.
 *
 * Attention (nsa_hip_dec_attention): one block per (row, KV group x head
 * chunk, split x Dv chunk), the forward's portable tile (attention.hip): a
 * split walks its keys of the row's key list (compressed rows 0 .. nc(t) - 1;
 * the selected blocks' positions, slot after slot, cut at t; the window) TK at
 * a time, K and V rows fetched into LDS through the page table once for the
 * chunk's heads, score tile, online softmax (tile.h), P V in registers. Each
 * split stores (unnormalised o, max, sum; log2 domain); the merge kernel
 * combines a (row, head)'s splits in split order into o_b and the LSE. With
 * one split the result is the forward's portable kernel's bit for bit.
 *
 * Selection (nsa_hip_dec_select): per (row, KV group, split of the compressed
 * rows), the group's p_cmp summed over heads per compressed row (scores.hip's
 * tile and order), then one block per (row, KV group) sums them onto the
 * eligible selection blocks (scores.hip's order) and ranks them with the
 * forward's topn.h. No float atomics anywhere: bitwise reproducible.
 */
#include "topn.h" /* first: the HIP runtime header defines __device__ & co. */
#include "nsa_decode_record.h"

/* ------------------------------------------------------------------ the step */

NSA_DEV bool nsa_hip_dec_failed(const nsa_hip_dec_geom &g) { return *(volatile const int *)g.rec != 0; }
NSA_DEV int64_t nsa_hip_dec_rows(const nsa_hip_dec_geom &g) { return g.cu[g.B]; }

/* The sequence of packed row r (r < cu[B]): the largest b with cu[b] <= r. */
NSA_DEV int64_t nsa_hip_dec_seq(const nsa_hip_dec_geom &g, int64_t r)
{
    int64_t lo = 0, hi = g.B - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (g.cu[mid] <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Local position of packed row r of sequence b. */
NSA_DEV int64_t nsa_hip_dec_pos(const nsa_hip_dec_geom &g, int64_t b, int64_t r) { return g.tk0[b] + r - g.cu[b]; }

/* Pool row of position x of sequence b (raw caches), and of compressed row i. */
NSA_DEV int64_t nsa_hip_dec_prow(const nsa_hip_dec_geom &g, int64_t b, int64_t x)
{
    return (int64_t)g.bt[b * g.bt_st + x / g.ps] * g.ps + x % g.ps;
}
NSA_DEV int64_t nsa_hip_dec_crow(const nsa_hip_dec_geom &g, int64_t b, int64_t i)
{
    return (int64_t)g.cbt[b * g.cbt_st + i / g.cps] * g.cps + i % g.cps;
}

/* ------------------------------------------------------------------ checks */

NSA_DEV int nsa_hip_dec_len_reason(const nsa_hip_dec_geom &g, int64_t b)
{
    return nsa_dec_len_reason(b, g.cu[b], g.cu[b + 1], g.tk0[b], g.MT, g.max_step, g.max_context, g.max_pages, g.ps,
                              g.max_cmp_pages, g.cps, g.l, g.d);
}

NSA_DEV void nsa_hip_dec_flag(unsigned long long *f, int64_t b) { atomicMax(f, ~0ull - (unsigned long long)b); }

__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_dec_entries_kernel(nsa_hip_dec_geom g, nsa_hip_dec_checkmem m, int64_t cols)
{
    const int64_t items = g.B * cols;
    for (int64_t it = (int64_t)blockIdx.x * NSA_HIP_THREADS + threadIdx.x; it < items;
         it += (int64_t)gridDim.x * NSA_HIP_THREADS) {
        const int64_t b = it / cols, x = it % cols;
        if (nsa_hip_dec_len_reason(g, b) != NSA_DRS_OK) {
            if (x == 0) nsa_hip_dec_flag(&m.flags[0], b);
            continue;
        }
        const int64_t tq = (int64_t)g.cu[b + 1] - g.cu[b], tk = g.tk0[b] + tq;
        const int64_t np = nsa_min64((tk + g.ps - 1) / g.ps, g.max_pages);
        const int64_t ncp = nsa_min64((nsa_num_cmp_blocks(tk, g.l, g.d) + g.cps - 1) / g.cps, g.max_cmp_pages);
        if (x < np) {
            const int e = g.bt[b * g.bt_st + x];
            const bool in = e >= 0 && e < g.num_pages;
            if (!in && tq > 0) nsa_hip_dec_flag(&m.flags[0], b);
            if (in) atomicAdd(&m.pcount[e], 1);
        }
        if (g.cbt && x < ncp) {
            const int e = g.cbt[b * g.cbt_st + x];
            const bool in = e >= 0 && e < g.num_cmp_pages;
            if (!in && tq > 0) nsa_hip_dec_flag(&m.flags[0], b);
            if (in) atomicAdd(&m.ccount[e], 1);
        }
    }
}

__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_dec_shared_kernel(nsa_hip_dec_geom g, nsa_hip_dec_checkmem m, int64_t cols)
{
    if (m.flags[0] != 0) return;
    const int64_t items = g.B * cols;
    const bool forms = g.compress != NSA_COMPRESS_EXTERNAL;
    for (int64_t it = (int64_t)blockIdx.x * NSA_HIP_THREADS + threadIdx.x; it < items;
         it += (int64_t)gridDim.x * NSA_HIP_THREADS) {
        const int64_t b = it / cols, x = it % cols;
        const int64_t tq = (int64_t)g.cu[b + 1] - g.cu[b], tk0 = g.tk0[b], tk = tk0 + tq;
        if (tq == 0) continue;
        if (x >= tk0 / g.ps && x <= (tk - 1) / g.ps && m.pcount[g.bt[b * g.bt_st + x]] != 1)
            nsa_hip_dec_flag(&m.flags[1], b);
        const int64_t nc0 = nsa_num_cmp_blocks(tk0, g.l, g.d), nc1 = nsa_num_cmp_blocks(tk, g.l, g.d);
        if (forms && g.cbt && nc1 > nc0 && x >= nc0 / g.cps && x <= (nc1 - 1) / g.cps &&
            m.ccount[g.cbt[b * g.cbt_st + x]] != 1)
            nsa_hip_dec_flag(&m.flags[1], b);
    }
}

__global__ void nsa_hip_dec_verdict_kernel(nsa_hip_dec_geom g, nsa_hip_dec_checkmem m)
{
    int rec[NSA_DR_FIELDS];
    for (int i = 0; i < NSA_DR_FIELDS; i++) rec[i] = 0;
    rec[NSA_DR_SEQ] = -1;
    const unsigned long long f0 = m.flags[0], f1 = m.flags[1];
    if (f0 != 0 || f1 != 0) {
        const int64_t b = (int64_t)(~0ull - (f0 != 0 ? f0 : f1));
        const int64_t tq = (int64_t)g.cu[b + 1] - g.cu[b], tk0 = g.tk0[b], tk = tk0 + tq;
        rec[NSA_DR_SEQ] = (int)b;
        rec[NSA_DR_CU0] = g.cu[b];
        rec[NSA_DR_CU1] = g.cu[b + 1];
        rec[NSA_DR_TK0] = g.tk0[b];
        int reason = f0 != 0 ? nsa_hip_dec_len_reason(g, b) : NSA_DRS_OK;
        rec[NSA_DR_STATUS] = reason != NSA_DRS_OK ? NSA_ERR_INVALID_SHAPE : NSA_ERR_INVALID_VALUE;
        if (f0 != 0 && reason == NSA_DRS_OK) { /* the first entry out of range: pages, then compressed pages */
            const int64_t np = (tk + g.ps - 1) / g.ps, ncp = (nsa_num_cmp_blocks(tk, g.l, g.d) + g.cps - 1) / g.cps;
            for (int64_t x = 0; x < np && reason == NSA_DRS_OK; x++) {
                const int e = g.bt[b * g.bt_st + x];
                if (e < 0 || e >= g.num_pages) reason = NSA_DRS_ENTRY, rec[NSA_DR_COL] = (int)x, rec[NSA_DR_ENTRY] = e;
            }
            for (int64_t x = 0; g.cbt && x < ncp && reason == NSA_DRS_OK; x++) {
                const int e = g.cbt[b * g.cbt_st + x];
                if (e < 0 || e >= g.num_cmp_pages)
                    reason = NSA_DRS_CMP_ENTRY, rec[NSA_DR_COL] = (int)x, rec[NSA_DR_ENTRY] = e;
            }
        } else if (f0 == 0) { /* the first written page that appears more than once */
            for (int64_t x = tk0 / g.ps; x <= (tk - 1) / g.ps && reason == NSA_DRS_OK; x++) {
                const int e = g.bt[b * g.bt_st + x];
                if (m.pcount[e] != 1)
                    reason = NSA_DRS_SHARED, rec[NSA_DR_COL] = (int)x, rec[NSA_DR_ENTRY] = e,
                    rec[NSA_DR_COUNT] = m.pcount[e];
            }
            const int64_t nc0 = nsa_num_cmp_blocks(tk0, g.l, g.d), nc1 = nsa_num_cmp_blocks(tk, g.l, g.d);
            if (g.compress != NSA_COMPRESS_EXTERNAL && g.cbt && nc1 > nc0)
                for (int64_t x = nc0 / g.cps; x <= (nc1 - 1) / g.cps && reason == NSA_DRS_OK; x++) {
                    const int e = g.cbt[b * g.cbt_st + x];
                    if (m.ccount[e] != 1)
                        reason = NSA_DRS_CMP_SHARED, rec[NSA_DR_COL] = (int)x, rec[NSA_DR_ENTRY] = e,
                        rec[NSA_DR_COUNT] = m.ccount[e];
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

/* ------------------------------------------------------------------ append and compress */

template <typename T>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_dec_append_kernel(nsa_hip_dec_geom g, nsa_hip_tensor src, nsa_hip_tensor cache, int64_t D)
{
    if (nsa_hip_dec_failed(g)) return;
    const int64_t n = nsa_hip_dec_rows(g) * g.Hkv * D;
    for (int64_t e = (int64_t)blockIdx.x * NSA_HIP_THREADS + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * NSA_HIP_THREADS) {
        const int64_t c = e % D, rh = e / D, h = rh % g.Hkv, r = rh / g.Hkv, b = nsa_hip_dec_seq(g, r);
        const int64_t row = nsa_hip_dec_prow(g, b, nsa_hip_dec_pos(g, b, r));
        ((T *)cache.ptr)[row * cache.st + h * cache.sh + c] = ((const T *)src.ptr)[r * src.st + h * src.sh + c];
    }
}

template <typename T>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_dec_compress_kernel(nsa_hip_dec_geom g, nsa_hip_tensor raw, nsa_hip_tensor w, nsa_hip_tensor pe,
                                nsa_hip_tensor cc, int64_t D)
{
    if (nsa_hip_dec_failed(g)) return;
    const int64_t n = nsa_hip_dec_rows(g) * g.Hkv * D;
    const float inv = 1.0f / (float)g.l;
    for (int64_t e = (int64_t)blockIdx.x * NSA_HIP_THREADS + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * NSA_HIP_THREADS) {
        const int64_t o = e % D, rh = e / D, h = rh % g.Hkv, r = rh / g.Hkv, b = nsa_hip_dec_seq(g, r);
        const int64_t x = nsa_hip_dec_pos(g, b, r);
        if (x + 1 < g.l || (x + 1 - g.l) % g.d != 0) continue; /* no compressed block ends at x */
        const int64_t i = (x + 1 - g.l) / g.d;
        float s = 0.0f;
        if (g.compress == NSA_COMPRESS_LINEAR) {
            const T *wg = (const T *)w.ptr + h * g.l * D * D;             /* W[h] as [l*D, D] */
            const T *peg = pe.ptr ? (const T *)pe.ptr + h * g.l * D : 0; /* pe[h] as [l*D] */
            for (int64_t j = 0; j < g.l; j++) {
                const T *xr = (const T *)raw.ptr + nsa_hip_dec_prow(g, b, i * g.d + j) * raw.st + h * raw.sh;
                for (int64_t c = 0; c < D; c++) {
                    const int64_t kk = j * D + c;
                    float a = nsa_ld(xr + c);
                    if (peg) a += nsa_ld(peg + kk);
                    s = fmaf(a, nsa_ld(wg + kk * D + o), s);
                }
            }
        } else {
            for (int64_t j = 0; j < g.l; j++)
                s += nsa_ld((const T *)raw.ptr + nsa_hip_dec_prow(g, b, i * g.d + j) * raw.st + h * raw.sh + o);
            s *= inv;
        }
        nsa_st((T *)cc.ptr + nsa_hip_dec_crow(g, b, i) * cc.st + h * cc.sh + o, s);
    }
}

/* ------------------------------------------------------------------ attention */

/* The keys of row r: how many, and the pool row of key k (-1: not visible). */
template <int KIND>
struct nsa_hip_dec_keys {
    int64_t b, t, lo;
    const int *sel; /* SLC: the row's n selected blocks */
    NSA_DEV int64_t count(const nsa_hip_dec_geom &g) const
    {
        return KIND == NSA_HIP_CMP ? nsa_cmp_visible(t, g.l, g.d) : KIND == NSA_HIP_SLC ? g.n * g.ls : t - lo + 1;
    }
    NSA_DEV int64_t row(const nsa_hip_dec_geom &g, int64_t k) const
    {
        if (KIND == NSA_HIP_CMP) return nsa_hip_dec_crow(g, b, k);
        if (KIND == NSA_HIP_WIN) return nsa_hip_dec_prow(g, b, lo + k);
        const int64_t slot = k / g.ls, j = sel[slot], pos = j * g.ls + (k - slot * g.ls);
        return j >= 0 && pos <= t ? nsa_hip_dec_prow(g, b, pos) : -1;
    }
};

template <typename T, int KIND>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_dec_attn_kernel(nsa_hip_dec_geom g, nsa_hip_tile tl, nsa_hip_dec_split sp, nsa_hip_tensor q,
                            nsa_hip_tensor k, nsa_hip_tensor v, nsa_hip_tensor idx, float *part)
{
    extern __shared__ int64_t nsa_lds[];
    const int64_t r = blockIdx.x;
    if (nsa_hip_dec_failed(g) || r >= nsa_hip_dec_rows(g)) return; /* uniform over the block */
    const int tid = threadIdx.x;
    const int R = tl.rows, TK = tl.keys, DVC = tl.dv_chunk;
    const int ldq = tl.ldq, ldv = tl.ldv, dpad = tl.dpad, ldp = TK + 1;

    const int64_t gi = blockIdx.y / tl.head_chunks, hc = blockIdx.y % tl.head_chunks;
    const int64_t h0 = gi * g.G + hc * R;
    const int rows = (int)nsa_min64(R, g.G - hc * R);
    const int s = (int)(blockIdx.z / tl.dv_chunks);
    const int64_t e0 = (int64_t)(blockIdx.z % tl.dv_chunks) * DVC;
    const int dvc = (int)nsa_min64(DVC, g.Dv - e0);

    nsa_hip_dec_keys<KIND> ks;
    ks.b = nsa_hip_dec_seq(g, r);
    ks.t = nsa_hip_dec_pos(g, ks.b, r);
    ks.lo = KIND == NSA_HIP_WIN ? nsa_win_start(ks.t, g.w) : 0;
    ks.sel = KIND == NSA_HIP_SLC ? (const int *)idx.ptr + r * idx.st + gi * idx.sh : 0;
    const int64_t k_lo = (int64_t)s * sp.chunk, k_hi = nsa_min64(k_lo + sp.chunk, ks.count(g));

    /* LDS as attention.hip's portable tile: krow[TK] int64 | Qs[R][ldq] | Ks[TK][ldq]
     * | Vs[TK][ldv] | Ps[R][ldp] | m, l, alpha [R] */
    int64_t *krow = nsa_lds;
    float *Qs = (float *)(krow + TK);
    float *Ks = Qs + R * ldq;
    float *Vs = Ks + TK * ldq;
    float *Ps = Vs + TK * ldv;
    float *m_r = Ps + R * ldp;
    float *l_r = m_r + R;
    float *a_r = l_r + R;

    nsa_hip_load_q<T>(Qs, ldq, q, r, h0, rows, R, g.Dqk, dpad, g.scale_log2);
    if (tid < R) {
        m_r[tid] = nsa_neg_inf();
        l_r[tid] = 0.0f;
    }
    float acc[NSA_HIP_ACC];
#pragma unroll
    for (int j = 0; j < NSA_HIP_ACC; j++) acc[j] = 0.0f;

    for (int64_t k0 = k_lo; k0 < k_hi; k0 += TK) {
        const int nk = (int)nsa_min64(TK, k_hi - k0);
        if (KIND == NSA_HIP_SLC && !nsa_hip_slc_chunk_live(g.ls, k0, nk, ks.t, ks.sel)) continue;
        if (tid < TK) krow[tid] = tid < nk ? ks.row(g, k0 + tid) : -1;
        __syncthreads();
        nsa_hip_load_keys<T>(Ks, ldq, k, krow, TK, gi, 0, (int)g.Dqk, dpad);
        nsa_hip_load_keys<T>(Vs, ldv, v, krow, TK, gi, e0, dvc, dvc);
        __syncthreads();
        nsa_hip_score_tile(Ps, ldp, Qs, ldq, Ks, ldq, krow, R, TK, dpad);
        __syncthreads();
        nsa_hip_softmax_step(Ps, ldp, R, rows, TK, m_r, l_r, a_r);
        __syncthreads();
        nsa_hip_pv_step(acc, Ps, ldp, Vs, ldv, a_r, rows, DVC, dvc, TK);
        /* the next chunk rewrites krow only (Ks/Vs/Ps after its first barrier) */
    }
    __syncthreads();

    /* the split's state of (r, h): part[((r * Hq + h) * ns + s) * (Dv + 2) + ...] */
    const int64_t pst = g.Dv + 2;
    float *pp = part + ((r * g.Hq + h0) * sp.ns + s) * pst;
#pragma unroll
    for (int j = 0; j < NSA_HIP_ACC; j++) {
        int e = tid + j * NSA_HIP_THREADS;
        int rr = e / DVC, c = e - rr * DVC;
        if (rr < rows && c < dvc) pp[(int64_t)rr * sp.ns * pst + e0 + c] = acc[j];
    }
    if (e0 == 0 && tid < rows) {
        pp[(int64_t)tid * sp.ns * pst + g.Dv] = m_r[tid];
        pp[(int64_t)tid * sp.ns * pst + g.Dv + 1] = l_r[tid];
    }
}

/* The splits of one (row, head), in split order, into o_b and the LSE: one block
 * per (row, head); thread 0 merges the statistics, every thread its columns. */
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_dec_merge_kernel(nsa_hip_dec_geom g, nsa_hip_dec_split sp, const float *part, nsa_hip_tensor o,
                             nsa_hip_tensor lse)
{
    __shared__ float stat[2]; /* max, sum */
    if (nsa_hip_dec_failed(g)) return;
    const int tid = threadIdx.x;
    const int64_t pairs = nsa_hip_dec_rows(g) * g.Hq, pst = g.Dv + 2;
    for (int64_t pr = blockIdx.x; pr < pairs; pr += gridDim.x) {
        const int64_t r = pr / g.Hq, h = pr % g.Hq;
        const float *pp = part + pr * sp.ns * pst;
        if (tid == 0) {
            float M = nsa_neg_inf();
            for (int s = 0; s < sp.ns; s++) {
                const float ms = pp[s * pst + g.Dv];
                M = (ms > M || ms != ms) ? ms : M; /* a NaN wins, as in the split's own step */
            }
            float L = 0.0f;
            if (M != nsa_neg_inf())
                for (int s = 0; s < sp.ns; s++) {
                    const float ms = pp[s * pst + g.Dv];
                    if (ms != nsa_neg_inf()) L += pp[s * pst + g.Dv + 1] * exp2f(ms - M);
                }
            stat[0] = M;
            stat[1] = L;
            if (lse.ptr)
                ((float *)lse.ptr)[r * lse.st + h * lse.sh] = L != 0.0f ? (M + log2f(L)) * NSA_LN2 : nsa_neg_inf();
        }
        __syncthreads();
        const float M = stat[0], L = stat[1];
        float *out = (float *)o.ptr + r * o.st + h * o.sh;
        for (int64_t c = tid; c < g.Dv; c += NSA_HIP_THREADS) {
            float a = 0.0f;
            if (L != 0.0f)
                for (int s = 0; s < sp.ns; s++) {
                    const float ms = pp[s * pst + g.Dv];
                    if (ms != nsa_neg_inf()) a += pp[s * pst + c] * exp2f(ms - M);
                }
            out[c] = L != 0.0f ? a / L : 0.0f;
        }
        __syncthreads(); /* stat is rewritten for the next pair */
    }
}

/* ------------------------------------------------------------------ selection */

/* pbuf[r, g, i] = sum over the group's heads of p_cmp(r, h, i) = exp2(S - lse * log2e)
 * for the split's visible compressed rows i: scores.hip's tile, heads in chunks of
 * tl.rows, summed in head order. */
template <typename T>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_dec_probs_kernel(nsa_hip_dec_geom g, nsa_hip_tile tl, nsa_hip_dec_split sp, nsa_hip_tensor q,
                             nsa_hip_tensor kc, nsa_hip_tensor lse, float *pbuf)
{
    extern __shared__ int64_t nsa_lds[];
    const int64_t r = blockIdx.x, gi = blockIdx.y;
    if (nsa_hip_dec_failed(g) || r >= nsa_hip_dec_rows(g)) return; /* uniform over the block */
    const int tid = threadIdx.x;
    const int R = tl.rows, TK = tl.keys, ldq = tl.ldq, dpad = tl.dpad, ldp = TK + 1;
    const int64_t b = nsa_hip_dec_seq(g, r), t = nsa_hip_dec_pos(g, b, r), nc = nsa_cmp_visible(t, g.l, g.d);
    const int64_t k_lo = (int64_t)blockIdx.z * sp.chunk, k_hi = nsa_min64(k_lo + sp.chunk, nc);
    float *out = pbuf + (r * g.Hkv + gi) * g.max_nc;

    /* LDS: krow[TK] int64 | Qs[R][ldq] | Ks[TK][ldq] | Ps[R][ldp] | lse2[R] */
    int64_t *krow = nsa_lds;
    float *Qs = (float *)(krow + TK);
    float *Ks = Qs + R * ldq;
    float *Ps = Ks + TK * ldq;
    float *lse2 = Ps + R * ldp;

    for (int64_t hc = 0; hc < tl.head_chunks && k_lo < k_hi; hc++) {
        const int64_t h0 = gi * g.G + hc * R;
        const int rows = (int)nsa_min64(R, g.G - hc * R);
        __syncthreads(); /* the previous head chunk's readers of Qs are done */
        nsa_hip_load_q<T>(Qs, ldq, q, r, h0, rows, R, g.Dqk, dpad, g.scale_log2);
        if (tid < R)
            lse2[tid] = tid < rows ? ((const float *)lse.ptr)[r * lse.st + (h0 + tid) * lse.sh] * NSA_LOG2E : 0.0f;
        for (int64_t i0 = k_lo; i0 < k_hi; i0 += TK) {
            if (tid < TK) krow[tid] = i0 + tid < k_hi ? nsa_hip_dec_crow(g, b, i0 + tid) : -1;
            __syncthreads();
            nsa_hip_load_keys<T>(Ks, ldq, kc, krow, TK, gi, 0, (int)g.Dqk, dpad);
            __syncthreads();
            nsa_hip_score_tile(Ps, ldp, Qs, ldq, Ks, ldq, krow, R, TK, dpad);
            __syncthreads();
            if (tid < TK && krow[tid] >= 0) {
                float p = 0.0f;
                for (int rr = 0; rr < rows; rr++) p += exp2f(Ps[rr * ldp + tid] - lse2[rr]);
                out[i0 + tid] = hc == 0 ? p : out[i0 + tid] + p; /* scores.hip's psum, head chunk by head chunk */
            }
            /* krow, Ks, Ps are rewritten only after the next barriers */
        }
    }
}

/* One block per (row, KV group): the eligible selection blocks' scores (scores.hip's
 * sums) into the row's scratch, then topn.h's ranking into idx. */
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_dec_select_kernel(nsa_hip_dec_geom g, const float *pbuf, float *rows, nsa_hip_tensor idx)
{
    __shared__ nsa_hip_topn_lds sh;
    const int64_t r = blockIdx.x, gi = blockIdx.y;
    if (nsa_hip_dec_failed(g) || r >= nsa_hip_dec_rows(g)) return; /* uniform over the block */
    const int64_t b = nsa_hip_dec_seq(g, r), t = nsa_hip_dec_pos(g, b, r);
    const int64_t nc = nsa_cmp_visible(t, g.l, g.d), last = nsa_slc_last(t, g.ls);
    const float *p = pbuf + (r * g.Hkv + gi) * g.max_nc;
    float *row = rows + (r * g.Hkv + gi) * g.max_ns;
    for (int64_t j = threadIdx.x; j <= last; j += NSA_HIP_THREADS) {
        const int64_t ia = nsa_cmp_first_overlapping(j, g.l, g.d, g.ls);
        const int64_t ib = nsa_min64(nsa_cmp_last_overlapping(j, g.ls, g.d), nc - 1);
        float s = 0.0f;
        for (int64_t i = ia; i <= ib; i++) s += (float)nsa_overlap(i, j, g.l, g.d, g.ls) * p[i];
        row[j] = s / (float)g.d;
    }
    __syncthreads(); /* the row (global memory) is complete for the whole block */
    nsa_hip_topn_row(row, t, g.ls, g.n, g.n_init, g.n_local, (int *)idx.ptr + r * idx.st + gi * idx.sh, sh);
}

/* ------------------------------------------------------------------ combine */

struct nsa_hip_dec_branches {
    nsa_hip_tensor gate[3];
    nsa_hip_tensor o_b[3];
};

template <typename T>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_dec_combine_kernel(nsa_hip_dec_geom g, nsa_hip_dec_branches br, nsa_hip_tensor o)
{
    if (nsa_hip_dec_failed(g)) return;
    const int64_t n = nsa_hip_dec_rows(g) * g.Hq * g.Dv;
    for (int64_t e = (int64_t)blockIdx.x * NSA_HIP_THREADS + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * NSA_HIP_THREADS) {
        const int64_t c = e % g.Dv, th = e / g.Dv, h = th % g.Hq, t = th / g.Hq;
        float acc = 0.0f;
#pragma unroll
        for (int b = 0; b < 3; b++) {
            if (!br.o_b[b].ptr) continue;
            const float gt = ((const float *)br.gate[b].ptr)[t * br.gate[b].st + h * br.gate[b].sh];
            const float ob = ((const float *)br.o_b[b].ptr)[t * br.o_b[b].st + h * br.o_b[b].sh + c];
            acc += gt * ob;
        }
        nsa_st((T *)o.ptr + t * o.st + h * o.sh + c, acc);
    }
}

/* ------------------------------------------------------------------ launchers */

hipError_t nsa_hip_dec_check(const nsa_hip_dec_geom *g, const nsa_hip_dec_checkmem *m, hipStream_t stream)
{
    const int64_t cols = nsa_max64(nsa_max64(g->max_pages, g->max_cmp_pages), 1);
    const dim3 grid(nsa_hip_grid_1d(g->B * cols));
    nsa_hip_dec_entries_kernel<<<grid, NSA_HIP_THREADS, 0, stream>>>(*g, *m, cols);
    nsa_hip_dec_shared_kernel<<<grid, NSA_HIP_THREADS, 0, stream>>>(*g, *m, cols);
    nsa_hip_dec_verdict_kernel<<<1, 1, 0, stream>>>(*g, *m);
    return hipGetLastError();
}

hipError_t nsa_hip_dec_append(const nsa_hip_dec_geom *g, nsa_hip_tensor src, nsa_hip_tensor cache, int64_t D,
                              hipStream_t stream)
{
    const dim3 grid(nsa_hip_grid_1d(g->MT * g->Hkv * D));
    NSA_HIP_DISPATCH(g->dtype, nsa_hip_dec_append_kernel, grid, 0, stream, *g, src, cache, D);
    return hipGetLastError();
}

hipError_t nsa_hip_dec_compress(const nsa_hip_dec_geom *g, nsa_hip_tensor raw, nsa_hip_tensor w, nsa_hip_tensor pe,
                                nsa_hip_tensor cc, int64_t D, hipStream_t stream)
{
    const dim3 grid(nsa_hip_grid_1d(g->MT * g->Hkv * D));
    NSA_HIP_DISPATCH(g->dtype, nsa_hip_dec_compress_kernel, grid, 0, stream, *g, raw, w, pe, cc, D);
    return hipGetLastError();
}

template <typename T>
static void dec_attn_launch(int kind, dim3 grid, hipStream_t stream, const nsa_hip_dec_geom &g,
                            const nsa_hip_tile &tl, const nsa_hip_dec_split &sp, nsa_hip_tensor q, nsa_hip_tensor k,
                            nsa_hip_tensor v, nsa_hip_tensor idx, float *part)
{
    if (kind == NSA_HIP_CMP)
        nsa_hip_dec_attn_kernel<T, NSA_HIP_CMP>
            <<<grid, NSA_HIP_THREADS, tl.lds_bytes, stream>>>(g, tl, sp, q, k, v, idx, part);
    else if (kind == NSA_HIP_SLC)
        nsa_hip_dec_attn_kernel<T, NSA_HIP_SLC>
            <<<grid, NSA_HIP_THREADS, tl.lds_bytes, stream>>>(g, tl, sp, q, k, v, idx, part);
    else
        nsa_hip_dec_attn_kernel<T, NSA_HIP_WIN>
            <<<grid, NSA_HIP_THREADS, tl.lds_bytes, stream>>>(g, tl, sp, q, k, v, idx, part);
}

hipError_t nsa_hip_dec_attention(const nsa_hip_dec_geom *g, int kind, const nsa_hip_tile *tile,
                                 const nsa_hip_dec_split *sp, nsa_hip_tensor q, nsa_hip_tensor k, nsa_hip_tensor v,
                                 nsa_hip_tensor idx, float *part, nsa_hip_tensor o, nsa_hip_tensor lse,
                                 hipStream_t stream)
{
    if (g->MT == 0) return hipSuccess;
    const dim3 grid((unsigned)g->MT, (unsigned)(g->Hkv * tile->head_chunks), (unsigned)(sp->ns * tile->dv_chunks));
    if (g->dtype == NSA_DT_F16)
        dec_attn_launch<nsa_f16_s>(kind, grid, stream, *g, *tile, *sp, q, k, v, idx, part);
    else if (g->dtype == NSA_DT_BF16)
        dec_attn_launch<nsa_bf16_s>(kind, grid, stream, *g, *tile, *sp, q, k, v, idx, part);
    else
        dec_attn_launch<float>(kind, grid, stream, *g, *tile, *sp, q, k, v, idx, part);
    hipError_t e = hipGetLastError();
    if (e != hipSuccess) return e;
    const dim3 mgrid((unsigned)nsa_min64(g->MT * g->Hq, 65535 * 16));
    nsa_hip_dec_merge_kernel<<<mgrid, NSA_HIP_THREADS, 0, stream>>>(*g, *sp, part, o, lse);
    return hipGetLastError();
}

hipError_t nsa_hip_dec_select(const nsa_hip_dec_geom *g, const nsa_hip_tile *tile, const nsa_hip_dec_split *sp,
                              nsa_hip_tensor q, nsa_hip_tensor kc, nsa_hip_tensor lse_cmp, float *pbuf, float *rows,
                              nsa_hip_tensor idx, hipStream_t stream)
{
    if (g->MT == 0) return hipSuccess;
    if (g->max_nc > 0) {
        const dim3 grid((unsigned)g->MT, (unsigned)g->Hkv, (unsigned)sp->ns);
        NSA_HIP_DISPATCH(g->dtype, nsa_hip_dec_probs_kernel, grid, tile->lds_bytes, stream, *g, *tile, *sp, q, kc,
                         lse_cmp, pbuf);
        hipError_t e = hipGetLastError();
        if (e != hipSuccess) return e;
    }
    const dim3 grid((unsigned)g->MT, (unsigned)g->Hkv);
    nsa_hip_dec_select_kernel<<<grid, NSA_HIP_THREADS, 0, stream>>>(*g, pbuf, rows, idx);
    return hipGetLastError();
}

hipError_t nsa_hip_dec_combine(const nsa_hip_dec_geom *g, const nsa_hip_tensor gate[3], const nsa_hip_tensor o_b[3],
                               nsa_hip_tensor o, hipStream_t stream)
{
    nsa_hip_dec_branches br;
    for (int b = 0; b < 3; b++) {
        br.gate[b] = gate[b];
        br.o_b[b] = o_b[b];
    }
    const dim3 grid(nsa_hip_grid_1d(g->MT * g->Hq * g->Dv));
    NSA_HIP_DISPATCH(g->dtype, nsa_hip_dec_combine_kernel, grid, 0, stream, *g, br, o);
    return hipGetLastError();
}
