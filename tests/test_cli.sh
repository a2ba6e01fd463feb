#!/usr/bin/env bash
# The nsa command as a user runs it: the issue's "must show" items, checked,
# and bad input (crafted files, hostile flags) answered with a clean error.
#   test_cli.sh /path/to/nsa [python3 craft.py fake_ctxfails_dir]
set -u
nsa=$1
python=${2:-python3}
craft=${3:-$(dirname "$0")/craft.py}
fakectx=${4:-}
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
# expect_bad NAME GREP_PATTERN -- command...: bad input must give exit 1 or 2,
# the message, and no crash or sanitizer report (a "clean error")
badtried=0 badclean=0
expect_bad() {
  local name=$1 pat=$2; shift 3
  badtried=$((badtried + 1))
  "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then
    echo "     (exit $rc, wanted 1 or 2)"
  elif grep -Eq "AddressSanitizer|LeakSanitizer|runtime error:|Segmentation fault|core dumped" "$tmp/out"; then
    echo "     (a crash or sanitizer report)"
  elif ! grep -Eq -- "$pat" "$tmp/out"; then
    echo "     (output lacks /$pat/)"
  else
    badclean=$((badclean + 1)); ok "$name"; return
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
# --backward: gradients checked against the fp64 reference and written; do.npy read
# from --inputs (the o of the first run has dO's shape [T, Hq, Dv]) and used
expect "run --backward checks the gradients" 0 "gradient elements.*PASS" -- "$nsa" "${small[@]}" --backward --outputs "$tmp/b1"
for f in dq dk dv dg_cmp dg_slc dg_win; do
  if head -c 6 "$tmp/b1/$f.npy" 2>/dev/null | grep -q "NUMPY"; then ok "--backward wrote $f.npy"; else bad "--backward wrote $f.npy"; fi
done
mkdir -p "$tmp/bin" && cp "$tmp/o1/o.npy" "$tmp/bin/do.npy"
expect "run --backward reads do.npy" 0 "dO from do.npy" -- "$nsa" "${small[@]}" --backward --inputs "$tmp/bin" --outputs "$tmp/b2"
if ! cmp -s "$tmp/b1/dq.npy" "$tmp/b2/dq.npy"; then ok "do.npy was used"; else bad "do.npy was used"; fi
cp "$tmp/o1/lse_cmp.npy" "$tmp/bin/do.npy"
expect "run --backward rejects a wrong do.npy shape" nonzero "do.npy: shape" -- "$nsa" "${small[@]}" --backward --inputs "$tmp/bin"
# --decode: the same problem computed by decode steps (chunked prefill, then TQ tokens a
# step over shuffled pages): the check passes, and on cpu every output file is bitwise
# the forward's for the same inputs ($tmp/o2: ${small[@]} with --inputs $tmp/in), also
# for LINEAR, EXTERNAL, a ragged batch with an empty sequence, bf16 and odd page sizes
expect "run --decode checks the reference and the forward" 0 "300 of 300 rows bitwise equal .*: PASS" -- \
  "$nsa" "${small[@]}" --inputs "$tmp/in" --decode 4 --outputs "$tmp/d1"
for f in o lse_cmp lse_slc lse_win selected; do
  if cmp -s "$tmp/d1/$f.npy" "$tmp/o2/$f.npy"; then ok "run --decode: $f.npy is the forward's"; else bad "run --decode: $f.npy is the forward's"; fi
done
grep -q "^check:   vs testkit fp64 oracle" "$tmp/out" && grep -Eq "^ +PASS \(f32 tolerance" "$tmp/out" &&
  ok "run --decode: the forward's check ran and passed" || bad "run --decode: the forward's check ran and passed"
dvar=0
for v in "--compress linear --decode 3 --prefill 0" "--compress external --decode 5 --prefill 200 --chunk 7" \
         "--seqlens 100,0,37,163 --decode 2 --page-size 5 --cmp-page-size 3" "--dtype bf16 --decode 16 --chunk 1"; do
  dvar=$((dvar + 1))
  # shellcheck disable=SC2086
  "$nsa" "${small[@]}" $v --check-tokens 0 --outputs "$tmp/dv$dvar" >/dev/null 2>&1
  # shellcheck disable=SC2086
  "$nsa" "${small[@]}" $(echo "$v" | sed -E 's/--(decode|prefill|chunk|page-size|cmp-page-size) [0-9]+//g') \
    --check-tokens 0 --outputs "$tmp/fv$dvar" >/dev/null 2>&1
  same=1
  for f in o lse_cmp lse_slc lse_win selected; do cmp -s "$tmp/dv$dvar/$f.npy" "$tmp/fv$dvar/$f.npy" || same=0; done
  if [ $same = 1 ]; then ok "run $v: outputs are the forward's"; else bad "run $v: outputs are the forward's"; fi
done
# per-branch k, v files: the window's keys and the selection's values of another seed,
# so the decode plan gets three caches (each branch its own k or v)
"$nsa" "${small[@]}" --seed 2 --check-tokens 0 --save-inputs "$tmp/s2" >/dev/null 2>&1
mkdir -p "$tmp/pbin" && cp "$tmp/s2/k.npy" "$tmp/pbin/k_win.npy" && cp "$tmp/s2/v.npy" "$tmp/pbin/v_slc.npy"
"$nsa" "${small[@]}" --inputs "$tmp/pbin" --check-tokens 0 --outputs "$tmp/pbf" >/dev/null 2>&1
expect "run --decode with per-branch k_win, v_slc" 0 "rows bitwise equal .*: PASS" -- \
  "$nsa" "${small[@]}" --inputs "$tmp/pbin" --decode 3 --page-size 7 --outputs "$tmp/pbd"
grep -q "read from .*: k_win,v_slc;" "$tmp/out" && same=1 || same=0
for f in o lse_cmp lse_slc lse_win selected; do cmp -s "$tmp/pbd/$f.npy" "$tmp/pbf/$f.npy" || same=0; done
cmp -s "$tmp/pbf/o.npy" "$tmp/o4/o.npy" && same=0   # the files changed the problem
if [ $same = 1 ]; then ok "run --decode per-branch: outputs are the forward's"; else bad "run --decode per-branch: outputs are the forward's"; fi
expect "run --decode --json says it decoded" 0 '"mode": "decode", "decode": \{"tq": 3, "prefill": 10, "chunk": 4, "page_size": 8, "cmp_page_size": 2, "prefill_steps": 3, "decode_steps": 97, "rows": 300, ' -- \
  "$nsa" "${small[@]}" --decode 3 --prefill 10 --chunk 4 --page-size 8 --cmp-page-size 2 --json
if python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); v = d["decode"]["vs_forward"]; sys.exit(0 if d["check"]["pass"] and v["pass"] and v["rows_bitwise_equal"] == 300 and d["exit_code"] == 0 else 1)' "$tmp/out"; then
  ok "run --decode --json parses, both checks pass"; else bad "run --decode --json parses, both checks pass"; fi
