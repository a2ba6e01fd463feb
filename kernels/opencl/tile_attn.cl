/*
 * tile_attn.cl: version 3 of the compressed and window attention kernels
 * (cmp_attn_v3, win_attn_v3): one work-group of TA_WG = 256 lanes per (tile of BQ
 * consecutive packed tokens, KV head g) computes the R = BQ * G <= TA_R query rows
 * (token, head of the group) of the tile together, so each key/value row is loaded
 * once per tile instead of once per token (version 2) or per head (version 1), and
 * every lane computes a register block of products instead of one dot product.
 *
 * Row r of the tile is token T0 + r / G, head g * G + r % G (BQ = TA_R / G rounded
 * down, so at G = 3 rows 63 of 64 are used). Each row's keys are one contiguous
 * range [lo_r, hi_r) of packed key rows (section 2: its sequence's first nc
 * compressed rows; section 5: the w tokens up to itself); consecutive packed tokens
 * have non-decreasing lo and hi, so the tile walks [lo of its first token, hi of its
 * last) in key tiles of TA_BK = 32 and masks per row. A tile that spans two
 * sequences walks the keys of both; the masks keep them apart.
 *
 * Per key tile:
 *   1. S = Q K^T for the R x TA_BK pairs, Dqk in chunks of TA_DC = 32 staged in local
 *      memory as f32 (Q chunk [R][DC + 1], K chunk [BK][DC + 1]); lane (ty, tx) =
 *      divmod(lid, 16) owns rows ty + 16 i (i < 4) and keys tx + 16 j (j < 2): six
 *      local loads per eight FMAs; the V tile [BK][Dv] is loaded with chunk 0.
 *   2. the scaled, masked scores go to P [R][BK + 1]; four lanes per row take the
 *      row's max and sum over eight keys each, combined in a fixed order (m, l and
 *      the rescale alpha per row in local memory).
 *   3. O += P V: the same lane owns rows ty + 16 i and columns tx + 16 c (c < TA_NC,
 *      so Dv <= 16 * TA_NC = 128) in registers: twelve local loads per 32 FMAs.
 * Then o = acc / l and lse = m + log(l) (l = 0: o = 0, lse = -inf), as version 2.
 * Every sum has a fixed order: bitwise reproducible run to run.
 *
 * Local memory: 4 * (R (DC + 1) + BK (DC + 1) + R (BK + 1) + BK Dv + 3 R + 8 R) bytes
 * plus 2 R longs: 40.5 KiB at Dv = 128 (the host checks the device's local memory
 * and the kernel's work-group limit; otherwise version 2 runs).
 */
#define TA_WG 256
#define TA_R 64
#define TA_BK 32
#define TA_DC 32
#define TA_NC 8 /* output columns per lane: Dv <= 16 * TA_NC */

/* The kernels' local float array, carved. */
#define TA_LOCALS(lm, Dv)                                   \
    __local float *ta_q = (lm);                             \
    __local float *ta_k = ta_q + TA_R * (TA_DC + 1);        \
    __local float *ta_p = ta_k + TA_BK * (TA_DC + 1);       \
    __local float *ta_v = ta_p + TA_R * (TA_BK + 1);        \
    __local float *ta_m = ta_v + TA_BK * (Dv);              \
    __local float *ta_l = ta_m + TA_R;                      \
    __local float *ta_alpha = ta_l + TA_R;                  \
    __local float *ta_red = ta_alpha + TA_R /* [R][8]: partial maxes, then sums */

/* Element i of a key / value array that is either f32 (kf) or the storage type (kt). */
inline float ta_ld(const __global float *kf, const __global nsa_t *kt, long i)
{
    return kf ? kf[i] : ld(kt, i);
}

/*
 * The tile's walk over keys [lo, hi) (row r's own range [rlo[r], rhi[r]), relative to
 * the arrays' element offsets kb0 + key * k_st, vb0 + key * v_st, which include the
 * KV head) and the end: writes rows' o and lse. q_row0 = element offset of row 0's
 * token and the group's first head; rows past nrows are padding.
 */
