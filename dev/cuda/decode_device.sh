#!/bin/bash
# One device call for the CUDA decode step (issue 15): build (sm_90a) the cuda
# module and the decode tests, then test_decode cuda small per class (the
# device's own, NSA_CUDA_TARGET=sm80, sm86), the graph replay test, the
# batch-1 64k timing, and the forced kernels (NSA_CUDA_FORCE=decode_attn:ref,
# every dtype; decode_attn:decode_sm80_probs, decode_sm80 and decode_sm80_wide, the 16-bit dtypes' parity alone,
# as the kernel takes no f32). Logs under $OUT. Usage (repo root, .debs carried):
#   bash dev/cuda/decode_device.sh [classes]   (after the device's own class and the timing; default "sm80 sm86")
OUT=${OUT:-/tmp/nsa-out}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 ))s; }
mkdir -p /tmp/r && for f in .debs/*.deb; do dpkg -x "$f" /tmp/r; done
export PKG_CONFIG_SYSROOT_DIR=/tmp/r PKG_CONFIG_PATH=/tmp/r/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=/tmp/r/usr/lib/x86_64-linux-gnu
B=${B:-build-dev}
export NSA_BACKEND_PATH=$PWD/$B/backends/cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# PREBUILT=1: $B was built elsewhere (an x86-64 machine) and carried: no meson, no ninja,
# unless its binaries do not load here (then a fresh build in build-dev2)
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$PWD/$B/core
if [ "${PREBUILT:-0}" = 1 ] && ldd $B/tests/test_decode $B/tests/test_decode_graph $B/backends/cuda/libnsa_backend_cuda.so \
     2>&1 | grep -q "not found"; then
  echo "prebuilt binaries do not load here:"; ldd $B/tests/test_decode $B/backends/cuda/libnsa_backend_cuda.so 2>&1 | grep "not found"
  exit 1
fi
[ "${PREBUILT:-0}" = 1 ] || { [ -f $B/build.ninja ] || meson setup $B -Dnvcc_archs=90a -Dnvcc_ptx= -Dhip=disabled -Dcuda=enabled -Dopencl=disabled
  ninja -C $B -j16 backends/cuda/libnsa_backend_cuda.so tests/test_decode tests/test_decode_graph; } > "$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
ls -la $B/tests/test_decode $B/tests/test_decode_graph $B/backends/cuda/libnsa_backend_cuda.so || exit 1
echo "[$(el)] build ok"
timeout 60 $B/tests/test_decode_graph > "$OUT/graph.log" 2>&1; echo "[$(el)] graph rc=$?"; tail -6 "$OUT/graph.log"
dec_class() {
  if [ $1 = sm90 ]; then e=X_UNUSED=1; else e=NSA_CUDA_TARGET=$1; fi
  env $e timeout ${DEC_TIMEOUT:-60} $B/tests/test_decode cuda small > "$OUT/decode_$1.log" 2>&1
  echo "[$(el)] test_decode cuda small, class $1: rc=$?"
  grep -E "^decode-|:F:|:E:|FAIL|Checks" "$OUT/decode_$1.log" | head -8
}
dec_class sm90
timeout 60 $B/tests/test_decode_graph time > "$OUT/time.log" 2>&1; echo "[$(el)] timing rc=$?"; tail -3 "$OUT/time.log"
for cls in ${1:-sm80 sm86}; do dec_class $cls; done
for f in decode_attn:ref decode_attn:decode_sm80_probs decode_attn:decode_sm80 decode_attn:decode_sm80_wide; do
  dts=$([ $f = decode_attn:ref ] || echo bf16,f16)
  env NSA_CUDA_FORCE=$f ${dts:+NSA_TEST_DTYPES=$dts} CK_FORK=no timeout ${DEC_TIMEOUT:-60} $B/tests/test_decode cuda small \
    > "$OUT/decode_${f#*:}.log" 2>&1
  echo "[$(el)] test_decode cuda small, NSA_CUDA_FORCE=$f ${dts:+(dtypes $dts)}: rc=$?"
  grep -E "^decode-|:F:|:E:|FAIL|Checks" "$OUT/decode_${f#*:}.log" | head -8
done
