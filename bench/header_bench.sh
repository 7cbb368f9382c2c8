#!/usr/bin/env bash
# Header validation time against the tensor count: one .safetensors file of N one-byte U8
# tensors per N, checked with `weightcast inspect` (parse + every format rule), best of 3;
# and `weightcast run --report` of the same file (load + a report of N entries), best of 3.
#
#   bench/header_bench.sh [BUILD_DIR] [N...]        (defaults: build, 5000 20000 100000)
#
# Files go to $BENCH_DIR (default /dev/shm) and are removed afterwards. The time should grow
# linearly with N (bench/RESULTS.md: the parser was once quadratic).
set -euo pipefail
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
