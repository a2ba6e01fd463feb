#!/bin/bash
# One device call for the CUDA backend: build (sm_90a), the kernel tests, the
# parity corpus on every device class (the H200 itself, then NSA_CUDA_TARGET=sm80
# and sm86), forced kernels, per-stage profiles per class, checks at real sizes
# against the cpu backend, determinism, sanitizers, NVIDIA OpenCL, the T sweep,
# PyTorch's cuDNN / FlashAttention-2 baselines, and an earlier tree's forward
# timed in the same call. Run from the repository root on the GPU machine:
#   bash backends/cuda/device_check.sh [step,step,...]
# steps (default: tests,classes,force,profile,check,det,sanitize,bench,sdpa; also resources):
#   tests    cuda-choose, cuda-wgmma, cuda-topn
#   classes  the full parity corpus (f32, f16, bf16, fixed) per class in CLASSES
#            (default "sm90 sm80 sm86"; sm90 = the device's own choice)
#   force    the small corpus under each NSA_CUDA_FORCE setting in FORCES
#   profile  NSA_CUDA_PROFILE per class at PROFILE_T (default 65536), Dqk 128 and 192
#   check    nsa run against the cpu backend: CHECKS / CHECK_EXTRA "class T args" items (default T = 8192, sm90)
#   resources cuobjdump --dump-resource-usage of the module ($OUT/resources.txt)
#   long     T = 140000, G = 16 (score rows past shared memory), with memcheck unless LONG_SAN=0
#   rows     score rows in plan memory (G = 1, T = 32768), one pass and in chunks: bitwise the same
#   backward test_backward cuda (full corpus) per class in CLASSES, memcheck and racecheck on
#            the small corpus, 20 processes of nsa run --backward (one gradient hash expected)
#   python   python/tests/cuda_device_check.py (CUDA tensors vs nsa run, copies, stream) and the unit tests
#   det      20 processes, one o.npy hash expected (T 8192, DET_ARGS: more nsa run flags)
#   sanitize memcheck and racecheck (small corpus; nsa run at G = 16 with several K tiles, or SAN_ARGS)
#   opencl   the small corpus (forward: OCL_CORPUS) on NVIDIA's OpenCL, forward, backward and decode (needs the
#            module: OPENCL=1 builds it)
#   shard    test_shard (SHARD_CORPUS, full) on NVIDIA's OpenCL (OPENCL=1) and on cuda (skips where refused)
#   million  nsa run at T = 1048576, paper shape, D 128, NSA_CUDA_PROFILE (about 68 GiB with SLC_COMBINE and
#            WIN_COMBINE, NSA_CUDA_SLC_COMBINE=1 on a GPU under 120 GB, about 100 GiB with auto's plain selected
#            stage at G 16; skipped on a GPU under 78 GiB; MILLION_S limit; run alone, it builds only the tool
#            and the cuda module)
#   fused    tests/test_cuda_fused.sh: the fused stages (slc_combine, win_combine) bitwise as the plain ones
#   hip      the HIP backend built from its sources with nvcc (tests/hip_on_cuda): the full corpus,
#            the backward, and the decode step (test_decode hip small)
#   bench    nsa bench at BENCH_T per class in BENCH_CLASSES (default sm90)
#   bwdlong  nsa run --backward against the cpu backend where reader lists split (T = BWDLONG_T, 4096, D 64,
#            G 16 and 4), and T = 524288 (paper shape, D 128) with its workspace and per-stage profile
#   bwdbench nsa bench --backward with NSA_CUDA_PROFILE per stage, BWD_T (16384,65536) x BWD_SHAPES per
#            class in BWD_CLASSES (sm90) and NSA_CUDA_FORCE of BWD_FORCES ("none": the default choice),
#            and .bench/sdpa_baseline.py's dense backward beside it
#   baseline nsa bench of the tree in .old/ (BASE_T, default 65536; git archive of an
#            earlier commit, built here in the background) beside this tree, alternating,
#            BASE_ROUNDS times (default 2), for the ';'-separated nsa flags of BASE_SHAPES
#            (default D 128, Dqk 192, and G = 4 at D 128), per class in BASE_CLASSES (sm90)
#   sdpa     tools/dense_baseline.py: PyTorch's cuDNN and FlashAttention-2 dense causal attention, 64k
#   slcpass  the block-major kernel (slc_sm90_blk on sm90, else slc_sm80_blk) in passes (NSA_CUDA_SLC_PASS_MAX):
#            small corpus; T = 8192, G = 4 bitwise as one pass
#   gpucorpus the gpu corpus (model sizes, G 1..16, T up to 8192) per class in GPU_CLASSES (sm90 sm80), GPU_MODES
#   slcncu   ncu: the block-major kernels (map build, sort, attention, reduce) at 64k, G = 4, time per kernel name
#   bwdncu   ncu: the backward's rows / keys kernels (BWDNCU_REGEX) at 64k per Dqk (BWDNCU_DQK), default and under
#            each NSA_CUDA_FORCE of BWDNCU_FORCES, time per kernel name (not in the default)
#   groups   nsa bench per GQA shape (GROUP_SHAPES "hq hkv dqk;..."; GROUP_T) with the 64k profile, also with
#            each NSA_CUDA_FORCE of GROUP_FORCES (default "none slc_attn:slc_sm80"), beside
#            .bench/sdpa_baseline.py's cuDNN forward (issue 14's table)
#   decbench nsa bench --decode at Hq 64 / Hkv 4 (DEC_DQK "128 192", DEC_B 1,64, DEC_C 8192..131072, DEC_TQ 1,4)
#            beside .bench/sdpa_baseline.py --decode (issue 15's table)
#   decncu   ncu over one decode step (batch DECNCU_B, 64k, D 128): per kernel time, DRAM and L2 bytes, warps active;
#            DECNCU_DETAIL=1 adds the attention launches' speed of light, warp stalls and occupancy at batch 64
#   decsrc   ncu source counters (stall samples per SASS line) of the decode attention, batch DECSRC_B (1), 64k, D 128
#   oclbench NVIDIA's OpenCL: nsa bench at OCL_T (8192) with v3 and v2 attention and their stage profiles (OPENCL=1)
#   ncu      stall reasons and source counters of NCU_SPEC kernels, nsa run with NCU_ARGS (not in the default)
#   l2       L2 sectors, DRAM bytes, instructions of L2_SPEC kernels (not in the default)
#   ldgsts   dev/cuda/ldgsts_l2.cu: cp.async's L2 reads per shared-memory layout (not in the default)
# Needs .debs (check, libsubunit, libclblast .deb files, unpacked with dpkg -x; the
# machine has no internet). Logs go to $OUT (or /tmp/nsa-out) as logs.tgz beside summary.txt; the summary is printed.
OUT=${OUT:-/tmp/nsa-out}
mkdir -p "$OUT"
SUM=$OUT/summary.txt
: > "$SUM"
note() { echo "$*" | tee -a "$SUM"; }
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 ))s; }
S=${1:-tests,classes,force,profile,check,det,sanitize,bench,sdpa}
has() { [[ ",$S," == *",$1,"* ]]; }

