/*
 * bwd_f16.cu -- the f16 operands of the backward's keys kernels in a bf16
 * call (semantics section 9, "Operands of the keys products"; docs/cuda.md).
 *
 * In bf16 the keys kernels' products dv += (g p)^T dO and dk += dS^T Q would
 * each take two MMAs (g p and dS split into hi + lo: warp_pv_exact says why
 * one bf16 rounding fails the corpus). An f16 operand has 11 significant
 * bits, enough on its own, but the other operand must then be f16 too. A
 * bf16 value (8 significant bits) times a power of two is exactly an f16
 * where it lands in [2^-17, 65504], so each tensor the keys kernels read
 * (q, dO, and the branch's keys and values) is scaled by a power of two from
 * its largest magnitude and converted:
 *   q, keys   largest below 2^15 (exponents a, b): S' = 2^(a+b) S, undone
 *             in the logit scale;
 *   dO        largest below 2^5 (c);
 *   values    largest below 2^10 / (max|g| Dv scale) (d), so that
 *             |scale dS'| <= 2 max|g| Dv 2^5 max|v'| scale stays below 2^15;
 *   gate      g p scaled by 2^-f where max|g| reaches 2^14.
 * The keys kernels then use lmul = 2^-(a+b) on the logits, emul = 2^(c+d) on
 * delta (the rows kernels' g dg, in true units), gmul = 2^-f on g p, and
 * multiply dk by 2^-(a+c+d) and dv by 2^(f-c) before adding them to the
 * accumulators. Every factor is a power of two, so the only roundings that
 * differ from the bf16 kernels are g p and scale dS to f16 (where a value of
 * a tensor lies below 2^-17 of the scaled range its low bits are lost: at
 * most 2^-25 in scaled units, about 2^-40 of the tensor's largest element).
 * Where an exponent would leave [-40, 40] (a tensor's largest magnitude
 * beyond about 2^55 or below 2^-25) or a maximum is not finite, the scale
 * block says so (use = 0) and the bf16 keys kernels run instead: both are
 * queued, each reads `use` and one returns at once, so nothing is read back
 * on the host.
 *
 * The maxima are atomicMax of |x|'s bits (order-free: the result is the same
 * whatever the order), so the copies and the gradients stay bitwise
 * reproducible.
 */
#include <math.h>

#include "nsa_cuda.cuh"
#include "nsa_cuda_kernels.h"

namespace nsa_cuda {

namespace {

constexpr int F16_EXP_MAX = 40;

template <typename S> NSA_DEV float src_abs(const S *p) { return fabsf(to_f(*p)); }

/* |x| bits of 8 consecutive dims (c8 .. c8 + 7, those < D) of pair (row, head) */
template <typename S>
__global__ void amax_kernel(const S *x, int64_t st, int64_t sh, int64_t rows, int64_t heads, int64_t D,
                            unsigned *out)
{
    const int64_t nc = (D + 7) / 8, n = rows * heads * nc;
    unsigned m = 0;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = e % nc, pr = e / nc, h = pr % heads, r = pr / heads;
        const S *p = x + r * st + h * sh + c * 8;
#pragma unroll
        for (int k = 0; k < 8; k++) /* unrolled: the 8 loads in flight at once */
            if (c * 8 + k < D) m = max(m, __float_as_uint(src_abs(p + k)));
    }
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0 && m) atomicMax(out, m);
}

/* dst [rows, heads, DP] f16 = x 2^ex[0], zero past D */
template <typename S>
__global__ void to_f16_kernel(const S *x, int64_t st, int64_t sh, int64_t rows, int64_t heads, int64_t D, int DP,
                              const int *ex, __half *dst)
{
    const int64_t nc = DP / 8, n = rows * heads * nc;
    const int s = *ex;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = e % nc, pr = e / nc, h = pr % heads, r = pr / heads;
        const S *p = x + r * st + h * sh + c * 8;
        __align__(16) __half v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = __float2half_rn(c * 8 + k < D ? ldexpf(to_f(p[k]), s) : 0.f);
        *(uint4 *)(dst + e * 8) = *(const uint4 *)v;
    }
}

/* the exponent that puts a largest magnitude m (bits) below 2^top; 0 for m = 0;
 * sets *ok = false where m is not finite or the exponent leaves the range */
