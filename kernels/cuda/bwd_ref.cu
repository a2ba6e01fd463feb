/*
 * bwd_ref.cu -- the backward stages (semantics section 9), readable: the
 * reference beside the tensor-core kernels of bwd_sm80.cu, and the kernels of
 * f32 inputs and of heads wider than those take (padded 32/32 .. 192/128).
 *
 * Per branch, with the forward's LSE (p_r = exp(scale q . k_r - lse)):
 *   e_r = dO . v_r,  dg = sum_r p_r e_r,  D = g dg,  ds_r = g p_r (e_r - dg)
 *   dq = scale sum_r ds_r k_r,  dk_r += scale ds_r q,  dv_r += g p_r dO
 * Two kernels per branch, both plain fp32 FFMA with fixed orders (no atomics):
 *   rows: one warp per (token, query head): two sweeps over the row's keys
 *         (32 keys at a time, one per lane): the first sums dg, the second
 *         forms ds and accumulates dq (lanes over dims); writes dgate, delta
 *         and adds dq to the f32 accumulator.
 *   keys: one warp per (key row, KV head): the query rows that read the key
 *         (compressed row i: local t >= i d + l - 1; window token r: t in
 *         [r, r + w); selected token r of block j: t >= r whose selection
 *         holds j, from the inverse map), 32 (token, head) pairs at a time,
 *         one per lane; adds dk, dv of the row to the accumulators.
 * The inverse map of the selection (slc_map_build): each (token, KV head, slot)
 * entry keyed by its (KV head, batch selection block), a stable radix sort by
 * key (so each block's tokens stay ascending) and the scanned counts as
 * segment offsets: deterministic, O(T Hkv n).
 * So each accumulator element is summed by one warp in a fixed order; the
 * stages run in a fixed order too. BWD_COMPRESS takes dkc, dvc back through
 * MEAN (1/l to each row of a block) or LINEAR (rows and pe through W^T, W
 * from the outer products), one thread per output element; BWD_STORE rounds
 * each accumulator once to the dtype.
 *
 * Speed: not tuned (CUDA cores, keys re-read from global memory); the
 * selection's inverse map, BWD_COMPRESS and BWD_STORE serve bwd_sm80 too.
 */
#include <cub/cub.cuh>

#include "nsa_cuda.cuh"
#include "nsa_cuda_kernels.h"

