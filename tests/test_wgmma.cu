/*
 * test_wgmma.cu -- the warpgroup MMA layouts of kernels/cuda/wgmma.cuh against
 * a CPU product, on the device (sm_90 with the module's sm_90a code).
 *
 * The parity suite checks the wgmma kernels end to end; this test pins down
 * the pieces they are built from, so that a change to a descriptor, the
 * swizzle or a fragment layout fails here with the product that broke:
 *   ss<N>  D (64 x N) = A (64 x 128) B^T, both K-major in 128-byte-swizzled
 *          shared memory (attn_sm90's and scores_sm90's S = Q K^T), N = 32, 64, 128;
 *   rs<N>  D (64 x N) = P (64 x 64, registers) V (64 x N, MN-major, the
 *          transposed descriptor), N = 64, 128 (attn_sm90's O += P V).
 * Inputs are fresh pseudo-random bf16 values, outputs are poisoned with NaN
 * first, and every output element is compared (fp32 accumulation of exact
 * bf16 products: the tolerance is a few fp32 ulps of the sum of |terms|).
 *
 * Exit status: 0 pass, 1 fail, 77 skipped (no CUDA device, not sm_90, or a
 * build without sm_90a code: nvcc_archs without 90a).
 */
#include "wgmma.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace nsa_cuda;
typedef __nv_bfloat16 bf16;

constexpr int M = 64, K = 128, KP = 64, NMAX = 128;

__global__ void probe(int *out)
{
#ifdef NSA_WGMMA
    *out = 1;
#else
    *out = 0;
#endif
}

/* Stores a warpgroup accumulator (m64nN) row-major into D (64 x N). */
template <int N> __device__ void store_acc(float *D, const float (&d)[N / 8][4])
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < N / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            D[(warp * 16 + (lane >> 2) + 8 * (e >> 1)) * N + j * 8 + 2 * (lane & 3) + (e & 1)] = d[j][e];
}

/* A (64 x 128) and B (N x 128) row-major into swizzled shared memory; D = A B^T. */
template <int N> __global__ void ss_kernel(const bf16 *A, const bf16 *B, float *D)
{
#ifdef NSA_WGMMA
    __shared__ __align__(1024) unsigned char sA[M * K * 2], sB[NMAX * K * 2];
    for (int i = threadIdx.x; i < M * K / 8; i += 128) {
        const int r = i / (K / 8), c = i % (K / 8);
        *(uint4 *)(sA + sw128_off(r, c, M)) = *(const uint4 *)(A + r * K + c * 8);
    }
    for (int i = threadIdx.x; i < N * K / 8; i += 128) {
        const int r = i / (K / 8), c = i % (K / 8);
        *(uint4 *)(sB + sw128_off(r, c, N)) = *(const uint4 *)(B + r * K + c * 8);
    }
    fence_async_smem();
    __syncthreads();
    float d[N / 8][4];
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++)
        wg_ss<bf16, N>(d, sw128_desc(smem_u32(sA) + (kk >> 2) * M * 128 + (kk & 3) * 32, 16),
                       sw128_desc(smem_u32(sB) + (kk >> 2) * N * 128 + (kk & 3) * 32, 16), kk > 0);
    wg_commit();
    wg_wait<0>();
    wg_hold(d);
    store_acc<N>(D, d);
#endif
}

/* P (64 x 64) row-major, taken into A fragments; V (64 x N) row-major into
 * swizzled shared memory (MN-major); D = P V. */
template <int N> __global__ void rs_kernel(const bf16 *P, const bf16 *V, float *D)
{
#ifdef NSA_WGMMA
    __shared__ __align__(1024) unsigned char sV[KP * NMAX * 2];
    for (int i = threadIdx.x; i < KP * N / 8; i += 128) {
        const int r = i / (N / 8), c = i % (N / 8);
        *(uint4 *)(sV + sw128_off(r, c, KP)) = *(const uint4 *)(V + r * N + c * 8);
    }
    fence_async_smem();
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g0 = warp * 16 + (lane >> 2), c2 = 2 * (lane & 3);
    auto pair = [&](int row, int col) {
        uint32_t lo = *(const unsigned short *)(P + row * KP + col), hi = *(const unsigned short *)(P + row * KP + col + 1);
        return lo | (hi << 16);
    };
    float d[N / 8][4];
#pragma unroll
    for (int j = 0; j < N / 8; j++) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.f;
    uint32_t a[KP / 16][4];
#pragma unroll
    for (int kk = 0; kk < KP / 16; kk++) {
        a[kk][0] = pair(g0, kk * 16 + c2);
        a[kk][1] = pair(g0 + 8, kk * 16 + c2);
        a[kk][2] = pair(g0, kk * 16 + c2 + 8);
        a[kk][3] = pair(g0 + 8, kk * 16 + c2 + 8);
    }
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < KP / 16; kk++) wg_rs<bf16, N>(d, a[kk], sw128_desc(smem_u32(sV) + kk * 16 * 128, KP * 128));
    wg_commit();
    wg_wait<0>();
    wg_hold(d);
    store_acc<N>(D, d);
