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
 * Two paths, one kernel template (MFMA = false / true):
 *   1. portable: plain fp32 FMAs, no wave-level intrinsics, right for any wave
 *      size (wave32 RDNA and wave64 CDNA). Tile: up to 32 heads x 8..32 keys.
 *   2. matrix cores (CDNA): the score tile and the P V update through
 *      v_mfma_f32_16x16x4f32 (mfma.h), fp32 in and out. Tile: 16 heads (zero
 *      padded) x 16 keys, Dv in chunks of up to 256. The softmax statistics
 *      are the same code as in 1.
 * The backend picks 2 on gfx908/gfx90a/gfx94x unless NSA_HIP_NO_MFMA=1.
 * Neither has been timed: no AMD GPU was available when they were written
 * (see backends/hip/README.md for how to measure and compare them).
 */
#include <string.h>

#include "mfma.h"

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

template <typename TQ, typename TKV, int KIND, bool MFMA>
__global__ void __launch_bounds__(NSA_HIP_THREADS)
    nsa_hip_attn_kernel(nsa_hip_dims dm, nsa_hip_tile tl, int64_t t0, nsa_hip_tensor q, nsa_hip_tensor k,
                        nsa_hip_tensor v, nsa_hip_tensor idx, nsa_hip_tensor o, nsa_hip_tensor lse)
{
    extern __shared__ int64_t nsa_lds[];
    const int tid = threadIdx.x;
    const int R = tl.rows, TK = tl.keys, DVC = tl.dv_chunk;
    const int ldq = tl.ldq, ldv = tl.ldv, dpad = tl.dpad, ldp = TK + 1;

    const int64_t t = t0 + blockIdx.x;
    const int64_t g = blockIdx.y / tl.head_chunks;
    const int64_t hc = blockIdx.y % tl.head_chunks;
    const int64_t h0 = g * dm.G + hc * R;
    const int rows = (int)nsa_min64(R, dm.G - hc * R);
    const int64_t e0 = (int64_t)blockIdx.z * DVC;
    const int dvc = (int)nsa_min64(DVC, dm.Dv - e0);
    const int vpad = MFMA ? (dvc + 15) / 16 * 16 : dvc; /* value columns in LDS */

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

    /* LDS: krow[TK] int64 | Qs[R][ldq] | Ks[TK][ldq] | Vs[TK][ldv] | Ps[R][ldp] | m, l, alpha [R]
     *      | (MFMA) 4 x 256 floats of partial score tiles */
    int64_t *krow = nsa_lds;
    float *Qs = (float *)(krow + TK);
    float *Ks = Qs + R * ldq;
    float *Vs = Ks + TK * ldq;
    float *Ps = Vs + TK * ldv;
    float *m_r = Ps + R * ldp;
    float *l_r = m_r + R;
    float *a_r = l_r + R;
    float *part = a_r + R;

    nsa_hip_load_q<TQ>(Qs, ldq, q, t, h0, rows, R, dm.Dqk, dpad, dm.scale_log2);
    if (tid < R) {
        m_r[tid] = nsa_neg_inf();
        l_r[tid] = 0.0f;
    }
    float acc[MFMA ? 1 : NSA_HIP_ACC];
    nsa_f32x4 acc4[MFMA ? NSA_HIP_MFMA_TILES : 1];
#pragma unroll
    for (int j = 0; j < (MFMA ? 1 : NSA_HIP_ACC); j++) acc[j] = 0.0f;
#pragma unroll
    for (int j = 0; j < (MFMA ? NSA_HIP_MFMA_TILES : 1); j++) acc4[j] = nsa_f32x4_zero();

    for (int64_t k0 = 0; k0 < nkeys; k0 += TK) {
        const int nk = (int)nsa_min64(TK, nkeys - k0);
        if (KIND == NSA_HIP_SLC && !nsa_hip_slc_chunk_live(dm.ls, k0, nk, tq, sel)) continue;
        if (tid < TK) krow[tid] = tid < nk ? nsa_hip_key_row<KIND>(dm, k0 + tid, nkeys, base, tq, sel) : -1;
        __syncthreads();
        nsa_hip_load_keys<TKV>(Ks, ldq, k, krow, TK, g, 0, (int)dm.Dqk, dpad);
        nsa_hip_load_keys<TKV>(Vs, ldv, v, krow, TK, g, e0, dvc, vpad);
        __syncthreads();
        if (MFMA) {
            nsa_hip_score_tile_mfma(Ps, ldp, Qs, Ks, ldq, krow, dpad, part);
        } else {
            nsa_hip_score_tile(Ps, ldp, Qs, ldq, Ks, ldq, krow, R, TK, dpad);
            __syncthreads();
        }
        nsa_hip_softmax_step(Ps, ldp, R, rows, TK, m_r, l_r, a_r);
        __syncthreads();
        if (MFMA)
            nsa_hip_pv_mfma(acc4, Ps, ldp, Vs, ldv, vpad, a_r);
        else
            nsa_hip_pv_step(acc, Ps, ldp, Vs, ldv, a_r, rows, DVC, dvc, TK);
        /* the next chunk rewrites krow only (Ks/Vs/Ps after its first barrier) */
    }
    __syncthreads();

    float *out = (float *)o.ptr + t * o.st + h0 * o.sh + e0;
    if (MFMA) {
        const int lane = tid % 64, wave = tid / 64, col = lane % 16, kq = lane / 16;
#pragma unroll
        for (int j = 0; j < (MFMA ? NSA_HIP_MFMA_TILES : 1); j++) {
            const int c = (wave + 4 * j) * 16 + col;
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int i = 4 * kq + r; /* D[i][col] */
                if (i < rows && c < dvc) {
                    float l = l_r[i];
                    out[i * o.sh + c] = l != 0.0f ? acc4[j][r] / l : 0.0f;
                }
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < (MFMA ? 1 : NSA_HIP_ACC); j++) {
            int e = tid + j * NSA_HIP_THREADS;
            int r = e / DVC, c = e - r * DVC;
            if (r < rows && c < dvc) {
                float l = l_r[r];
                out[r * o.sh + c] = l != 0.0f ? acc[j] / l : 0.0f;
            }
        }
    }
    if (lse.ptr && blockIdx.z == 0 && tid < rows) {
        float l = l_r[tid];
        ((float *)lse.ptr)[t * lse.st + (h0 + tid) * lse.sh] =
            l != 0.0f ? (m_r[tid] + log2f(l)) * NSA_LN2 : nsa_neg_inf();
    }
}

