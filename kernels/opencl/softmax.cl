/*
 * softmax.cl: online softmax over chunks of keys, shared by the three attention
 * kernels (cmp_attn.cl, slc_attn.cl, win_attn.cl).
 *
 * Version 1 (the readable reference): one work-group per (query token, query head).
 * The key range is walked in chunks of WG = get_local_size(0) keys (WG a power of two):
 *   1. lane i computes the scaled logit x_i of key base + i by itself (a full Dqk dot
 *      product against the query, which sits in local memory) -- or -INFINITY if masked;
 *   2. softmax_chunk(): the work-group max and sum (fixed-order trees, so results are
 *      bitwise reproducible) update the running max m and normaliser l, and lane i
 *      leaves p_i = exp(x_i - m) in local memory;
 *   3. accumulate_*(): lane c owns output dims c, c + WG, ... of acc (local memory) and
 *      adds sum_i p_i * v[row_i][c] after rescaling by alpha = exp(m_old - m_new).
 * At the end o = acc / l and lse = m + log(l) (l = 0: o = 0, lse = -inf).
 * Version 2 (all G heads of a KV group in one work-group) is in group_attn.cl.
 */

inline float wg_max(__local float *red, float x)
{
    const int lid = get_local_id(0), nl = get_local_size(0);
    red[lid] = x;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = nl / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] = fmax(red[lid], red[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline float wg_sum(__local float *red, float x)
{
    const int lid = get_local_id(0), nl = get_local_size(0);
    red[lid] = x;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = nl / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] = red[lid] + red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* Copies n elements of a storage-type row into local memory as f32. */
inline void load_row_local(__local float *dst, const __global nsa_t *src, long base, long n)
{
    for (long c = get_local_id(0); c < n; c += get_local_size(0))
        dst[c] = ld(src, base + c);
    barrier(CLK_LOCAL_MEM_FENCE);
}

inline void zero_local(__local float *dst, long n)
{
    for (long c = get_local_id(0); c < n; c += get_local_size(0))
        dst[c] = 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* Dot product of a local f32 row with a global row (storage type or f32). */
inline float dot_local_t(__local const float *a, const __global nsa_t *b, long base, long n)
{
    float s = 0.0f;
    for (long c = 0; c < n; ++c)
        s += a[c] * ld(b, base + c);
    return s;
}

inline float dot_local_f32(__local const float *a, const __global float *b, long base, long n)
{
    float s = 0.0f;
    for (long c = 0; c < n; ++c)
        s += a[c] * b[base + c];
    return s;
}

/* Step 2: lane's logit x (-INFINITY if masked) joins the running (m, l); writes
 * p[lane] = exp(x - m_new) and returns alpha = exp(m_old - m_new). */
inline float softmax_chunk(__local float *p, __local float *red, float x, float *m, float *l)
{
    const float cm = wg_max(red, x);
    const float mn = fmax(*m, cm);
    const float alpha = (*m == -INFINITY) ? 0.0f : exp(*m - mn);
    const float e = (x == -INFINITY) ? 0.0f : exp(x - mn);
    p[get_local_id(0)] = e;
    const float cs = wg_sum(red, e); /* its barriers also publish p[] */
    *l = *l * alpha + cs;
    *m = mn;
    return alpha;
}

/* Step 3 for f32 values (compressed vc); row[i] < 0 marks a masked key. Ends with a
 * barrier so that the next chunk may overwrite p[] and row[]. */
inline void accumulate_f32(__local float *acc, float alpha, __local const float *p,
                           __local const long *row, int nk, const __global float *v, long dv)
{
    for (long c = get_local_id(0); c < dv; c += get_local_size(0)) {
        float a = acc[c] * alpha;
        for (int i = 0; i < nk; ++i)
            if (row[i] >= 0) a += p[i] * v[row[i] + c];
        acc[c] = a;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* Step 3 for storage-type values (v_slc, v_win). */
inline void accumulate_t(__local float *acc, float alpha, __local const float *p,
                         __local const long *row, int nk, const __global nsa_t *v, long dv)
{
    for (long c = get_local_id(0); c < dv; c += get_local_size(0)) {
        float a = acc[c] * alpha;
        for (int i = 0; i < nk; ++i)
            if (row[i] >= 0) a += p[i] * ld(v, row[i] + c);
        acc[c] = a;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* Steps 1-3 for one chunk of storage-type keys (selected and window branches):
 * this work-item's key row is krow in k and vrow in v, or vrow < 0 for none;
 * nk keys of the chunk are real. */
inline void attend_chunk_t(__local const float *qs, const __global nsa_t *k, long krow,
                           const __global nsa_t *v, long vrow, float scale, long dqk, long dv,
                           __local float *p, __local float *red, __local long *row,
                           __local float *acc, float *m, float *l, int nk)
{
    const float x = vrow >= 0 ? scale * dot_local_t(qs, k, krow, dqk) : -INFINITY;
    row[get_local_id(0)] = vrow;
    const float alpha = softmax_chunk(p, red, x, m, l);
    accumulate_t(acc, alpha, p, row, nk, v, dv);
}

/* Writes o = acc / l (f32, dense row at o_row) and, if asked, lse = m + log(l). */
inline void softmax_finish(__local const float *acc, float m, float l, __global float *o, long o_row,
                           long dv, __global float *lse, long lse_at, int has_lse)
{
    for (long c = get_local_id(0); c < dv; c += get_local_size(0))
        o[o_row + c] = (l != 0.0f) ? acc[c] / l : 0.0f;
    if (has_lse && get_local_id(0) == 0)
        lse[lse_at] = (l != 0.0f) ? m + log(l) : -INFINITY;
}
