#!/usr/bin/env bash
# The floors beside bench/dcp_bench.sh's table, one process, three rounds alternated: warm `cat`
# of every shard (the page-cache copy), warm weightcast.load of the checkpoint into host memory
# (one process: a fresh arena, faulted in as it lands), and after `echo 3 >
# /proc/sys/vm/drop_caches` (root): `dd iflag=direct bs=16M` of the shards in turn, of the four
# at once, and a cold weightcast.load. Prints one line per round (seconds).
#
# Usage: bash bench/dcp_bench_floors.sh   Env: CKPT (/tmp/wc-llama), PY (build/py-venv/bin/python)
set -e
cd "$(dirname "$0")/.."
CKPT=${CKPT:-/tmp/wc-llama}
PY=${PY:-build/py-venv/bin/python}
F=("$CKPT"/model-0000*-of-0000*.safetensors)
t() { local s; s=$(date +%s.%N); "$@" >/dev/null 2>&1; echo "$(date +%s.%N) - $s" | bc; }
# shellcheck disable=SC2016  # the inner bash expands "$@" itself
for rep in 1 2 3; do
  cat "${F[@]}" > /dev/null
  a=$(t cat "${F[@]}")
  b=$($PY -c "
import time, weightcast
t = time.perf_counter(); sd = weightcast.load('$CKPT', progress=False)
print(round(time.perf_counter() - t, 2))")
  sync; echo 3 > /proc/sys/vm/drop_caches
  c=$(t bash -c 'for f in "$@"; do dd if=$f of=/dev/null bs=16M iflag=direct; done' \
      _ "${F[@]}")
  sync; echo 3 > /proc/sys/vm/drop_caches
  d=$(t bash -c 'for f in "$@"; do dd if=$f of=/dev/null bs=16M iflag=direct & done; wait' \
      _ "${F[@]}")
  sync; echo 3 > /proc/sys/vm/drop_caches
  e=$($PY -c "
import time, weightcast
t = time.perf_counter(); sd = weightcast.load('$CKPT', progress=False)
print(round(time.perf_counter() - t, 2))")
  echo "rep $rep: warm cat ${a}s; warm weightcast.load 1 process ${b}s;" \
    "cold dd O_DIRECT serial ${c}s; cold 4 dd O_DIRECT in parallel ${d}s;" \
    "cold weightcast.load 1 process ${e}s"
done
