/*
 * topn.h -- the ranking of SELECT_TOPN (section 3 of docs/nsa-semantics.md)
 * for one (query, KV group) row of block scores, by one block: shared by the
 * forward's top-n kernel (topn.hip) and the decode step's (decode.hip), so
 * that both pick the same blocks from the same scores.
 *
 * Rank: forced blocks (j < n_init, or last - n_local < j <= last) above all
 * others; then higher score; equal scores: lower index first.
 *   1. fewer than n eligible blocks (last + 1 <= n): all of them, then -1s.
 *   2. need = n - #forced unforced blocks are wanted. Radix select finds the
 *      need-th largest score key among the unforced blocks, 8 bits at a time
 *      from the top (4 passes; integer LDS histograms, whose counts do not
 *      depend on the order of the atomic adds).
 *   3. Selected = forced, or key > threshold, or key == threshold and among
 *      the first (need - #greater) such blocks by index: one block-wide scan
 *      ranks the ties, a second compacts the selection in index order.
 * Score keys map f32 to u32 so that unsigned order is float order. Exact and
 * deterministic; no wave-level step (any wave size).
 */
#ifndef NSA_KERNELS_HIP_TOPN_H
#define NSA_KERNELS_HIP_TOPN_H

#include "tile.h"

NSA_DEV unsigned nsa_hip_key(float s)
{
    unsigned u = __float_as_uint(s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The block's LDS for nsa_hip_topn_row. */
struct nsa_hip_topn_lds {
    int buf[NSA_HIP_THREADS];
    int hist[256];
    unsigned prefix;
    int remaining;
};

/* One block ranks the scores sc[0 .. floor(tq / ls)] of a query at local
 * position tq and writes its n selected blocks to out[0 .. n) (ascending, -1
 * padded). Every thread of the block must call it. */
NSA_DEV void nsa_hip_topn_row(const float *sc, int64_t tq, int64_t ls, int64_t n, int64_t n_init_cfg,
                              int64_t n_local_cfg, int *out, nsa_hip_topn_lds &sh)
{
    int *buf = sh.buf, *hist = sh.hist;
    const int tid = threadIdx.x;
    const int64_t last = nsa_slc_last(tq, ls), ne = last + 1;

    if (ne <= n) { /* every eligible block */
        for (int64_t k = tid; k < n; k += NSA_HIP_THREADS) out[k] = k < ne ? (int)k : -1;
        return;
    }

    /* forced: [0, min(n_init, ne)) and (last - n_local, last], counted once */
    const int64_t n_init = nsa_min64(n_init_cfg, ne), n_loc = nsa_min64(n_local_cfg, ne);
    const int64_t both = nsa_max64(0, n_init - (ne - n_loc));
    const int64_t need = nsa_max64(0, n - (n_init + n_loc - both));

    /* 2. radix select of the need-th largest unforced key */
    unsigned prefix = 0, mask = 0;
    int remaining = (int)need;
    for (int shift = 24; shift >= 0 && need > 0; shift -= 8) {
        hist[tid] = 0; /* NSA_HIP_THREADS == 256 bins */
        __syncthreads();
        for (int64_t j = tid; j < ne; j += NSA_HIP_THREADS) {
            if (nsa_slc_forced(j, tq, ls, n_init_cfg, n_local_cfg)) continue;
            unsigned u = nsa_hip_key(sc[j]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1);
        }
        __syncthreads();
        const int bin = 255 - tid, c = hist[bin]; /* thread 0 holds the top bin */
        int total;
        int above = nsa_hip_block_scan(c, buf, &total); /* keys in higher bins */
        if (above < remaining && above + c >= remaining) {
            sh.prefix = prefix | ((unsigned)bin << shift);
            sh.remaining = remaining - above;
        }
        __syncthreads();
        prefix = sh.prefix;
        remaining = sh.remaining;
        mask |= 255u << shift;
    }
    const unsigned thr = need > 0 ? prefix : 0xffffffffu;
    const int take_eq = need > 0 ? remaining : 0; /* ties at thr to take, lowest index first */

    /* 3. contiguous ranges per thread: rank the ties, then compact */
    const int64_t per = (ne + NSA_HIP_THREADS - 1) / NSA_HIP_THREADS;
    const int64_t jb = nsa_min64(ne, tid * per), je = nsa_min64(ne, jb + per);
    int eq = 0;
    for (int64_t j = jb; j < je; j++)
        eq += !nsa_slc_forced(j, tq, ls, n_init_cfg, n_local_cfg) && nsa_hip_key(sc[j]) == thr;
    int total;
    const int eq_before = nsa_hip_block_scan(eq, buf, &total);

    int picked = 0;
    for (int pass = 0; pass < 2; pass++) {
        int rank = eq_before, pos = 0;
        if (pass == 1) {
            pos = nsa_hip_block_scan(picked, buf, &total);
        }
        for (int64_t j = jb; j < je; j++) {
            bool s;
            if (nsa_slc_forced(j, tq, ls, n_init_cfg, n_local_cfg)) {
                s = true;
            } else {
                unsigned u = nsa_hip_key(sc[j]);
                s = u > thr || (u == thr && rank++ < take_eq);
            }
            if (!s) continue;
            if (pass == 0)
                picked++;
            else if (pos < n)
                out[pos++] = (int)j;
        }
    }
    for (int64_t k = total + tid; k < n; k += NSA_HIP_THREADS) out[k] = -1; /* only if something was off */
}

#endif /* NSA_KERNELS_HIP_TOPN_H */