inline void ta_walk(const __global nsa_t *q, long q_row0, long q_st, long q_sh,
                    const __global float *kf, const __global nsa_t *kt, long kb0, long k_st,
                    const __global float *vf, const __global nsa_t *vt, long vb0, long v_st,
                    __global float *o, long o_row0, long o_st, long o_sh,
                    __global float *lse, long lse_row0, long lse_st, long lse_sh, int has_lse,
                    __local const long *rlo, __local const long *rhi, long lo, long hi, int nrows, int G,
                    int Dqk, int Dv, float scale, __local float *lm)
{
    TA_LOCALS(lm, Dv);
    const int lid = get_local_id(0), ty = lid / 16, tx = lid % 16;
    const int srow = lid / 4, spart = lid % 4; /* softmax: four lanes per row */
    float acc[4][TA_NC];
    for (int i = 0; i < 4; ++i)
        for (int c = 0; c < TA_NC; ++c) acc[i][c] = 0.0f;
    if (lid < TA_R) {
        ta_m[lid] = -INFINITY;
        ta_l[lid] = 0.0f;
    }
    for (long kb = lo; kb < hi; kb += TA_BK) {
        float s[4][2];
        for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = 0.0f;
        for (int d0 = 0; d0 < Dqk; d0 += TA_DC) {
            barrier(CLK_LOCAL_MEM_FENCE); /* the last chunk's (or tile's P V) readers are done */
            for (int e = lid; e < TA_R * TA_DC; e += TA_WG) {
                const int r = e / TA_DC, c = e % TA_DC;
                ta_q[r * (TA_DC + 1) + c] =
                    (r < nrows && d0 + c < Dqk) ? ld(q, q_row0 + (r / G) * q_st + (r % G) * q_sh + d0 + c) : 0.0f;
            }
            for (int e = lid; e < TA_BK * TA_DC; e += TA_WG) {
                const int j = e / TA_DC, c = e % TA_DC;
                ta_k[j * (TA_DC + 1) + c] =
                    (kb + j < hi && d0 + c < Dqk) ? ta_ld(kf, kt, kb0 + (kb + j) * k_st + d0 + c) : 0.0f;
            }
            if (d0 == 0)
                for (int e = lid; e < TA_BK * Dv; e += TA_WG) {
                    const int j = e / Dv, c = e % Dv;
                    /* masked keys load zeros: 0 * garbage could be NaN */
                    ta_v[e] = kb + j < hi ? ta_ld(vf, vt, vb0 + (kb + j) * v_st + c) : 0.0f;
                }
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int c = 0; c < TA_DC; ++c) {
                const float k0 = ta_k[tx * (TA_DC + 1) + c], k1 = ta_k[(tx + 16) * (TA_DC + 1) + c];
                for (int i = 0; i < 4; ++i) {
                    const float qv = ta_q[(ty + 16 * i) * (TA_DC + 1) + c];
                    s[i][0] = fma(qv, k0, s[i][0]);
                    s[i][1] = fma(qv, k1, s[i][1]);
                }
            }
        }
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 2; ++j) {
                const int r = ty + 16 * i, key = tx + 16 * j;
                const long kk = kb + key;
                const int ok = r < nrows && kk >= rlo[r] && kk < rhi[r];
                ta_p[r * (TA_BK + 1) + key] = ok ? scale * s[i][j] : -INFINITY;
            }
        barrier(CLK_LOCAL_MEM_FENCE);
        {
            __local float *pr = ta_p + srow * (TA_BK + 1) + spart * 8;
            float mx = -INFINITY;
            for (int j = 0; j < 8; ++j) mx = fmax(mx, pr[j]);
            ta_red[srow * 8 + spart] = mx;
            barrier(CLK_LOCAL_MEM_FENCE);
            const float mo = ta_m[srow];
            mx = fmax(fmax(fmax(mo, ta_red[srow * 8]), ta_red[srow * 8 + 1]),
                      fmax(ta_red[srow * 8 + 2], ta_red[srow * 8 + 3]));
            float sum = 0.0f;
            for (int j = 0; j < 8; ++j) {
                const float x = pr[j];
                const float e = (x == -INFINITY) ? 0.0f : exp(x - mx);
                pr[j] = e;
                sum += e;
            }
            ta_red[srow * 8 + 4 + spart] = sum;
            barrier(CLK_LOCAL_MEM_FENCE);
            if (spart == 0) {
                const float a = (mo == -INFINITY) ? 0.0f : exp(mo - mx);
                const __local float *ps = ta_red + srow * 8 + 4;
                ta_l[srow] = ta_l[srow] * a + ((ps[0] + ps[1]) + (ps[2] + ps[3]));
                ta_m[srow] = mx;
                ta_alpha[srow] = a;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        for (int i = 0; i < 4; ++i) {
            const int r = ty + 16 * i;
            const float a = ta_alpha[r];
            for (int c = 0; c < TA_NC; ++c) acc[i][c] *= a;
            __local const float *pr = ta_p + r * (TA_BK + 1);
            for (int j = 0; j < TA_BK; ++j) {
                const float pj = pr[j];
                __local const float *vr = ta_v + j * Dv + tx;
                for (int c = 0; c < TA_NC; ++c)
                    if (tx + 16 * c < Dv) acc[i][c] = fma(pj, vr[16 * c], acc[i][c]);
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* m, l final (a tile-less walk: as initialised) */
    for (int i = 0; i < 4; ++i) {
        const int r = ty + 16 * i;
        if (r >= nrows) continue;
        const float lr = ta_l[r];
        const long orow = o_row0 + (r / G) * o_st + (r % G) * o_sh;
        for (int c = 0; c < TA_NC; ++c)
            if (tx + 16 * c < Dv) o[orow + tx + 16 * c] = lr != 0.0f ? acc[i][c] / lr : 0.0f;
        if (has_lse && tx == 0)
            lse[lse_row0 + (r / G) * lse_st + (r % G) * lse_sh] = lr != 0.0f ? ta_m[r] + log(lr) : -INFINITY;
    }
}

/* The tile of work-group wg: its first token, token count and row count. */
inline long ta_tile(long wg, long Hkv, long T, int G, long *t_first, int *nrows)
{
    const long BQ = TA_R / G, tile = wg / Hkv;
    *t_first = tile * BQ;
    const long ntok = min(BQ, T - *t_first);
    *nrows = (int)(ntok * G);
    return wg % Hkv;
}

/*
 * Compressed branch (section 2): token t at local position tl sees its sequence's
 * first nc(tl) compressed rows, nc = (tl + 1 >= l) ? (tl + 1 - l) / d + 1 : 0.
 * Work-group index = tile * Hkv + g, ceil(T / BQ) * Hkv work-groups.
 */
__kernel void cmp_attn_v3(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                          const __global float *kc, long kc_off, long kc_st, long kc_sh,
                          const __global float *vc, long vc_off, long vc_st, long vc_sh,
                          __global float *o, long o_off, long o_st, long o_sh,
                          __global float *lse, long lse_off, long lse_st, long lse_sh,
                          const __global long *tab, long cu_seq_at, long cu_k_at, long cu_cmp_at, long tok_seq_at, long T,
                          long Hq, long Hkv, long Dqk, long Dv, long l, long d, float scale,
                          long first, __local float *lm, __local long *rows)
{
    const int G = (int)(Hq / Hkv);
    long t1;
    int nrows;
    const long g = ta_tile(first + (long)get_group_id(0), Hkv, T, G, &t1, &nrows);
    __local long *rlo = rows, *rhi = rows + TA_R;
    for (int r = get_local_id(0); r < TA_R; r += TA_WG) {
        long a = 0, z = 0;
        if (r < nrows) {
            const long t = t1 + r / G, b = tab[tok_seq_at + t];
            const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
            a = tab[cu_cmp_at + b];
            z = a + ((tl + 1 >= l) ? (tl + 1 - l) / d + 1 : 0);
        }
        rlo[r] = a;
        rhi[r] = z;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const long lo = rlo[0], hi = nrows > 0 ? rhi[nrows - 1] : 0;
    ta_walk(q, q_off + t1 * q_st + g * G * q_sh, q_st, q_sh, kc, 0, kc_off + g * kc_sh, kc_st, vc, 0,
            vc_off + g * vc_sh, vc_st, o, o_off + t1 * o_st + g * G * o_sh, o_st, o_sh, lse,
            lse_off + t1 * lse_st + g * G * lse_sh, lse_st, lse_sh, 1, rlo, rhi, lo, hi, nrows, G, (int)Dqk,
            (int)Dv, scale, lm);
}

/*
 * Window branch (section 5): token t at position tl of the sequence whose keys start at
 * key row t0 attends key rows t0 + max(0, tl - w + 1) .. t0 + tl.
 */
__kernel void win_attn_v3(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                          const __global nsa_t *k, long k_off, long k_st, long k_sh,
                          const __global nsa_t *v, long v_off, long v_st, long v_sh,
                          __global float *o, long o_off, long o_st, long o_sh,
                          __global float *lse, long lse_off, long lse_st, long lse_sh, int has_lse,
                          const __global long *tab, long cu_seq_at, long cu_k_at, long tok_seq_at, long T,
                          long Hq, long Hkv, long Dqk, long Dv, long w, float scale,
                          long first, __local float *lm, __local long *rows)
{
    const int G = (int)(Hq / Hkv);
    long t1;
    int nrows;
    const long g = ta_tile(first + (long)get_group_id(0), Hkv, T, G, &t1, &nrows);
    __local long *rlo = rows, *rhi = rows + TA_R;
    for (int r = get_local_id(0); r < TA_R; r += TA_WG) {
        long a = 0, z = 0;
        if (r < nrows) {
            const long t = t1 + r / G, b = tab[tok_seq_at + t], t0 = tab[cu_k_at + b];
            const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
            a = t0 + max(0L, tl - w + 1);
            z = t0 + tl + 1;
        }
        rlo[r] = a;
        rhi[r] = z;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const long lo = rlo[0], hi = nrows > 0 ? rhi[nrows - 1] : 0;
    ta_walk(q, q_off + t1 * q_st + g * G * q_sh, q_st, q_sh, 0, k, k_off + g * k_sh, k_st, 0, v,
            v_off + g * v_sh, v_st, o, o_off + t1 * o_st + g * G * o_sh, o_st, o_sh, lse,
            lse_off + t1 * lse_st + g * G * lse_sh, lse_st, lse_sh, has_lse, rlo, rhi, lo, hi, nrows, G, (int)Dqk,
            (int)Dv, scale, lm);
}