mkdir -p /tmp/r && for f in .debs/*.deb; do dpkg -x "$f" /tmp/r; done
export PKG_CONFIG_SYSROOT_DIR=/tmp/r PKG_CONFIG_PATH=/tmp/r/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=/tmp/r/usr/lib/x86_64-linux-gnu
B=build-dev
NSA=$B/tools/nsa
export NSA_BACKEND_PATH=$PWD/$B/backends/cuda:$PWD/$B/backends/opencl NSA_CACHE_DIR=$PWD/$B/nsa-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee -a "$SUM"
# the earlier tree builds on half the cores while this one's GPU steps run
if has baseline && [ -d .old ]; then
  ( cd .old && { [ -f build/build.ninja ] || meson setup build -Dnvcc_archs=90a -Dhip=disabled -Dopencl=disabled \
      -Dtests=disabled; } > /tmp/old_build.log 2>&1 && ninja -C build -j8 tools/nsa backends/cuda/libnsa_backend_cuda.so \
      >> /tmp/old_build.log 2>&1; echo "rc=$?" >> /tmp/old_build.log ) &
  OLD_PID=$!
fi
{ [ -f $B/build.ninja ] || meson setup $B -Dnvcc_archs=90a -Dhip=disabled -Dcuda=enabled \
    -Dopencl=$([ "${OPENCL:-0}" = 1 ] && echo enabled || echo disabled)
  # 'million' alone, or BUILD_MIN=1 (steps that run only nsa and test_oracle: classes, fused, million, baseline,
  # bench, groups), needs only the tool and the module (about a minute less of a call)
  if [ "$S" = million ] || [ "${BUILD_MIN:-0}" = 1 ]; then
    ninja -C $B -j16 tools/nsa backends/cuda/libnsa_backend_cuda.so $([ "${BUILD_MIN:-0}" = 1 ] && echo tests/test_oracle)
  else ninja -C $B -j16; fi
} > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
note "[$(el)] build ok"

# ncu's gpu__time_duration.sum lines summed per kernel name, in us. ncu picks each value's unit
# (second, msecond, usecond, nsecond, or s, ms, us, ns in newer versions): every one is converted.
ncu_times() {
  awk '/^  [a-zA-Z_].*\(/ {k=$0; sub(/^  (void )?/, "", k); sub(/[<(].*/, "", k)}
       /gpu__time_duration.sum/ {u=$(NF-1); v=$NF; gsub(",", "", v)
         if (u=="second" || u=="s") v*=1e6; else if (u=="msecond" || u=="ms") v*=1e3
         else if (u=="nsecond" || u=="ns") v/=1e3; else if (u!="usecond" && u!="us") {print "  unknown unit " u; next}
         t[k]+=v; c[k]++}
       END {for (k in t) printf "  %-40s %4d launches %12.1f us\n", substr(k,1,40), c[k], t[k]}' "$1" | tee -a "$SUM"
}
# NSA_CUDA_TARGET for a class name ("sm90": the device's own choice, no variable)
target() { [ "$1" = sm90 ] && echo "X_UNUSED=1" || echo "NSA_CUDA_TARGET=$1"; }

if has tests; then
  for t in test_cuda_choose test_wgmma test_topn; do
    timeout 60 $B/tests/$t > /tmp/$t.log 2>&1
    rc=$?; note "[$(el)] $t rc=$rc $(tail -1 /tmp/$t.log)"
    grep -E "^FAIL|:F:" /tmp/$t.log | head -4 | tee -a "$SUM"
  done
fi
if has classes; then
  for cls in ${CLASSES:-sm90 sm80 sm86}; do
    env $(target $cls) timeout 300 $B/tests/test_oracle cuda > "$OUT/parity_$cls.log" 2>&1
    rc=$?; note "[$(el)] parity-cuda full corpus, class $cls: rc=$rc $(grep -cE '^FAIL|:F:' "$OUT/parity_$cls.log") failures"
    grep -E "^parity-cuda|^FAIL|:F:" "$OUT/parity_$cls.log" | head -8 | tee -a "$SUM"
    env $(target $cls) $NSA run --backend cuda --T 4096 --iters 1 --warmup 0 --check-tokens 0 2>&1 \
      | sed -n '/^kernels:/,/^time:/p' | grep -v '^time:' | tee -a "$SUM"
  done
fi
if has force; then
  for v in ${FORCES:-ref slc_attn:slc_sm80 slc_attn:slc_sm80_blk combine:combine block_scores:scores_sm80 cmp_attn:attn_sm80,win_attn:attn_sm80}; do
    modes=f16,bf16 # a forced tensor-core kernel refuses f32 plans (by design: it cannot run them)
    [ "$v" = ref ] && modes=f32,f16,bf16,fixed
    NSA_CUDA_FORCE=$v timeout 150 $B/tests/test_oracle cuda $modes small > /tmp/pv.log 2>&1
    rc=$?; note "[$(el)] parity-cuda small corpus ($modes), NSA_CUDA_FORCE=$v: rc=$rc $(grep -cE '^FAIL|:F:' /tmp/pv.log) failures, $(grep -hE '^parity-cuda' /tmp/pv.log | grep -oE '[0-9]+ passed' | tr '\n' ' ')"
    grep -E "^FAIL|:F:" -A1 /tmp/pv.log | head -4 | tee -a "$SUM"
  done
fi
if has profile; then
  for cls in ${PROFILE_CLASSES:-sm90 sm80 sm86}; do for dqk in 128 192; do for T in ${PROFILE_T:-65536}; do
    env $(target $cls) NSA_CUDA_PROFILE=1 timeout 90 $NSA run --backend cuda --T $T --dqk $dqk --dv 128 --iters 3 \
      --warmup 1 --check-tokens 0 > /tmp/prof.tmp 2>&1
    note "[$(el)] profile $cls Dqk=$dqk T=$T: $(grep 'nsa-cuda profile' /tmp/prof.tmp | tail -1)"
  done; done; done
