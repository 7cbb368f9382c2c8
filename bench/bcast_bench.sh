#!/usr/bin/env bash
# Host-mode broadcast throughput: the mpi transport (weightcast's whole load pipeline) against
# plain MPI_Bcast of the same bytes with the same chunking, in the same mpirun job.
#
#   bench/bcast_bench.sh [BUILD_DIR] [RANKS] [PARAMS...]
#   env: BENCH_DIR (where the checkpoints go), CHUNK_SIZE (16MiB), ITERATIONS (5),
#        DIRECT_IO (auto|on|off: the loads' direct_io, as in a config; auto)
#
# Writes synthetic checkpoints (weightcast synth) under $BENCH_DIR (default /dev/shm, so
# rank 0's reads come from memory and the broadcast is what is measured) and runs
# build/bcast_bench on each; see bench/RESULTS.md for recorded numbers.
set -euo pipefail
build=${1:-build-mpi}
ranks=${2:-3}
shift $(( $# > 2 ? 2 : $# )) || true
params=("$@")
if ((${#params[@]} == 0)); then params=(64M 256M); fi
bench_dir=${BENCH_DIR:-/dev/shm}
chunk=${CHUNK_SIZE:-16MiB}
iters=${ITERATIONS:-5}
direct_io=${DIRECT_IO:-auto}

mpirun_args=(--oversubscribe -np "$ranks")
if [ "$(id -u)" -eq 0 ]; then mpirun_args+=(--allow-run-as-root); fi

echo "# $(uname -n): $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# $(mpirun --version | head -1); $ranks ranks on one node (shared memory), chunk $chunk, direct_io $direct_io"
if ((ranks > $(nproc))); then
  # Rank 0's read stage needs a core the raw MPI_Bcast loop does not: with fewer cores than
  # ranks the stages take CPU from each other, and the broadcast stage stretches with them.
  echo "# note: $ranks ranks on $(nproc) cores: the load's stages compete for CPU (bench/RESULTS.md)"
fi
for p in "${params[@]}"; do
  dir="$bench_dir/weightcast-bcast-$p"
  if [ ! -d "$dir" ]; then "$build/weightcast" synth "$dir" --params "$p" >/dev/null; fi
  echo "# checkpoint: weightcast synth --params $p"
  mpirun "${mpirun_args[@]}" "$build/bcast_bench" "$dir" "$chunk" "$iters" "$direct_io"
done
