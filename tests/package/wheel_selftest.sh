#!/usr/bin/env bash
# Proves the wheel (scripts/wheel.sh) installs and runs on a host with no compiler, no -dev
# package and none of the libraries the normal build links (fmt, spdlog, yaml-cpp, liburing,
# xxhash, utf8proc, Open MPI, PMIx): a minimal Debian root with python3 and python3-venv only.
# Inside it, in a fresh venv, as a user without root would:
#   - pip install of the wheel, timed, with no index (the wheel has no dependencies);
#   - `import weightcast` (and that it did not import torch);
#   - the console script: `weightcast --version`, `synth` of a tiny checkpoint, `inspect`, `run`
#     (--json), `launch -n 1` and `launch -n 2` with transport shm (the launcher re-executes its
#     own binary for the ranks), and transport mpi refused (69: no MPI in the wheel);
#   - with torch (`weightcast.load` needs it; PyPI's CPU wheel, installed once into a folder of
#     the root once, or a local one: see below), `weightcast.load` of that checkpoint,
#     bit-exact against safetensors.torch.load_file;
#   - the Python suite (tests/python) against the installed wheel, in a second fresh venv: the
#     one-process tests and the multi-rank ones that need no MPI (torch.multiprocessing and
#     torchrun worlds over shm and tcp); the mpirun ones skip, saying so (see the step below).
#
# Usage: bash tests/package/wheel_selftest.sh [WHEEL]     (default: builds dist/ with scripts/wheel.sh)
# Needs root (debootstrap, chroot, mounts) and the network the first time (Debian's mirror for
# the root, about 4 minutes; the torch CPU wheel and safetensors from PyPI). The root is cached
# in $WEIGHTCAST_WHEEL_ROOT (default build/wheel-root-<suite>): a rerun takes seconds plus the
# wheel's build. The suite matches the wheel's Python: a cp311 wheel (built by this machine's
# Python 3.11) needs Debian 12 (bookworm, Python 3.11); an abi3 wheel runs on Debian stable.
# WEIGHTCAST_WHEEL_TORCH=0 leaves torch out (the load step is then skipped, saying so).
# Time on the 2-core VM, the wheel built: about 2 minutes for a new root and the steps before
# the Python suite, and 1 minute for the suite (150 passed, 51 skipped: the mpirun, CUDA and
# namespace-cluster tests, and one that needs a git checkout).
# Exit status: 0 when every step passed, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
START=$(date +%s)
say() { printf 'wheel_selftest [%4s s]: %s\n' "$(($(date +%s) - START))" "$*"; }

if [ $# -ge 1 ]; then
  WHEEL=$1
else
  say "building the wheel (scripts/wheel.sh)"
  mkdir -p build
  bash scripts/wheel.sh >build/wheel.log 2>&1 || { tail -40 build/wheel.log; exit 1; }
  WHEEL=$(ls dist/weightcast-*.whl | head -1)
fi
[ -f "$WHEEL" ] || { say "no wheel at $WHEEL"; exit 1; }
name=${WHEEL##*/}
say "wheel: $name ($(du -h "$WHEEL" | cut -f1))"

case $name in
  *-cp311-cp311-*) suite=bookworm ;;
  *-cp310-cp310-*) suite=bullseye ;;
  *-abi3-*) suite=stable ;;
  *) say "no Debian suite known for the Python of $name"; exit 1 ;;
esac
suite=${WEIGHTCAST_WHEEL_SUITE:-$suite}
ROOT=${WEIGHTCAST_WHEEL_ROOT:-build/wheel-root-$suite}
if [ ! -e "$ROOT/.weightcast-wheel-root" ]; then
  say "making the minimal root $ROOT (debootstrap minbase, Debian $suite, python3 python3-venv)"
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
  rm -rf "$ROOT"
  mkdir -p "$(dirname "$ROOT")"
  debootstrap --variant=minbase --include=python3,python3-venv "$suite" "$ROOT" \
    http://deb.debian.org/debian >"$ROOT.log" 2>&1 || { tail -20 "$ROOT.log"; exit 1; }
  touch "$ROOT/.weightcast-wheel-root"
