#!/usr/bin/env bash
# CTest `install.example_trainer`: installs this build into a temporary prefix, then
# configures, builds and runs examples/trainer against the installed package, the way a
# trainer embeds weightcast (find_package(weightcast CONFIG), weightcast::weightcast).
#
# Usage: install_example.sh BUILD_DIR SOURCE_DIR CXX_COMPILER CXX_FLAGS GENERATOR
set -euo pipefail
build_dir=$1 source_dir=$2 cxx=$3 cxx_flags=$4 generator=$5
corpus=${WEIGHTCAST_CORPUS:-$source_dir/../shared/corpus}
checkpoint=$corpus/real/CoffeeVampir3__Model-Saving-Test-Repo/model.safetensors
[ -f "$checkpoint" ] || { echo "corpus file not found: $checkpoint" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/weightcast-install-XXXXXX")
trap 'rm -rf "$work"' EXIT

cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
for f in include/weightcast/loader.hpp include/weightcast/asio.hpp lib/libweightcast.a \
         lib/cmake/weightcast/weightcastConfig.cmake \
         lib/cmake/weightcast/weightcastConfigVersion.cmake \
         lib/cmake/weightcast/weightcastTargets.cmake bin/weightcast; do
  [ -e "$work/prefix/$f" ] || { echo "not installed: $f" >&2; cat "$work/install.log"; exit 1; }
done

# The consumer sees only the installed prefix, never this source or build tree. Debug (-O0)
# compiles the example fastest; the compiler and flags are the build's (a sanitizer build's
# static library needs the sanitizer at link time too).
cmake -S "$source_dir/examples/trainer" -B "$work/build" -G "$generator" \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$cxx_flags" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
cmake --build "$work/build"

check() {  # check MODE_ARGS...: runs the trainer, checks what it printed
  local out
  out=$("$work/build/trainer" "$@")
  echo "$out"
  grep -q '^tensors: 4$' <<<"$out"
  grep -q '^bytes: [1-9][0-9]*$' <<<"$out"
  grep -qE '^first tensor: .* first bytes:( [0-9a-f]{2})+$' <<<"$out"
}
check "$checkpoint"
check --coroutine "$checkpoint"
grep -q '^mode: coroutine' <<<"$("$work/build/trainer" --coroutine "$checkpoint")"
# A failed load ends the trainer with weightcast's <sysexits.h> status (66: no such file).
for mode in "" --coroutine; do
  status=0
  "$work/build/trainer" $mode "$work/no-such.safetensors" 2>/dev/null || status=$?
  if [ "$status" -ne 66 ]; then
    echo "install.example_trainer: trainer $mode on a missing file exited $status, not 66" >&2
    exit 1
  fi
done
echo "install.example_trainer: passed"
