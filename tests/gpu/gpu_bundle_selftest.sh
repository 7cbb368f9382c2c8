#!/usr/bin/env bash
# Proves the GPU bundle is self-contained, without a GPU: runs tests/gpu/gpu_check.sh from it in
# a minimal Debian root that has none of the build's packages (no compiler, no -dev packages,
# no fmt/spdlog/yaml-cpp/liburing/Boost/Open MPI), as a bare GPU host would, and checks that
# the wheel installs into a venv there, its console script loads the CUDA runtime from the
# nvidia wheels' folder it passes the CLI, every step that needs no GPU passes and every GPU
# step is skipped with its reason.
#
# Usage: bash tests/gpu/gpu_bundle_selftest.sh [BUNDLE_DIR]     (default out/gpu-bundle)
#   Packs the bundle first (tests/gpu/gpu_bundle.sh: builds ./build, incremental, and takes
#   or builds the abi3 wheel).
#   The root: $WEIGHTCAST_SELFTEST_ROOT (default out/gpu-selftest-root, git-ignored), made
#   with `debootstrap --variant=minbase --include=python3,python3-venv stable` when missing
#   (about 4 minutes; needs root and Debian's mirror) and reused after.
#   What the GPU host brings and the root lacks, the CUDA runtime (libcudart.so.13) and NCCL
#   (libnccl.so.2), come from PyPI's nvidia-cuda-runtime and nvidia-nccl-cu13 wheels (torch's
#   own dependencies), installed into the root's site-packages where torch's would be; a
#   local Python that already has them (torch's wheels) is used instead of a download. torch
#   itself is not installed in the root (a CUDA torch wheel and its nvidia dependencies are
#   several GB): the Python rows skip, saying so.
# Exit status: 0 when the check passes; 1 when a step failed or a GPU step did not skip.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUNDLE=${1:-out/gpu-bundle}
ROOT=${WEIGHTCAST_SELFTEST_ROOT:-out/gpu-selftest-root}
START=$(date +%s)
PARAMS=${WEIGHTCAST_SELFTEST_PARAMS:-50M}
say() { printf 'gpu_bundle_selftest [%4s s]: %s\n' "$(($(date +%s) - START))" "$*"; }

# Packed again every time (seconds when the build is up to date): a stale bundle would test
# old scripts. WEIGHTCAST_SELFTEST_REPACK=0 tests BUNDLE_DIR as it is.
if [ "${WEIGHTCAST_SELFTEST_REPACK:-1}" != 0 ] || [ ! -x "$BUNDLE/bin/weightcast_tests" ]; then
  say "packing the bundle (tests/gpu/gpu_bundle.sh $BUNDLE)"
  mkdir -p "$(dirname "$BUNDLE")"  # out/ is absent in a fresh clone
  bash tests/gpu/gpu_bundle.sh "$BUNDLE" >"${BUNDLE%/}.pack.log" 2>&1 || { tail -30 "${BUNDLE%/}.pack.log"; exit 1; }
  say "packed: $(grep '^size:' "$BUNDLE/BUNDLE.txt")"
fi

# A root made before the check installed a wheel has no python3-venv: made again.
if [ ! -e "$ROOT/.weightcast-selftest-root" ] || ! ls -d "$ROOT"/usr/lib/python3*/ensurepip >/dev/null 2>&1; then
  say "making the minimal root $ROOT (debootstrap minbase, Debian stable, python3, python3-venv)"
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
  rm -rf "$ROOT"
  debootstrap --variant=minbase --include=python3,python3-venv stable "$ROOT" http://deb.debian.org/debian \
    >"$ROOT.log" 2>&1 || { tail -20 "$ROOT.log"; exit 1; }
  touch "$ROOT/.weightcast-selftest-root"
fi
say "root: $(. "$ROOT/etc/os-release"; echo "$PRETTY_NAME"), $(chroot "$ROOT" python3 --version)"

# None of the build's packages: no compiler, no headers, none of the libraries the bundle
# carries. A root that has any of them proves nothing.
for path in usr/bin/c++ usr/bin/g++ usr/bin/cmake usr/include/boost usr/include/fmt \
  usr/include/liburing.h; do
  [ -e "$ROOT/$path" ] && { say "the root has /$path: not a bare host"; exit 1; }
done
for lib in "$BUNDLE"/lib/*.so*; do
  name=${lib##*/}
  if ls "$ROOT"/usr/lib/x86_64-linux-gnu/"$name" >/dev/null 2>&1; then
    say "note: the root has its own $name (bundled too; the bundle's RPATH takes precedence)"
  fi
done

