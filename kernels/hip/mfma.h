/*
 * mfma.h -- the matrix-core (MFMA) versions of the two small matrix products
 * of the attention and block-score kernels, for CDNA GPUs (gfx908 MI100,
 * gfx90a MI200, gfx94x MI300), which run wave64 only.
 *
 * Instruction: v_mfma_f32_16x16x4f32, D[16][16] = A[16][4] B[4][16] + C in
 * fp32 (inputs stay fp32: the same numbers as the portable path, only the
 * summation order inside a 4-term step differs). Register layout (one wave
 * of 64 lanes, no CBSZ/ABID/BLGP; AMD Matrix Instruction Calculator):
 *   A[i][k]  lane 16 k + i          B[k][j]  lane 16 k + j
 *   D[i][j]  lane 16 (i / 4) + j, element i % 4 of the 4-float result
 *
 * Tiles (block = 4 waves): 16 query rows (heads, zero padded) x 16 keys.
 *   score tile  S = Q K^T over Dpad (a multiple of 4): wave w takes the
 *               4-column steps s = w, w + 4, ...; the 4 partial tiles are
 *               summed in wave order through LDS (deterministic).
 *   PV update   O[16][cols] = O * alpha + P[16][16] V[16][cols]: wave w owns
 *               the 16-column output tiles w, w + 4, ... (up to
 *               NSA_HIP_MFMA_TILES each) in registers.
 *
 * NSA_HIP_NO_MFMA=1 in the environment makes the backend use the portable
 * kernels instead (see backends/hip/README.md).
 */
#ifndef NSA_KERNELS_HIP_MFMA_H
#define NSA_KERNELS_HIP_MFMA_H

#include "tile.h"

#define NSA_HIP_MFMA_ROWS 16
#define NSA_HIP_MFMA_KEYS 16
#define NSA_HIP_MFMA_TILES 4 /* 16-column output tiles per wave: Dv chunk <= 4 * 4 * 16 = 256 */
#define NSA_HIP_MFMA_MAX_DV (4 * NSA_HIP_MFMA_TILES * 16)

#if defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
#define NSA_HIP_HAS_MFMA 1
#else
#define NSA_HIP_HAS_MFMA 0
#endif

/* The MFMA tiles map lanes 0..63 of one wave: CDNA runs wave64 only. */
#if NSA_HIP_HAS_MFMA && defined(__AMDGCN_WAVEFRONT_SIZE) && __AMDGCN_WAVEFRONT_SIZE != 64
#error "the MFMA kernels need wave64"
#endif

#ifndef NSA_HIP_MFMA_EMULATED /* a test build may supply both names (emulating the instruction) */
typedef float nsa_f32x4 __attribute__((ext_vector_type(4)));

NSA_DEV nsa_f32x4 nsa_mfma_16x16x4(float a, float b, nsa_f32x4 c)
{
#if NSA_HIP_HAS_MFMA
    return __builtin_amdgcn_mfma_f32_16x16x4f32(a, b, c, 0, 0, 0);
#else
    (void)a; /* never launched on targets without matrix cores */
    (void)b;
    return c;
#endif
}
#endif

NSA_DEV nsa_f32x4 nsa_f32x4_zero(void)
{
    nsa_f32x4 z;
    z[0] = z[1] = z[2] = z[3] = 0.0f;
    return z;
}

/* Ss[i][k] (row stride lds) = Qs[i] . Ks[k] over dpad columns, or -inf where
 * krow[k] < 0. part: 4 * 256 floats of LDS scratch. Ends with a barrier. */
NSA_DEV void nsa_hip_score_tile_mfma(float *Ss, int lds, const float *Qs, const float *Ks, int ldq,
                                     const int64_t *krow, int dpad, float *part)
{
    const int lane = threadIdx.x % 64, wave = threadIdx.x / 64;
    const int row = lane % 16, kq = lane / 16;
    nsa_f32x4 acc = nsa_f32x4_zero();
    for (int s = wave; s < dpad / 4; s += 4) {
        int c = 4 * s + kq;
        acc = nsa_mfma_16x16x4(Qs[row * ldq + c], Ks[row * ldq + c], acc); /* A = Q, B = K^T */
    }
    float *mine = part + wave * 256;
#pragma unroll
    for (int r = 0; r < 4; r++) mine[(4 * kq + r) * 16 + row] = acc[r]; /* D[i][j], i = 4 kq + r, j = row */
    __syncthreads();
    {
        const int i = threadIdx.x / 16, k = threadIdx.x % 16; /* 256 threads: one (i, k) each */
        float s = part[i * 16 + k] + part[256 + i * 16 + k];
        s += part[512 + i * 16 + k];
        s += part[768 + i * 16 + k];
        Ss[i * lds + k] = krow[k] >= 0 ? s : nsa_neg_inf();
    }
    __syncthreads();
}

/* acc[t] (tile w + 4 t of this wave) = acc * alpha[row] + P V for the 16 keys.
 * Ps [16][ldp], Vs [16][ldv] with ncols (a multiple of 16) columns. */
NSA_DEV void nsa_hip_pv_mfma(nsa_f32x4 *acc, const float *Ps, int ldp, const float *Vs, int ldv, int ncols,
                             const float *alpha)
{
    const int lane = threadIdx.x % 64, wave = threadIdx.x / 64;
    const int col = lane % 16, kq = lane / 16;
#pragma unroll
    for (int t = 0; t < NSA_HIP_MFMA_TILES; t++) {
        const int c0 = (wave + 4 * t) * 16;
        if (c0 >= ncols) break;
        nsa_f32x4 a = acc[t];
#pragma unroll
        for (int r = 0; r < 4; r++) a[r] *= alpha[4 * kq + r];
#pragma unroll
        for (int s = 0; s < 4; s++) { /* keys 4 s .. 4 s + 3 */
            int k = 4 * s + kq;
            a = nsa_mfma_16x16x4(Ps[col * ldp + k], Vs[k * ldv + c0 + col], a); /* A[i][k] = P, B[k][j] = V */
        }
        acc[t] = a;
    }
}

#endif /* NSA_KERNELS_HIP_MFMA_H */
