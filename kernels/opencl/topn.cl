/*
 * topn.cl: top-n selection of blocks per (query, KV group) (semantics section 3).
 * Eligible blocks: 0 <= j <= jmax = tl / l_s. Forced blocks (j < n_init, and the
 * n_local blocks ending at jmax) rank above all others and are always taken (the
 * config guarantees n >= n_init + n_local). The remaining slots go to the unforced
 * eligible blocks of highest score; equal scores: the lower index wins. Fewer than n
 * eligible blocks: all are taken and the unused slots hold -1. Output ascending.
 *
 * Version 1: one work-group per (t, g). The unforced winners are found one per round,
 * in rank order: a block is still available iff it ranks below the previous winner,
 *     s < s_prev  or  (s == s_prev and j > j_prev),
 * so no scratch marks are needed. Each round every lane scans blocks j = lane + k*WG
 * and the lanes' bests meet in a fixed-order tree (deterministic). Lane 0 writes the
 * forced blocks and the winners into the output row and sorts it at the end.
 */
/* The end of a selection row (lane 0): its first k entries sorted ascending, the
 * rest of the n slots -1 (scores_topn in scores.cl ends the same way). */
inline void topn_finish_row(__global int *idx, long orow, long k, long n)
{
    for (long a = 1; a < k; ++a) { /* insertion sort, ascending */
        const int x = idx[orow + a];
        long c = a - 1;
        while (c >= 0 && idx[orow + c] > x) { idx[orow + c + 1] = idx[orow + c]; --c; }
        idx[orow + c + 1] = x;
    }
    for (long a = k; a < n; ++a) idx[orow + a] = -1;
}

inline int topn_better(float sa, int ja, float sb, int jb)
{
    if (ja < 0) return 0;
    if (jb < 0) return 1;
    return sa > sb || (sa == sb && ja < jb);
}

__kernel void select_topn(const __global float *sc, long sc_off, long sc_st, long sc_sh,
                          __global int *idx, long ix_off, long ix_st, long ix_sh,
                          const __global long *tab, long cu_seq_at, long cu_k_at, long tok_seq_at,
                          long Hkv, long ls, long n, long n_init, long n_local,
                          long first,
                          __local float *rs, __local int *rj)
{
    const long wg = first + (long)get_group_id(0);
    const long t = wg / Hkv, g = wg % Hkv;
    const int lid = get_local_id(0), nl = get_local_size(0);

    const long b = tab[tok_seq_at + t];
    const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
    const long jmax = tl / ls;
    const long take = min(n, jmax + 1);
    const long f1 = min(n_init, jmax + 1);          /* forced: [0, f1) */
    const long f2 = max(f1, jmax - n_local + 1);    /* forced: [f2, jmax] */
    const long srow = sc_off + t * sc_st + g * sc_sh;
    const long orow = ix_off + t * ix_st + g * ix_sh;

    long k = 0;
    if (lid == 0) {
        for (long j = 0; j < f1; ++j) idx[orow + k++] = (int)j;
        for (long j = f2; j <= jmax; ++j) idx[orow + k++] = (int)j;
    }
    k = f1 + (jmax + 1 - f2);

    float ps = INFINITY; /* previous winner */
    int pj = -1;
    for (; k < take; ++k) {
        float bs = -INFINITY;
        int bj = -1;
        for (long j = f1 + lid; j < f2; j += nl) {
            const float s = sc[srow + j];
            const int avail = s < ps || (s == ps && (int)j > pj);
            if (avail && topn_better(s, (int)j, bs, bj)) { bs = s; bj = (int)j; }
        }
        rs[lid] = bs;
        rj[lid] = bj;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int s = nl / 2; s > 0; s >>= 1) {
            if (lid < s && topn_better(rs[lid + s], rj[lid + s], rs[lid], rj[lid])) {
                rs[lid] = rs[lid + s];
                rj[lid] = rj[lid + s];
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        ps = rs[0];
        pj = rj[0];
        barrier(CLK_LOCAL_MEM_FENCE);
        if (pj < 0) break; /* only NaN scores left */
        if (lid == 0) idx[orow + k] = pj;
    }

    if (lid == 0) topn_finish_row(idx, orow, k, n);
}
