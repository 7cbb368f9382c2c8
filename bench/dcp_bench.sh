#!/usr/bin/env bash
# DCP loads of the 1.7 GB Llama on a 2 x 2 (dp x tp) gloo CPU mesh of 4 ranks, side by side:
# weightcast.dcp.HuggingFaceStorageReader vs torch's HuggingFaceStorageReader vs
# set_model_state_dict(broadcast_from_rank0=True), page cache warm and dropped before each job,
# plus the O_DIRECT floor (dd of every shard). What each figure is: bench/dcp_bench.py's header.
#
# Usage: bash bench/dcp_bench.sh [CHECKPOINT_DIR]   (default /tmp/wc-llama; written with
#        bench/make_llama_checkpoint.py, default size, when absent)
# Env:   PYTHON (a Python with torch, transformers, safetensors and weightcast installed; default
#        build/py-venv/bin/python, as scripts/test_python.sh's WEIGHTCAST_VENV=build/py-venv leaves
#        it), REPS (3), MODES (cold,warm), METHODS (weightcast,torch_reader,broadcast; also
#        weightcast_unverified: verify=False, weightcast_buffered: direct_io=False), STOP_AT
#        (UTC HH:MM after which no repetition starts), WORK (/tmp/weightcast-dcp-bench),
#        RESULTS_MD (a file to append the tables to), LAUNCHER (mpirun, the default, or
#        torchrun: the ranks' world from torch's process group), WC_CONFIG (a weightcast
#        config for the weightcast methods, e.g. one setting transport).
# Root only for MODES with cold: the page cache is dropped with `echo 3 > /proc/sys/vm/drop_caches`.
set -euo pipefail
cd "$(dirname "$0")/.."
ckpt=${1:-/tmp/wc-llama}
py=${PYTHON:-build/py-venv/bin/python}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [[ ! -e $ckpt/model.safetensors.index.json ]]; then
  rm -rf "$ckpt"
  "$py" bench/make_llama_checkpoint.py "$ckpt" --seed 0 >&2
fi
echo "# $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
  "$(mpirun --version | head -1), torch $("$py" -c 'import torch; print(torch.__version__)')," \
  "weightcast $(git rev-parse --short HEAD)" >&2
args=(--reps "${REPS:-3}" --modes "${MODES:-cold,warm}"
      --methods "${METHODS:-weightcast,torch_reader,broadcast}"
      --work "${WORK:-/tmp/weightcast-dcp-bench}")
[[ -n ${STOP_AT:-} ]] && args+=(--stop-at "$STOP_AT")
[[ -n ${RESULTS_MD:-} ]] && args+=(--results-md "$RESULTS_MD")
[[ -n ${LAUNCHER:-} ]] && args+=(--launcher "$LAUNCHER")
[[ -n ${WC_CONFIG:-} ]] && args+=(--config "$WC_CONFIG")
exec "$py" bench/dcp_bench.py "$ckpt" "${args[@]}"
