#!/usr/bin/env bash
# Builds the HIP backend module (backends/hip, kernels/hip) with nvcc against the
# test-only HIP-to-CUDA header beside this script, so that the HIP backend's
# parity runs on an NVIDIA GPU:
#   bash tests/hip_on_cuda/build.sh OUT_DIR [SM]       (SM: default 90)
#   NSA_HIP_NO_MFMA=1 NSA_BACKEND_PATH=OUT_DIR build/tests/test_oracle hip
#   NSA_HIP_NO_MFMA=1 NSA_BACKEND_PATH=OUT_DIR build/tests/test_decode hip small
# The module is the product's sources unchanged; only hip/hip_runtime.h differs.
# It runs the portable (wave-size-agnostic) kernels (NSA_HIP_NO_MFMA=1: the MFMA
# instruction is not emulated and traps). Not for users: AMD GPUs run the
# real module (README, "Parity on AMD GPUs").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:?usage: build.sh OUT_DIR [SM]}
sm=${2:-90}
mkdir -p "$out/obj"
srcs=(backends/hip/backend.hip backends/hip/stages.hip backends/hip/decode_stages.hip kernels/hip/compress.hip
      kernels/hip/attention.hip kernels/hip/scores.hip kernels/hip/topn.hip kernels/hip/combine.hip
      kernels/hip/backward.hip kernels/hip/decode.hip)
pids=()
for s in "${srcs[@]}"; do
  nvcc -x cu -std=c++17 -O3 -Xcompiler=-fPIC,-fvisibility=hidden -DNDEBUG -gencode "arch=compute_$sm,code=sm_$sm" \
    -I"$here" -I"$root/include" -I"$root/core" -I"$root/kernels/common" -I"$root/kernels/hip" -I"$root/backends/hip" \
    -c "$root/$s" -o "$out/obj/$(basename "$s" .hip).o" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
nvcc -shared -o "$out/libnsa_backend_hip.so" "$out"/obj/*.o -Xlinker "--version-script=$root/backends/hip/exports.map" -lcudart
echo "built $out/libnsa_backend_hip.so (HIP sources on CUDA, sm_$sm)"
