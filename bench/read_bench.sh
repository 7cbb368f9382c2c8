#!/usr/bin/env bash
# Rank 0's read stage against fio on the same file, and a chunk/ring/queue sweep.
#
#   bench/read_bench.sh [compare|dd|sweep|all] [FILE]
#
# compare: fio (io_uring engine with registered buffers and files, block size = chunk_size,
#          iodepth = io_depth) and
#          `weightcast run --set destination=discard` (read stage + XXH3 of every tensor,
#          nothing kept) on the same file, alternating, REPS times each, in two modes:
#            buffered/warm: the file is read once first, both read it from the page cache;
#            direct/cold:   the file's pages are dropped (posix_fadvise DONTNEED) before every
#                           run, both read with O_DIRECT.
#          Prints GB/s (1 GB = 1e9 B) of each run, the medians and the ratio weightcast/fio.
# dd:      buffered, warm page cache: `dd bs=CHUNK of=/dev/null` (one read() at a time into
#          one buffer, the plain-read floor) against `weightcast run --set destination=discard`
#          with `verify=none` (the read stage alone) and with `verify=digest` (reads + XXH3 of
#          every tensor), alternating who goes first, REPS rounds; GB/s of each, the ratios to
#          dd of the same round, and the range over rounds.
# sweep:   weightcast alone over chunk_size {1,4,16,64} MiB x buffer_depth {2,4,8} x
#          io_depth {1,4,16}, both modes, one run each, as a table.
#
# FILE defaults to a single-file 1B-parameter synthetic checkpoint (~2 GB) written to
# $BENCH_DIR (default /tmp/weightcast-read-bench).
#
# LOOP=1 (root): copies FILE onto an ext4 filesystem on a loop device whose backing file
# lives in /dev/shm, and benches that copy. The "disk" is then memory behind the block
# layer: O_DIRECT reads go through the loop driver and nothing is cached outside the guest,
# so who reads first no longer matters (on a VM, a virtual disk is cached by the host,
# which the guest's DONTNEED cannot drop). It measures the software path of each reader,
# not a disk; the mount and loop device are removed on exit.
#
# Environment: WEIGHTCAST (the launcher, default build/weightcast), REPS (default 3), CHUNK
# (default 16MiB), BUFFER_DEPTH (4), IO_DEPTH (4), MODES (compare's modes, default
# "buffered direct"), LOOP (above).
set -euo pipefail

what=${1:-all}
here=$(cd "$(dirname "$0")/.." && pwd)
weightcast=${WEIGHTCAST:-$here/build/weightcast}
reps=${REPS:-3}
chunk=${CHUNK:-16MiB}
buffer_depth=${BUFFER_DEPTH:-4}
io_depth=${IO_DEPTH:-4}
bench_dir=${BENCH_DIR:-/tmp/weightcast-read-bench}
modes=${MODES:-buffered direct}

command -v fio >/dev/null || { echo "read_bench: fio not found (bash scripts/install-deps.sh)" >&2; exit 69; }
[ -x "$weightcast" ] || { echo "read_bench: $weightcast not built (cmake --build build)" >&2; exit 66; }

file=${2:-}
if [ -z "$file" ]; then
  file=$bench_dir/model.safetensors
  if [ ! -f "$file" ]; then
    mkdir -p "$bench_dir"
    "$weightcast" synth "$bench_dir" --params 1B --shard-size 64GiB --seed 1 >/dev/null
  fi
fi

