#!/usr/bin/env bash
# transport shm (the node ring) against mpi on one node: 3 ranks via `weightcast launch`,
# whole-process wall time, alternating, RUNS runs each (docs/DESIGN.md § Staging).
# Usage: bash bench/node_ring.sh CHECKPOINT [RUNS] [EXTRA --set ...], e.g. --set placement=fsdp
set -euo pipefail
ckpt=$1; runs=${2:-3}; shift $(( $# >= 2 ? 2 : 1 ))
bin=${WEIGHTCAST:-build/weightcast}
port=$(( 30000 + RANDOM % 20000 ))
cat "$ckpt"/*.safetensors > /dev/null  # warm the page cache: both read it cached
for i in $(seq 1 "$runs"); do
  for t in mpi shm; do
    port=$((port + 1))
    start=$(date +%s.%N)
    "$bin" launch -n 3 --quiet --set checkpoint="$ckpt" --set device=host \
      --set rendezvous.port=$port --set transport=$t "$@" > /dev/null
    end=$(date +%s.%N)
    printf '%s run %d: %.3f s\n' "$t" "$i" "$(echo "$end - $start" | bc)"
  done
done