fi
if has check; then # "class T args" items, ';'-separated (CHECKS); the defaults, then CHECK_EXTRA
  IFS=';' read -ra items <<< "${CHECKS:-sm90 8192 --dqk 128 --dv 128;sm90 8192 --dqk 192 --dv 128;sm90 8192 --hq 32 --hkv 1 --dqk 64 --dv 64 --dtype f16;sm90 8192 --dqk 128 --dv 128 --seqlens 3000,0,5000,190}${CHECK_EXTRA:+;$CHECK_EXTRA}"
  for it in "${items[@]}"; do
    read -r cls T args <<< "$it"
    env $(target $cls) timeout 120 $NSA run --backend cuda --T $T $args --iters 2 --warmup 1 > /tmp/check.tmp 2>&1
    rc=$?; note "[$(el)] nsa run $cls T=$T $args: rc=$rc $(grep -E 'max err / tol|PASS|FAIL' /tmp/check.tmp | tr '\n' ' ' | cut -c1-200)"
  done
fi
if has resources; then # registers, shared memory, spills of every kernel instance
  cuobjdump --dump-resource-usage $B/backends/cuda/libnsa_backend_cuda.so 2>&1 | c++filt > "$OUT/resources.txt"
  rc=$?; note "[$(el)] resources rc=$rc ($(grep -c 'Function' "$OUT/resources.txt") functions, $OUT/resources.txt)"
fi
if has long; then
  timeout 120 $NSA run --backend cuda --T 140000 --hq 16 --hkv 1 --dqk 64 --dv 64 --iters 1 --warmup 0 > /tmp/long.tmp 2>&1
  rc=$?; note "[$(el)] nsa run T=140000 G=16 D=64: rc=$rc $(grep -E 'max err / tol|PASS|FAIL' /tmp/long.tmp | tr '\n' ' ' | cut -c1-160)"
  if [ "${LONG_SAN:-1}" != 0 ]; then
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $NSA run --backend cuda --T 140000 \
      --hq 16 --hkv 1 --dqk 64 --dv 64 --iters 1 --warmup 0 --check-tokens 0 > /tmp/long2.log 2>&1
    rc=$?; note "[$(el)] memcheck T=140000 rc=$rc $(grep -E 'ERROR SUMMARY' /tmp/long2.log | tail -1)"
  fi
fi
if has rows; then
  # score rows that do not fit in shared memory (G = 1: scores_sm80_kq, 128 tokens x 512 blocks x 4 bytes per CTA at T = 32768,
  # rows:global, 268 MB) in chunks (NSA_CUDA_SCORE_ROWS_MAX=10000000: 29 chunks): the same indices and
  # outputs bitwise as one pass, and the check against the cpu backend
  for lim in default 10000000; do
    env $([ $lim = default ] && echo X_UNUSED=1 || echo NSA_CUDA_SCORE_ROWS_MAX=$lim) NSA_CUDA_PROFILE=1 timeout 120 \
      $NSA run --backend cuda --T 32768 --hq 4 --hkv 4 --dqk 64 --dv 64 --iters 1 --warmup 0 \
      --outputs /tmp/rows_$lim > /tmp/rows_$lim.log 2>&1
    rc=$?; note "[$(el)] score rows $lim: rc=$rc $(grep -E 'PASS|FAIL|plan:' /tmp/rows_$lim.log | tr '\n' ' ' | cut -c1-260)"
    grep -oE "scores_topn [^|]*" /tmp/rows_$lim.log | tail -1 | tee -a "$SUM"
  done
  for f in o.npy selected.npy; do
    cmp -s /tmp/rows_default/$f /tmp/rows_10000000/$f && note "  $f bitwise equal (chunked vs one pass)" \
      || note "  $f DIFFERS (chunked vs one pass) or missing"
  done
fi
if has backward; then # nsa_backward against the fp64 gradient reference, per class; memcheck / racecheck
  for cls in ${CLASSES:-sm90 sm80 sm86}; do
    env $(target $cls) CK_FORK=no timeout 300 $B/tests/test_backward cuda f32,f16,bf16 ${BWD_CORPUS:-full} \
      > "$OUT/backward_$cls.log" 2>&1
    rc=$?; note "[$(el)] backward-cuda class $cls: rc=$rc $(grep -cE '^FAIL|:F:' "$OUT/backward_$cls.log") failures; $(grep -E '^backward-' "$OUT/backward_$cls.log" | tail -1)"
    grep -E ":F:" "$OUT/backward_$cls.log" | head -3 | cut -c1-400 | tee -a "$SUM"
  done
  for tool in memcheck racecheck; do
    CK_FORK=no timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/test_backward cuda bf16 small \
      > /tmp/bsan.log 2>&1
    rc=$?; note "[$(el)] $tool test_backward cuda bf16 small: rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/bsan.log | tail -1)"
  done
  for i in $(seq 1 20); do
    $NSA run --backend cuda --T 4096 --backward --check-tokens 0 --outputs /tmp/bdet >/dev/null 2>&1
    cat /tmp/bdet/dq.npy /tmp/bdet/dk.npy /tmp/bdet/dv.npy 2>/dev/null | md5sum
  done | sort | uniq -c > /tmp/bdet.txt
  note "[$(el)] backward determinism: 20 processes, $(wc -l < /tmp/bdet.txt) distinct dq+dk+dv hash(es)"
fi
if has bwdlong; then # the backward at shapes whose reader lists split into chunks, checked against the cpu
  # backend (whole problem: --check-gflop), G = 16 and G = 4; then T = 524288, paper shape, with its workspace
  for sh in "--hq 16 --hkv 1" "--hq 16 --hkv 4"; do
    timeout 300 $NSA run --backend cuda --T ${BWDLONG_T:-4096} $sh --dqk 64 --dv 64 --backward --iters 1 --warmup 0 \
      --check-gflop 400 > /tmp/bl.log 2>&1
    rc=$?; note "[$(el)] backward T=${BWDLONG_T:-4096} $sh D 64 vs cpu: rc=$rc"
    grep -iE "gradient elements|PASS|FAIL" /tmp/bl.log | tail -2 | cut -c1-300 | tee -a "$SUM"
  done
  NSA_CUDA_PROFILE=1 timeout 400 $NSA run --backend cuda --T 524288 --dqk 128 --dv 128 --backward --iters 1 --warmup 0 \
    --check-tokens 0 --json > "$OUT/bwd_512k.json" 2> "$OUT/bwd_512k.err"
  rc=$?; note "[$(el)] backward T=524288 D 128: rc=$rc $(grep -oE '"(workspace|backend)_bytes": [0-9]+' "$OUT/bwd_512k.json" | tr '\n' ' ')"
  grep -E "bwd_store|cudaError|NSA_ERR" "$OUT/bwd_512k.err" | tail -2 | cut -c1-700 | tee -a "$SUM"
