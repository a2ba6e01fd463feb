/*
 * nsa_cuda.cuh -- device helpers every CUDA kernel of libnsa uses:
 * element types (f32 / f16 / bf16 as fp32 arithmetic), warp reductions,
 * the sm_80 tensor-core instructions (mma.sync m16n8k16, ldmatrix, cp.async),
 * and a small loader that moves a [rows][D] tile of a strided tensor into
 * shared memory (16-byte cp.async when aligned, element loads otherwise).
 *
 * Fragment layout of mma.m16n8k16 (g = lane / 4, c = lane % 4), used by every
 * tensor-core kernel here:
 *   A (16x16, row-major) a0: (g, 2c..2c+1)   a1: (g+8, 2c..)   a2: (g, 2c+8..)   a3: (g+8, 2c+8..)
 *   B (16x8,  "col")     b0: (k 2c..2c+1, n g)                 b1: (k 2c+8.., n g)
 *   C (16x8, fp32)       c0,c1: (g, 2c, 2c+1)                  c2,c3: (g+8, 2c, 2c+1)
 * so the C fragments of two neighbouring n-tiles form the A fragment of the
 * next product (P of softmax(QK^T) feeds PV straight from registers).
 */
#ifndef NSA_KERNELS_CUDA_NSA_CUDA_CUH
#define NSA_KERNELS_CUDA_NSA_CUDA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "nsa_blocks.h"

#define NSA_DEV __device__ __forceinline__
#define NSA_LOG2E 1.4426950408889634f
#define NSA_LN2 0.6931471805599453f

/* ------------------------------------------------------------ element types */

NSA_DEV float to_f(float x) { return x; }
NSA_DEV float to_f(__half x) { return __half2float(x); }
NSA_DEV float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> NSA_DEV T from_f(float x);
template <> NSA_DEV float from_f<float>(float x) { return x; }
template <> NSA_DEV __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> NSA_DEV __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/* 2^x with one MUFU.EX2 (flush-to-zero): exp2f adds a range fix-up of three
 * instructions per call so that results below 2^-126 come out subnormal; the
 * softmax loops do not need those (a probability under 2^-126 is 0 to every
 * sum it enters), and the fix-up was a visible share of their instructions. */
NSA_DEV float fast_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* ------------------------------------------------------------ warp reductions
 * xor butterflies: every lane ends with the bitwise same value (a + b == b + a),
 * and the order is fixed, so results are reproducible. */
NSA_DEV float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
NSA_DEV float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ------------------------------------------------------------ tensor cores */

template <typename T> struct Mma;

/* Mma<T> for a 16-bit type: run() is one mma.sync m16n8k16 (fp32 accumulate),
 * pack() puts two floats into one register, lo in the lower 16 bits (the lower
 * column index). The two types differ only in the PTX type name and the pair
 * conversion, hence one definition for both. */
#define NSA_MMA_16BIT(T, PTX_T, PAIR_T, CVT_PAIR)                                                               \
    template <> struct Mma<T> {                                                                                  \
        static NSA_DEV void run(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)                       \
        {                                                                                                        \
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_T "." PTX_T ".f32 "                       \
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                              \
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                        \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                        \
        }                                                                                                        \
        static NSA_DEV uint32_t pack(float lo, float hi)                                                         \
        {                                                                                                        \
            PAIR_T v = CVT_PAIR(lo, hi);                                                                         \
            return *reinterpret_cast<uint32_t *>(&v);                                                            \
        }                                                                                                        \
    };
NSA_MMA_16BIT(__nv_bfloat16, "bf16", __nv_bfloat162, __floats2bfloat162_rn)
NSA_MMA_16BIT(__half, "f16", __half2, __floats2half2_rn)
#undef NSA_MMA_16BIT

