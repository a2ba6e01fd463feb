#!/bin/bash
# One device call: build (sm_90 only), parity, sanitizers, checks at real sizes,
# per-stage profile, the T sweep and the cuDNN baseline in the same call.
# Run from the repository root on the GPU machine:  bash backends/cuda/device_check.sh [steps]
# steps (default all): build parity bisect sanitize check profile bench sdpa
# The v3 kernels are the default; every step runs them. parity and profile also
# run the v2.2 path (NSA_CUDA_V3=0: unfused block_scores + select_topn, the
# three-barrier scores loop) on the small corpus / at T = 65536.
# Logs go to $OUT (or /tmp/nsa-out); the last lines printed are a summary.
OUT=${OUT:-/tmp/nsa-out}
mkdir -p "$OUT"
STEPS=${1:-build,parity,bisect,sanitize,check,profile,bench,sdpa}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
SUM=$OUT/summary.txt
: > "$SUM"
note() { echo "$*" | tee -a "$SUM"; }

mkdir -p /tmp/r && for f in .debs/*.deb; do dpkg -x "$f" /tmp/r; done
export PKG_CONFIG_SYSROOT_DIR=/tmp/r PKG_CONFIG_PATH=/tmp/r/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=/tmp/r/usr/lib/x86_64-linux-gnu
B=build-dev
export NSA_BACKEND_PATH=$PWD/$B/backends/cuda
NSA=$B/tools/nsa
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee -a "$SUM"

if has build; then
  t0=$(date +%s)
  { meson setup $B -Dnvcc_archs=90 -Dhip=disabled -Dopencl=disabled && ninja -C $B -j16; } > "$OUT/build.log" 2>&1
  rc=$?
  note "build rc=$rc in $(( $(date +%s) - t0 )) s"
  grep -i "check" "$OUT/build.log" | grep -i "dependency" | head -2 | tee -a "$SUM"
  if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; exit 1; fi
  $NSA info 2>&1 | head -8 | tee -a "$SUM"
fi

if has parity; then
  t0=$(date +%s)
  $B/tests/test_oracle cuda > "$OUT/parity.log" 2>&1; rc=$?
  note "parity-cuda (tensor-core path) rc=$rc in $(( $(date +%s) - t0 )) s"
  grep -E "^parity-cuda" "$OUT/parity.log" | tee -a "$SUM"
  grep -E "^FAIL" -A1 "$OUT/parity.log" | head -12 | tee -a "$SUM"
  t0=$(date +%s)
  NSA_CUDA_V3=0 NSA_TEST_CORPUS=small $B/tests/test_oracle cuda f16,bf16 small > "$OUT/parity_v22.log" 2>&1
  note "parity-cuda (NSA_CUDA_V3=0, v2.2 path, small corpus, 16-bit) rc=$? in $(( $(date +%s) - t0 )) s"
  grep -E "^parity-cuda" "$OUT/parity_v22.log" | tee -a "$SUM"
  grep -E "^FAIL" -A1 "$OUT/parity_v22.log" | head -6 | tee -a "$SUM"
  NSA_CUDA_KERNELS=ref $B/tests/test_oracle cuda f16,bf16 > "$OUT/parity_ref.log" 2>&1
  note "parity-cuda (reference kernels, 16-bit) rc=$?"
  grep -E "^parity-cuda" "$OUT/parity_ref.log" | tee -a "$SUM"
  grep -E "^FAIL" -A1 "$OUT/parity_ref.log" | head -6 | tee -a "$SUM"
fi

if has bisect && grep -q "^FAIL" "$OUT/parity.log" 2>/dev/null; then
  # each tensor-core stage alone (the others on their reference kernels)
  all="cmp_attn,block_scores,slc_attn,win_attn"
  for st in cmp_attn block_scores slc_attn win_attn; do
    NSA_CUDA_REF=${all/$st/none} $B/tests/test_oracle cuda bf16 > "$OUT/bisect_$st.log" 2>&1
    note "only $st on tensor cores: rc=$? $(grep -E '^parity-cuda bf16' "$OUT/bisect_$st.log")"
  done
fi

if has sanitize; then
  t0=$(date +%s)
  NSA_TEST_CORPUS=small timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
    $B/tests/test_oracle cuda bf16,f32 small > "$OUT/san_memcheck.log" 2>&1
  note "compute-sanitizer memcheck (small corpus, bf16+f32) rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E 'ERROR SUMMARY' "$OUT/san_memcheck.log" | tail -1)"
  t0=$(date +%s)
  NSA_TEST_CASE=${RACE_CASE:-s-basic} timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 \
    $B/tests/test_oracle cuda bf16 small > "$OUT/san_racecheck.log" 2>&1
  note "compute-sanitizer racecheck (case ${RACE_CASE:-s-basic}, bf16) rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/san_racecheck.log" | tail -1)"
  # the v3 block-scores loop (G = 16, one barrier per K tile) needs >= 2 K tiles: nc > 64
  t0=$(date +%s)
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 $NSA run --backend cuda --T 1536 --hq 16 --hkv 1 \
    --dqk 64 --dv 64 --iters 1 --warmup 0 --check-tokens 0 > "$OUT/san_racecheck_g16.log" 2>&1
  note "compute-sanitizer racecheck (nsa run T=1536 G=16, v3 scores_topn) rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/san_racecheck_g16.log" | tail -1)"
fi

if has check; then
  if [ -n "$CHECK_ONE" ]; then set -- "$CHECK_ONE"; else
  set -- "--dqk 128 --dv 128" "--dqk 192 --dv 128" "--hq 32 --hkv 1 --dqk 64 --dv 64 --dtype f16" \
         "--dqk 128 --dv 128 --seqlens 3000,0,5000,190"; fi
  for args in "$@"; do
    $NSA run --backend cuda --T 8192 $args --iters 5 --warmup 1 > "$OUT/check.log.tmp" 2>&1
    rc=$?
    cat "$OUT/check.log.tmp" >> "$OUT/check.log"
    note "run $args: rc=$rc $(grep -E '^(time|check)' "$OUT/check.log.tmp" | tr '\n' ' ' | cut -c1-260)"
  done
fi

if has profile; then
  for dqk in 128 192; do
    for T in ${PROFILE_T:-8192 16384 32768 65536}; do
      NSA_CUDA_PROFILE=1 $NSA run --backend cuda --T $T --dqk $dqk --dv 128 --iters 3 --warmup 1 --check-tokens 0 \
        > "$OUT/profile.tmp" 2>&1
      note "profile Dqk=$dqk T=$T: $(grep 'nsa-cuda profile' "$OUT/profile.tmp" | tail -1)"
      cat "$OUT/profile.tmp" >> "$OUT/profile.log"
    done
    # the v2.2 path at the largest size, for the before/after of the same call
    NSA_CUDA_V3=0 NSA_CUDA_PROFILE=1 $NSA run --backend cuda --T ${PROFILE_T_V22:-65536} --dqk $dqk --dv 128 --iters 3 \
      --warmup 1 --check-tokens 0 > "$OUT/profile.tmp" 2>&1
    note "profile Dqk=$dqk T=${PROFILE_T_V22:-65536} NSA_CUDA_V3=0: $(grep 'nsa-cuda profile' "$OUT/profile.tmp" | tail -1)"
    cat "$OUT/profile.tmp" >> "$OUT/profile.log"
  done
fi

if has bench; then
  for dqk in 128 192; do
    $NSA bench --backend cuda --T 8192,16384,32768,65536 --dqk $dqk --dv 128 --iters 5 --warmup 1 --no-dense \
      > "$OUT/bench_$dqk.log" 2>&1
    note "bench Dqk=$dqk rc=$?"; tail -12 "$OUT/bench_$dqk.log" | tee -a "$SUM"
  done
fi

if has sdpa; then
  for dqk in 128 192; do
    python3 .bench/sdpa_baseline.py --T ${SDPA_T:-8192 16384 32768 65536} --hq 64 --hkv 4 --dqk $dqk --dv 128 --no-backward \
      > "$OUT/sdpa_$dqk.log" 2>&1
    note "sdpa Dqk=$dqk:"; grep -o '"baseline": "[a-z-]*".*"fwd_ms": [0-9.]*' "$OUT/sdpa_$dqk.log" | sed 's/"hq.*"dtype": "bf16", "device": "[^"]*", //' | tee -a "$SUM"
  done
fi
echo "==== summary"; cat "$SUM"
