#!/bin/bash
# dev/cuda/scores_zero.sh: one device call comparing prebuilt trees of the forward's small-G stages (issue 14):
# written for the scores map patches (dev/cuda/scores_map_rounds_v1.patch, _v2.patch), used since for the
# block-major selected kernels (dev/cuda/slc_blk_prologue_v2.patch).
# Takes prebuilt trees (an x86-64 build elsewhere, carried) named by TREES (default "base new"; the first is
# the baseline), each .bench/<name> with tools/nsa, core/libnsa.so* and backends/cuda/libnsa_backend_cuda.so.xz
# (nvcc_archs 90a). Then:
#   same    nsa run --outputs of each later tree bitwise equal to the first's (o, LSEs, selected) over the rows-in-plan-memory
#           shapes (64k at 32 / 8 and 4 / 4, score-row chunks, sm80, packed sequences), rows in shared memory
#           (G 7), G 16 as sm80 (scores_sm80_g16), G 32 (scores_sm80), slc_sm80_blk in passes;
#   check   nsa run's check against the cpu backend with each later tree (forward, and --decode over paged caches);
#   bench   nsa bench with the stage profile (NSA_CUDA_PROFILE), all trees in turn ROUNDS times at BENCH_T,
#           for BENCH_SHAPES (Hq x Hkv, default 32x8 16x4 4x4; QUICK: 32x8 4x4);
#   sdpa    .bench/sdpa_baseline.py's cuDNN forward at the same shapes (issue 14's ratio);
#   ncu     source counters (instructions executed and stall samples per SASS line) of NCU_KERNELS (default
#           scores_sm80_kernel), last tree, 64k, NCU_SHAPES (default 32x8 4x4), as CSV under $OUT.
#   ragged  small and ragged shapes (T < l_s, packed with empty and one-token sequences, G 3, 5, 7, 12, 64, l_s 128,
#           64/32 dims): same, and nsa run's check against the cpu backend (every token) with each later tree;
# A tree named dir@force runs .bench/dir with NSA_CUDA_FORCE=force.
# Steps: STEPS (default "same check bench ncu"). QUICK=1: three same cases (64k 32 / 8 and 4 / 4, chunks), one
# check, the bench at 32 / 8 and 4 / 4 only (a short call where device time is scarce).
OUT=${OUT:-/tmp/nsa-out}; mkdir -p "$OUT"; SUM=$OUT/summary.txt; : > "$SUM"
note() { echo "$*" | tee -a "$SUM"; }
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 ))s; }
has() { case " ${STEPS:-same check bench ncu} " in *" $1 "*) return 0;; esac; return 1; }
full() { [ "${QUICK:-0}" != 1 ]; } # the long form
SHAPES=${BENCH_SHAPES:-32x8 16x4 4x4}; full || SHAPES=${BENCH_SHAPES:-32x8 4x4} # Hq x Hkv, D 128
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$SUM"
TREES=${TREES:-base new}; set -- $TREES; BASE=$1; shift; LATER="$*"; LAST=${TREES##* }
for t in $TREES; do t=${t%@*}
  [ -f .bench/$t/backends/cuda/libnsa_backend_cuda.so ] || xz -dkf .bench/$t/backends/cuda/libnsa_backend_cuda.so.xz ||
    { note "$t: no module"; exit 1; }
  mkdir -p /tmp/cache_$t
done
run_t() { # tree seconds args...: the tree's nsa with its module and kernel cache, under a time limit; a tree
  # named dir@force runs .bench/dir with NSA_CUDA_FORCE=force
  local t=${1%@*} f= to=$2; case $1 in *@*) f=${1#*@};; esac; shift 2
  env ${f:+NSA_CUDA_FORCE=$f} NSA_BACKEND_PATH=$PWD/.bench/$t/backends/cuda NSA_CACHE_DIR=/tmp/cache_$t \
    timeout $to .bench/$t/tools/nsa "$@"
}
same() { # label args...: each later tree's outputs against the first's, bitwise
  local l=$1; shift
  rm -rf /tmp/o0; mkdir -p /tmp/o0
  run_t $BASE 150 run --backend cuda "$@" --check-tokens 0 --outputs /tmp/o0 > /tmp/s0.log 2>&1; local r0=$?
  for t in $LATER; do
    rm -rf /tmp/o1; mkdir -p /tmp/o1
    run_t $t 150 run --backend cuda "$@" --check-tokens 0 --outputs /tmp/o1 > /tmp/s1.log 2>&1; local r1=$?
    local d=""; for f in /tmp/o0/*.npy; do cmp -s "$f" /tmp/o1/$(basename $f) || d="$d $(basename $f)"; done
    note "[$(el)] same $l $t rc=$r0/$r1 files=$(ls /tmp/o0 | wc -l) differ:[${d}]"
  done
}
if has same; then
  same 32x8-64k --T 65536 --hq 32 --hkv 8 --dqk 128 --dv 128
  same 4x4-64k --T 65536 --hq 4 --hkv 4 --dqk 128 --dv 128
  full && same 16x4-packed --T 40000 --hq 16 --hkv 4 --dqk 128 --dv 128 --seqlens 30000,10000
  full && same 8x4-d192 --T 30000 --hq 8 --hkv 4
  full && NSA_CUDA_TARGET=sm80 same 4x4-sm80 --T 30000 --hq 4 --hkv 4 --dqk 128 --dv 128
  full && NSA_CUDA_TARGET=sm86 same 8x4-sm86-d64 --T 30000 --hq 8 --hkv 4 --dqk 64 --dv 64
  full && NSA_CUDA_TARGET=sm80 same 64x4-sm80-g16 --T 20000 --hq 64 --hkv 4 --dqk 128 --dv 128
  full && same 28x4 --T 20000 --hq 28 --hkv 4 --dqk 128 --dv 128
  full && same 32x1-g32 --T 8000 --hq 32 --hkv 1 --dqk 128 --dv 128
  full && NSA_CUDA_SLC_PASS_MAX=20000000 same 8x4-slcpass --T 20000 --hq 8 --hkv 4 --dqk 128 --dv 128 --seqlens 5,12000,7995
  NSA_CUDA_SCORE_ROWS_MAX=3000000 same 4x4-chunks --T 30000 --hq 4 --hkv 4 --dqk 128 --dv 128 --seqlens 1,63,64,65,9000,20807
fi
if has ragged; then # small and ragged shapes: bitwise against the first tree, and against the cpu backend
  RAG=("--T 40 --hq 12 --hkv 4 --dqk 128 --dv 128 --w 16"
       "--seqlens 1,63,64,65,200,3000 --hq 20 --hkv 4"
       "--seqlens 7,700,1500 --hq 48 --hkv 4 --dqk 64 --dv 64 --ls 128 --l 64 --d 32"
       "--T 5000 --hq 2 --hkv 2 --dqk 128 --dv 128 --dtype f16"
       "--seqlens 300,0,900,200 --hq 8 --hkv 2 --dqk 64 --dv 32 --w 0 --dtype f16"
       "--T 3000 --hq 64 --hkv 1 --dqk 128 --dv 128"
       "--seqlens 130,2000,5 --hq 28 --hkv 4 --dqk 192 --dv 128 --n 5 --n-local 1")
  i=0; for a in "${RAG[@]}"; do i=$((i + 1))
    same "rag$i" $a
    for t in $LATER; do run_t $t 300 run --backend cuda $a --check-tokens 100000 > /tmp/chk.log 2>&1
      note "[$(el)] check $t $a rc=$? $(grep -iE 'PASS|FAIL' /tmp/chk.log | head -2 | tr -s ' ' | cut -c1-160 | tr '\n' ' ')"
      grep -o 'slc_sm[a-z_0-9]*\[[^]]*\]' /tmp/chk.log | sort -u | paste -sd' ' | tee -a "$SUM"; done
  done
fi
if has check; then
  chk() { for t in $LATER; do run_t $t 300 run --backend cuda "$@" > /tmp/chk.log 2>&1
    note "[$(el)] check $t $* rc=$? $(grep -iE 'PASS|FAIL|max err' /tmp/chk.log | head -3 | tr -s ' ' | tr '\n' ' ')"; done; }
  chk --T 20000 --hq 4 --hkv 4 --dqk 128 --dv 128 --seqlens 7000,13000
  if full; then
  chk --T 65536 --hq 32 --hkv 8 --dqk 128 --dv 128
  chk --T 16384 --hq 8 --hkv 4
  NSA_CUDA_SCORE_ROWS_MAX=3000000 chk --T 24000 --hq 16 --hkv 8 --dqk 128 --dv 128 --seqlens 100,23900
  chk --decode 1 --T 20000 --prefill 18800 --hq 16 --hkv 4 --dqk 128 --dv 128
  chk --decode 4 --T 12000 --prefill 9000 --chunk 256 --hq 8 --hkv 4 --seqlens 5000,7000
  fi
fi
if has bench; then
  for r in $(seq 1 ${ROUNDS:-2}); do
    for t in $TREES; do
      for s in $SHAPES; do set -- ${s%x*} ${s#*x}
        NSA_CUDA_PROFILE=1 run_t $t 150 bench --backend cuda --T ${BENCH_T:-65536} --hq $1 --hkv $2 \
          --dqk 128 --dv 128 --iters 7 --warmup 1 --no-dense > /tmp/b.log 2>&1
        note "[$(el)] bench $t $1/$2 rc=$? $(grep -E '^ +[0-9]+ ' /tmp/b.log | tr -s ' ' | tr '\n' '|')"
        grep 'nsa-cuda profile' /tmp/b.log | grep -o 'T=[0-9]*\|scores_topn [^|]*\|slc[a-z_]* [^|]*' | paste -sd' ' | cut -c1-600 | tee -a "$SUM"
      done
    done
  done
fi
if has sdpa && [ -f .bench/sdpa_baseline.py ]; then
  for s in $SHAPES; do set -- ${s%x*} ${s#*x}
    timeout 200 python3 .bench/sdpa_baseline.py --T $(echo ${BENCH_T:-65536} | tr ',' ' ') --hq $1 --hkv $2 \
      --dqk 128 --dv 128 --iters 7 --no-backward > "$OUT/sdpa_$1x$2.log" 2>&1
    note "[$(el)] sdpa $1/$2 rc=$?"; grep -iE "cudnn" "$OUT/sdpa_$1x$2.log" | head -4 | tee -a "$SUM"
  done
fi
if has ncu; then
  for s in ${NCU_SHAPES:-32x8 4x4}; do hq=${s%x*}; hkv=${s#*x}
    for k in ${NCU_KERNELS:-scores_sm80_kernel}; do
      timeout 240 env NSA_BACKEND_PATH=$PWD/.bench/$LAST/backends/cuda NSA_CACHE_DIR=/tmp/cache_$LAST \
        ncu --clock-control none -k regex:$k --launch-count 1 --section SpeedOfLight --section Occupancy \
        --section SchedulerStats --section WarpStateStats --section SourceCounters --section InstructionStats \
        -f -o /tmp/ncu_$k .bench/$LAST/tools/nsa run --backend cuda --T 65536 --hq $hq --hkv $hkv --dqk 128 --dv 128 \
        --iters 1 --warmup 0 --check-tokens 0 > /tmp/ncu_run.log 2>&1
      note "[$(el)] ncu $k $s rc=$?"
      ncu --import /tmp/ncu_$k.ncu-rep --page details > "$OUT/ncu_${k}_$s.txt" 2>&1
      grep -E "Duration|Executed Instructions |Issue Slots Busy|No Eligible|Achieved Occupancy" "$OUT/ncu_${k}_$s.txt" | tr -s ' ' | tee -a "$SUM"
      ncu --import /tmp/ncu_$k.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_src_${k}_$s.csv" 2>&1
      xz -f "$OUT/ncu_src_${k}_$s.csv"
    done
  done
fi
note "[$(el)] done"
