/*
 * topn.hip -- stage SELECT_TOPN (section 3 of docs/nsa-semantics.md): per
 * (token t, KV group g), the n eligible selection blocks of highest rank,
 * written ascending and -1 padded.
 *
 * Rank: forced blocks (j < n_init, or last - n_local < j <= last) above all
 * others; then higher score; equal scores: lower index first.
 *
 * One block per (t, g), exact and deterministic:
 *   1. fewer than n eligible blocks (last + 1 <= n): all of them, then -1s.
 *   2. need = n - #forced unforced blocks are wanted. Radix select finds the
 *      need-th largest score key among the unforced blocks, 8 bits at a time
 *      from the top (4 passes; integer LDS histograms, whose counts do not
 *      depend on the order of the atomic adds).
 *   3. Selected = forced, or key > threshold, or key == threshold and among
 *      the first (need - #greater) such blocks by index: one block-wide scan
 *      ranks the ties, a second compacts the selection in index order.
 * Score keys map f32 to u32 so that unsigned order is float order.
 */
#include "tile.h"

NSA_DEV unsigned nsa_hip_key(float s)
{
    unsigned u = __float_as_uint(s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_topn_kernel(nsa_hip_dims dm, int64_t t0, nsa_hip_tensor scores, nsa_hip_tensor idx)
{
    __shared__ int buf[NSA_HIP_THREADS];
    __shared__ int hist[256];
    __shared__ unsigned sh_prefix;
    __shared__ int sh_remaining;

    const int tid = threadIdx.x;
    const int64_t t = t0 + blockIdx.x, g = blockIdx.y;
    const int64_t tq = t - dm.cu_seqlens[dm.tok_seq[t]];
    const int64_t last = nsa_slc_last(tq, dm.ls), ne = last + 1, n = dm.n;
    int *out = (int *)idx.ptr + t * idx.st + g * idx.sh;
    const float *sc = (const float *)scores.ptr + t * scores.st + g * scores.sh;

    if (ne <= n) { /* every eligible block */
        for (int64_t k = tid; k < n; k += NSA_HIP_THREADS) out[k] = k < ne ? (int)k : -1;
        return;
    }

    /* forced: [0, min(n_init, ne)) and (last - n_local, last], counted once */
    const int64_t n_init = nsa_min64(dm.n_init, ne), n_loc = nsa_min64(dm.n_local, ne);
    const int64_t both = nsa_max64(0, n_init - (ne - n_loc));
    const int64_t need = nsa_max64(0, n - (n_init + n_loc - both));

    /* 2. radix select of the need-th largest unforced key */
    unsigned prefix = 0, mask = 0;
    int remaining = (int)need;
    for (int shift = 24; shift >= 0 && need > 0; shift -= 8) {
        hist[tid] = 0; /* NSA_HIP_THREADS == 256 bins */
        __syncthreads();
        for (int64_t j = tid; j < ne; j += NSA_HIP_THREADS) {
            if (nsa_slc_forced(j, tq, dm.ls, dm.n_init, dm.n_local)) continue;
            unsigned u = nsa_hip_key(sc[j]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1);
        }
        __syncthreads();
        const int bin = 255 - tid, c = hist[bin]; /* thread 0 holds the top bin */
        int total;
        int above = nsa_hip_block_scan(c, buf, &total); /* keys in higher bins */
        if (above < remaining && above + c >= remaining) {
            sh_prefix = prefix | ((unsigned)bin << shift);
            sh_remaining = remaining - above;
        }
        __syncthreads();
        prefix = sh_prefix;
        remaining = sh_remaining;
        mask |= 255u << shift;
    }
    const unsigned thr = need > 0 ? prefix : 0xffffffffu;
    const int take_eq = need > 0 ? remaining : 0; /* ties at thr to take, lowest index first */

    /* 3. contiguous ranges per thread: rank the ties, then compact */
    const int64_t per = (ne + NSA_HIP_THREADS - 1) / NSA_HIP_THREADS;
    const int64_t jb = nsa_min64(ne, tid * per), je = nsa_min64(ne, jb + per);
    int eq = 0;
    for (int64_t j = jb; j < je; j++)
        eq += !nsa_slc_forced(j, tq, dm.ls, dm.n_init, dm.n_local) && nsa_hip_key(sc[j]) == thr;
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
            if (nsa_slc_forced(j, tq, dm.ls, dm.n_init, dm.n_local)) {
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

#define NSA_HIP_TOKENS_PER_LAUNCH ((int64_t)1 << 23)

hipError_t nsa_hip_select_topn(const nsa_hip_dims *dm, nsa_hip_tensor scores, nsa_hip_tensor idx, hipStream_t stream)
{
    for (int64_t t0 = 0; t0 < dm->T; t0 += NSA_HIP_TOKENS_PER_LAUNCH) {
        dim3 grid((unsigned)nsa_min64(dm->T - t0, NSA_HIP_TOKENS_PER_LAUNCH), (unsigned)dm->Hkv);
        nsa_hip_topn_kernel<<<grid, NSA_HIP_THREADS, 0, stream>>>(*dm, t0, scores, idx);
        hipError_t e = hipGetLastError();
        if (e != hipSuccess) return e;
    }
    return hipSuccess;
}
