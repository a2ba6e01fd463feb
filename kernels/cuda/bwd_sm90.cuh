/*
 * bwd_sm90.cuh -- the wgmma pieces of the backward's sm90 kernels
 * (bwd_keys_sm90.cu, bwd_rows_sm90.cu): products whose A operand is a
 * probability or dS tile held in the accumulators, exact in bf16.
 */
#ifndef NSA_KERNELS_CUDA_BWD_SM90_CUH
#define NSA_KERNELS_CUDA_BWD_SM90_CUH

#include <type_traits>

#include "bwd_common.cuh"
#include "wgmma.cuh"

namespace nsa_cuda {

/* acc (m64 x N) += A B for the A fragment of k-step kk formed from the
 * accumulator p (columns 16 kk .. 16 kk + 15), B at descriptor db; in bf16 p
 * is split into hi + lo, two products, as if p were fp32 (warp_pv_exact); in
 * f16 too where ALL (warp_pv_exact says why) */
template <typename T, int N, int NJ, bool ALL = false>
NSA_DEV void wg_rs_exact(float (&acc)[N / 8][4], const float (&p)[NJ][4], int kk, uint64_t db)
{
    uint32_t a[4];
    a[0] = Mma<T>::pack(p[2 * kk][0], p[2 * kk][1]);
    a[1] = Mma<T>::pack(p[2 * kk][2], p[2 * kk][3]);
    a[2] = Mma<T>::pack(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[3] = Mma<T>::pack(p[2 * kk + 1][2], p[2 * kk + 1][3]);
    wg_rs<T, N>(acc, a, db);
    if constexpr (ALL || std::is_same<T, __nv_bfloat16>::value) {
        auto lo = [&](int j, int x) { return p[j][x] - to_f(from_f<T>(p[j][x])); };
        uint32_t b[4];
        b[0] = Mma<T>::pack(lo(2 * kk, 0), lo(2 * kk, 1));
        b[1] = Mma<T>::pack(lo(2 * kk, 2), lo(2 * kk, 3));
        b[2] = Mma<T>::pack(lo(2 * kk + 1, 0), lo(2 * kk + 1, 1));
        b[3] = Mma<T>::pack(lo(2 * kk + 1, 2), lo(2 * kk + 1, 3));
        wg_rs<T, N>(acc, b, db);
    }
}

/* acc (m64 x N) += p B for k-step kk (wg_rs_exact): one wgmma where a
 * width matches N, else 128 + 64 columns (192: the third 64-column panel,
 * `panel` bytes after the second) */
template <typename T, int DQK, int NJ, bool ALL = false>
NSA_DEV void wg_rs_wide(float (&dka)[DQK / 8][4], const float (&ds)[NJ][4], int kk, uint64_t db, uint32_t panel)
{
    if constexpr (DQK == 192) {
        wg_rs_exact<T, 128, NJ, ALL>(*reinterpret_cast<float(*)[16][4]>(&dka[0]), ds, kk, db);
        wg_rs_exact<T, 64, NJ, ALL>(*reinterpret_cast<float(*)[8][4]>(&dka[16]), ds, kk, desc_at(db, 2 * panel));
    } else {
        wg_rs_exact<T, DQK, NJ, ALL>(dka, ds, kk, db);
    }
}

} // namespace nsa_cuda

#endif
