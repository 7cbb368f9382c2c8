#!/usr/bin/env bash
# GPU check for weightcast's cuda device and nccl transport (issue #5), on one GPU host.
#
# Builds with -DWEIGHTCAST_CUDA=ON, runs the [gpu] tests, writes an ~8 GB synthetic
# checkpoint to local disk, loads it onto the GPU at world size 1 (warm page cache, then
# O_DIRECT), measures pinned H2D bandwidth and safetensors.torch.load_file(device="cuda") on
# the same files in the same run, and prints one table with GB/s (1 GB = 1e9 B) and peak RSS.
#
# Usage: bash bench/gpu_check.sh [WORK_DIR]      (default WORK_DIR: /tmp/weightcast-gpu-check)
# Needs: nvcc/CUDA toolkit, NCCL, CMake, Ninja or make, a C++20 compiler, python3 with torch
# and safetensors. Installs nothing (the GPU hosts have no package registry). Budget: about
# 5 minutes on one H200; every step is bounded with `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."

WORK_DIR=${1:-/tmp/weightcast-gpu-check}
BUILD_DIR=build-gpu-check
CKPT_DIR="$WORK_DIR/ckpt-4B"
PARAMS=4B  # BF16: 8e9 bytes, ~7.5 GiB
JOBS=$(nproc)
RESULTS="$WORK_DIR/results.tsv"

step() { printf '\n==== %s\n' "$*"; }
note() { printf '  -- %s\n' "$*"; }

mkdir -p "$WORK_DIR"
: >"$RESULTS"

# Runs a command under /usr/bin/time -v when present (else a python3 rusage wrapper),
# output to $1.log; prints the peak RSS in bytes to $1.rss. Returns the command's status.
measure() {
  local name=$1
  shift
  local log="$WORK_DIR/$name.log"
  local status=0
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -v -o "$WORK_DIR/$name.time" "$@" >"$log" 2>&1 || status=$?
    awk -F': ' '/Maximum resident set size/ {print $2 * 1024}' "$WORK_DIR/$name.time" >"$WORK_DIR/$name.rss"
  else
    python3 - "$WORK_DIR/$name.rss" "$@" >"$log" 2>&1 <<'PY' || status=$?
import resource, subprocess, sys
r = subprocess.run(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024) + "\n")
sys.exit(r.returncode)
PY
  fi
  return "$status"
}

# Appends one row to the results table: name, GB/s, peak RSS bytes, note.
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RESULTS"; }

rss_of() { cat "$WORK_DIR/$1.rss" 2>/dev/null || echo "?"; }

step "0/7 machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || note "nvidia-smi failed"
note "cpus $JOBS, work dir $WORK_DIR ($(df -h --output=avail "$WORK_DIR" | tail -1 | tr -d ' ') free)"
note "ulimit -l: $(ulimit -l)"

step "1/7 build with -DWEIGHTCAST_CUDA=ON into $BUILD_DIR"
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
timeout 240 cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DWEIGHTCAST_CUDA=ON >"$WORK_DIR/cmake.log" 2>&1 ||
  { tail -30 "$WORK_DIR/cmake.log"; exit 1; }
grep "weightcast: CUDA" "$WORK_DIR/cmake.log" || true
timeout 240 cmake --build "$BUILD_DIR" -j "$JOBS" >"$WORK_DIR/build.log" 2>&1 ||
  { tail -40 "$WORK_DIR/build.log"; exit 1; }
WC="$BUILD_DIR/weightcast"
"$WC" --version

step "2/7 [gpu] tests (and the other device tests)"
gpu_tests_status=0
timeout 180 "$BUILD_DIR/tests/weightcast_tests" "[gpu],[pinned],[gpu-info]" --durations yes ||
  gpu_tests_status=$?
note "[gpu] tests exit status $gpu_tests_status"

step "3/7 synthetic checkpoint: $PARAMS params (BF16) into $CKPT_DIR"
if [ -e "$CKPT_DIR/model.safetensors.index.json" ] || [ -e "$CKPT_DIR/model.safetensors" ]; then
  note "already there, reusing it"
else
  rm -rf "$CKPT_DIR"
  timeout 240 "$WC" synth "$CKPT_DIR" --params "$PARAMS"
fi
du -sh "$CKPT_DIR"
mapfile -t SHARDS < <(find "$CKPT_DIR" -name '*.safetensors' | sort)
BYTES=$(du -cb "${SHARDS[@]}" | tail -1 | cut -f1)
note "${#SHARDS[@]} shard(s), $BYTES bytes on disk"

step "4/7 pinned H2D bandwidth (h2d_bench: 256 MiB copies from cudaHostAlloc memory)"
if measure h2d timeout 60 "$BUILD_DIR/h2d_bench" $((256 << 20)) 20; then
  cat "$WORK_DIR/h2d.log"
  record "pinned H2D (h2d_bench)" "$(awk '/^h2d_gbps/ {print $2}' "$WORK_DIR/h2d.log")" "$(rss_of h2d)" "cudaMemcpyAsync, 256 MiB"
