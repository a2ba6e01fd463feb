// Configure-time check (backends/hip/meson.build): can hipcc build device
// code for every target in hip_targets with this ROCm installation?
#include <hip/hip_runtime.h>

__global__ void nsa_hip_probe_kernel(float *x) { x[threadIdx.x] *= 2.0f; }
