#!/usr/bin/env bash
# The Python package's tests: builds and installs `weightcast` with pip (scikit-build-core +
# nanobind) and runs pytest on tests/python/.
#
#   scripts/test_python.sh [pytest args...]
#
# Python: $WEIGHTCAST_VENV if set (a venv to create or reuse), else the active venv
# ($VIRTUAL_ENV), else ./build/py-venv. On a
# fresh machine the venv is created and torch (PyPI's wheel, used on the CPU), safetensors, transformers, accelerate, pytest,
# numpy, nanobind and scikit-build-core are installed from PyPI once; later runs reuse it.
# WEIGHTCAST_CUDA=AUTO|ON|OFF is passed to CMake (default AUTO: CUDA when the toolkit and
# NCCL are found). The C++ build's dependencies must be installed (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${WEIGHTCAST_VENV:-${VIRTUAL_ENV:-build/py-venv}}
# Absolute: pytest runs from tests/python below.
venv=$(realpath -m "$venv")
python=${PYTHON:-python3}
if [[ ! -x "$venv/bin/python" ]]; then
  echo "test_python.sh: creating $venv" >&2
  "$python" -m venv "$venv"
fi
py="$venv/bin/python"
need=()
"$py" -c 'import torch' 2>/dev/null ||
  need+=(torch)
for mod in safetensors transformers accelerate pytest numpy nanobind scikit_build_core; do
  "$py" -c "import $mod" 2>/dev/null || need+=("${mod//_/-}")
done
if ((${#need[@]})); then
  echo "test_python.sh: installing ${need[*]}" >&2
  "$py" -m pip install --quiet "${need[@]}"
fi

export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
fi
# --no-build-isolation: build with the venv's nanobind and scikit-build-core (no download
# per run); the persistent build folder (pyproject.toml) makes a rebuild incremental.
# A build folder per CUDA setting, so switching does not rebuild everything.
cuda=${WEIGHTCAST_CUDA:-AUTO}
# WEIGHTCAST_SELF_CONTAINED=OFF: the system's libraries, MPI and CUDA as found, the extension
# only (pyproject.toml's default is the self-contained wheel with its CLI: scripts/wheel.sh).
"$py" -m pip install --quiet --no-build-isolation -C cmake.define.WEIGHTCAST_CUDA="$cuda" \
  -C cmake.define.WEIGHTCAST_SELF_CONTAINED=OFF -C build.targets=weightcast_python \
  -C build-dir="build/py-cuda-$cuda-{wheel_tag}" .
# Run from outside the tree so `import weightcast` is the installed package.
cd tests/python
exec "$py" -m pytest -q -p no:cacheprovider "$@" .