# --shards P: the same problem as P shard plans per sequence (nsa_plan_create_varlen), forward
# and backward; on cpu every row and the complete gradient rows are bitwise the whole run's
expect "run --shards 3 --backward checks both passes" 0 "gradient elements.*PASS" -- \
  "$nsa" "${small[@]}" --inputs "$tmp/in" --shards 3 --backward --outputs "$tmp/s3"
if grep -q "3 shard backward plans" "$tmp/out" && grep -Eq "^ +PASS" "$tmp/out"; then
  ok "run --shards: the forward's check ran and passed"; else bad "run --shards: the forward's check ran and passed"; fi
"$nsa" "${small[@]}" --inputs "$tmp/in" --backward --outputs "$tmp/s1" >/dev/null 2>&1
for f in o lse_cmp lse_slc lse_win selected dq dg_cmp dg_slc dg_win; do
  if cmp -s "$tmp/s3/$f.npy" "$tmp/s1/$f.npy"; then ok "run --shards 3: $f.npy is the whole run's"; else bad "run --shards 3: $f.npy is the whole run's"; fi
done
expect "run --shards on packed sequences, EXTERNAL" 0 "gradient elements.*PASS" -- \
  "$nsa" "${small[@]}" --seqlens 100,0,37,163 --compress external --shards 5 --backward
expect "run --shards --json says it sharded" 0 '"mode": "shards", "shards": 2,' -- "$nsa" "${small[@]}" --shards 2 --json

expect "parity --backends cpu"      0 "cpu"             -- "$nsa" parity --backends cpu --corpus small --dtypes f32,bf16
expect "parity --save"              0 ""                -- "$nsa" parity --backends cpu --corpus small --dtypes f32 --save "$tmp/p.bin"
expect "parity --compare"           0 ""                -- "$nsa" parity --backends cpu --corpus small --dtypes f32 --compare "$tmp/p.bin"
expect "parity with an absent backend skips" 77 "unavailable" -- env NSA_BACKEND_PATH=/nonexistent "$nsa" parity --backends hip --corpus small

