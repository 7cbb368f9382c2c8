#!/usr/bin/env bash
# Two weightcast builds against dd on one warm file, side by side, in alternating rounds.
#
#   OLD=path/to/weightcast NEW=path/to/weightcast [ROUNDS=8] bench/read_ab.sh FILE
#
# Each round runs `dd if=FILE of=/dev/null bs=8M` and, with each build, `weightcast run
# --set destination=discard --set direct_io=off --set chunk_size=8MiB` with verify=none and
# verify=digest, in an order rotated and reversed round by round. Each run prints
# `round who GB/s wall_s user_s sys_s load1` (GB/s: dd's own figure, weightcast's pipeline
# GB/s; the seconds: GNU time of the whole process). Take ratios within a round.
set -euo pipefail
rounds=${ROUNDS:-8}; file=$1
old=${OLD:?OLD=path of the first weightcast}; new=${NEW:?NEW=path of the second weightcast}
timing=$(mktemp); trap 'rm -f "$timing"' EXIT
cat "$file" >/dev/null
wc() {  # bin verify
  /usr/bin/time -f '%e %U %S' -o "$timing" "$1" run --json --quiet --set checkpoint="$file" \
    --set destination=discard --set direct_io=off --set chunk_size=8MiB --set verify="$2" |
    tail -1 | python3 -c "import json,sys; print(f\"{json.load(sys.stdin)['gbps']:.3f}\")"
}
dd_() {
  /usr/bin/time -f '%e %U %S' -o "$timing" dd if="$file" of=/dev/null bs=8M 2>&1 |
    python3 -c "import re,sys; m=re.search(r'^(\d+) bytes.* copied, ([0-9.e+-]+) s', sys.stdin.read(), re.M); print(f'{int(m[1]) / float(m[2]) / 1e9:.3f}')"
}
runs=(dd old_none new_none old_digest new_digest)
for ((r = 1; r <= rounds; r++)); do
  k=$(( (r - 1) % ${#runs[@]} )); order=("${runs[@]:k}" "${runs[@]:0:k}")
  ((r % 2)) || mapfile -t order < <(printf '%s\n' "${order[@]}" | tac)
  for who in "${order[@]}"; do
    case $who in
      dd) g=$(dd_) ;;
      old_none) g=$(wc "$old" none) ;; new_none) g=$(wc "$new" none) ;;
      old_digest) g=$(wc "$old" digest) ;; new_digest) g=$(wc "$new" digest) ;;
    esac
    echo "$r $who $g $(cat "$timing") $(cut -d' ' -f1 /proc/loadavg)"
  done
done
