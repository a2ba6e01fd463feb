#!/bin/bash
# dev/cuda/bwd_rows_slc8.sh: one device call that measures this tree against .old (git archive of the
# commit before bwd_rows_slc8_sm80_kernel): builds both, test_backward f16 / bf16 (sm90 full corpus,
# sm80 / sm86 small), racecheck and memcheck, the gradient hash over 8 processes, and
# nsa bench --backward at 64k old beside new at G 4 (Hq 32 / Hkv 8; D 128 and Dqk 192) and G 7 (28 / 4).
# Needs .debs (check, libsubunit). Steps run in order of need: a call cut at its limit keeps the first.
OUT=${OUT:-/tmp/nsa-out}; mkdir -p "$OUT"; SUM=$OUT/summary.txt; : > "$SUM"
note() { echo "$*" | tee -a "$SUM"; }
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 ))s; }
mkdir -p /tmp/r && for f in .debs/*.deb; do dpkg -x "$f" /tmp/r; done
export PKG_CONFIG_SYSROOT_DIR=/tmp/r PKG_CONFIG_PATH=/tmp/r/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=/tmp/r/usr/lib/x86_64-linux-gnu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$SUM"
( cd .old && { [ -d build/meson-private ] || meson setup build -Dnvcc_archs=90a -Dnvcc_ptx= -Dhip=disabled -Dopencl=disabled -Dtests=disabled -Dfuzz=disabled; } > /tmp/old_build.log 2>&1 \
  && ninja -C build -j6 tools/nsa backends/cuda/libnsa_backend_cuda.so >> /tmp/old_build.log 2>&1; echo "rc=$?" >> /tmp/old_build.log ) &
OLD_PID=$!
B=build-dev; NSA=$B/tools/nsa
{ { [ -d $B/meson-private ] || meson setup $B -Dnvcc_archs=90a -Dnvcc_ptx= -Dhip=disabled -Dcuda=enabled -Dopencl=disabled -Dfuzz=disabled; } && \
  ninja -C $B -j12 tools/nsa backends/cuda/libnsa_backend_cuda.so tests/test_backward; } > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
note "[$(el)] build ok"
export NSA_BACKEND_PATH=$PWD/$B/backends/cuda NSA_CACHE_DIR=$PWD/$B/nsa-cache
OLDP=$PWD/.old/build/backends/cuda
tb() { # class corpus log
  env $([ $1 = sm90 ] && echo X=1 || echo NSA_CUDA_TARGET=$1) CK_FORK=no timeout 150 $B/tests/test_backward cuda f16,bf16 $2 > "$3" 2>&1
  note "[$(el)] backward $1 f16,bf16 $2 rc=$? $(grep -E '^backward-' "$3" | tail -1)"; grep ":F:" "$3" | head -3 | cut -c1-300 | tee -a "$SUM"
}
tb sm90 small /tmp/bs.log
wait $OLD_PID; note "[$(el)] old build $(tail -1 /tmp/old_build.log)"
bench() { # tree args...
  local tree=$1; shift
  if [ $tree = old ]; then bin=.old/build/tools/nsa; bp=$OLDP; else bin=$NSA; bp=$NSA_BACKEND_PATH; fi
  NSA_BACKEND_PATH=$bp NSA_CUDA_PROFILE=1 timeout 100 $bin bench \
    --backend cuda --T 65536 "$@" --backward --iters 3 --warmup 1 --no-stages --no-dense > /tmp/bb.log 2>&1
  note "[$(el)] $tree $* rc=$? $(grep -E '^ +(bwd|[0-9]+) ' /tmp/bb.log | tr -s ' ' | tr '\n' '|')"
  grep 'nsa-cuda profile' /tmp/bb.log | tail -1 | cut -c1-900 | tee -a "$SUM"
}
bench old --hq 32 --hkv 8 --dqk 128 --dv 128; bench new --hq 32 --hkv 8 --dqk 128 --dv 128
tb sm90 full "$OUT/backward_sm90.log"
tb sm80 small "$OUT/backward_sm80.log"
tb sm86 small "$OUT/backward_sm86.log"
CK_FORK=no timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/test_backward cuda bf16 small > /tmp/bsan.log 2>&1
note "[$(el)] racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' /tmp/bsan.log | tail -1)"
CK_FORK=no timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_backward cuda bf16 small > /tmp/bmem.log 2>&1
note "[$(el)] memcheck rc=$? $(grep -E 'ERROR SUMMARY' /tmp/bmem.log | tail -1)"
bench old --hq 28 --hkv 4 --dqk 128 --dv 128; bench new --hq 28 --hkv 4 --dqk 128 --dv 128
for i in $(seq 1 8); do
  rm -rf /tmp/bdet; $NSA run --backend cuda --T 4096 --hq 32 --hkv 8 --backward --check-tokens 0 --outputs /tmp/bdet >/dev/null 2>&1; rc=$?
  if [ $rc = 0 ] && [ -s /tmp/bdet/dq.npy ] && [ -s /tmp/bdet/dk.npy ]; then cat /tmp/bdet/d*.npy | md5sum; else echo "failed rc=$rc"; fi
done | sort | uniq -c > /tmp/bdet.txt
note "[$(el)] backward determinism (G 4): 8 processes, $(wc -l < /tmp/bdet.txt) distinct hash(es): $(cat /tmp/bdet.txt | tr '\n' ' ')"
bench old --hq 32 --hkv 8 --dqk 192 --dv 128; bench new --hq 32 --hkv 8 --dqk 192 --dv 128
