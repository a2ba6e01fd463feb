/*
 * backward.hip -- the backward stages (section 9 of docs/nsa-semantics.md),
 * portable (no wave-size assumption: reductions go through LDS) and plain fp32.
 *
 * Per branch, with the forward's LSE (p_r = exp(scale q . k_r - lse)):
 *   e_r = dO . v_r,  dg = sum_r p_r e_r,  D = g dg,  ds_r = g p_r (e_r - dg)
 *   dq = scale sum_r ds_r k_r,  dk_r += scale ds_r q,  dv_r += g p_r dO
 *
 * rows: one block of NSA_HIP_BWD_THREADS per (token, query head). The row's
 *       keys, one per thread per step: a first sweep sums dg (per-thread
 *       partials, then a fixed-order LDS tree), a second forms ds per key in
 *       LDS and the threads, each owning some dims, add sum_k ds_k k_k to dq.
 * keys: one block per (key row, KV head): the (token, head) pairs that read the
 *       key (compressed row i: local t >= i d + l - 1; window token r: t in
 *       [r, r + w); selected token r of block j: t >= r whose selection holds
 *       j), one pair per thread per step; the threads, owning dims, add the
 *       step's sums to dk and dv.
 * Every accumulator element has one owner per stage and a fixed order, so the
 * result is bitwise reproducible. compress_rows / compress_w / store: one
 * thread per output element.
 */
#include "tile.h"

#define NSA_HIP_BWD_THREADS 64

/* The row's key segments (the forward's visiting order): cmp one ([0, nc) of the
 * sequence's compressed rows), win one, slc one per selected slot (empty for -1
 * or an ineligible block). */
template <int KIND>
NSA_DEV void nsa_hip_bwd_segment(const nsa_hip_dims &dm, int64_t slot, int64_t tl, int64_t s0, int64_t cmp0,
                                 const int *sel, int64_t *lo, int64_t *hi, int64_t *base)
{
    if (KIND == NSA_HIP_CMP) {
        *lo = 0;
        *hi = nsa_cmp_visible(tl, dm.l, dm.d);
        *base = cmp0;
    } else if (KIND == NSA_HIP_WIN) {
        *lo = nsa_win_start(tl, dm.w);
        *hi = tl + 1;
        *base = s0;
    } else {
        const int64_t j = sel[slot];
        *base = s0;
        if (j < 0 || j * dm.ls > tl) {
            *lo = *hi = 0;
        } else {
            *lo = j * dm.ls;
            *hi = nsa_min64((j + 1) * dm.ls, tl + 1);
        }
    }
}