fi
if has python; then # the Python package on CUDA tensors (python/tests/cuda_device_check.py): equal to nsa run,
  # no tensor copies, the caller's stream; then the package's unit tests with the GPU present
  NSA_LIBRARY=$PWD/$B/core/libnsa.so NSA_TOOL=$PWD/$NSA timeout 200 python3 python/tests/cuda_device_check.py \
    > "$OUT/python_cuda.log" 2>&1
  rc=$?; note "[$(el)] python cuda check: rc=$rc"; grep -E "^(PASS|FAIL|SKIP)" "$OUT/python_cuda.log" | cut -c1-400 | tee -a "$SUM"
  ( cd python && NSA_LIBRARY=$PWD/../$B/core/libnsa.so NSA_TOOL=$PWD/../$NSA timeout 300 python3 -m unittest discover tests ) \
    > "$OUT/python_unit.log" 2>&1
  rc=$?; note "[$(el)] python unit tests (GPU present): rc=$rc $(tail -3 "$OUT/python_unit.log" | tr '\n' ' ')"
fi
if has det; then
  for i in $(seq 1 20); do
    $NSA run --backend cuda --T 8192 ${DET_ARGS:-} --iters 1 --warmup 0 --check-tokens 0 --outputs /tmp/det >/dev/null 2>&1
    md5sum < /tmp/det/o.npy
  done | sort | uniq -c > /tmp/det.txt
  note "[$(el)] determinism ${DET_ARGS:-}: 20 processes, $(wc -l < /tmp/det.txt) distinct o.npy hash(es)"
fi
if has sanitize; then
  for cls in ${SAN_CLASSES:-sm90 sm80}; do
    env $(target $cls) CK_FORK=no NSA_TEST_CORPUS=small timeout 200 compute-sanitizer --tool memcheck \
      --error-exitcode 9 $B/tests/test_oracle cuda ${SAN_MODES:-bf16} small > /tmp/memcheck.log 2>&1
    rc=$?; note "[$(el)] memcheck small corpus, class $cls: rc=$rc $(grep -E 'ERROR SUMMARY' /tmp/memcheck.log | tail -1)"
    for tool in memcheck racecheck; do
      env $(target $cls) timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $NSA run --backend cuda \
        --T 4096 ${SAN_ARGS:---hq 16 --hkv 1 --dqk 128 --dv 128} --iters 1 --warmup 0 --check-tokens 0 > /tmp/san3.log 2>&1
      rc=$?; note "[$(el)] $tool nsa run T=4096 ${SAN_ARGS:-G=16 D=128}, class $cls: rc=$rc $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' /tmp/san3.log | tail -1)"
    done
  done
fi
if has opencl; then
  NSA_OPENCL_PLATFORM=NVIDIA timeout 300 $B/tests/test_oracle opencl f32,f16,bf16,fixed ${OCL_CORPUS:-small} > /tmp/ocl.log 2>&1
  rc=$?; note "[$(el)] parity-opencl (NVIDIA OpenCL, ${OCL_CORPUS:-small} corpus) rc=$rc"
  grep -E "^parity-opencl|^FAIL|:F:" /tmp/ocl.log | head -6 | tee -a "$SUM"
  NSA_OPENCL_PLATFORM=NVIDIA CK_FORK=no timeout 300 $B/tests/test_backward opencl f32,f16,bf16 ${OCL_BWD_CORPUS:-small} \
    > /tmp/oclb.log 2>&1
  rc=$?; note "[$(el)] backward-opencl (NVIDIA OpenCL): rc=$rc $(grep -cE '^FAIL|:F:' /tmp/oclb.log) failures; $(grep -E '^backward-' /tmp/oclb.log | tail -1)"
  grep -E ":F:" /tmp/oclb.log | head -3 | cut -c1-400 | tee -a "$SUM"
  # the decode step (kernels/opencl/decode.cl): every row against the opencl forward, the step checks, determinism
  NSA_OPENCL_PLATFORM=NVIDIA CK_FORK=no timeout 300 $B/tests/test_decode opencl small > "$OUT/decode_opencl.log" 2>&1
  rc=$?; note "[$(el)] decode-opencl (NVIDIA OpenCL, small corpus): rc=$rc $(grep -cE ':F:|:E:' "$OUT/decode_opencl.log") failures; $(grep -E '^decode-opencl: [0-9]' "$OUT/decode_opencl.log" | tail -1 | cut -c1-300)"
  grep -E ":F:|:E:" "$OUT/decode_opencl.log" | head -3 | cut -c1-400 | tee -a "$SUM"
fi
if has shard; then # shards of one sequence (test_shard) on NVIDIA's OpenCL, and on cuda (skipped where refused)
  NSA_OPENCL_PLATFORM=NVIDIA CK_FORK=no timeout 400 $B/tests/test_shard opencl f32,bf16 ${SHARD_CORPUS:-full} \
    > "$OUT/shard_opencl.log" 2>&1
  rc=$?; note "[$(el)] shard-opencl (NVIDIA OpenCL, ${SHARD_CORPUS:-full}): rc=$rc $(grep -cE ':F:|:E:' "$OUT/shard_opencl.log") failures"
  grep -E "^shard|:F:|:E:" "$OUT/shard_opencl.log" | tail -8 | cut -c1-300 | tee -a "$SUM"
  CK_FORK=no timeout 400 $B/tests/test_shard cuda f32,f16,bf16 ${SHARD_CORPUS:-full} > "$OUT/shard_cuda.log" 2>&1
  rc=$?; note "[$(el)] shard-cuda (${SHARD_CORPUS:-full}): rc=$rc (77 = refused and skipped) $(grep -cE ':F:|:E:' "$OUT/shard_cuda.log") failures"
  grep -E "^shard|:F:|:E:" "$OUT/shard_cuda.log" | tail -8 | cut -c1-300 | tee -a "$SUM"