# ---- bad input: each must be a clean error (exit 1 or 2, a message, no crash)
tiny=(run --backend cpu --T 32 --hq 2 --hkv 1 --dqk 8 --dv 8 --n 3 --w 16 --dtype f32)
# parity files: counts that overflow, counts larger than the file, garbage
"$python" "$craft" parity "$tmp/wrap.bin" 1 2147483648 2147483648        # 4 * T * Hq * Dv wraps to 0
"$python" "$craft" parity "$tmp/ovf.bin" 4 1099511627776 1099511627776   # T * Hq * Dv overflows int64
"$python" "$craft" parity "$tmp/big.bin" 64 8 8 300                      # needs 16 KiB, has 300 bytes
head -c 100 "$tmp/p.bin" >"$tmp/trunc.bin"
printf 'not a parity file' >"$tmp/junk.bin"
pc=(parity --backends cpu --corpus small --dtypes f32 --limit 1 --compare)
expect_bad "parity --compare: 256-byte file whose o size wraps" "record 0 is corrupt: o .* needs 4611686018427387904 elements, but only 76 bytes" -- "$nsa" "${pc[@]}" "$tmp/wrap.bin"
expect_bad "parity --compare: o size overflows int64"   "record 0 is corrupt: the tensor sizes .* overflow 64 bits" -- "$nsa" "${pc[@]}" "$tmp/ovf.bin"
expect_bad "parity --compare: o larger than the file"   "needs 4096 elements, but only" -- "$nsa" "${pc[@]}" "$tmp/big.bin"
expect_bad "parity --compare: truncated file"           "record 0 is corrupt" -- "$nsa" "${pc[@]}" "$tmp/trunc.bin"
expect_bad "parity --compare: not a parity file"        "bad magic" -- "$nsa" "${pc[@]}" "$tmp/junk.bin"
expect_bad "parity --compare: a directory"              "not a regular file" -- "$nsa" "${pc[@]}" "$tmp"
# flags whose sizes overflow (the input generator used to wrap T * Hq * Dqk * 4)
huge=(--T 1152921504606846976 --hq 4 --hkv 1 --dqk 1 --dv 1 --n 0 --w 0)
expect_bad "run --T 2^60: sizes overflow"   "q \[T, Hq, Dqk\] would need more than 2\^63 bytes with 1152921504606846976 tokens \(--T x --batch\)" -- "$nsa" run --backend cpu "${huge[@]}"
expect_bad "bench --T 2^60: sizes overflow" "q \[T, Hq, Dqk\] would need more than 2\^63 bytes" -- "$nsa" bench --backend cpu "${huge[@]}"
expect_bad "run --seqlens sum overflows"    "--seqlens: the sequence lengths must be >= 0 and add up" -- "$nsa" run --backend cpu --seqlens 9223372036854775807,1 --hq 1 --hkv 1 --dqk 1 --dv 1
expect_bad "run --batch x --T overflows"    "--T x --batch: the sequence lengths must be >= 0 and add up" -- "$nsa" run --backend cpu --T 4611686018427387904 --batch 2 --hq 1 --hkv 1 --dqk 1 --dv 1
expect_bad "run: LINEAR w_k overflows"      "w_k \[Hkv, l, Dqk, Dqk\] would need more than 2\^63 bytes" -- \
  "$nsa" run --backend cpu --T 1 --compress linear --hq 65536 --hkv 65536 --l 1048576 --d 1048576 --ls 1048576 --dqk 16384 --dv 1 --n 0 --w 0
# f64 (cpu only): checked at the f64 tolerances, outputs and gradients written as '<f8';
# '<f8' inputs pass the same checks as the others, and (the tool's inputs being f32
# values) an f64 run refuses a '<f8' value that is not exact in f32
f64=(run --backend cpu --T 300 --hq 8 --hkv 2 --dqk 16 --dv 16 --n 4 --w 64 --dtype f64)
expect "run --dtype f64 checks at the f64 tolerance" 0 "PASS \(f64 tolerance" -- "$nsa" "${f64[@]}" --backward --outputs "$tmp/f64o"
expect "run --dtype f64 --backward checks the gradients" 0 "gradient elements.*PASS" -- "$nsa" "${f64[@]}" --backward
for f in o lse_cmp dq dk dg_win; do
  if head -c 64 "$tmp/f64o/$f.npy" 2>/dev/null | grep -q "'<f8'"; then ok "f64 wrote $f.npy as <f8"; else bad "f64 wrote $f.npy as <f8"; fi
done
mkdir -p "$tmp/f64in" "$tmp/f64bad" "$tmp/f64lie"
"$python" "$craft" npy "$tmp/f64in/q.npy" 300,8,16 '<f8' 307200          # zeros: exact in f32
expect "--inputs takes a <f8 q" 0 "read from .*: q" -- "$nsa" "${f64[@]}" --inputs "$tmp/f64in"
cp "$tmp/f64o/o.npy" "$tmp/f64bad/q.npy"                                   # fp64 values
expect_bad "--inputs: f64 q not exact in f32 is refused" "is not exact in f32" -- "$nsa" "${f64[@]}" --inputs "$tmp/f64bad"
expect "--inputs: a <f8 q rounds to bf16" 0 "PASS" -- "$nsa" run --backend cpu --T 300 --hq 8 --hkv 2 --dqk 16 --dv 16 --n 4 --w 64 --dtype bf16 --inputs "$tmp/f64bad"
"$python" "$craft" npy "$tmp/f64lie/q.npy" 1152921504606846976,4,1 '<f8' 0  # 2^60 rows of 8 bytes
expect_bad "--inputs: <f8 q.npy header claims 2^60 rows" "needs 4611686018427387904 elements, but the file has only 0 bytes" -- "$nsa" run --backend cpu --dtype f64 --inputs "$tmp/f64lie"