template <typename T, typename KV, int KIND>
__global__ void __launch_bounds__(NSA_HIP_BWD_THREADS)
    nsa_hip_bwd_rows_kernel(nsa_hip_dims dm, nsa_hip_bwd_in in, nsa_hip_tensor k, nsa_hip_tensor v, nsa_hip_tensor dq)
{
    __shared__ float red[NSA_HIP_BWD_THREADS], sds[NSA_HIP_BWD_THREADS];
    __shared__ int64_t skey[NSA_HIP_BWD_THREADS];
    const int tid = threadIdx.x, nt = NSA_HIP_BWD_THREADS;
    const float scale = dm.scale;
    const int64_t rows = dm.T * dm.Hq;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int64_t t = row / dm.Hq, h = row % dm.Hq, gi = h / dm.G;
        const int64_t seq = dm.tok_seq[t], s0 = dm.cu_seqlens[seq], tl = t - s0, cmp0 = dm.cu_cmp[seq];
        const float lv = ((const float *)in.lse.ptr)[t * in.lse.st + h * in.lse.sh];
        const float gt = ((const float *)in.gate.ptr)[t * in.gate.st + h * in.gate.sh];
        const bool none = lv == nsa_neg_inf();
        const T *qr = (const T *)in.q.ptr + t * in.q.st + h * in.q.sh;
        const T *dr = (const T *)in.dout.ptr + t * in.dout.st + h * in.dout.sh;
        const int *sel = KIND == NSA_HIP_SLC ? (const int *)in.idx.ptr + t * in.idx.st + gi * in.idx.sh : nullptr;
        const KV *kb = (const KV *)k.ptr + gi * k.sh;
        const KV *vb = (const KV *)v.ptr + gi * v.sh;
        const int64_t nseg = KIND == NSA_HIP_SLC ? dm.n : 1;
        auto pe = [&](int64_t krow, float *p, float *e) {
            float z = 0.f, ev = 0.f;
            for (int64_t x = 0; x < dm.Dqk; x++) z += nsa_ld(qr + x) * nsa_ld(kb + krow * k.st + x);
            for (int64_t x = 0; x < dm.Dv; x++) ev += nsa_ld(dr + x) * nsa_ld(vb + krow * v.st + x);
            *p = none ? 0.f : expf(z * scale - lv);
            *e = ev;
        };
        float part = 0.f;
        for (int64_t sg = 0; sg < nseg; sg++) {
            int64_t lo, hi, base;
            nsa_hip_bwd_segment<KIND>(dm, sg, tl, s0, cmp0, sel, &lo, &hi, &base);
            for (int64_t key = lo + tid; key < hi; key += nt) {
                float p, e;
                pe(base + key, &p, &e);
                part += p * e;
            }
        }
        red[tid] = part;
        __syncthreads();
        for (int s = nt / 2; s > 0; s >>= 1) {
            if (tid < s) red[tid] += red[tid + s];
            __syncthreads();
        }
        const float dg = red[0];
        if (tid == 0) {
            if (in.dgate.ptr) ((float *)in.dgate.ptr)[t * in.dgate.st + h * in.dgate.sh] = dg;
            ((float *)in.delta.ptr)[t * in.delta.st + h * in.delta.sh] = gt * dg;
        }
        __syncthreads();
        if (!dq.ptr) continue;
        float *dqr = (float *)dq.ptr + t * dq.st + h * dq.sh;
        for (int64_t sg = 0; sg < nseg; sg++) {
            int64_t lo, hi, base;
            nsa_hip_bwd_segment<KIND>(dm, sg, tl, s0, cmp0, sel, &lo, &hi, &base);
            for (int64_t c0 = lo; c0 < hi; c0 += nt) {
                const int64_t key = c0 + tid;
                float ds = 0.f;
                if (key < hi && !none) {
                    float p, e;
                    pe(base + key, &p, &e);
                    ds = gt * p * (e - dg) * scale;
                }
                sds[tid] = ds;
                skey[tid] = base + key;
                __syncthreads();
                const int64_t cnt = nsa_min64(hi - c0, nt);
                for (int64_t x = tid; x < dm.Dqk; x += nt) {
                    float s = 0.f;
                    for (int64_t kk = 0; kk < cnt; kk++) s += sds[kk] * nsa_ld(kb + skey[kk] * k.st + x);
                    dqr[x] += s;
                }
                __syncthreads();
            }
        }
    }
}

