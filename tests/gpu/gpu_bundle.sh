#!/usr/bin/env bash
# Builds weightcast here (the one build, ./build, CUDA compiled in; no GPU needed) and packs a
# relocatable bundle for a bare GPU host: tests/gpu/gpu_check.sh runs from it with no
# compiler, headers or package registry.
#
# Usage: bash tests/gpu/gpu_bundle.sh [BUNDLE_DIR]        (default: out/gpu-bundle, git-ignored)
#
# The bundle (at most 64 MiB, all the device tool carries to a GPU machine):
#   bin/      weightcast, weightcast_tests, h2d_bench; RPATH $ORIGIN/../lib
#   lib/      the shared libraries they load that a bare host lacks (found with ldd): fmt,
#             spdlog, yaml-cpp, liburing, xxhash, Open MPI's, ...; never glibc, the CUDA
#             runtime, the driver or NCCL (the host's: weightcast and weightcast_tests load
#             the CUDA runtime and NCCL at run time, torch's nvidia-* wheels carry both,
#             gpu_check.sh puts their folders on the library path and reports the versions
#             that ran; only h2d_bench links them)
#   lib/compat/  this build's libstdc++ and libgcc_s, used only where the host's are older
#   python/weightcast/  the Python package with an abi3 extension (Python >= 3.12; see below)
#   pydeps/   what the check's Python rows import that torch's wheel does not bring: the
#             safetensors wheel (abi3, manylinux x86_64) unpacked; gpu_check.sh puts it on
#             sys.path only where the host's python3 has no safetensors
#   tests/gpu/ gpu_check.sh and its Python helpers (gpu_check_*.py);  BUNDLE.txt: what was
#             built, from which commit
#
# No kernels: weightcast calls the CUDA runtime and NCCL from plain C++ (g++ builds it, no
# nvcc), so there is no device code to compile for sm_90; what runs on the H200 is NCCL's and
# the driver's. The binaries need a CUDA 13 runtime (libcudart.so.13, or 12 from 12.5 for
# weightcast) and a driver for it.
#
# The Python extension is built for the stable ABI (nanobind STABLE_ABI, Py_LIMITED_API
# 3.12), which needs Python >= 3.12 headers at build time; this machine's python3 is 3.11.
# They come from $WEIGHTCAST_BUNDLE_PYROOT (default out/gpu-pyroot), a Debian stable root
# (Python 3.13) with python3-dev, made with debootstrap when missing (about 5 minutes).
# Without python/CMakeLists.txt (the package not merged yet) or with
# WEIGHTCAST_BUNDLE_PYTHON=0 the bundle has no Python package and says so in BUNDLE.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD
BUNDLE=${1:-out/gpu-bundle}
# The one build (scripts/test.sh's); the extension has a build of its own: another Python.
BUILD=${WEIGHTCAST_BUNDLE_BUILD:-build}
PYBUILD=${WEIGHTCAST_BUNDLE_PYBUILD:-build-bundle-py}
PYROOT=$(realpath -m "${WEIGHTCAST_BUNDLE_PYROOT:-out/gpu-pyroot}")
JOBS=${WEIGHTCAST_BUNDLE_JOBS:-2}
LIMIT_BYTES=$((64 << 20))
WORK=out/gpu-bundle-work  # logs, the Python header copy, the interpreter wrapper (ignored)
mkdir -p "$WORK"
note() { printf 'gpu_bundle: %s\n' "$*"; }

# The compiler launcher comes from the environment (CMAKE_CXX_COMPILER_LAUNCHER=ccache, as
# the project builds) or from an existing build folder's cache: passing one here would change
# every compile command of a build configured without it (scripts/test.sh's) and rebuild it
# all.
launcher=()

# ON: the bundle is for a GPU host, so missing CUDA headers are an error here, not a build
# without CUDA.
note "configuring $BUILD (WEIGHTCAST_CUDA=ON, Release)"
cmake -S . -B "$BUILD" -G Ninja -DWEIGHTCAST_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
  "${launcher[@]}" >"$WORK/configure.log" 2>&1 || { tail -30 "$WORK/configure.log"; exit 69; }