NSA_DEV int exp_below(unsigned bits, int top, bool *ok)
{
    const float m = __uint_as_float(bits);
    if (!(m < INFINITY)) {
        *ok = false;
        return 0;
    }
    if (m == 0.f) return 0;
    int E;
    frexpf(m, &E); /* m < 2^E */
    const int s = top - E;
    if (s < -F16_EXP_MAX || s > F16_EXP_MAX) *ok = false;
    return s;
}

__global__ void scales_kernel(F16Scale *f, int stage, float scale, int64_t Dv)
{
    bool ok = true;
    if (stage == 0) { /* q and dO, for the call */
        f->ex[0] = exp_below(f->mx[0], 15, &ok);
        f->ex[1] = exp_below(f->mx[1], 5, &ok);
        f->qo_ok = ok ? 1 : 0;
        return;
    }
    ok = f->qo_ok != 0;
    const int a = f->ex[0], c = f->ex[1];
    const int b = exp_below(f->mx[2], 15, &ok);
    const float mg = __uint_as_float(f->mx[4]);
    if (!(mg < INFINITY)) ok = false;
    /* values: the largest below lim = 2^10 / (max|g| Dv scale), at most 2^15 */
    const double lim = fmin(32768.0, 1024.0 / ((double)fmaxf(mg, 0x1p-30f) * (double)Dv * (double)scale));
    int L;
    frexp(lim, &L); /* lim < 2^L: 2^(L-1) <= lim */
    const int d = exp_below(f->mx[3], L - 1, &ok);
    int Eg = 0;
    if (mg > 0.f && mg < INFINITY) frexpf(mg, &Eg);
    const int fg = Eg > 14 ? Eg - 14 : 0;
    if (fg > F16_EXP_MAX) ok = false;
    f->ex[2] = b;
    f->ex[3] = d;
    float *k = f->ks;
    k[KS_LMUL] = ldexpf(1.f, -(a + b));
    k[KS_EMUL] = ldexpf(1.f, c + d);
    k[KS_GMUL] = ldexpf(1.f, -fg);
    k[KS_DKMUL] = ldexpf(1.f, -(a + c + d));
    k[KS_DVMUL] = ldexpf(1.f, fg - c);
    k[KS_USE] = ok ? 1.f : 0.f;
}

unsigned grid_of(int64_t n)
{
    int64_t b = (n + 255) / 256;
    if (b > 65535 * 8) b = 65535 * 8;
    return (unsigned)(b > 0 ? b : 1);
}

} // namespace

cudaError_t f16_amax(bool fsrc, View x, int64_t rows, int64_t heads, int64_t D, unsigned *out, cudaStream_t s)
{
    const int64_t n = rows * heads * ((D + 7) / 8);
    if (n == 0 || !x.p) return cudaSuccess;
    if (fsrc)
        amax_kernel<float><<<grid_of(n), 256, 0, s>>>((const float *)x.p, x.st, x.sh, rows, heads, D, out);
    else
        amax_kernel<__nv_bfloat16><<<grid_of(n), 256, 0, s>>>((const __nv_bfloat16 *)x.p, x.st, x.sh, rows, heads, D,
                                                              out);
    return cudaGetLastError();
}

cudaError_t f16_scales(F16Scale *f, int stage, float scale, int64_t Dv, cudaStream_t s)
{
    scales_kernel<<<1, 1, 0, s>>>(f, stage, scale, Dv);
    return cudaGetLastError();
}

cudaError_t f16_convert(bool fsrc, View x, int64_t rows, int64_t heads, int64_t D, int DP, const int *ex, void *dst,
                        cudaStream_t s)
{
    const int64_t n = rows * heads * (DP / 8);
    if (n == 0 || !x.p) return cudaSuccess;
    if (fsrc)
        to_f16_kernel<float><<<grid_of(n), 256, 0, s>>>((const float *)x.p, x.st, x.sh, rows, heads, D, DP, ex,
                                                        (__half *)dst);
    else
        to_f16_kernel<__nv_bfloat16><<<grid_of(n), 256, 0, s>>>((const __nv_bfloat16 *)x.p, x.st, x.sh, rows, heads,
                                                                D, DP, ex, (__half *)dst);
    return cudaGetLastError();
}

} // namespace nsa_cuda