template <typename T, typename KV, int KIND>
__global__ void __launch_bounds__(NSA_HIP_BWD_THREADS)
    nsa_hip_bwd_keys_kernel(nsa_hip_dims dm, nsa_hip_bwd_in in, nsa_hip_tensor k, nsa_hip_tensor v, nsa_hip_tensor dk,
                            nsa_hip_tensor dv, int64_t nrows)
{
    __shared__ float sds[NSA_HIP_BWD_THREADS], spg[NSA_HIP_BWD_THREADS];
    const int tid = threadIdx.x, nt = NSA_HIP_BWD_THREADS;
    const float scale = dm.scale;
    const int64_t items = nrows * dm.Hkv;
    for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
        const int64_t r = it / dm.Hkv, gi = it % dm.Hkv;
        int64_t t0, t1, j = -1;
        if (KIND == NSA_HIP_CMP) {
            const int64_t b = nsa_hip_seq_of_row(dm.cu_cmp, dm.B, r);
            t0 = dm.cu_seqlens[b] + (r - dm.cu_cmp[b]) * dm.d + dm.l - 1;
            t1 = dm.cu_seqlens[b + 1];
        } else {
            const int64_t b = dm.tok_seq[r], s0 = dm.cu_seqlens[b];
            t0 = r;
            t1 = KIND == NSA_HIP_WIN ? nsa_min64(r + dm.w, dm.cu_seqlens[b + 1]) : dm.cu_seqlens[b + 1];
            j = (r - s0) / dm.ls;
        }
        const KV *kr = (const KV *)k.ptr + r * k.st + gi * k.sh;
        const KV *vr = (const KV *)v.ptr + r * v.st + gi * v.sh;
        const int64_t pairs = (t1 > t0 ? t1 - t0 : 0) * dm.G;
        for (int64_t p0 = 0; p0 < pairs; p0 += nt) {
            const int64_t pr = p0 + tid;
            float ds = 0.f, pg = 0.f;
            if (pr < pairs) {
                const int64_t t = t0 + pr / dm.G, h = gi * dm.G + pr % dm.G;
                bool reads = true;
                if (KIND == NSA_HIP_SLC) {
                    const int *sel = (const int *)in.idx.ptr + t * in.idx.st + gi * in.idx.sh;
                    reads = false;
                    for (int64_t b = 0; b < dm.n; b++) reads |= sel[b] == j;
                }
                const float lv = ((const float *)in.lse.ptr)[t * in.lse.st + h * in.lse.sh];
                if (reads && lv != nsa_neg_inf()) {
                    const T *qr = (const T *)in.q.ptr + t * in.q.st + h * in.q.sh;
                    const T *dr = (const T *)in.dout.ptr + t * in.dout.st + h * in.dout.sh;
                    float z = 0.f, e = 0.f;
                    for (int64_t x = 0; x < dm.Dqk; x++) z += nsa_ld(qr + x) * nsa_ld(kr + x);
                    for (int64_t x = 0; x < dm.Dv; x++) e += nsa_ld(dr + x) * nsa_ld(vr + x);
                    const float p = expf(z * scale - lv);
                    const float gt = ((const float *)in.gate.ptr)[t * in.gate.st + h * in.gate.sh];
                    const float de = ((const float *)in.delta.ptr)[t * in.delta.st + h * in.delta.sh];
                    ds = scale * p * (gt * e - de);
                    pg = p * gt;
                }
            }
            sds[tid] = ds;
            spg[tid] = pg;
            __syncthreads();
            const int64_t cnt = nsa_min64(pairs - p0, nt);
            if (dk.ptr)
                for (int64_t x = tid; x < dm.Dqk; x += nt) {
                    float s = 0.f;
                    for (int64_t kk = 0; kk < cnt; kk++) {
                        const int64_t t = t0 + (p0 + kk) / dm.G, h = gi * dm.G + (p0 + kk) % dm.G;
                        s += sds[kk] * nsa_ld((const T *)in.q.ptr + t * in.q.st + h * in.q.sh + x);
                    }
                    ((float *)dk.ptr)[r * dk.st + gi * dk.sh + x] += s;
                }
            if (dv.ptr)
                for (int64_t x = tid; x < dm.Dv; x += nt) {
                    float s = 0.f;
                    for (int64_t kk = 0; kk < cnt; kk++) {
                        const int64_t t = t0 + (p0 + kk) / dm.G, h = gi * dm.G + (p0 + kk) % dm.G;
                        s += spg[kk] * nsa_ld((const T *)in.dout.ptr + t * in.dout.st + h * in.dout.sh + x);
                    }
                    ((float *)dv.ptr)[r * dv.st + gi * dv.sh + x] += s;
                }
            __syncthreads();
        }
    }
}

static unsigned nsa_hip_bwd_grid(int64_t items)
{
    return (unsigned)(items < 1 ? 1 : items > 65535 * 16 ? 65535 * 16 : items);
}

template <typename T, typename KV, int KIND>
static hipError_t nsa_hip_bwd_launch(const nsa_hip_dims *dm, const nsa_hip_bwd_in &in, nsa_hip_tensor k,
                                     nsa_hip_tensor v, nsa_hip_tensor dq, nsa_hip_tensor dk, nsa_hip_tensor dv,
                                     hipStream_t stream)
{
    nsa_hip_bwd_rows_kernel<T, KV, KIND>
        <<<nsa_hip_bwd_grid(dm->T * dm->Hq), NSA_HIP_BWD_THREADS, 0, stream>>>(*dm, in, k, v, dq);
    hipError_t e = hipGetLastError();
    const int64_t nrows = KIND == NSA_HIP_CMP ? dm->total_cmp : dm->T;
    if (e != hipSuccess || (!dk.ptr && !dv.ptr) || nrows == 0) return e;
    nsa_hip_bwd_keys_kernel<T, KV, KIND>
        <<<nsa_hip_bwd_grid(nrows * dm->Hkv), NSA_HIP_BWD_THREADS, 0, stream>>>(*dm, in, k, v, dk, dv, nrows);
    return hipGetLastError();
}

