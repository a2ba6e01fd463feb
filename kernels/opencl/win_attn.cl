/*
 * win_attn.cl: sliding-window attention (semantics section 5): query t (local position
 * tl) attends tokens s in [max(0, tl - w + 1), tl] of its own sequence.
 *
 * Version 1: one work-group per (t, h); see softmax.cl for the chunk loop.
 * Writes o_win (f32) and lse_win if has_lse.
 */
__kernel void win_attn(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                       const __global nsa_t *k, long k_off, long k_st, long k_sh,
                       const __global nsa_t *v, long v_off, long v_st, long v_sh,
                       __global float *o, long o_off, long o_st, long o_sh,
                       __global float *lse, long lse_off, long lse_st, long lse_sh, int has_lse,
                       const __global long *tab, long cu_seq_at, long cu_k_at, long tok_seq_at,
                       long Hq, long Hkv, long Dqk, long Dv, long w, float scale,
                       long first,
                       __local float *qs, __local float *acc, __local float *p,
                       __local float *red, __local long *row)
{
    const long wg = first + (long)get_group_id(0);
    const long t = wg / Hq, h = wg % Hq, g = h / (Hq / Hkv);
    const int lid = get_local_id(0), nl = get_local_size(0);

    const long b = tab[tok_seq_at + t];
    const long t0 = tab[cu_k_at + b]; /* key row of the sequence's position 0 */
    const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
    const long s0 = max(0L, tl - w + 1);
    const long nkeys = tl - s0 + 1;

    load_row_local(qs, q, q_off + t * q_st + h * q_sh, Dqk);
    zero_local(acc, Dv);

    float m = -INFINITY, lsum = 0.0f;
    for (long base = 0; base < nkeys; base += nl) {
        const long s = s0 + base + lid;
        const int ok = s <= tl;
        attend_chunk_t(qs, k, k_off + (t0 + s) * k_st + g * k_sh, v, ok ? v_off + (t0 + s) * v_st + g * v_sh : -1,
                       scale, Dqk, Dv, p, red, row, acc, &m, &lsum, (int)min((long)nl, nkeys - base));
    }
    softmax_finish(acc, m, lsum, o, o_off + t * o_st + h * o_sh, Dv, lse,
                   lse_off + t * lse_st + h * lse_sh, has_lse);
}

/*
 * Version 2: one work-group per (t, g), the G heads of the group sharing each K/V
 * tile (group_attn.cl). Work-group index = t * Hkv + g.
 */
__kernel void win_attn_v2(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                          const __global nsa_t *k, long k_off, long k_st, long k_sh,
                          const __global nsa_t *v, long v_off, long v_st, long v_sh,
                          __global float *o, long o_off, long o_st, long o_sh,
                          __global float *lse, long lse_off, long lse_st, long lse_sh, int has_lse,
                          const __global long *tab, long cu_seq_at, long cu_k_at, long tok_seq_at,
                          long Hq, long Hkv, long Dqk, long Dv, long w, float scale,
                          long first, long KT, __local float *lm, __local long *rows)
{
    const long wg = first + (long)get_group_id(0);
    const long t = wg / Hkv, g = wg % Hkv, G = Hq / Hkv;
    const int Gi = (int)G, KTi = (int)KT, Dqki = (int)Dqk, Dvi = (int)Dv;
    GA_LOCALS(lm, Gi, KTi, Dqki, Dvi);
    __local long *krow = rows, *vrow = rows + KT;

    const long b = tab[tok_seq_at + t];
    const long t0 = tab[cu_k_at + b]; /* key row of the sequence's position 0 */
    const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
    const long s0 = max(0L, tl - w + 1);
    const long nkeys = tl - s0 + 1;

    float acc[GA_MAX_ACC];
    for (int i = 0; i < GA_MAX_ACC; ++i) acc[i] = 0.0f;
    ga_begin(ga_qs, ga_m, ga_l, q, q_off + t * q_st + g * G * q_sh, q_sh, Gi, Dqki);
    for (long base = 0; base < nkeys; base += KT) {
        for (long i = get_local_id(0); i < KT; i += get_local_size(0)) {
            const long s = s0 + base + i;
            krow[i] = s <= tl ? k_off + (t0 + s) * k_st + g * k_sh : -1;
            vrow[i] = s <= tl ? v_off + (t0 + s) * v_st + g * v_sh : -1;
        }
        ga_load_tile_t(ga_ks, ga_vs, krow, vrow, k, v, KTi, Dqki, Dvi);
        ga_step(acc, ga_qs, ga_ks, ga_vs, ga_p, ga_m, ga_l, ga_alpha, krow, Gi, KTi, Dqki, Dvi, scale);
    }
    ga_finish(acc, ga_m, ga_l, o, o_off + t * o_st + g * G * o_sh, o_sh, lse, lse_off + t * lse_st + g * G * lse_sh,
              lse_sh, has_lse, Gi, Dvi);
}
