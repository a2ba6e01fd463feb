/*
 * slc_tile.cl: version 3 of the selected attention (slc_attn_v3, semantics section 4):
 * one work-group of ST_WG = 256 lanes per (token t, KV group g, chunk hc of up to
 * ST_R = 16 heads of the group). The chunk's rows (heads g * G + 16 hc + r, r < 16)
 * share every key / value tile, and each lane computes a register block of products
 * (version 2 computed one dot product per lane and ran each row's softmax on one lane).
 * Selected blocks differ from token to token, so rows of different tokens share no
 * keys: a work-group holds one token, and at G < 16 part of its rows are padding.
 *
 * The usable blocks (j >= 0, j * l_s <= tl) are gathered into blk[] as in versions 1
 * and 2 (slc_usable_blocks, slc_attn.cl) and walked as one virtual key list (entry e:
 * block blk[e / l_s], offset e % l_s) in tiles of ST_BK = 64 keys; a key s > tl (the
 * query's own block) is masked.
 * Per key tile:
 *   1. S = Q K^T for the 16 x 64 pairs, Dqk in chunks of ST_DC = 32 columns staged in
 *      local memory (Q chunk [16][ST_QS], K chunk [64][ST_QS], rows of 16-byte
 *      multiples). Lane (dq, rg, kg) = (lid / 64, lid / 16 % 4, lid % 16) owns rows
 *      4 rg + i and keys kg + 16 j (i, j < 4) over the chunk's columns 8 dq .. 8 dq + 7:
 *      eight float4 local loads per 64 FMAs. The four column quarters' partial sums
 *      meet in local memory and are added in the order dq = 0, 1, 2, 3.
 *   2. the scaled, masked scores go to P^T [64][ST_PS]; sixteen lanes per row take the
 *      row's max and sum over four keys each, combined in a fixed order (m, l and the
 *      rescale alpha per row in local memory).
 *   3. O += P V with the V tile [64][VS] (VS = Dv rounded up to even) in local memory:
 *      lane (kq, cg) = (lid / 64, lid % 64) owns all 16 rows of columns 2 cg, 2 cg + 1
 *      over the tile's keys 16 kq .. 16 kq + 15 (four float4 loads of P^T and one float2
 *      of V per 32 FMAs), so each key quarter keeps its own partial output, rescaled by
 *      alpha every tile as a whole output would be.
 * At the end the four partial outputs meet in local memory and are added in the order
 * kq = 0, 1, 2, 3; then o = acc / l and lse = m + log(l) (l = 0: o = 0, lse = -inf).
 * Every sum has a fixed order: bitwise reproducible run to run.
 *
 * Local memory (floats): A = max(16 ST_QS + 64 ST_QS, 4 * 16 * 64, 64 VS), used in turn
 * by the Q / K chunks, the partial scores, the V tile and the final partial outputs;
 * P^T 64 ST_PS; m, l, alpha 3 * 16; two [16][16] reduction arrays; plus krow, vrow (64
 * longs each) and blk (n + 1 ints). 41.7 KiB at Dv = 128 (the host checks the device's
 * local memory and the kernel's work-group limit; otherwise version 2 runs). Needs
 * Dv <= 64 * ST_NV = 128.
 */
#define ST_WG 256
#define ST_R 16
#define ST_BK 64
#define ST_DC 32
#define ST_QS (ST_DC + 4) /* Q / K chunk row stride: 16-byte rows, banks spread */
#define ST_PS (ST_R + 4)  /* P^T row stride */
#define ST_NV 2           /* output columns per lane */

/* vload4 / vload2 need only the element's alignment. NVIDIA's OpenCL (driver 580.159, H200 and H100)
 * faulted on float4 pointer casts here while PoCL and Oclgrind ran them: do not cast. */
inline float4 st_ld4(__local const float *p) { return vload4(0, p); }

