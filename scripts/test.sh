#!/usr/bin/env bash
# Installs dependencies, builds weightcast (Release) and runs the whole test suite.
# Usage: bash scripts/test.sh   (from anywhere; the build goes to ./build)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j 2 --timeout 900
