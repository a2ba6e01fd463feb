/*
 * scores.cl: block importance (semantics section 3). For query t (local position tl)
 * and KV group g, every eligible selection block j (0 <= j <= tl / l_s) gets
 *     s(t, g, j) = sum_{h in g} sum_i (overlap(i, j) / d) * p_cmp(t, h, i)
 * over the visible compressed blocks i < nc(tl) that share tokens with block j, where
 * p_cmp(t, h, i) = exp(scale * q(t,h) . kc_i - lse_cmp(t, h)) is recomputed from the
 * compressed attention's LSE. Compressed block i covers [i*d, i*d + l - 1], selection
 * block j covers [j*l_s, (j+1)*l_s - 1]; the blocks i that overlap j are
 *     ceil((j*l_s - l + 1) / d) <= i <= ((j+1)*l_s - 1) / d.
 * Writes scores[t, g, j] for eligible j only.
 *
 * Version 1: one work-group per (t, g); lane k handles blocks j = k, k + WG, ... and
 * sums in a fixed order (i ascending, heads ascending). The G queries of the group are
 * staged in local memory when they fit (q_local = 1), else read from global memory.
 * Blocks i that straddle two selection blocks are computed twice (25% extra work for
 * the paper's l = 32, d = 16, l_s = 64).
 */
__kernel void block_scores(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                           const __global float *kc, long kc_off, long kc_st, long kc_sh,
                           const __global float *lse, long lse_off, long lse_st, long lse_sh,
                           __global float *sc, long sc_off, long sc_st, long sc_sh,
                           const __global long *tab, long cu_seq_at, long cu_k_at, long cu_cmp_at, long tok_seq_at,
                           long Hq, long Hkv, long Dqk, long l, long d, long ls, float scale,
                           long first, int q_local,
                           __local float *qs, __local float *lsel)
{
    const long wg = first + (long)get_group_id(0);
    const long t = wg / Hkv, g = wg % Hkv, G = Hq / Hkv;
    const int lid = get_local_id(0), nl = get_local_size(0);

    const long b = tab[tok_seq_at + t];
    const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
    const long nc = (tl + 1 >= l) ? (tl + 1 - l) / d + 1 : 0;
    const long r0 = tab[cu_cmp_at + b];
    const long jmax = tl / ls;

    for (long hh = lid; hh < G; hh += nl)
        lsel[hh] = lse[lse_off + t * lse_st + (g * G + hh) * lse_sh];
    if (q_local)
        for (long e = lid; e < G * Dqk; e += nl)
            qs[e] = ld(q, q_off + t * q_st + (g * G + e / Dqk) * q_sh + e % Dqk);
    barrier(CLK_LOCAL_MEM_FENCE);

    for (long j = lid; j <= jmax; j += nl) {
        const long first_tok = j * ls - l + 1;
        const long ilo = (first_tok <= 0) ? 0 : (first_tok + d - 1) / d;
        const long ihi = min(nc - 1, ((j + 1) * ls - 1) / d);
        float s = 0.0f;
        for (long i = ilo; i <= ihi; ++i) {
            const long ov = min(i * d + l, (j + 1) * ls) - max(i * d, j * ls);
            const long krow = kc_off + (r0 + i) * kc_st + g * kc_sh;
            float ps = 0.0f;
            for (long hh = 0; hh < G; ++hh) {
                float x = 0.0f;
                if (q_local) {
                    for (long c = 0; c < Dqk; ++c)
                        x += qs[hh * Dqk + c] * kc[krow + c];
                } else {
                    const long qrow = q_off + t * q_st + (g * G + hh) * q_sh;
                    for (long c = 0; c < Dqk; ++c)
                        x += ld(q, qrow + c) * kc[krow + c];
                }
                ps += exp(scale * x - lsel[hh]);
            }
            s += ((float)ov / (float)d) * ps;
        }
        sc[sc_off + t * sc_st + g * sc_sh + j] = s;
    }
}

