#!/bin/bash
# dev/cuda/bwd_rows_one_sweep.sh: one device call that measures this tree against .old (git archive
# of 7dfb1d5, before dev/cuda/bwd_rows_one_sweep_v1.patch): builds both, test_backward f16 / bf16
# small as sm90, nsa bench --backward at 64k old beside new (D 128, Dqk 192, G 4), the gradient hash
# over 20 processes, memcheck, the full backward corpus as sm80 and sm86, the sm80-class bench.
# Needs .debs (check, libsubunit). Steps run in order of need: a call cut at its limit keeps the first.
OUT=${OUT:-/tmp/nsa-out}; mkdir -p "$OUT"; SUM=$OUT/summary.txt; : > "$SUM"
note() { echo "$*" | tee -a "$SUM"; }
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 ))s; }
mkdir -p /tmp/r && for f in .debs/*.deb; do dpkg -x "$f" /tmp/r; done
export PKG_CONFIG_SYSROOT_DIR=/tmp/r PKG_CONFIG_PATH=/tmp/r/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=/tmp/r/usr/lib/x86_64-linux-gnu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$SUM"
( cd .old && { [ -d build/meson-private ] || meson setup build -Dnvcc_archs=90a -Dnvcc_ptx= -Dhip=disabled -Dopencl=disabled -Dtests=disabled -Dfuzz=disabled; } > /tmp/old_build.log 2>&1 \
  && ninja -C build -j6 tools/nsa backends/cuda/libnsa_backend_cuda.so >> /tmp/old_build.log 2>&1; echo "rc=$?" >> /tmp/old_build.log ) &
OLD_PID=$!
B=build-dev; NSA=$B/tools/nsa
{ { [ -d $B/meson-private ] || meson setup $B -Dnvcc_archs=90a -Dnvcc_ptx= -Dhip=disabled -Dcuda=enabled -Dopencl=disabled -Dfuzz=disabled; } && \
  ninja -C $B -j12 tools/nsa backends/cuda/libnsa_backend_cuda.so tests/test_backward; } > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
note "[$(el)] build ok"
export NSA_BACKEND_PATH=$PWD/$B/backends/cuda NSA_CACHE_DIR=$PWD/$B/nsa-cache
OLDP=$PWD/.old/build/backends/cuda
CK_FORK=no timeout 100 $B/tests/test_backward cuda f16,bf16 small > /tmp/bs.log 2>&1
note "[$(el)] backward sm90 f16,bf16 small rc=$? $(grep -E '^backward-' /tmp/bs.log | tail -1)"; grep ":F:" /tmp/bs.log | head -3 | cut -c1-300 | tee -a "$SUM"
wait $OLD_PID; note "[$(el)] old build $(tail -1 /tmp/old_build.log)"
bench() { # tree cls args...
  local tree=$1 cls=$2; shift 2
  if [ $tree = old ]; then bin=.old/build/tools/nsa; bp=$OLDP; else bin=$NSA; bp=$NSA_BACKEND_PATH; fi
  env $([ $cls = sm90 ] && echo X=1 || echo NSA_CUDA_TARGET=$cls) NSA_BACKEND_PATH=$bp NSA_CUDA_PROFILE=1 timeout 100 $bin bench \
    --backend cuda --T 65536 "$@" --backward --iters 3 --warmup 1 --no-stages --no-dense > /tmp/bb.log 2>&1
  note "[$(el)] $tree $cls $* rc=$? $(grep -E '^ +(bwd|[0-9]+) ' /tmp/bb.log | tr -s ' ' | tr '\n' '|')"
  grep 'nsa-cuda profile' /tmp/bb.log | tail -1 | cut -c1-900 | tee -a "$SUM"
}
bench old sm90 --dqk 128 --dv 128; bench new sm90 --dqk 128 --dv 128
bench old sm90 --dqk 192 --dv 128; bench new sm90 --dqk 192 --dv 128
bench old sm90 --hq 32 --hkv 8 --dqk 128 --dv 128; bench new sm90 --hq 32 --hkv 8 --dqk 128 --dv 128
for i in $(seq 1 20); do
  rm -rf /tmp/bdet; $NSA run --backend cuda --T 4096 --backward --check-tokens 0 --outputs /tmp/bdet >/dev/null 2>&1; rc=$?
  if [ $rc = 0 ] && [ -s /tmp/bdet/dq.npy ] && [ -s /tmp/bdet/dk.npy ]; then cat /tmp/bdet/d*.npy | md5sum; else echo "failed rc=$rc"; fi
done | sort | uniq -c > /tmp/bdet.txt
note "[$(el)] backward determinism: 20 processes, $(wc -l < /tmp/bdet.txt) distinct hash(es): $(cat /tmp/bdet.txt | tr '\n' ' ')"
CK_FORK=no timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_backward cuda bf16 small > /tmp/bmem.log 2>&1
note "[$(el)] memcheck rc=$? $(grep -E 'ERROR SUMMARY' /tmp/bmem.log | tail -1)"
for cls in sm80 sm86; do
  NSA_CUDA_TARGET=$cls CK_FORK=no timeout 100 $B/tests/test_backward cuda f16,bf16 full > "$OUT/backward_$cls.log" 2>&1
  note "[$(el)] backward $cls f16,bf16 full rc=$? $(grep -E '^backward-' "$OUT/backward_$cls.log" | tail -1)"; grep ":F:" "$OUT/backward_$cls.log" | head -3 | cut -c1-300 | tee -a "$SUM"
done
bench old sm80 --dqk 128 --dv 128; bench new sm80 --dqk 128 --dv 128
