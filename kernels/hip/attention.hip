/*
 * attention.hip -- stages CMP_ATTN, SLC_ATTN and WIN_ATTN (sections 2, 4, 5 of
 * docs/nsa-semantics.md): one softmax-attention kernel over three key sets.
 *
 * A block handles one token t, one KV group g and a chunk of its query heads
 * (rows), for a chunk of the Dv output columns. All rows of a block share the
 * token, hence the key set, so each key chunk is fetched once into LDS and
 * used by every head of the group (group-centric; for SLC_ATTN this is the
 * "G heads share one fetch of each selected block" of the paper's kernel).
 *   CMP  keys: compressed rows cu_cmp[b] + i, i < nc(t), from f32 kc/vc
 *   SLC  keys: tokens j*ls + o (o < ls) of the selected blocks j of (t, g),
 *        causally masked (s <= t); slots holding -1 are skipped
 *   WIN  keys: tokens max(0, t - w + 1) .. t
 * Per key chunk: load K/V rows (f32 in LDS) -> scores S = (q * scale * log2e) . k
 * -> online-softmax statistics per row (one thread per row, keys in order) ->
 * O = O * alpha + P V with each thread owning up to NSA_HIP_ACC outputs in
 * registers. exp2 throughout; lse = (m + log2 l) * ln 2 (natural log).
 * A query with no visible key (nc(t) = 0) gets o = 0 and lse = -inf.
 *
 * Version 1 (this file): the portable path, plain fp32 FMAs, no wave-level
 * intrinsics; right for any wave size. Not measured (no AMD GPU was
 * available when it was written); see backends/hip/README.md.
 */
#include "tile.h"

/* Row of key `key` (0-based in the key enumeration), or -1 if masked. */
template <int KIND>
NSA_DEV int64_t nsa_hip_key_row(const nsa_hip_dims &dm, int64_t key, int64_t nkeys, int64_t base, int64_t tq,
                                const int *sel)
{
    if (key >= nkeys) return -1;
    if (KIND == NSA_HIP_SLC) {
        int64_t slot = key / dm.ls, j = sel[slot];
        if (j < 0) return -1;
        int64_t s = j * dm.ls + (key - slot * dm.ls);
        return s <= tq ? base + s : -1;
    }
    return base + key; /* CMP: cu_cmp[b] + i; WIN: first window token + offset */
}

/* SLC: does the chunk [k0, k0 + nk) hold any visible key? (Uniform over the
 * block: every thread computes the same answer from the same indices.) */
NSA_DEV bool nsa_hip_slc_chunk_live(const nsa_hip_dims &dm, int64_t k0, int nk, int64_t tq, const int *sel)
{
    for (int64_t slot = k0 / dm.ls; slot <= (k0 + nk - 1) / dm.ls; slot++) {
        int64_t j = sel[slot];
        int64_t first = k0 > slot * dm.ls ? k0 - slot * dm.ls : 0;
        if (j >= 0 && j * dm.ls + first <= tq) return true;
    }
    return false;
}

