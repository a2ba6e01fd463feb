#!/usr/bin/env bash
# The nsa command as a user runs it: the "must show" items, checked.
#   test_cli.sh /path/to/nsa
set -u
nsa=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok()   { passes=$((passes + 1)); echo "ok   $1"; }
bad()  { fails=$((fails + 1)); echo "FAIL $1"; [ -f "$tmp/out" ] && sed 's/^/     | /' "$tmp/out" | tail -20; }
expect() { # expect NAME WANT_RC GREP_PATTERN -- command...
  local name=$1 want=$2 pat=$3; shift 4
  "$@" >"$tmp/out" 2>&1
  local rc=$?
  if { [ "$want" = nonzero ] && [ $rc -ne 0 ]; } || [ "$want" = "$rc" ]; then
    if [ -z "$pat" ] || grep -Eq "$pat" "$tmp/out"; then ok "$name"; return; fi
    echo "     (output lacks /$pat/)"
  else
    echo "     (exit $rc, wanted $want)"
  fi
  bad "$name"
}

expect "nsa --help"                 0 "info"            -- "$nsa" --help
expect "nsa info lists cpu"         0 "cpu +available"  -- "$nsa" info
for sub in info run parity bench; do
  expect "nsa $sub --help"          0 "usage"           -- "$nsa" "$sub" --help
done
expect "unknown flag is exit 2"     2 ""                -- "$nsa" run --no-such-flag
expect "NSA_BACKEND=nope names cpu" nonzero "cpu: available" -- env NSA_BACKEND=nope "$nsa" run
expect "run on cpu checks the reference" 0 "PASS" -- \
  "$nsa" run --backend cpu --T 300 --hq 8 --hkv 2 --dqk 32 --dv 16 --n 4 --w 64 --dtype f32 --outputs "$tmp/o1"
for f in o lse_cmp lse_slc lse_win selected; do
  if head -c 6 "$tmp/o1/$f.npy" 2>/dev/null | grep -q "NUMPY"; then ok "--outputs wrote $f.npy"; else bad "--outputs wrote $f.npy"; fi
done
# --inputs: o of the first run has shape [T, Hq, Dv] = [300, 8, 16], a valid q
# when Dqk = 16. The file must be used (o differs from the drawn-q run) and
# the run must be reproducible (same file, same o).
mkdir -p "$tmp/in" && cp "$tmp/o1/o.npy" "$tmp/in/q.npy"
small=(run --backend cpu --T 300 --hq 8 --hkv 2 --dqk 16 --dv 16 --n 4 --w 64 --dtype f32)
expect "--inputs reads q from .npy" 0 "PASS" -- "$nsa" "${small[@]}" --inputs "$tmp/in" --outputs "$tmp/o2"
expect "same inputs, same output"   0 "PASS" -- "$nsa" "${small[@]}" --inputs "$tmp/in" --outputs "$tmp/o3"
expect "drawn inputs"               0 "PASS" -- "$nsa" "${small[@]}" --outputs "$tmp/o4"
if cmp -s "$tmp/o2/o.npy" "$tmp/o3/o.npy"; then ok "--inputs run is reproducible"; else bad "--inputs run is reproducible"; fi
if ! cmp -s "$tmp/o2/o.npy" "$tmp/o4/o.npy"; then ok "--inputs q was used"; else bad "--inputs q was used"; fi
expect "--inputs rejects a wrong shape" nonzero "q" -- \
  "$nsa" run --backend cpu --T 300 --hq 8 --hkv 2 --dqk 32 --dv 16 --n 4 --w 64 --dtype f32 --inputs "$tmp/in"
expect "parity --backends cpu"      0 "cpu"             -- "$nsa" parity --backends cpu --corpus small --dtypes f32,bf16
expect "parity --save"              0 ""                -- "$nsa" parity --backends cpu --corpus small --dtypes f32 --save "$tmp/p.bin"
expect "parity --compare"           0 ""                -- "$nsa" parity --backends cpu --corpus small --dtypes f32 --compare "$tmp/p.bin"
expect "parity with an absent backend skips" 77 "unavailable" -- env NSA_BACKEND_PATH=/nonexistent "$nsa" parity --backends hip --corpus small

# nsa bench --baseline / --plot: records for the swept T and shape are compared, the
# figure is well-formed SVG; a missing or malformed file is a usage error with a message
bench=(bench --backend cpu --T 64,128 --hq 4 --hkv 1 --dqk 16 --dv 16 --n 3 --w 32 --iters 1 --warmup 0 --no-stages)
printf '%s\n' '{"baseline": "torch-sdpa-cudnn", "T": 64, "hq": 4, "hkv": 1, "dqk": 16, "dv": 16, "fwd_ms": 0.25}' \
  '{"baseline": "torch-sdpa-flash", "T": 64, "error": "unsupported"}' '{"baseline": "x", "T": 64, "hq": 8, "fwd_ms": 1}' \
  'not json' > "$tmp/base.jsonl"
expect "bench --baseline compares" 0 "baseline torch-sdpa-cudnn, T=64: 0.25 ms" -- \
  "$nsa" "${bench[@]}" --baseline "$tmp/base.jsonl" --plot "$tmp/b.svg"
if python3 -c 'import sys, xml.dom.minidom as m; d = m.parse(sys.argv[1]); sys.exit(0 if "torch-sdpa-cudnn" in d.toxml() else 1)' \
   "$tmp/b.svg" 2>/dev/null; then ok "bench --plot writes an SVG with the baseline"; else bad "bench --plot writes an SVG with the baseline"; fi
expect "bench --json lists the baselines" 0 '"baselines": \[\{"baseline": "torch-sdpa-cudnn"' -- \
  "$nsa" "${bench[@]}" --baseline "$tmp/base.jsonl" --json
expect "bench --baseline of a missing file" 2 "baseline .*No such file" -- \
  "$nsa" "${bench[@]}" --baseline "$tmp/none.jsonl"
head -c 5000 /dev/zero | tr '\0' 'a' > "$tmp/long.jsonl"
expect "bench --baseline with an endless line" 2 "longer than 4096" -- "$nsa" "${bench[@]}" --baseline "$tmp/long.jsonl"
expect "bench --plot into a missing folder" 1 "cannot write" -- "$nsa" "${bench[@]}" --plot "$tmp/no/such/dir.svg"

# A kernel that fails to compile: the status names it and the message carries
# the compiler's log (OpenCL compiles at run time; skipped without a device).
if "$nsa" info 2>/dev/null | grep -Eq "^ *opencl +available"; then
  expect "NSA_BACKEND=opencl nsa run checks the reference" 0 "PASS" -- \
    env NSA_BACKEND=opencl "$nsa" run --T 200 --hq 8 --hkv 2 --dqk 32 --dv 16 --n 3 --w 48 --iters 2
  expect "nsa parity --backends opencl,cpu" 0 "opencl" -- \
    "$nsa" parity --backends opencl,cpu --corpus small --dtypes f32,bf16
  expect "opencl build failure shows the compiler log" nonzero "NSA_ERR_KERNEL_BUILD.*compiler log" -- \
    env NSA_OPENCL_BUILD_OPTIONS=-DNSA_DTYPE=9 NSA_CACHE_DIR=off "$nsa" run --backend opencl --T 64 --hq 4 --hkv 1 --dqk 16 --dv 16
fi

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
