#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for FUZZ_SECONDS (default 60),
# seeded from ../shared/corpus (or $WEIGHTCAST_CORPUS); fuzz_control_message's seeds are real
# control-plane messages written by build-fuzz/control_message_seeds. Crashes land in
# build-fuzz/crashes/; the script fails if any target finds one. Usage: bash scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
corpus=${WEIGHTCAST_CORPUS:-../shared/corpus}
[ -d "$corpus/real" ] || { echo "fuzz: corpus not found at $corpus" >&2; exit 66; }

CC=clang CXX=clang++ cmake -S fuzz -B build-fuzz -G Ninja >/dev/null
cmake --build build-fuzz

seeds=build-fuzz/seeds
rm -rf "$seeds" && mkdir -p "$seeds/header" "$seeds/index" "$seeds/control" build-fuzz/crashes
# -size -1024k: under 1 MiB (find rounds -1M up to whole MiB, which only empty files pass).
find "$corpus" -name '*.safetensors' -size -1024k -exec cp -t "$seeds/header" {} + 2>/dev/null || true
find "$corpus" -name '*.index.json' -size -1024k -exec sh -c 'for f; do cp "$f" "$0/$(echo "$f" | md5sum | cut -c1-16).json"; done' "$seeds/index" {} +
find "$corpus/real" -name '*.safetensors' -size -1024k -print0 |
  xargs -0 build-fuzz/control_message_seeds "$seeds/control" 2>build-fuzz/control-seeds.log
export TMPDIR=${TMPDIR:-/tmp}
status=0
for target in header index control; do
  case $target in
    header) binary=fuzz_safetensors_header dict=fuzz/safetensors.dict ;;
    index) binary=fuzz_index dict=fuzz/safetensors.dict ;;
    control) binary=fuzz_control_message dict=fuzz/control_message.dict ;;
  esac
  echo "fuzz: $binary for ${seconds}s"
  if ! "build-fuzz/$binary" -max_total_time="$seconds" \
      -timeout=10 -rss_limit_mb=2048 -dict="$dict" -artifact_prefix=build-fuzz/crashes/ \
      -print_final_stats=1 "$seeds/$target" 2>build-fuzz/fuzz-$target.log; then
    echo "fuzz: $binary found a failure:" >&2
    tail -40 build-fuzz/fuzz-$target.log >&2
    status=1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" build-fuzz/fuzz-$target.log || true
done
exit $status
