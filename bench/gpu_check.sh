#!/usr/bin/env bash
# GPU check for weightcast's cuda device, pinned staging, nccl transport and Python CUDA path,
# on one bare GPU host, in at most 5 minutes, from the bundle bench/gpu_bundle.sh packs.
#
# Usage: bash BUNDLE/bench/gpu_check.sh OUT_DIR
#        bash bench/gpu_check.sh --dry-run OUT_DIR
#   (on the device tool: carry ["out/gpu-bundle"], command
#    `bash out/gpu-bundle/bench/gpu_check.sh "$OUT"`, timeout_s 330; docs/gpu.md)
#
# --dry-run runs nothing and needs no GPU, bundle or torch: it prints every command the check
# would run, each with its time cap, and the sum of the caps against the budget, and writes
# them to OUT_DIR/commands.tsv (step, cap in seconds, the command as bash would quote it) with
# the scripts the check generates under OUT_DIR/work. tests/bench/gpu_check_dry_run.sh checks it.
# WEIGHTCAST_GPU_CHECK_DRY_NCCL (default 2.28.9) is the NCCL version the dry run assumes.
#
# Runs nothing it has to build: the bundle's weightcast, weightcast_tests and h2d_bench, its
# Python package on the host's python3 + torch, the host's CUDA runtime and NCCL (torch's
# nvidia wheels first). Falls back to building from the source tree beside the script only
# when the bundle is missing or cannot run here, saying why (that needs the build's -dev
# packages, which a bare GPU host lacks).
#
# Steps: the [gpu] tests (WEIGHTCAST_REQUIRE_GPU=1 where nvidia-smi sees a GPU: "no usable
# GPU" fails them); a synthetic checkpoint from the bundled `weightcast synth`; pinned H2D
# bandwidth and the upload, nccl-group and read-back costs (h2d_bench); weightcast loads to
# the GPU from page cache and with O_DIRECT; safetensors.torch.load_file(device="cuda") on
# the same files; then two ranks on the one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1 from NCCL 2.30,
# else a distinct NCCL_HOSTID per rank over loopback sockets): a replicated load over NCCL
# broadcast, an fsdp placement over ncclSend/ncclRecv, the [placement][gpu] tests, rank 1
# killed mid-load (rank 0 must end 69 within its timeout); Python load(device=cuda), and
# load_into of an FSDP2 model on 2 ranks after init_weights-like work queued on the
# destinations, bit-exact.
#
# One table (GB/s, 1 GB = 1e9 B, and peak RSS) in OUT_DIR/table.md and on stdout; OUT_DIR
# also gets results.tsv and each step's log tail. A hard budget, WEIGHTCAST_GPU_CHECK_BUDGET
# seconds (default 280): every step's cap is listed in CAPS below, their sum is checked
# against the budget at start, and a step is cut to what is left; a step that fails or times
# out is recorded and the next one runs, so the table always comes out.
# Exit status: 0 when every step that ran passed; 1 when a step failed; 69 without a bundle
# that runs and without what a fallback build needs.
set -uo pipefail

DRY=0
if [ "${1:-}" = --dry-run ]; then
  DRY=1
  shift
fi
OUT=${1:?usage: gpu_check.sh [--dry-run] OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
BUDGET=${WEIGHTCAST_GPU_CHECK_BUDGET:-280}
START=$(date +%s)
DEADLINE=$((START + BUDGET))
RESERVE=8  # seconds kept for the table
WORK=${WEIGHTCAST_GPU_CHECK_WORK:-${TMPDIR:-/tmp}/weightcast-gpu-check}
((DRY)) && WORK=$OUT/work
PARAMS=${WEIGHTCAST_GPU_CHECK_PARAMS:-1B}  # BF16: ~2 GB (whole layers: synth rounds)
RESULTS=$OUT/results.tsv
COMMANDS=$OUT/commands.tsv
FAILED=0
mkdir -p "$WORK"
: >"$RESULTS"
((DRY)) && : >"$COMMANDS"

# Each step's cap, seconds. Their sum must fit the budget less the reserve (checked below).
# probe bounds step 0's own timeouts (nvidia-smi, the library search, --version, torch).
# The two-rank steps run over loopback sockets on NCCL < 2.30 (correctness, not speed).
declare -A CAPS=(
  [probe]=20 [tests]=28 [synth]=18 [h2d]=8 [pieces]=10 [nccl_groups]=10 [readback]=8
  [prewarm]=5 [warm]=15 [direct]=18 [torch]=16 [nccl2]=20 [nccl2_fsdp]=20 [scatter]=20
  [nccl2_kill]=18 [py_load]=13 [py_fsdp2]=25
)
caps_sum=0
for k in "${!CAPS[@]}"; do caps_sum=$((caps_sum + CAPS[$k])); done
if ((caps_sum > BUDGET - RESERVE)); then
  echo "gpu_check: the step caps add up to ${caps_sum} s, more than the budget ${BUDGET} s less ${RESERVE} s for the table" >&2
  exit 70
fi

left() { echo $((DEADLINE - $(date +%s) - RESERVE)); }
step() { printf '\n==== [%3s s left] %s\n' "$(left)" "$*"; }
note() { printf '  -- %s\n' "$*"; }
# cap NAME: the step's cap, cut to what is left; 0 when too little is left to start it. The
# dry run takes no time, so each step shows its full cap.
cap() {
  local c=${CAPS[$1]} l
  ((DRY)) && { echo "$c"; return; }
  l=$(left)
  if ((l < 3)); then echo 0; elif ((l < c)); then echo "$l"; else echo "$c"; fi
}
# record WHAT STATUS GBPS RSS_BYTES NOTE   (STATUS: pass, fail, skip, timeout; dry). An empty
# field is written as "-": read back with IFS=tab, two tabs in a row would shift the columns.
record() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "${3:--}" "${4:--}" "${5:--}" >>"$RESULTS"
  case "$2" in fail | timeout) FAILED=1 ;; esac
}
# Keeps the tail of a log in OUT (only small files come back from the GPU machine).
keep_log() { [ -f "$WORK/$1.log" ] && tail -c 12000 "$WORK/$1.log" >"$OUT/$1.log"; }

