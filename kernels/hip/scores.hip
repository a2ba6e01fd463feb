/*
 * scores.hip -- stage BLOCK_SCORES (section 3 of docs/nsa-semantics.md):
 *   s(t, g, j) = sum_{h in g} sum_i (overlap(i, j) / d) * p_cmp(t, h, i)
 * for every eligible selection block j <= floor(t / ls).
 *
 * One block per (token t, KV group g). p_cmp is recomputed from q, kc and the
 * LSE that CMP_ATTN wrote: p = exp2(S - lse * log2e) with the same scaled
 * scores S as CMP_ATTN. Selection blocks are processed in passes of sel_chunk
 * blocks; a pass needs the compressed blocks [first_ov(j0), last_ov(j1)]
 * (clamped to nc(t) - 1), whose head-summed probabilities psum[i] are built in
 * LDS: key chunks of TK compressed rows, head chunks of `rows` heads, each
 * psum[i] summed over heads in head order. Then thread j sums its overlapping
 * blocks in index order. No atomics; fixed order; deterministic.
 * The score tile runs on the matrix cores on CDNA (mfma.h) unless
 * NSA_HIP_NO_MFMA=1; the rest is the same code for both paths.
 */
#include <string.h>

#include "mfma.h"

template <typename TQ, bool MFMA>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_scores_kernel(nsa_hip_dims dm, nsa_hip_tile tl, int64_t t0, nsa_hip_tensor q, nsa_hip_tensor kc,
                          nsa_hip_tensor lse, nsa_hip_tensor scores)
{
    extern __shared__ int64_t nsa_lds[];
    const int tid = threadIdx.x;
    const int R = tl.rows, TK = tl.keys;
    const int ldq = tl.ldq, dpad = tl.dpad, ldp = TK + 1;
    const int64_t t = t0 + blockIdx.x, g = blockIdx.y;
    const int64_t b = dm.tok_seq[t], tq = t - dm.cu_seqlens[b];
    const int64_t nc = nsa_cmp_visible(tq, dm.l, dm.d);
    const int64_t last = nsa_slc_last(tq, dm.ls);
    const int64_t row0 = dm.cu_cmp[b];

    /* LDS: krow[TK] int64 | Qs[R][ldq] | Ks[TK][ldq] | Ps[R][ldp] | lse2[R] | psum[psum_len]
     *      | (MFMA) 4 x 256 floats of partial score tiles */
    int64_t *krow = nsa_lds;
    float *Qs = (float *)(krow + TK);
    float *Ks = Qs + R * ldq;
    float *Ps = Ks + TK * ldq;
    float *lse2 = Ps + R * ldp;
    float *psum = lse2 + R;
    float *part = psum + tl.psum_len;

    const bool q_resident = tl.head_chunks == 1; /* load the query rows once */
    bool have_q = false;
    float *out = (float *)scores.ptr + t * scores.st + g * scores.sh;

    for (int64_t j0 = 0; j0 <= last; j0 += tl.sel_chunk) {
        const int64_t j1 = nsa_min64(last, j0 + tl.sel_chunk - 1);
        const int64_t ilo = nsa_cmp_first_overlapping(j0, dm.l, dm.d, dm.ls);
        const int64_t ihi = nsa_min64(nsa_cmp_last_overlapping(j1, dm.ls, dm.d), nc - 1);
        for (int64_t i = tid; i <= ihi - ilo; i += NSA_HIP_THREADS) psum[i] = 0.0f;

        for (int64_t hc = 0; hc < tl.head_chunks && ilo <= ihi; hc++) {
            const int64_t h0 = g * dm.G + hc * R;
            const int rows = (int)nsa_min64(R, dm.G - hc * R);
            if (!q_resident || !have_q) {
                have_q = true;
                __syncthreads(); /* previous users of Qs are done */
                nsa_hip_load_q<TQ>(Qs, ldq, q, t, h0, rows, R, dm.Dqk, dpad, dm.scale_log2);
                if (tid < R)
                    lse2[tid] = tid < rows ? ((const float *)lse.ptr)[t * lse.st + (h0 + tid) * lse.sh] * NSA_LOG2E
                                           : 0.0f;
            }
            for (int64_t i0 = ilo; i0 <= ihi; i0 += TK) {
                if (tid < TK) krow[tid] = i0 + tid <= ihi ? row0 + i0 + tid : -1;
                __syncthreads();
                nsa_hip_load_keys<float>(Ks, ldq, kc, krow, TK, g, 0, (int)dm.Dqk, dpad);
                __syncthreads();
                if (MFMA) {
                    nsa_hip_score_tile_mfma(Ps, ldp, Qs, Ks, ldq, krow, dpad, part);
                } else {
                    nsa_hip_score_tile(Ps, ldp, Qs, ldq, Ks, ldq, krow, R, TK, dpad);
                    __syncthreads();
                }
                if (tid < TK && krow[tid] >= 0) {
                    float s = 0.0f;
                    for (int r = 0; r < rows; r++) s += exp2f(Ps[r * ldp + tid] - lse2[r]);
                    psum[i0 - ilo + tid] += s;
                }
                /* krow, Ks, Ps are rewritten only after the next barriers */
            }
        }
        __syncthreads();
        for (int64_t j = j0 + tid; j <= j1; j += NSA_HIP_THREADS) {
            const int64_t ia = nsa_cmp_first_overlapping(j, dm.l, dm.d, dm.ls);
            const int64_t ib = nsa_min64(nsa_cmp_last_overlapping(j, dm.ls, dm.d), nc - 1);
            float s = 0.0f;
            for (int64_t i = ia; i <= ib; i++) s += (float)nsa_overlap(i, j, dm.l, dm.d, dm.ls) * psum[i - ilo];
            out[j] = s / (float)dm.d;
        }
        __syncthreads(); /* psum is reused by the next pass */
    }
}

