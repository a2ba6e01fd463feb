/*
 * backward.cl: the backward stages (semantics section 9), portable and plain:
 * the reference of the OpenCL backend's backward, f32 arithmetic.
 *
 * Per branch, with the forward's LSE (p_r = exp(scale q . k_r - lse)):
 *   e_r = dO . v_r,  dg = sum_r p_r e_r,  D = g dg,  ds_r = g p_r (e_r - dg)
 *   dq = scale sum_r ds_r k_r,  dk_r += scale ds_r q,  dv_r += g p_r dO
 *
 * bwd_rows_*: one work-group per (token, query head). The row's keys are walked
 * a work-group's width at a time, one key per lane: the first sweep sums dg
 * (partial sums per lane, then a fixed-order tree), the second forms ds per key
 * into local memory and the lanes, each owning some of the Dqk dims, add
 * sum_kk ds_kk k_kk to the dq accumulator.
 * bwd_keys_*: one work-group per (key row, KV head): the (token, head) pairs
 * that read the key (compressed row i: local t >= i d + l - 1; window token r:
 * t in [r, r + w); selected token r of block j: t >= r whose selection holds j)
 * a width at a time, one pair per lane; the lanes, owning dims, add the
 * chunk's sums to the dk, dv accumulators.
 * Every accumulator element has one owner per stage and a fixed order: results
 * are reproducible. Barriers sit in the kernels' own loops (uniform trip
 * counts), never in helpers.
 *
 * _cmp reads the f32 compressed rows (kc, vc); _slc and _win the storage type.
 */

#define BWD_NEG_INF(x) (isinf(x) && (x) < 0.0f)

/* The row's key segments: cmp one ([0, nc) over the sequence's compressed rows),
 * win one, slc one per selected slot (empty for -1 or an ineligible block). */
inline long bwd_nseg(int mode, long n) { return mode == 1 ? n : 1; }
inline void bwd_segment(int mode, long sgi, long tl, long s0, long cmp0, const __global int *sel, long l, long d,
                        long ls, long w, long *lo, long *hi, long *base)
{
    if (mode == 0) {
        *lo = 0;
        *hi = tl + 1 >= l ? (tl + 1 - l) / d + 1 : 0;
        *base = cmp0;
    } else if (mode == 2) {
        *lo = tl - w + 1 > 0 ? tl - w + 1 : 0;
        *hi = tl + 1;
        *base = s0;
    } else {
        const long j = sel[sgi];
        *base = s0;
        if (j < 0 || j * ls > tl) {
            *lo = *hi = 0;
        } else {
            *lo = j * ls;
            *hi = (j + 1) * ls < tl + 1 ? (j + 1) * ls : tl + 1;
        }
    }
}

