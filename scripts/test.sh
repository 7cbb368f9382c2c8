#!/usr/bin/env bash
# Installs dependencies, builds weightcast (Release) and runs the whole test suite.
# Usage: bash scripts/test.sh   (from anywhere; the builds go to ./build and ./build-cuda)
#
# ./build is the host-only build (-DWEIGHTCAST_CUDA=OFF) and runs every test. Where the CUDA
# toolkit and NCCL are installed (/usr/local/cuda), ./build-cuda (-DWEIGHTCAST_CUDA=ON) is
# built and linked as well and runs the tests except the multi-GiB [large] ones; without a
# GPU its [gpu] tests skip with a warning. WEIGHTCAST_TEST_CUDA=0 skips that build,
# WEIGHTCAST_TEST_CUDA=1 makes a missing toolkit an error.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DWEIGHTCAST_CUDA=OFF
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j 2 --timeout 900

want_cuda=${WEIGHTCAST_TEST_CUDA:-auto}
if [ "$want_cuda" = 0 ]; then
  echo "test.sh: CUDA build skipped (WEIGHTCAST_TEST_CUDA=0)"
elif [ -e /usr/local/cuda/include/nccl.h ] || command -v nvcc >/dev/null || [ "$want_cuda" = 1 ]; then
  echo "test.sh: CUDA build (-DWEIGHTCAST_CUDA=ON) in build-cuda"
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DWEIGHTCAST_CUDA=ON
  cmake --build build-cuda -j "$(nproc)"
  build-cuda/weightcast --version
  build-cuda/tests/weightcast_tests "~[large]"
else
  echo "test.sh: no CUDA toolkit and NCCL in /usr/local/cuda: CUDA build skipped"
fi

# The Python package (tests/python): a venv (WEIGHTCAST_VENV, else build/py-venv, torch CPU
# from PyPI once), `pip install .`, pytest. WEIGHTCAST_TEST_PYTHON=0 skips it.
if [ "${WEIGHTCAST_TEST_PYTHON:-1}" != 0 ]; then
  bash scripts/test_python.sh
fi