/*
 * Version 2: one work-group per (t, g) as in version 1, but every compressed block i
 * is scored once and by all lanes together. Eligible blocks are taken in chunks of JC
 * selection blocks; a chunk needs the compressed rows ilo .. ihi, which are walked in
 * tiles of KT rows staged in local memory (as in group_attn.cl):
 *   1. lane pairs (h, s) over G*KT: e = exp(scale * q_h . kc_s - lse_h);
 *   2. lane s < KT: P[i] = sum_h e(h, s), h ascending, kept in local memory;
 *   3. after the chunk's rows: lane j of the chunk sums (overlap(i, j) / d) * P[i] over
 *      i ascending.
 * The sums run in the same order as version 1, so both give the same bits.
 * Local memory (floats): qs G*Dqk | lsel G | ks KT*(Dqk+1) | pe G*KT | P pc (>= the
 * rows of one chunk: JC*l_s/d + l/d + 1).
 *
 * scores_topn (the fused SCORES_TOPN stage) runs the same chunks and keeps no scores
 * row: after each chunk lane 0 merges the chunk's unforced blocks into a ranked list
 * of the best `take - forced` (score descending, then index ascending: select_topn's
 * order; NaN scores are skipped), so the workspace holds no T x Ns scores and the
 * selection is the one select_topn makes from the same scores.
 */

/* The helpers below contain no barrier; the kernels put the barriers between them
 * (with the tile loop and its barriers inside one helper, PoCL gave block_scores_v2
 * wrong scores on the small corpus). */

/* The work-group's query heads and their LSEs into local memory (qs, lsel). */
inline void scores_stage_q(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                           const __global float *lse, long lse_off, long lse_st, long lse_sh,
                           long t, long g, int Gi, int Dqki, __local float *qs, __local float *lsel)
{
    const int lid = get_local_id(0), nl = get_local_size(0);
    for (int hh = lid; hh < Gi; hh += nl)
        lsel[hh] = lse[lse_off + t * lse_st + (g * Gi + hh) * lse_sh];
    for (int e = lid; e < Gi * Dqki; e += nl) {
        const int hh = e / Dqki;
        qs[e] = ld(q, q_off + t * q_st + (g * Gi + hh) * q_sh + (e - hh * Dqki));
    }
}

/* Step 1 for the tile of compressed rows ib .. min(ib + KT, ihi + 1) - 1: the keys
 * into ks (zero past ihi) ... */
inline void scores_tile_keys(const __global float *kc, long kc_off, long kc_st, long kc_sh, long r0, long g,
                             long ib, long ihi, int KTi, int Dqki, __local float *ks)
{
    const int lid = get_local_id(0), nl = get_local_size(0);
    for (int e = lid; e < KTi * Dqki; e += nl) {
        const int s = e / Dqki, c = e - s * Dqki;
        ks[s * (Dqki + 1) + c] = ib + s <= ihi ? kc[kc_off + (r0 + ib + s) * kc_st + g * kc_sh + c] : 0.0f;
    }
}

/* ... then pe[h][s] = exp(scale q_h . k_s - lse_h) ... */
inline void scores_tile_exp(int Gi, int KTi, int Dqki, float scale, __local const float *qs,
                            __local const float *lsel, __local const float *ks, __local float *pe)
{
    const int lid = get_local_id(0), nl = get_local_size(0);
    for (int e = lid; e < Gi * KTi; e += nl) {
        const int hh = e / KTi, s = e - hh * KTi;
        float x = 0.0f;
        __local const float *qh = qs + hh * Dqki;
        __local const float *kr = ks + s * (Dqki + 1);
        for (int c = 0; c < Dqki; ++c) x += qh[c] * kr[c];
        pe[e] = exp(scale * x - lsel[hh]);
    }
}

/* ... and step 2: P[ib + s - ilo] = sum_h pe[h][s], h ascending. */
inline void scores_tile_sum(long ib, long ihi, long ilo, int Gi, int KTi, __local const float *pe, __local float *P)
{
    const int lid = get_local_id(0), nl = get_local_size(0);
    for (int s = lid; s < KTi; s += nl) {
        if (ib + s <= ihi) {
            float ps = 0.0f;
            for (int hh = 0; hh < Gi; ++hh) ps += pe[hh * KTi + s];
            P[ib + s - ilo] = ps;
        }
    }
}