/* ------------------------------------------------------------ host side */

static int round_up(int64_t x, int64_t m) { return (int)((x + m - 1) / m * m); }

static size_t attn_lds_bytes(int R, int TK, int ldq, int ldv, int mfma)
{
    size_t floats = (size_t)R * ldq + (size_t)TK * ldq + (size_t)TK * ldv + (size_t)R * (TK + 1) + 3 * (size_t)R;
    if (mfma) floats += 4 * 256;
    return (size_t)TK * sizeof(int64_t) + floats * sizeof(float);
}

static int pow2_keys(int R)
{
    int tk = 32; /* rows * keys ~ one score per thread */
    while (tk > 8 && tk * R > NSA_HIP_THREADS) tk /= 2;
    return tk;
}

int nsa_hip_attn_tile(const nsa_hip_dims *dm, size_t budget, int mfma, nsa_hip_tile *out)
{
    memset(out, 0, sizeof *out);
    if (mfma) { /* fixed 16 x 16 tile; Dv in chunks of up to 256 columns */
        int DVC = (int)nsa_min64(dm->Dv, NSA_HIP_MFMA_MAX_DV);
        int ldq = round_up(dm->Dqk, 32) + 2, ldv = round_up(DVC, 32) + 16; /* conflict-free MFMA operand reads */
        size_t bytes = attn_lds_bytes(NSA_HIP_MFMA_ROWS, NSA_HIP_MFMA_KEYS, ldq, ldv, 1);
        if (bytes > budget) return -1;
        out->rows = NSA_HIP_MFMA_ROWS;
        out->keys = NSA_HIP_MFMA_KEYS;
        out->dv_chunk = DVC;
        out->head_chunks = (int)((dm->G + NSA_HIP_MFMA_ROWS - 1) / NSA_HIP_MFMA_ROWS);
        out->dv_chunks = (int)((dm->Dv + DVC - 1) / DVC);
        out->dpad = round_up(dm->Dqk, 4);
        out->ldq = ldq;
        out->ldv = ldv;
        out->mfma = 1;
        out->lds_bytes = bytes;
        return 0;
    }
    int R = (int)nsa_min64(dm->G, NSA_HIP_MAX_ROWS);
    for (;;) {
        int DVC = (int)nsa_min64(dm->Dv, (NSA_HIP_THREADS * NSA_HIP_ACC) / R);
        int ldq = (int)dm->Dqk + 1; /* odd: conflict-free column walks */
        for (int TK = pow2_keys(R); TK >= 1; TK /= 2) {
            size_t bytes = attn_lds_bytes(R, TK, ldq, DVC, 0);
            if (bytes <= budget) {
                out->rows = R;
                out->keys = TK;
                out->dv_chunk = DVC;
                out->head_chunks = (int)((dm->G + R - 1) / R);
                out->dv_chunks = (int)((dm->Dv + DVC - 1) / DVC);
                out->dpad = (int)dm->Dqk;
                out->ldq = ldq;
                out->ldv = DVC;
                out->mfma = 0;
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

template <typename T, bool MFMA>
static void attn_launch(int kind, dim3 grid, size_t lds, hipStream_t stream, const nsa_hip_dims &dm,
                        const nsa_hip_tile &tl, int64_t t0, nsa_hip_tensor q, nsa_hip_tensor k, nsa_hip_tensor v,
                        nsa_hip_tensor idx, nsa_hip_tensor o, nsa_hip_tensor lse)
{
    if (kind == NSA_HIP_CMP)
        nsa_hip_attn_kernel<T, float, NSA_HIP_CMP, MFMA>
            <<<grid, NSA_HIP_THREADS, lds, stream>>>(dm, tl, t0, q, k, v, idx, o, lse);
    else if (kind == NSA_HIP_SLC)
        nsa_hip_attn_kernel<T, T, NSA_HIP_SLC, MFMA>
            <<<grid, NSA_HIP_THREADS, lds, stream>>>(dm, tl, t0, q, k, v, idx, o, lse);
    else
        nsa_hip_attn_kernel<T, T, NSA_HIP_WIN, MFMA>
            <<<grid, NSA_HIP_THREADS, lds, stream>>>(dm, tl, t0, q, k, v, idx, o, lse);
}

template <typename T>
static void attn_launch_path(int kind, dim3 grid, hipStream_t stream, const nsa_hip_dims &dm,
                             const nsa_hip_tile &tl, int64_t t0, nsa_hip_tensor q, nsa_hip_tensor k,
                             nsa_hip_tensor v, nsa_hip_tensor idx, nsa_hip_tensor o, nsa_hip_tensor lse)
{
    if (tl.mfma)
        attn_launch<T, true>(kind, grid, tl.lds_bytes, stream, dm, tl, t0, q, k, v, idx, o, lse);
    else
        attn_launch<T, false>(kind, grid, tl.lds_bytes, stream, dm, tl, t0, q, k, v, idx, o, lse);
}

hipError_t nsa_hip_attention(const nsa_hip_dims *dm, int kind, const nsa_hip_tile *tile, nsa_hip_tensor q,
                             nsa_hip_tensor k, nsa_hip_tensor v, nsa_hip_tensor idx, nsa_hip_tensor o,
                             nsa_hip_tensor lse, hipStream_t stream)
{
    for (int64_t t0 = 0; t0 < dm->T; t0 += NSA_HIP_TOKENS_PER_LAUNCH) {
        dim3 grid((unsigned)nsa_min64(dm->T - t0, NSA_HIP_TOKENS_PER_LAUNCH),
                  (unsigned)(dm->Hkv * tile->head_chunks), (unsigned)tile->dv_chunks);
        if (dm->dtype == NSA_DT_F16)
            attn_launch_path<nsa_f16_s>(kind, grid, stream, *dm, *tile, t0, q, k, v, idx, o, lse);
        else if (dm->dtype == NSA_DT_BF16)
            attn_launch_path<nsa_bf16_s>(kind, grid, stream, *dm, *tile, t0, q, k, v, idx, o, lse);
        else
            attn_launch_path<float>(kind, grid, stream, *dm, *tile, t0, q, k, v, idx, o, lse);
        hipError_t e = hipGetLastError();
        if (e != hipSuccess) return e;
    }
    return hipSuccess;
}
