#!/usr/bin/env bash
# FSDP2 loads on 3 ranks, side by side in one run (issues 18 and 19): torch's
# set_model_state_dict(broadcast_from_rank0), every rank reading its own slices (torch DCP's
# way), every rank load_file(), weightcast.load_into, and `weightcast run` with placement
# replicate and fsdp, on one transformers save_pretrained Llama checkpoint made here. Prints one
# Markdown table (what each variant is and where each figure comes from: the header of
# bench/torch_load_bench.py).
#
# Usage: bash bench/torch_placement_bench.sh [--small] [BUILD_DIR]   (default build; a build folder
#        holding the `weightcast` binary; the CLI rows are skipped without one)
# Env:   WORK (/tmp/weightcast-bench), RANKS (3), DTYPES (bf16,fp32), VARIANTS (all),
#        PYTHON (/work/venv/bin/python, else python3: needs torch, transformers, safetensors),
#        RESULTS_MD (a file to append the table to), TIMEOUT (300 s per mpirun job),
#        ROUNDS (3: each variant's median of that many runs, round-robin).
# --small: a 110 MB checkpoint (development, ~6 min here); default 1.7 GB (1.59 GiB), as in the
#          issues' anchors.
# xxhash (the cross-check's XXH3) is pip-installed into $WORK/pydeps when the Python lacks it.
set -euo pipefail
cd "$(dirname "$0")/.."
size=full
if [[ ${1:-} == --small ]]; then size=small; shift; fi
build=${1:-build}
work=${WORK:-/tmp/weightcast-bench}
py=${PYTHON:-/work/venv/bin/python}
[[ -x $py ]] || py=python3
mkdir -p "$work"

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if ! "$py" -c 'import xxhash' 2>/dev/null; then
  export WC_BENCH_PYDEPS=$work/pydeps
  if ! PYTHONPATH=$WC_BENCH_PYDEPS "$py" -c 'import xxhash' 2>/dev/null; then
    "$py" -m pip install --quiet --target "$WC_BENCH_PYDEPS" xxhash
  fi
fi

ckpt=$work/llama-$size
if [[ ! -e $ckpt/model.safetensors.index.json ]]; then
  rm -rf "$ckpt"
  flag=(); [[ $size == small ]] && flag=(--small)
  "$py" bench/make_llama_checkpoint.py "$ckpt" "${flag[@]}" --seed 0 >&2
fi

echo "# $(date -u +%FT%TZ), $(nproc) cores, $(mpirun --version | head -1)," \
  "torch $("$py" -c 'import torch; print(torch.__version__)'), weightcast $build/weightcast" >&2
args=(--checkpoint "$ckpt" --ranks "${RANKS:-3}" --dtypes "${DTYPES:-bf16,fp32}"
      --weightcast "$build/weightcast" --work "$work/torch-load" --timeout "${TIMEOUT:-300}")
[[ -n ${VARIANTS:-} ]] && args+=(--variants "$VARIANTS")
[[ -n ${ROUNDS:-} ]] && args+=(--rounds "$ROUNDS")
[[ -n ${RESULTS_MD:-} ]] && args+=(--results-md "$RESULTS_MD")
exec "$py" bench/torch_load_bench.py "${args[@]}"