#define BWD_ROWS(NAME, KV, LDKV, MODE)                                                                           \
    __kernel void NAME(const __global nsa_t *q, long q_off, long q_st, long q_sh, const __global nsa_t *dout,     \
                       long do_off, long do_st, long do_sh, const __global float *lse, long l_off, long l_st,    \
                       long l_sh, const __global float *gate, long g_off, long g_st, long g_sh,                  \
                       const __global int *idx, long i_off, long i_st, long i_sh, const __global KV *k, long k_off,\
                       long k_st, long k_sh, const __global KV *v, long v_off, long v_st, long v_sh,             \
                       __global float *dq, long dq_off, long dq_st, long dq_sh, int has_dq, __global float *dg,   \
                       long dg_off, long dg_st, long dg_sh, int has_dg, __global float *delta, long de_off,       \
                       long de_st, long de_sh, const __global long *tab, long cu_seq, long cu_k, long cu_cmp,        \
                       long tok_seq,                                                                     \
                       long B, long Hq, long Hkv, long Dqk, long Dv, long l, long d, long ls, long n, long w,      \
                       float scale, long first, __local float *red, __local float *sds, __local long *skey)      \
    {                                                                                                            \
        const long row = first + (long)get_group_id(0);                                                          \
        const int lid = (int)get_local_id(0), wg = (int)get_local_size(0);                                       \
        const long t = row / Hq, h = row % Hq, G = Hq / Hkv, gi = h / G;                                         \
        const long seq = tab[tok_seq + t], s0 = tab[cu_k + seq], cmp0 = tab[cu_cmp + seq];                      \
        const long tl = q_pos(tab, cu_seq, cu_k, seq, t); /* s0: the key row of position 0 */                    \
        const float lv = lse[l_off + t * l_st + h * l_sh], gt = gate[g_off + t * g_st + h * g_sh];              \
        const int none = BWD_NEG_INF(lv);                                                                        \
        const __global nsa_t *qr = q + q_off + t * q_st + h * q_sh;                                              \
        const __global nsa_t *dr = dout + do_off + t * do_st + h * do_sh;                                        \
        const __global int *sel = idx + i_off + t * i_st + gi * i_sh;                                            \
        const long nseg = bwd_nseg(MODE, n);                                                                     \
        float part = 0.0f;                                                                                       \
        for (long sg = 0; sg < nseg; sg++) {                                                                     \
            long lo, hi, base;                                                                                   \
            bwd_segment(MODE, sg, tl, s0, cmp0, sel, l, d, ls, w, &lo, &hi, &base);                              \
            for (long key = lo + lid; key < hi; key += wg) {                                                     \
                const __global KV *kr = k + k_off + (base + key) * k_st + gi * k_sh;                             \
                const __global KV *vr = v + v_off + (base + key) * v_st + gi * v_sh;                             \
                float z = 0.0f, e = 0.0f;                                                                        \
                for (long x = 0; x < Dqk; x++) z += ld(qr, x) * LDKV(kr, x);                                     \
                for (long x = 0; x < Dv; x++) e += ld(dr, x) * LDKV(vr, x);                                      \
                part += none ? 0.0f : exp(z * scale - lv) * e;                                                   \
            }                                                                                                    \
        }                                                                                                        \
        red[lid] = part;                                                                                         \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                            \
        for (int s = wg / 2; s > 0; s >>= 1) {                                                                   \
            if (lid < s) red[lid] += red[lid + s];                                                               \
            barrier(CLK_LOCAL_MEM_FENCE);                                                                        \
        }                                                                                                        \
        const float dgv = red[0];                                                                                \
        if (lid == 0) {                                                                                          \
            if (has_dg) dg[dg_off + t * dg_st + h * dg_sh] = dgv;                                                \
            delta[de_off + t * de_st + h * de_sh] = gt * dgv;                                                    \
        }                                                                                                        \
        if (!has_dq) return;                                                                                     \
        __global float *dqr = dq + dq_off + t * dq_st + h * dq_sh;                                               \
        for (long sg = 0; sg < nseg; sg++) {                                                                     \
            long lo, hi, base;                                                                                   \
            bwd_segment(MODE, sg, tl, s0, cmp0, sel, l, d, ls, w, &lo, &hi, &base);                              \
            for (long c0 = lo; c0 < hi; c0 += wg) {                                                              \
                const long key = c0 + lid;                                                                       \
                float ds = 0.0f;                                                                                 \
                if (key < hi && !none) {                                                                         \
                    const __global KV *kr = k + k_off + (base + key) * k_st + gi * k_sh;                         \
                    const __global KV *vr = v + v_off + (base + key) * v_st + gi * v_sh;                         \
                    float z = 0.0f, e = 0.0f;                                                                    \
                    for (long x = 0; x < Dqk; x++) z += ld(qr, x) * LDKV(kr, x);                                 \
                    for (long x = 0; x < Dv; x++) e += ld(dr, x) * LDKV(vr, x);                                  \
                    ds = gt * exp(z * scale - lv) * (e - dgv) * scale;                                           \
                }                                                                                                \
                sds[lid] = ds;                                                                                   \
                skey[lid] = base + key;                                                                          \
                barrier(CLK_LOCAL_MEM_FENCE);                                                                    \
                const long cnt = hi - c0 < wg ? hi - c0 : wg;                                                    \
                for (long x = lid; x < Dqk; x += wg) {                                                           \
                    float s = 0.0f;                                                                              \
                    for (long kk = 0; kk < cnt; kk++)                                                            \
                        s += sds[kk] * LDKV(k + k_off + skey[kk] * k_st + gi * k_sh, x);                         \
                    dqr[x] += s;                                                                                 \
                }                                                                                                \
                barrier(CLK_LOCAL_MEM_FENCE);                                                                    \
            }                                                                                                    \
        }                                                                                                        \
    }