else
  tail -5 "$WORK_DIR/h2d.log"
  record "pinned H2D (h2d_bench)" "failed" "-" "see $WORK_DIR/h2d.log"
fi

# weightcast runs: $1 row name, $2 log name, rest: extra --set overrides.
run_weightcast() {
  local row=$1 name=$2
  shift 2
  local sets=()
  for kv in "$@"; do sets+=(--set "$kv"); done
  if measure "$name" timeout 120 "$WC" run --set "checkpoint=$CKPT_DIR" --set device=cuda \
    --set transport=local --set chunk_size=16MiB --set buffer_depth=8 "${sets[@]}" \
    --report "$WORK_DIR/$name.report.json"; then
    grep '^# ' "$WORK_DIR/$name.log" | tail -4
    local gbps
    gbps=$(grep -o '[0-9.]* GB/s' "$WORK_DIR/$name.log" | head -1 | cut -d' ' -f1)
    record "$row" "${gbps:-?}" "$(rss_of "$name")" "$*"
  else
    tail -8 "$WORK_DIR/$name.log"
    record "$row" "failed" "-" "see $WORK_DIR/$name.log"
  fi
}

step "5/7 weightcast run, device cuda, world size 1: warm page cache, then O_DIRECT"
note "warming the page cache (cat > /dev/null)"
cat "${SHARDS[@]}" >/dev/null
run_weightcast "weightcast warm" wc_warm direct_io=off
run_weightcast "weightcast O_DIRECT" wc_direct direct_io=on
if [ -s "$WORK_DIR/wc_warm.report.json" ] && [ -s "$WORK_DIR/wc_direct.report.json" ]; then
  if python3 - "$WORK_DIR/wc_warm.report.json" "$WORK_DIR/wc_direct.report.json" <<'PY'; then
import json, sys
a, b = (json.load(open(p))["tensors"] for p in sys.argv[1:])
bad = [n for n in a if a[n]["xxh3"] != b.get(n, {}).get("xxh3")]
print(f"  -- device digests: {len(a)} tensors, {len(bad)} differ between the two runs")
sys.exit(1 if bad else 0)
PY
    note "warm and O_DIRECT loads landed the same bytes on the GPU"
  else
    note "DIGEST MISMATCH between warm and O_DIRECT runs"
  fi
fi

step "6/7 safetensors.torch.load_file(device=\"cuda\") on the same shards (warm)"
cat >"$WORK_DIR/torch_load.py" <<'PY'
import sys, time
import torch
from safetensors.torch import load_file
files = sys.argv[1:]
torch.cuda.init()
torch.zeros(1, device="cuda")  # CUDA context outside the timed part, as weightcast's is
torch.cuda.synchronize()
start = time.perf_counter()
state, total = {}, 0
for f in files:
    part = load_file(f, device="cuda")
    total += sum(t.numel() * t.element_size() for t in part.values())
    state.update(part)
torch.cuda.synchronize()
seconds = time.perf_counter() - start
print(f"torch {torch.__version__}: {len(state)} tensors, {total} B in {seconds:.3f} s: {total / seconds / 1e9:.2f} GB/s")
PY
if measure torch timeout 240 python3 "$WORK_DIR/torch_load.py" "${SHARDS[@]}"; then
  cat "$WORK_DIR/torch.log"
  record "safetensors load_file(cuda)" "$(grep -o '[0-9.]* GB/s' "$WORK_DIR/torch.log" | tail -1 | cut -d' ' -f1)" "$(rss_of torch)" "same shards, warm"
else
  tail -8 "$WORK_DIR/torch.log"
  record "safetensors load_file(cuda)" "failed" "-" "see $WORK_DIR/torch.log"
fi

step "7/7 results ($BYTES B checkpoint, 1 GB = 1e9 B)"
printf '%-30s %10s %16s  %s\n' "what" "GB/s" "peak RSS" "note"
while IFS=$'\t' read -r what gbps rss extra; do
  if [[ "$rss" =~ ^[0-9]+$ ]]; then rss="$((rss / 1048576)) MiB"; fi
  printf '%-30s %10s %16s  %s\n' "$what" "$gbps" "$rss" "$extra"
done <"$RESULTS"
wc_gbps=$(awk -F'\t' '$1 == "weightcast warm" {print $2}' "$RESULTS")
h2d_gbps=$(awk -F'\t' '$1 ~ /^pinned H2D/ {print $2}' "$RESULTS")
torch_gbps=$(awk -F'\t' '$1 ~ /^safetensors/ {print $2}' "$RESULTS")
python3 - "$wc_gbps" "$h2d_gbps" "$torch_gbps" <<'PY' || true
import sys
def num(s):
    try: return float(s)
    except ValueError: return None
wc, h2d, torch = (num(s) for s in sys.argv[1:])
if wc and h2d: print(f"weightcast warm / pinned H2D: {wc / h2d:.2f}")
if wc and torch: print(f"weightcast warm / safetensors load_file: {wc / torch:.2f}")
PY
note "[gpu] tests exit status $gpu_tests_status; logs in $WORK_DIR"
exit "$gpu_tests_status"