__kernel void slc_attn_v3(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                          const __global nsa_t *k, long k_off, long k_st, long k_sh,
                          const __global nsa_t *v, long v_off, long v_st, long v_sh,
                          const __global int *idx, long ix_off, long ix_st, long ix_sh,
                          __global float *o, long o_off, long o_st, long o_sh,
                          __global float *lse, long lse_off, long lse_st, long lse_sh, int has_lse,
                          const __global long *tab, long cu_seq_at, long cu_k_at, long tok_seq_at,
                          long Hq, long Hkv, long Dqk, long Dv, long ls, long n, float scale,
                          long first, __local float4 *lm4, __local long *rows, __local int *blk)
{
    __local float *lm = (__local float *)lm4; /* declared float4: 16-byte aligned, so vload4 can be one load */
    const int G = (int)(Hq / Hkv), nhc = (G + ST_R - 1) / ST_R;
    const long wg = first + (long)get_group_id(0);
    const long t = wg / (Hkv * nhc), g = wg / nhc % Hkv;
    const int hc = (int)(wg % nhc), nrows = min(ST_R, G - hc * ST_R);
    const int lid = get_local_id(0), Dqki = (int)Dqk, Dvi = (int)Dv, VS = (Dvi + 1) & ~1;

    const int asz = max(max((ST_R + ST_BK) * ST_QS, 4 * ST_R * ST_BK), ST_BK * VS);
    __local float *A = lm;
    __local float *qc = A, *kc = A + ST_R * ST_QS;
    __local float *pt = A + asz;
    __local float *mrow = pt + ST_BK * ST_PS, *lrow = mrow + ST_R, *arow = lrow + ST_R;
    __local float *redm = arow + ST_R, *reds = redm + ST_R * 16;
    __local long *krow = rows, *vrow = rows + ST_BK;

    const long b = tab[tok_seq_at + t];
    const long t0 = tab[cu_k_at + b]; /* key row of the sequence's position 0 */
    const long tl = q_pos(tab, cu_seq_at, cu_k_at, b, t);
    const long h0 = g * G + (long)hc * ST_R; /* the chunk's first head */
    const long q_row0 = q_off + t * q_st + h0 * q_sh;
    if (lid == 0) slc_usable_blocks(idx, ix_off + t * ix_st + g * ix_sh, n, ls, tl, blk);
    if (lid < ST_R) {
        mrow[lid] = -INFINITY;
        lrow[lid] = 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int lsi = (int)ls;
    const long nkeys = (long)blk[0] * ls;

    /* step 1's lane roles; step 2: row sr, keys 4 sp .. 4 sp + 3; step 3: (kq, cg) */
    const int dq = lid >> 6, rg = (lid >> 4) & 3, kg = lid & 15;
    const int sr = lid >> 4, sp = lid & 15;
    const int kq = lid >> 6, cg = lid & 63;
    float acc[ST_R][ST_NV];
    for (int r = 0; r < ST_R; ++r)
        for (int c = 0; c < ST_NV; ++c) acc[r][c] = 0.0f;

    for (long base = 0; base < nkeys; base += ST_BK) {
        barrier(CLK_LOCAL_MEM_FENCE); /* the last tile's readers of A, P^T and vrow are done */
        if (lid < ST_BK) {
            const long e = base + lid;
            const int eb = (int)(e / ls);
            const long s = e < nkeys ? (long)blk[1 + eb] * ls + (e - (long)eb * lsi) : tl + 1;
            krow[lid] = s <= tl ? k_off + (t0 + s) * k_st + g * k_sh : -1;
            vrow[lid] = s <= tl ? v_off + (t0 + s) * v_st + g * v_sh : -1;
        }
        float s[4][4];
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) s[i][j] = 0.0f;
        for (int d0 = 0; d0 < Dqki; d0 += ST_DC) {
            barrier(CLK_LOCAL_MEM_FENCE); /* krow written; the last chunk's readers are done */
            for (int e = lid; e < ST_R * ST_DC; e += ST_WG) {
                const int r = e / ST_DC, c = e % ST_DC;
                qc[r * ST_QS + c] = (r < nrows && d0 + c < Dqki) ? ld(q, q_row0 + r * q_sh + d0 + c) : 0.0f;
            }
            for (int e = lid; e < ST_BK * ST_DC; e += ST_WG) {
                const int j = e / ST_DC, c = e % ST_DC;
                const long kr = krow[j];
                /* masked keys load zeros: 0 * garbage could be NaN */
                kc[j * ST_QS + c] = (kr >= 0 && d0 + c < Dqki) ? ld(k, kr + d0 + c) : 0.0f;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int c = dq * 8; c < dq * 8 + 8; c += 4) {
                float4 qv[4], kv[4];
                for (int i = 0; i < 4; ++i) qv[i] = st_ld4(qc + (4 * rg + i) * ST_QS + c);
                for (int j = 0; j < 4; ++j) kv[j] = st_ld4(kc + (kg + 16 * j) * ST_QS + c);
                for (int i = 0; i < 4; ++i)
                    for (int j = 0; j < 4; ++j) {
                        float x = fma(qv[i].x, kv[j].x, s[i][j]);
                        x = fma(qv[i].y, kv[j].y, x);
                        x = fma(qv[i].z, kv[j].z, x);
                        s[i][j] = fma(qv[i].w, kv[j].w, x);
                    }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* the chunks' readers are done: A takes the partial scores */
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) A[(dq * ST_R + 4 * rg + i) * ST_BK + kg + 16 * j] = s[i][j];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int e = lid; e < ST_R * ST_BK; e += ST_WG) {
            const int r = e / ST_BK, j = e % ST_BK;
            const float x = ((A[r * ST_BK + j] + A[(ST_R + r) * ST_BK + j]) + A[(2 * ST_R + r) * ST_BK + j]) +
                            A[(3 * ST_R + r) * ST_BK + j];
            pt[j * ST_PS + r] = (r < nrows && krow[j] >= 0) ? scale * x : -INFINITY;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        {
            float mx = -INFINITY;
            for (int j = 4 * sp; j < 4 * sp + 4; ++j) mx = fmax(mx, pt[j * ST_PS + sr]);
            redm[sr * 16 + sp] = mx;
            barrier(CLK_LOCAL_MEM_FENCE);
            const float mo = mrow[sr];
            mx = mo;
            for (int u = 0; u < 16; ++u) mx = fmax(mx, redm[sr * 16 + u]);
            float sum = 0.0f;
            for (int j = 4 * sp; j < 4 * sp + 4; ++j) {
                const float x = pt[j * ST_PS + sr];
                const float e = (x == -INFINITY) ? 0.0f : exp(x - mx);
                pt[j * ST_PS + sr] = e;
                sum += e;
            }
            reds[sr * 16 + sp] = sum;
            barrier(CLK_LOCAL_MEM_FENCE);
            if (sp == 0) {
                const float a = (mo == -INFINITY) ? 0.0f : exp(mo - mx);
                float tot = 0.0f;
                for (int u = 0; u < 16; ++u) tot += reds[sr * 16 + u];
                lrow[sr] = lrow[sr] * a + tot;
                mrow[sr] = mx;
                arow[sr] = a;
            }
        }
        /* the V tile into A (the partial scores were read before the last barriers) */
        for (int e = lid; e < ST_BK * VS; e += ST_WG) {
            const int j = e / VS, c = e - j * VS;
            const long vr = vrow[j];
            A[e] = (vr >= 0 && c < Dvi) ? ld(v, vr + c) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (ST_NV * cg < Dvi) {
            for (int r = 0; r < ST_R; ++r) {
                const float a = arow[r];
                for (int c = 0; c < ST_NV; ++c) acc[r][c] *= a;
            }
            for (int j = 16 * kq; j < 16 * kq + 16; ++j) {
                const float2 vv = vload2(0, A + j * VS + ST_NV * cg);
                for (int i = 0; i < ST_R / 4; ++i) {
                    const float4 p4 = st_ld4(pt + j * ST_PS + 4 * i);
                    acc[4 * i][0] = fma(p4.x, vv.x, acc[4 * i][0]);
                    acc[4 * i][1] = fma(p4.x, vv.y, acc[4 * i][1]);
                    acc[4 * i + 1][0] = fma(p4.y, vv.x, acc[4 * i + 1][0]);
                    acc[4 * i + 1][1] = fma(p4.y, vv.y, acc[4 * i + 1][1]);
                    acc[4 * i + 2][0] = fma(p4.z, vv.x, acc[4 * i + 2][0]);
                    acc[4 * i + 2][1] = fma(p4.z, vv.y, acc[4 * i + 2][1]);
                    acc[4 * i + 3][0] = fma(p4.w, vv.x, acc[4 * i + 3][0]);
                    acc[4 * i + 3][1] = fma(p4.w, vv.y, acc[4 * i + 3][1]);
                }
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* the last tile's readers are done: A takes the partial outputs */
    if (ST_NV * cg < Dvi)
        for (int r = 0; r < ST_R; ++r)
            for (int c = 0; c < ST_NV; ++c) A[(kq * ST_R + r) * VS + ST_NV * cg + c] = acc[r][c];
    barrier(CLK_LOCAL_MEM_FENCE);
    const long o_row0 = o_off + t * o_st + h0 * o_sh;
    for (int e = lid; e < nrows * Dvi; e += ST_WG) {
        const int r = e / Dvi, c = e - r * Dvi;
        const float x = ((A[r * VS + c] + A[(ST_R + r) * VS + c]) + A[(2 * ST_R + r) * VS + c]) +
                        A[(3 * ST_R + r) * VS + c];
        const float lr = lrow[r];
        o[o_row0 + r * o_sh + c] = lr != 0.0f ? x / lr : 0.0f;
    }
    if (has_lse && lid < nrows) {
        const float lr = lrow[lid];
        lse[lse_off + t * lse_st + (h0 + lid) * lse_sh] = lr != 0.0f ? mrow[lid] + log(lr) : -INFINITY;
    }
}
