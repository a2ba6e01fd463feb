/*
 * Test-only: the HIP runtime calls the HIP backend uses (backends/hip,
 * kernels/hip), mapped to CUDA, so that the same sources compile with nvcc and
 * the HIP backend's parity runs on an NVIDIA GPU (wave32; the portable kernels,
 * not MFMA). Never installed, never part of the product: tests/hip_on_cuda/
 * build.sh builds the module with it. What this cannot check: AMD hardware,
 * wave64 and the MFMA path (backends/hip/README.md).
 */
#ifndef NSA_TESTS_HIP_ON_CUDA_HIP_RUNTIME_H
#define NSA_TESTS_HIP_ON_CUDA_HIP_RUNTIME_H

#include <cuda_runtime.h>

typedef cudaError_t hipError_t;
typedef cudaStream_t hipStream_t;
typedef cudaDeviceProp hipDeviceProp_t;

#define hipSuccess cudaSuccess
#define hipErrorOutOfMemory cudaErrorMemoryAllocation
#define hipErrorMemoryAllocation cudaErrorMemoryAllocation
#define hipErrorNoDevice cudaErrorNoDevice
#define hipStreamNonBlocking cudaStreamNonBlocking
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost

#define hipSetDevice cudaSetDevice
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipRuntimeGetVersion cudaRuntimeGetVersion
#define hipGetLastError cudaGetLastError
#define hipGetErrorString cudaGetErrorString
#define hipGetErrorName cudaGetErrorName
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemsetAsync cudaMemsetAsync
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize

/* kernels/hip/mfma.h's matrix-core names, so that its kernels compile. The
 * instruction is not emulated (a 64-lane MFMA has no one-warp equivalent
 * here): it traps if it runs. NSA_HIP_MFMA_EMULATED also makes the backend
 * choose the MFMA kernels (backends/hip/backend.hip), so runs of this build
 * set NSA_HIP_NO_MFMA=1 for the portable kernels (device_check.sh does). */
#define NSA_HIP_MFMA_EMULATED 1
struct nsa_f32x4 {
    float v[4];
    __device__ float &operator[](int i) { return v[i]; }
    __device__ const float &operator[](int i) const { return v[i]; }
};
__device__ inline nsa_f32x4 nsa_mfma_16x16x4(float, float, nsa_f32x4 c)
{
    __trap();
    return c;
}

#endif
