/*
 * slc_attn.cl: attention of each query over the tokens of the selection blocks chosen
 * for its KV group (semantics section 4): every token s of block j = indices[t, g, k]
 * (j >= 0) with s <= tl, the query's own block causally masked. The indices come from
 * SELECT_TOPN or from the caller; -1 slots are skipped.
 *
 * Version 1: one work-group per (t, h). Lane 0 first copies the usable blocks (j >= 0,
 * j * l_s <= tl) into blk[] (local, n entries); they are then walked as one virtual key
 * list of nb * l_s entries (entry e = block blk[e / l_s], offset e % l_s) in chunks of
 * WG; see softmax.cl for the chunk loop. Writes o_slc (f32) and lse_slc if has_lse.
 */

/* blk[0] = the number nb of usable blocks among the n indices of row ix_row (j >= 0 and
 * j * l_s <= tl), blk[1 .. nb] = those blocks in index order; run by one lane. */
inline void slc_usable_blocks(const __global int *idx, long ix_row, long n, long ls, long tl, __local int *blk)
{
    int nb = 0;
    for (long k = 0; k < n; ++k) {
        const int j = idx[ix_row + k];
        if (j >= 0 && (long)j * ls <= tl) blk[1 + nb++] = j;
    }
    blk[0] = nb;
}

__kernel void slc_attn(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                       const __global nsa_t *k, long k_off, long k_st, long k_sh,
                       const __global nsa_t *v, long v_off, long v_st, long v_sh,
                       const __global int *idx, long ix_off, long ix_st, long ix_sh,
                       __global float *o, long o_off, long o_st, long o_sh,
                       __global float *lse, long lse_off, long lse_st, long lse_sh, int has_lse,
                       const __global long *tab, long cu_seq_at, long cu_k_at, long tok_seq_at,
                       long Hq, long Hkv, long Dqk, long Dv, long ls, long n, float scale,
                       long first,
                       __local float *qs, __local float *acc, __local float *p,
                       __local float *red, __local long *row, __local int *blk)
{
    const long wg = first + (long)get_group_id(0);
    const long t = wg / Hq, h = wg % Hq, g = h / (Hq / Hkv);
    const int lid = get_local_id(0), nl = get_local_size(0);

    const long b = tab[tok_seq_at + t];
    const long t0 = tab[cu_k_at + b]; /* key row of the sequence's position 0 */
    const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
    const long ix_row = ix_off + t * ix_st + g * ix_sh;

    if (lid == 0) slc_usable_blocks(idx, ix_row, n, ls, tl, blk);
    load_row_local(qs, q, q_off + t * q_st + h * q_sh, Dqk); /* (its barrier publishes blk) */
    zero_local(acc, Dv);

    float m = -INFINITY, lsum = 0.0f;
    const long nkeys = (long)blk[0] * ls;
    for (long base = 0; base < nkeys; base += nl) {
        const long e = base + lid;
        const long s = e < nkeys ? (long)blk[1 + e / ls] * ls + e % ls : tl + 1;
        const int ok = s <= tl;
        attend_chunk_t(qs, k, k_off + (t0 + s) * k_st + g * k_sh, v, ok ? v_off + (t0 + s) * v_st + g * v_sh : -1,
                       scale, Dqk, Dv, p, red, row, acc, &m, &lsum, (int)min((long)nl, nkeys - base));
    }
    softmax_finish(acc, m, lsum, o, o_off + t * o_st + h * o_sh, Dv, lse,
                   lse_off + t * lse_st + h * lse_sh, has_lse);
}

/*
 * Version 2: one work-group per (t, g), the G heads of the group sharing each K/V
 * tile (group_attn.cl); the usable blocks are gathered into blk[] as in version 1.
 */
__kernel void slc_attn_v2(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                          const __global nsa_t *k, long k_off, long k_st, long k_sh,
                          const __global nsa_t *v, long v_off, long v_st, long v_sh,
                          const __global int *idx, long ix_off, long ix_st, long ix_sh,
                          __global float *o, long o_off, long o_st, long o_sh,
                          __global float *lse, long lse_off, long lse_st, long lse_sh, int has_lse,
                          const __global long *tab, long cu_seq_at, long cu_k_at, long tok_seq_at,
                          long Hq, long Hkv, long Dqk, long Dv, long ls, long n, float scale,
                          long first, long KT, __local float *lm, __local long *rows, __local int *blk)
{
    const long wg = first + (long)get_group_id(0);
    const long t = wg / Hkv, g = wg % Hkv, G = Hq / Hkv;
    const int Gi = (int)G, KTi = (int)KT, Dqki = (int)Dqk, Dvi = (int)Dv;
    GA_LOCALS(lm, Gi, KTi, Dqki, Dvi);
    __local long *krow = rows, *vrow = rows + KT;

    const long b = tab[tok_seq_at + t];
    const long t0 = tab[cu_k_at + b];
    const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
    const long ix_row = ix_off + t * ix_st + g * ix_sh;
    if (get_local_id(0) == 0) slc_usable_blocks(idx, ix_row, n, ls, tl, blk);

    float acc[GA_MAX_ACC];
    for (int i = 0; i < GA_MAX_ACC; ++i) acc[i] = 0.0f;
    ga_begin(ga_qs, ga_m, ga_l, q, q_off + t * q_st + g * G * q_sh, q_sh, Gi, Dqki); /* (publishes blk) */
    const long nkeys = (long)blk[0] * ls;
    for (long base = 0; base < nkeys; base += KT) {
        for (long i = get_local_id(0); i < KT; i += get_local_size(0)) {
            const long e = base + i;
            const long s = e < nkeys ? (long)blk[1 + e / ls] * ls + e % ls : tl + 1;
            krow[i] = s <= tl ? k_off + (t0 + s) * k_st + g * k_sh : -1;
            vrow[i] = s <= tl ? v_off + (t0 + s) * v_st + g * v_sh : -1;
        }
        ga_load_tile_t(ga_ks, ga_vs, krow, vrow, k, v, KTi, Dqki, Dvi);
        ga_step(acc, ga_qs, ga_ks, ga_vs, ga_p, ga_m, ga_l, ga_alpha, krow, Gi, KTi, Dqki, Dvi, scale);
    }
    ga_finish(acc, ga_m, ga_l, o, o_off + t * o_st + g * G * o_sh, o_sh, lse, lse_off + t * lse_st + g * G * lse_sh,
              lse_sh, has_lse, Gi, Dvi);
}
