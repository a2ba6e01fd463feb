#!/bin/bash
# One full GPU session on an NVIDIA machine, each step time-boxed, logs in $OUT:
# build (sm_90, CUDA + OpenCL), CUDA parity (v3 and the v2.2 fallback), 20-run
# determinism, compute-sanitizer memcheck/racecheck, OpenCL parity on NVIDIA's
# platform and `nsa run` at the paper shape, per-stage CUDA profile at 64k,
# `nsa bench` and PyTorch's cuDNN/FlashAttention baseline in the same call.
#   STEPS=cuda_parity,opencl bash tools/gpu_session.sh
# Needs, in git-ignored folders: .debs/ (libcheck, libsubunit, libclblast .debs
# fetched with `apt-get download` where the GPU machine has no package access)
# and .bench/sdpa_baseline.py (the baseline script; not part of libnsa).
# The session's final device call: CUDA + OpenCL(NVIDIA) parity, sanitizers,
# determinism, profile, bench and the cuDNN baseline, each step time-boxed.
OUT=${OUT:-/tmp/nsa-out}; mkdir -p "$OUT"
SUM=$OUT/summary.txt; : > "$SUM"
note() { echo "$*" | tee -a "$SUM"; }
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 ))s; }
mkdir -p /tmp/r && for f in .debs/*.deb; do dpkg -x "$f" /tmp/r; done
export PKG_CONFIG_SYSROOT_DIR=/tmp/r PKG_CONFIG_PATH=/tmp/r/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=/tmp/r/usr/lib/x86_64-linux-gnu
B=build-dev; NSA=$B/tools/nsa
export NSA_BACKEND_PATH=$PWD/$B/backends/cuda:$PWD/$B/backends/opencl NSA_CACHE_DIR=$PWD/$B/nsa-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee -a "$SUM"
{ meson setup $B -Dnvcc_archs=90 -Dhip=disabled -Dopencl=enabled -Dcuda=enabled && ninja -C $B -j16; } > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
note "[$(el)] build ok"; $NSA info 2>&1 | grep -E "^  (cuda|opencl)|device" | tee -a "$SUM"
S=${STEPS:-cuda_parity,old_parity,determinism,opencl,sanitize,profile,sdpa,bench,check}
has() { [[ ",$S," == *",$1,"* ]]; }
if has cuda_parity; then
  timeout 150 $B/tests/test_oracle cuda > "$OUT/parity_cuda.log" 2>&1; note "[$(el)] parity-cuda rc=$?"
  grep -E "^parity-cuda|^FAIL" -A0 "$OUT/parity_cuda.log" | head -12 | tee -a "$SUM"
fi
if has old_parity; then
  NSA_CUDA_V3=0 timeout 60 $B/tests/test_oracle cuda f32,bf16,fixed small > "$OUT/parity_cuda_v2.log" 2>&1; note "[$(el)] parity-cuda NSA_CUDA_V3=0 small rc=$?"
  grep -E "^parity-cuda|^FAIL" "$OUT/parity_cuda_v2.log" | head -6 | tee -a "$SUM"
fi
if has determinism; then
  for i in $(seq 1 20); do $NSA run --backend cuda --T 8192 --iters 1 --warmup 0 --check-tokens 0 --outputs $OUT/det >/dev/null 2>&1; md5sum < $OUT/det/o.npy; done | sort | uniq -c > "$OUT/det.txt"
  note "[$(el)] determinism, 20 runs of nsa run T=8192 bf16 (distinct o.npy hashes): $(wc -l < $OUT/det.txt) -> $(cat $OUT/det.txt | tr '\n' ' ')"
  rm -rf $OUT/det
fi
if has sanitize; then
  NSA_TEST_CORPUS=small timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_oracle cuda bf16,f32 small > "$OUT/memcheck.log" 2>&1
  note "[$(el)] memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  NSA_TEST_CASE=s-basic timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/test_oracle cuda bf16 small > "$OUT/racecheck.log" 2>&1
  note "[$(el)] racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
fi
if has opencl; then
  export NSA_OPENCL_PLATFORM=NVIDIA
  timeout 200 $B/tests/test_oracle opencl > "$OUT/parity_opencl.log" 2>&1; note "[$(el)] parity-opencl (NVIDIA OpenCL) rc=$?"
  grep -E "^parity-opencl|^FAIL" "$OUT/parity_opencl.log" | head -8 | tee -a "$SUM"
  for T in 8192 32768; do
    timeout 90 $NSA run --backend opencl --T $T --iters 3 --warmup 1 > "$OUT/ocl_run_$T.log" 2>&1
    note "[$(el)] opencl run T=$T rc=$? $(grep -E '^(backend|time|work|check| *max)' "$OUT/ocl_run_$T.log" | tr '\n' ' ' | cut -c1-400)"
  done
  unset NSA_OPENCL_PLATFORM
fi
if has profile; then
  for v in 1 0; do for dqk in 128 192; do
    NSA_CUDA_V3=$v NSA_CUDA_PROFILE=1 timeout 60 $NSA run --backend cuda --T 65536 --dqk $dqk --dv 128 --iters 3 --warmup 1 --check-tokens 0 > "$OUT/prof.tmp" 2>&1
    note "[$(el)] profile V3=$v Dqk=$dqk T=65536: $(grep 'nsa-cuda profile' "$OUT/prof.tmp" | tail -1)"; cat "$OUT/prof.tmp" >> "$OUT/profile.log"
  done; done
fi
if has bench; then
  for dqk in 128 192; do
    timeout 150 $NSA bench --backend cuda --T 8192,16384,32768,65536 --dqk $dqk --dv 128 --iters 5 --warmup 1 --no-stages > "$OUT/bench_$dqk.log" 2>&1
    note "[$(el)] bench Dqk=$dqk rc=$?"; tail -14 "$OUT/bench_$dqk.log" | tee -a "$SUM"
  done
fi
if has sdpa; then
  for dqk in 128 192; do
    timeout 120 python3 .bench/sdpa_baseline.py --T 8192 16384 32768 65536 --hq 64 --hkv 4 --dqk $dqk --dv 128 --no-backward --iters 6 > "$OUT/sdpa_$dqk.log" 2>&1
    note "[$(el)] sdpa Dqk=$dqk:"; grep -o '"baseline": "[a-z-]*".*"fwd_ms": [0-9.]*' "$OUT/sdpa_$dqk.log" | sed 's/"hq.*"dtype": "bf16", "device": "[^"]*", //' | tee -a "$SUM"
  done
fi
if has check; then
  for a in "--dqk 128 --dv 128" "--dqk 192 --dv 128" "--hq 32 --hkv 2 --dqk 64 --dv 64 --dtype f16 --seqlens 3000,0,5000,190"; do
    timeout 60 $NSA run --backend cuda --T 8192 $a --iters 5 --warmup 1 > "$OUT/check.tmp" 2>&1
    note "[$(el)] run cuda $a rc=$? $(grep -E '^(time|check| *max)' "$OUT/check.tmp" | tr '\n' ' ' | cut -c1-300)"; cat "$OUT/check.tmp" >> "$OUT/check.log"
  done
fi
note "[$(el)] done"