# dry NAME SECONDS CMD...: the dry run's line for a command: on stdout and in commands.tsv.
dry() {
  local name=$1 seconds=$2 line
  shift 2
  line=$(printf '%q ' "$@")
  printf '%s\t%s\t%s\n' "$name" "$seconds" "${line% }" >>"$COMMANDS"
  printf '  [cap %3s s] %s: %s\n' "$seconds" "$name" "${line% }"
}

# measure NAME SECONDS CMD...: runs CMD under `timeout`, output to $WORK/NAME.log, peak RSS
# (bytes) to $WORK/NAME.rss. Returns CMD's status (124: timed out). The dry run prints it.
measure() {
  local name=$1 seconds=$2 status=0
  shift 2
  if ((DRY)); then
    dry "$name" "$seconds" "$@"
    : >"$WORK/$name.log"
    return 0
  fi
  if [ -x /usr/bin/time ]; then
    timeout -k 3 "$seconds" /usr/bin/time -v -o "$WORK/$name.time" "$@" >"$WORK/$name.log" 2>&1 || status=$?
    awk -F': ' '/Maximum resident set size/ {print $2 * 1024}' "$WORK/$name.time" >"$WORK/$name.rss" 2>/dev/null
  else
    timeout -k 3 "$seconds" python3 -c '
import resource, subprocess, sys
r = subprocess.run(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.exit(r.returncode)' "$WORK/$name.rss" "$@" >"$WORK/$name.log" 2>&1 || status=$?
  fi
  keep_log "$name"
  return "$status"
}
rss_of() { cat "$WORK/$1.rss" 2>/dev/null || echo "-"; }
outcome() {
  if ((DRY)); then echo dry; elif (($1 == 0)); then echo pass; elif (($1 == 124 || $1 == 137)); then echo timeout; else echo fail; fi
}

print_table() {
  {
    echo "| step | result | GB/s | peak RSS | note |"
    echo "| --- | --- | ---: | ---: | --- |"
    while IFS=$'\t' read -r what status gbps rss extra; do
      if [[ "$rss" =~ ^[0-9]+$ ]]; then rss="$((rss / 1048576)) MiB"; fi
      echo "| $what | $status | $gbps | $rss | $extra |"
    done <"$RESULTS"
  } >"$OUT/table.md"
  echo
  cat "$OUT/table.md"
}
trap print_table EXIT

# ---- 0: the machine, the bundle, the host's CUDA runtime and NCCL -------------------------
step "0 machine, bundle, CUDA runtime and NCCL"
if ((DRY)); then
  # What the real run would find on a GPU host, assumed: the commands come out as they would
  # run there (the bundle's paths; the NCCL version picks the two-rank setting).
  BUNDLE=$(cd "$HERE/.." && pwd)
  [ -x "$BUNDLE/out/gpu-bundle/bin/weightcast" ] && BUNDLE=$BUNDLE/out/gpu-bundle
  WC=$BUNDLE/bin/weightcast TESTS=$BUNDLE/bin/weightcast_tests H2D=$BUNDLE/bin/h2d_bench
  GPUS_SEEN=1 PROBE_GPUS=1 HAVE_GPU=1 HAVE_TORCH=1 TORCH_CUDA=1
  NCCL_RAN="NCCL ${WEIGHTCAST_GPU_CHECK_DRY_NCCL:-2.28.9}"
  gpu_skip_reason="dry run"
  note "dry run: nothing runs. Assumed: a GPU, python3 with torch and CUDA, the bundle at $BUNDLE, $NCCL_RAN (run time)"
  note "budget: the step caps add up to $caps_sum s, within the $BUDGET s budget less $RESERVE s for the table"
  record "dry run" dry - - "step caps $caps_sum s of the $BUDGET s budget less $RESERVE s; $NCCL_RAN assumed"
else
BUNDLE=
for candidate in "$HERE/.." "$HERE/../out/gpu-bundle"; do
  [ -x "$candidate/bin/weightcast" ] && BUNDLE=$(cd "$candidate" && pwd) && break
done
cat "$BUNDLE/BUNDLE.txt" 2>/dev/null | sed 's/^/  /'
GPUS_SEEN=0
if command -v nvidia-smi >/dev/null; then
  timeout 5 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/  nvidia-smi: /'
  GPUS_SEEN=$(timeout 5 nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
else
  note "nvidia-smi: not found"
fi
# The host's libraries: torch's nvidia wheels (nvidia/nccl/lib, nvidia/cu13/lib), then the
# CUDA toolkit's, then the loader's default path.
HOST_LIBS=
if command -v python3 >/dev/null; then
  HOST_LIBS=$(timeout 5 python3 -c '
import glob, os, site
dirs = []
for base in site.getsitepackages() + [site.getusersitepackages()]:
    for pattern in ("nvidia/nccl/lib", "nvidia/cu13/lib", "nvidia/cuda_runtime/lib"):
        for d in glob.glob(os.path.join(base, pattern)):
            if d not in dirs:
                dirs.append(d)
print(":".join(dirs))' 2>/dev/null)
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && HOST_LIBS=${HOST_LIBS:+$HOST_LIBS:}$d
done
export LD_LIBRARY_PATH=${HOST_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
note "host library path: ${HOST_LIBS:-none found, the dynamic loader defaults}"

WC= TESTS= H2D=
bundle_runs() {
  local why
  why=$(timeout 5 "$BUNDLE/bin/weightcast" --version 2>&1) && return 0
  if echo "$why" | grep -q 'GLIBCXX\|libstdc++\|libgcc_s'; then
    # The host's C++ runtime is older than the build's: use the bundled one.
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$BUNDLE/lib/compat
    note "the host's libstdc++ is older than the build's: using the bundle's lib/compat"
    why=$(timeout 5 "$BUNDLE/bin/weightcast" --version 2>&1) && return 0
  fi
  BUNDLE_WHY=$why
  return 1
}
BUNDLE_WHY="no bundle next to this script (bin/weightcast)"
if [ -n "$BUNDLE" ] && bundle_runs; then
  WC=$BUNDLE/bin/weightcast TESTS=$BUNDLE/bin/weightcast_tests H2D=$BUNDLE/bin/h2d_bench
  record "bundle runs here" pass - - "$(ldd "$WC" | grep -o 'libnccl.so.2 => [^ ]*\|libcudart.so.13 => [^ ]*' | tr '\n' ' ')"
else
  note "the bundle cannot run here: $BUNDLE_WHY"
  SRC=$(cd "$HERE/.." && pwd)
  if [ -f "$SRC/CMakeLists.txt" ] && command -v cmake >/dev/null && command -v c++ >/dev/null; then
    note "falling back to building from $SRC (needs the build's -dev packages)"
    BUILD=$SRC/build-gpu-check
    t=$(cap tests)
    if timeout "$((t + CAPS[synth]))" cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
      -DWEIGHTCAST_CUDA=ON >"$WORK/fallback.log" 2>&1 &&
      timeout "$(cap tests)" cmake --build "$BUILD" -j "$(nproc)" --target weightcast_cli \
        weightcast_tests h2d_bench >>"$WORK/fallback.log" 2>&1; then
      WC=$BUILD/weightcast TESTS=$BUILD/tests/weightcast_tests H2D=$BUILD/h2d_bench
      record "fallback build" pass - - "the bundle could not run: $BUNDLE_WHY"
    else
      keep_log fallback
      record "fallback build" fail - - "the bundle could not run ($BUNDLE_WHY), nor could it be built here: $(grep -m1 -iE 'could not find|not found|error' "$WORK/fallback.log")"
      exit 69
    fi
  else
    record "bundle runs here" fail - - "$BUNDLE_WHY; no source tree and compiler to build from"
    exit 69
  fi
fi
"$WC" --version | sed 's/^/  /' | tee "$WORK/version.log"
keep_log version
PROBE_GPUS=$(grep -o 'run time: .*' "$WORK/version.log" | grep -o '[0-9]* CUDA device' | grep -o '^[0-9]*' || echo 0)
NCCL_RAN=$(grep -o 'NCCL [0-9.]*$' "$WORK/version.log" | tail -1)
note "nvidia-smi sees $GPUS_SEEN GPU(s); the CUDA runtime probe sees ${PROBE_GPUS:-0}; run-time ${NCCL_RAN:-NCCL unknown}"
if ((GPUS_SEEN > 0)) && ((${PROBE_GPUS:-0} == 0)); then
  record "GPU probe" fail - - "nvidia-smi sees $GPUS_SEEN GPU(s) but the CUDA runtime none: $(grep -o 'no CUDA device ([^)]*)' "$WORK/version.log")"
elif ((GPUS_SEEN > 0)); then
  record "GPU probe" pass - - "$PROBE_GPUS device(s); $(grep -o 'driver [0-9.]*' "$WORK/version.log"), ${NCCL_RAN:-NCCL ?} (run time)"
else
  record "GPU probe" skip - - "no GPU: nvidia-smi sees none; the GPU steps below skip"
fi
HAVE_GPU=$(( ${PROBE_GPUS:-0} > 0 ))
gpu_skip_reason="no usable CUDA device: $(sed -n 's/.*no CUDA device (\(.*\)), NCCL.*/\1/p' "$WORK/version.log" | head -1)"

HAVE_TORCH=0
TORCH_CUDA=0
t=$((START + CAPS[probe] - $(date +%s)))
((t < 5)) && t=5
if torch_info=$(timeout "$t" python3 -c '
import sys, torch, safetensors.torch
print(sys.version.split()[0], torch.__version__, int(torch.cuda.is_available()))' 2>/dev/null); then
  HAVE_TORCH=1
  TORCH_CUDA=${torch_info##* }
  note "python3 ${torch_info% *} (python, torch), torch.cuda.is_available(): $TORCH_CUDA"
else
  note "python3 cannot import torch and safetensors (or not within ${t} s): the torch and Python rows skip"
fi
fi

# Two ranks on the one GPU. NCCL refuses two ranks on one GPU of one host ("Duplicate GPU
# detected", NCCL's init.cc) unless, from 2.30, NCCL_MULTI_RANK_GPU_ENABLE=1 (experimental, up
# to 2 ranks per GPU); before 2.30 a distinct NCCL_HOSTID per rank makes them two hosts, which
# then talk over sockets (NCCL_IB_DISABLE=1, the loopback interface): correctness, not speed.
nccl_version=$(grep -o '[0-9][0-9.]*' <<<"${NCCL_RAN:-}" | head -1)
if [ -n "$nccl_version" ] && printf '2.30\n%s\n' "$nccl_version" | sort -V -C; then
  TWO_RANKS=multi
  two_ranks_why="NCCL $nccl_version: NCCL_MULTI_RANK_GPU_ENABLE=1"
else
  TWO_RANKS=hostid
  two_ranks_why="NCCL ${nccl_version:-unknown} (< 2.30): NCCL_HOSTID per rank, sockets over loopback"
fi
note "2 ranks on the one GPU: $two_ranks_why"
for r in 0 1; do
  if [ "$TWO_RANKS" = multi ]; then
    note "  rank $r: RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 NCCL_MULTI_RANK_GPU_ENABLE=1"
  else
    note "  rank $r: RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 NCCL_HOSTID=weightcast-gpu-check-rank$r NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
  fi
done
# NCCL's refusal of two ranks on one GPU, word for word: only this is a refusal; any other
# failure of a two-rank step (a pairing bug in weightcast's groups too) fails the step.
NCCL_REFUSAL='Duplicate GPU detected : rank [0-9]+ and rank [0-9]+ both on CUDA device [0-9a-fA-F]+'

# two_ranks.sh MODE KILL_AFTER_S CMD...: CMD as ranks 0 and 1 of 2 on the one GPU, with
# torchrun's variables; rank 1 killed (SIGKILL) KILL_AFTER_S seconds after the start when that
# is not 0. Exit status: rank 0's when rank 1 was killed, else the first nonzero one.
cat >"$WORK/two_ranks.sh" <<'SH'
mode=$1 kill_after=$2
shift 2
logs=$(mktemp -d)
pids=()
for r in 0 1; do
  if [ "$mode" = multi ]; then
    nccl=(NCCL_MULTI_RANK_GPU_ENABLE=1)
  else
    nccl=(NCCL_HOSTID="weightcast-gpu-check-rank$r" NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo)
  fi
  env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT="${MASTER_PORT:-29581}" NCCL_DEBUG="${NCCL_DEBUG:-WARN}" "${nccl[@]}" "$@" \
    >"$logs/rank$r" 2>&1 &
  pids+=($!)
done
statuses=()
if [ "$kill_after" != 0 ]; then
  sleep "$kill_after"
  kill -0 "${pids[1]}" 2>/dev/null && killed=1 || killed=0
  kill -9 "${pids[1]}" 2>/dev/null
  start=$(date +%s.%N)
  wait "${pids[0]}"
  status=$?
  echo "rank 1 killed: $killed; rank 0 ended with $status $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s after the kill"
  wait "${pids[1]}" 2>/dev/null
else
  status=0
  for pid in "${pids[@]}"; do wait "$pid" || { s=$?; ((status == 0)) && status=$s; }; done
fi
for r in 0 1; do sed "s/^/[rank $r] /" "$logs/rank$r"; done
rm -rf "$logs"
exit "$status"
SH

# ---- 1: the [gpu] tests --------------------------------------------------------------------
step "1 [gpu] tests"
if [ -d "${WEIGHTCAST_CORPUS:-/nonexistent}/real" ]; then
  # The [placement][gpu] tests run in a row of their own, with 2 ranks.
  filter="[gpu]~[placement],[pinned],[gpu-info]"
  why_filter="with the corpus at $WEIGHTCAST_CORPUS"
else
  # Without the corpus (it does not travel): the tests that read it are left out.
  filter="[gpu]~[corpus]~[placement],[pinned],[gpu-info]~[run]"
  why_filter="the corpus tests left out (no WEIGHTCAST_CORPUS)"
fi
require=0
((GPUS_SEEN > 0)) && require=1
t=$(cap tests)
if ((t == 0)); then
  record "[gpu] tests" skip - - "no time left"
else
  measure tests "$t" env WEIGHTCAST_REQUIRE_GPU=$require WEIGHTCAST_CLI="$WC" "$TESTS" "$filter" --durations yes
  status=$?
  summary=$(grep -E '^(All tests passed|test cases:)' "$WORK/tests.log" | tail -1)
  skipped=$(grep -c 'skipped: ' "$WORK/tests.log" || true)
  record "[gpu] tests" "$(outcome $status)" - "$(rss_of tests)" "$filter: ${summary:-exit $status}; $skipped skip warning(s); REQUIRE_GPU=$require; $why_filter"
fi

# ---- 2: a synthetic checkpoint ----------------------------------------------------------
step "2 synthetic checkpoint: $PARAMS params (BF16) in $WORK"
CKPT=$WORK/ckpt-$PARAMS
SHARDS=()
BYTES=0
synth_seconds=reused
if ((DRY)); then
  measure synth "$(cap synth)" "$WC" synth "$CKPT" --params "$PARAMS"
  SHARDS=("$CKPT/model-00001-of-00001.safetensors")  # what synth writes is known only after
  record "synth $PARAMS" dry - - "$CKPT"
else
  if [ -e "$CKPT/model.safetensors.index.json" ] || [ -e "$CKPT/model.safetensors" ]; then
    note "reusing $CKPT"
  else
    rm -rf "$CKPT"
    t=$(cap synth)
    synth_start=$(date +%s)
    if ((t == 0)) || ! measure synth "$t" "$WC" synth "$CKPT" --params "$PARAMS"; then
      rm -rf "$CKPT"
      record "synth $PARAMS" fail - - "writing the checkpoint failed or ran out of its ${t} s (see synth.log)"
    fi
    synth_seconds="$(($(date +%s) - synth_start)) s"
  fi
  if [ -d "$CKPT" ]; then
    mapfile -t SHARDS < <(find "$CKPT" -name '*.safetensors' | sort)
    BYTES=$(du -cb "${SHARDS[@]}" | tail -1 | cut -f1)
    record "synth $PARAMS" pass - "$(rss_of synth)" "${#SHARDS[@]} shard(s), $BYTES B, $synth_seconds, $(stat -f -c %T "$WORK") filesystem"
  fi
fi

# ---- 3: h2d_bench: pinned H2D, uploads by piece, nccl groups, read-back -----------------
step "3 h2d_bench: pinned H2D, uploads, nccl group cost, read-back"
# Each row names h2d_bench's mode word (bench/h2d_bench.cpp): without it the arguments read as
# the plain H2D mode's BYTES ITERATIONS.
bench_row() {  # NAME ROW MODE ARGS...
  local name=$1 row=$2 t
  shift 2
  t=$(cap "$name")
  if ((HAVE_GPU == 0)); then record "$row" skip - - "$gpu_skip_reason"; return; fi
  if ((t == 0)); then record "$row" skip - - "no time left"; return; fi
  measure "$name" "$t" "$H2D" "$@"
  local status=$?
  sed 's/^/  /' "$WORK/$name.log" | tail -8
  local gbps=- extra
  if [ "$name" = h2d ]; then
    gbps=$(awk '/^h2d_gbps/ {print $2}' "$WORK/$name.log")
    extra="256 MiB cudaMemcpyAsync from cudaHostAlloc"
  elif [ "$name" = pieces ]; then
    gbps=$(awk '/one_copy_per_chunk_waited/ {print $3}' "$WORK/$name.log")
    extra=$(awk '/^upload_gbps/ && !/warmup/ {printf "%s %s; ", $2, $3}' "$WORK/$name.log")
  elif [ "$name" = nccl_groups ]; then
    extra=$(awk '/^nccl_group/ {printf "%s %s; ", $2, $3}' "$WORK/$name.log")
  else
    extra=$(grep '^readback' "$WORK/$name.log" | tr '\n' ';')
  fi
  record "$row" "$(outcome $status)" "${gbps:--}" "$(rss_of "$name")" "$extra"
}
bench_row h2d "pinned H2D (h2d_bench)" h2d $((256 << 20)) 20
bench_row pieces "Device::upload 16 MiB chunks, 64 pieces" pieces $((16 << 20)) 64 64
bench_row nccl_groups "nccl group enqueue, world size 1" nccl 200 $((16 << 20))
bench_row readback "Arena::read_back, 1000 x 64 KiB" readback 1000 65536

# ---- 4: weightcast loads to the GPU ------------------------------------------------------
step "4 weightcast run, device cuda, world size 1: page cache, then O_DIRECT"
run_weightcast() {  # NAME ROW SETS...
  local name=$1 row=$2 t
  shift 2
  local sets=()
  for kv in "$@"; do sets+=(--set "$kv"); done
  t=$(cap "$name")
  if ((HAVE_GPU == 0)); then record "$row" skip - - "$gpu_skip_reason"; return; fi
  if ((${#SHARDS[@]} == 0)); then record "$row" skip - - "no checkpoint"; return; fi
  if ((t == 0)); then record "$row" skip - - "no time left"; return; fi
  rm -f "$WORK/$name.report.json"
  measure "$name" "$t" "$WC" run --set "checkpoint=$CKPT" --set device=cuda --set transport=local \
    --set chunk_size=16MiB --set buffer_depth=8 "${sets[@]}" --report "$WORK/$name.report.json"
  local status=$?
  grep '^# ' "$WORK/$name.log" | tail -4 | sed 's/^/  /'
  local gbps reader
  gbps=$(grep -o '[0-9.]* GB/s' "$WORK/$name.log" | head -1 | cut -d' ' -f1)
  reader=$(grep -o '# reader [^,]*' "$WORK/$name.log" | head -1 | cut -c3-)
  record "$row" "$(outcome $status)" "${gbps:--}" "$(rss_of "$name")" "$BYTES B; ${reader:-}; $(grep -o 'upload [0-9.]* GB/s' "$WORK/$name.log" | head -1)"
}
if ((HAVE_GPU)) && ((${#SHARDS[@]})); then
  if ((DRY)); then
    dry prewarm "$(cap prewarm)" cat "$CKPT/*.safetensors"
  else
    timeout "$(cap prewarm)" cat "${SHARDS[@]}" >/dev/null || note "warming the page cache did not finish"
  fi
fi
run_weightcast warm "weightcast cuda, page cache" direct_io=off
run_weightcast direct "weightcast cuda, O_DIRECT" direct_io=on
if [ -s "$WORK/warm.report.json" ] && [ -s "$WORK/direct.report.json" ] && command -v python3 >/dev/null; then
  if python3 - "$WORK/warm.report.json" "$WORK/direct.report.json" <<'PY'; then
import json, sys
a, b = (json.load(open(p))["tensors"] for p in sys.argv[1:])
bad = [n for n in a if a[n]["xxh3"] != b.get(n, {}).get("xxh3")]
print(f"  -- device digests: {len(a)} tensors, {len(bad)} differ between the two loads")
sys.exit(1 if bad or not a else 0)
PY
    record "same bytes, page cache vs O_DIRECT" pass - - "every tensor's device digest equal"
  else
    record "same bytes, page cache vs O_DIRECT" fail - - "digests differ"
  fi
fi

# ---- 5: safetensors.torch.load_file(device="cuda") on the same files ----------------------
step "5 safetensors.torch.load_file(device=\"cuda\") on the same shards (page cache)"
cat >"$WORK/torch_load.py" <<'PY'
import sys, time
import torch
from safetensors.torch import load_file
files = sys.argv[1:]
torch.zeros(1, device="cuda")  # the CUDA context outside the timed part, as weightcast's is
torch.cuda.synchronize()
start = time.perf_counter()
total = 0
for f in files:
    part = load_file(f, device="cuda")
    total += sum(t.numel() * t.element_size() for t in part.values())
    del part
torch.cuda.synchronize()
seconds = time.perf_counter() - start
print(f"torch {torch.__version__}: {total} B in {seconds:.3f} s: {total / seconds / 1e9:.2f} GB/s")
PY
t=$(cap torch)
if ((HAVE_GPU == 0)); then
  record "safetensors load_file(cuda)" skip - - "$gpu_skip_reason"
elif ((HAVE_TORCH == 0 || TORCH_CUDA == 0)); then
  record "safetensors load_file(cuda)" skip - - "python3 has no torch with CUDA"
elif ((${#SHARDS[@]} == 0 || t == 0)); then
  record "safetensors load_file(cuda)" skip - - "no checkpoint or no time left"
else
  measure torch "$t" python3 "$WORK/torch_load.py" "${SHARDS[@]}"
  status=$?
  tail -2 "$WORK/torch.log" | sed 's/^/  /'
  record "safetensors load_file(cuda)" "$(outcome $status)" "$(grep -o '[0-9.]* GB/s' "$WORK/torch.log" | tail -1 | cut -d' ' -f1)" "$(rss_of torch)" "same shards, page cache; $(grep -o '^torch [^:]*' "$WORK/torch.log")"
fi

# ---- 6: two ranks on the one GPU: broadcast, fsdp send/recv, [placement][gpu], a rank killed --
step "6 nccl transport, 2 ranks on the one GPU ($two_ranks_why)"
# two_rank_row NAME ROW KILL_AFTER EXPECT CMD...: CMD on 2 ranks; the row passes when rank 0
# (killed: rank 0; else both) ends with EXPECT. NCCL's refusal of two ranks on one GPU is
# recorded as such (the setting above did not take); anything else that fails, fails.
two_rank_row() {
  local name=$1 row=$2 kill_after=$3 expect=$4 t
  shift 4
  t=$(cap "$name")
  if ((HAVE_GPU == 0)); then record "$row" skip - - "$gpu_skip_reason"; return; fi
  if ((t == 0)); then record "$row" skip - - "no time left"; return; fi
  measure "$name" "$t" bash "$WORK/two_ranks.sh" "$TWO_RANKS" "$kill_after" "$@"
  local status=$?
  tail -4 "$WORK/$name.log" | sed 's/^/  /'
  local refusal
  refusal=$(grep -oE -m1 "$NCCL_REFUSAL" "$WORK/$name.log")
  if ((DRY)); then
    record "$row" dry - - "$two_ranks_why; expects exit $expect"
  elif ((status == expect)) && [ -z "$refusal" ]; then
    record "$row" pass "$(grep -o '[0-9.]* GB/s' "$WORK/$name.log" | head -1 | cut -d' ' -f1)" "$(rss_of "$name")" "$two_ranks_why; $(grep -m1 -o 'rank 0 ended with [^;]*\|local shards bit-exact\|bit-exact[^;]*\|All tests passed[^;]*' "$WORK/$name.log" | head -c 160)"
  elif [ -n "$refusal" ]; then
    record "$row" skip - - "NCCL refused two ranks on one GPU ($two_ranks_why did not take): $refusal"
  else
    record "$row" "$(outcome $status)" - - "exit $status, expected $expect ($two_ranks_why): see $name.log"
  fi
}
if ((${#SHARDS[@]} == 0)); then
  for row in "nccl broadcast, 2 ranks one GPU" "nccl fsdp send/recv, 2 ranks one GPU" \
    "nccl rank 1 killed mid-load"; do record "$row" skip - - "no checkpoint"; done
else
  two_rank_row nccl2 "nccl broadcast, 2 ranks one GPU" 0 0 \
    "$WC" run --set "checkpoint=$CKPT" --set device=cuda --set transport=nccl --set timeout=15s \
    --set rendezvous.port=29591 --set chunk_size=16MiB
  two_rank_row nccl2_fsdp "nccl fsdp send/recv, 2 ranks one GPU" 0 0 \
    "$WC" run --set "checkpoint=$CKPT" --set device=cuda --set transport=nccl --set timeout=15s \
    --set rendezvous.port=29592 --set placement=fsdp --set chunk_size=16MiB
  # Small chunks and a shallow ring stretch the load over several seconds, so the kill lands
  # in it; rank 0 must end with 69 (a peer gone) within its 8 s timeout, not hang.
  two_rank_row nccl2_kill "nccl rank 1 killed mid-load" 3 69 \
    "$WC" run --set "checkpoint=$CKPT" --set device=cuda --set transport=nccl --set timeout=8s \
    --set rendezvous.port=29593 --set chunk_size=64KiB --set buffer_depth=2
fi
# The [placement][gpu] tests run 2 ranks through `weightcast launch`, which cannot give each
# rank its own NCCL_HOSTID: they take two ranks on one GPU only where NCCL 2.30's setting does.
if ((HAVE_GPU == 0)); then
  record "placement [placement][gpu] tests" skip - - "$gpu_skip_reason"
elif ((DRY == 0)) && ! "$TESTS" --list-tags 2>/dev/null | grep -q '\[placement\]'; then
  record "placement [placement][gpu] tests" skip - - "not in this build (no [placement] tests)"
else
  t=$(cap scatter)
  two=()
  [ "$TWO_RANKS" = multi ] && two=(NCCL_MULTI_RANK_GPU_ENABLE=1 WEIGHTCAST_TEST_TWO_RANKS_PER_GPU=1)
  measure scatter "$t" env WEIGHTCAST_REQUIRE_GPU=1 WEIGHTCAST_CLI="$WC" "${two[@]}" "$TESTS" "[placement][gpu]" --durations yes
  status=$?
  summary=$(grep -E '^(All tests passed|test cases:)' "$WORK/scatter.log" | tail -1)
  skipped=$(grep -o 'skipped: needs 2 CUDA devices[^;]*' "$WORK/scatter.log" | head -1)
  record "placement [placement][gpu] tests" "$(outcome $status)" - "$(rss_of scatter)" "[placement][gpu]: ${summary:-exit $status}${skipped:+; fsdp between ranks $skipped}"
fi

# ---- 7: Python: load to CUDA; load_into an FSDP2 model on 2 ranks ------------------------
step "7 Python load to CUDA; load_into an FSDP2 model, 2 ranks on the one GPU"
PYDIR=${BUNDLE:+$BUNDLE/python}
py_ok=0
if ((DRY)); then
  py_ok=1
elif [ -n "$PYDIR" ] && [ -d "$PYDIR/weightcast" ] && ((HAVE_TORCH)); then
  if PYTHONPATH=$PYDIR timeout 30 python3 -c 'import torch, weightcast' >"$WORK/py_import.log" 2>&1; then
    py_ok=1
  else
    keep_log py_import
  fi
fi
py_why="no Python package in the bundle"
[ -n "$PYDIR" ] && [ -d "$PYDIR/weightcast" ] && py_why="python3 cannot import torch and weightcast: $(tail -1 "$WORK/py_import.log" 2>/dev/null)"
((HAVE_TORCH == 0)) && py_why="python3 has no torch"

cat >"$WORK/py_load.py" <<'PY'
import sys, time
import torch
import weightcast
path = sys.argv[1]
torch.zeros(1, device="cuda")
start = time.perf_counter()
tensors = weightcast.load(path, device="cuda")
torch.cuda.synchronize()
seconds = time.perf_counter() - start
total = sum(t.numel() * t.element_size() for t in tensors.values())
devices = {str(t.device) for t in tensors.values()}
assert devices == {"cuda:0"}, devices
line = (f"weightcast.load(device='cuda'): {len(tensors)} tensors, {total} B in {seconds:.3f} s: "
        f"{total / seconds / 1e9:.2f} GB/s")
del tensors
# The DCP reader into CUDA tensors (docs/python.md, "DCP reader"): a BF16 destination lands in
# place on the GPU, an FP32 one in BF16 first and then copy_; a checkpoint, and the same tensor
# in two pieces as torch's HuggingFaceStorageWriter(save_distributed=True) writes them.
import json, os, warnings
import torch.distributed.checkpoint as dcp
import weightcast.dcp
from safetensors.torch import save_file
work = sys.argv[2]
whole = torch.randn(300, 70, generator=torch.Generator().manual_seed(0)).bfloat16()
os.makedirs(f"{work}/one", exist_ok=True)
os.makedirs(f"{work}/pieces", exist_ok=True)
save_file({"w": whole}, f"{work}/one/model.safetensors")
for i, (a, b) in enumerate([(0, 200), (200, 300)], start=1):
    save_file({"w": whole[a:b].contiguous()},
              f"{work}/pieces/shard-{i:05d}-model-00001-of-00001.safetensors",
              metadata={"DCP_SHARDING_INFO": json.dumps({"w": {"saved_offsets": [a, 0]}})})
with warnings.catch_warnings():  # DCP warns that no process group means one process
    warnings.simplefilter("ignore", UserWarning)
    for source in ("one", "pieces"):
        for dtype in (torch.bfloat16, torch.float32):
            got = {"w": torch.full((300, 70), float("nan"), dtype=dtype, device="cuda")}
            dcp.load(got, storage_reader=weightcast.dcp.HuggingFaceStorageReader(
                f"{work}/{source}", timeout=20, progress=False))
            torch.cuda.synchronize()
            assert torch.equal(got["w"].cpu(), whole.to(dtype)), (source, dtype)
print("weightcast.dcp.HuggingFaceStorageReader into CUDA BF16/FP32, whole and in pieces: "
      "bit-exact")
print(line)
PY
# Rank 0 writes the checkpoint; both ranks build the FSDP2 model on the meta device, to_empty()
# it, queue init_weights-like writes (NaN) behind a long GPU sleep on the current stream, and
# load_into: weightcast's streams must wait for that work, or the NaNs land after its bytes.
cat >"$WORK/py_fsdp2.py" <<'PY'
import os, sys
import torch
import torch.distributed as dist
import weightcast
from safetensors.torch import save_file
from torch.distributed.fsdp import fully_shard
rank = int(os.environ["RANK"])
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
torch.manual_seed(0)
def model():
    return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 1024))
reference = model()
path = os.path.join(sys.argv[1], "model.safetensors")
if rank == 0:
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, path)
dist.barrier()
with torch.device("meta"):
    target = model()
for layer in target:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(target)
target.to_empty(device="cuda")
torch.cuda._sleep(2_000_000_000)  # about a second of GPU time before the writes below
with torch.no_grad():
    for p in target.parameters():
        p.to_local().fill_(float("nan"))
report = weightcast.load_into(target, path, rendezvous_port=29594, timeout=20)
for name, p in target.state_dict().items():
    full = p.full_tensor()
    assert torch.equal(full.cpu(), reference.state_dict()[name]), f"rank {rank}: {name} differs"
print(f"rank {rank}: load_into(FSDP2 model after queued init work) bit-exact: {report.verdict}")
dist.destroy_process_group()
PY
py_step() {  # NAME ROW ARGS...
  local name=$1 row=$2 t
  shift 2
  t=$(cap "$name")
  if ((HAVE_GPU == 0)); then record "$row" skip - - "$gpu_skip_reason"; return; fi
  if ((py_ok == 0)); then record "$row" skip - - "$py_why"; return; fi
  if ((t == 0)); then record "$row" skip - - "no time left"; return; fi
  measure "$name" "$t" env PYTHONPATH="$PYDIR" python3 "$WORK/$name.py" "$@"
  local status=$?
  tail -2 "$WORK/$name.log" | sed 's/^/  /'
  record "$row" "$(outcome $status)" "$(grep -o '[0-9.]* GB/s' "$WORK/$name.log" | tail -1 | cut -d' ' -f1)" "$(rss_of "$name")" "$(tail -1 "$WORK/$name.log" | head -c 200)"
}
if ((${#SHARDS[@]} || HAVE_GPU == 0)); then
  mkdir -p "$WORK/dcp"
  py_step py_load "python weightcast.load(device=cuda); DCP reader" "$CKPT" "$WORK/dcp"
else
  record "python weightcast.load(device=cuda); DCP reader" skip - - "no checkpoint"
fi
mkdir -p "$WORK/fsdp2"
if ((HAVE_GPU == 0)); then
  record "python load_into(FSDP2), 2 ranks one GPU" skip - - "$gpu_skip_reason"
elif ((py_ok == 0)); then
  record "python load_into(FSDP2), 2 ranks one GPU" skip - - "$py_why"
else
  two_rank_row py_fsdp2 "python load_into(FSDP2), 2 ranks one GPU" 0 0 \
    env PYTHONPATH="$PYDIR" python3 "$WORK/py_fsdp2.py" "$WORK/fsdp2"
fi

# ---- the table -------------------------------------------------------------------------------
if ((DRY)); then
  step "dry run: $(wc -l <"$COMMANDS") commands in $COMMANDS; the caps add up to $caps_sum s of the ${BUDGET} s budget (less $RESERVE s for the table)"
  exit 0
fi
step "results: $BYTES B checkpoint, 1 GB = 1e9 B; $(( $(date +%s) - START )) s of the ${BUDGET} s budget used"
ratio() {  # ROW_A ROW_B
  awk -F'\t' -v a="$1" -v b="$2" '$1 == a {x = $3} $1 == b {y = $3}
    END {if (x + 0 > 0 && y + 0 > 0) printf "%s / %s: %.2f\n", a, b, x / y}' "$RESULTS"
}
{
  ratio "weightcast cuda, page cache" "pinned H2D (h2d_bench)"
  ratio "weightcast cuda, page cache" "safetensors load_file(cuda)"
  ratio "weightcast cuda, O_DIRECT" "safetensors load_file(cuda)"
} | tee "$OUT/ratios.txt"
exit "$FAILED"
