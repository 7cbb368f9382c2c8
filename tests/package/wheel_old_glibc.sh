#!/usr/bin/env bash
# Runs the wheel's CLI on a glibc older than the build host's, for real: in a root that holds
# nothing but one Debian release's libc6 package (its libc, libpthread, libdl, librt, libm and
# dynamic loader) and the `weightcast` binary from the wheel. scripts/wheel.sh checks the
# symbol versions the binaries reference against the floor (manylinux_2_28); this shows that
# the binary links, starts (its constructors run: glibc < 2.34 starts a program differently),
# loads a checkpoint on one and two ranks, and unwinds a C++ exception (libgcc's unwinder
# finds its tables through weightcastGlibcFloor.cpp's _dl_find_object there) to its exit
# status, under that glibc.
#
# Usage: bash tests/package/wheel_old_glibc.sh WHEEL [SUITE]
# SUITE: a Debian release on deb.debian.org (default bullseye, glibc 2.31, the oldest there:
# buster's 2.28 is on archive.debian.org only). Needs root (chroot, mounts) and that mirror the
# first time; the root is cached in $WEIGHTCAST_OLD_GLIBC_ROOT (default
# build/old-glibc-root-SUITE). About 10 s with the root cached.
# Exit status: 0 when every step passed, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEEL=${1:?usage: wheel_old_glibc.sh WHEEL [SUITE]}
suite=${2:-bullseye}
mirror=${WEIGHTCAST_DEBIAN_MIRROR:-http://deb.debian.org/debian}
ROOT=${WEIGHTCAST_OLD_GLIBC_ROOT:-build/old-glibc-root-$suite}
say() { printf 'wheel_old_glibc: %s\n' "$*"; }

if [ ! -e "$ROOT/.complete" ]; then
  say "making $ROOT: libc6 of Debian $suite"
  rm -rf "$ROOT" "$ROOT.dl"
  mkdir -p "$ROOT.dl"
  curl -fsS --retry 2 -o "$ROOT.dl/Packages.xz" "$mirror/dists/$suite/main/binary-amd64/Packages.xz"
  read -r version deb < <(xz -dc "$ROOT.dl/Packages.xz" |
    awk '/^Package: / {p = ($2 == "libc6")} p && /^Version:/ {v = $2} p && /^Filename:/ {print v, $2}')
  [ -n "${deb:-}" ] || { say "no libc6 in $suite's index"; exit 1; }
  curl -fsS --retry 2 -o "$ROOT.dl/libc6.deb" "$mirror/$deb"
  dpkg-deb -x "$ROOT.dl/libc6.deb" "$ROOT"
  mkdir -p "$ROOT"/{proc,dev,tmp,bin}
  chmod 1777 "$ROOT/tmp"
  rm -rf "$ROOT.dl"
  echo "$version" >"$ROOT/.complete"
fi
glibc=$(cat "$ROOT/.complete")
say "root: $ROOT, glibc ${glibc:-?} alone"

rm -rf "$ROOT/bin/weightcast" "$ROOT/tmp/ckpt"
unzip -q -p "$WHEEL" weightcast/weightcast >"$ROOT/bin/weightcast"
chmod 755 "$ROOT/bin/weightcast"

mounted=()
cleanup() {
  local m
  for m in "${mounted[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
}
trap cleanup EXIT
# /proc: `launch` re-executes /proc/self/exe; /dev: /dev/null, /dev/shm for the node ring.
mountpoint -q "$ROOT/proc" || { mount -t proc proc "$ROOT/proc" && mounted+=("$ROOT/proc"); }
mountpoint -q "$ROOT/dev" ||
  { mount --rbind /dev "$ROOT/dev" && mount --make-rslave "$ROOT/dev" && mounted+=("$ROOT/dev"); }

# No env(1) in the root: the environment is cleared outside it.
in_root() { env -i PATH=/bin TMPDIR=/tmp LANG=C "$(command -v chroot)" "$ROOT" "$@"; }
status=0
fail() { say "FAIL: $*"; status=1; }

out=$(in_root weightcast --version 2>&1) && say "weightcast --version: $out" ||
  fail "weightcast --version: $out"
in_root weightcast synth /tmp/ckpt --params 2M --shard-size 1MiB >/dev/null || fail "synth"
in_root weightcast inspect /tmp/ckpt >/dev/null || fail "inspect"
out=$(in_root weightcast run --set checkpoint=/tmp/ckpt --json -q) && say "run: ${out:0:120}" ||
  fail "run"
out=$(in_root weightcast launch -n 2 --spawner local --set checkpoint=/tmp/ckpt \
  --set transport=shm --set device=host -q 2>&1) || fail "launch -n 2, transport shm: $out"
grep -q '2 ranks .* bit-exact' <<<"$out" && say "launch -n 2: $(grep 'bit-exact' <<<"$out" | cut -c1-80)" ||
  fail "launch -n 2: no bit-exact line: $out"
# An error is a C++ exception thrown in the library and caught in main: 66 and its message,
# not std::terminate (134) as where the unwinder cannot find the unwind tables.
rc=0
msg=$(in_root weightcast run --set checkpoint=/tmp/absent -q 2>&1) || rc=$?
if [ "$rc" = 66 ] && grep -q 'no such file' <<<"$msg"; then
  say "a missing checkpoint: exit 66, '$msg'"
else
  fail "a missing checkpoint: exit $rc, not 66 'no such file': $msg"
fi

say "$( ((status == 0)) && echo passed || echo FAILED) (glibc ${glibc:-?})"
exit "$status"
