/*
 * group_attn.cl: version 2 of the three attention kernels (cmp_attn_v2, slc_attn_v2,
 * win_attn_v2): one work-group per (query token t, KV group g) computes all G query
 * heads of the group together, so every key/value row is loaded (and converted) once
 * into local memory and used by G heads instead of being fetched G times. The key set
 * of a query depends only on (t, g) in all three branches (the compressed blocks
 * visible at t, the group's selected blocks, the window), so this is exact.
 *
 * Keys are walked in tiles of KT (a power of two chosen from the local memory size):
 *   1. the kernel writes the K and V element offsets of the tile's keys into krow[],
 *      vrow[] (-1: masked key), then calls
 *   2. ga_load_tile_*(): K tile [KT][Dqk + 1] (row padded by one float so that lanes
 *      reading one column of different rows hit different banks) and V tile [KT][Dv]
 *      into local memory as f32; masked rows are zeros (0 * garbage could be NaN);
 *   3. ga_step(): logits for the G*KT (head, key) pairs, one dot product per lane;
 *      then lane h < G updates head h's running max m and sum l serially over the
 *      tile and leaves p = exp(x - m) and the rescale alpha in local memory; then each
 *      lane updates the outputs it owns, (h, c) = divmod(lane + k*WG, Dv) for
 *      k < GA_MAX_ACC, kept in registers: acc = acc * alpha[h] + sum_s p[h][s] v[s][c].
 *   4. ga_finish(): o = acc / l, lse = m + log(l) (l = 0: o = 0, lse = -inf).
 * Every sum has a fixed order: bitwise reproducible. Needs G*Dv <= GA_MAX_ACC * WG
 * (the host falls back to version 1 otherwise).
 *
 * Local memory (floats): qs G*Dqk | ks KT*(Dqk+1) | vs KT*Dv | p G*KT | m, l, alpha 3G,
 * plus krow, vrow (2*KT longs). Paper shape (G=16, Dqk=192, Dv=128) with 48 KiB of
 * local memory (NVIDIA): KT = 16, 34 KiB per work-group of 256 lanes.
 *
 * Measured (whole forward, paper shape bf16 MEAN, T=1024, `nsa run`): PoCL 3.1 on 2
 * EPYC cores: v1 15.1 s, v2 15.5 s (a CPU gains nothing from local memory; v2 is
 * meant for GPUs, where every K/V row is read once per group instead of G times).
 */
#define GA_MAX_ACC 16

