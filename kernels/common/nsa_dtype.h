/*
 * nsa_dtype.h -- storage types of the tensors (f32, f16, bf16) for CUDA and HIP
 * device code: load as fp32, store from fp32 with round-to-nearest-even.
 *
 * Arithmetic is always fp32 on GPUs (docs/nsa-semantics.md, section 7); the
 * 16-bit types only exist in memory. They are plain structs around the raw
 * bits so that a kernel can be templated on the storage type (float,
 * nsa_f16_s, nsa_bf16_s) without depending on the vendor's half/bfloat16
 * classes, which differ between CUDA, ROCm releases and compilers.
 *
 *   float nsa_ld(const T *p)        element -> fp32
 *   void  nsa_st(T *p, float v)     fp32 -> element (RNE; NaN stays NaN)
 *
 * f16 conversion uses the vendor intrinsics (__half2float, __float2half_rn),
 * which are spelled the same in CUDA and HIP; bf16 is pure bit arithmetic.
 * The dtype numbers match enum nsa_dtype of include/nsa.h (F32 = 0, F16 = 1,
 * BF16 = 2), which this header does not include.
 */
#ifndef NSA_KERNELS_COMMON_NSA_DTYPE_H
#define NSA_KERNELS_COMMON_NSA_DTYPE_H

#include <stdint.h>

#if defined(__HIP__) || defined(__HIPCC__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#elif defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#define NSA_DT_F32 0
#define NSA_DT_F16 1
#define NSA_DT_BF16 2

#define NSA_DEV __device__ __forceinline__

/* IEEE binary16 and bfloat16 as raw bits. */
struct nsa_f16_s {
    unsigned short x;
};
struct nsa_bf16_s {
    unsigned short x;
};

NSA_DEV float nsa_ld(const float *p) { return *p; }
NSA_DEV float nsa_ld(const nsa_f16_s *p) { return __half2float(__ushort_as_half(p->x)); }
NSA_DEV float nsa_ld(const nsa_bf16_s *p) { return __uint_as_float((unsigned)p->x << 16); }

NSA_DEV void nsa_st(float *p, float v) { *p = v; }
NSA_DEV void nsa_st(nsa_f16_s *p, float v) { p->x = __half_as_ushort(__float2half_rn(v)); }
NSA_DEV void nsa_st(nsa_bf16_s *p, float v)
{
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) { /* NaN: keep it a (quiet) NaN */
        p->x = (unsigned short)(((u >> 16) & 0x8000u) | 0x7fc0u);
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    p->x = (unsigned short)(u >> 16);
}

#endif /* NSA_KERNELS_COMMON_NSA_DTYPE_H */