#define BWD_KEYS(NAME, KV, LDKV, MODE)                                                                           \
    __kernel void NAME(const __global nsa_t *q, long q_off, long q_st, long q_sh, const __global nsa_t *dout,     \
                       long do_off, long do_st, long do_sh, const __global float *lse, long l_off, long l_st,    \
                       long l_sh, const __global float *gate, long g_off, long g_st, long g_sh,                  \
                       const __global int *idx, long i_off, long i_st, long i_sh, const __global KV *k, long k_off,\
                       long k_st, long k_sh, const __global KV *v, long v_off, long v_st, long v_sh,             \
                       __global float *dk, long dk_off, long dk_st, long dk_sh, int has_dk, __global float *dv,   \
                       long dv_off, long dv_st, long dv_sh, int has_dv, const __global float *delta, long de_off, \
                       long de_st, long de_sh, const __global long *tab, long cu_seq, long cu_k, long cu_cmp,        \
                       long tok_seq,                                                                     \
                       long B, long Hq, long Hkv, long Dqk, long Dv, long l, long d, long ls, long n, long w,      \
                       float scale, long first, __local float *sds, __local float *spg)                          \
    {                                                                                                            \
        const long it = first + (long)get_group_id(0);                                                           \
        const int lid = (int)get_local_id(0), wg = (int)get_local_size(0);                                       \
        const long r = it / Hkv, gi = it % Hkv, G = Hq / Hkv;                                                    \
        long t0, t1, x0, x1, sq, j = -1;                                                                         \
        if (MODE == 0) {                                                                                         \
            long lo = 0, hi = B - 1; /* the sequence of compressed row r */                                      \
            while (lo < hi) {                                                                                    \
                const long mid = lo + (hi - lo + 1) / 2;                                                         \
                if (tab[cu_cmp + mid] <= r) lo = mid;                                                            \
                else hi = mid - 1;                                                                               \
            }                                                                                                    \
            sq = lo;                                                                                             \
            x0 = (r - tab[cu_cmp + lo]) * d + l - 1;                                                             \
            x1 = tab[cu_k + lo + 1] - tab[cu_k + lo];                                                            \
        } else {                                                                                                 \
            sq = key_seq(tab, cu_seq, cu_k, tok_seq, B, r);                                                      \
            const long rl = r - tab[cu_k + sq], tk = tab[cu_k + sq + 1] - tab[cu_k + sq];                        \
            x0 = rl;                                                                                             \
            x1 = MODE == 2 ? (rl + w < tk ? rl + w : tk) : tk;                                                   \
            j = rl / ls;                                                                                         \
        }                                                                                                        \
        /* the readers at positions [x0, x1) that are rows of the plan: positions >= shift */                   \
        const long q0 = tab[cu_seq + sq];                                                                        \
        const long shift = (tab[cu_k + sq + 1] - tab[cu_k + sq]) - (tab[cu_seq + sq + 1] - q0);                  \
        t0 = q0 + (x0 > shift ? x0 : shift) - shift;                                                             \
        t1 = q0 + x1 - shift;                                                                                    \
        const __global KV *kr = k + k_off + r * k_st + gi * k_sh;                                                \
        const __global KV *vr = v + v_off + r * v_st + gi * v_sh;                                                \
        const long pairs = (t1 > t0 ? t1 - t0 : 0) * G;                                                          \
        for (long p0 = 0; p0 < pairs; p0 += wg) {                                                                \
            const long pr = p0 + lid;                                                                            \
            float ds = 0.0f, pg = 0.0f;                                                                          \
            if (pr < pairs) {                                                                                    \
                const long t = t0 + pr / G, h = gi * G + pr % G;                                                 \
                int reads = 1;                                                                                   \
                if (MODE == 1) {                                                                                 \
                    reads = 0;                                                                                   \
                    const __global int *sel = idx + i_off + t * i_st + gi * i_sh;                                \
                    for (long b = 0; b < n; b++) reads |= sel[b] == j;                                           \
                }                                                                                                \
                const float lv = lse[l_off + t * l_st + h * l_sh];                                               \
                if (reads && !BWD_NEG_INF(lv)) {                                                                 \
                    const __global nsa_t *qr = q + q_off + t * q_st + h * q_sh;                                  \
                    const __global nsa_t *dr = dout + do_off + t * do_st + h * do_sh;                            \
                    float z = 0.0f, e = 0.0f;                                                                    \
                    for (long x = 0; x < Dqk; x++) z += ld(qr, x) * LDKV(kr, x);                                 \
                    for (long x = 0; x < Dv; x++) e += ld(dr, x) * LDKV(vr, x);                                  \
                    const float p = exp(z * scale - lv), gt = gate[g_off + t * g_st + h * g_sh];                 \
                    ds = scale * p * (gt * e - delta[de_off + t * de_st + h * de_sh]);                           \
                    pg = p * gt;                                                                                 \
                }                                                                                                \
            }                                                                                                    \
            sds[lid] = ds;                                                                                       \
            spg[lid] = pg;                                                                                       \
            barrier(CLK_LOCAL_MEM_FENCE);                                                                        \
            const long cnt = pairs - p0 < wg ? pairs - p0 : wg;                                                  \
            if (has_dk)                                                                                          \
                for (long x = lid; x < Dqk; x += wg) {                                                           \
                    float s = 0.0f;                                                                              \
                    for (long kk = 0; kk < cnt; kk++) {                                                          \
                        const long t = t0 + (p0 + kk) / G, h = gi * G + (p0 + kk) % G;                           \
                        s += sds[kk] * ld(q + q_off + t * q_st + h * q_sh, x);                                   \
                    }                                                                                            \
                    dk[dk_off + r * dk_st + gi * dk_sh + x] += s;                                                \
                }                                                                                                \
            if (has_dv)                                                                                          \
                for (long x = lid; x < Dv; x += wg) {                                                            \
                    float s = 0.0f;                                                                              \
                    for (long kk = 0; kk < cnt; kk++) {                                                          \
                        const long t = t0 + (p0 + kk) / G, h = gi * G + (p0 + kk) % G;                           \
                        s += spg[kk] * ld(dout + do_off + t * do_st + h * do_sh, x);                             \
                    }                                                                                            \
                    dv[dv_off + r * dv_st + gi * dv_sh + x] += s;                                                \
                }                                                                                                \
            barrier(CLK_LOCAL_MEM_FENCE);                                                                        \
        }                                                                                                        \
    }