template <typename TQ, typename TKV, int KIND>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_attn_kernel(nsa_hip_dims dm, nsa_hip_tile tl, int64_t t0, nsa_hip_tensor q, nsa_hip_tensor k,
                        nsa_hip_tensor v, nsa_hip_tensor idx, nsa_hip_tensor o, nsa_hip_tensor lse)
{
    extern __shared__ int64_t nsa_lds[];
    const int tid = threadIdx.x;
    const int R = tl.rows, TK = tl.keys, DVC = tl.dv_chunk;
    const int ldq = (int)dm.Dqk + 1, ldp = TK + 1;

    const int64_t t = t0 + blockIdx.x;
    const int64_t g = blockIdx.y / tl.head_chunks;
    const int64_t hc = blockIdx.y % tl.head_chunks;
    const int64_t h0 = g * dm.G + hc * R;
    const int rows = (int)nsa_min64(R, dm.G - hc * R);
    const int64_t e0 = (int64_t)blockIdx.z * DVC;
    const int dvc = (int)nsa_min64(DVC, dm.Dv - e0);

    const int64_t b = dm.tok_seq[t], s0 = dm.cu_seqlens[b], tq = t - s0;
    int64_t nkeys, base;
    const int *sel = 0;
    if (KIND == NSA_HIP_CMP) {
        nkeys = nsa_cmp_visible(tq, dm.l, dm.d);
        base = dm.cu_cmp[b];
    } else if (KIND == NSA_HIP_WIN) {
        int64_t lo = nsa_win_start(tq, dm.w);
        nkeys = tq - lo + 1;
        base = s0 + lo;
    } else {
        nkeys = dm.n * dm.ls;
        base = s0;
        sel = (const int *)idx.ptr + t * idx.st + g * idx.sh;
    }

    /* LDS: krow[TK] int64 | Qs[R][ldq] | Ks[TK][ldq] | Vs[TK][DVC] | Ps[R][ldp] | m, l, alpha [R] */
    int64_t *krow = nsa_lds;
    float *Qs = (float *)(krow + TK);
    float *Ks = Qs + R * ldq;
    float *Vs = Ks + TK * ldq;
    float *Ps = Vs + TK * DVC;
    float *m_r = Ps + R * ldp;
    float *l_r = m_r + R;
    float *a_r = l_r + R;

    nsa_hip_load_q<TQ>(Qs, ldq, q, t, h0, rows, R, dm.Dqk, dm.scale_log2);
    if (tid < R) {
        m_r[tid] = nsa_neg_inf();
        l_r[tid] = 0.0f;
    }
    float acc[NSA_HIP_ACC];
#pragma unroll
    for (int j = 0; j < NSA_HIP_ACC; j++) acc[j] = 0.0f;

    for (int64_t k0 = 0; k0 < nkeys; k0 += TK) {
        const int nk = (int)nsa_min64(TK, nkeys - k0);
        if (KIND == NSA_HIP_SLC && !nsa_hip_slc_chunk_live(dm, k0, nk, tq, sel)) continue;
        if (tid < TK) krow[tid] = tid < nk ? nsa_hip_key_row<KIND>(dm, k0 + tid, nkeys, base, tq, sel) : -1;
        __syncthreads();
        nsa_hip_load_keys<TKV>(Ks, ldq, k, krow, TK, g, 0, (int)dm.Dqk);
        nsa_hip_load_keys<TKV>(Vs, DVC, v, krow, TK, g, e0, dvc);
        __syncthreads();
        nsa_hip_score_tile(Ps, ldp, Qs, ldq, Ks, ldq, krow, R, TK, (int)dm.Dqk);
        __syncthreads();
        if (tid < rows) { /* online softmax statistics of row tid, keys in order */
            float *p = Ps + tid * ldp;
            float mo = m_r[tid], mx = mo;
            for (int kk = 0; kk < TK; kk++) mx = fmaxf(mx, p[kk]);
            if (mx == nsa_neg_inf()) { /* nothing visible yet */
                for (int kk = 0; kk < TK; kk++) p[kk] = 0.0f;
                a_r[tid] = 1.0f;
            } else {
                float sum = 0.0f;
                for (int kk = 0; kk < TK; kk++) {
                    float e = exp2f(p[kk] - mx); /* -inf -> 0 */
                    p[kk] = e;
                    sum += e;
                }
                float alpha = exp2f(mo - mx); /* mo = -inf -> 0 */
                a_r[tid] = alpha;
                l_r[tid] = l_r[tid] * alpha + sum;
                m_r[tid] = mx;
            }
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < NSA_HIP_ACC; j++) {
            int e = tid + j * NSA_HIP_THREADS;
            int r = e / DVC, c = e - r * DVC;
            if (r < rows && c < dvc) {
                const float *p = Ps + r * ldp;
                float s = 0.0f;
                for (int kk = 0; kk < TK; kk++) s = fmaf(p[kk], Vs[kk * DVC + c], s);
                acc[j] = acc[j] * a_r[r] + s;
            }
        }
        /* the next chunk rewrites krow only (Ks/Vs/Ps after its first barrier) */
    }
    __syncthreads();

    float *out = (float *)o.ptr + t * o.st + h0 * o.sh + e0;
#pragma unroll
    for (int j = 0; j < NSA_HIP_ACC; j++) {
        int e = tid + j * NSA_HIP_THREADS;
        int r = e / DVC, c = e - r * DVC;
        if (r < rows && c < dvc) {
            float l = l_r[r];
            out[r * o.sh + c] = l > 0.0f ? acc[j] / l : 0.0f;
        }
    }
    if (lse.ptr && blockIdx.z == 0 && tid < rows) {
        float l = l_r[tid];
        ((float *)lse.ptr)[t * lse.st + (h0 + tid) * lse.sh] =
            l > 0.0f ? (m_r[tid] + log2f(l)) * NSA_LN2 : nsa_neg_inf();
    }
}