fi
if has million; then # one sequence of 1,048,576 tokens, paper shape: workspace, stages, check (about 68 GiB)
  if [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 80000 ]; then
    note "[$(el)] million skipped: this GPU has under 78 GiB (it needs about 68 GiB)"
  else
    t1=$(date +%s)
    # under 120 GB the selected branch fuses too (NSA_CUDA_SLC_COMBINE=1: 32 GiB less workspace, slower at G 16)
    sc=auto; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 120000 ] && sc=1
    NSA_CUDA_SLC_COMBINE=$sc NSA_CUDA_PROFILE=1 NSA_LOG=info timeout ${MILLION_S:-400} stdbuf -oL $NSA run --backend cuda --T 1048576 --dqk 128 \
      --dv 128 --iters 1 --warmup 0 > "$OUT/million.log" 2>&1
    rc=$?; note "[$(el)] nsa run T=1048576 D 128: rc=$rc in $(( $(date +%s) - t1 )) s"
    grep -vE '^ *$' "$OUT/million.log" | tail -14 | cut -c1-300 | tee -a "$SUM"
  fi
fi
if has fused; then # the fused forward stages bitwise as the plain ones (slc_combine, win_combine)
  timeout 300 bash tests/test_cuda_fused.sh $NSA > "$OUT/fused.log" 2>&1
  rc=$?; note "[$(el)] cuda-fused rc=$rc: $(tail -1 "$OUT/fused.log")"
  grep -E "^FAIL|^     " "$OUT/fused.log" | head -12 | tee -a "$SUM"
fi
if has hip; then # the HIP backend's sources on CUDA (tests/hip_on_cuda): its parity on the H200
  bash tests/hip_on_cuda/build.sh /tmp/hipcu 90 > "$OUT/hip_build.log" 2>&1
  rc=$?; note "[$(el)] hip module on CUDA rc=$rc ($(tail -1 "$OUT/hip_build.log"))"
  NSA_HIP_NO_MFMA=1 NSA_BACKEND_PATH=/tmp/hipcu timeout 300 $B/tests/test_oracle hip ${HIP_MODES:-f32,f16,bf16,fixed} > "$OUT/parity_hip.log" 2>&1
  rc=$?; note "[$(el)] parity-hip (HIP sources on CUDA, full corpus): rc=$rc $(grep -cE '^FAIL|:F:' "$OUT/parity_hip.log") failures"
  grep -E "^parity-hip|^FAIL|:F:" "$OUT/parity_hip.log" | head -10 | tee -a "$SUM"
  NSA_HIP_NO_MFMA=1 NSA_BACKEND_PATH=/tmp/hipcu CK_FORK=no timeout 300 $B/tests/test_backward hip f32,f16,bf16 full \
    > "$OUT/backward_hip.log" 2>&1
  rc=$?; note "[$(el)] backward-hip (HIP sources on CUDA, full corpus): rc=$rc $(grep -cE '^FAIL|:F:' "$OUT/backward_hip.log") failures; $(grep -E '^backward-' "$OUT/backward_hip.log" | tail -1)"
  grep -E ":F:" "$OUT/backward_hip.log" | head -3 | cut -c1-400 | tee -a "$SUM"
  # the decode step (kernels/hip/decode.hip): every row against the hip forward, the step checks, determinism
  NSA_HIP_NO_MFMA=1 NSA_BACKEND_PATH=/tmp/hipcu CK_FORK=no timeout 300 $B/tests/test_decode hip small \
    > "$OUT/decode_hip.log" 2>&1
  rc=$?; note "[$(el)] decode-hip (HIP sources on CUDA, small corpus): rc=$rc $(grep -cE ':F:|:E:' "$OUT/decode_hip.log") failures; $(grep -E '^decode-hip: [0-9]' "$OUT/decode_hip.log" | tail -1 | cut -c1-300)"
  grep -E ":F:|:E:" "$OUT/decode_hip.log" | head -3 | cut -c1-400 | tee -a "$SUM"
fi
if has bench; then
  for cls in ${BENCH_CLASSES:-sm90}; do for dqk in 128 192; do
    env $(target $cls) timeout 200 $NSA bench --backend cuda --T ${BENCH_T:-8192,16384,32768,65536} --dqk $dqk --dv 128 \
      --iters 5 --warmup 1 --no-stages --no-dense > "$OUT/bench_${cls}_$dqk.log" 2>&1
    rc=$?; note "[$(el)] bench $cls Dqk=$dqk rc=$rc"
    grep -E "^ +[0-9]+ " "$OUT/bench_${cls}_$dqk.log" | tee -a "$SUM"
  done; done
fi
if has baseline && [ -n "$OLD_PID" ]; then
  wait $OLD_PID
  note "[$(el)] old tree build: $(tail -1 /tmp/old_build.log)"
  OLDP=$PWD/.old/build/backends/cuda
  IFS=';' read -ra shapes <<< "${BASE_SHAPES:---dqk 128 --dv 128;--dqk 192 --dv 128;--hq 32 --hkv 8 --dqk 128 --dv 128}"
  for cls in ${BASE_CLASSES:-sm90}; do for args in "${shapes[@]}"; do
    for round in $(seq 1 ${BASE_ROUNDS:-2}); do
      for tree in old new; do
        if [ $tree = old ]; then bin=.old/build/tools/nsa; bp=$OLDP; else bin=$NSA; bp=$NSA_BACKEND_PATH; fi
        env $(target $cls) NSA_BACKEND_PATH=$bp timeout 150 $bin bench --backend cuda --T ${BASE_T:-65536} $args \
          --iters 7 --warmup 2 --no-stages --no-dense > /tmp/bb.log 2>&1
        note "[$(el)] baseline $cls $tree round $round $args: $(grep -E '^ +[0-9]+ ' /tmp/bb.log | awk '{print $1" "$2" ms"}')"
      done
    done
  done; done
