#!/bin/bash
# dev/cuda/bwd_rows_slc8.sh: one device call that measures this tree against .old (git archive of the
# commit before bwd_rows_slc8_sm80_kernel): builds both, test_backward f16 / bf16 (sm90 full corpus,
# sm80 / sm86 small), racecheck and memcheck, the gradient hash over 8 processes, and
# nsa bench --backward at 64k old beside new at G 4 (Hq 32 / Hkv 8; D 128 and Dqk 192) and G 7 (28 / 4).
# Needs .debs (check, libsubunit). Steps run in order of need: a call cut at its limit keeps the first.
. dev/cuda/call_common.sh
tb() { # class corpus log
  env $([ $1 = sm90 ] && echo X=1 || echo NSA_CUDA_TARGET=$1) CK_FORK=no timeout 150 $B/tests/test_backward cuda f16,bf16 $2 > "$3" 2>&1
  note "[$(el)] backward $1 f16,bf16 $2 rc=$? $(grep -E '^backward-' "$3" | tail -1)"; grep ":F:" "$3" | head -3 | cut -c1-300 | tee -a "$SUM"
}
tb sm90 small /tmp/bs.log
wait $OLD_PID; note "[$(el)] old build $(tail -1 /tmp/old_build.log)"
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