template <typename T>
static hipError_t nsa_hip_bwd_kind(const nsa_hip_dims *dm, int kind, const nsa_hip_bwd_in &in, nsa_hip_tensor k,
                                   nsa_hip_tensor v, nsa_hip_tensor dq, nsa_hip_tensor dk, nsa_hip_tensor dv,
                                   hipStream_t stream)
{
    if (kind == NSA_HIP_CMP) return nsa_hip_bwd_launch<T, float, NSA_HIP_CMP>(dm, in, k, v, dq, dk, dv, stream);
    if (kind == NSA_HIP_SLC) return nsa_hip_bwd_launch<T, T, NSA_HIP_SLC>(dm, in, k, v, dq, dk, dv, stream);
    return nsa_hip_bwd_launch<T, T, NSA_HIP_WIN>(dm, in, k, v, dq, dk, dv, stream);
}

hipError_t nsa_hip_bwd_attention(const nsa_hip_dims *dm, int kind, const nsa_hip_bwd_in *in, nsa_hip_tensor k,
                                 nsa_hip_tensor v, nsa_hip_tensor dq, nsa_hip_tensor dk, nsa_hip_tensor dv,
                                 hipStream_t stream)
{
    if (dm->T == 0) return hipSuccess;
    if (dm->dtype == NSA_DT_F16) return nsa_hip_bwd_kind<nsa_f16_s>(dm, kind, *in, k, v, dq, dk, dv, stream);
    if (dm->dtype == NSA_DT_BF16) return nsa_hip_bwd_kind<nsa_bf16_s>(dm, kind, *in, k, v, dq, dk, dv, stream);
    return nsa_hip_bwd_kind<float>(dm, kind, *in, k, v, dq, dk, dv, stream);
}

/* dx[t, g, e] += sum over the blocks i that hold t (ascending) of MEAN dc[i, g, e] / l,
 * LINEAR sum_c W[g][t_local - i d][e][c] dc[i, g, c]. */
template <typename T>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_bwd_compress_rows_kernel(nsa_hip_dims dm, int linear, int64_t D, nsa_hip_tensor dc, nsa_hip_tensor w,
                                     nsa_hip_tensor dx)
{
    const int64_t total = dm.T * dm.Hkv * D;
    for (int64_t id = (int64_t)blockIdx.x * NSA_HIP_THREADS + threadIdx.x; id < total;
         id += (int64_t)gridDim.x * NSA_HIP_THREADS) {
        const int64_t e = id % D, gi = (id / D) % dm.Hkv, t = id / (D * dm.Hkv);
        const int64_t b = dm.tok_seq[t], tl = t - dm.cu_seqlens[b], c0 = dm.cu_cmp[b], nc = dm.cu_cmp[b + 1] - c0;
        const int64_t i0 = tl - dm.l + 1 > 0 ? nsa_ceil_div(tl - dm.l + 1, dm.d) : 0;
        const int64_t i1 = nsa_min64(tl / dm.d, nc - 1);
        float acc = 0.f;
        for (int64_t i = i0; i <= i1; i++) {
            const float *gr = (const float *)dc.ptr + (c0 + i) * dc.st + gi * dc.sh;
            if (!linear) {
                acc += gr[e] / (float)dm.l;
            } else {
                const T *wr = (const T *)w.ptr + ((gi * dm.l + (tl - i * dm.d)) * D + e) * D;
                float s = 0.f;
                for (int64_t c = 0; c < D; c++) s += nsa_ld(wr + c) * gr[c];
                acc += s;
            }
        }
        ((float *)dx.ptr)[t * dx.st + gi * dx.sh + e] += acc;
    }
}

/* LINEAR weights, one thread per (g, j, r, c): dW[g][j][r][c] += sum over the
 * batch's compressed rows (ascending) of (x + pe[g, j])[r] dc[row][c]; the
 * thread with c = 0 adds dpe[g][j][r] = sum_c W[g][j][r][c] sum_rows dc[row][c]. */