note "building weightcast_cli weightcast_tests h2d_bench ($JOBS jobs)"
ninja -C "$BUILD" -j "$JOBS" weightcast_cli weightcast_tests h2d_bench

# ---- the Python extension, abi3 (optional) ----------------------------------------------
PY_STATUS="not built: python/CMakeLists.txt is absent (the Python package is not in this tree)"
PY_MODULE=
if [ "${WEIGHTCAST_BUNDLE_PYTHON:-1}" = 0 ]; then
  PY_STATUS="not built: WEIGHTCAST_BUNDLE_PYTHON=0"
elif [ -f python/CMakeLists.txt ]; then
  if [ ! -x "$PYROOT/usr/bin/python3" ] || ! ls "$PYROOT"/usr/include/python3.1[2-9]/Python.h >/dev/null 2>&1; then
    note "making the Python >= 3.12 header root $PYROOT (debootstrap, Debian stable)"
    command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
    rm -rf "$PYROOT"
    debootstrap --variant=minbase --include=python3-dev stable "$PYROOT" \
      http://deb.debian.org/debian >"$WORK/pyroot.log" 2>&1 || { tail -20 "$WORK/pyroot.log"; exit 69; }
  fi
  rootinc=$(ls -d "$PYROOT"/usr/include/python3.1[2-9] | tail -1)
  pyver=${rootinc##*/python}
  # Debian's pyconfig.h includes the multiarch one by a path under /usr/include: a copy of
  # the headers with that one in its place, so no -I to the root's /usr/include (its C
  # library headers must not mix with this machine's).
  pyinc=$PWD/$WORK/include/python$pyver
  rm -rf "$PWD/$WORK/include"
  mkdir -p "$pyinc"
  cp -a "$rootinc"/. "$pyinc"/
  cp "$PYROOT/usr/include/x86_64-linux-gnu/python$pyver/pyconfig.h" "$pyinc/pyconfig.h"
  # CMake runs the interpreter for its version and extension suffix: the root's python3,
  # through chroot (its answers are the root's; the include dir is given as a host path).
  wrapper=$PWD/$WORK/python3
  printf '#!/bin/sh\nexec chroot %q /usr/bin/python3 "$@"\n' "$PYROOT" >"$wrapper"
  chmod +x "$wrapper"
  # nanobind (its CMake package ships in the Python package) and CMake >= 3.26 (nanobind's
  # stable ABI needs FindPython's Development.SABIModule; Debian 12 has 3.25): python3's when
  # it has them, else from PyPI into a small venv of the bundle's own, out/gpu-bundle-venv,
  # made here, so this script alone works from a fresh clone (it does not lean on the venv
  # scripts/test_python.sh makes). WEIGHTCAST_BUNDLE_NANOBIND_DIR overrides nanobind.
  TOOLS=$PWD/out/gpu-bundle-venv
  tools_need=()
  nanobind_dir=${WEIGHTCAST_BUNDLE_NANOBIND_DIR:-$(python3 -m nanobind --cmake_dir 2>/dev/null ||
    "$TOOLS/bin/python" -m nanobind --cmake_dir 2>/dev/null || true)}
  [ -n "$nanobind_dir" ] || tools_need+=('nanobind>=2.4')
  CMAKE_PY=cmake
  if ! printf '3.26\n%s\n' "$(cmake --version | awk 'NR == 1 {print $3}')" | sort -V -C; then
    CMAKE_PY=$TOOLS/bin/cmake
    [ -x "$CMAKE_PY" ] || tools_need+=('cmake>=3.26,<4')
  fi
  if ((${#tools_need[@]})); then
    note "from PyPI into $TOOLS: ${tools_need[*]}"
    [ -x "$TOOLS/bin/python" ] || python3 -m venv "$TOOLS" ||
      { note "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 69; }
    "$TOOLS/bin/python" -m pip install -q "${tools_need[@]}" ||
      { note "pip could not install ${tools_need[*]}"; exit 69; }
    [ -n "$nanobind_dir" ] || nanobind_dir=$("$TOOLS/bin/python" -m nanobind --cmake_dir)
  fi
  note "configuring $PYBUILD: the extension for the limited API of Python 3.12 (headers $pyver)"
  if "$CMAKE_PY" -S . -B "$PYBUILD" -G Ninja -DWEIGHTCAST_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DWEIGHTCAST_PYTHON=ON -DWEIGHTCAST_BUILD_TESTS=OFF "${launcher[@]}" \
    -DPython_EXECUTABLE="$wrapper" -DPython_INCLUDE_DIR="$pyinc" \
    -DPython_FIND_STRATEGY=LOCATION -Dnanobind_DIR="$nanobind_dir" \
    >"$WORK/configure-py.log" 2>&1 && ninja -C "$PYBUILD" -j "$JOBS" weightcast_python; then
    PY_MODULE=$(find "$PYBUILD" -name '_weightcast*.so' -newer "$WORK/configure-py.log" | head -1)
    [ -n "$PY_MODULE" ] || PY_MODULE=$(find "$PYBUILD" -name '_weightcast*.so' | head -1)
    case "$PY_MODULE" in
      *.abi3.so) PY_STATUS="built: ${PY_MODULE##*/} (stable ABI, Python >= 3.12; headers $pyver)" ;;
      "") PY_STATUS="build produced no _weightcast*.so"; note "$PY_STATUS" ;;
      *) PY_STATUS="built, but not abi3: ${PY_MODULE##*/}" ;;
    esac
  else
    tail -20 "$WORK/configure-py.log"
    PY_STATUS="build failed (see $WORK/configure-py.log)"
    note "the Python extension: $PY_STATUS; bundling without it"
  fi
fi

# ---- the Python rows' own imports that torch does not bring: safetensors -------------------
# Downloaded once (pip's own client) into $WORK/wheels and reused; the abi3 wheel serves any
# Python >= 3.10 on x86_64 (the GPU host's is 3.12). Only safetensors: its torch module needs
# nothing but torch to load, and the rows write their files with gpu_check_st.py (no numpy).
WHEELS=$WORK/wheels
mkdir -p "$WHEELS"
if ! ls "$WHEELS"/safetensors-*.whl >/dev/null 2>&1; then
  note "downloading the safetensors wheel (abi3, manylinux x86_64) into $WHEELS"
  pip_py=python3
  if ! python3 -m pip --version >/dev/null 2>&1; then
    pip_py=$PWD/out/gpu-bundle-venv/bin/python
    [ -x "$pip_py" ] || python3 -m venv "$PWD/out/gpu-bundle-venv" ||
      { note "python3 has no pip and no venv (Debian: apt-get install python3-venv)"; exit 69; }
  fi
  "$pip_py" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --python-version 3.12 --implementation cp -d "$WHEELS" 'safetensors>=0.4' ||
    { note "pip could not download the safetensors wheel"; exit 69; }
fi

# ---- pack --------------------------------------------------------------------------------
note "packing $BUNDLE"
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE"/{bin,lib/compat,tests/gpu,python,pydeps}
cp "$BUILD/weightcast" "$BUILD/tests/weightcast_tests" "$BUILD/h2d_bench" "$BUNDLE/bin/"
cp tests/gpu/gpu_check.sh tests/gpu/gpu_check_*.py "$BUNDLE/tests/gpu/"
wheel=$(ls "$WHEELS"/safetensors-*.whl | sort -V | tail -1)
python3 -m zipfile -e "$wheel" "$BUNDLE/pydeps"
if [ -n "$PY_MODULE" ]; then
  cp -r python/weightcast "$BUNDLE/python/"
  find "$BUNDLE/python" -name __pycache__ -prune -exec rm -rf {} +
  cp "$PY_MODULE" "$BUNDLE/python/weightcast/"
fi

# What a bare host has or must bring itself: glibc, the CUDA driver and runtime, NCCL.
is_host_lib() {
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libdl.so* | libpthread.so* | \
      librt.so* | libutil.so* | libresolv.so* | libcuda.so* | libcudart.so* | libnccl.so* | \
      libnvidia*.so*) return 0 ;;
  esac
  return 1
}
objects=("$BUNDLE"/bin/*)
[ -n "$PY_MODULE" ] && objects+=("$BUNDLE"/python/weightcast/"${PY_MODULE##*/}")
declare -A copied=()
for object in "${objects[@]}"; do
  while read -r name _ path _; do
    [ "$path" = "not" ] && { note "ldd: $object: $name not found here"; exit 1; }
    [ -n "$path" ] && [ -e "$path" ] || continue
    is_host_lib "$name" && continue
    [ -n "${copied[$name]:-}" ] && continue
    copied[$name]=1
    case "$name" in
      libstdc++.so* | libgcc_s.so*) cp -L "$path" "$BUNDLE/lib/compat/$name" ;;
      *) cp -L "$path" "$BUNDLE/lib/$name" ;;
    esac
  done < <(ldd "$object" | awk '/=>/ {print $1, $2, $3, $4}')
