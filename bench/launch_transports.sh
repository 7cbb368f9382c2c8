#!/bin/bash
# Whole-process wall time of `weightcast launch -n 3` on host memory, transport mpi against
# tcp, alternating so that both see the same machine load, RUNS runs each (bench/RESULTS.md,
# issue 40). Each run's output (every rank's summary, its load time) goes to OUT/.
# Usage: bench/launch_transports.sh BUILD_DIR CHECKPOINT [RUNS] [OUT]
#   e.g. build/weightcast synth /tmp/wc-100m --params 100M
#        bench/launch_transports.sh build /tmp/wc-100m 3 /tmp/wc-bench
set -euo pipefail
build=${1:?build dir}
checkpoint=${2:?checkpoint}
runs=${3:-3}
out=${4:-/tmp/weightcast-launch-transports}
mkdir -p "$out"
for i in $(seq 1 "$runs"); do
  for transport in mpi tcp; do
    port=$((29700 + RANDOM % 500))
    begin=$(date +%s.%N)
    status=0
    timeout 60 "$build/weightcast" launch -n 3 -q --set "checkpoint=$checkpoint" \
      --set device=host --set "transport=$transport" --set "rendezvous.port=$port" \
      > "$out/$transport-$i.txt" 2>&1 || status=$?
    end=$(date +%s.%N)
    load=$(grep -o 'in [0-9.]* s' "$out/$transport-$i.txt" | awk '{print $2}' | sort -n | tail -1)
    printf '%s run %d: status %d, wall %.3f s, slowest rank load %s s\n' "$transport" "$i" \
      "$status" "$(echo "$end - $begin" | bc)" "${load:-?}"
  done
done
