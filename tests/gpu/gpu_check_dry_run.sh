#!/usr/bin/env bash
# CPU test of tests/gpu/gpu_check.sh: its dry run (no GPU, wheel, bundle or torch) lists every
# command the check would run with its cap; this checks those commands' arguments, that the
# CLI and every Python row run from the wheel installed into a venv on the host's torch, the
# budget (every
# command capped, at least 20 s spare), the two-rank rows and the setting that puts two ranks
# on one GPU for each NCCL version, that every row moving tensor bytes is compared with
# digests computed on the host from the files, and that only NCCL's own refusal texts (before
# and from 2.30) count as a refusal. ctest runs it (gpu.check_dry_run, label `gpu`).
# Usage: bash tests/gpu/gpu_check_dry_run.sh [SOURCE_DIR]
set -uo pipefail
SRC=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
CHECK=$SRC/tests/gpu/gpu_check.sh
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
  # Every command the check runs: each with a cap > 0; the sum leaves >= 20 s of the budget
  # less the reserve for the table.
  for name in install probe synth host host.digests py_fsdp2 nccl2 nccl2.digests nccl2_fsdp \
    nccl2_fsdp.digests nccl2_kill py_cuda warm warm.digests direct direct.digests tests \
    scatter.tags scatter h2d pieces nccl_groups readback; do
    [ "$(awk -F'\t' -v n="$name" '$1 == n' "$commands" | wc -l)" = 1 ] ||
      fail "NCCL $nccl: step '$name' is not listed exactly once in commands.tsv"
  done
  sum=$(awk -F'\t' '{ if ($2 !~ /^[0-9]+$/ || $2 == 0) bad = 1; s += $2 } END { print bad ? "bad" : s }' "$commands")
  if [ "$sum" = bad ]; then
    fail "NCCL $nccl: a step without a cap > 0"
  elif ((295 - 8 - sum < 20)); then
    fail "NCCL $nccl: the caps add up to $sum s: under 20 s spare of the 295 s budget less 8 s"
  fi
  grep -q "leaves $((295 - 8 - sum)) s spare" "$TMP/$nccl.log" ||
    fail "NCCL $nccl: the dry run does not show the spare the commands leave ($((295 - 8 - sum)) s)"
  # Order: the most valuable rows first (Python FSDP2 load_into, then the NCCL rows).
  order=$(cut -f1 "$commands" | grep -nxE 'py_fsdp2|nccl2|nccl2_fsdp|nccl2_kill|tests|h2d' | cut -d: -f2 | tr '\n' ' ')
  [ "$order" = "py_fsdp2 nccl2 nccl2_fsdp nccl2_kill tests h2d " ] || fail "NCCL $nccl: rows out of order: $order"
  grep -q "cap *[0-9]* s\] h2d: " "$TMP/$nccl.log" || fail "NCCL $nccl: the dry run does not print each step's cap"
  grep -q 'caps add up to [0-9]* s of the 295 s budget' "$TMP/$nccl.log" || fail "NCCL $nccl: the dry run does not show the budget"

  # The wheel, installed as a user would: a venv on the host's python3 that sees its torch
  # (--system-site-packages), pip from the file alone, first; then every weightcast command is
  # the venv's console script and every Python row the venv's python.
  [ "$(head -1 "$commands" | cut -f1)" = install ] || fail "NCCL $nccl: the wheel is not installed first"
  install=$out/work/install.sh
  grep -q 'python3 -m venv --system-site-packages "$venv"' "$install" &&
    grep -q 'install --quiet --no-index --no-deps --ignore-installed --disable-pip-version-check "$wheel"' "$install" ||
    fail "install.sh does not make a venv with the host's site-packages and pip-install the wheel alone"
  [[ "$(awk -F'\t' '$1 == "install" {print $3}' "$commands")" == *"/install.sh "*"/weightcast-"*".whl "*"/venv "* ]] ||
    fail "NCCL $nccl: the install step does not install a weightcast wheel into the venv"
  venv=$out/work/venv
  for name in synth host warm direct; do
    [[ "$(awk -F'\t' -v n="$name" '$1 == n {print $3}' "$commands")" == "$venv/bin/weightcast "* ]] ||
      fail "NCCL $nccl: step $name does not run the venv's weightcast console script"
  done
  for name in nccl2 nccl2_fsdp nccl2_kill; do
    [[ "$(awk -F'\t' -v n="$name" '$1 == n {print $3}' "$commands")" == *" $venv/bin/weightcast run "* ]] ||
      fail "NCCL $nccl: step $name does not run the venv's weightcast console script"
  done
  for name in probe py_cuda host.digests; do
    [[ "$(awk -F'\t' -v n="$name" '$1 == n {print $3}' "$commands")" == "$venv/bin/python "* ]] ||
      fail "NCCL $nccl: step $name does not run the venv's python"
  done
  [[ "$(awk -F'\t' '$1 == "py_fsdp2" {print $3}' "$commands")" == *" $venv/bin/python "*gpu_check_fsdp2.py* ]] ||
    fail "NCCL $nccl: py_fsdp2 does not run the venv's python"
  grep -q PYTHONPATH "$commands" && fail "NCCL $nccl: a row sets PYTHONPATH: every Python row runs from the venv"

  # Every row that moves tensor bytes is compared with what the host computed from the files:
  # its --report against the host digests (NAME.digests), torch.equal against
  # safetensors.load_file (Python), or h2d_bench's read-back against the source's XXH3-64.
  digests=$out/digests.tsv
  line_of() { awk -F'\t' -v n="$1" '$1 == n {print $3}' "$commands"; }
  host=$(line_of host)
  [[ "$host" == *" run "*"device=host"*"--report "*"/host.report.json" ]] || fail "no host load writing host.report.json: $host"
  [[ "$(line_of host.digests)" == *"gpu_check_digests.py"*" host "*"/host.report.json" ]] ||
    fail "the host digests are not recomputed from the files: $(line_of host.digests)"
  for name in warm direct nccl2 nccl2_fsdp; do
    grep -q "^$name"$'\t'"host digests" "$digests" || fail "step $name: no digest comparison in digests.tsv"
    report=$(line_of "$name" | grep -oE -- '--report [^ ]+' | cut -d' ' -f2)
    [ -n "$report" ] || { fail "step $name writes no --report"; continue; }
    compare=$(line_of "$name.digests")
    [[ "$compare" == *"gpu_check_digests.py"*" rows "*"/host.report.json "* ]] ||
      fail "step $name: its digests are not compared with the host's: $compare"
    want=${report//\\\{rank\\\}/0}
    [[ "$compare" == *"$want"* ]] || fail "step $name: $name.digests does not read its report ($want): $compare"
  done
  for name in py_fsdp2 py_cuda; do
    grep -q "^$name"$'\t'"torch.equal .*safetensors.torch.load_file" "$digests" || fail "step $name: not compared with safetensors.load_file"
  done
  for py in gpu_check_fsdp2.py gpu_check_cuda.py; do
    grep -q 'torch.equal' "$SRC/tests/gpu/$py" && grep -q 'load_file' "$SRC/tests/gpu/$py" || fail "$py does not compare with torch.equal against load_file"
  done
  for name in h2d pieces readback; do
    grep -q "^$name"$'\t'"h2d_bench" "$digests" || fail "step $name: its bytes are not checked"
  done
  grep -q 'verify %s host %s device %s' "$SRC/bench/h2d_bench.cpp" || fail "h2d_bench prints no verify line"
  grep -q '"verify ... equal"\|verify ... equal' "$CHECK" || fail "gpu_check.sh does not require h2d_bench's verify line"

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
  # The kill lands at rank 0's first progress line, not at a fixed time.
  awk -F'\t' '$1 == "nccl2_kill" {print $3}' "$commands" | grep -qE "two_ranks.sh $setting progress .*timeout=[0-9]+s" ||
    fail "nccl2_kill kills no rank at rank 0's progress, or has no timeout"
  grep -qF "grep -qE 'weightcast\[rank 0\]: +[0-9]+%'" "$out/work/two_ranks.sh" || fail "two_ranks.sh does not poll rank 0's progress line"
  awk -F'\t' '$1 == "py_fsdp2" {print $3}' "$commands" | grep -q 'gpu_check_fsdp2.py' || fail "py_fsdp2 runs no gpu_check_fsdp2.py"
  # The ordering row: a calibrated sleep then a NaN fill, on the default stream and a side
  # stream, then load_into; bit-exact and the load's wall time at least the sleep.
  fsdp2=$SRC/tests/gpu/gpu_check_fsdp2.py
  for want in '_sleep' 'elapsed_time' 'torch.cuda.stream(' 'fully_shard' 'torch.equal' \
    'fill_(float("nan"))' 'wall >= slept'; do
    grep -qF "$want" "$fsdp2" || fail "gpu_check_fsdp2.py lacks '$want'"
  done
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

# Only NCCL's own words are its refusal of two ranks on one GPU (init.cc's WARN), as NCCL
# before 2.30 and from 2.30 word it.
refusal=$(sed -n "s/^NCCL_REFUSAL='\(.*\)'$/\1/p" "$CHECK")
[ -n "$refusal" ] || fail "gpu_check.sh has no NCCL_REFUSAL pattern"
echo 'init.cc:738 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000' |
  grep -qE "$refusal" || fail "NCCL_REFUSAL does not match NCCL < 2.30's refusal text"
echo 'init.cc:1141 (initTransportsRank) NCCL WARN Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.' |
  grep -qE "$refusal" || fail "NCCL_REFUSAL does not match NCCL 2.30's refusal text"
# Under NCCL_MULTI_RANK_GPU_ENABLE=1 a refusal fails the row (the setting was there).
grep -q 'record "$row" fail - - "NCCL refused two ranks on one GPU although NCCL_MULTI_RANK_GPU_ENABLE=1' "$CHECK" ||
  fail "a refusal under NCCL_MULTI_RANK_GPU_ENABLE=1 is not a failure"
for other in 'ncclGroupEnd (ncclSend/ncclRecv) failed: invalid usage' 'ncclInvalidUsage' \
  'duplicate GPU' 'multiple ranks are using the same GPU'; do
  echo "$other" | grep -qE "$refusal" && fail "NCCL_REFUSAL matches '$other', which is not the refusal"
done
grep -n -i "invalid usage" "$CHECK" | grep -v '^ *#' | grep -q 'grep' && fail "gpu_check.sh still greps for 'invalid usage'"

if ((FAILS)); then
  echo "gpu_check dry run: $FAILS failure(s)"
  exit 1
fi
echo "gpu_check dry run: every check passed"