# .npy headers that lie about their size, trailing bytes, missing files
mkdir -p "$tmp/lie60" "$tmp/lie4g" "$tmp/lie62" "$tmp/trail" "$tmp/dangle"
"$python" "$craft" npy "$tmp/lie60/q.npy" 1152921504606846976,4,1 '<f4' 0   # 2^60 rows, no --T
"$python" "$craft" npy "$tmp/lie4g/q.npy" 1073741824,1,1 '<f4' 64           # 192 bytes claiming 4 GiB
"$python" "$craft" npy "$tmp/lie62/k.npy" 4611686018427387904 '<f4' 0       # (2^62,): 4 * 2^62 wraps
cp "$tmp/o1/o.npy" "$tmp/trail/q.npy" && printf 'xxxx' >>"$tmp/trail/q.npy"
ln -s "$tmp/nonexistent.npy" "$tmp/dangle/q.npy"
expect_bad "--inputs: q.npy header claims 2^60 rows" "needs 4611686018427387904 elements, but the file has only 0 bytes" -- "$nsa" run --backend cpu --inputs "$tmp/lie60"
expect_bad "--inputs: 192-byte q.npy claims 4 GiB"  "needs 1073741824 elements, but the file has only 64 bytes" -- "$nsa" run --backend cpu --hq 1 --hkv 1 --dqk 1 --dv 1 --inputs "$tmp/lie4g"
expect_bad "--inputs: k.npy shape (2^62,)"          "needs 4611686018427387904 elements" -- "$nsa" "${tiny[@]}" --inputs "$tmp/lie62"
expect_bad "--inputs: trailing bytes after the data" "4 bytes follow the data" -- "$nsa" "${small[@]}" --inputs "$tmp/trail"
expect_bad "--inputs: dangling q.npy symlink"        "q.npy: cannot open" -- "$nsa" "${tiny[@]}" --inputs "$tmp/dangle"
expect_bad "--inputs /nonexistent"                   "--inputs /nonexistent: No such file or directory" -- "$nsa" "${tiny[@]}" --inputs /nonexistent
expect_bad "--inputs names a file"                   "not a directory" -- "$nsa" "${tiny[@]}" --inputs "$tmp/junk.bin"
expect_bad "--scale 1e-300 is not silently the default" "--scale 1e-300 is not a normal float" -- "$nsa" "${tiny[@]}" --scale 1e-300
expect_bad "--scale -1e-300"                         "is not a normal float" -- "$nsa" "${tiny[@]}" --scale -1e-300
expect_bad "--scale 1e300"                           "scale = inf must be finite" -- "$nsa" "${tiny[@]}" --scale 1e300
# --decode flags and files it cannot serve
mkdir -p "$tmp/bidx" && "$python" "$craft" npy "$tmp/bidx/block_indices.npy" 300,2,4 '<i4' 9600
expect_bad "run --decode 0"                          "--decode TQ, --chunk, --page-size and --cmp-page-size must be >= 1" -- "$nsa" "${tiny[@]}" --decode 0
expect_bad "run --decode 4 --chunk -1"               "must be >= 1, --prefill >= 0" -- "$nsa" "${tiny[@]}" --decode 4 --chunk -1
expect_bad "run --decode 4 --prefill -3"             "must be >= 1, --prefill >= 0" -- "$nsa" "${tiny[@]}" --decode 4 --prefill -3
expect_bad "run --page-size without --decode"        "need --decode TQ" -- "$nsa" "${tiny[@]}" --page-size 16
expect_bad "run --decode --backward"                 "--decode does not take --backward" -- "$nsa" "${tiny[@]}" --decode 2 --backward
expect_bad "run --decode --iters"                    "--decode does not take --iters or --warmup" -- "$nsa" "${tiny[@]}" --decode 2 --iters 5
expect_bad "run --shards 0"                          "--shards P must be in \\[1, 64\\]" -- "$nsa" "${tiny[@]}" --shards 0
expect_bad "run --shards 65"                         "--shards P must be in" -- "$nsa" "${tiny[@]}" --shards 65
expect_bad "run --shards --decode"                   "--shards does not take --decode" -- "$nsa" "${tiny[@]}" --shards 2 --decode 2
expect_bad "run --shards --iters"                    "--shards does not take --iters" -- "$nsa" "${tiny[@]}" --shards 2 --iters 3
expect_bad "run --decode with block_indices.npy"     "block_indices.npy: a decode step has no block_indices" -- "$nsa" "${small[@]}" --decode 2 --inputs "$tmp/bidx"
expect_bad "run --decode --page-size 2^62"           "nsa_decode_plan_create: .*lim->page_size = 4611686018427387904" -- "$nsa" "${tiny[@]}" --decode 2 --page-size 4611686018427387904
expect_bad "run --decode 2^62 --T 2^60: sizes overflow" "would need more than 2\^63 bytes" -- "$nsa" run --backend cpu "${huge[@]}" --decode 4611686018427387904
expect_bad "bench --batch list without --decode"     "--batch takes one value" -- "$nsa" bench --backend cpu --batch 1,2
expect_bad "bench --context without --decode"        "need --decode" -- "$nsa" bench --backend cpu --context 64
expect_bad "bench --decode --T"                      "does not take --T" -- "$nsa" bench --backend cpu --decode --T 64
expect_bad "bench --decode --tq 0"                   "--tq 0: a step takes TQ >= 1" -- "$nsa" bench --backend cpu --decode --tq 0
expect_bad "bench --decode --batch 0"                "--batch 0: a decode point needs B >= 1" -- "$nsa" bench --backend cpu --decode --batch 2,0
expect_bad "bench --decode --context -1"             "--context -1: the cached tokens must be >= 0" -- "$nsa" bench --backend cpu --decode --context 5,-1
expect_bad "bench --decode --page-size 0"            "--chunk, --page-size and --cmp-page-size >= 1" -- "$nsa" bench --backend cpu --decode --page-size 0
expect_bad "bench --decode --fill steps --batch 9"   "--batch 9: --fill steps draws the whole problem, of 1 \.\. 8 sequences" -- "$nsa" bench --backend cpu --decode --fill steps --batch 9
expect_bad "bench --decode --chunk without --fill steps" "--chunk is the prefill step of --fill steps" -- "$nsa" bench --backend cpu --decode --chunk 16
expect_bad "bench --fill without --decode"           "--fill, --chunk, .* need --decode" -- "$nsa" bench --backend cpu --fill steps
expect_bad "bench --decode context + TQ past int32"  "--context 2147483647 \+ --tq 1: a sequence's length must fit the int32 cache_seqlens" -- "$nsa" bench --backend cpu --decode --context 2147483647
expect_bad "bench --decode B x TQ past int32"        "--batch 1073741824 x --tq 2: a step's rows must fit the int32 cu_seqlens_q" -- "$nsa" bench --backend cpu --decode --batch 1073741824 --tq 2
expect_bad "bench --decode caches past 2^63 bytes"   "B=1 context=10 TQ=1: the caches would need more than 2\^63 bytes" -- "$nsa" bench --backend cpu --decode --context 10 --page-size 4611686018427387904
# refused before anything is allocated (68 TiB of caches on a CPU device), a failed point: exit 1
expect_bad "bench --decode caches that do not fit"   "B=256 context=2147483646 TQ=1 full: the caches \(68\.00 TiB\) and the step's host buffers \(.*\) would not fit this machine's" -- \
  "$nsa" bench --backend cpu --decode --hq 4 --hkv 1 --dqk 16 --dv 16 --dtype f32 --batch 256 --context 2147483646
