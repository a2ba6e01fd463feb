# dev/cuda/call_common.sh: the preamble the dev/cuda/*.sh device calls share (sourced, not run).
# Sets OUT, SUM, note (a line to the summary), el (seconds since the start); unpacks .debs (check,
# libsubunit) for the tests; builds .old (a git archive of an earlier commit: the nsa tool and the
# cuda module, in the background, OLD_PID) and this tree in build-dev (B, NSA; the tool, the module
# and the targets in CALL_TARGETS); exports NSA_BACKEND_PATH and NSA_CACHE_DIR for this tree and
# OLDP for the old one. bench TREE ARGS...: nsa bench --backward at 64k with the per-stage profile
# (NSA_CUDA_PROFILE), TREE old or new, its rows and profile line into the summary.
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
  ninja -C $B -j12 tools/nsa backends/cuda/libnsa_backend_cuda.so ${CALL_TARGETS:-tests/test_backward}; } > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
note "[$(el)] build ok"
export NSA_BACKEND_PATH=$PWD/$B/backends/cuda NSA_CACHE_DIR=$PWD/$B/nsa-cache
OLDP=$PWD/.old/build/backends/cuda
bench() { # tree args...
  local tree=$1 bin bp; shift
  if [ $tree = old ]; then bin=.old/build/tools/nsa; bp=$OLDP; else bin=$NSA; bp=$NSA_BACKEND_PATH; fi
  NSA_BACKEND_PATH=$bp NSA_CUDA_PROFILE=1 timeout 100 $bin bench \
    --backend cuda --T 65536 "$@" --backward --iters 3 --warmup 1 --no-stages --no-dense > /tmp/bb.log 2>&1
  note "[$(el)] $tree ${NSA_CUDA_TARGET:-} $* rc=$? $(grep -E '^ +(bwd|[0-9]+) ' /tmp/bb.log | tr -s ' ' | tr '\n' '|')"
  grep 'nsa-cuda profile' /tmp/bb.log | tail -1 | cut -c1-900 | tee -a "$SUM"
}
