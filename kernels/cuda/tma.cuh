/*
 * tma.cuh -- Hopper's tensor memory accelerator (TMA, cp.async.bulk.tensor)
 * and shared-memory mbarriers for the wgmma tile kernels (v8):
 *
 *   one thread asks the TMA unit for a K / V tile (a box of 64 elements x 1
 *   head x BN rows per 128-byte panel), the copy lands in shared memory in
 *   the 128-byte swizzle the wgmma descriptors read (wgmma.cuh, sw128_off)
 *   and completes a transaction count on a "full" mbarrier; each warp waits
 *   on that barrier instead of on its own cp.async groups and a CTA barrier,
 *   and when it is done reading the tile it arrives on the tile's "empty"
 *   barrier, which the issuing thread waits on before it refills the buffer.
 *
 * Why (docs/cuda.md): with cp.async every thread computed the swizzled
 * addresses of its share of every tile (about 120 instructions per thread per
 * 64-key K tile in scores_sm90), and the CTA barrier per tile kept the two
 * warpgroups in lock-step.
 *
 * Host side: a CUtensorMap per tensor (tma_map_rows), encoded through the
 * runtime's driver entry point (no link against libcuda), passed to the
 * kernel as a __grid_constant__ parameter. The map's row count is the
 * tensor's, so a box that runs past the last row is zero-filled by the TMA
 * unit, never read out of bounds; rows past a CTA's last key but inside the
 * tensor are read and masked, as the cp.async loads mask them (a masked
 * probability is exactly 0 and multiplies the row's finite values).
 */
#ifndef NSA_KERNELS_CUDA_TMA_CUH
#define NSA_KERNELS_CUDA_TMA_CUH

#include <cuda.h>

#include "nsa_cuda.cuh"
#include "wgmma.cuh"

namespace nsa_cuda {

/* The K and V maps of one launch; ok = 0 when they could not be made (the
 * kernel then takes its cp.async path). */
struct TmaKV {
    CUtensorMap k, v;
    int ok;
};

/* Encodes a 3-D map of a 16-bit tensor [rows][heads][D] with element strides
 * st (row) and sh (head) for boxes of 64 elements x 1 head x box_rows rows in
 * the 128-byte swizzle. False (map unset) where the TMA cannot address it:
 * strides not multiples of 16 bytes, a base not 16-byte aligned, D not a
 * multiple of 64, counts past 2^31, or no driver entry point. */
bool tma_map_rows(CUtensorMap *map, const void *base, int64_t rows, int64_t heads, int64_t D, int64_t st, int64_t sh,
                  int box_rows);

#ifdef NSA_WGMMA
NSA_DEV void mbar_init(uint64_t *bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
/* makes the initialised barriers visible to the async proxy (a CTA barrier follows) */
NSA_DEV void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
NSA_DEV void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
/* this thread's arrival plus `bytes` of transactions the copies will complete */
NSA_DEV void mbar_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}
/* waits until the phase of parity `parity` has completed */
NSA_DEV void mbar_wait(uint64_t *bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nNSA_MBAR_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra NSA_MBAR_WAIT;\n}\n" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
}
/* box (x = element column, y = head, z = row) of map into dst (1024-byte aligned) */
NSA_DEV void tma_load_3d(void *dst, const CUtensorMap *map, uint64_t *bar, int x, int y, int z)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(x), "r"(y), "r"(z), "r"(smem_u32(bar))
                 : "memory");
}
#endif

/* A tile of BN rows (row0 .. row0+BN-1 of head `head`) with D elements per row
 * into the swizzled panels at dst (panel p at dst + p * BN * 128), completing
 * on bar. Issued by one thread; the caller has armed bar with the bytes
 * (tma_tile_bytes). */
template <int BN, int D> NSA_DEV void tma_tile(unsigned char *dst, const CUtensorMap *map, uint64_t *bar, int head,
                                               int64_t row0)
{
#ifdef NSA_WGMMA
#pragma unroll
    for (int p = 0; p < D / 64; p++) tma_load_3d(dst + p * BN * 128, map, bar, p * 64, head, (int)row0);
#endif
}
template <int BN, int D> constexpr uint32_t tma_tile_bytes() { return (uint32_t)BN * D * 2; }

} // namespace nsa_cuda

#endif