if [ "${LOOP:-0}" = 1 ]; then
  [ "$(id -u)" -eq 0 ] || { echo "read_bench: LOOP=1 needs root (losetup, mount)" >&2; exit 77; }
  loop_image=$(mktemp /dev/shm/weightcast-read-bench-loop.XXXXXX)
  loop_mount=$(mktemp -d /tmp/weightcast-read-bench-mnt.XXXXXX)
  loop_device=""
  cleanup_loop() {
    # A reader started by a process substitution may still hold the file for a moment.
    for _ in 1 2 3 4 5 6 7 8 9 10; do umount "$loop_mount" 2>/dev/null && break; sleep 0.5; done
    if mountpoint -q "$loop_mount"; then
      echo "read_bench: $loop_mount is still busy: umount it and losetup -d $loop_device" >&2
      return
    fi
    if [ -n "$loop_device" ]; then losetup -d "$loop_device"; fi
    rm -f "$loop_image"
    rmdir "$loop_mount"
  }
  trap cleanup_loop EXIT
  # Room for the file plus ext4's own metadata (about 5%).
  truncate -s $(( ($(stat -c %s "$file") * 11 / 10 + (64 << 20)) / 4096 * 4096 )) "$loop_image"
  mkfs.ext4 -q -F "$loop_image"
  loop_device=$(losetup --find --show "$loop_image")
  mount "$loop_device" "$loop_mount"
  cp "$file" "$loop_mount/"
  sync
  file=$loop_mount/$(basename "$file")
fi
file_bytes=$(stat -c %s "$file")

bytes_of() {  # 16MiB -> 16777216
  python3 -c "import sys,re; m=re.fullmatch(r'(\d+)(KiB|MiB|GiB)?', sys.argv[1]); \
print(int(m[1]) * {None:1,'KiB':1<<10,'MiB':1<<20,'GiB':1<<30}[m[2]])" "$1"
}

evict() {  # drop the file's pages: the next read comes from the disk
  python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fdatasync(fd); \
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)" "$file"
}

warm() { cat "$file" >/dev/null; }

# fio GB/s: whole file, sequential, one job. --invalidate=0: fio's default (1) drops the
# file's pages before the job, which would make the "warm" run read from the disk.
# --fixedbufs --registerfiles: like for like, weightcast registers its slots and shard fds
# (without them fio pins each O_DIRECT buffer per read: about half the throughput here).
fio_gbps() {  # direct(0|1) chunk io_depth
  fio --name=read --filename="$file" --readonly --invalidate=0 --rw=read --ioengine=io_uring \
      --fixedbufs --registerfiles \
      --direct="$1" --bs="$(bytes_of "$2")" --iodepth="$3" --size="$file_bytes" \
      --numjobs=1 --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['read']; \
print(f\"{j['io_bytes'] / (j['runtime'] / 1e3) / 1e9:.3f}\")"
}

# dd GB/s: the whole file, buffered, one read() of CHUNK bytes at a time into one buffer.
dd_gbps() {  # chunk
  dd if="$file" of=/dev/null bs="$(bytes_of "$1")" 2>&1 |
    python3 -c "import re,sys; m=re.search(r'^(\d+) bytes.* copied, ([0-9.e+-]+) s', sys.stdin.read(), re.M); \
print(f\"{int(m[1]) / float(m[2]) / 1e9:.3f}\")"
}

# weightcast GB/s: tensor bytes / pipeline seconds, destination discard; and peak RSS (MiB).
weightcast_gbps() {  # direct_io(on|off) chunk buffer_depth io_depth [verify]
  "$weightcast" run --json --quiet --set checkpoint="$file" --set destination=discard \
      --set direct_io="$1" --set chunk_size="$2" --set buffer_depth="$3" --set io_depth="$4" \
      --set verify="${5:-digest}" |
    python3 -c "import json,sys; j=json.loads(sys.stdin.read().strip().splitlines()[-1]); \
print(f\"{j['gbps']:.3f} {j['peak_rss_bytes'] / 2**20:.0f} {j['io_mode']}\")"
}

median() { python3 -c "import statistics,sys; print(f'{statistics.median(map(float, sys.argv[1:])):.3f}')" "$@"; }

machine() {
  echo "# machine: $(nproc) CPUs, kernel $(uname -r), $(free -g | awk '/Mem:/ {print $2}') GiB RAM"
  echo "# file: $file ($file_bytes B) on $(stat -f -c %T "$file") ($(df -h "$file" | awk 'NR==2 {print $1}'))"
}

compare() {
  machine
  echo "# compare: chunk_size=$chunk buffer_depth=$buffer_depth io_depth=$io_depth, $reps reps"
  printf '%-14s %4s %10s %14s %8s %9s\n' mode rep fio_GB/s weightcast_GB/s ratio rss_MiB
  for mode in $modes; do
    local f=() w=()
    [ "$mode" = buffered ] && warm
    for ((r = 1; r <= reps; r++)); do
      # Who goes first alternates: on a VM the host's own cache can favour the second reader
      # of a cold file, whatever the guest dropped.
      for who in $( ((r % 2)) && echo "fio wc" || echo "wc fio"); do
        if [ "$mode" = buffered ]; then
          if [ "$who" = fio ]; then fg=$(fio_gbps 0 "$chunk" "$io_depth")
          else read -r wg rss io < <(weightcast_gbps off "$chunk" "$buffer_depth" "$io_depth"); fi
        else
          evict
          if [ "$who" = fio ]; then fg=$(fio_gbps 1 "$chunk" "$io_depth")
          else read -r wg rss io < <(weightcast_gbps on "$chunk" "$buffer_depth" "$io_depth"); fi
        fi
      done
      f+=("$fg"); w+=("$wg")
      printf '%-14s %4d %10s %14s %8.3f %9s\n' "$mode" "$r" "$fg" "$wg" \
        "$(python3 -c "print($wg / $fg)")" "$rss"
    done
    mf=$(median "${f[@]}"); mw=$(median "${w[@]}")
    printf '%-14s %4s %10s %14s %8.3f\n' "$mode" median "$mf" "$mw" "$(python3 -c "print($mw / $mf)")"
  done
}

versus_dd() {
  machine
  echo "# dd: buffered, warm; chunk_size=$chunk buffer_depth=$buffer_depth io_depth=$io_depth," \
       "$reps rounds, load $(cut -d' ' -f1-3 /proc/loadavg)"
  printf '%4s %8s %10s %12s %8s %12s %8s %8s\n' round dd_GB/s none_GB/s none/dd digest_GB/s \
    digest/dd rss_MiB reader
  warm
  local rn=() rd=()
  for ((r = 1; r <= reps; r++)); do
    local order="dd none digest"
    ((r % 2)) || order="digest none dd"
    for who in $order; do
      case $who in
        dd) d=$(dd_gbps "$chunk") ;;
        none) read -r n rss io < <(weightcast_gbps off "$chunk" "$buffer_depth" "$io_depth" none) ;;
        digest) read -r g _ _ < <(weightcast_gbps off "$chunk" "$buffer_depth" "$io_depth" digest) ;;
      esac
    done
    rn+=("$(python3 -c "print($n / $d)")"); rd+=("$(python3 -c "print($g / $d)")")
    printf '%4d %8s %10s %12.3f %12s %8.3f %8s %8s\n' "$r" "$d" "$n" "${rn[-1]}" "$g" "${rd[-1]}" \
      "$rss" "$io"
  done
  python3 - "${rn[*]}" "${rd[*]}" <<'PY'