if [ -n "$fakectx" ]; then
  expect_bad "run --decode on a backend without decode names it" "--decode on backend fakeplan: nsa_decode_plan_create: NSA_ERR_UNSUPPORTED: .*backend fakeplan has no decode step" -- \
    env NSA_BACKEND_PATH="$fakectx" "$nsa" "${tiny[@]:0:1}" --backend fakeplan "${tiny[@]:3}" --decode 4
  expect_bad "bench --decode on a backend without decode" "backend fakeplan has no decode step" -- \
    env NSA_BACKEND_PATH="$fakectx" "$nsa" bench --backend fakeplan --decode --hq 4 --hkv 1 --dqk 16 --dv 16 --dtype f32 --context 8
fi
# backend lists
expect_bad "NSA_BACKEND=,,, names the empty names"    "\(empty\): an empty name" -- env NSA_BACKEND=,,, "$nsa" "${tiny[@]:0:1}" "${tiny[@]:3}"
expect_bad "a 32-character backend name"             "32 characters long; backend names have at most 31" -- "$nsa" run --backend abcdefghijklmnopqrstuvwxyz012345
if [ -n "$fakectx" ]; then
  expect_bad "a backend whose context fails, alone"  "backend fakectx failed creating a context" -- env NSA_BACKEND_PATH="$fakectx" "$nsa" run --backend fakectx
  expect "--backend fakectx,cpu falls back to cpu" 0 "backend: cpu" -- env NSA_BACKEND_PATH="$fakectx" "$nsa" "${tiny[@]:0:1}" --backend fakectx,cpu "${tiny[@]:3}"
fi
echo "bad inputs: $badtried tried, $badclean clean errors"

# nsa bench --baseline / --plot: records for the swept T and shape are compared, the
# figure is well-formed SVG; a missing or malformed file is a usage error with a message
bench=(bench --backend cpu --T 64,128 --hq 4 --hkv 1 --dqk 16 --dv 16 --n 3 --w 32 --iters 1 --warmup 0 --no-stages)
expect "bench --backward times the backward" 0 "^ +bwd +[0-9.]+ " -- "$nsa" "${bench[@]}" --backward
expect "run --backward reports the training plan's memory" 0 '"backward": \{"dout": "seed", "seconds": [0-9.e-]+, "workspace_bytes": [1-9][0-9]*, "backend_bytes": [0-9]+' -- \
  "$nsa" run --backend cpu --T 64 --hq 4 --hkv 1 --dqk 16 --dv 16 --n 3 --w 32 --iters 1 --warmup 0 --backward --json
expect "run --backward names the backward's kernels" 0 '"kernels": \{"compress": "[^"]+", "bwd_cmp_attn": "[^"]+", "bwd_compress": "[^"]+", "bwd_slc_attn": "[^"]+", "bwd_win_attn": "[^"]+", "bwd_store": "[^"]+"\}' -- \
  "$nsa" run --backend cpu --T 64 --hq 4 --hkv 1 --dqk 16 --dv 16 --n 3 --w 32 --iters 1 --warmup 0 --backward --json
expect "info --kernels --backward lists both passes" 0 '"cpu": \{"forward": \{"compress": "compress", .*"win_combine": "win_combine"\}, "backward": \{"compress": "compress", "bwd_cmp_attn": "bwd_cmp_attn", .*"bwd_store": "bwd_store"\}\}' -- \
  env NSA_BACKEND=cpu "$nsa" info --kernels --backward --T 512 --json
expect "bench times the first plan" 0 "^first: +plan [0-9.]+ ms" -- "$nsa" "${bench[@]}"
# the fused window + combine stage: no o_win in the workspace; NSA_CPU_NO_FUSED=1 keeps the plain stages
kplan=(run --backend cpu --T 64 --hq 4 --hkv 1 --dqk 16 --dv 16 --n 3 --w 32 --iters 1 --warmup 0 --check-tokens 0)
expect "cpu plans fuse the window branch with combine" 0 "^plan: .* slc_attn win_combine\)" -- "$nsa" "${kplan[@]}"
expect "NSA_CPU_NO_FUSED=1 keeps win_attn and combine" 0 "^plan: .* win_attn combine\)" -- \
  env NSA_CPU_NO_FUSED=1 "$nsa" "${kplan[@]}"
expect "bench --json has the first plan" 0 '"first_plan_s": [0-9.e-]+, "first_plan_log": \["plan on cpu' -- \
  "$nsa" "${bench[@]}" --json