/* Steps 1-2 over the chunk's rows ilo .. ihi, with the barriers between them. */
#define SCORES_CHUNK_ROWS()                                                                               \
    for (long ib = ilo; ib <= ihi; ib += KT) {                                                            \
        scores_tile_keys(kc, kc_off, kc_st, kc_sh, r0, g, ib, ihi, KTi, Dqki, ks);                        \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                     \
        scores_tile_exp(Gi, KTi, Dqki, scale, qs, lsel, ks, pe);                                          \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                     \
        scores_tile_sum(ib, ihi, ilo, Gi, KTi, pe, P);                                                    \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                     \
    }

/* Step 3: s(t, g, j) from the chunk's P (rows from ilo). */
inline float scores_block(long j, long ilo, long nc, long l, long d, long ls, __local const float *P)
{
    const long ft = j * ls - l + 1;
    const long jlo = (ft <= 0) ? 0 : (ft + d - 1) / d;
    const long jhi = min(nc - 1, ((j + 1) * ls - 1) / d);
    float s = 0.0f;
    for (long i = jlo; i <= jhi; ++i) {
        const long ov = min(i * d + l, (j + 1) * ls) - max(i * d, j * ls);
        s += ((float)ov / (float)d) * P[i - ilo];
    }
    return s;
}

/* The compressed rows a chunk of selection blocks j0 .. j1 needs. */
inline void scores_chunk_span(long j0, long j1, long nc, long l, long d, long ls, long *ilo, long *ihi)
{
    const long first_tok = j0 * ls - l + 1;
    *ilo = (first_tok <= 0) ? 0 : (first_tok + d - 1) / d;
    *ihi = min(nc - 1, ((j1 + 1) * ls - 1) / d);
}