#endif
}

static uint32_t rng = 12345u;
static float urand()
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffff) / 65536.0f - 0.5f;
}
static void fill(std::vector<bf16> &h, std::vector<float> &f, size_t n)
{
    h.resize(n);
    f.resize(n);
    for (size_t i = 0; i < n; i++) f[i] = __bfloat162float(h[i] = __float2bfloat16(urand()));
}

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "test_wgmma: %s: %s\n", #x, cudaGetErrorString(e_));                               \
            return 1;                                                                                          \
        }                                                                                                      \
    } while (0)

/* max over elements of |got - ref| / (2^-18 * sum |terms| + 1e-30); > 1 fails */
static int compare(const char *name, const std::vector<float> &got, const std::vector<double> &ref,
                   const std::vector<double> &mag)
{
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double r = std::fabs((double)got[i] - ref[i]) / (std::ldexp(mag[i], -18) + 1e-30);
        if (!(r <= worst)) { /* NaN (an unwritten element) counts as worst */
            worst = std::isnan(r) ? INFINITY : r;
            at = i;
        }
    }
    const bool ok = worst <= 1.0;
    printf("%s %s: worst error %.3g of tolerance (element %zu)\n", ok ? "PASS" : "FAIL", name, worst, at);
    return ok ? 0 : 1;
}

/* Fresh inputs a (na values) and b (nb values) on the device, D poisoned,
 * launch(), then D (64 x N) against sum_k a[ai(i, k)] * b[bi(k, j)], k < kd. */
template <typename Launch, typename AIdx, typename BIdx>
static int check(const char *name, int N, int kd, size_t na, size_t nb, bf16 *dA, bf16 *dB, float *dD,
                 Launch launch, AIdx ai, BIdx bi)
{
    std::vector<bf16> ha, hb;
    std::vector<float> fa, fb;
    fill(ha, fa, na);
    fill(hb, fb, nb);
    CK(cudaMemcpy(dA, ha.data(), na * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, hb.data(), nb * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dD, 0xff, (size_t)M * N * 4)); /* NaN */
    launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> got((size_t)M * N);
    CK(cudaMemcpy(got.data(), dD, got.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<double> ref(got.size()), mag(got.size());
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, m = 0;
            for (int k = 0; k < kd; k++) {
                const double t = (double)fa[ai(i, k)] * fb[bi(k, j)];
                s += t;
                m += std::fabs(t);
            }
            ref[(size_t)i * N + j] = s;
            mag[(size_t)i * N + j] = m;
        }
    return compare(name, got, ref, mag);
}

template <int N> static int run_ss(bf16 *dA, bf16 *dB, float *dD)
{
    char name[64];
    snprintf(name, sizeof name, "ss m64n%dk16 (K-major A, B)", N);
    return check(
        name, N, K, (size_t)M * K, (size_t)N * K, dA, dB, dD, [&] { ss_kernel<N><<<1, 128>>>(dA, dB, dD); },
        [](int i, int k) { return i * K + k; }, [](int k, int j) { return j * K + k; });
}

template <int N> static int run_rs(bf16 *dP, bf16 *dV, float *dD)
{
    char name[64];
    snprintf(name, sizeof name, "rs m64n%dk16 (registers A, MN-major B)", N);
    return check(
        name, N, KP, (size_t)M * KP, (size_t)KP * N, dP, dV, dD, [&] { rs_kernel<N><<<1, 128>>>(dP, dV, dD); },
        [](int i, int k) { return i * KP + k; }, [](int k, int j) { return k * N + j; });
}

int main()
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    if (p.major != 9) {
        printf("SKIP: %s is sm_%d%d; wgmma needs sm_90\n", p.name, p.major, p.minor);
        return 77;
    }
    int *dflag = nullptr, has = 0;
    CK(cudaMalloc(&dflag, sizeof(int)));
    probe<<<1, 1>>>(dflag);
    CK(cudaMemcpy(&has, dflag, sizeof(int), cudaMemcpyDeviceToHost));
    CK(cudaFree(dflag));
    if (!has) {
        printf("SKIP: this build has no sm_90a code (nvcc_archs without 90a)\n");
        return 77;
    }
    bf16 *dA, *dB;
    float *dD;
    CK(cudaMalloc(&dA, (size_t)M * K * 2));
    CK(cudaMalloc(&dB, (size_t)NMAX * K * 2));
    CK(cudaMalloc(&dD, (size_t)M * NMAX * 4));
    int fails = run_ss<32>(dA, dB, dD) + run_ss<64>(dA, dB, dD) + run_ss<128>(dA, dB, dD);
    fails += run_rs<64>(dA, dB, dD) + run_rs<128>(dA, dB, dD);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dD);
    printf("test_wgmma: %d of 5 products failed\n", fails);
    return fails ? 1 : 0;
}
