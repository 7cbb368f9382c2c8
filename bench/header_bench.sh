#!/usr/bin/env bash
# Header validation time against the tensor count: one .safetensors file of N one-byte U8
# tensors per N, checked with `weightcast inspect` (parse + every format rule), best of 3;
# and `weightcast run --report` of the same file (load + a report of N entries), best of 3.
#
#   bench/header_bench.sh [BUILD_DIR] [N...]        (defaults: build, 5000 20000 100000)
#
# Files go to $BENCH_DIR (default /dev/shm) and are removed afterwards. The time should grow
# linearly with N (bench/RESULTS.md: the parser was once quadratic).
#
#   bench/header_bench.sh --reference [BUILD_DIR]
#
# Against the reference, in one run: a file with a header of $HEADER_BYTES (default
# 96,600,000, under the format's 100,000,000) of realistic names (`model.layers.L.mlp.
# experts.E.up_proj.weight`, BF16 [2, 2]), opened $ROUNDS times (default 3) alternately by
#   reference:  safetensors.safe_open(FILE, framework="numpy") and its keys(), in $PYTHON
#               (default /work/venv/bin/python, else python3), the call timed inside Python;
#   inspect:    `weightcast inspect FILE` (read, parse, every rule; output to /dev/null);
#   run:        `weightcast run --set destination=discard --set verify=none` (the whole load).
# Each line: wall seconds and peak RSS (GNU time's %M), and the ratio to the reference.
set -euo pipefail
if [ "${1:-}" = --reference ]; then
  build=${2:-build}
  python=${PYTHON:-/work/venv/bin/python}
  [ -x "$python" ] || python=python3
  header_bytes=${HEADER_BYTES:-96600000}
  rounds=${ROUNDS:-3}
  dir=$(mktemp -d "${BENCH_DIR:-/dev/shm}/weightcast-header-XXXXXX")
  trap 'rm -rf "$dir"' EXIT
  file="$dir/wide.safetensors"
  python3 - "$header_bytes" "$file" <<'PY'
import json, struct, sys
target, out = int(sys.argv[1]), sys.argv[2]
parts, size, i = [], 1, 0
while True:
    name = f"model.layers.{i // 4096}.mlp.experts.{i % 4096}.up_proj.weight"
    entry = json.dumps({name: {"dtype": "BF16", "shape": [2, 2],
                               "data_offsets": [8 * i, 8 * i + 8]}}, separators=(",", ":"))[1:-1]
    if size + len(entry) + 1 > target:
        break
    parts.append(entry)
    size += len(entry) + 1
    i += 1
text = ("{" + ",".join(parts) + "}").encode()
text += b" " * (target - len(text))  # trailing spaces are valid padding
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + bytes(8 * i))
print(f"# {out}: {i} tensors, header {len(text)} bytes", flush=True)
PY
  echo "# $(uname -n): $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); safetensors" \
       "$("$python" -c 'import safetensors; print(safetensors.__version__)')"
  printf '# %5s %-10s %9s %9s %9s\n' round who wall_s rss_MiB vs_ref
  cat "$file" >/dev/null  # warm: every reader finds it in the page cache
  for ((r = 1; r <= rounds; r++)); do
    out=$(/usr/bin/time -f '%e %M' "$python" -c '
import sys, time
from safetensors import safe_open
t = time.perf_counter()
with safe_open(sys.argv[1], framework="numpy") as f:
    n = len(f.keys())
print(f"{time.perf_counter() - t:.3f}")' "$file" 2>&1)
    ref_in=$(echo "$out" | sed -n 1p)
    read -r ref_wall ref_rss <<<"$(echo "$out" | tail -1)"
    awk -v r="$r" -v w="$ref_wall" -v m="$ref_rss" -v i="$ref_in" \
      'BEGIN { printf "  %5d %-10s %9.2f %9.0f %9s   (safe_open itself %.2f s)\n", r, "reference", w, m / 1024, "1.00", i }'
    for who in inspect run; do
      if [ "$who" = inspect ]; then
        cmd=("$build/weightcast" inspect "$file")
      else
        cmd=("$build/weightcast" run -q --set checkpoint="$file" --set destination=discard
             --set verify=none)
      fi
      read -r wall rss <<<"$( { /usr/bin/time -f '%e %M' "${cmd[@]}" >/dev/null; } 2>&1 | tail -1)"
      awk -v r="$r" -v who="$who" -v w="$wall" -v m="$rss" -v rw="$ref_in" \
        'BEGIN { printf "  %5d %-10s %9.2f %9.0f %9.2f\n", r, who, w, m / 1024, w / rw }'
    done
  done
  echo "# vs_ref: wall seconds / the reference's safe_open seconds (below 1: faster)"
  exit 0
fi
build=${1:-build}
shift $(( $# > 0 ? 1 : 0 )) || true
counts=("$@")
if ((${#counts[@]} == 0)); then counts=(5000 20000 100000); fi
dir=$(mktemp -d "${BENCH_DIR:-/dev/shm}/weightcast-header-XXXXXX")
trap 'rm -rf "$dir"' EXIT

echo "# $(uname -n): $(nproc) cores; weightcast inspect and run --report, best of 3"
printf '# %10s %12s %10s %12s %10s\n' tensors header_bytes inspect_s us_per_tensor report_s
for n in "${counts[@]}"; do
  file="$dir/t$n.safetensors"
  python3 - "$n" "$file" <<'PY'
import json, struct, sys
n, out = int(sys.argv[1]), sys.argv[2]
header = {f"t{i}": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(n)}
text = json.dumps(header, separators=(",", ":")).encode()
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + bytes(n))
PY
  best_ns=""
  for _ in 1 2 3; do
    start=$(date +%s%N)
    "$build/weightcast" inspect "$file" >/dev/null
    t=$(( $(date +%s%N) - start ))
    if [ -z "$best_ns" ] || (( t < best_ns )); then best_ns=$t; fi
  done
  report_ns=""
  for _ in 1 2 3; do
    start=$(date +%s%N)
    "$build/weightcast" run -q --set checkpoint="$file" --set device=host \
      --report "$dir/report.json" >/dev/null
    t=$(( $(date +%s%N) - start ))
    if [ -z "$report_ns" ] || (( t < report_ns )); then report_ns=$t; fi
  done
  header_bytes=$(( $(stat -c %s "$file") - 8 - n ))
  awk -v n="$n" -v h="$header_bytes" -v ns="$best_ns" -v rns="$report_ns" \
    'BEGIN { printf "  %10d %12d %10.3f %12.2f %10.3f\n", n, h, ns / 1e9, ns / 1e3 / n, rns / 1e9 }'
done
