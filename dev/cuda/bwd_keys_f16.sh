#!/bin/bash
# dev/cuda/bwd_keys_f16.sh: one device call that measures this tree (the keys kernels on f16 copies in bf16
# calls, bwd_f16.cu) against .old (git archive of the commit before it): builds both, test_backward bf16 on
# the full corpus as sm90 (with the power-of-two and far-range checks) and f16 on the small one, nsa bench
# --backward at 64k old beside new (D 128, G 4 at 32 / 8, Dqk 192), cuDNN's dense backward beside them
# (.bench/sdpa_baseline.py), the sm80 / sm86 classes on the small corpus, racecheck and memcheck, and the
# gradient hash over 8 processes. Needs .debs (check, libsubunit). Steps run in order of need.
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
tb() { # class modes corpus log
  env $([ $1 = sm90 ] && echo X=1 || echo NSA_CUDA_TARGET=$1) CK_FORK=no timeout 200 $B/tests/test_backward cuda $2 $3 > "$4" 2>&1
  note "[$(el)] backward $1 $2 $3 rc=$? $(grep -E '^backward-|Checks' "$4" | tr '\n' ' ')"; grep ":F:" "$4" | head -3 | cut -c1-300 | tee -a "$SUM"
}
tb sm90 bf16 small /tmp/bs.log
wait $OLD_PID; note "[$(el)] old build $(tail -1 /tmp/old_build.log)"
bench() { # tree args...
  local tree=$1; shift
  if [ $tree = old ]; then bin=.old/build/tools/nsa; bp=$OLDP; else bin=$NSA; bp=$NSA_BACKEND_PATH; fi
  NSA_BACKEND_PATH=$bp NSA_CUDA_PROFILE=1 timeout 100 $bin bench \
    --backend cuda --T 65536 "$@" --backward --iters 3 --warmup 1 --no-stages --no-dense > /tmp/bb.log 2>&1
  note "[$(el)] $tree $* rc=$? $(grep -E '^ +(bwd|[0-9]+) ' /tmp/bb.log | tr -s ' ' | tr '\n' '|')"
  grep 'nsa-cuda profile' /tmp/bb.log | tail -1 | cut -c1-900 | tee -a "$SUM"
}
bench old --dqk 128 --dv 128; bench new --dqk 128 --dv 128
bench new --hq 32 --hkv 8 --dqk 128 --dv 128; bench old --hq 32 --hkv 8 --dqk 128 --dv 128
sdpa() { timeout 120 python3 .bench/sdpa_baseline.py --T 65536 "$@" --iters 5 > /tmp/sd.log 2>&1; note "[$(el)] sdpa $* rc=$?"; tail -6 /tmp/sd.log | tee -a "$SUM"; }
[ -f .bench/sdpa_baseline.py ] && sdpa --hq 64 --hkv 4 --dqk 128 --dv 128
[ -f .bench/sdpa_baseline.py ] && sdpa --hq 32 --hkv 8 --dqk 128 --dv 128
tb sm90 bf16 full "$OUT/backward_sm90.log"
tb sm90 f16 small "$OUT/backward_sm90_f16.log"
CK_FORK=no timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/test_backward cuda bf16 small > /tmp/bsan.log 2>&1
note "[$(el)] racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' /tmp/bsan.log | tail -1)"
CK_FORK=no timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_backward cuda bf16 small > /tmp/bmem.log 2>&1
note "[$(el)] memcheck rc=$? $(grep -E 'ERROR SUMMARY' /tmp/bmem.log | tail -1)"
for i in $(seq 1 8); do
  rm -rf /tmp/bdet; $NSA run --backend cuda --T 4096 --backward --check-tokens 0 --outputs /tmp/bdet >/dev/null 2>&1; rc=$?
  if [ $rc = 0 ] && [ -s /tmp/bdet/dq.npy ] && [ -s /tmp/bdet/dk.npy ]; then cat /tmp/bdet/d*.npy | md5sum; else echo "failed rc=$rc"; fi
done | sort | uniq -c > /tmp/bdet.txt
note "[$(el)] backward determinism: 8 processes, $(wc -l < /tmp/bdet.txt) distinct hash(es): $(cat /tmp/bdet.txt | tr '\n' ' ')"
tb sm80 bf16 small "$OUT/backward_sm80.log"
tb sm86 bf16 small "$OUT/backward_sm86.log"
bench old --dqk 192 --dv 128; bench new --dqk 192 --dv 128
NSA_CUDA_TARGET=sm80 bench old --dqk 128 --dv 128; NSA_CUDA_TARGET=sm80 bench new --dqk 128 --dv 128