fi
if has bwdbench; then # the backward per stage (NSA_CUDA_PROFILE) and in total at BWD_T, per shape in BWD_SHAPES;
  # beside it the dense backward of cuDNN / FlashAttention-2 (.bench/sdpa_baseline.py, copied from ../shared/bench)
  IFS=';' read -ra shapes <<< "${BWD_SHAPES:---dqk 128 --dv 128;--dqk 192 --dv 128;--hq 32 --hkv 8 --dqk 128 --dv 128}"
  bwd_forces=${BWD_FORCES:-none}
  for cls in ${BWD_CLASSES:-sm90}; do for args in "${shapes[@]}"; do for fo in $bwd_forces; do
    tag=$(echo "$cls $args $fo" | tr -d '-' | tr ' :,' '___')
    env $(target $cls) $([ $fo = none ] || echo NSA_CUDA_FORCE=$fo) NSA_CUDA_PROFILE=1 timeout 240 $NSA bench \
      --backend cuda --T ${BWD_T:-16384,65536} $args --backward --iters 5 --warmup 1 --no-stages --no-dense \
      > "$OUT/bwdbench_$tag.log" 2>&1
    rc=$?; note "[$(el)] bwdbench $cls $args force $fo rc=$rc"
    grep -E "^ +[0-9]+ |bwd" "$OUT/bwdbench_$tag.log" | tee -a "$SUM"
    for T in $(echo ${BWD_T:-16384,65536} | tr ',' ' '); do
      grep "T=$T)" "$OUT/bwdbench_$tag.log" | grep BWD_STORE | tail -1 | cut -c1-900 | tee -a "$SUM"
    done
    if [ -f .bench/sdpa_baseline.py ] && [ "$cls" = sm90 ] && [ "$fo" = "${bwd_forces%% *}" ]; then
      hq=$(echo "$args" | grep -oE -- '--hq [0-9]+' | awk '{print $2}'); hkv=$(echo "$args" | grep -oE -- '--hkv [0-9]+' | awk '{print $2}')
      dqk=$(echo "$args" | grep -oE -- '--dqk [0-9]+' | awk '{print $2}'); dv=$(echo "$args" | grep -oE -- '--dv [0-9]+' | awk '{print $2}')
      timeout 200 python3 .bench/sdpa_baseline.py --T $(echo ${BWD_T:-16384,65536} | tr ',' ' ') --hq ${hq:-64} \
        --hkv ${hkv:-4} --dqk ${dqk:-192} --dv ${dv:-128} --iters 5 > "$OUT/sdpa_$tag.log" 2>&1
      note "[$(el)] sdpa_baseline $args rc=$?"; tee -a "$SUM" < "$OUT/sdpa_$tag.log" | tail -8
    fi
  done; done; done
fi
if has slcpass; then # the block-major kernel in passes (NSA_CUDA_SLC_PASS_MAX): the small corpus, and bitwise the one-pass result
  NSA_CUDA_SLC_PASS_MAX=200000 timeout 200 $B/tests/test_oracle cuda f16,bf16,fixed small > /tmp/sp.log 2>&1
  rc=$?; note "[$(el)] parity-cuda small corpus, NSA_CUDA_SLC_PASS_MAX=200000: rc=$rc $(grep -cE '^FAIL|:F:' /tmp/sp.log) failures, $(grep -hE '^parity-cuda' /tmp/sp.log | grep -oE '[0-9]+ passed' | tr '\n' ' ')"
  grep -E "^FAIL|:F:" -A1 /tmp/sp.log | head -4 | tee -a "$SUM"
  for lim in default 3000000; do
    env $([ $lim = default ] && echo X_UNUSED=1 || echo NSA_CUDA_SLC_PASS_MAX=$lim) NSA_CUDA_PROFILE=1 timeout 120 \
      $NSA run --backend cuda --T 8192 --hq 32 --hkv 8 --dqk 128 --dv 128 --iters 1 --warmup 0 \
      --outputs /tmp/sp_$lim > /tmp/sp_$lim.log 2>&1
    rc=$?; note "[$(el)] slc passes $lim: rc=$rc $(grep -E 'PASS|FAIL' /tmp/sp_$lim.log | tr '\n' ' ' | cut -c1-200)"
  done
  for f in o.npy lse_slc.npy; do
    cmp -s /tmp/sp_default/$f /tmp/sp_3000000/$f && note "  $f bitwise equal (passes vs one pass)" \
      || note "  $f DIFFERS (passes vs one pass) or missing"
  done
fi
if has gpucorpus; then # the gpu corpus (tests/common/corpus.c: model sizes, G = 1, 4, 7, 8, 16, T up to 8192) per class
  for cls in ${GPU_CLASSES:-sm90 sm80}; do
    env $(target $cls) timeout 500 $B/tests/test_oracle cuda ${GPU_MODES:-bf16,fixed} gpu > "$OUT/gpucorpus_$cls.log" 2>&1
    rc=$?; note "[$(el)] parity-cuda gpu corpus, class $cls: rc=$rc $(grep -cE '^FAIL|:F:' "$OUT/gpucorpus_$cls.log") failures"
    grep -E "^parity-cuda|:F:" "$OUT/gpucorpus_$cls.log" | head -6 | tee -a "$SUM"
  done
fi
if has slcncu; then # the block-major kernels at 64k, G = 4 (Hq 32, Hkv 8): time per kernel name summed over the passes
  timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:'slc_blk|slc_map|Radix|Scan' \
    $NSA run --backend cuda --T 65536 --hq 32 --hkv 8 --dqk 128 --dv 128 --iters 1 --warmup 0 --check-tokens 0 \
    > "$OUT/slcncu.log" 2>&1
  note "[$(el)] slcncu rc=$?:"
  ncu_times "$OUT/slcncu.log"
fi
if has bwdncu; then # the backward's attention kernels under ncu at 64k: time per kernel name, per Dqk in BWDNCU_DQK,
  # default and under each NSA_CUDA_FORCE of BWDNCU_FORCES (only the forced kernels differ, so no old tree is needed)
  for dqk in ${BWDNCU_DQK:-128 192}; do for fo in none ${BWDNCU_FORCES:-bwd_cmp_attn:bwd_attn_sm80,bwd_win_attn:bwd_attn_sm80}; do
    env $([ $fo = none ] && echo X_UNUSED=1 || echo NSA_CUDA_FORCE=$fo) timeout 200 ncu --clock-control none \
      --metrics gpu__time_duration.sum -k regex:"${BWDNCU_REGEX:-bwd_(rows|keys)_}" $NSA run --backend cuda --T 65536 \
      --dqk $dqk --dv 128 --backward --iters 1 --warmup 0 --check-tokens 0 > /tmp/bwdncu.log 2>&1
    note "[$(el)] bwdncu Dqk=$dqk force $fo rc=$?:"
    ncu_times /tmp/bwdncu.log
  done; done
