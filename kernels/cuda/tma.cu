/*
 * tma.cu -- host side of tma.cuh: CUtensorMap encoding for the K / V tiles of
 * the wgmma kernels. cuTensorMapEncodeTiled is a driver function; the module
 * links the CUDA runtime statically and not libcuda, so the function comes
 * from the runtime's driver entry point, looked up once.
 */
#include <atomic>

#include "tma.cuh"

namespace nsa_cuda {

typedef CUresult (*EncodeTiledFn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static EncodeTiledFn encode_fn()
{
    static std::atomic<EncodeTiledFn> fn{nullptr};
    static std::atomic<int> tried{0};
    EncodeTiledFn f = fn.load();
    if (f || tried.load()) return f;
    void *p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        p = nullptr;
    cudaGetLastError();
    f = (EncodeTiledFn)p;
    fn.store(f);
    tried.store(1);
    return f;
}

bool tma_map_rows(CUtensorMap *map, const void *base, int64_t rows, int64_t heads, int64_t D, int64_t st, int64_t sh,
                  int box_rows)
{
    const int64_t lim = (int64_t)1 << 31;
    if (!base || rows <= 0 || heads <= 0 || D <= 0 || D % 64 != 0 || rows >= lim || heads >= lim || st <= 0 ||
        sh <= 0 || ((uintptr_t)base & 15u) != 0 || (st * 2) % 16 != 0 || (sh * 2) % 16 != 0 ||
        st * 2 >= ((int64_t)1 << 40) || sh * 2 >= ((int64_t)1 << 40) || box_rows <= 0 || box_rows > 256)
        return false;
    const EncodeTiledFn f = encode_fn();
    if (!f) return false;
    const cuuint64_t dim[3] = {(cuuint64_t)D, (cuuint64_t)heads, (cuuint64_t)rows};
    const cuuint64_t stride[2] = {(cuuint64_t)(sh * 2), (cuuint64_t)(st * 2)};
    const cuuint32_t box[3] = {64, 1, (cuuint32_t)box_rows};
    const cuuint32_t estride[3] = {1, 1, 1};
    /* the element type only sets the size here: the copies move bits */
    return f(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void *>(base), dim, stride, box, estride,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

} // namespace nsa_cuda
