/*
 * decode.cl: the decode step (semantics section 10) over caller-owned paged caches.
 * Sequence b of a step has TQ = cu[b+1] - cu[b] new tokens, packed rows cu[b] ..
 * cu[b+1] - 1, at positions TK0 = csl[b] .. TK - 1; position x of sequence b lives in
 * pool row bt[b][x / ps] * ps + x % ps of a raw cache, compressed row i in pool row
 * cbt[b][i / cps] * cps + i % cps of the compressed caches.
 *
 * DECODE_APPEND
 *   decode_check     one work-item: the checks of nsa.h's nsa_decode on the step's
 *                    lengths and tables, in the cpu reference's order (so the first
 *                    bad sequence is the same), into the plan's verdict (status, the
 *                    sequence and what the host needs for the message) and the
 *                    caller's status tensor. It counts the uses of every page in
 *                    `cnt` (plan scratch) for the "a written page belongs to one
 *                    sequence" rule.
 *   decode_store     element-wise: the new tokens' k or v into one raw cache, bits as
 *                    they are.
 *   decode_compress  element-wise over (sequence, new row, head, element): the
 *                    compressed rows Nc(TK0) <= i < Nc(TK) (MEAN, LINEAR) from the
 *                    cached tokens, the forward's arithmetic (compress.cl), stored
 *                    rounded to the dtype in kc_cache / vc_cache.
 * DECODE_ATTN (for each packed row r < cu[B]; local position t = TK0 + r - cu[b])
 *   decode_cmp_attn     per (r, h): softmax.cl's chunk loop (version 1) over the nc(t)
 *                       compressed rows -> o_cmp, lse_cmp.
 *   decode_scores_topn  per (r, g): scores_topn's chunks (scores.cl: the same sums in
 *                       the same order, the same ranking and tie rule), the compressed
 *                       keys read through the page table -> indices.
 *   decode_slc_attn     per (r, h): the selected blocks' tokens s <= t -> o_slc.
 *   decode_win_attn     per (r, h): tokens [max(0, t - w + 1), t] -> o_win.
 *   decode_combine      element-wise: combine.cl's gated sum -> o.
 * Every kernel after decode_check reads the verdict first and does nothing when the
 * step's data failed a check, so such a step writes nothing but the status tensor.
 * Rows from cu[B] on are not touched.
 */

/* The storage type's bits, for copies that keep every bit (NaN payloads too). */
#if NSA_DTYPE == NSA_F32
typedef uint nsa_bits;
#else
typedef ushort nsa_bits;
#endif

/* The verdict (int32 [DV_SIZE]); backends/opencl/decode.c reads it with the same layout. */
#define DV_STATUS 0 /* nsa_status of the step's checks, 0: passed */
#define DV_SEQ 1    /* the first bad sequence, or -1 */
#define DV_CODE 2   /* which check (decode.c's messages) */
#define DV_COL 3    /* the table column */
#define DV_VALUE 4  /* the table entry, or cu_seqlens_q[0] */
#define DV_COUNT 5  /* uses of a shared page */
#define DV_CU0 6    /* cu_seqlens_q[b], cu_seqlens_q[b + 1], cache_seqlens[b] */
#define DV_CU1 7
#define DV_TK0 8
#define DV_SIZE 16

/* Nc(x) of section 1 (x tokens); nc(t) of section 2 is Nc(t + 1). */
inline long dec_nc(long x, long l, long d)
{
    return x >= l ? (x - l) / d + 1 : 0;
}

