#!/bin/bash
# One device call for the CUDA backend: build (sm_90a + OpenCL), per-stage profile,
# parity (full corpus, then the small corpus under each kernel switch), checks at
# real sizes against the cpu backend, determinism across processes, sanitizers,
# NVIDIA OpenCL parity, and the T sweep beside PyTorch's cuDNN attention.
# Run from the repository root on the GPU machine:
#   bash backends/cuda/device_check.sh [step,step,...]
# Several lists run in one call: call the script once per list; the build is kept (OUT
# subfolders keep the summaries apart). LONG_SAN=0 skips the long step's memcheck runs.
# steps (default all): profile parity variants check long det sanitize opencl bench sdpa; sanwg (in
# sanitize; alone: only the wgmma kernels' sanitizer runs), prof2, ncu, l2 and ldgsts (not in the default): prof2 profiles T = 64k under the wgmma switches (PROF_VARIANTS overrides the list), l2 reads L2 / DRAM counters of one launch per kernel, ldgsts measures cp.async's L2 reads per shared-memory layout (probes/ldgsts_l2.cu).
# A variant is one or more VAR=value settings joined by commas (VARIANTS, PROF_VARIANTS).
# Needs: .debs (libcheck/libsubunit/libclblast .deb files, unpacked with dpkg -x;
# the machine has no internet) and, for sdpa, .bench/sdpa_baseline.py (a copy of
# ../shared/bench/sdpa_baseline.py, not part of the project). Logs go to $OUT (or
# /tmp/nsa-out); the summary is printed last. The device tool returns at most a
# few files, so scratch output stays in /tmp.
OUT=${OUT:-/tmp/nsa-out}
mkdir -p "$OUT"
SUM=$OUT/summary.txt
: > "$SUM"
note() { echo "$*" | tee -a "$SUM"; }
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 ))s; }
S=${1:-profile,parity,variants,check,long,det,sanitize,opencl,bench,sdpa}
has() { [[ ",$S," == *",$1,"* ]]; }

