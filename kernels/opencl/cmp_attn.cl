/*
 * cmp_attn.cl: attention of each query over the compressed blocks it can see
 * (semantics section 2). Query t (local position tl in its sequence) sees compressed
 * block i iff i*d + l - 1 <= tl, i.e. the first nc(tl) rows of its sequence:
 *     nc = (tl + 1 >= l) ? (tl + 1 - l) / d + 1 : 0.
 * Writes o_cmp (f32 [T, Hq, Dv]) and lse_cmp (always; -inf where nc = 0).
 *
 * Version 1: one work-group per (t, h), work-group index = t * Hq + h (plus `first`
 * when a launch is split); see softmax.cl for the chunk loop.
 */
__kernel void cmp_attn(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                       const __global float *kc, long kc_off, long kc_st, long kc_sh,
                       const __global float *vc, long vc_off, long vc_st, long vc_sh,
                       __global float *o, long o_off, long o_st, long o_sh,
                       __global float *lse, long lse_off, long lse_st, long lse_sh,
                       const __global long *tab, long cu_seq_at, long cu_k_at, long cu_cmp_at, long tok_seq_at,
                       long Hq, long Hkv, long Dqk, long Dv, long l, long d, float scale,
                       long first,
                       __local float *qs, __local float *acc, __local float *p,
                       __local float *red, __local long *row)
{
    const long wg = first + (long)get_group_id(0);
    const long t = wg / Hq, h = wg % Hq, g = h / (Hq / Hkv);
    const int lid = get_local_id(0), nl = get_local_size(0);

    const long b = tab[tok_seq_at + t];
    const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
    const long nc = (tl + 1 >= l) ? (tl + 1 - l) / d + 1 : 0;
    const long r0 = tab[cu_cmp_at + b];

    load_row_local(qs, q, q_off + t * q_st + h * q_sh, Dqk);
    zero_local(acc, Dv);

    float m = -INFINITY, lsum = 0.0f;
    for (long base = 0; base < nc; base += nl) {
        const long i = base + lid;
        float x = -INFINITY;
        long vrow = -1;
        if (i < nc) {
            x = scale * dot_local_f32(qs, kc, kc_off + (r0 + i) * kc_st + g * kc_sh, Dqk);
            vrow = vc_off + (r0 + i) * vc_st + g * vc_sh;
        }
        row[lid] = vrow;
        const float alpha = softmax_chunk(p, red, x, &m, &lsum);
        accumulate_f32(acc, alpha, p, row, (int)min((long)nl, nc - base), vc, Dv);
    }
    softmax_finish(acc, m, lsum, o, o_off + t * o_st + h * o_sh, Dv, lse,
                   lse_off + t * lse_st + h * lse_sh, 1);
}

/*
 * Version 2: one work-group per (t, g), the G heads of the group sharing each tile of
 * compressed K/V rows (group_attn.cl). Work-group index = t * Hkv + g.
 */
__kernel void cmp_attn_v2(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                          const __global float *kc, long kc_off, long kc_st, long kc_sh,
                          const __global float *vc, long vc_off, long vc_st, long vc_sh,
                          __global float *o, long o_off, long o_st, long o_sh,
                          __global float *lse, long lse_off, long lse_st, long lse_sh,
                          const __global long *tab, long cu_seq_at, long cu_k_at, long cu_cmp_at, long tok_seq_at,
                          long Hq, long Hkv, long Dqk, long Dv, long l, long d, float scale,
                          long first, long KT, __local float *lm, __local long *rows)
{
    const long wg = first + (long)get_group_id(0);
    const long t = wg / Hkv, g = wg % Hkv, G = Hq / Hkv;
    const int Gi = (int)G, KTi = (int)KT, Dqki = (int)Dqk, Dvi = (int)Dv;
    GA_LOCALS(lm, Gi, KTi, Dqki, Dvi);
    __local long *krow = rows, *vrow = rows + KT;

    const long b = tab[tok_seq_at + t];
    const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
    const long nc = (tl + 1 >= l) ? (tl + 1 - l) / d + 1 : 0;
    const long r0 = tab[cu_cmp_at + b];

    float acc[GA_MAX_ACC];
    for (int i = 0; i < GA_MAX_ACC; ++i) acc[i] = 0.0f;
    ga_begin(ga_qs, ga_m, ga_l, q, q_off + t * q_st + g * G * q_sh, q_sh, Gi, Dqki);
    for (long base = 0; base < nc; base += KT) {
        for (long i = get_local_id(0); i < KT; i += get_local_size(0)) {
            const long r = r0 + base + i;
            krow[i] = base + i < nc ? kc_off + r * kc_st + g * kc_sh : -1;
            vrow[i] = base + i < nc ? vc_off + r * vc_st + g * vc_sh : -1;
        }
        ga_load_tile_f32(ga_ks, ga_vs, krow, vrow, kc, vc, KTi, Dqki, Dvi);
        ga_step(acc, ga_qs, ga_ks, ga_vs, ga_p, ga_m, ga_l, ga_alpha, krow, Gi, KTi, Dqki, Dvi, scale);
    }
    ga_finish(acc, ga_m, ga_l, o, o_off + t * o_st + g * G * o_sh, o_sh, lse, lse_off + t * lse_st + g * G * lse_sh,
              lse_sh, 1, Gi, Dvi);
}