fi
if has groups; then # issue 14's table: nsa bench per GQA shape at GROUP_T beside cuDNN (.bench/sdpa_baseline.py)
  # in the same call, the 64k per-stage profile, and the same with slc_attn forced to slc_sm80 (the earlier kernel)
  IFS=';' read -ra shapes <<< "${GROUP_SHAPES:-64 4 128;64 4 192;28 4 128;32 8 128;16 4 128;4 4 128}"
  for sh in "${shapes[@]}"; do
    read -r hq hkv dqk <<< "$sh"
    tag="hq${hq}_hkv${hkv}_d${dqk}"
    timeout 200 $NSA bench --backend cuda --T ${GROUP_T:-8192,16384,65536} --hq $hq --hkv $hkv --dqk $dqk --dv 128 \
      --iters 7 --warmup 2 --no-stages --no-dense > "$OUT/groups_$tag.log" 2>&1
    note "[$(el)] bench Hq $hq Hkv $hkv Dqk $dqk rc=$?: $(grep -E '^ +[0-9]+ ' "$OUT/groups_$tag.log" | awk '{print $1"="$2"ms"}' | tr '\n' ' ')"
    for force in ${GROUP_FORCES:-none slc_attn:slc_sm80}; do
      env $([ $force = none ] && echo X_UNUSED=1 || echo NSA_CUDA_FORCE=$force) NSA_CUDA_PROFILE=1 timeout 100 \
        $NSA run --backend cuda --T 65536 --hq $hq --hkv $hkv --dqk $dqk --dv 128 --iters 3 --warmup 1 \
        --check-tokens 0 > /tmp/gp.log 2>&1
      note "[$(el)]   profile 64k ($force): $(grep 'nsa-cuda profile' /tmp/gp.log | tail -1 | cut -c1-900)"
    done
    if [ -f .bench/sdpa_baseline.py ]; then
      timeout 200 python3 .bench/sdpa_baseline.py --T $(echo ${GROUP_T:-8192,16384,65536} | tr ',' ' ') --hq $hq \
        --hkv $hkv --dqk $dqk --dv 128 --iters 7 --no-backward > "$OUT/sdpa_$tag.log" 2>&1
      note "[$(el)]   sdpa_baseline rc=$?"; grep -iE "cudnn|flash" "$OUT/sdpa_$tag.log" | head -8 | tee -a "$SUM"
    fi
  done
fi
if has decbench; then # issue 15: nsa bench --decode (caches filled directly) beside sdpa_baseline.py --decode, same call
  for dq in ${DEC_DQK:-128 192}; do
    timeout 300 $NSA bench --backend cuda --decode --batch ${DEC_B:-1,64} --context ${DEC_C:-8192,32768,65536,131072} \
      --tq ${DEC_TQ:-1,4} --hq 64 --hkv 4 --dqk $dq --dv 128 --iters 20 --warmup 3 > "$OUT/decbench_d$dq.log" 2>&1
    note "[$(el)] nsa bench --decode Dqk $dq rc=$?"; head -40 "$OUT/decbench_d$dq.log" | tee -a "$SUM"
    if [ -f .bench/sdpa_baseline.py ]; then
      for b in $(echo ${DEC_B:-1,64} | tr ',' ' '); do
        timeout 200 python3 .bench/sdpa_baseline.py --decode --batch $b --T $(echo ${DEC_C:-8192,32768,65536,131072} | tr ',' ' ') \
          --hq 64 --hkv 4 --dqk $dq --dv 128 --iters 20 --no-backward >> "$OUT/decsdpa_d$dq.log" 2>&1
      done
      note "[$(el)]   sdpa_baseline --decode rc=$?"; grep -iE "cudnn|flash" "$OUT/decsdpa_d$dq.log" | cut -c1-220 | tee -a "$SUM"
    fi
  done
fi
if has decncu; then # issue 15: the decode step's kernels under ncu, one step of DECNCU_B (64,1) at 64k, Dqk 128: time, DRAM bytes
  for b in $(echo ${DECNCU_B:-64,1} | tr ',' ' '); do
    timeout 300 ncu --clock-control none -k regex:'check_|append_|compress_|dec_attn|attn_kernel|merge_|probs_|select_|combine_' \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
      $NSA bench --backend cuda --decode --batch $b --context 65536 --tq 1 --hq 64 --hkv 4 --dqk 128 --dv 128 --iters 1 \
      --warmup 0 --no-dense > "$OUT/decncu_b$b.log" 2>&1
    note "[$(el)] decncu batch $b rc=$? (per kernel: launches, us, DRAM MB, L2 MB read, warps active %):"
    awk '/^  [a-zA-Z_].*\(/ {k=$0; gsub(/\(anonymous namespace\)::/, "", k); sub(/^  (void )?/, "", k); sub(/[<(].*/, "", k); sub(/.*::/, "", k); c[k]++}
         /gpu__time_duration.sum/ {u=$(NF-1); v=$NF; gsub(",", "", v); if (u=="msecond") v*=1000; if (u=="nsecond") v/=1000; t[k]+=v}
         /dram__bytes_read.sum/ {u=$(NF-1); v=$NF; gsub(",", "", v); f=(u=="Gbyte")?1000:(u=="Mbyte")?1:(u=="Kbyte")?0.001:1e-6; d[k]+=v*f}
         /lts__t_sectors_srcunit_tex_op_read.sum/ {v=$NF; gsub(",", "", v); l[k]+=v*32/1e6}
         /sm__warps_active/ {v=$NF; gsub(",", "", v); w[k]+=v}
         END {for (k in t) printf "  %-28s %3d %9.1f %9.1f %9.1f %6.1f\n", substr(k,1,28), c[k], t[k], d[k], l[k], w[k]/c[k]}' \
      "$OUT/decncu_b$b.log" | sort -k3 -nr | tee -a "$SUM"
  done
  if [ "${DECNCU_DETAIL:-0}" = 1 ]; then # the attention launches at batch 64: speed of light, stalls, occupancy
    timeout 300 ncu --clock-control none -k regex:dec_attn_sm80 --section SpeedOfLight --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      $NSA bench --backend cuda --decode --batch 64 --context 65536 --tq 1 --hq 64 --hkv 4 --dqk 128 --dv 128 \
      --iters 1 --warmup 0 --no-dense > "$OUT/decncu_detail.log" 2>&1
    note "[$(el)] decncu detail (DECNCU_DETAIL=1) rc=$?: $OUT/decncu_detail.log"
    grep -E "dec_attn_sm80_kernel<|Duration|DRAM Throughput|Warp Cycles Per Issued|Achieved Occupancy" \
      "$OUT/decncu_detail.log" | sed 's/(DecGeom.*//' | cut -c1-120 | tee -a "$SUM"
  fi
