#!/bin/bash
# Where a decode step's attention CTAs spend their time (issue 15): builds the
# cuda module and the nsa tool with -DNSA_DEC_TRACE (decode_attn_sm80.cu's
# DM_TRACE: thread 0 of every CTA records the global timer at each phase into
# a device buffer, which nsa_decode_check prints), runs
# one step per batch in TRACE_B (default "1 64") at 64k, D 128, and writes
# the lines to $OUT/trace_b<B>.txt; dev/cuda/decode_trace.py summarises them.
# Run from the repository root on the GPU machine.
OUT=${OUT:-/tmp/nsa-out}
mkdir -p "$OUT"
B=build-trace
{ [ -f $B/build.ninja ] || meson setup $B -Dnvcc_archs=90a -Dnvcc_ptx= -Dhip=disabled -Dopencl=disabled \
    -Dtests=disabled -Dcuda_args=-DNSA_DEC_TRACE
  ninja -C $B -j16 tools/nsa backends/cuda/libnsa_backend_cuda.so; } > "$OUT/trace_build.log" 2>&1 ||
  { tail -20 "$OUT/trace_build.log"; exit 1; }
export NSA_BACKEND_PATH=$PWD/$B/backends/cuda LD_LIBRARY_PATH=$PWD/$B/core:$LD_LIBRARY_PATH
for b in ${TRACE_B:-1 64}; do
  timeout 120 $B/tools/nsa bench --backend cuda --decode --batch $b --context ${TRACE_C:-65536} --tq 1 --hq 64 --hkv 4 \
    --dqk ${TRACE_DQK:-128} --dv 128 --iters 1 --warmup 0 --no-dense > "$OUT/trace_b$b.txt" 2>&1
  echo "batch $b rc=$? lines $(grep -c '^nsa-trace' "$OUT/trace_b$b.txt")"
done
