#!/usr/bin/env bash
# CPU test of bench/gpu_check.sh: its dry run (no GPU, bundle or torch) lists every command the
# check would run with its cap; this checks those commands' arguments, the budget, the four
# two-rank rows and the setting that puts two ranks on one GPU for each NCCL version, and that
# only NCCL's own refusal text counts as a refusal. ctest runs it (label `bench`).
# Usage: bash tests/bench/gpu_check_dry_run.sh [SOURCE_DIR]
set -uo pipefail
SRC=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
CHECK=$SRC/bench/gpu_check.sh
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }

for nccl in 2.28.9 2.30.7; do
  out=$TMP/$nccl
  if ! WEIGHTCAST_GPU_CHECK_DRY_NCCL=$nccl bash "$CHECK" --dry-run "$out" >"$TMP/$nccl.log" 2>&1; then
    fail "NCCL $nccl: the dry run exited nonzero:"; tail -20 "$TMP/$nccl.log"; continue
  fi
  commands=$out/commands.tsv
  [ -s "$commands" ] || { fail "NCCL $nccl: no $commands"; continue; }
  # Every step the check runs: each with a cap > 0, the sum within the budget less the reserve.
  for name in tests synth h2d pieces nccl_groups readback prewarm warm direct torch nccl2 \
    nccl2_fsdp nccl2_kill scatter py_load py_fsdp2; do
    [ "$(awk -F'\t' -v n="$name" '$1 == n' "$commands" | wc -l)" = 1 ] ||
      fail "NCCL $nccl: step '$name' is not listed exactly once in commands.tsv"
  done
  sum=$(awk -F'\t' '{ if ($2 !~ /^[0-9]+$/ || $2 == 0) bad = 1; s += $2 } END { print bad ? "bad" : s }' "$commands")
  if [ "$sum" = bad ]; then
    fail "NCCL $nccl: a step without a cap > 0"
  elif ((sum > 280 - 8)); then
    fail "NCCL $nccl: the caps add up to $sum s, over the 280 s budget less 8 s"
  fi
  grep -q "cap *[0-9]* s\] h2d: " "$TMP/$nccl.log" || fail "NCCL $nccl: the dry run does not print each step's cap"
  grep -q 'caps add up to [0-9]* s of the 280 s budget' "$TMP/$nccl.log" || fail "NCCL $nccl: the dry run does not show the budget"

  # h2d_bench: each row starts with its mode word, the rest whole numbers > 0, as many as the
  # mode takes (bench/h2d_bench.cpp's main).
  while IFS=$'\t' read -r name _ command; do
    read -r -a words <<<"$command"
    bin=${words[0]}
    [[ "$bin" == */h2d_bench ]] || continue
    declare -A want=([h2d]=h2d [pieces]=pieces [nccl_groups]=nccl [readback]=readback)
    declare -A most=([h2d]=2 [pieces]=3 [nccl]=2 [readback]=2)
    mode=${words[1]:-}
    if [ "$mode" != "${want[$name]:-?}" ]; then
      fail "step $name: h2d_bench's mode word is '${mode}', expected '${want[$name]:-?}': $command"
      continue
    fi
    counts=("${words[@]:2}")
    ((${#counts[@]} <= ${most[$mode]})) || fail "step $name: h2d_bench $mode takes at most ${most[$mode]} counts: $command"
    for c in "${counts[@]}"; do
      [[ "$c" =~ ^[1-9][0-9]*$ ]] || fail "step $name: '$c' is not a count > 0: $command"
    done
  done <"$commands"
  for name in h2d pieces nccl_groups readback; do
    awk -F'\t' -v n="$name" '$1 == n' "$commands" | grep -q '/h2d_bench ' || fail "step $name does not run h2d_bench"
  done

  # The two-rank rows: all through two_ranks.sh, with the setting NCCL's version calls for.
  setting=hostid
  [ "$nccl" = 2.30.7 ] && setting=multi
  for name in nccl2 nccl2_fsdp nccl2_kill py_fsdp2; do
    line=$(awk -F'\t' -v n="$name" '$1 == n {print $3}' "$commands")
    [[ "$line" == "bash "*"/two_ranks.sh $setting "* ]] || fail "NCCL $nccl: step $name does not run 2 ranks with '$setting': $line"
  done
  awk -F'\t' '$1 == "nccl2" {print $3}' "$commands" | grep -q 'transport=nccl' || fail "nccl2 is not over nccl"
  awk -F'\t' '$1 == "nccl2_fsdp" {print $3}' "$commands" | grep -q 'placement=fsdp' || fail "nccl2_fsdp has no placement=fsdp"
  awk -F'\t' '$1 == "nccl2_kill" {print $3}' "$commands" | grep -qE "two_ranks.sh $setting [1-9][0-9]* .*timeout=[0-9]+s" ||
    fail "nccl2_kill kills no rank, or has no timeout"
  awk -F'\t' '$1 == "py_fsdp2" {print $3}' "$commands" | grep -q 'py_fsdp2.py' || fail "py_fsdp2 runs no py_fsdp2.py"
  grep -q '_sleep' "$out/work/py_fsdp2.py" && grep -q 'fully_shard' "$out/work/py_fsdp2.py" &&
    grep -q 'torch.equal' "$out/work/py_fsdp2.py" || fail "py_fsdp2.py does not queue work before load_into and compare bit-exact"
  if [ "$setting" = multi ]; then
    grep -q 'NCCL_MULTI_RANK_GPU_ENABLE=1' "$out/work/two_ranks.sh" || fail "two_ranks.sh lacks NCCL_MULTI_RANK_GPU_ENABLE=1"
    awk -F'\t' '$1 == "scatter" {print $3}' "$commands" | grep -q 'NCCL_MULTI_RANK_GPU_ENABLE=1' ||
      fail "NCCL $nccl: the [placement][gpu] tests do not run two ranks on the GPU"
  else
    grep -q 'NCCL_HOSTID="weightcast-gpu-check-rank$r"' "$out/work/two_ranks.sh" &&
      grep -q 'NCCL_IB_DISABLE=1' "$out/work/two_ranks.sh" && grep -q 'NCCL_SOCKET_IFNAME=lo' "$out/work/two_ranks.sh" ||
      fail "two_ranks.sh lacks a per-rank NCCL_HOSTID over loopback sockets"
  fi
  grep -q 'nccl rank 1 killed mid-load' "$out/results.tsv" || fail "no 'rank killed' row in results.tsv"
done

# Only NCCL's own words are its refusal of two ranks on one GPU (init.cc's WARN).
refusal=$(sed -n "s/^NCCL_REFUSAL='\(.*\)'$/\1/p" "$CHECK")
[ -n "$refusal" ] || fail "gpu_check.sh has no NCCL_REFUSAL pattern"
echo 'init.cc:738 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000' |
  grep -qE "$refusal" || fail "NCCL_REFUSAL does not match NCCL's refusal text"
for other in 'ncclGroupEnd (ncclSend/ncclRecv) failed: invalid usage' 'ncclInvalidUsage' \
  'duplicate GPU'; do
  echo "$other" | grep -qE "$refusal" && fail "NCCL_REFUSAL matches '$other', which is not the refusal"
done
grep -n -i "invalid usage" "$CHECK" | grep -v '^ *#' | grep -q 'grep' && fail "gpu_check.sh still greps for 'invalid usage'"

if ((FAILS)); then
  echo "gpu_check dry run: $FAILS failure(s)"
  exit 1
fi
echo "gpu_check dry run: every check passed"
