#!/usr/bin/env bash
# Installs dependencies, builds weightcast (Release) and runs the whole test suite.
# Usage: bash scripts/test.sh   (from anywhere; the build goes to ./build)
#
# One build serves CPU and GPU hosts: where the CUDA toolkit's headers and nccl.h are found
# (/usr/local/cuda) the cuda device and the nccl transport are compiled in, and the CUDA
# runtime and NCCL are loaded at run time (docs/DESIGN.md § Devices), so the same binaries run
# every test here; without a GPU the [gpu] tests skip with a warning. WEIGHTCAST_TEST_CUDA=0
# builds without CUDA (-DWEIGHTCAST_CUDA=OFF), WEIGHTCAST_TEST_CUDA=1 makes missing headers
# an error (ON); the default is AUTO.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
case ${WEIGHTCAST_TEST_CUDA:-auto} in
  0) cuda=OFF ;;
  1) cuda=ON ;;
  *) cuda=AUTO ;;
esac
# The option is passed every time: a build folder configured before keeps its cached value.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DWEIGHTCAST_CUDA=$cuda
cmake --build build -j "$(nproc)"
build/weightcast --version
ctest --test-dir build --output-on-failure -j 2 --timeout 900

# The Python package (tests/python): a venv (WEIGHTCAST_VENV, else build/py-venv, torch CPU
# from PyPI once), `pip install .`, pytest. WEIGHTCAST_TEST_PYTHON=0 skips it.
if [ "${WEIGHTCAST_TEST_PYTHON:-1}" != 0 ]; then
  bash scripts/test_python.sh
fi
