#!/bin/bash
# dev/cuda/scores_carry.sh: one device call for the small-G scores stage (issue 14), kept as the record of
# how the carry was measured: on bb75dd8 (before it was taken) it applies dev/cuda/scores_carry_v1.patch,
# whose NSA_XSC_CARRY switch the product no longer has (on a later tree both runs are the product). Builds
# (the tool and the cuda module), then: ncu (stall reasons, source counters) of scores_sm80_kernel and
# topn_kernel at 64k for Hq / Hkv 32 / 8 and 4 / 4; the carry (NSA_XSC_CARRY=1: rows in global memory
# stored a whole periodic tile at a time, scores_map.cuh) against the plain read-add-write rows: o and
# the selected indices bitwise equal (nsa run --outputs) at 64k 32 / 8, 4 / 4 and 16 / 4, and as sm80;
# nsa run's check against the cpu backend with it (4 / 4, T 20000 packed); then nsa bench with the stage
# profile, plain and carry alternating, at 16k and 64k.
OUT=${OUT:-/tmp/nsa-out}; mkdir -p "$OUT"; SUM=$OUT/summary.txt; : > "$SUM"
note() { echo "$*" | tee -a "$SUM"; }
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 ))s; }
git apply --check dev/cuda/scores_carry_v1.patch 2>/dev/null && git apply dev/cuda/scores_carry_v1.patch && note "patch applied"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$SUM"
B=build-dev; NSA=$B/tools/nsa
{ { [ -d $B/meson-private ] || meson setup $B -Dnvcc_archs=90a -Dnvcc_ptx= -Dhip=disabled -Dcuda=enabled -Dopencl=disabled -Dtests=disabled -Dfuzz=disabled; } && \
  ninja -C $B -j16 tools/nsa backends/cuda/libnsa_backend_cuda.so; } > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
note "[$(el)] build ok"
export NSA_BACKEND_PATH=$PWD/$B/backends/cuda NSA_CACHE_DIR=$PWD/$B/nsa-cache
same() { # label args...: nsa run plain and with the carry, outputs compared bitwise
  local l=$1; shift
  rm -rf /tmp/o0 /tmp/o1
  timeout 120 $NSA run --backend cuda "$@" --check-tokens 0 --outputs /tmp/o0 > /tmp/s0.log 2>&1; r0=$?
  NSA_XSC_CARRY=1 timeout 120 $NSA run --backend cuda "$@" --check-tokens 0 --outputs /tmp/o1 > /tmp/s1.log 2>&1; r1=$?
  local d=""; for f in /tmp/o0/*.npy; do cmp -s "$f" /tmp/o1/$(basename $f) || d="$d $(basename $f)"; done
  note "[$(el)] same $l rc=$r0/$r1 files=$(ls /tmp/o0 | wc -l) differ:[${d}] $(grep -E '^ +scores' /tmp/s1.log | head -1 | tr -s ' ')"
}
same 32x8 --T 65536 --hq 32 --hkv 8
same 4x4 --T 65536 --hq 4 --hkv 4
same 16x4 --T 40000 --hq 16 --hkv 4 --seqlens 30000,10000
NSA_CUDA_TARGET=sm80 same 4x4-sm80 --T 30000 --hq 4 --hkv 4
NSA_CUDA_SCORE_ROWS_MAX=3000000 same 4x4-chunks --T 30000 --hq 4 --hkv 4
NSA_XSC_CARRY=1 timeout 200 $NSA run --backend cuda --T 20000 --hq 4 --hkv 4 --seqlens 7000,13000 > /tmp/chk.log 2>&1
note "[$(el)] check 4x4 carry rc=$? $(grep -iE 'PASS|FAIL' /tmp/chk.log | head -2 | tr '\n' ' ')"
NSA_XSC_CARRY=1 timeout 200 $NSA run --backend cuda --T 16384 --hq 8 --hkv 4 --dqk 192 --dv 128 > /tmp/chk.log 2>&1
note "[$(el)] check 8x4 Dqk192 carry rc=$? $(grep -iE 'PASS|FAIL' /tmp/chk.log | head -2 | tr '\n' ' ')"
for r in $(seq 1 ${ROUNDS:-2}); do
  for x in 0 1; do
    for s in "32 8" "16 4" "4 4"; do set -- $s
      NSA_XSC_CARRY=$x NSA_CUDA_PROFILE=1 timeout 120 $NSA bench --backend cuda --T ${BENCH_T:-16384,65536} --hq $1 --hkv $2 \
        --iters 7 --warmup 1 --no-dense > /tmp/b.log 2>&1
      note "[$(el)] bench carry=$x $1/$2 rc=$? $(grep -E '^ +[0-9]+ ' /tmp/b.log | tr -s ' ' | tr '\n' '|')"
      grep 'nsa-cuda profile' /tmp/b.log | grep -o 'T=[0-9]*\|scores_topn [^|]*' | paste -sd' ' | cut -c1-600 | tee -a "$SUM"
    done
  done
done
[ "${NCU:-1}" = 1 ] && for s in "32 8" "4 4"; do set -- $s
  for k in scores_sm80_kernel topn_kernel; do
    timeout 200 ncu --clock-control none -k regex:$k --launch-count 1 --section SpeedOfLight --section Occupancy \
      --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis --section SourceCounters \
      --section MemoryWorkloadAnalysis --section InstructionStats -f -o /tmp/ncu_$k $NSA run --backend cuda --T 65536 \
      --hq $1 --hkv $2 --iters 1 --warmup 0 --check-tokens 0 > /tmp/ncu_run.log 2>&1
    note "[$(el)] ncu $k $1/$2 rc=$?"
    ncu --import /tmp/ncu_$k.ncu-rep --page details > "$OUT/ncu_${k}_$1x$2.txt" 2>&1
    ncu --import /tmp/ncu_$k.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_src_${k}_$1x$2.csv" 2>&1
  done
done
note "[$(el)] done"
