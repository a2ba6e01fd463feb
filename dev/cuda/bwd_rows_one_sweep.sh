#!/bin/bash
# dev/cuda/bwd_rows_one_sweep.sh: one device call that measures this tree against .old (git archive
# of 7dfb1d5, before dev/cuda/bwd_rows_one_sweep_v1.patch): builds both, test_backward f16 / bf16
# small as sm90, nsa bench --backward at 64k old beside new (D 128, Dqk 192, G 4), the gradient hash
# over 20 processes, memcheck, the full backward corpus as sm80 and sm86, the sm80-class bench.
# Needs .debs (check, libsubunit). Steps run in order of need: a call cut at its limit keeps the first.
. dev/cuda/call_common.sh
CK_FORK=no timeout 100 $B/tests/test_backward cuda f16,bf16 small > /tmp/bs.log 2>&1
note "[$(el)] backward sm90 f16,bf16 small rc=$? $(grep -E '^backward-' /tmp/bs.log | tail -1)"; grep ":F:" /tmp/bs.log | head -3 | cut -c1-300 | tee -a "$SUM"
wait $OLD_PID; note "[$(el)] old build $(tail -1 /tmp/old_build.log)"
bench old --dqk 128 --dv 128; bench new --dqk 128 --dv 128
bench old --dqk 192 --dv 128; bench new --dqk 192 --dv 128
bench old --hq 32 --hkv 8 --dqk 128 --dv 128; bench new --hq 32 --hkv 8 --dqk 128 --dv 128
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
NSA_CUDA_TARGET=sm80 bench old --dqk 128 --dv 128; NSA_CUDA_TARGET=sm80 bench new --dqk 128 --dv 128