namespace nsa_cuda {

constexpr int BWD_WARPS = 4;

NSA_DEV bool neg_inf(float x) { return x == -INFINITY; }

/* ------------------------------------------------------------ rows (dq, dgate, delta) */

template <typename T, typename KV, int MODE>
__global__ void __launch_bounds__(BWD_WARPS * 32)
    bwd_rows_kernel(const Geom g, BwdIn in, const KV *k, int64_t kst, int64_t ksh, const KV *v, int64_t vst,
                    int64_t vsh, float *dq, int64_t dqst, int64_t dqsh)
{
    extern __shared__ float sm[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *sq = sm + warp * (2 * g.Dqk + g.Dv + 32); /* q * scale */
    float *sd = sq + g.Dqk;                          /* dO */
    float *sa = sd + g.Dv;                           /* dq */
    float *sp = sa + g.Dqk;                          /* the 32 ds of a step */
    const T *q = (const T *)in.q.p, *dout = (const T *)in.dout.p;
    const float *lse_p = (const float *)in.lse.p, *gate_p = (const float *)in.gate.p;
    const int *idx = (const int *)in.idx.p;
    const int64_t rows = g.T * g.Hq;
    for (int64_t row = (int64_t)blockIdx.x * BWD_WARPS + warp; row < rows; row += (int64_t)gridDim.x * BWD_WARPS) {
        const int64_t t = row / g.Hq, h = row % g.Hq, gi = h / g.G;
        const int64_t seq = g.tok_seq[t], s0 = g.cu_seqlens[seq], tl = t - s0;
        const float lse = lse_p[t * in.lse.st + h * in.lse.sh], gate = gate_p[t * in.gate.st + h * in.gate.sh];
        for (int64_t e = lane; e < g.Dqk; e += 32) {
            sq[e] = to_f(q[t * in.q.st + h * in.q.sh + e]) * g.scale;
            sa[e] = 0.f;
        }
        for (int64_t e = lane; e < g.Dv; e += 32) sd[e] = to_f(dout[t * in.dout.st + h * in.dout.sh + e]);
        __syncwarp();
        const bool none = neg_inf(lse);
        float dg_part = 0.f, dg = 0.f;

        /* the row's keys, segment by segment, as the forward visits them */
        auto keys = [&](auto &&step) {
            auto segment = [&](int64_t lo, int64_t hi, int64_t base) {
                for (int64_t c0 = lo; c0 < hi; c0 += 32) step(c0, hi, base);
            };
            if (MODE == 0) {
                segment(0, nsa_cmp_visible(tl, g.l, g.d), g.cu_cmp[seq]);
            } else if (MODE == 2) {
                segment(nsa_win_start(tl, g.w), tl + 1, s0);
            } else {
                for (int64_t b = 0; b < g.n; b++) {
                    const int64_t j = idx[t * in.idx.st + gi * in.idx.sh + b];
                    if (j < 0 || j * g.ls > tl) continue;
                    segment(j * g.ls, nsa_min64((j + 1) * g.ls, tl + 1), s0);
                }
            }
        };
        /* p and e of the lane's key */
        auto pe = [&](int64_t key, int64_t base, float *p, float *e) {
            const KV *kr = k + (base + key) * kst + gi * ksh;
            const KV *vr = v + (base + key) * vst + gi * vsh;
            float z = 0.f, ev = 0.f;
            for (int64_t x = 0; x < g.Dqk; x++) z += sq[x] * to_f(kr[x]);
            for (int64_t x = 0; x < g.Dv; x++) ev += sd[x] * to_f(vr[x]);
            *p = none ? 0.f : expf(z - lse);
            *e = ev;
        };
        keys([&](int64_t c0, int64_t hi, int64_t base) {
            const int64_t key = c0 + lane;
            if (key < hi) {
                float p, e;
                pe(key, base, &p, &e);
                dg_part += p * e;
            }
        });
        dg = warp_sum(dg_part);
        if (lane == 0) {
            if (in.dgate.p) ((float *)in.dgate.p)[t * in.dgate.st + h * in.dgate.sh] = dg;
            ((float *)in.delta.p)[t * in.delta.st + h * in.delta.sh] = gate * dg;
        }
        if (dq) {
            keys([&](int64_t c0, int64_t hi, int64_t base) {
                const int64_t key = c0 + lane;
                float ds = 0.f;
                if (key < hi) {
                    float p, e;
                    pe(key, base, &p, &e);
                    ds = gate * p * (e - dg) * g.scale;
                }
                sp[lane] = ds;
                __syncwarp();
                const int cnt = (int)(hi - c0 < 32 ? hi - c0 : 32);
                for (int64_t x = lane; x < g.Dqk; x += 32) {
                    float acc = sa[x];
                    const KV *kr = k + (base + c0) * kst + gi * ksh + x;
                    for (int kk = 0; kk < cnt; kk++) acc += sp[kk] * to_f(kr[kk * kst]);
                    sa[x] = acc;
                }
                __syncwarp();
            });
            float *d = dq + t * dqst + h * dqsh;
            for (int64_t x = lane; x < g.Dqk; x += 32) d[x] += sa[x];
        }
        __syncwarp();
    }
}

/* ------------------------------------------------------------ keys (dk, dv) */

template <typename T, typename KV, int MODE>
__global__ void __launch_bounds__(BWD_WARPS * 32)
    bwd_keys_kernel(const Geom g, BwdIn in, const KV *k, int64_t kst, int64_t ksh, const KV *v, int64_t vst,
                    int64_t vsh, float *dk, int64_t dkst, int64_t dksh, float *dv, int64_t dvst, int64_t dvsh,
                    int64_t nrows, const int *mlist, const int *moff, const int64_t *blk_off, int64_t nb)
{
    extern __shared__ float sm[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *sk = sm + warp * (2 * g.Dqk + 2 * g.Dv + 64); /* k row */
    float *sv = sk + g.Dqk;                               /* v row */
    float *ak = sv + g.Dv;                                /* dk */
    float *av = ak + g.Dqk;                               /* dv */
    float *sds = av + g.Dv;                               /* scale * ds of the 32 pairs */
    float *spg = sds + 32;                                /* g p of the 32 pairs */
    const T *q = (const T *)in.q.p, *dout = (const T *)in.dout.p;
    const float *lse_p = (const float *)in.lse.p, *gate_p = (const float *)in.gate.p;
    const float *delta_p = (const float *)in.delta.p;
    const int64_t items = nrows * g.Hkv;
    for (int64_t it = (int64_t)blockIdx.x * BWD_WARPS + warp; it < items; it += (int64_t)gridDim.x * BWD_WARPS) {
        const int64_t r = it / g.Hkv, gi = it % g.Hkv;
        /* the queries [t0, t1) that may read key row r; block j (selected) */
        /* the queries: tokens [t0, t1) (cmp, win), or list entries [t0, t1) (slc) */
        int64_t t0, t1;
        if (MODE == 0) {
            const int64_t b = find_seq(g.cu_cmp, g.B, r), i = r - g.cu_cmp[b];
            t0 = g.cu_seqlens[b] + i * g.d + g.l - 1;
            t1 = g.cu_seqlens[b + 1];
        } else if (MODE == 2) {
            const int64_t b = g.tok_seq[r];
            t0 = r;
            t1 = nsa_min64(r + g.w, g.cu_seqlens[b + 1]);
        } else { /* the block's selecting tokens (ascending) from r on */
            const int64_t b = g.tok_seq[r], sg = gi * nb + blk_off[b] + (r - g.cu_seqlens[b]) / g.ls;
            int64_t lo = moff[sg], hi = moff[sg + 1];
            t1 = hi;
            while (lo < hi) {
                const int64_t mid = (lo + hi) / 2;
                if (mlist[mid] < r) lo = mid + 1;
                else hi = mid;
            }
            t0 = lo;
        }
        const KV *kr = k + r * kst + gi * ksh, *vr = v + r * vst + gi * vsh;
        for (int64_t x = lane; x < g.Dqk; x += 32) {
            sk[x] = to_f(kr[x]);
            ak[x] = 0.f;
        }
        for (int64_t x = lane; x < g.Dv; x += 32) {
            sv[x] = to_f(vr[x]);
            av[x] = 0.f;
        }
        __syncwarp();
        const int64_t pairs = (t1 > t0 ? t1 - t0 : 0) * g.G;
        for (int64_t p0 = 0; p0 < pairs; p0 += 32) {
            const int64_t pr = p0 + lane;
            float ds = 0.f, pg = 0.f;
            int64_t t = -1, h = 0;
            if (pr < pairs) {
                t = MODE == 1 ? mlist[t0 + pr / g.G] : t0 + pr / g.G;
                h = gi * g.G + pr % g.G;
                const float lse = lse_p[t * in.lse.st + h * in.lse.sh];
                if (!neg_inf(lse)) {
                    const T *qr = q + t * in.q.st + h * in.q.sh, *dr = dout + t * in.dout.st + h * in.dout.sh;
                    float z = 0.f, e = 0.f;
                    for (int64_t x = 0; x < g.Dqk; x++) z += to_f(qr[x]) * sk[x];
                    for (int64_t x = 0; x < g.Dv; x++) e += to_f(dr[x]) * sv[x];
                    const float p = expf(z * g.scale - lse);
                    const float gate = gate_p[t * in.gate.st + h * in.gate.sh];
                    const float delta = delta_p[t * in.delta.st + h * in.delta.sh];
                    ds = g.scale * p * (gate * e - delta);
                    pg = p * gate;
                }
            }
            sds[lane] = ds;
            spg[lane] = pg;
            __syncwarp();
            const int cnt = (int)(pairs - p0 < 32 ? pairs - p0 : 32);
            for (int kk = 0; kk < cnt; kk++) {
                if (sds[kk] == 0.f && spg[kk] == 0.f) continue;
                const int64_t pe = t0 + (p0 + kk) / g.G, ph = gi * g.G + (p0 + kk) % g.G;
                const int64_t pt = MODE == 1 ? mlist[pe] : pe;
                const T *qr = q + pt * in.q.st + ph * in.q.sh, *dr = dout + pt * in.dout.st + ph * in.dout.sh;
                for (int64_t x = lane; x < g.Dqk; x += 32) ak[x] += sds[kk] * to_f(qr[x]);
                for (int64_t x = lane; x < g.Dv; x += 32) av[x] += spg[kk] * to_f(dr[x]);
            }
            __syncwarp();
        }
        if (dk) {
            float *d = dk + r * dkst + gi * dksh;
            for (int64_t x = lane; x < g.Dqk; x += 32) d[x] += ak[x];
        }
        if (dv) {
            float *d = dv + r * dvst + gi * dvsh;
            for (int64_t x = lane; x < g.Dv; x += 32) d[x] += av[x];
        }
        __syncwarp();
    }
}

template <typename K>
static cudaError_t big_smem(K kernel, size_t smem)
{
    if (smem <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
}

static unsigned grid_of(int64_t items)
{
    int64_t b = (items + BWD_WARPS - 1) / BWD_WARPS;
    return (unsigned)(b < 1 ? 1 : b > (1 << 30) ? (1 << 30) : b);
}

template <typename T, typename KV, int MODE>
static cudaError_t launch_bwd(const Geom &g, const BwdIn &in, View k, View v, MView dq, MView dk, MView dv,
                              const SlcMap *map, cudaStream_t s)
{
    if (g.T == 0) return cudaSuccess;
    const size_t smem_r = (size_t)BWD_WARPS * (2 * g.Dqk + g.Dv + 32) * sizeof(float);
    cudaError_t e = big_smem(bwd_rows_kernel<T, KV, MODE>, smem_r);
    if (e != cudaSuccess) return e;
    bwd_rows_kernel<T, KV, MODE><<<grid_of(g.T * g.Hq), BWD_WARPS * 32, smem_r, s>>>(
        g, in, (const KV *)k.p, k.st, k.sh, (const KV *)v.p, v.st, v.sh, (float *)dq.p, dq.st, dq.sh);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    const int64_t nrows = MODE == 0 ? g.total_cmp : g.T;
    if ((!dk.p && !dv.p) || nrows == 0) return cudaSuccess;
    if (MODE == 1 && !map) return cudaErrorInvalidValue; /* the selected branch needs the inverse map */
    const size_t smem_k = (size_t)BWD_WARPS * (2 * g.Dqk + 2 * g.Dv + 64) * sizeof(float);
    if ((e = big_smem(bwd_keys_kernel<T, KV, MODE>, smem_k)) != cudaSuccess) return e;
    bwd_keys_kernel<T, KV, MODE><<<grid_of(nrows * g.Hkv), BWD_WARPS * 32, smem_k, s>>>(
        g, in, (const KV *)k.p, k.st, k.sh, (const KV *)v.p, v.st, v.sh, (float *)dk.p, dk.st, dk.sh, (float *)dv.p,
        dv.st, dv.sh, nrows, map ? map->list_out : nullptr, map ? map->off : nullptr, map ? map->blk_off : nullptr,
        map ? map->nb : 0);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t bwd_attn_t(const Geom &g, int mode, const BwdIn &in, View k, View v, MView dq, MView dk, MView dv,
                              const SlcMap *map, cudaStream_t s)
{
    if (mode == 0) return launch_bwd<T, float, 0>(g, in, k, v, dq, dk, dv, nullptr, s);
    if (mode == 1) return launch_bwd<T, T, 1>(g, in, k, v, dq, dk, dv, map, s);
    return launch_bwd<T, T, 2>(g, in, k, v, dq, dk, dv, nullptr, s);
}

cudaError_t bwd_attn_ref(const Geom &g, int mode, const BwdIn &in, View k, View v, MView dq, MView dk, MView dv,
                         const SlcMap *map, cudaStream_t s)
{
    NSA_DISPATCH_DTYPE(g.dtype, T, return bwd_attn_t<T>(g, mode, in, k, v, dq, dk, dv, map, s));
    return cudaErrorInvalidValue;
}

static unsigned grid1(int64_t n);

/* ------------------------------------------------------------ the selection's inverse map */

/* entry e = (t, g, slot): key = g * nb + blk_off[seq] + j for an eligible j, else
 * the sentinel Hkv * nb (sorted last); value t; counts per key */
__global__ void slc_map_entries_kernel(const Geom g, const int *idx, int64_t ist, int64_t ish,
                                       const int64_t *blk_off, int64_t nb, int64_t t0, int64_t total, bool entry_vals,
                                       int *key, int *val, int *cnt)
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t slot = e % g.n, gi = (e / g.n) % g.Hkv, t = t0 + e / (g.n * g.Hkv);
        const int64_t b = g.tok_seq[t], tl = t - g.cu_seqlens[b];
        const int64_t j = idx[t * ist + gi * ish + slot];
        int k = (int)(g.Hkv * nb);
        if (j >= 0 && j * g.ls <= tl) {
            k = (int)(gi * nb + blk_off[b] + j);
            atomicAdd(cnt + k, 1); /* integer counts: the same whatever the order */
        }
        key[e] = k;
        val[e] = entry_vals ? (int)e : (int)t;
    }
}

static int key_bits(int64_t segments)
{
    int bits = 1;
    while (bits < 31 && ((int64_t)1 << bits) <= segments) bits++;
    return bits;
}

size_t slc_map_tmp_bytes(int64_t entries, int64_t segments)
{
    size_t a = 0, b = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, a, (const int *)nullptr, (int *)nullptr, (const int *)nullptr,
                                    (int *)nullptr, (int)entries, 0, key_bits(segments));
    cub::DeviceScan::ExclusiveSum(nullptr, b, (const int *)nullptr, (int *)nullptr, (int)(segments + 1));
    return a > b ? a : b;
}

cudaError_t slc_map_build(const Geom &g, View idx, SlcMap &m, int64_t t0, int64_t t1, bool entry_vals, cudaStream_t s)
{
    const int64_t entries = (t1 - t0) * g.Hkv * g.n, segments = g.Hkv * m.nb;
    if (entries <= 0) return cudaSuccess;
    cudaError_t e = cudaMemsetAsync(m.cnt, 0, (size_t)(segments + 1) * sizeof(int), s);
    if (e != cudaSuccess) return e;
    slc_map_entries_kernel<<<grid1(entries), 256, 0, s>>>(g, (const int *)idx.p, idx.st, idx.sh, m.blk_off, m.nb, t0,
                                                           entries, entry_vals, m.seg, m.list_in, m.cnt);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    size_t bytes = m.tmp_bytes;
    /* stable: each segment's entries keep their ascending order (tokens ascending) */
    if ((e = cub::DeviceRadixSort::SortPairs(m.tmp, bytes, m.seg, m.seg_out, m.list_in, m.list_out, (int)entries, 0,
                                             key_bits(segments), s)) != cudaSuccess)
        return e;
    bytes = m.tmp_bytes;
    return cub::DeviceScan::ExclusiveSum(m.tmp, bytes, m.cnt, m.off, (int)(segments + 1), s);
}

/* ------------------------------------------------------------ compression */

/* dx[t, g, e] += sum over the blocks i that hold t (ascending) of
 * MEAN: dc[i, g, e] / l;  LINEAR: sum_c W[g][t_local - i d][e][c] dc[i, g, c] */
template <typename WT, bool LINEAR>
__global__ void bwd_compress_rows_kernel(const Geom g, int64_t D, const float *dc, int64_t dcst, int64_t dcsh,
                                         const WT *W, float *dx, int64_t dxst, int64_t dxsh)
{
    const int64_t total = g.T * g.Hkv * D;
    for (int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; id < total; id += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = id % D, gi = (id / D) % g.Hkv, t = id / (D * g.Hkv);
        const int64_t b = g.tok_seq[t], tl = t - g.cu_seqlens[b], nc = g.cu_cmp[b + 1] - g.cu_cmp[b];
        const int64_t i0 = tl - g.l + 1 > 0 ? (tl - g.l + 1 + g.d - 1) / g.d : 0;
        const int64_t i1 = nsa_min64(tl / g.d, nc - 1);
        float acc = 0.f;
        for (int64_t i = i0; i <= i1; i++) {
            const float *gr = dc + (g.cu_cmp[b] + i) * dcst + gi * dcsh;
            if (!LINEAR) {
                acc += gr[e] / (float)g.l;
            } else {
                const WT *wr = W + ((gi * g.l + (tl - i * g.d)) * D + e) * D;
                float s = 0.f;
                for (int64_t c = 0; c < D; c++) s += to_f(wr[c]) * gr[c];
                acc += s;
            }
        }
        dx[t * dxst + gi * dxsh + e] += acc;
    }
}

/* LINEAR weights: dW[g][j][r][c] += sum_rows (x[row tok j, g, r] + pe[g, j, r]) dc[row, g, c];
 * dpe[g][j][r] += sum_c W[g][j][r][c] sum_rows dc[row, g, c]; rows over the batch ascending */
template <typename T>
__global__ void bwd_compress_w_kernel(const Geom g, int64_t D, const T *x, int64_t xst, int64_t xsh, const T *pe,
                                      const T *W, const float *dc, int64_t dcst, int64_t dcsh, float *dW, float *dpe)
{
    const int64_t total = g.Hkv * g.l * D * D;
    for (int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; id < total; id += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = id % D, r = (id / D) % D, j = (id / (D * D)) % g.l, gi = id / (D * D * g.l);
        const float per = pe ? to_f(pe[(gi * g.l + j) * D + r]) : 0.f;
        if (dW) {
            float aw = 0.f;
            for (int64_t b = 0; b < g.B; b++)
                for (int64_t row = g.cu_cmp[b]; row < g.cu_cmp[b + 1]; row++) {
                    const int64_t tok = g.cu_seqlens[b] + (row - g.cu_cmp[b]) * g.d + j;
                    aw += (to_f(x[tok * xst + gi * xsh + r]) + per) * dc[row * dcst + gi * dcsh + c];
                }
            dW[id] += aw;
        }
        if (dpe && c == 0) { /* one thread per (g, j, r) sums the row of W against sum_rows dc */
            float s = 0.f;
            for (int64_t cc = 0; cc < D; cc++) {
                float col = 0.f;
                for (int64_t row = 0; row < g.total_cmp; row++) col += dc[row * dcst + gi * dcsh + cc];
                s += to_f(W[((gi * g.l + j) * D + r) * D + cc]) * col;
            }
            dpe[(gi * g.l + j) * D + r] += s;
        }
    }
}

static unsigned grid1(int64_t n)
{
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > (1 << 20) ? (1 << 20) : b);
}

template <typename T>
static cudaError_t bwd_compress_t(const Geom &g, bool linear, int64_t D, View dc, View x, View W, View pe, MView dx,
                                  MView dW, MView dpe, cudaStream_t s)
{
    if (g.total_cmp == 0) return cudaSuccess;
    if (dx.p) {
        if (linear)
            bwd_compress_rows_kernel<T, true><<<grid1(g.T * g.Hkv * D), 256, 0, s>>>(
                g, D, (const float *)dc.p, dc.st, dc.sh, (const T *)W.p, (float *)dx.p, dx.st, dx.sh);
        else
            bwd_compress_rows_kernel<T, false><<<grid1(g.T * g.Hkv * D), 256, 0, s>>>(
                g, D, (const float *)dc.p, dc.st, dc.sh, (const T *)W.p, (float *)dx.p, dx.st, dx.sh);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    if (linear && (dW.p || dpe.p)) {
        bwd_compress_w_kernel<T><<<grid1(g.Hkv * g.l * D * D), 256, 0, s>>>(
            g, D, (const T *)x.p, x.st, x.sh, (const T *)pe.p, (const T *)W.p, (const float *)dc.p, dc.st, dc.sh,
            (float *)dW.p, (float *)dpe.p);
        return cudaGetLastError();
    }
    return cudaSuccess;
}

cudaError_t bwd_compress(const Geom &g, bool linear, int64_t D, View dc, View x, View W, View pe, MView dx, MView dW,
                         MView dpe, cudaStream_t s)
{
    NSA_DISPATCH_DTYPE(g.dtype, T, return bwd_compress_t<T>(g, linear, D, dc, x, W, pe, dx, dW, dpe, s));
    return cudaErrorInvalidValue;
}

/* ------------------------------------------------------------ store */

template <typename T>
__global__ void bwd_store_kernel(const float *acc, int64_t ast, int64_t ash, T *out, int64_t ost, int64_t osh,
                                 int64_t rows, int64_t heads, int64_t dim)
{
    const int64_t total = rows * heads * dim;
    for (int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; id < total; id += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = id % dim, h = (id / dim) % heads, r = id / (dim * heads);
        out[r * ost + h * osh + e] = from_f<T>(acc[r * ast + h * ash + e]);
    }
}

cudaError_t bwd_store(int dtype, View acc, MView out, int64_t rows, int64_t heads, int64_t dim, cudaStream_t s)
{
    const int64_t n = rows * heads * dim;
    if (n == 0) return cudaSuccess;
    NSA_DISPATCH_DTYPE(dtype, T, bwd_store_kernel<T><<<grid1(n), 256, 0, s>>>((const float *)acc.p, acc.st, acc.sh,
                                                                               (T *)out.p, out.st, out.sh, rows, heads,
                                                                               dim));
    return cudaGetLastError();
}

} // namespace nsa_cuda
