#!/usr/bin/env bash
# Installs dependencies, builds weightcast, writes a 1B-parameter synthetic checkpoint to
# /tmp/weightcast-demo (once) and loads it with the built-in default config.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
if [ ! -e /tmp/weightcast-demo/model.safetensors ] && [ ! -e /tmp/weightcast-demo/model.safetensors.index.json ]; then
  build/weightcast synth /tmp/weightcast-demo --params 1B
fi
build/weightcast run configs/default.yaml "$@"
