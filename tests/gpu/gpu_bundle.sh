#!/usr/bin/env bash
# Packs what a bare GPU host needs for tests/gpu/gpu_check.sh: the wheel (scripts/wheel.sh,
# abi3, so the host's Python >= 3.12 installs it) and what the wheel does not carry, built
# here (the one build, ./build, CUDA compiled in; no GPU needed): no compiler, headers or
# package registry is needed there.
#
# Usage: bash tests/gpu/gpu_bundle.sh [BUNDLE_DIR]        (default: out/gpu-bundle, git-ignored)
#
# The bundle (at most 64 MiB, all the device tool carries to a GPU machine):
#   wheels/   weightcast-*-abi3-*.whl, which gpu_check.sh installs into a venv on the host's
#             torch and runs the CLI and every Python row from; the safetensors wheel (abi3,
#             manylinux x86_64), installed with it only where the host's python3 has none
#             (torch does not bring it)
#   bin/      weightcast_tests and h2d_bench (the [gpu] tests and the H2D ceiling: the wheel
#             has neither); RPATH $ORIGIN/../lib
#   lib/      the shared libraries they load that a bare host lacks (found with ldd): fmt,
#             spdlog, yaml-cpp, liburing, xxhash (gpu_check_digests.py's too), Open MPI's,
#             ...; never glibc, the CUDA runtime, the driver or NCCL (the host's: torch's
#             nvidia-* wheels carry both; only h2d_bench links the CUDA runtime)
#   lib/compat/  this build's libstdc++ and libgcc_s, used only where the host's are older
#   tests/gpu/ gpu_check.sh and its Python helpers (gpu_check_*.py);  BUNDLE.txt: what was
#             built, from which commit
#
# The wheel: $WEIGHTCAST_BUNDLE_WHEEL, else dist/weightcast-*-abi3-*.whl when there, else
# built with scripts/wheel.sh by $WEIGHTCAST_WHEEL_PYTHON (default: the first python3.12 or
# python3.13 found; an abi3 wheel needs Python >= 3.12 to build, and the GPU host's Python
# is 3.12).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUNDLE=${1:-out/gpu-bundle}
BUILD=${WEIGHTCAST_BUNDLE_BUILD:-build}
JOBS=${WEIGHTCAST_BUNDLE_JOBS:-2}
LIMIT_BYTES=$((64 << 20))
WORK=out/gpu-bundle-work  # logs and the downloaded safetensors wheel (ignored)
mkdir -p "$WORK"
note() { printf 'gpu_bundle: %s\n' "$*"; }

# ON: the bundle is for a GPU host, so missing CUDA headers are an error here, not a build
# without CUDA. The compiler launcher comes from the environment or the build's cache: passing
# one here would change every compile command of a build configured without it.
note "configuring $BUILD (WEIGHTCAST_CUDA=ON, Release)"
cmake -S . -B "$BUILD" -G Ninja -DWEIGHTCAST_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
  >"$WORK/configure.log" 2>&1 || { tail -30 "$WORK/configure.log"; exit 69; }
note "building weightcast_tests h2d_bench ($JOBS jobs)"
ninja -C "$BUILD" -j "$JOBS" weightcast_tests h2d_bench

# ---- the wheel -----------------------------------------------------------------------------
WHEEL=${WEIGHTCAST_BUNDLE_WHEEL:-$(ls dist/weightcast-*-abi3-*.whl 2>/dev/null | head -1)}
if [ -z "$WHEEL" ]; then
  wheel_py=${WEIGHTCAST_WHEEL_PYTHON:-$(command -v python3.12 || command -v python3.13 ||
    ls /root/.pyenv/versions/3.1[23]*/bin/python3 2>/dev/null | head -1 || true)}
  [ -n "$wheel_py" ] || { note "no Python >= 3.12 to build the abi3 wheel with (WEIGHTCAST_WHEEL_PYTHON)"; exit 69; }
  note "building the abi3 wheel with $wheel_py (scripts/wheel.sh)"
  PYTHON=$wheel_py WEIGHTCAST_VENV=${WEIGHTCAST_WHEEL_VENV:-build/py-abi3-venv} \
    bash scripts/wheel.sh >"$WORK/wheel.log" 2>&1 || { tail -30 "$WORK/wheel.log"; exit 69; }
  WHEEL=$(ls dist/weightcast-*-abi3-*.whl | head -1)
fi
case ${WHEEL##*/} in
  *-abi3-*) ;;
  *) note "${WHEEL##*/} is not an abi3 wheel: the GPU host's Python (3.12) could not install it"; exit 69 ;;
esac

# ---- the Python rows' own imports that torch does not bring: safetensors -------------------
# Downloaded once (pip's own client) into $WORK/wheels and reused; the abi3 wheel serves any
# Python >= 3.10 on x86_64. Only safetensors: its torch module needs nothing but torch to
# load, and the rows write their files with gpu_check_st.py (no numpy).
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
mkdir -p "$BUNDLE"/{bin,lib/compat,tests/gpu,wheels}
cp "$BUILD/tests/weightcast_tests" "$BUILD/h2d_bench" "$BUNDLE/bin/"
cp tests/gpu/gpu_check.sh tests/gpu/gpu_check_*.py "$BUNDLE/tests/gpu/"
safetensors=$(ls "$WHEELS"/safetensors-*.whl | sort -V | tail -1)
cp "$WHEEL" "$safetensors" "$BUNDLE/wheels/"

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
strip --strip-unneeded "$BUNDLE"/bin/* "$BUNDLE"/lib/*.so* 2>/dev/null || true

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
  echo "needs on the host: glibc >= ${glibc#GLIBC_} (for ${newest##* }), libcudart.so.13, libnccl.so.2, a CUDA 13 driver; python3 >= 3.12 with torch"
  echo "wheel: ${WHEEL##*/} ($(du -h "$WHEEL" | cut -f1))"
  echo "safetensors: ${safetensors##*/} (installed where the host's python3 has none)"
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