fi
say "root: $(. "$ROOT/etc/os-release"; echo "$PRETTY_NAME"), $(chroot "$ROOT" python3 --version)"

# A root with the build's tools or libraries proves nothing.
for path in usr/bin/c++ usr/bin/g++ usr/bin/cc usr/bin/cmake usr/include/fmt usr/include/spdlog \
  usr/include/liburing.h usr/include/python3.11/Python.h usr/bin/mpirun; do
  [ -e "$ROOT/$path" ] && { say "the root has /$path: not a bare host"; exit 1; }
done
# Debian's minimal base has libxxhash0 (apt needs it): a note, not a failure; the wheel's
# binaries need no library but glibc's (checked below, and by scripts/wheel.sh).
for lib in libfmt libspdlog libyaml-cpp liburing libxxhash libutf8proc libmpi libpmix; do
  if ls "$ROOT"/usr/lib/x86_64-linux-gnu/"$lib".so* >/dev/null 2>&1; then
    case $lib in
      libxxhash) say "note: the root has $lib (a dependency of apt)" ;;
      *) say "the root has $lib: not a bare host"; exit 1 ;;
    esac
  fi
done

mounted=()
cleanup() {
  local m
  for m in "${mounted[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
}
trap cleanup EXIT
for fs in proc sys dev; do
  mountpoint -q "$ROOT/$fs" && continue
  case $fs in
    proc) mount -t proc proc "$ROOT/proc" ;;
    *) mount --rbind "/$fs" "$ROOT/$fs" && mount --make-rslave "$ROOT/$fs" ;;
  esac
  mounted=("$ROOT/$fs" "${mounted[@]}")
done
# The host's name servers, for pip in the root (debootstrap's copy may be stale).
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
# And the host's names: torchrun's --standalone rendezvous resolves "localhost" and this host's
# own name (unresolved, its agent retries until the test's timeout), which a minbase root
# does not list.
cp -L /etc/hosts "$ROOT/etc/hosts" 2>/dev/null || true
grep -qw localhost "$ROOT/etc/hosts" 2>/dev/null || printf '127.0.0.1 localhost\n' >>"$ROOT/etc/hosts"
grep -qw "$(hostname)" "$ROOT/etc/hosts" || printf '127.0.1.1 %s\n' "$(hostname)" >>"$ROOT/etc/hosts"

in_root() {
  chroot "$ROOT" env -i PATH=/opt/wc-venv/bin:/usr/bin:/bin HOME=/root TMPDIR=/tmp LANG=C.UTF-8 "$@"
}