import statistics, sys
none, digest = (list(map(float, a.split())) for a in sys.argv[1:3])
print(f"# none/dd:   median {statistics.median(none):.3f}, range {min(none):.3f}-{max(none):.3f}")
print(f"# digest/dd: median {statistics.median(digest):.3f}, range {min(digest):.3f}-{max(digest):.3f}")
PY
}

sweep() {
  machine
  echo "# sweep: weightcast run --set destination=discard, one run per cell"
  printf '%-9s %6s %6s %10s %9s %10s %9s\n' chunk depth io_dep warm_GB/s warm_rss cold_GB/s cold_rss
  for c in 1MiB 4MiB 16MiB 64MiB; do
    for d in 2 4 8; do
      for q in 1 4 16; do
        warm; read -r bg brss _ < <(weightcast_gbps off "$c" "$d" "$q")
        evict; read -r dg drss _ < <(weightcast_gbps on "$c" "$d" "$q")
        printf '%-9s %6s %6s %10s %9s %10s %9s\n' "$c" "$d" "$q" "$bg" "$brss" "$dg" "$drss"
      done
    done
  done
}

case $what in
  compare) compare ;;
  sweep) sweep ;;
  dd) versus_dd ;;
  all) compare; sweep ;;
  *) echo "usage: $0 [compare|dd|sweep|all] [FILE]" >&2; exit 64 ;;
esac