fi
if has decsrc; then # issue 15: where the decode attention's warps stall, per SASS line (one step, DECSRC_B (1), 64k, D 128)
  timeout 300 ncu --clock-control none -k regex:dec_attn_sm80 --section WarpStateStats --section SourceCounters \
    --section SpeedOfLight -f -o /tmp/decsrc $NSA bench --backend cuda --decode --batch ${DECSRC_B:-1} --context 65536 \
    --tq 1 --hq 64 --hkv 4 --dqk 128 --dv 128 --iters 1 --warmup 0 --no-dense > /tmp/decsrc_run.log 2>&1
  note "[$(el)] decsrc batch ${DECSRC_B:-1} rc=$?"
  ncu --import /tmp/decsrc.ncu-rep --page details > "$OUT/decsrc.txt" 2>&1
  ncu --import /tmp/decsrc.ncu-rep --page source --csv --print-source sass > "$OUT/decsrc_sass.csv" 2>&1
  grep -E "dec_attn_sm80_kernel<|Duration" "$OUT/decsrc.txt" | sed 's/(DecGeom.*//' | tee -a "$SUM"
fi
if has oclbench; then # issue 18: NVIDIA's OpenCL at the paper shape, v3 and v2 attention, per-stage profile (OPENCL=1 build)
  for ver in v3 v2; do
    NSA_OPENCL_KERNELS=$ver NSA_OPENCL_PLATFORM=NVIDIA timeout 240 $NSA bench --backend opencl --T ${OCL_T:-8192} \
      --iters 3 --warmup 1 --no-stages --no-dense > "$OUT/oclbench_$ver.log" 2>&1
    note "[$(el)] opencl bench $ver rc=$?: $(grep -E '^ +[0-9]+ ' "$OUT/oclbench_$ver.log" | awk '{print $1"="$2"ms "$3"TFLOP/s"}' | tr '\n' ' ')"
    NSA_OPENCL_KERNELS=$ver NSA_OPENCL_PLATFORM=NVIDIA NSA_OPENCL_PROFILE=1 timeout 120 $NSA run --backend opencl \
      --T ${OCL_T:-8192} --iters 1 --warmup 1 --check-tokens 256 > /tmp/oclp.log 2>&1
    note "[$(el)]   run $ver: $(grep -E 'PASS|FAIL' /tmp/oclp.log | tr '\n' ' ' | cut -c1-160)"
    grep -iE "cmp_attn|win_attn|slc_attn|scores|total" /tmp/oclp.log | tail -8 | cut -c1-200 | tee -a "$SUM"
  done
fi
if has sdpa; then
  for dqk in 128; do
    timeout 150 python3 tools/dense_baseline.py --T 65536 --hq 64 --hkv 4 --dqk $dqk --dv 128 --iters 6 \
      > /tmp/sdpa.log 2>&1
    rc=$?; note "[$(el)] sdpa Dqk=$dqk rc=$rc:"
    grep -o '"baseline": "[a-z-]*".*"fwd_ms": [0-9.]*' /tmp/sdpa.log | sed 's/"hq.*"device": "[^"]*", //' | tee -a "$SUM"
  done
fi
if has ncu; then # NCU_SPEC kernel:launch-count (default the sm90 kernels), NCU_T (32768), NCU_DQK (128)
  for spec in ${NCU_SPEC:-scores_sm90_kernel:1 attn_sm90_kernel:2}; do
    k=${spec%%:*}; n=${spec##*:}
    timeout 240 ncu --clock-control none -k regex:$k --launch-count $n --section SpeedOfLight --section Occupancy \
      --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis --section SourceCounters \
      --section MemoryWorkloadAnalysis \
      -f -o /tmp/ncu_$k $NSA run --backend cuda --T ${NCU_T:-32768} --dqk ${NCU_DQK:-128} --dv 128 --iters 1 --warmup 0 \
      --check-tokens 0 ${NCU_ARGS:-} > /tmp/ncu_run.log 2>&1
    rc=$?; note "[$(el)] ncu $k rc=$rc"
    ncu --import /tmp/ncu_$k.ncu-rep --page details > "$OUT/ncu_$k.txt" 2>&1
    ncu --import /tmp/ncu_$k.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_src_$k.csv" 2>&1
  done
fi
if has l2; then # L2 sectors the SMs read, DRAM bytes and instructions of one launch (L2_SPEC kernel regexes, T = 64k)
  for k in ${L2_SPEC:-slc_sm80_g16_kernel attn_sm90_kernel scores_sm90_kernel}; do
    for dqk in 128 192; do
      timeout 200 ncu --clock-control none -k regex:$k --launch-count 1 --metrics \
        gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,smsp__inst_executed.sum \
        $NSA run --backend cuda --T 65536 --dqk $dqk --dv 128 --iters 1 --warmup 0 --check-tokens 0 > /tmp/l2.log 2>&1
      rc=$?; note "[$(el)] l2 $k Dqk=$dqk rc=$rc: $(grep -E '^ +(gpu__|lts__|dram__|smsp__)' /tmp/l2.log | awk '{print $1"="$(NF)}' | tr '\n' ' ')"
    done
  done
fi
if has ldgsts; then # L2 sectors per data sector of cp.async by shared-memory layout (dev/cuda/ldgsts_l2.cu)
  nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/ldgsts dev/cuda/ldgsts_l2.cu > /tmp/ldgsts_b.log 2>&1 &&
    timeout 120 ncu --clock-control none --metrics lts__t_sectors_srcunit_tex_op_read.sum,gpu__time_duration.sum \
      /tmp/ldgsts > "$OUT/ldgsts.log" 2>&1
  rc=$?; note "[$(el)] ldgsts rc=$rc"
  grep -E "data sectors|copy_chunks|lts__t_sectors|gpu__time" "$OUT/ldgsts.log" | sed 's/(int \*)//' | tee -a "$SUM"
fi
note "[$(el)] done"
# the device tool brings back at most 8 files: every log in one archive, the summary beside it
( cd "$OUT" && tar czf /tmp/nsa-logs.tgz --exclude=logs.tgz . ) && find "$OUT" -mindepth 1 ! -name summary.txt -delete &&
  mv /tmp/nsa-logs.tgz "$OUT/logs.tgz"