# torch (`weightcast.load` needs it) at /opt/torch-site, which the fresh venv below sees through
# a .pth file: kept apart so that the wheel's own venv is new on every run while torch is not
# installed again. First choice: PyPI's CPU wheel from download.pytorch.org with safetensors,
# installed once into the root (timed). Where that index cannot be reached, a local Python's
# site-packages that has torch and safetensors for the root's Python version
# ($WEIGHTCAST_WHEEL_TORCH_SITE, else the project venv's: build/py-venv, $WEIGHTCAST_VENV),
# bound read-only: torch is then the host's wheel, still nothing of the build.
torch=${WEIGHTCAST_WHEEL_TORCH:-1}
torch_from=""
root_pyver=$(chroot "$ROOT" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$torch" != 0 ] && [ -e "$ROOT/opt/torch-site/.complete" ]; then
  torch_from="the CPU wheel installed into the root before"
elif [ "$torch" != 0 ]; then
  say "installing torch (CPU wheel, download.pytorch.org) and safetensors into the root (once)"
  t0=$(date +%s)
  rm -rf "$ROOT/opt/torch-site" "$ROOT/opt/pip-venv"
  in_root python3 -m venv /opt/pip-venv
  if in_root /opt/pip-venv/bin/pip install --quiet --disable-pip-version-check --retries 1 \
       --timeout 30 --target /opt/torch-site --index-url https://download.pytorch.org/whl/cpu torch \
       >"$ROOT.torch.log" 2>&1 &&
     in_root /opt/pip-venv/bin/pip install --quiet --disable-pip-version-check \
       --target /opt/torch-site --no-deps safetensors >>"$ROOT.torch.log" 2>&1; then
    touch "$ROOT/opt/torch-site/.complete"
    torch_from="the CPU wheel, installed in $(($(date +%s) - t0)) s ($(du -sh "$ROOT/opt/torch-site" | cut -f1))"
  else
    rm -rf "$ROOT/opt/torch-site"
    say "the CPU wheel did not install ($(tail -1 "$ROOT.torch.log" | cut -c1-120)); looking for a local torch"
    site=${WEIGHTCAST_WHEEL_TORCH_SITE:-}
    if [ -z "$site" ]; then
      for py in "${WEIGHTCAST_VENV:-build/py-venv}/bin/python" build/wheel-venv/bin/python python3; do
        site=$("$py" -c "import sys, os, torch, safetensors.torch
if '%d.%d' % sys.version_info[:2] == '$root_pyver': print(os.path.dirname(os.path.dirname(torch.__file__)))" \
          2>/dev/null) && [ -n "$site" ] && break
        site=""
      done
    fi
    if [ -n "$site" ] && [ -d "$site/torch" ] && [ -d "$site/safetensors" ]; then
      mkdir -p "$ROOT/opt/torch-site"
      mount --bind "$site" "$ROOT/opt/torch-site" && mount -o remount,bind,ro "$ROOT/opt/torch-site"
      mounted=("$ROOT/opt/torch-site" "${mounted[@]}")
      torch_from="the local site-packages $site (read-only)"
    else
      say "no torch for Python $root_pyver: the load step is skipped"
      torch=0
    fi
  fi
fi
[ "$torch" = 0 ] || say "torch: $torch_from"

status=0
fail() { say "FAIL: $*"; status=1; }

rm -rf "$ROOT/opt/wc-venv" "$ROOT/tmp/wheel" "$ROOT/tmp/wc-ckpt"
mkdir -p "$ROOT/tmp/wheel"
cp "$WHEEL" "$ROOT/tmp/wheel/"
in_root python3 -m venv /opt/wc-venv
t0=$(date +%s%N)
in_root pip install --quiet --disable-pip-version-check --no-index "/tmp/wheel/$name" ||
  { fail "pip install of the wheel"; exit 1; }
ms=$((($(date +%s%N) - t0) / 1000000))
say "pip install of the wheel: $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s"

in_root python -c '
import sys, weightcast
assert "torch" not in sys.modules, "import weightcast imported torch"
print("import weightcast:", weightcast.build_info())' || fail "import weightcast"

# What the extension and the CLI load, as the root's dynamic loader resolves it: glibc only
# (libpthread, libdl and librt too where the wheel has a glibc floor below 2.34, which had
# their functions there).
for f in "$(echo "$ROOT"/opt/wc-venv/lib/python3*/site-packages/weightcast)"/{_weightcast*.so,weightcast}; do
  libs=$(in_root ldd "${f#"$ROOT"}" | awk '{print $1}' |
    grep -vE '^(linux-vdso|/lib64/ld-linux|lib(c|m|pthread|dl|rt)\.so)' || true)
  [ -z "$libs" ] || fail "${f##*/} loads more than glibc: $libs"
done
out=$(in_root weightcast --version) || fail "weightcast --version"
say "weightcast --version: $out"
# The console script execs the binary in the package folder, not a copy on PATH.
in_root sh -c 'readlink -f "$(python -c "import weightcast._cli as c; print(c.binary())")"' |
  grep -q '^/opt/wc-venv/lib/python3[.0-9]*/site-packages/weightcast/weightcast$' ||
  fail "the CLI binary is not in the package folder"

in_root weightcast synth /tmp/wc-ckpt --params 2M --shard-size 1MiB >/dev/null ||
  fail "weightcast synth"
in_root weightcast inspect /tmp/wc-ckpt >/dev/null || fail "weightcast inspect"
if out=$(in_root weightcast run --set checkpoint=/tmp/wc-ckpt --json -q); then
  say "weightcast run: $(tail -1 <<<"$out" | cut -c1-160)"
else
  fail "weightcast run"
fi
# launch re-executes its own binary (/proc/self/exe) for each rank: one rank, local processes.
in_root weightcast launch -n 1 --spawner local --set checkpoint=/tmp/wc-ckpt -q >/dev/null ||
  fail "weightcast launch -n 1"
# Several ranks without MPI: transport shm on this node, the ranks started by launch from the
# binary (bit-exact digests on every rank, or a non-zero exit).
out=$(in_root weightcast launch -n 2 --spawner local --set checkpoint=/tmp/wc-ckpt \
  --set transport=shm --set device=host -q 2>&1) || fail "weightcast launch -n 2, transport shm: $out"
grep -q '2 ranks .* bit-exact' <<<"$out" && say "launch -n 2, transport shm: $(grep 'bit-exact' <<<"$out" | cut -c3-80)" ||
  fail "launch -n 2, transport shm: no bit-exact line: $out"
# No MPI in the wheel: transport mpi, as rank 0 of two (torchrun's variables), is refused
# with 69, saying the build has none.
rc=0
msg=$(in_root env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 \
  weightcast run --set checkpoint=/tmp/wc-ckpt --set transport=mpi -q 2>&1) || rc=$?
if [ "$rc" = 69 ] && grep -q 'has no MPI' <<<"$msg"; then :; else
  fail "transport mpi: exit $rc, not 69 'has no MPI': $msg"
fi
# The wheel compiles CUDA in and loads the runtime at run time: on this host (no torch in the
# venv yet, no CUDA library in the root, no GPU) `device: cuda` is refused with 69 naming the
# CUDA runtime, and `device: auto` loads on the host.
rc=0
msg=$(in_root weightcast run --set checkpoint=/tmp/wc-ckpt --set device=cuda -q 2>&1) || rc=$?
if [ "$rc" = 69 ] && grep -qi 'cuda' <<<"$msg"; then
  say "device cuda without a CUDA runtime: 69, $(tail -1 <<<"$msg" | cut -c1-140)"
else
  fail "device cuda without a CUDA runtime: exit $rc, not 69 naming CUDA: $msg"
fi
in_root weightcast run --set checkpoint=/tmp/wc-ckpt --set device=auto -q >/dev/null 2>&1 ||
  fail "device auto without a CUDA runtime did not load on the host"

if [ "$torch" != 0 ]; then
  echo /opt/torch-site >"$(echo "$ROOT"/opt/wc-venv/lib/python3*/site-packages)/torch-site.pth"
  in_root python -c '
import torch, weightcast, safetensors.torch, glob
assert weightcast.__file__.startswith("/opt/wc-venv/"), weightcast.__file__
got = weightcast.load("/tmp/wc-ckpt")
want = {}
for f in sorted(glob.glob("/tmp/wc-ckpt/*.safetensors")):
    want.update(safetensors.torch.load_file(f))
assert set(got) == set(want), "the tensor names differ"
for k, v in want.items():
    g = got[k]
    assert g.dtype == v.dtype and g.shape == v.shape, k
    # Bytes, not values: NaN payloads and -0.0 must survive too.
    assert torch.equal(g.reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)), k
print(f"weightcast.load: {len(got)} tensors bit-exact against safetensors (torch {torch.__version__})")
# An error is a C++ exception, unwound inside the extension by its static libgcc (which finds
# the unwind tables through weightcastGlibcFloor.cpp where the wheel has a glibc floor), then
# raised here.
try:
    weightcast.load("/tmp/wc-absent")
except weightcast.MissingInputError as e:
    print(f"weightcast.load of a missing path: MissingInputError: {e}")
else:
    raise AssertionError("weightcast.load of a missing path raised nothing")
' || fail "weightcast.load against safetensors"
else
  say "weightcast.load skipped (WEIGHTCAST_WHEEL_TORCH=0: no torch in the root)"
fi

# The Python suite (tests/python) against the installed wheel: its one-process tests and the
# multi-rank ones that need no MPI (torch.multiprocessing and torchrun worlds over shm and
# tcp); those that need mpirun skip, saying so, since the wheel has no MPI. The suite needs
# torch, transformers, accelerate, safetensors, numpy and pytest: the project venv's
# site-packages (scripts/test_python.sh makes it; $WEIGHTCAST_WHEEL_TEST_SITE overrides),
# bound read-only and seen through a .pth after the fresh venv's own site-packages, so
# `import weightcast` is the wheel's (checked). The tests and the corpus are the checkout's
# tracked files, copied in, and ../shared bound read-only beside them.
# WEIGHTCAST_WHEEL_PYTEST=0 skips this step, =1 makes a missing test site an error.
pytest_mode=${WEIGHTCAST_WHEEL_PYTEST:-auto}
if [ "$pytest_mode" != 0 ]; then
  tsite=${WEIGHTCAST_WHEEL_TEST_SITE:-}
  if [ -z "$tsite" ]; then
    tpy=${WEIGHTCAST_VENV:-build/py-venv}/bin/python
    tsite=$("$tpy" -c "import sys, os, torch, transformers, accelerate, safetensors, numpy, pytest
if '%d.%d' % sys.version_info[:2] == '$root_pyver': print(os.path.dirname(os.path.dirname(torch.__file__)))" \
      2>/dev/null) || tsite=""
  fi
  if [ -z "$tsite" ] || [ ! -d "$tsite/torch" ] || ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    msg="no site-packages with torch, transformers, accelerate and pytest for Python $root_pyver (or not a git checkout)"
    if [ "$pytest_mode" = 1 ]; then fail "the Python suite: $msg"; else say "the Python suite skipped: $msg"; fi
  else
    rm -rf "$ROOT/opt/wc-test-venv" "$ROOT/opt/wc-src"
    mkdir -p "$ROOT/opt/test-site" "$ROOT/opt/wc-src" "$ROOT/opt/shared"
    mountpoint -q "$ROOT/opt/test-site" || {
      mount --bind "$tsite" "$ROOT/opt/test-site" && mount -o remount,bind,ro "$ROOT/opt/test-site"
      mounted=("$ROOT/opt/test-site" "${mounted[@]}"); }
    if [ -d ../shared ] && ! mountpoint -q "$ROOT/opt/shared"; then
      mount --bind ../shared "$ROOT/opt/shared" && mount -o remount,bind,ro "$ROOT/opt/shared"
      mounted=("$ROOT/opt/shared" "${mounted[@]}")
    fi
    git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$ROOT/opt/wc-src"
    in_root python3 -m venv /opt/wc-test-venv
    in_root /opt/wc-test-venv/bin/pip install --quiet --disable-pip-version-check --no-index \
      "/tmp/wheel/$name" || fail "pip install of the wheel into the test venv"
    echo /opt/test-site >"$(echo "$ROOT"/opt/wc-test-venv/lib/python3*/site-packages)/test-site.pth"
    in_test() {
      chroot "$ROOT" env -i PATH=/opt/wc-test-venv/bin:/usr/bin:/bin HOME=/root TMPDIR=/tmp \
        LANG=C.UTF-8 OMP_NUM_THREADS=1 ${WEIGHTCAST_REQUIRE_CORPUS:+WEIGHTCAST_REQUIRE_CORPUS=1} "$@"
    }
    in_test python -c '
import weightcast
assert weightcast.__file__.startswith("/opt/wc-test-venv/"), weightcast.__file__' ||
      fail "the test venv imports a weightcast that is not the wheel's"
    say "the Python suite against the wheel (site-packages of $tsite, read-only)"
    t0=$(date +%s)
    if in_test sh -c 'cd /opt/wc-src/tests/python && exec timeout 1800 python -m pytest -q \
         -p no:cacheprovider -rs . ' >"$ROOT.pytest.log" 2>&1; then
      say "the Python suite: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$ROOT.pytest.log" | tail -1) ($(($(date +%s) - t0)) s)"
    else
      tail -60 "$ROOT.pytest.log"
      fail "the Python suite against the wheel (log: $ROOT.pytest.log)"
    fi
  fi
fi

say "$( ((status == 0)) && echo passed || echo FAILED); $(($(date +%s) - START)) s in all"
exit "$status"