template <typename T>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_bwd_compress_w_kernel(nsa_hip_dims dm, int64_t D, nsa_hip_tensor x, nsa_hip_tensor pe, nsa_hip_tensor w,
                                  nsa_hip_tensor dc, nsa_hip_tensor dw, nsa_hip_tensor dpe)
{
    const int64_t total = dm.Hkv * dm.l * D * D;
    for (int64_t id = (int64_t)blockIdx.x * NSA_HIP_THREADS + threadIdx.x; id < total;
         id += (int64_t)gridDim.x * NSA_HIP_THREADS) {
        const int64_t c = id % D, r = (id / D) % D, j = (id / (D * D)) % dm.l, gi = id / (D * D * dm.l);
        if (dw.ptr) {
            const float per = pe.ptr ? nsa_ld((const T *)pe.ptr + (gi * dm.l + j) * D + r) : 0.f;
            float aw = 0.f;
            for (int64_t b = 0; b < dm.B; b++)
                for (int64_t row = dm.cu_cmp[b]; row < dm.cu_cmp[b + 1]; row++) {
                    const int64_t tok = dm.cu_seqlens[b] + (row - dm.cu_cmp[b]) * dm.d + j;
                    aw += (nsa_ld((const T *)x.ptr + tok * x.st + gi * x.sh + r) + per) *
                          ((const float *)dc.ptr)[row * dc.st + gi * dc.sh + c];
                }
            ((float *)dw.ptr)[id] += aw;
        }
        if (dpe.ptr && c == 0) {
            float s = 0.f;
            for (int64_t cc = 0; cc < D; cc++) {
                float col = 0.f;
                for (int64_t row = 0; row < dm.total_cmp; row++)
                    col += ((const float *)dc.ptr)[row * dc.st + gi * dc.sh + cc];
                s += nsa_ld((const T *)w.ptr + ((gi * dm.l + j) * D + r) * D + cc) * col;
            }
            ((float *)dpe.ptr)[(gi * dm.l + j) * D + r] += s;
        }
    }
}

hipError_t nsa_hip_bwd_compress(const nsa_hip_dims *dm, int linear, int64_t D, nsa_hip_tensor dc, nsa_hip_tensor x,
                                nsa_hip_tensor w, nsa_hip_tensor pe, nsa_hip_tensor dx, nsa_hip_tensor dw,
                                nsa_hip_tensor dpe, hipStream_t stream)
{
    if (dm->total_cmp == 0) return hipSuccess;
    if (dx.ptr) {
        dim3 grid(nsa_hip_grid_1d(dm->T * dm->Hkv * D));
        NSA_HIP_DISPATCH(dm->dtype, nsa_hip_bwd_compress_rows_kernel, grid, 0, stream, *dm, linear, D, dc, w, dx);
        hipError_t e = hipGetLastError();
        if (e != hipSuccess) return e;
    }
    if (linear && (dw.ptr || dpe.ptr)) {
        dim3 grid(nsa_hip_grid_1d(dm->Hkv * dm->l * D * D));
        NSA_HIP_DISPATCH(dm->dtype, nsa_hip_bwd_compress_w_kernel, grid, 0, stream, *dm, D, x, pe, w, dc, dw, dpe);
        return hipGetLastError();
    }
    return hipSuccess;
}

template <typename T>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_bwd_store_kernel(nsa_hip_tensor acc, nsa_hip_tensor out, int64_t rows, int64_t heads, int64_t dim)
{
    const int64_t total = rows * heads * dim;
    for (int64_t id = (int64_t)blockIdx.x * NSA_HIP_THREADS + threadIdx.x; id < total;
         id += (int64_t)gridDim.x * NSA_HIP_THREADS) {
        const int64_t e = id % dim, h = (id / dim) % heads, rr = id / (dim * heads);
        nsa_st((T *)out.ptr + rr * out.st + h * out.sh + e, ((const float *)acc.ptr)[rr * acc.st + h * acc.sh + e]);
    }
}

hipError_t nsa_hip_bwd_store(int dtype, nsa_hip_tensor acc, nsa_hip_tensor out, int64_t rows, int64_t heads,
                             int64_t dim, hipStream_t stream)
{
    const int64_t n = rows * heads * dim;
    if (n == 0) return hipSuccess;
    dim3 grid(nsa_hip_grid_1d(n));
    NSA_HIP_DISPATCH(dtype, nsa_hip_bwd_store_kernel, grid, 0, stream, acc, out, rows, heads, dim);
    return hipGetLastError();
}