#define BWD_LD_F32(p, i) ((p)[i])
#define BWD_LD_T(p, i) ld((p), (i))
BWD_ROWS(bwd_rows_cmp, float, BWD_LD_F32, 0)
BWD_ROWS(bwd_rows_slc, nsa_t, BWD_LD_T, 1)
BWD_ROWS(bwd_rows_win, nsa_t, BWD_LD_T, 2)
BWD_KEYS(bwd_keys_cmp, float, BWD_LD_F32, 0)
BWD_KEYS(bwd_keys_slc, nsa_t, BWD_LD_T, 1)
BWD_KEYS(bwd_keys_win, nsa_t, BWD_LD_T, 2)

/* dx[t, g, e] += sum over the blocks i that hold t (ascending) of MEAN dc[i, g, e] / l,
 * LINEAR sum_c W[g][t_local - i d][e][c] dc[i, g, c]; one work-item per element. */
__kernel void bwd_compress_rows(const __global float *dc, long dc_off, long dc_st, long dc_sh, const __global nsa_t *W,
                                long W_off, __global float *dx, long dx_off, long dx_st, long dx_sh, int linear,
                                const __global long *tab, long cu_seq, long cu_k, long cu_cmp, long tok_seq, long B,
                                long Hkv, long D, long l, long d, long total, long first)
{
    const long id = first + (long)get_global_id(0);
    if (id >= total) return;
    const long e = id % D, gi = (id / D) % Hkv, t = id / (D * Hkv);
    const long b = key_seq(tab, cu_seq, cu_k, tok_seq, B, t); /* t: a key row */
    const long tl = t - tab[cu_k + b], c0 = tab[cu_cmp + b], nc = tab[cu_cmp + b + 1] - c0;
    const long i0 = tl - l + 1 > 0 ? (tl - l + 1 + d - 1) / d : 0, i1 = tl / d < nc - 1 ? tl / d : nc - 1;
    float acc = 0.0f;
    for (long i = i0; i <= i1; i++) {
        const __global float *gr = dc + dc_off + (c0 + i) * dc_st + gi * dc_sh;
        if (!linear) {
            acc += gr[e] / (float)l;
        } else {
            const long w0 = W_off + ((gi * l + (tl - i * d)) * D + e) * D;
            float s = 0.0f;
            for (long c = 0; c < D; c++) s += ld(W, w0 + c) * gr[c];
            acc += s;
        }
    }
    dx[dx_off + t * dx_st + gi * dx_sh + e] += acc;
}

