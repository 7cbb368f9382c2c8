#!/usr/bin/env bash
# GPU check for weightcast's cuda device and nccl transport (issue #5), on one GPU host.
#
# Builds with -DWEIGHTCAST_CUDA=ON, runs the [gpu] tests, writes an ~8 GB synthetic
# checkpoint to local disk, loads it onto the GPU at world size 1 (warm page cache, then
# O_DIRECT), measures pinned H2D bandwidth and safetensors.torch.load_file(device="cuda") on
# the same files in the same run, and prints one table with GB/s (1 GB = 1e9 B) and peak RSS.
#
# Usage: bash bench/gpu_check.sh [WORK_DIR]      (default WORK_DIR: /tmp/weightcast-gpu-check)
# Needs: nvcc/CUDA toolkit, NCCL, CMake >= 3.25, Ninja or make, a C++20 compiler, pkg-config,
# the build's libraries (Boost >= 1.81 headers, fmt, spdlog, yaml-cpp, nlohmann_json, CLI11,
# Catch2 v2, liburing, libxxhash), python3 with torch and safetensors. Installs nothing (the
# GPU hosts have no package registry; never runs scripts/install-deps.sh, apt or pip): a
# preflight names everything missing within seconds and exits 69 before building.
# WEIGHTCAST_GPU_CHECK_PARAMS overrides the checkpoint size (e.g. 100M for a dry run).
# Budget: WEIGHTCAST_GPU_CHECK_BUDGET seconds in all (default 290, under 5 minutes on one
# H200); every step runs under `timeout` capped by what is left, and a step that no longer
# fits is skipped with a note, so the table always comes out.
set -euo pipefail
cd "$(dirname "$0")/.."

WORK_DIR=${1:-/tmp/weightcast-gpu-check}
BUILD_DIR=build-gpu-check
PARAMS=${WEIGHTCAST_GPU_CHECK_PARAMS:-4.4B}  # BF16: ~8.8e9 bytes, ~8 GiB (whole layers: synth rounds to the nearest layer)
CKPT_DIR="$WORK_DIR/ckpt-$PARAMS"
JOBS=$(nproc)
RESULTS="$WORK_DIR/results.tsv"
BUDGET=${WEIGHTCAST_GPU_CHECK_BUDGET:-290}
DEADLINE=$(($(date +%s) + BUDGET))

step() { printf '\n==== [%3ss left] %s\n' "$((DEADLINE - $(date +%s)))" "$*"; }
note() { printf '  -- %s\n' "$*"; }

# Seconds a step may take: at most $1, and never past the deadline (5 s kept for the table).
# Prints 1 (never 0: `timeout 0` would mean no limit) when fewer than 5 s would be left; the
# steps skip themselves on 1.
cap() {
  local left=$((DEADLINE - $(date +%s) - 5))
  if ((left < 5)); then echo 1; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}