expect "bench --backward --json" 0 '"backward_tflops"' -- "$nsa" "${bench[@]}" --backward --json
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

# nsa bench --groups: the T sweep once per Hq/Hkv pair, each pair's rows under a 'heads' line, the
# baselines matched per pair; bad lists and conflicting flags are usage errors with a message
gbench=(bench --backend cpu --T 64,96 --groups 4/1,2/2 --dqk 16 --dv 16 --n 3 --w 32 --iters 1 --warmup 0 --no-stages)
printf '%s\n' '{"baseline": "dense", "T": 64, "hq": 4, "hkv": 1, "dqk": 16, "dv": 16, "fwd_ms": 0.25}' \
  '{"baseline": "dense", "T": 96, "hq": 2, "hkv": 2, "dqk": 16, "dv": 16, "fwd_ms": 0.5}' \
  '{"baseline": "dense", "T": 64, "hq": 8, "hkv": 1, "fwd_ms": 1}' > "$tmp/gbase.jsonl"
"$nsa" "${gbench[@]}" --baseline "$tmp/gbase.jsonl" > "$tmp/out" 2>&1
grc=$?
if [ $grc -eq 0 ] && [ "$(grep -Ec '^heads +Hq 4, Hkv 1 \(G = 4\)$|^heads +Hq 2, Hkv 2 \(G = 1\)$' "$tmp/out")" = 2 ] &&
   [ "$(grep -Ec '^ +(64|96) +[0-9.e-]+ ' "$tmp/out")" = 4 ] &&
   grep -Eq '^baseline dense, T=64, Hq/Hkv 4/1: 0.25 ms; speedup [0-9.e+-]+x$' "$tmp/out" &&
   grep -Eq '^baseline dense, T=96, Hq/Hkv 2/2: 0.5 ms; speedup [0-9.e+-]+x$' "$tmp/out" &&
   [ "$(grep -c '^baseline' "$tmp/out")" = 2 ] && grep -q '1 record(s) .* not compared' "$tmp/out"; then
  ok "bench --groups sweeps T per head pair, baselines matched per pair"
else
  echo "     (exit $grc)"; bad "bench --groups sweeps T per head pair, baselines matched per pair"
fi
if "$nsa" "${gbench[@]}" --baseline "$tmp/gbase.jsonl" --json 2>&1 | head -n 1 | python3 -c '
import json, sys
d = json.load(sys.stdin)
r = [(x["T"], x["hq"], x["hkv"], x["ok"]) for x in d["results"]]
b = [(x["baseline"], x["T"], x["hq"], x["hkv"], x["ms"]) for x in d["baselines"]]
sys.exit(0 if r == [(64, 4, 1, True), (96, 4, 1, True), (64, 2, 2, True), (96, 2, 2, True)] and
         b == [("dense", 64, 4, 1, 0.25), ("dense", 96, 2, 2, 0.5)] and
         all(x["speedup"] > 0 for x in d["baselines"]) else 1)'; then
  ok "bench --groups --json: hq, hkv in every result and baseline"
else
  bad "bench --groups --json: hq, hkv in every result and baseline"
fi
expect_bad "bench --groups 4/3 (not a multiple)" "'4/3' is not HQ/HKV" -- "$nsa" "${gbench[@]:0:3}" --groups 4/1,4/3
expect_bad "bench --groups 2/0" "'2/0' is not HQ/HKV" -- "$nsa" "${gbench[@]:0:3}" --groups 2/0
expect_bad "bench --groups with junk" "'4x1' is not HQ/HKV" -- "$nsa" "${gbench[@]:0:3}" --groups 4x1
expect_bad "bench --groups with an empty entry" "'' is not HQ/HKV" -- "$nsa" "${gbench[@]:0:3}" --groups 4/1,,2/2
expect_bad "bench --groups, 17 pairs" "at most 16 pairs" -- "$nsa" "${gbench[@]:0:3}" \
  --groups 1/1,1/1,1/1,1/1,1/1,1/1,1/1,1/1,1/1,1/1,1/1,1/1,1/1,1/1,1/1,1/1,1/1
expect_bad "bench --groups with --hq" "does not take --hq" -- "$nsa" "${gbench[@]}" --hq 4
expect_bad "bench --groups with --plot" "does not take --hq, --hkv or --plot" -- "$nsa" "${gbench[@]}" --plot "$tmp/g.svg"
expect_bad "bench --groups with --decode" "does not take .*--groups" -- "$nsa" bench --backend cpu --decode --groups 4/1

# nsa bench --decode: a B x context x TQ sweep; every point's fields are there and sane
dbench=(bench --backend cpu --decode --hq 4 --hkv 1 --dqk 16 --dv 16 --n 3 --w 32 --dtype f32 --batch 1,3 --context 0,79 --tq 1,4 --iters 2 --page-size 16)
expect "bench --decode prints a row per point" 0 "^ +3 +79 +4 +[0-9.e-]+ +[0-9.e-]+ +[0-9.e-]+ +[0-9.]+ +n/a +[0-9.e-]+ +-?[0-9.e-]+ +[0-9.e-]+ " -- "$nsa" "${dbench[@]}"
expect "bench --decode names the step's kernels" 0 "^kernels \(from B=1 context=0 TQ=1 on\):" -- "$nsa" "${dbench[@]}"
# the default fills the caches with random values; --fill steps prefills them by decode steps
for fill in random steps; do
expect "bench --decode --fill $fill --json" 0 '"mode": "decode", "fill": "'$fill'"' -- "$nsa" "${dbench[@]}" --fill $fill --json --peak-gbps 100
if python3 - "$tmp/out" $fill <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
fill = sys.argv[2]
pts = d["results"]
assert d["command"] == "bench" and d["mode"] == "decode" and d["exit_code"] == 0 and d["peak_gbps"] == 100, d
assert sorted((p["batch"], p["context"], p["tq"]) for p in pts) == sorted(
    (b, c, q) for b in (1, 3) for c in (0, 79) for q in (1, 4)), pts