/* LINEAR weights, one work-item per (g, j, r, c): dW[g][j][r][c] += sum over the
 * batch's compressed rows (ascending) of (x[tok] + pe[g, j])[r] dc[row][c]; the
 * work-item with c = 0 also adds dpe[g][j][r] = sum_c W[g][j][r][c] sum_rows dc[row][c]. */
__kernel void bwd_compress_w(const __global nsa_t *x, long x_off, long x_st, long x_sh, const __global nsa_t *pe,
                             long pe_off, int has_pe, const __global nsa_t *W, long W_off, const __global float *dc,
                             long dc_off, long dc_st, long dc_sh, __global float *dW, long dW_off, int has_dW,
                             __global float *dpe, long dpe_off, int has_dpe, const __global long *tab, long cu_seq,
                             long cu_cmp, long B, long total_cmp, long Hkv, long D, long l, long d, long total,
                             long first)
{
    const long id = first + (long)get_global_id(0);
    if (id >= total) return;
    const long c = id % D, r = (id / D) % D, j = (id / (D * D)) % l, gi = id / (D * D * l);
    if (has_dW) {
        const float per = has_pe ? ld(pe, pe_off + (gi * l + j) * D + r) : 0.0f;
        float aw = 0.0f;
        for (long b = 0; b < B; b++)
            for (long row = tab[cu_cmp + b]; row < tab[cu_cmp + b + 1]; row++) {
                const long tok = tab[cu_seq + b] + (row - tab[cu_cmp + b]) * d + j;
                aw += (ld(x, x_off + tok * x_st + gi * x_sh + r) + per) * dc[dc_off + row * dc_st + gi * dc_sh + c];
            }
        dW[dW_off + id] += aw;
    }
    if (has_dpe && c == 0) {
        float s = 0.0f;
        for (long cc = 0; cc < D; cc++) {
            float col = 0.0f;
            for (long row = 0; row < total_cmp; row++) col += dc[dc_off + row * dc_st + gi * dc_sh + cc];
            s += ld(W, W_off + ((gi * l + j) * D + r) * D + cc) * col;
        }
        dpe[dpe_off + (gi * l + j) * D + r] += s;
    }
}

/* out (f32) = acc (f32): NSA_BACKWARD_FLOAT_KEY_GRADS's unrounded gradients */
__kernel void bwd_store_f32(const __global float *acc, long a_off, long a_st, long a_sh, __global float *out,
                            long o_off, long o_st, long o_sh, long heads, long dim, long total, long first)
{
    const long id = first + (long)get_global_id(0);
    if (id >= total) return;
    const long e = id % dim, h = (id / dim) % heads, rr = id / (dim * heads);
    out[o_off + rr * o_st + h * o_sh + e] = acc[a_off + rr * a_st + h * a_sh + e];
}

/* out (storage type) = acc (f32), rows x heads x dim elements; one work-item per element */
__kernel void bwd_store(const __global float *acc, long a_off, long a_st, long a_sh, __global nsa_t *out, long o_off,
                        long o_st, long o_sh, long heads, long dim, long total, long first)
{
    const long id = first + (long)get_global_id(0);
    if (id >= total) return;
    const long e = id % dim, h = (id / dim) % heads, rr = id / (dim * heads);
    st(out, o_off + rr * o_st + h * o_sh + e, acc[a_off + rr * a_st + h * a_sh + e]);
}
