#!/usr/bin/env bash
# The CUDA backend's fused forward stages give bitwise the plain stages' output.
#   test_cuda_fused.sh /path/to/nsa
# By default a CUDA plan runs SLC_COMBINE (the selected kernel adds its gated
# term into o_cmp) where its selected kernel is not slc_sm80_g16 (there with
# NSA_CUDA_SLC_COMBINE=1) and, where the window kernel is a tensor-core one,
# WIN_COMBINE; NSA_CUDA_FORCE=combine:combine keeps every branch's output in the
# workspace and runs the combine kernel. Each case runs both and compares
# o.npy and the LSEs byte for byte, over each selected kernel (slc_sm80_g16 at
# G = 16, the block-major kernels below it: slc_sm90_blk on the sm90 class where
# the padded dims are 64/64, 128/128 or 192/128, slc_sm80_blk otherwise;
# slc_sm80 forced, the reference at f32), a
# packed batch without the window branch (the combine kernel resumes from the
# fused sum) and the sm80 class. Exits 77 (skipped) where no CUDA device is.
set -u
nsa=$1
if ! "$nsa" info 2>/dev/null | grep -Eq "^ *cuda +available"; then
  echo "SKIP: no CUDA device"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
common=(--backend cuda --iters 1 --warmup 0)
# NAME|extra environment (or -)|nsa run flags
cases=(
  "G 16 slc_sm80_g16 (NSA_CUDA_SLC_COMBINE=1), Dqk 192|NSA_CUDA_SLC_COMBINE=1|--T 3000 --hq 32 --hkv 2 --dqk 192 --dv 128 --seqlens 1000,0,2000"
  "G 7 block-major (slc_sm90_blk on sm90)|-|--T 2500 --hq 28 --hkv 4 --dqk 128 --dv 128 --seqlens 700,1800"
  "G 4 slc_sm80_blk (dims 64/32) f16, no window, packed|-|--T 1400 --hq 8 --hkv 2 --dqk 64 --dv 32 --w 0 --dtype f16 --seqlens 300,0,900,200"
  "G 4 slc_sm80 forced|NSA_CUDA_FORCE=slc_attn:slc_sm80|--T 1200 --hq 16 --hkv 4 --dqk 128 --dv 64 --seqlens 500,700"
  "f32 (reference kernels)|-|--T 700 --hq 8 --hkv 2 --dqk 32 --dv 48 --dtype f32 --seqlens 200,500"
  "sm80 class, G 8|NSA_CUDA_TARGET=sm80|--T 2100 --hq 16 --hkv 2 --dqk 128 --dv 128"
)
for c in "${cases[@]}"; do
  IFS='|' read -r name extra flags <<< "$c"
  env=()
  [ "$extra" != - ] && env+=("$extra")
  ok=1
  for v in fused plain; do
    force=()
    if [ $v = plain ]; then
      # combine:combine added to a forced selection, or alone
      f=""
      for e in "${env[@]}"; do case $e in NSA_CUDA_FORCE=*) f=${e#NSA_CUDA_FORCE=},;; esac; done
      force=("NSA_CUDA_FORCE=${f}combine:combine")
    fi
    # shellcheck disable=SC2086
    if ! env "${env[@]}" "${force[@]}" NSA_LOG=info "$nsa" run "${common[@]}" $flags --outputs "$tmp/$v" \
      > "$tmp/$v.log" 2>&1; then
      echo "     $v run failed:"; tail -5 "$tmp/$v.log" | sed 's/^/     | /'
      ok=0
    fi
  done
  # the fused run must have planned slc_combine, the plain one slc_attn
  grep -Eq "slc_combine" "$tmp/fused.log" || { echo "     (fused run did not plan slc_combine)"; ok=0; }
  grep -Eq "slc_combine" "$tmp/plain.log" && { echo "     (plain run planned slc_combine)"; ok=0; }
  for f in o lse_cmp lse_slc lse_win; do
    [ -f "$tmp/fused/$f.npy" ] || [ -f "$tmp/plain/$f.npy" ] || continue
    cmp -s "$tmp/fused/$f.npy" "$tmp/plain/$f.npy" || { echo "     ($f.npy differs)"; ok=0; }
  done
  [ -s "$tmp/fused/o.npy" ] || ok=0
  if [ $ok = 1 ]; then passes=$((passes + 1)); echo "ok   $name"; else fails=$((fails + 1)); echo "FAIL $name"; fi
  rm -rf "$tmp/fused" "$tmp/plain"
done
# auto (the default) keeps slc_sm80_g16 plans on the plain selected stage
if NSA_LOG=info "$nsa" run "${common[@]}" --T 600 --hq 32 --hkv 2 --dqk 128 --dv 128 > "$tmp/g16.log" 2>&1 &&
  grep -Eq "^plan: .*slc_attn " "$tmp/g16.log" && grep -Eq "slc_attn +slc_sm80_g16" "$tmp/g16.log"; then
  passes=$((passes + 1)); echo "ok   G 16 plans slc_attn on slc_sm80_g16 by default"
else
  fails=$((fails + 1)); echo "FAIL G 16 plans slc_attn on slc_sm80_g16 by default"; tail -12 "$tmp/g16.log" | sed 's/^/     | /'
fi
echo "cuda-fused: $passes passed, $fails failed"
[ $fails = 0 ]