mkdir -p /tmp/r && for f in .debs/*.deb; do dpkg -x "$f" /tmp/r; done
export PKG_CONFIG_SYSROOT_DIR=/tmp/r PKG_CONFIG_PATH=/tmp/r/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=/tmp/r/usr/lib/x86_64-linux-gnu
B=build-dev
NSA=$B/tools/nsa
export NSA_BACKEND_PATH=$PWD/$B/backends/cuda:$PWD/$B/backends/opencl NSA_CACHE_DIR=$PWD/$B/nsa-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee -a "$SUM"
{ [ -f $B/build.ninja ] || meson setup $B -Dnvcc_archs=90a -Dhip=disabled -Dopencl=enabled -Dcuda=enabled
  ninja -C $B -j16; } > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
note "[$(el)] build ok"

if has profile; then
  for dqk in 128 192; do for T in ${PROFILE_T:-8192 16384 32768 65536}; do
    NSA_CUDA_PROFILE=1 timeout 60 $NSA run --backend cuda --T $T --dqk $dqk --dv 128 --iters 3 --warmup 1 \
      --check-tokens 0 > /tmp/prof.tmp 2>&1
    note "[$(el)] profile Dqk=$dqk T=$T: $(grep 'nsa-cuda profile' /tmp/prof.tmp | tail -1)"
  done; done
fi
if has prof2; then # T = 64k under the wgmma switches (the default is profiled above)
  for v in ${PROF_VARIANTS:-NSA_CUDA_TMA=0 NSA_CUDA_WG_CMP=x1 NSA_CUDA_WG_CMP=x2 NSA_CUDA_WGMMA=0 \
           NSA_CUDA_WG_BN=64 NSA_CUDA_WG_BN=x1 NSA_CUDA_SLC=fs NSA_CUDA_SLC=fsp NSA_CUDA_SLC=mt}; do
    for dqk in 128 192; do
    env ${v//,/ } NSA_CUDA_PROFILE=1 timeout 60 $NSA run --backend cuda --T 65536 --dqk $dqk --dv 128 --iters 3 --warmup 1 \
      --check-tokens 0 > /tmp/prof.tmp 2>&1
    note "[$(el)] profile $v Dqk=$dqk T=65536: $(grep 'nsa-cuda profile' /tmp/prof.tmp | tail -1)"
  done; done
fi
if has parity; then
  timeout 60 $B/tests/test_wgmma > /tmp/wgmma.log 2>&1
  note "[$(el)] cuda-wgmma rc=$? $(tail -1 /tmp/wgmma.log)"
  timeout 60 $B/tests/test_topn > /tmp/topn.log 2>&1
  note "[$(el)] cuda-topn rc=$? $(tail -1 /tmp/topn.log)"
  grep -E "^FAIL" /tmp/topn.log | head -4 | tee -a "$SUM"
  timeout 200 $B/tests/test_oracle cuda > "$OUT/parity.log" 2>&1
  note "[$(el)] parity-cuda full corpus rc=$?"
  grep -E "^parity-cuda|^FAIL" "$OUT/parity.log" | head -12 | tee -a "$SUM"
fi
if has variants; then
  for v in ${VARIANTS:-NSA_CUDA_SCORES_LEAN=0 NSA_CUDA_V3=0 NSA_CUDA_ATTN_VAR=0 NSA_CUDA_FUSE_COMBINE=0 \
           NSA_CUDA_SLC=mt NSA_CUDA_SLC=tc NSA_CUDA_WGMMA=0 NSA_CUDA_WGMMA=all \
           NSA_CUDA_WG_BN=64 NSA_CUDA_WG_BN=pipe NSA_CUDA_WG_BN=x2 NSA_CUDA_WGMMA=all,NSA_CUDA_WG_BN=x2 \
           NSA_CUDA_SLC=fs NSA_CUDA_SLC=fsp NSA_CUDA_SCORES_WT=0 NSA_CUDA_SCORES_WT=128 NSA_CUDA_TOPN=rounds \
           NSA_CUDA_TMA=0 NSA_CUDA_WG_CMP=x1 NSA_CUDA_WG_BN=x1 NSA_CUDA_KERNELS=ref}; do
    env ${v//,/ } timeout 100 $B/tests/test_oracle cuda f32,f16,bf16,fixed small > /tmp/pv.log 2>&1
    note "[$(el)] parity-cuda small corpus, $v: rc=$? $(grep -cE '^FAIL' /tmp/pv.log) failures, $(grep -hE '^parity-cuda' /tmp/pv.log | tr '\n' ' ' | cut -c1-240)"
    grep -E "^FAIL" -A1 /tmp/pv.log | head -4 | tee -a "$SUM"
  done
fi
if has check; then
  for args in "--dqk 128 --dv 128" "--dqk 192 --dv 128" "--hq 32 --hkv 1 --dqk 64 --dv 64 --dtype f16" \
              "--dqk 128 --dv 128 --seqlens 3000,0,5000,190"; do
    timeout 100 $NSA run --backend cuda --T 8192 $args --iters 3 --warmup 1 > /tmp/check.tmp 2>&1
    note "[$(el)] nsa run $args: rc=$? $(grep -E 'max err / tol|PASS|FAIL' /tmp/check.tmp | tr '\n' ' ' | cut -c1-200)"
  done
fi
if has long; then # T = 140000, G = 16: score rows past the fused stage's shared memory (private
  # scores buffer + select_topn); with SCORES_WT=0 the v5 LEAN kernel's global-row path
  for v in NSA_CUDA_SCORES_WT=1 NSA_CUDA_SCORES_WT=0; do
    env $v timeout 120 $NSA run --backend cuda --T 140000 --hq 16 --hkv 1 --dqk 64 --dv 64 --iters 1 --warmup 0 \
      > /tmp/long.tmp 2>&1
    note "[$(el)] nsa run T=140000 G=16 D=64 $v: rc=$? $(grep -E 'max err / tol|PASS|FAIL' /tmp/long.tmp | tr '\n' ' ' | cut -c1-160)"
    [ "${LONG_SAN:-1}" = 0 ] && continue # LONG_SAN=0: no memcheck run
    env $v timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $NSA run --backend cuda --T 140000 \
      --hq 16 --hkv 1 --dqk 64 --dv 64 --iters 1 --warmup 0 --check-tokens 0 > /tmp/long2.log 2>&1
    note "[$(el)] memcheck T=140000 $v rc=$? $(grep -E 'ERROR SUMMARY' /tmp/long2.log | tail -1)"
  done
fi
if has det; then
  for i in $(seq 1 20); do
    $NSA run --backend cuda --T 8192 --iters 1 --warmup 0 --check-tokens 0 --outputs /tmp/det >/dev/null 2>&1
    md5sum < /tmp/det/o.npy
  done | sort | uniq -c > /tmp/det.txt
  note "[$(el)] determinism: 20 processes, $(wc -l < /tmp/det.txt) distinct o.npy hash(es)"
fi
if has sanitize; then
  CK_FORK=no NSA_TEST_CORPUS=small timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
    $B/tests/test_oracle cuda ${SAN_MODES:-bf16,f16,f32} small > /tmp/memcheck.log 2>&1
  note "[$(el)] memcheck rc=$? $(grep -E 'ERROR SUMMARY' /tmp/memcheck.log | tail -1)"
  NSA_TEST_CASE=s-basic timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 \
    $B/tests/test_oracle cuda bf16 small > /tmp/racecheck.log 2>&1
  note "[$(el)] racecheck s-basic rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' /tmp/racecheck.log | tail -1)"
  # G = 16 with several K tiles: the LEAN scores loop, the fused combine, slc_tc (SAN_G16=0 skips)
  if [ "${SAN_G16:-1}" != 0 ]; then
    timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 $NSA run --backend cuda --T 1536 --hq 16 \
      --hkv 1 --dqk 64 --dv 64 --iters 1 --warmup 0 --check-tokens 0 > /tmp/racecheck2.log 2>&1
    note "[$(el)] racecheck nsa run T=1536 G=16 rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' /tmp/racecheck2.log | tail -1)"
  fi
fi
if has sanitize || has sanwg; then
  # D = 128 with two or more K tiles of the wgmma kernels (attn_wg, scores WG / WT) on sm_90
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $NSA run --backend cuda --T 4096 --hq 16 \
      --hkv 1 --dqk 128 --dv 128 --iters 1 --warmup 0 --check-tokens 0 > /tmp/san3.log 2>&1
    note "[$(el)] $tool nsa run T=4096 G=16 D=128 rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' /tmp/san3.log | tail -1)"
  done
fi
if has opencl; then
  NSA_OPENCL_PLATFORM=NVIDIA timeout 200 $B/tests/test_oracle opencl f32,f16,bf16,fixed small > /tmp/ocl.log 2>&1
  note "[$(el)] parity-opencl (NVIDIA OpenCL, small corpus) rc=$?"
  grep -E "^parity-opencl|^FAIL" /tmp/ocl.log | head -6 | tee -a "$SUM"
fi
if has bench; then
  for dqk in 128 192; do
    timeout 200 $NSA bench --backend cuda --T 8192,16384,32768,65536 --dqk $dqk --dv 128 --iters 5 --warmup 1 \
      --no-stages > "$OUT/bench_$dqk.log" 2>&1
    note "[$(el)] bench Dqk=$dqk rc=$?"
    tail -8 "$OUT/bench_$dqk.log" | tee -a "$SUM"
  done
fi
if has sdpa; then
  for dqk in 128 192; do
    timeout 150 python3 .bench/sdpa_baseline.py --T 8192 16384 32768 65536 --hq 64 --hkv 4 --dqk $dqk --dv 128 \
      --no-backward > /tmp/sdpa.log 2>&1
    note "[$(el)] sdpa Dqk=$dqk rc=$?:"
    grep -o '"baseline": "[a-z-]*".*"fwd_ms": [0-9.]*' /tmp/sdpa.log | sed 's/"hq.*"dtype": "bf16", "device": "[^"]*", //' | tee -a "$SUM"
  done
fi
if has ncu; then # stall reasons and per-instruction samples (NCU_SPEC kernel:launch-count, default the wgmma
  # kernels; NCU_T, default 32768; NCU_DQK, default 128)
  for spec in ${NCU_SPEC:-scores_wt_kernel:1 attn_wg_kernel:2}; do
    k=${spec%%:*}; n=${spec##*:}
    timeout 240 ncu --clock-control none -k regex:$k --launch-count $n --section SpeedOfLight --section Occupancy \
      --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis --section SourceCounters \
      --section MemoryWorkloadAnalysis \
      -f -o /tmp/ncu_$k $NSA run --backend cuda --T ${NCU_T:-32768} --dqk ${NCU_DQK:-128} --dv 128 --iters 1 --warmup 0 \
      --check-tokens 0 > /tmp/ncu_run.log 2>&1
    note "[$(el)] ncu $k rc=$?"
    ncu --import /tmp/ncu_$k.ncu-rep --page details > "$OUT/ncu_$k.txt" 2>&1
    ncu --import /tmp/ncu_$k.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_src_$k.csv" 2>&1
    tail -3 /tmp/ncu_run.log
  done
fi
if has l2; then # L2 sectors the SMs read, DRAM bytes and instructions of one launch (L2_SPEC kernel regexes, T = 64k)
  for k in ${L2_SPEC:-slc_fs_kernel attn_wg_kernel scores_wt_kernel}; do
    for dqk in 128 192; do
      timeout 200 ncu --clock-control none -k regex:$k --launch-count 1 --metrics \
        gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,dram__bytes_read.sum,smsp__inst_executed.sum,lts__t_sectors_srcunit_tex.sum,l1tex__m_xbar2l1tex_read_bytes.sum \
        $NSA run --backend cuda --T 65536 --dqk $dqk --dv 128 --iters 1 --warmup 0 --check-tokens 0 > /tmp/l2.log 2>&1
      note "[$(el)] l2 $k Dqk=$dqk rc=$?: $(grep -E '^ +(gpu__|lts__|dram__|smsp__|l1tex__)' /tmp/l2.log | awk '{print $1"="$(NF)}' | tr '\n' ' ')"
    done
  done
fi
if has ldgsts; then # L2 sectors per data sector of cp.async by shared-memory layout (probes/ldgsts_l2.cu)
  nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/ldgsts backends/cuda/probes/ldgsts_l2.cu > /tmp/ldgsts_b.log 2>&1 &&
    timeout 120 ncu --clock-control none --metrics lts__t_sectors_srcunit_tex_op_read.sum,gpu__time_duration.sum \
      /tmp/ldgsts > "$OUT/ldgsts.log" 2>&1
  note "[$(el)] ldgsts rc=$?"
  grep -E "data sectors|copy_chunks|lts__t_sectors|gpu__time" "$OUT/ldgsts.log" | sed 's/(int \*)//' | tee -a "$SUM"
fi
note "[$(el)] done"