for p in pts:
    f, de, co = p["full"], p["dense"], p["cmp_only"]
    assert p["ok"] and f["time_s"] > 0 and f["time_min_s"] <= f["time_s"] and f["bytes"] > 0, p
    assert f["time_queued_s"] > 0, p  # the steps queued back to back, per step
    assert set(p["kernels"]) == {"decode_append", "decode_attn"} and all(p["kernels"].values()), p
    assert abs(f["gbps"] - f["bytes"] / f["time_s"] / 1e9) <= 1e-4 * f["gbps"], p  # 6 digits printed
    assert abs(p["pct_peak_gbps"] - f["gbps"]) <= 1e-4 * f["gbps"], p  # peak 100 GB/s
    assert abs(p["dense_s"] - (de["time_s"] - co["time_s"])) <= 1e-5 * (de["time_s"] + co["time_s"]), p
    # Hq 4, Hkv 1, Dqk = Dv = 16, f32, one shared k/v: q + 3 gates + k, v per new token, and
    # the dense step reads the whole context once: nc(TK) rows and TK tokens of k and v
    B, TK, TQ = p["batch"], p["context"] + p["tq"], p["tq"]
    nc = (TK - 32) // 16 + 1 if TK >= 32 else 0
    want = B * (TQ * (4 * 16 * 4 + 2 * 4 * 4 + 32 * 4) + nc * 32 * 4 + TK * 32 * 4)
    assert de["bytes"] == want, (p, want)
    if fill == "steps":
        assert f["prefill_steps"] == (1 if p["context"] else 0) and f["fill_s"] == 0, p
    else:
        assert f["prefill_steps"] == 0 and f["prefill_s"] == 0 and f["fill_s"] > 0, p
PY
then ok "bench --decode --fill $fill --json: every point, its fields and bytes"; else bad "bench --decode --fill $fill --json: every point, its fields and bytes"; fi
done
# past the testkit's 8 sequences: B 16 and 40 (--fill random), a row per point
expect "bench --decode with B > 8" 0 "^ +40 +300 +3 +[0-9.e-]+ +[0-9.e-]+ +[0-9.e-]+ +[0-9.e-]+ +n/a " -- \
  "$nsa" bench --backend cpu --decode --hq 4 --hkv 1 --dqk 16 --dv 16 --n 3 --w 32 --dtype bf16 --batch 16,40 --context 300 --tq 1,3 --iters 2 --warmup 1
if [ "$(grep -Ec '^ +(16|40) +300 +[13] ' "$tmp/out")" = 4 ]; then ok "bench --decode with B > 8: four points"; else bad "bench --decode with B > 8: four points"; fi
expect "bench --decode --no-dense" 0 '"dense": null, "cmp_only": null' -- "$nsa" "${dbench[@]}" --json --no-dense --tq 2 --batch 1 --context 40

# With no NSA_BACKEND, an OpenCL backend on a CPU device (PoCL) ranks after the cpu
# backend (when no GPU backend is available, the default is then cpu)
if "$nsa" info 2>/dev/null | grep -Eq "^ *opencl +available" && ! "$nsa" info 2>/dev/null | grep -Eq "^ *(cuda|hip) +available" &&
   "$nsa" info 2>/dev/null | grep -A1 -E "^ *opencl +available" | grep -Eqi "pthread|cpu"; then
  expect "no NSA_BACKEND: an OpenCL CPU device ranks after cpu" 0 "backend: cpu" -- \
    env -u NSA_BACKEND "$nsa" run --T 64 --hq 4 --hkv 1 --dqk 16 --dv 16 --n 3 --w 32 --check-tokens 0
fi