/* Sequence of packed row r (cu checked: 0, non-decreasing), or -1 past cu[B]. */
inline long dec_seq_of(const __global int *cu, long cu_off, long B, long r)
{
    if (r >= cu[cu_off + B]) return -1;
    long lo = 0, hi = B - 1;
    while (lo < hi) {
        const long mid = (lo + hi + 1) / 2;
        if (cu[cu_off + mid] <= r) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* Pool row of position x of sequence b through a page table (checked entries). */
inline long dec_pool_row(const __global int *tab, long tab_off, long tab_st, long b, long x, long page)
{
    return (long)tab[tab_off + b * tab_st + x / page] * page + x % page;
}

/* ------------------------------------------------------------------ DECODE_APPEND */

__kernel void decode_check(const __global int *cu, long cu_off, const __global int *csl, long csl_off,
                           const __global int *bt, long bt_off, long bt_st,
                           const __global int *cbt, long cbt_off, long cbt_st,
                           __global int *cnt, long num_pages, long num_cmp_pages,
                           __global int *verdict, __global int *status, long status_off, int has_status,
                           long B, long max_total, long max_step, long max_context, long ps, long max_pages,
                           long cps, long max_cmp_pages, long l, long d, int forms, int st_shape, int st_value,
                           long first)
{
    if (first + (long)get_global_id(0) != 0) return;
    int code = 0, st = 0, val = 0, count = 0;
    long seq = -1, col = 0, c0 = 0, c1 = 0, tk0v = 0;
    if (cu[cu_off] != 0) {
        code = 1;
        st = st_shape;
        seq = 0;
        val = cu[cu_off];
    }
    for (long b = 0; b < B && !code; ++b) {
        const long lo = cu[cu_off + b], hi = cu[cu_off + b + 1], tq = hi - lo, tk0 = csl[csl_off + b], tk = tk0 + tq;
        int why = 0;
        if (tq < 0) why = 2;
        else if (hi > max_total) why = 3;
        else if (tq > max_step) why = 4;
        else if (tk0 < 0) why = 5;
        else if (tk > max_context) why = 6;
        else if (tq > 0 && tk > max_pages * ps) why = 7;
        else if (tq > 0 && dec_nc(tk, l, d) > max_cmp_pages * cps) why = 8;
        if (why) {
            code = why;
            st = st_shape;
            seq = b;
            c0 = lo;
            c1 = hi;
            tk0v = tk0;
            break;
        }
        if (tq == 0) continue;
        /* every entry the step reads or writes: positions 0 .. TK - 1, rows 0 .. Nc(TK) - 1 */
        const long np = (tk + ps - 1) / ps, ncp = (dec_nc(tk, l, d) + cps - 1) / cps;
        for (long x = 0; x < np && !code; ++x) {
            const int e = bt[bt_off + b * bt_st + x];
            if (e < 0 || e >= num_pages) {
                code = 9;
                st = st_value;
                seq = b;
                col = x;
                val = e;
            }
        }
        for (long x = 0; x < ncp && !code; ++x) {
            const int e = cbt[cbt_off + b * cbt_st + x];
            if (e < 0 || e >= num_cmp_pages) {
                code = 10;
                st = st_value;
                seq = b;
                col = x;
                val = e;
            }
        }
    }
    if (!code) {
        /* a page the step writes appears once in the entries the batch uses */
        __global int *ccnt = cnt + num_pages;
        for (long p = 0; p < num_pages; ++p) cnt[p] = 0;
        for (long p = 0; p < num_cmp_pages; ++p) ccnt[p] = 0;
        for (long b = 0; b < B; ++b) {
            const long tk = (long)csl[csl_off + b] + cu[cu_off + b + 1] - cu[cu_off + b];
            const long np = min((tk + ps - 1) / ps, max_pages); /* a TQ = 0 sequence is not held to its pages */
            const long ncp = min((dec_nc(tk, l, d) + cps - 1) / cps, max_cmp_pages);
            for (long x = 0; x < np; ++x) {
                const int e = bt[bt_off + b * bt_st + x];
                if (e >= 0 && e < num_pages && cnt[e] < INT_MAX) cnt[e]++;
            }
            for (long x = 0; x < ncp; ++x) {
                const int e = cbt[cbt_off + b * cbt_st + x];
                if (e >= 0 && e < num_cmp_pages && ccnt[e] < INT_MAX) ccnt[e]++;
            }
        }
        for (long b = 0; b < B && !code; ++b) {
            const long tq = (long)cu[cu_off + b + 1] - cu[cu_off + b], tk0 = csl[csl_off + b], tk = tk0 + tq;
            if (tq == 0) continue;
            for (long x = tk0 / ps; x <= (tk - 1) / ps && !code; ++x) {
                const int e = bt[bt_off + b * bt_st + x];
                if (cnt[e] != 1) {
                    code = 11;
                    st = st_value;
                    seq = b;
                    col = x;
                    val = e;
                    count = cnt[e];
                }
            }
            const long nc0 = dec_nc(tk0, l, d), nc1 = dec_nc(tk, l, d);
            for (long x = nc0 / cps; forms && nc1 > nc0 && x <= (nc1 - 1) / cps && !code; ++x) {
                const int e = cbt[cbt_off + b * cbt_st + x];
                if (ccnt[e] != 1) {
                    code = 12;
                    st = st_value;
                    seq = b;
                    col = x;
                    val = e;
                    count = ccnt[e];
                }
            }
        }
    }
    verdict[DV_STATUS] = st;
    verdict[DV_SEQ] = (int)seq;
    verdict[DV_CODE] = code;
    verdict[DV_COL] = (int)col;
    verdict[DV_VALUE] = val;
    verdict[DV_COUNT] = count;
    verdict[DV_CU0] = (int)c0;
    verdict[DV_CU1] = (int)c1;
    verdict[DV_TK0] = (int)tk0v;
    if (has_status) {
        status[status_off] = st;
        status[status_off + 1] = (int)seq;
    }
}

/* x (the new tokens, packed rows) into the cache y at their positions; element-wise over
 * max_total_tokens * Hkv * D. */
__kernel void decode_store(const __global nsa_bits *x, long x_off, long x_st, long x_sh,
                           __global nsa_bits *y, long y_off, long y_st, long y_sh,
                           const __global int *cu, long cu_off, const __global int *csl, long csl_off,
                           const __global int *bt, long bt_off, long bt_st, const __global int *verdict,
                           long B, long Hkv, long D, long ps, long total, long first)
{
    const long e = first + (long)get_global_id(0);
    if (e >= total || verdict[DV_STATUS] != 0) return;
    const long c = e % D, rg = e / D, g = rg % Hkv, r = rg / Hkv;
    const long b = dec_seq_of(cu, cu_off, B, r);
    if (b < 0) return;
    const long pos = (long)csl[csl_off + b] + r - cu[cu_off + b];
    y[y_off + dec_pool_row(bt, bt_off, bt_st, b, pos, ps) * y_st + g * y_sh + c] = x[x_off + r * x_st + g * x_sh + c];
}

/* The compressed rows the step completes: element-wise over B * maxnew * Hkv * D, where
 * maxnew bounds Nc(TK) - Nc(TK0) for one sequence. MEAN: compress_mean's f32 sum in
 * token order, / l; LINEAR: compress_linear's FMA order (linear_add_row); both stored
 * rounded to the dtype (st), as the forward rounds kc / vc. x is the compressed branch's
 * raw cache, written by decode_store before. */
__kernel void decode_compress(const __global nsa_t *x, long x_off, long x_st, long x_sh,
                              __global nsa_t *y, long y_off, long y_st, long y_sh,
                              const __global nsa_t *w, long w_off, const __global nsa_t *pe, long pe_off,
                              int has_pe, int linear,
                              const __global int *cu, long cu_off, const __global int *csl, long csl_off,
                              const __global int *bt, long bt_off, long bt_st,
                              const __global int *cbt, long cbt_off, long cbt_st, const __global int *verdict,
                              long B, long Hkv, long D, long l, long d, long ps, long cps, long maxnew,
                              long total, long first)
{
    const long e = first + (long)get_global_id(0);
    if (e >= total || verdict[DV_STATUS] != 0) return;
    const long c = e % D, rg = e / D, g = rg % Hkv, bk = rg / Hkv, k = bk % maxnew, b = bk / maxnew;
    const long tk0 = csl[csl_off + b], tk = tk0 + cu[cu_off + b + 1] - cu[cu_off + b];
    const long i = dec_nc(tk0, l, d) + k;
    if (i >= dec_nc(tk, l, d)) return;
    float s = 0.0f;
    if (linear) {
        for (long j = 0; j < l; ++j)
            s = linear_add_row(s, x, x_off + dec_pool_row(bt, bt_off, bt_st, b, i * d + j, ps) * x_st + g * x_sh, w,
                               w_off + (g * l + j) * D * D + c, pe, pe_off + (g * l + j) * D, has_pe, D);
    } else {
        for (long j = 0; j < l; ++j)
            s += ld(x, x_off + dec_pool_row(bt, bt_off, bt_st, b, i * d + j, ps) * x_st + g * x_sh + c);
        s = s / (float)l;
    }
    st(y, y_off + dec_pool_row(cbt, cbt_off, cbt_st, b, i, cps) * y_st + g * y_sh + c, s);
}

/* ------------------------------------------------------------------ DECODE_ATTN */

/* The start of a per-(row, head) kernel: packed row r, query head h, KV group g; b is
 * r's sequence and t its local position, or b = -1 (and t = 0) when the step failed its
 * checks or r is past the step's rows: the work-group then walks no keys and writes
 * nothing. (No early return before the barriers: PoCL mis-ran a kernel that had one.) */
#define DEC_ROW_HEAD()                                                                          \
    const long wg = first + (long)get_group_id(0);                                              \
    const long r = wg / Hq, h = wg % Hq, g = h / (Hq / Hkv);                                    \
    const int lid = get_local_id(0), nl = get_local_size(0);                                    \
    const long b = verdict[DV_STATUS] == 0 ? dec_seq_of(cu, cu_off, B, r) : -1;                 \
    const long t = b >= 0 ? (long)csl[csl_off + b] + r - cu[cu_off + b] : 0;

/* Compressed attention of row (r, h) over the compressed rows 0 .. nc(t) - 1 (cmp_attn's
 * version 1 with the keys read through the compressed page table). lse always written. */
__kernel void decode_cmp_attn(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                              const __global nsa_t *kc, long kc_off, long kc_st, long kc_sh,
                              const __global nsa_t *vc, long vc_off, long vc_st, long vc_sh,
                              __global float *o, long o_off, long o_st, long o_sh,
                              __global float *lse, long lse_off, long lse_st, long lse_sh,
                              const __global int *cu, long cu_off, const __global int *csl, long csl_off,
                              const __global int *cbt, long cbt_off, long cbt_st, const __global int *verdict,
                              long B, long Hq, long Hkv, long Dqk, long Dv, long l, long d, long cps, float scale,
                              long first, __local float *qs, __local float *acc, __local float *p,
                              __local float *red, __local long *row)
{
    DEC_ROW_HEAD()
    const long nc = b >= 0 ? dec_nc(t + 1, l, d) : 0;
    load_row_local(qs, q, q_off + r * q_st + h * q_sh, Dqk);
    zero_local(acc, Dv);
    float m = -INFINITY, lsum = 0.0f;
    for (long base = 0; base < nc; base += nl) {
        const long i = base + lid;
        const long cr = i < nc ? dec_pool_row(cbt, cbt_off, cbt_st, b, i, cps) : 0;
        attend_chunk_t(qs, kc, kc_off + cr * kc_st + g * kc_sh, vc, i < nc ? vc_off + cr * vc_st + g * vc_sh : -1,
                       scale, Dqk, Dv, p, red, row, acc, &m, &lsum, (int)min((long)nl, nc - base));
    }
    if (b >= 0)
        softmax_finish(acc, m, lsum, o, o_off + r * o_st + h * o_sh, Dv, lse, lse_off + r * lse_st + h * lse_sh, 1);
}

/* Block scores and top-n of row r, group g: scores_topn (scores.cl) with t local and the
 * compressed keys of tile ib .. read through the page table. Local memory as there. */
__kernel void decode_scores_topn(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                                 const __global nsa_t *kc, long kc_off, long kc_st, long kc_sh,
                                 const __global float *lse, long lse_off, long lse_st, long lse_sh,
                                 __global int *idx, long ix_off, long ix_st, long ix_sh,
                                 const __global int *cu, long cu_off, const __global int *csl, long csl_off,
                                 const __global int *cbt, long cbt_off, long cbt_st, const __global int *verdict,
                                 long B, long Hq, long Hkv, long Dqk, long l, long d, long ls, long cps, float scale,
                                 long n, long n_init, long n_local, long first, long KT, long JC, long pc,
                                 __local float *lm)
{
    const long wg = first + (long)get_group_id(0);
    const long r = wg / Hkv, g = wg % Hkv, G = Hq / Hkv;
    const int lid = get_local_id(0), nl = get_local_size(0);
    const int Gi = (int)G, KTi = (int)KT, Dqki = (int)Dqk;
    /* no early return (PoCL): a row past the step's, or a failed step, runs as t = 0
     * with nothing to score and writes nothing */
    const long b = verdict[DV_STATUS] == 0 ? dec_seq_of(cu, cu_off, B, r) : -1;
    const long t = b >= 0 ? (long)csl[csl_off + b] + r - cu[cu_off + b] : 0;
    __local float *qs = lm;
    __local float *lsel = qs + G * Dqk;
    __local float *ks = lsel + G;
    __local float *pe = ks + KT * (Dqk + 1);
    __local float *P = pe + G * KT;
    __local float *cs = P + pc;
    __local float *cand_s = cs + JC;
    __local int *cand_j = (__local int *)(cand_s + n);

    const long nc = dec_nc(t + 1, l, d);
    const long jmax = t / ls;
    const long take = min(n, jmax + 1);
    const long f1 = min(n_init, jmax + 1);       /* forced: [0, f1) */
    const long f2 = max(f1, jmax - n_local + 1); /* forced: [f2, jmax] */
    const long K = max(take - f1 - (jmax + 1 - f2), 0L); /* unforced slots */
    long m = 0;                                           /* candidates held (lane 0) */

    scores_stage_q(q, q_off, q_st, q_sh, lse, lse_off, lse_st, lse_sh, r, g, Gi, Dqki, qs, lsel);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (long j0 = f1; K > 0 && j0 < f2; j0 += JC) {
        const long j1 = min(j0 + JC - 1, f2 - 1);
        long ilo, ihi;
        scores_chunk_span(j0, j1, nc, l, d, ls, &ilo, &ihi);
        for (long ib = ilo; ib <= ihi; ib += KT) {
            /* scores_tile_keys through the page table (zero past ihi) */
            for (int e = lid; e < KTi * Dqki; e += nl) {
                const int s = e / Dqki, c = e - s * Dqki;
                ks[s * (Dqki + 1) + c] =
                    ib + s <= ihi
                        ? ld(kc, kc_off + dec_pool_row(cbt, cbt_off, cbt_st, b, ib + s, cps) * kc_st + g * kc_sh + c)
                        : 0.0f;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            scores_tile_exp(Gi, KTi, Dqki, scale, qs, lsel, ks, pe);
            barrier(CLK_LOCAL_MEM_FENCE);
            scores_tile_sum(ib, ihi, ilo, Gi, KTi, pe, P);
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        for (long j = j0 + lid; j <= j1; j += nl) cs[j - j0] = scores_block(j, ilo, nc, l, d, ls, P);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid == 0) m = topn_merge_chunk(cs, j0, j1, m, K, cand_s, cand_j);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0 && b >= 0) topn_write_row(idx, ix_off + r * ix_st + g * ix_sh, f1, f2, jmax, cand_j, m, n);
}

/* Selected attention of row (r, h): slc_attn's version 1 (the usable blocks gathered
 * into blk, walked as one key list), tokens read through the page table. */
__kernel void decode_slc_attn(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                              const __global nsa_t *k, long k_off, long k_st, long k_sh,
                              const __global nsa_t *v, long v_off, long v_st, long v_sh,
                              const __global int *idx, long ix_off, long ix_st, long ix_sh,
                              __global float *o, long o_off, long o_st, long o_sh,
                              __global float *lse, long lse_off, long lse_st, long lse_sh, int has_lse,
                              const __global int *cu, long cu_off, const __global int *csl, long csl_off,
                              const __global int *bt, long bt_off, long bt_st, const __global int *verdict,
                              long B, long Hq, long Hkv, long Dqk, long Dv, long ls, long n, long ps, float scale,
                              long first, __local float *qs, __local float *acc, __local float *p,
                              __local float *red, __local long *row, __local int *blk)
{
    DEC_ROW_HEAD()
    const long ix_row = ix_off + r * ix_st + g * ix_sh;
    if (lid == 0) slc_usable_blocks(idx, ix_row, b >= 0 ? n : 0, ls, t, blk);
    load_row_local(qs, q, q_off + r * q_st + h * q_sh, Dqk); /* (its barrier publishes blk) */
    zero_local(acc, Dv);
    float m = -INFINITY, lsum = 0.0f;
    const long nkeys = (long)blk[0] * ls;
    for (long base = 0; base < nkeys; base += nl) {
        const long e = base + lid;
        const long s = e < nkeys ? (long)blk[1 + e / ls] * ls + e % ls : t + 1;
        const int ok = s <= t;
        const long pr = ok ? dec_pool_row(bt, bt_off, bt_st, b, s, ps) : 0;
        attend_chunk_t(qs, k, k_off + pr * k_st + g * k_sh, v, ok ? v_off + pr * v_st + g * v_sh : -1, scale, Dqk,
                       Dv, p, red, row, acc, &m, &lsum, (int)min((long)nl, nkeys - base));
    }
    if (b >= 0)
        softmax_finish(acc, m, lsum, o, o_off + r * o_st + h * o_sh, Dv, lse, lse_off + r * lse_st + h * lse_sh,
                       has_lse);
}

/* Window attention of row (r, h): win_attn's version 1, tokens read through the page table. */
__kernel void decode_win_attn(const __global nsa_t *q, long q_off, long q_st, long q_sh,
                              const __global nsa_t *k, long k_off, long k_st, long k_sh,
                              const __global nsa_t *v, long v_off, long v_st, long v_sh,
                              __global float *o, long o_off, long o_st, long o_sh,
                              __global float *lse, long lse_off, long lse_st, long lse_sh, int has_lse,
                              const __global int *cu, long cu_off, const __global int *csl, long csl_off,
                              const __global int *bt, long bt_off, long bt_st, const __global int *verdict,
                              long B, long Hq, long Hkv, long Dqk, long Dv, long w, long ps, float scale,
                              long first, __local float *qs, __local float *acc, __local float *p,
                              __local float *red, __local long *row)
{
    DEC_ROW_HEAD()
    const long s0 = max(0L, t - w + 1);
    const long nkeys = b >= 0 ? t - s0 + 1 : 0;
    load_row_local(qs, q, q_off + r * q_st + h * q_sh, Dqk);
    zero_local(acc, Dv);
    float m = -INFINITY, lsum = 0.0f;
    for (long base = 0; base < nkeys; base += nl) {
        const long s = s0 + base + lid;
        const int ok = s <= t;
        const long pr = ok ? dec_pool_row(bt, bt_off, bt_st, b, s, ps) : 0;
        attend_chunk_t(qs, k, k_off + pr * k_st + g * k_sh, v, ok ? v_off + pr * v_st + g * v_sh : -1, scale, Dqk,
                       Dv, p, red, row, acc, &m, &lsum, (int)min((long)nl, nkeys - base));
    }
    if (b >= 0)
        softmax_finish(acc, m, lsum, o, o_off + r * o_st + h * o_sh, Dv, lse, lse_off + r * lse_st + h * lse_sh,
                       has_lse);
}

/* combine's gated sum for the step's rows; element-wise over max_total_tokens * Hq * Dv. */
__kernel void decode_combine(const __global float *oc, long oc_off, long oc_st, long oc_sh,
                             const __global float *os, long os_off, long os_st, long os_sh,
                             const __global float *ow, long ow_off, long ow_st, long ow_sh,
                             const __global float *gc, long gc_off, long gc_st, long gc_sh,
                             const __global float *gs, long gs_off, long gs_st, long gs_sh,
                             const __global float *gw, long gw_off, long gw_st, long gw_sh,
                             int has_c, int has_s, int has_w,
                             __global nsa_t *o, long o_off, long o_st, long o_sh,
                             const __global int *cu, long cu_off, const __global int *verdict,
                             long B, long Hq, long Dv, long total, long first)
{
    const long e = first + (long)get_global_id(0);
    if (e >= total || verdict[DV_STATUS] != 0) return;
    const long c = e % Dv, th = e / Dv, h = th % Hq, t = th / Hq;
    if (t >= cu[cu_off + B]) return;
    st(o, o_off + t * o_st + h * o_sh + c,
       combine_value(oc, oc_off, oc_st, oc_sh, os, os_off, os_st, os_sh, ow, ow_off, ow_st, ow_sh, gc, gc_off, gc_st,
                     gc_sh, gs, gs_off, gs_st, gs_sh, gw, gw_off, gw_st, gw_sh, has_c, has_s, has_w, t, h, c));
}