# Everything the build and the steps need, checked before any of them runs: a machine without
# a package registry cannot fetch what is missing, so say all of it now, not after minutes.
preflight() {
  local missing=()
  command -v cmake >/dev/null || missing+=("cmake (>= 3.25)")
  if command -v cmake >/dev/null; then
    local v
    v=$(cmake --version | awk 'NR == 1 {print $3}')
    if ! printf '3.25\n%s\n' "$v" | sort -V -C; then missing+=("cmake >= 3.25 (found $v)"); fi
  fi
  command -v ninja >/dev/null || command -v make >/dev/null || missing+=("ninja or make")
  local cxx=${CXX:-c++}
  command -v "$cxx" >/dev/null || missing+=("a C++20 compiler ($cxx)")
  command -v pkg-config >/dev/null || missing+=("pkg-config")
  if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ] &&
    [ -z "${CUDAToolkit_ROOT:-}" ]; then
    missing+=("the CUDA toolkit (nvcc not on PATH nor in /usr/local/cuda/bin)")
  fi
  local nccl_found=0 d
  for d in "${NCCL_HOME:-/nonexistent}/include" /usr/local/cuda/include /usr/include; do
    [ -e "$d/nccl.h" ] && nccl_found=1
  done
  ((nccl_found)) || missing+=("NCCL (nccl.h not in \$NCCL_HOME/include, /usr/local/cuda/include, /usr/include)")
  if command -v "$cxx" >/dev/null; then
    # Preprocessing only (-E), all at once: a second or two, not a compile of each header.
    local header probe_dir
    probe_dir=$(mktemp -d)
    local headers=(boost/version.hpp fmt/core.h spdlog/spdlog.h yaml-cpp/yaml.h
      nlohmann/json.hpp CLI/CLI.hpp catch2/catch.hpp liburing.h xxhash.h)
    for header in "${headers[@]}"; do
      printf '#include <%s>\n' "$header" |
        "$cxx" -std=c++20 -E -x c++ - -o /dev/null 2>/dev/null &&
        touch "$probe_dir/${header//\//_}" &
    done
    wait
    for header in "${headers[@]}"; do
      [ -e "$probe_dir/${header//\//_}" ] || missing+=("<$header> (its -dev package)")
    done
    rm -rf "$probe_dir"
    if ! printf '#include <boost/version.hpp>\n#if BOOST_VERSION < 108100\n#error old\n#endif\n' |
      "$cxx" -std=c++20 -E -x c++ - -o /dev/null >/dev/null 2>&1; then
      missing+=("Boost >= 1.81 headers")
    fi
  fi
  if command -v pkg-config >/dev/null; then
    pkg-config --exists liburing || missing+=("liburing (pkg-config liburing)")
    pkg-config --exists libxxhash || missing+=("libxxhash (pkg-config libxxhash)")
  fi
  if ((${#missing[@]})); then
    printf 'gpu_check: cannot build here; missing (this script installs nothing):\n' >&2
    printf '  - %s\n' "${missing[@]}" >&2
    exit 69
  fi
  # torch and safetensors only feed one row of the table: their absence is a note.
  if timeout 30 python3 -c 'import torch, safetensors.torch' >/dev/null 2>&1; then
    HAVE_TORCH=1
  else
    HAVE_TORCH=0
    note "python3 cannot import torch and safetensors: the safetensors row will be skipped"
  fi
}

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

step "0/7 machine and preflight"
preflight
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || note "nvidia-smi failed"
note "cpus $JOBS, work dir $WORK_DIR ($(stat -f -c %T "$WORK_DIR") filesystem, $(df -h --output=avail "$WORK_DIR" | tail -1 | tr -d ' ') free)"
note "ulimit -l: $(ulimit -l)"

step "1/7 build with -DWEIGHTCAST_CUDA=ON into $BUILD_DIR"
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
configure_status=0
timeout "$(cap 90)" cmake -S . -B "$BUILD_DIR" "${generator[@]}" "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DWEIGHTCAST_CUDA=ON >"$WORK_DIR/cmake.log" 2>&1 ||
  configure_status=$?
if ((configure_status == 124)); then
  echo "gpu_check: CMake configure ran out of its time budget" >&2
  exit 75
elif ((configure_status)); then
  tail -30 "$WORK_DIR/cmake.log"
  echo "gpu_check: CMake configure failed (above; lines naming what was not found:)" >&2
  grep -iE "could not find|not found|required" "$WORK_DIR/cmake.log" | head -10 >&2 || true
  exit 69
fi
grep "weightcast: CUDA" "$WORK_DIR/cmake.log" || true
# Only what this script runs (the CLI, the tests, h2d_bench): not the other benches.
build_status=0
timeout "$(cap 200)" cmake --build "$BUILD_DIR" -j "$JOBS" \
  --target weightcast_cli weightcast_tests h2d_bench >"$WORK_DIR/build.log" 2>&1 || build_status=$?
if ((build_status)); then
  tail -40 "$WORK_DIR/build.log"
  ((build_status == 124)) && echo "gpu_check: the build ran out of its time budget" >&2
  exit 1
fi
WC="$BUILD_DIR/weightcast"
"$WC" --version

step "2/7 [gpu] tests (and the other device tests)"
gpu_tests_status=0
t=$(cap 90)
if ((t > 1)); then
  timeout "$t" "$BUILD_DIR/tests/weightcast_tests" "[gpu],[pinned],[gpu-info]" --durations yes ||
    gpu_tests_status=$?
  ((gpu_tests_status == 124)) && note "the [gpu] tests ran out of their ${t} s"
else
  gpu_tests_status=124
  note "skipped: no time left"
fi
note "[gpu] tests exit status $gpu_tests_status"

step "3/7 synthetic checkpoint: $PARAMS params (BF16) into $CKPT_DIR"
if [ -e "$CKPT_DIR/model.safetensors.index.json" ] || [ -e "$CKPT_DIR/model.safetensors" ]; then
  note "already there, reusing it"
else
  rm -rf "$CKPT_DIR"
  t=$(cap 100)
  if ((t <= 1)) || ! timeout "$t" "$WC" synth "$CKPT_DIR" --params "$PARAMS"; then
    rm -rf "$CKPT_DIR"  # a partial checkpoint must not be reused by the next run
    echo "gpu_check: writing the synthetic checkpoint failed or ran out of time" >&2
    exit 1
  fi
fi
du -sh "$CKPT_DIR"
mapfile -t SHARDS < <(find "$CKPT_DIR" -name '*.safetensors' | sort)
BYTES=$(du -cb "${SHARDS[@]}" | tail -1 | cut -f1)
note "${#SHARDS[@]} shard(s), $BYTES bytes on disk"

step "4/7 pinned H2D bandwidth (h2d_bench: 256 MiB copies from cudaHostAlloc memory)"
if measure h2d timeout "$(cap 30)" "$BUILD_DIR/h2d_bench" $((256 << 20)) 20; then
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
  local t
  t=$(cap 60)
  if ((t <= 1)); then
    record "$row" "skipped" "-" "no time left"
    return
  fi
  rm -f "$WORK_DIR/$name.report.json"
  if measure "$name" timeout "$t" "$WC" run --set "checkpoint=$CKPT_DIR" --set device=cuda \
    --set transport=local --set chunk_size=16MiB --set buffer_depth=8 "${sets[@]}" \
    --report "$WORK_DIR/$name.report.json"; then
    grep '^# ' "$WORK_DIR/$name.log" | tail -4
    local gbps reader
    gbps=$(grep -o '[0-9.]* GB/s' "$WORK_DIR/$name.log" | head -1 | cut -d' ' -f1)
    # The reads actually done: O_DIRECT falls back to buffered where the filesystem refuses.
    reader=$(grep -o '# reader [^,]*' "$WORK_DIR/$name.log" | head -1 | cut -c3-)
    record "$row" "${gbps:-?}" "$(rss_of "$name")" "$* ${reader:-}"
  else
    tail -8 "$WORK_DIR/$name.log"
    record "$row" "failed" "-" "see $WORK_DIR/$name.log"
  fi
}

step "5/7 weightcast run, device cuda, world size 1: warm page cache, then O_DIRECT"
note "warming the page cache (cat > /dev/null)"
timeout "$(cap 60)" cat "${SHARDS[@]}" >/dev/null || note "warming did not finish"
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
t=$(cap 90)
if ((HAVE_TORCH == 0)); then
  record "safetensors load_file(cuda)" "skipped" "-" "python3 cannot import torch/safetensors"
elif ((t <= 1)); then
  record "safetensors load_file(cuda)" "skipped" "-" "no time left"
elif measure torch timeout "$t" python3 "$WORK_DIR/torch_load.py" "${SHARDS[@]}"; then
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
note "[gpu] tests exit status $gpu_tests_status; logs in $WORK_DIR; $((DEADLINE - $(date +%s) + 0)) s of the ${BUDGET} s budget left"
if ((gpu_tests_status != 0)); then exit "$gpu_tests_status"; fi
if grep -qP '^weightcast[^\t]*\t(failed|skipped)\t' "$RESULTS"; then exit 1; fi
exit 0