/* Loads the G query rows of (t, g) into qs and resets the running max / sum. */
inline void ga_begin(__local float *qs, __local float *m, __local float *l, const __global nsa_t *q, long qrow0,
                     long q_sh, int G, int Dqk)
{
    for (int e = get_local_id(0); e < G * Dqk; e += get_local_size(0)) {
        const int h = e / Dqk;
        qs[e] = ld(q, qrow0 + h * q_sh + (e - h * Dqk));
    }
    for (int h = get_local_id(0); h < G; h += get_local_size(0)) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* Step 2 for storage-type K/V (k_slc, v_slc, k_win, v_win). Local indices are int
 * (32-bit division is much cheaper than 64-bit on GPUs); global offsets stay long. */
inline void ga_load_tile_t(__local float *ks, __local float *vs, __local const long *krow, __local const long *vrow,
                           const __global nsa_t *k, const __global nsa_t *v, int KT, int Dqk, int Dv)
{
    barrier(CLK_LOCAL_MEM_FENCE); /* krow / vrow written */
    for (int e = get_local_id(0); e < KT * Dqk; e += get_local_size(0)) {
        const int s = e / Dqk, c = e - s * Dqk;
        ks[s * (Dqk + 1) + c] = krow[s] >= 0 ? ld(k, krow[s] + c) : 0.0f;
    }
    for (int e = get_local_id(0); e < KT * Dv; e += get_local_size(0)) {
        const int s = e / Dv, c = e - s * Dv;
        vs[e] = vrow[s] >= 0 ? ld(v, vrow[s] + c) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* Step 2 for f32 K/V (the compressed kc, vc). */
inline void ga_load_tile_f32(__local float *ks, __local float *vs, __local const long *krow,
                             __local const long *vrow, const __global float *k, const __global float *v, int KT,
                             int Dqk, int Dv)
{
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = get_local_id(0); e < KT * Dqk; e += get_local_size(0)) {
        const int s = e / Dqk, c = e - s * Dqk;
        ks[s * (Dqk + 1) + c] = krow[s] >= 0 ? k[krow[s] + c] : 0.0f;
    }
    for (int e = get_local_id(0); e < KT * Dv; e += get_local_size(0)) {
        const int s = e / Dv, c = e - s * Dv;
        vs[e] = vrow[s] >= 0 ? v[vrow[s] + c] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* Step 3. Ends with a barrier so that the next tile may overwrite the local arrays. */
inline void ga_step(float *acc, __local const float *qs, __local const float *ks, __local const float *vs,
                    __local float *p, __local float *m, __local float *l, __local float *alpha,
                    __local const long *krow, int G, int KT, int Dqk, int Dv, float scale)
{
    const int lid = get_local_id(0), nl = get_local_size(0);
    for (int e = lid; e < G * KT; e += nl) {
        const int h = e / KT, s = e - h * KT;
        float x = -INFINITY;
        if (krow[s] >= 0) {
            __local const float *qh = qs + h * Dqk;
            __local const float *kr = ks + s * (Dqk + 1);
            float d = 0.0f;
            for (int c = 0; c < Dqk; ++c) d += qh[c] * kr[c];
            x = scale * d;
        }
        p[e] = x;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = lid; h < G; h += nl) {
        __local float *ph = p + h * KT;
        const float mo = m[h];
        float mx = mo;
        for (int s = 0; s < KT; ++s) mx = fmax(mx, ph[s]);
        const float a = (mo == -INFINITY) ? 0.0f : exp(mo - mx);
        float sum = 0.0f;
        for (int s = 0; s < KT; ++s) {
            const float x = ph[s];
            const float e = (x == -INFINITY) ? 0.0f : exp(x - mx);
            ph[s] = e;
            sum += e;
        }
        l[h] = l[h] * a + sum;
        m[h] = mx;
        alpha[h] = a;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = 0; k < GA_MAX_ACC; ++k) {
        const int o = lid + k * nl;
        if (o < G * Dv) {
            const int h = o / Dv, c = o - h * Dv;
            __local const float *ph = p + h * KT;
            float a = acc[k] * alpha[h];
            for (int s = 0; s < KT; ++s) a += ph[s] * vs[s * Dv + c];
            acc[k] = a;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* Step 4: o rows of heads g*G .. g*G + G - 1 of token t (f32), and the LSEs. */
inline void ga_finish(const float *acc, __local const float *m, __local const float *l, __global float *o,
                      long orow0, long o_sh, __global float *lse, long lse_at0, long lse_sh, int has_lse, int G,
                      int Dv)
{
    const int lid = get_local_id(0), nl = get_local_size(0);
    for (int k = 0; k < GA_MAX_ACC; ++k) {
        const int e = lid + k * nl;
        if (e < G * Dv) {
            const int h = e / Dv, c = e - h * Dv;
            o[orow0 + h * o_sh + c] = (l[h] != 0.0f) ? acc[k] / l[h] : 0.0f;
        }
    }
    if (has_lse)
        for (int h = lid; h < G; h += nl)
            lse[lse_at0 + h * lse_sh] = (l[h] != 0.0f) ? m[h] + log(l[h]) : -INFINITY;
}

/* Carves the kernel's local float array into its parts. */
#define GA_LOCALS(lm, G, KT, Dqk, Dv)                       \
    __local float *ga_qs = (lm);                            \
    __local float *ga_ks = ga_qs + (G) * (Dqk);             \
    __local float *ga_vs = ga_ks + (KT) * ((Dqk) + 1);      \
    __local float *ga_p = ga_vs + (KT) * (Dv);              \
    __local float *ga_m = ga_p + (G) * (KT);                \
    __local float *ga_l = ga_m + (G);                       \
    __local float *ga_alpha = ga_l + (G)
