#!/usr/bin/env bash
# Placement: 3 ranks under mpirun on the same checkpoint, `placement: replicate` against
# `placement: fsdp`, side by side in one run (alternating, ROUNDS times each): wall time of
# each job and every rank's peak RSS (from its --report), and the ratios.
#
#   bench/placement_bench.sh [BUILD_DIR] [PARAMS]
#   env: BENCH_DIR (where the checkpoint goes; /dev/shm), ROUNDS (3), CHUNK_SIZE (16MiB),
#        RANKS (3)
#
# Done-when (issue 18): fsdp's peak RSS per rank <= its share of the model + 160 MiB, and fsdp
# no slower than replicate in the same run.
set -euo pipefail
build=${1:-build}
params=${2:-400M}
bench_dir=${BENCH_DIR:-/dev/shm}
rounds=${ROUNDS:-3}
chunk=${CHUNK_SIZE:-16MiB}
ranks=${RANKS:-3}
cli="$build/tools/weightcast"
[ -x "$cli" ] || cli="$build/weightcast"

dir="$bench_dir/weightcast-placement-$params"
if [ ! -d "$dir" ]; then "$cli" synth "$dir" --params "$params" >/dev/null; fi
model_bytes=$(du -sb "$dir" | cut -f1)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

mpirun_args=(--oversubscribe -np "$ranks")
if [ "$(id -u)" -eq 0 ]; then mpirun_args+=(--allow-run-as-root); fi

echo "# $(uname -n): $(nproc) cores; $ranks ranks; checkpoint: weightcast synth --params $params ($model_bytes B); chunk $chunk"
echo "# command: mpirun ${mpirun_args[*]} $cli run --set checkpoint=$dir --set device=host --set transport=mpi --set chunk_size=$chunk --set placement=MODE --report R --quiet"
printf '%-10s %5s %9s' mode round seconds
for ((r = 0; r < ranks; r++)); do printf ' %14s' "rank$r-rss(MiB)"; done
echo
# A port free now (the kernel's pick for port 0) for each job, not a fixed range.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
declare -A total_s
for ((round = 1; round <= rounds; round++)); do
  for mode in replicate fsdp; do
    port=$(free_port)
    begin=$(date +%s.%N)
    mpirun "${mpirun_args[@]}" "$cli" run --set "checkpoint=$dir" --set device=host \
      --set transport=mpi --set "chunk_size=$chunk" --set "placement=$mode" \
      --set "rendezvous.port=$port" --report "$out/$mode.{rank}.json" --quiet >/dev/null
    end=$(date +%s.%N)
    seconds=$(echo "$end - $begin" | bc -l)
    total_s[$mode]=$(echo "${total_s[$mode]:-0} + $seconds" | bc -l)
    printf '%-10s %5d %9.3f' "$mode" "$round" "$seconds"
    for ((r = 0; r < ranks; r++)); do
      rss=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['peak_rss_bytes'])" "$out/$mode.$r.json")
      printf ' %14.1f' "$(echo "$rss / 1048576" | bc -l)"
    done
    echo
  done
done
share=$(echo "$model_bytes / $ranks / 1048576" | bc -l)
printf '# model share per rank: %.1f MiB (bound: share + 160 MiB = %.1f MiB)\n' "$share" "$(echo "$share + 160" | bc -l)"
printf '# time fsdp / replicate (sum of %d rounds): %.3f\n' "$rounds" "$(echo "${total_s[fsdp]} / ${total_s[replicate]}" | bc -l)"