done
# Open MPI finds its plugins and help files relative to its install prefix, which does not
# travel: the bundle's mpi transport is for loading the library only (one GPU, one rank).
for object in "$BUNDLE"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$object"; done
for lib in "$BUNDLE"/lib/*.so*; do patchelf --set-rpath '$ORIGIN' "$lib" 2>/dev/null || true; done
if [ -n "$PY_MODULE" ]; then
  patchelf --set-rpath '$ORIGIN/../../lib' "$BUNDLE/python/weightcast/${PY_MODULE##*/}"
fi
strip --strip-unneeded "$BUNDLE"/bin/* "$BUNDLE"/lib/*.so* 2>/dev/null || true
[ -n "$PY_MODULE" ] && strip --strip-unneeded "$BUNDLE/python/weightcast/${PY_MODULE##*/}"

{
  echo "weightcast GPU bundle"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%FT%TZ) on $(. /etc/os-release; echo "$PRETTY_NAME"), $(c++ --version | head -1)"
  echo "CUDA headers: $(awk '/define CUDART_VERSION/ {print int($3 / 1000) "." ($3 % 1000) / 10; exit}' /usr/local/cuda/include/cuda_runtime_api.h 2>/dev/null); NCCL headers: $(awk '/define NCCL_(MAJOR|MINOR|PATCH) /{printf "%s%s", sep, $3; sep="."}' /usr/local/cuda/include/nccl.h 2>/dev/null)"
  echo "device code: none (no kernels; nothing compiled for sm_90)"
  newest=$(for f in "$BUNDLE"/bin/* "$BUNDLE"/lib/*.so*; do
    printf '%s %s\n' "$(objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)" "${f##*/}"
  done | sort -V | tail -1)
  glibc=${newest%% *}
  echo "needs on the host: glibc >= ${glibc#GLIBC_} (for ${newest##* }), libcudart.so.13, libnccl.so.2, a CUDA 13 driver"
  echo "python: $PY_STATUS"
  echo "pydeps: ${wheel##*/} (used where the host's python3 has no safetensors)"
  echo "libraries: $(cd "$BUNDLE/lib" && ls *.so* | tr '\n' ' ')"
  echo "compat (host's used when new enough): $(cd "$BUNDLE/lib/compat" && ls | tr '\n' ' ')"
} >"$BUNDLE/BUNDLE.txt"

bytes=$(du -sb "$BUNDLE" | cut -f1)
echo "size: $bytes bytes" >>"$BUNDLE/BUNDLE.txt"
cat "$BUNDLE/BUNDLE.txt"
if ((bytes > LIMIT_BYTES)); then
  note "the bundle is $bytes bytes, over the $LIMIT_BYTES the device tool carries"
  exit 1
fi
note "done: $BUNDLE ($((bytes >> 20)) MiB of the 64 MiB limit)"