# The GPU host's CUDA runtime and NCCL, where torch's wheels put them.
SITE=$ROOT/usr/local/lib/python3/dist-packages
pyver=$(chroot "$ROOT" python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
SITE=$ROOT/usr/local/lib/python$pyver/dist-packages
if [ ! -e "$SITE/nvidia/nccl/lib/libnccl.so.2" ] || [ ! -e "$SITE/nvidia/cu13/lib/libcudart.so.13" ]; then
  mkdir -p "$SITE/nvidia/nccl/lib" "$SITE/nvidia/cu13/lib"
  venv_py=$(realpath -m "${WEIGHTCAST_VENV:-build/py-venv}")/bin/python
  local_site=$(for py in python3 "$venv_py"; do
    "$py" -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null; done |
    while read -r d; do [ -e "$d/nvidia/nccl/lib/libnccl.so.2" ] && [ -e "$d/nvidia/cu13/lib/libcudart.so.13" ] && echo "$d"; done | head -1)
  if [ -n "$local_site" ]; then
    say "the host's libnccl.so.2 and libcudart.so.13 from $local_site (torch's nvidia wheels)"
    cp -L "$local_site/nvidia/nccl/lib/libnccl.so.2" "$SITE/nvidia/nccl/lib/"
    cp -L "$local_site/nvidia/cu13/lib/libcudart.so.13" "$SITE/nvidia/cu13/lib/"
  else
    say "downloading nvidia-nccl-cu13 and nvidia-cuda-runtime (13) from PyPI"
    wheels=$(mktemp -d)
    # pip: the project's venv's, else a throwaway venv's (Debian's python3 has no pip).
    pip_py=$venv_py
    if ! "$pip_py" -m pip --version >/dev/null 2>&1; then
      python3 -m venv "$wheels/venv" && pip_py=$wheels/venv/bin/python
    fi
    "$pip_py" -m pip download -q --no-deps -d "$wheels" nvidia-nccl-cu13 'nvidia-cuda-runtime>=13,<14'
    for w in "$wheels"/*.whl; do python3 -m zipfile -e "$w" "$SITE"; done
    rm -rf "$wheels"
  fi
fi

say "copying the bundle ($(du -sh "$BUNDLE" | cut -f1)) into the root"
rm -rf "$ROOT/bundle" "$ROOT/out"
cp -a "$BUNDLE" "$ROOT/bundle"
mkdir -p "$ROOT/out" "$ROOT/tmp"
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

status=0
say "running tests/gpu/gpu_check.sh from the bundle inside the root"
check_status=0
# A small checkpoint: this checks that the bundle runs, not how fast (no GPU here anyway).
rm -rf "$ROOT/tmp/weightcast-gpu-check"
chroot "$ROOT" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root TMPDIR=/tmp LANG=C.UTF-8 \
  WEIGHTCAST_GPU_CHECK_PARAMS="$PARAMS" bash /bundle/tests/gpu/gpu_check.sh /out || check_status=$?
cp "$ROOT/out/table.md" "$ROOT.table.md" 2>/dev/null || true

# Every row: CPU rows pass, GPU rows skip with a reason; nothing fails or times out.
results=$ROOT/out/results.tsv
[ -s "$results" ] || { say "FAIL: gpu_check.sh wrote no results"; exit 1; }
if awk -F'\t' '$2 == "fail" || $2 == "timeout" {bad = 1; print "  failed: " $1 ": " $5} END {exit bad}' "$results"; then :; else status=1; fi
row_of() { awk -F'\t' -v row="$1" '$1 == row' "$results"; }
# The host digests need no GPU: the host load, and every digest recomputed from the files
# with the bundle's libxxhash under the root's python3 (gpu_check_digests.py).
for row in "wheel installed" "[gpu] tests" "synth $PARAMS" "host digests from the files"; do
  if [ "$(row_of "$row" | cut -f2)" != pass ]; then
    say "FAIL: '$row' did not pass: $(row_of "$row")"
    status=1
  fi
done
# The venv's console script passed the nvidia wheels' folder to the CLI, which loaded the
# CUDA runtime from it (the root has no other).
if ! row_of "wheel installed" | grep -q "dist-packages/nvidia/cu13/lib/libcudart.so.13"; then
  say "FAIL: the console script's CLI did not load libcudart.so.13 from the nvidia wheel's folder: $(row_of "wheel installed")"
  status=1
fi
for row in "pinned H2D (h2d_bench)" "weightcast cuda, page cache" "weightcast cuda, O_DIRECT" \
  "nccl broadcast, 2 ranks one GPU" "nccl fsdp send/recv, 2 ranks one GPU" \
  "nccl rank 1 killed mid-load" "python weightcast.load(device=cuda); DCP reader" \
  "python load_into vs load_state_dict(load_file(cuda))" \
  "python load_into(FSDP2) after queued work, 2 ranks one GPU" "python prerequisites"; do
  line=$(row_of "$row")
  if [ "$(cut -f2 <<<"$line")" != skip ] || [ -z "$(cut -f5 <<<"$line")" ]; then
    say "FAIL: GPU step '$row' did not skip with a reason: ${line:-missing}"
    status=1
  fi
done
((check_status == 0)) || { say "FAIL: gpu_check.sh exited $check_status"; status=1; }
say "$( ((status == 0)) && echo "passed" || echo "FAILED"): $(wc -l <"$results") rows, table in $ROOT.table.md; $(($(date +%s) - START)) s in all"
exit "$status"