/* ------------------------------------------------------------ host side */

static size_t attn_lds_bytes(int R, int TK, int DVC, int64_t Dqk)
{
    size_t ldq = (size_t)Dqk + 1;
    size_t floats = (size_t)R * ldq + (size_t)TK * ldq + (size_t)TK * DVC + (size_t)R * (TK + 1) + 3 * (size_t)R;
    return (size_t)TK * sizeof(int64_t) + floats * sizeof(float);
}

static int pow2_keys(int R)
{
    int tk = 32; /* rows * keys ~ one score per thread */
    while (tk > 8 && tk * R > NSA_HIP_THREADS) tk /= 2;
    return tk;
}

int nsa_hip_attn_tile(const nsa_hip_dims *dm, size_t budget, nsa_hip_tile *out)
{
    int R = (int)nsa_min64(dm->G, NSA_HIP_MAX_ROWS);
    for (;;) {
        int DVC = (int)nsa_min64(dm->Dv, (NSA_HIP_THREADS * NSA_HIP_ACC) / R);
        for (int TK = pow2_keys(R); TK >= 1; TK /= 2) {
            size_t bytes = attn_lds_bytes(R, TK, DVC, dm->Dqk);
            if (bytes <= budget) {
                out->rows = R;
                out->keys = TK;
                out->dv_chunk = DVC;
                out->head_chunks = (int)((dm->G + R - 1) / R);
                out->dv_chunks = (int)((dm->Dv + DVC - 1) / DVC);
                out->sel_chunk = 0;
                out->psum_len = 0;
                out->lds_bytes = bytes;
                return 0;
            }
        }
        if (R == 1) return -1;
        R = (R + 1) / 2;
    }
}

/* Tokens per launch: the grid's x extent times the block size must stay below
 * 2^32 work-items on AMD (HSA grid sizes are 32-bit). */
#define NSA_HIP_TOKENS_PER_LAUNCH ((int64_t)1 << 23)

template <typename T>
static void attn_launch(int kind, dim3 grid, size_t lds, hipStream_t stream, const nsa_hip_dims &dm,
                        const nsa_hip_tile &tl, int64_t t0, nsa_hip_tensor q, nsa_hip_tensor k, nsa_hip_tensor v,
                        nsa_hip_tensor idx, nsa_hip_tensor o, nsa_hip_tensor lse)
{
    if (kind == NSA_HIP_CMP)
        nsa_hip_attn_kernel<T, float, NSA_HIP_CMP>
            <<<grid, NSA_HIP_THREADS, lds, stream>>>(dm, tl, t0, q, k, v, idx, o, lse);
    else if (kind == NSA_HIP_SLC)
        nsa_hip_attn_kernel<T, T, NSA_HIP_SLC><<<grid, NSA_HIP_THREADS, lds, stream>>>(dm, tl, t0, q, k, v, idx, o, lse);
    else
        nsa_hip_attn_kernel<T, T, NSA_HIP_WIN><<<grid, NSA_HIP_THREADS, lds, stream>>>(dm, tl, t0, q, k, v, idx, o, lse);
}

hipError_t nsa_hip_attention(const nsa_hip_dims *dm, int kind, const nsa_hip_tile *tile, nsa_hip_tensor q,
                             nsa_hip_tensor k, nsa_hip_tensor v, nsa_hip_tensor idx, nsa_hip_tensor o,
                             nsa_hip_tensor lse, hipStream_t stream)
{
    for (int64_t t0 = 0; t0 < dm->T; t0 += NSA_HIP_TOKENS_PER_LAUNCH) {
        dim3 grid((unsigned)nsa_min64(dm->T - t0, NSA_HIP_TOKENS_PER_LAUNCH),
                  (unsigned)(dm->Hkv * tile->head_chunks), (unsigned)tile->dv_chunks);
        if (dm->dtype == NSA_DT_F16)
            attn_launch<nsa_f16_s>(kind, grid, tile->lds_bytes, stream, *dm, *tile, t0, q, k, v, idx, o, lse);
        else if (dm->dtype == NSA_DT_BF16)
            attn_launch<nsa_bf16_s>(kind, grid, tile->lds_bytes, stream, *dm, *tile, t0, q, k, v, idx, o, lse);
        else
            attn_launch<float>(kind, grid, tile->lds_bytes, stream, *dm, *tile, t0, q, k, v, idx, o, lse);
        hipError_t e = hipGetLastError();
        if (e != hipSuccess) return e;
    }
    return hipSuccess;
}
