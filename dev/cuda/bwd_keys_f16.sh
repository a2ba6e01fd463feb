#!/bin/bash
# dev/cuda/bwd_keys_f16.sh: one device call that measures this tree (the keys kernels on f16 copies in bf16
# calls, bwd_f16.cu) against .old (git archive of the commit before it): builds both, test_backward bf16 on
# the full corpus as sm90 (with the power-of-two and far-range checks) and f16 on the small one, nsa bench
# --backward at 64k old beside new (D 128, G 4 at 32 / 8, Dqk 192), cuDNN's dense backward beside them
# (.bench/sdpa_baseline.py), the sm80 / sm86 classes on the small corpus, racecheck and memcheck, and the
# gradient hash over 8 processes. Needs .debs (check, libsubunit). Steps run in order of need.
. dev/cuda/call_common.sh
tb() { # class modes corpus log
  env $([ $1 = sm90 ] && echo X=1 || echo NSA_CUDA_TARGET=$1) CK_FORK=no timeout 200 $B/tests/test_backward cuda $2 $3 > "$4" 2>&1
  note "[$(el)] backward $1 $2 $3 rc=$? $(grep -E '^backward-|Checks' "$4" | tr '\n' ' ')"; grep ":F:" "$4" | head -3 | cut -c1-300 | tee -a "$SUM"
}
tb sm90 bf16 small /tmp/bs.log
wait $OLD_PID; note "[$(el)] old build $(tail -1 /tmp/old_build.log)"
bench old --dqk 128 --dv 128; bench new --dqk 128 --dv 128
bench new --hq 32 --hkv 8 --dqk 128 --dv 128; bench old --hq 32 --hkv 8 --dqk 128 --dv 128
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
sdpa() { timeout 120 python3 .bench/sdpa_baseline.py --T 65536 "$@" --iters 5 > /tmp/sd.log 2>&1; note "[$(el)] sdpa $* rc=$?"; tail -6 /tmp/sd.log | tee -a "$SUM"; }
[ -f .bench/sdpa_baseline.py ] && sdpa --hq 64 --hkv 4 --dqk 128 --dv 128
[ -f .bench/sdpa_baseline.py ] && sdpa --hq 32 --hkv 8 --dqk 128 --dv 128
tb sm80 bf16 small "$OUT/backward_sm80.log"
tb sm86 bf16 small "$OUT/backward_sm86.log"
bench old --dqk 192 --dv 128; bench new --dqk 192 --dv 128
NSA_CUDA_TARGET=sm80 bench old --dqk 128 --dv 128; NSA_CUDA_TARGET=sm80 bench new --dqk 128 --dv 128
