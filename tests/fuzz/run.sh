#!/usr/bin/env bash
# Runs the libFuzzer targets of a fuzz build for a bounded time each and fails
# on any finding (crash, sanitizer report, leak, timeout, allocation or RSS
# over the limit).
#
#   tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET [TARGET...]]
#
# BUILD_DIR is a clang build with the fuzzers (README, "Fuzzing"); SECONDS
# defaults to 50; TARGETs are npy, parity, plan (default: all three, one after
# the other). The seeds in tests/fuzz/corpus/<target> are read, never written:
# what the fuzzer adds goes to BUILD_DIR/fuzz/corpus/<target> and is kept
# between runs (a long run picks up where the last one stopped). A finding's
# input is written to BUILD_DIR/fuzz/artifacts/<target>/ and its log is shown;
# reproduce it with BUILD_DIR/tests/fuzz/fuzz_<target> ARTIFACT.
# For hours: tests/fuzz/run.sh build-fuzz 3600 plan (FUZZ_JOBS=N runs N jobs).
set -u
build=${1:?usage: tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET [TARGET...]]}
secs=${2:-50}
shift $(($# < 2 ? $# : 2))
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(npy parity plan)
src=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$build" && pwd) || exit 1
jobs=${FUZZ_JOBS:-1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
for t in "${targets[@]}"; do
  exe=$build/tests/fuzz/fuzz_$t
  if [ ! -x "$exe" ]; then
    echo "fuzz $t: $exe is missing (configure BUILD_DIR with CC=clang -Dfuzz=enabled)"
    status=1
    continue
  fi
  work=$build/fuzz/corpus/$t art=$build/fuzz/artifacts/$t log=$build/fuzz/$t.log
  rm -rf "$art" && mkdir -p "$work" "$art"
  extra=()
  [ "$jobs" -gt 1 ] && extra=(-jobs="$jobs" -workers="$jobs")
  rm -f "$build"/fuzz/fuzz-*.log
  # (in BUILD_DIR/fuzz: with -jobs, each job logs to fuzz-N.log there)
  (cd "$build/fuzz" && "$exe" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 \
    -artifact_prefix="$art/" "${extra[@]}" "$work" "$src/corpus/$t") >"$log" 2>&1
  rc=$?
  execs=$(cat "$log" "$build"/fuzz/fuzz-*.log 2>/dev/null | grep -o 'stat::number_of_executed_units: [0-9]*' |
          awk '{s += $2} END {print s + 0}')
  findings=$(find "$art" -type f | wc -l)
  units=$(find "$work" -type f | wc -l)
  echo "fuzz $t: $execs executions in ${secs} s, $findings findings (exit $rc), corpus $units units"
  if [ $rc -ne 0 ] || [ "$findings" -ne 0 ]; then
    status=1
    grep -E "ERROR|SUMMARY|runtime error|==[0-9]+==" "$log" | head -20
    tail -30 "$log"
  fi
done
exit $status