/* ------------------------------------------------------------ host side */

static int round_up(int64_t x, int64_t m) { return (int)((x + m - 1) / m * m); }

static size_t scores_lds_bytes(int R, int TK, int ldq, int psum_len, int mfma)
{
    size_t floats = (size_t)R * ldq + (size_t)TK * ldq + (size_t)R * (TK + 1) + (size_t)R + (size_t)psum_len;
    if (mfma) floats += 4 * 256;
    return (size_t)TK * sizeof(int64_t) + floats * sizeof(float);
}

int nsa_hip_scores_tile(const nsa_hip_dims *dm, size_t budget, int mfma, nsa_hip_tile *out)
{
    memset(out, 0, sizeof *out);
    /* about 1024 compressed blocks of psum per pass */
    int64_t jc = (1022 * dm->d - dm->l) / dm->ls;
    if (jc < 1) jc = 1;
    if (jc > 4096) jc = 4096;
    int64_t psum = (jc * dm->ls + dm->l) / dm->d + 2;
    if (psum >= (1 << 20)) return -1;
    if (mfma) {
        int ldq = round_up(dm->Dqk, 32) + 2;
        size_t bytes = scores_lds_bytes(NSA_HIP_MFMA_ROWS, NSA_HIP_MFMA_KEYS, ldq, (int)psum, 1);
        if (bytes > budget) return -1;
        out->rows = NSA_HIP_MFMA_ROWS;
        out->keys = NSA_HIP_MFMA_KEYS;
        out->head_chunks = (int)((dm->G + NSA_HIP_MFMA_ROWS - 1) / NSA_HIP_MFMA_ROWS);
        out->sel_chunk = (int)jc;
        out->psum_len = (int)psum;
        out->dpad = round_up(dm->Dqk, 4);
        out->ldq = ldq;
        out->mfma = 1;
        out->lds_bytes = bytes;
        return 0;
    }
    int R = (int)nsa_min64(dm->G, NSA_HIP_MAX_ROWS);
    for (;;) {
        int tk = 32;
        while (tk > 8 && tk * R > NSA_HIP_THREADS) tk /= 2;
        for (; tk >= 1; tk /= 2) {
            size_t bytes = scores_lds_bytes(R, tk, (int)dm->Dqk + 1, (int)psum, 0);
            if (bytes <= budget) {
                out->rows = R;
                out->keys = tk;
                out->head_chunks = (int)((dm->G + R - 1) / R);
                out->sel_chunk = (int)jc;
                out->psum_len = (int)psum;
                out->dpad = (int)dm->Dqk;
                out->ldq = (int)dm->Dqk + 1;
                out->mfma = 0;
                out->lds_bytes = bytes;
                return 0;
            }
        }
        if (R == 1) return -1;
        R = (R + 1) / 2;
    }
}

#define NSA_HIP_TOKENS_PER_LAUNCH ((int64_t)1 << 23)

template <typename T>
static void scores_launch(dim3 grid, hipStream_t stream, const nsa_hip_dims &dm, const nsa_hip_tile &tl, int64_t t0,
                          nsa_hip_tensor q, nsa_hip_tensor kc, nsa_hip_tensor lse, nsa_hip_tensor scores)
{
    if (tl.mfma)
        nsa_hip_scores_kernel<T, true><<<grid, NSA_HIP_THREADS, tl.lds_bytes, stream>>>(dm, tl, t0, q, kc, lse, scores);
    else
        nsa_hip_scores_kernel<T, false><<<grid, NSA_HIP_THREADS, tl.lds_bytes, stream>>>(dm, tl, t0, q, kc, lse, scores);
}

hipError_t nsa_hip_block_scores(const nsa_hip_dims *dm, const nsa_hip_tile *tile, nsa_hip_tensor q,
                                nsa_hip_tensor kc, nsa_hip_tensor lse, nsa_hip_tensor scores, hipStream_t stream)
{
    for (int64_t t0 = 0; t0 < dm->T; t0 += NSA_HIP_TOKENS_PER_LAUNCH) {
        dim3 grid((unsigned)nsa_min64(dm->T - t0, NSA_HIP_TOKENS_PER_LAUNCH), (unsigned)dm->Hkv);
        if (dm->dtype == NSA_DT_F16)
            scores_launch<nsa_f16_s>(grid, stream, *dm, *tile, t0, q, kc, lse, scores);
        else if (dm->dtype == NSA_DT_BF16)
            scores_launch<nsa_bf16_s>(grid, stream, *dm, *tile, t0, q, kc, lse, scores);
        else
            scores_launch<float>(grid, stream, *dm, *tile, t0, q, kc, lse, scores);
        hipError_t e = hipGetLastError();
        if (e != hipSuccess) return e;
    }
    return hipSuccess;
}