# A kernel that fails to compile: the status names it and the message carries
# the compiler's log (OpenCL compiles at run time; skipped without a device).
if "$nsa" info 2>/dev/null | grep -Eq "^ *opencl +available"; then
  expect "NSA_BACKEND=opencl nsa run checks the reference" 0 "PASS" -- \
    env NSA_BACKEND=opencl "$nsa" run --T 200 --hq 8 --hkv 2 --dqk 32 --dv 16 --n 3 --w 48 --iters 2
  # the kernel each stage runs: version 3 attention where it fits, the forced versions otherwise
  kinfo=(info --kernels --T 256 --hq 8 --hkv 2 --dqk 32 --dv 32)
  expect "opencl stage kernels: cmp_attn_v3 by default" 0 "cmp_attn +cmp_attn_v3\[" -- "$nsa" "${kinfo[@]}"
  expect "opencl stage kernels: win_attn_v3 and combine fused by default" 0 \
    "win_combine +win_attn_v3\[r[0-9]+,bk[0-9]+,dc[0-9]+\]\+combine\[chunk256\]" -- "$nsa" "${kinfo[@]}"
  expect "opencl stage kernels: NSA_OPENCL_NO_FUSED=1 keeps win_attn_v3" 0 "win_attn +win_attn_v3\[" -- \
    env NSA_OPENCL_NO_FUSED=1 "$nsa" "${kinfo[@]}"
  expect "opencl stage kernels: NSA_OPENCL_KERNELS=v2" 0 "cmp_attn +cmp_attn_v2\[" -- \
    env NSA_OPENCL_KERNELS=v2 "$nsa" "${kinfo[@]}"
  # selected attention: v3 where G >= 8, v2 below it and when forced
  kinfo8=(info --kernels --T 256 --hq 16 --hkv 2 --dqk 32 --dv 32)
  # (fused with combine's first two terms by default: SLC_COMBINE)
  expect "opencl stage kernels: slc_attn_v3 at G = 8" 0 \
    "slc_combine +slc_attn_v3\[r[0-9]+,bk[0-9]+,dc[0-9]+\]\+combine_partial\[chunk256\]" -- "$nsa" "${kinfo8[@]}"
  expect "opencl stage kernels: slc_attn_v2 at G = 4" 0 "slc_combine +slc_attn_v2\[" -- "$nsa" "${kinfo[@]}"
  expect "opencl stage kernels: NSA_OPENCL_KERNELS=v2 at G = 8" 0 "slc_combine +slc_attn_v2\[" -- \
    env NSA_OPENCL_KERNELS=v2 "$nsa" "${kinfo8[@]}"
  expect "opencl stage kernels: NSA_OPENCL_KERNELS=v1" 0 "slc_combine +slc_attn\[wg" -- \
    env NSA_OPENCL_KERNELS=v1 "$nsa" "${kinfo[@]}"
  expect "opencl stage kernels: NSA_OPENCL_NO_FUSED=1 keeps slc_attn" 0 "slc_attn +slc_attn_v3\[" -- \
    env NSA_OPENCL_NO_FUSED=1 "$nsa" "${kinfo8[@]}"
  # the fused stages give bitwise the plain stages' o (G 8 runs slc_attn_v3; a packed batch without the window
  # branch resumes COMBINE from SLC_COMBINE's sum)
  for fz in 0 1; do
    frun=(run --backend opencl --T 300 --hq 16 --hkv 2 --dqk 32 --dv 32 --n 3 --w 48 --iters 1 --warmup 0)
    env NSA_OPENCL_NO_FUSED=$fz "$nsa" "${frun[@]}" --outputs "$tmp/fz$fz" >/dev/null 2>&1
    env NSA_OPENCL_NO_FUSED=$fz "$nsa" run --backend opencl --T 300 --hq 8 --hkv 2 --dqk 32 --dv 16 --n 3 --w 0 \
      --dtype f16 --seqlens 100,0,150,50 --iters 1 --warmup 0 --outputs "$tmp/fp$fz" >/dev/null 2>&1
  done
  if [ -s "$tmp/fz0/o.npy" ] && cmp -s "$tmp/fz0/o.npy" "$tmp/fz1/o.npy" && [ -s "$tmp/fp0/o.npy" ] &&
    cmp -s "$tmp/fp0/o.npy" "$tmp/fp1/o.npy"; then
    ok "opencl fused stages (scores_topn, slc_combine, win_combine) bitwise as the plain stages"
  else
    bad "opencl fused stages (scores_topn, slc_combine, win_combine) bitwise as the plain stages"
  fi
  expect "nsa parity --backends opencl,cpu" 0 "opencl" -- \
    "$nsa" parity --backends opencl,cpu --corpus small --dtypes f32,bf16
  expect "opencl build failure shows the compiler log" nonzero "NSA_ERR_KERNEL_BUILD.*compiler log" -- \
    env NSA_OPENCL_BUILD_OPTIONS=-DNSA_DTYPE=9 NSA_CACHE_DIR=off "$nsa" run --backend opencl --T 64 --hq 4 --hkv 1 --dqk 16 --dv 16
  # The kernel cache as untrusted input (issue 17, item 3): a flipped byte in a
  # cached binary, then a FIFO in its place, are rebuilt and replaced; no crash, no hang.
  cdir=$tmp/clcache
  crun() { env NSA_CACHE_DIR="$cdir" timeout 300 "$nsa" run --backend opencl --T 64 --hq 4 --hkv 1 --dqk 16 --dv 16 \
      --dtype f32 --iters 1 --warmup 0; }
  expect "opencl kernel cache written" 0 "PASS" -- crun
  entry=$(ls "$cdir"/opencl-*.bin 2>/dev/null | head -1)
  if [ -n "$entry" ]; then
    cp "$entry" "$tmp/good.bin"
    "$python" -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 0xff; open(p, 'wb').write(b)" "$entry"
    expect "a corrupt cache entry is rebuilt" 0 "PASS" -- crun
    if cmp -s "$entry" "$tmp/good.bin"; then ok "the corrupt entry was replaced"; else bad "the corrupt entry was replaced"; fi
    rm -f "$entry" && mkfifo "$entry"
    expect "a FIFO in place of a cache entry neither hangs nor fails" 0 "PASS" -- crun
    if [ -f "$entry" ] && [ ! -p "$entry" ]; then ok "the FIFO was replaced by a file"; else bad "the FIFO was replaced by a file"; fi
  else
    bad "opencl kernel cache written (no opencl-*.bin in $cdir)"
  fi
fi

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