NSA_DEV uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* from a shared-memory address (a loop can keep it in a register and add constants) */
NSA_DEV void ldsm_x4_a(uint32_t r[4], uint32_t a)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
NSA_DEV void ldsm_x4(uint32_t r[4], const void *p) { ldsm_x4_a(r, smem_u32(p)); }
NSA_DEV void ldsm_x4_t(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

/* The transpose of an 8 x 8 16-bit matrix held as fragments (thread: row
 * lane / 4, columns 2 (lane % 4), + 1, the lower column in the lower half):
 * turns a C fragment's keys x rows into a B fragment's rows x keys. */
NSA_DEV uint32_t movm_t(uint32_t x)
{
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

/* 16-byte global -> shared copy; with pred false the 16 bytes are zero-filled
 * and nothing is read (src must still be a valid address expression). */
NSA_DEV void cp_async16_a(uint32_t dst, const void *src, bool pred) /* dst: a shared-memory address */
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0));
}
NSA_DEV void cp_async16(void *dst, const void *src, bool pred) { cp_async16_a(smem_u32(dst), src, pred); }
NSA_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> NSA_DEV void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* ------------------------------------------------------------ tile loader
 * Copies rows [0, ROWS) x dims [0, DP) of 16-bit elements into shared memory,
 * 16-byte chunk c of row r to dst(r, c) (8 elements). Row r comes from
 * src + roff(r) when valid(r), dims >= D and invalid rows are zero. vec:
 * every row start is 16-byte aligned and D % 8 == 0 (then cp.async), else
 * element loads. load_tile_by: thread tid of NT (a warp's lanes: NT 32);
 * load_tile_to: the CTA's threads; load_tile: the plain layout, row stride
 * SS elements. */
template <typename T, int ROWS, int DP, int NT, typename RowFn, typename DstFn>
NSA_DEV void load_tile_by(int tid, DstFn dst, const T *src, int64_t D, bool vec, RowFn rowoff)
{
    constexpr int CPR = DP / 8; /* 16-byte chunks per row */
    for (int idx = tid; idx < ROWS * CPR; idx += NT) {
        const int r = idx / CPR, c = idx % CPR;
        const int64_t off = rowoff(r); /* < 0: row absent */
        T *d = dst(r, c);
        if (vec) {
            const bool ok = off >= 0 && c * 8 < D;
            cp_async16(d, ok ? (const void *)(src + off + c * 8) : (const void *)src, ok);
        } else {
            union {
                uint4 u;
                T e[8];
            } buf;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int64_t dd = (int64_t)c * 8 + k;
                buf.e[k] = (off >= 0 && dd < D) ? src[off + dd] : from_f<T>(0.f);
            }
            *reinterpret_cast<uint4 *>(d) = buf.u;
        }
    }
}
/* the CTA's NT threads load the tile (load_tile_by with the thread index) */
template <typename T, int ROWS, int DP, int NT, typename RowFn, typename DstFn>
NSA_DEV void load_tile_to(DstFn dst, const T *src, int64_t D, bool vec, RowFn rowoff)
{
    load_tile_by<T, ROWS, DP, NT>((int)threadIdx.x, dst, src, D, vec, rowoff);
}
template <typename T, int ROWS, int DP, int SS, int NT, typename RowFn>
NSA_DEV void load_tile(T *s, const T *src, int64_t D, bool vec, RowFn rowoff)
{
    load_tile_to<T, ROWS, DP, NT>([&](int r, int c) { return s + r * SS + c * 8; }, src, D, vec, rowoff);
}

/* The fast case of load_tile for K/V tiles: row r (r < nvalid) comes from
 * base + r * rs, rows at or past nvalid and dims >= D are zero-filled. Needs
 * what load_tile's `vec` needs (16-byte aligned rows, D % 8 == 0) and
 * ROWS * rs < 2^31 (rs32_ok), so every offset is one 32-bit multiply-add:
 * v2 spent most of its issue slots on 64-bit address arithmetic here. */
template <typename T, int ROWS, int DP, int NT, typename DstFn>
NSA_DEV void load_rows_vec_to(DstFn dst, const T *base, int rs, int nvalid, int D)
{
    constexpr int CPR = DP / 8, N = ROWS * CPR;
#pragma unroll
    for (int i = 0; i < (N + NT - 1) / NT; i++) {
        const int idx = (int)threadIdx.x + i * NT;
        if (N % NT != 0 && idx >= N) break;
        const int r = idx / CPR, c = idx - (idx / CPR) * CPR;
        const bool ok = r < nvalid && c * 8 < D;
        cp_async16(dst(r, c), base + (ok ? r * rs + c * 8 : 0), ok);
    }
}
template <typename T, int ROWS, int DP, int SS, int NT>
NSA_DEV void load_rows_vec(T *s, const T *base, int rs, int nvalid, int D)
{
    load_rows_vec_to<T, ROWS, DP, NT>([&](int r, int c) { return s + r * SS + c * 8; }, base, rs, nvalid, D);
}

/* May a tile of `rows` rows with element stride rs use load_rows_vec? */
inline bool rs32_ok(int64_t rs, int rows) { return rs >= 0 && rs * (int64_t)(rows + 1) < ((int64_t)1 << 31); }

/* Runs the statement with T = float, __half or __nv_bfloat16 for dtype 0, 1, 2. */
#define NSA_DISPATCH_DTYPE(dt, T, ...)                                                                         \
    do {                                                                                                       \
        if ((dt) == 0) {                                                                                       \
            typedef float T;                                                                                   \
            __VA_ARGS__;                                                                                       \
        } else if ((dt) == 1) {                                                                                \
            typedef __half T;                                                                                  \
            __VA_ARGS__;                                                                                       \
        } else {                                                                                               \
            typedef __nv_bfloat16 T;                                                                           \
            __VA_ARGS__;                                                                                       \
        }                                                                                                      \
    } while (0)

/* Largest b in [0, B) with cu[b] <= x (cu non-decreasing, x < cu[B]). */
NSA_DEV int64_t find_seq(const int64_t *cu, int64_t B, int64_t x)
{
    int64_t lo = 0, hi = B - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (cu[mid] <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

#endif /* NSA_KERNELS_CUDA_NSA_CUDA_CUH */