__kernel void block_scores_v2(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                              const __global float *kc, long kc_off, long kc_st, long kc_sh,
                              const __global float *lse, long lse_off, long lse_st, long lse_sh,
                              __global float *sc, long sc_off, long sc_st, long sc_sh,
                              const __global long *tab, long cu_seq_at, long cu_k_at, long cu_cmp_at, long tok_seq_at,
                              long Hq, long Hkv, long Dqk, long l, long d, long ls, float scale,
                              long first, long KT, long JC, __local float *lm)
{
    const long wg = first + (long)get_group_id(0);
    const long t = wg / Hkv, g = wg % Hkv, G = Hq / Hkv;
    const int lid = get_local_id(0), nl = get_local_size(0);
    const int Gi = (int)G, KTi = (int)KT, Dqki = (int)Dqk; /* local indices: 32-bit */
    __local float *qs = lm;
    __local float *lsel = qs + G * Dqk;
    __local float *ks = lsel + G;
    __local float *pe = ks + KT * (Dqk + 1);
    __local float *P = pe + G * KT;

    const long b = tab[tok_seq_at + t];
    const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
    const long nc = (tl + 1 >= l) ? (tl + 1 - l) / d + 1 : 0;
    const long r0 = tab[cu_cmp_at + b];
    const long jmax = tl / ls;

    scores_stage_q(q, q_off, q_st, q_sh, lse, lse_off, lse_st, lse_sh, t, g, Gi, Dqki, qs, lsel);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (long j0 = 0; j0 <= jmax; j0 += JC) {
        const long j1 = min(j0 + JC - 1, jmax);
        long ilo, ihi;
        scores_chunk_span(j0, j1, nc, l, d, ls, &ilo, &ihi);
        SCORES_CHUNK_ROWS()
        for (long j = j0 + lid; j <= j1; j += nl)
            sc[sc_off + t * sc_st + g * sc_sh + j] = scores_block(j, ilo, nc, l, d, ls, P);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

/* Lane 0 of scores_topn (and of the decode step's decode_scores_topn): merges the
 * chunk's scores cs[0 .. j1 - j0] of the unforced blocks j0 .. j1 into the ranked list
 * cand_s / cand_j of the best K (score descending, then index ascending; NaN scores
 * are skipped) holding m candidates; returns the new count. */
inline long topn_merge_chunk(__local const float *cs, long j0, long j1, long m, long K, __local float *cand_s,
                             __local int *cand_j)
{
    for (long j = j0; j <= j1; ++j) {
        const float s = cs[j - j0];
        if (s != s) continue; /* NaN: never selected */
        /* j ascends, so an equal score never beats a held one (lower index wins) */
        if (m == K && !(s > cand_s[m - 1])) continue;
        long pos = m < K ? m : K - 1;
        while (pos > 0 && s > cand_s[pos - 1]) {
            cand_s[pos] = cand_s[pos - 1];
            cand_j[pos] = cand_j[pos - 1];
            --pos;
        }
        cand_s[pos] = s;
        cand_j[pos] = (int)j;
        if (m < K) ++m;
    }
    return m;
}

/* Lane 0: the selection row, forced blocks [0, f1) and [f2, jmax], then the m
 * candidates, sorted, -1 padded to n. */
inline void topn_write_row(__global int *idx, long orow, long f1, long f2, long jmax, __local const int *cand_j,
                           long m, long n)
{
    long k = 0;
    for (long j = 0; j < f1; ++j) idx[orow + k++] = (int)j;
    for (long j = f2; j <= jmax; ++j) idx[orow + k++] = (int)j;
    for (long c = 0; c < m; ++c) idx[orow + k++] = cand_j[c];
    topn_finish_row(idx, orow, k, n);
}

/* Local memory: block_scores_v2's | cs JC floats | cand_s n floats | cand_j n ints. */
__kernel void scores_topn(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                          const __global float *kc, long kc_off, long kc_st, long kc_sh,
                          const __global float *lse, long lse_off, long lse_st, long lse_sh,
                          __global int *idx, long ix_off, long ix_st, long ix_sh,
                          const __global long *tab, long cu_seq_at, long cu_k_at, long cu_cmp_at, long tok_seq_at,
                          long Hq, long Hkv, long Dqk, long l, long d, long ls, float scale,
                          long n, long n_init, long n_local,
                          long first, long KT, long JC, long pc, __local float *lm)
{
    const long wg = first + (long)get_group_id(0);
    const long t = wg / Hkv, g = wg % Hkv, G = Hq / Hkv;
    const int lid = get_local_id(0), nl = get_local_size(0);
    const int Gi = (int)G, KTi = (int)KT, Dqki = (int)Dqk;
    __local float *qs = lm;
    __local float *lsel = qs + G * Dqk;
    __local float *ks = lsel + G;
    __local float *pe = ks + KT * (Dqk + 1);
    __local float *P = pe + G * KT;
    __local float *cs = P + pc;
    __local float *cand_s = cs + JC;
    __local int *cand_j = (__local int *)(cand_s + n);

    const long b = tab[tok_seq_at + t];
    const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
    const long nc = (tl + 1 >= l) ? (tl + 1 - l) / d + 1 : 0;
    const long r0 = tab[cu_cmp_at + b];
    const long jmax = tl / ls;
    const long take = min(n, jmax + 1);
    const long f1 = min(n_init, jmax + 1);       /* forced: [0, f1) */
    const long f2 = max(f1, jmax - n_local + 1); /* forced: [f2, jmax] */
    const long K = max(take - f1 - (jmax + 1 - f2), 0L); /* unforced slots */
    long m = 0;                                           /* candidates held (lane 0) */

    scores_stage_q(q, q_off, q_st, q_sh, lse, lse_off, lse_st, lse_sh, t, g, Gi, Dqki, qs, lsel);
    barrier(CLK_LOCAL_MEM_FENCE);
    /* only the unforced blocks f1 .. f2 - 1 compete; none when every slot is forced */
    for (long j0 = f1; K > 0 && j0 < f2; j0 += JC) {
        const long j1 = min(j0 + JC - 1, f2 - 1);
        long ilo, ihi;
        scores_chunk_span(j0, j1, nc, l, d, ls, &ilo, &ihi);
        SCORES_CHUNK_ROWS()
        for (long j = j0 + lid; j <= j1; j += nl) cs[j - j0] = scores_block(j, ilo, nc, l, d, ls, P);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid == 0) m = topn_merge_chunk(cs, j0, j1, m, K, cand_s, cand_j);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) topn_write_row(idx, ix_off + t * ix_st + g * ix_sh, f1, f2, jmax, cand_j, m, n);
}
