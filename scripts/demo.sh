#!/usr/bin/env bash
# The job the README describes, on this machine: builds the weightcast CLI alone, writes a
# 1B-parameter synthetic checkpoint to /tmp/weightcast-demo (once) and loads it on 3 ranks
# under mpirun with configs/demo.yaml: rank 0 reads through a 64 MiB window, each rank
# receives only its FSDP shard, every rank's bytes are checked against rank 0's. Rank 0's
# summary prints its peak RSS beside the window and the model's size. Extra arguments go to
# `weightcast launch` (e.g. --set buffer_depth=2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# Its own build directory, without the test suite or benchmarks (scripts/test.sh builds
# ./build with them), and only the CLI target: building what the demo runs, nothing else.
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DWEIGHTCAST_CUDA=OFF \
  -DWEIGHTCAST_BUILD_TESTS=OFF
cmake --build build-demo -j "$(nproc)" --target weightcast_cli
if [ ! -e /tmp/weightcast-demo/model.safetensors ] && [ ! -e /tmp/weightcast-demo/model.safetensors.index.json ]; then
  build-demo/weightcast synth /tmp/weightcast-demo --params 1B
fi
build-demo/weightcast launch -n 3 configs/demo.yaml "$@"
