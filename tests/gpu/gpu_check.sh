#!/usr/bin/env bash
# GPU check for weightcast's cuda device, pinned staging, nccl transport and Python CUDA path,
# on one bare GPU host, in at most 5 minutes, from the wheel (scripts/wheel.sh) installed into
# a venv of its own on the host's python3 + torch.
#
# Usage: bash tests/gpu/gpu_check.sh [--wheel WHEEL] OUT_DIR
#        bash tests/gpu/gpu_check.sh --dry-run [--wheel WHEEL] OUT_DIR
#   WHEEL: default the bundle's wheels/weightcast-*.whl beside this script (tests/gpu/
#   gpu_bundle.sh packs it), else dist/weightcast-*.whl of the tree.
#   (on the device tool: carry ["out/gpu-bundle"], command
#    `bash out/gpu-bundle/tests/gpu/gpu_check.sh "$OUT"`, timeout_s 345; docs/gpu.md)
#
# --dry-run runs nothing and needs no GPU, wheel or torch: it prints every command the check
# would run, each with its time cap, and the sum of the caps against the budget, and writes
# them to OUT_DIR/commands.tsv (step, cap in seconds, the command as bash would quote it),
# OUT_DIR/digests.tsv (each step that moves tensor bytes and what its bytes are compared
# with) and the scripts the check generates under OUT_DIR/work.
# tests/gpu/gpu_check_dry_run.sh checks it. WEIGHTCAST_GPU_CHECK_DRY_NCCL (default 2.28.9)
# is the NCCL version the dry run assumes.
#
# What runs is what a user installs: `python3 -m venv --system-site-packages` (the host's
# torch, its nvidia-* wheels and safetensors stay visible) and `pip install --no-index` of the
# wheel into it ($WORK/venv, step 0), then the venv's `weightcast` console script (which passes
# torch's CUDA library folders to the CLI: WEIGHTCAST_CUDA_LIBRARY_DIRS) and the venv's python
# for every Python row. Where the host's python3 has no safetensors (torch does not bring it)
# the bundle's safetensors wheel is installed into the venv too.
# The wheel does not carry weightcast_tests and h2d_bench; they come from the bundle beside it
# (bin/ with lib/, their shared libraries: see gpu_bundle.sh), and their rows skip, saying so,
# where it is absent. They are kept, not replaced by rows the wheel can run, because they
# check what no CLI or Python row does: the [gpu] tests drive the device, staging and
# transports through the C++ API with their own expectations (failure paths, aborts, the
# placement cases on two ranks), and h2d_bench measures the pinned H2D ceiling that the
# weightcast rows' GB/s are read against, with a read-back check of every piece; both are
# ~10 MiB with their libraries, and libxxhash among them is what gpu_check_digests.py
# recomputes the files' digests with.
#
# Every row that moves tensor bytes is judged against the files, never against another GPU
# load (a bug that corrupts every upload alike would pass that): one `weightcast run --set
# device=host --report` gives the reference digests, themselves recomputed from the files;
# each GPU load's per-rank --report is compared with them (gpu_check_digests.py); the Python
# rows compare with torch.equal against safetensors.torch.load_file; h2d_bench compares what
# it reads back with the XXH3-64 of its source computed on the host.
#
# Rows, most valuable first (a row cut short by the budget leaves the ones before it):
# the wheel installed and its CLI's run-time libraries; the checkpoint (`weightcast synth`)
# and its host digests; Python load_into of an
# FSDP2 model on 2 ranks, after a GPU sleep and a NaN fill queued on the default stream and on
# a side stream (gpu_check_fsdp2.py: it must wait, and equal the file); two ranks on the one
# GPU over NCCL (NCCL_MULTI_RANK_GPU_ENABLE=1 from NCCL 2.30, else a distinct NCCL_HOSTID per
# rank over loopback sockets): broadcast, fsdp send/recv, rank 1 killed at rank 0's first
# progress line; Python load(cuda), the DCP reader and the benchmark load_into against
# load_state_dict(load_file(cuda)) (gpu_check_cuda.py); weightcast run to the GPU from page
# cache and with O_DIRECT; the [gpu] tests (WEIGHTCAST_REQUIRE_GPU=1 where nvidia-smi sees a
# GPU); the [placement][gpu] tests; h2d_bench (pinned H2D, uploads, nccl groups, read-back).
#
# One table (GB/s, 1 GB = 1e9 B, and peak RSS) in OUT_DIR/table.md and on stdout; OUT_DIR
# also gets results.tsv and each step's log tail. A hard budget, WEIGHTCAST_GPU_CHECK_BUDGET
# seconds (default 295): every command runs under a cap listed in CAPS below, the caps must
# leave SPARE (20 s) beside RESERVE (the table) within the budget (checked at start), and a
# step is cut to what is left; a step that fails or times out is recorded and the next one
# runs, so the table always comes out.
# Exit status: 0 when every step that ran passed; 1 when a step failed; 69 without a wheel
# that installs and runs here; 70 when the caps do not fit the budget.
set -uo pipefail

DRY=0 WHEEL=
while (($#)); do
  case $1 in
    --dry-run) DRY=1 ;;
    --wheel) WHEEL=${2:?--wheel needs a path}; shift ;;
    *) break ;;
  esac
  shift
done
OUT=${1:?usage: gpu_check.sh [--dry-run] [--wheel WHEEL] OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
# The bundle's root (BUNDLE/tests/gpu/gpu_check.sh) or the source tree's (tests/gpu/).
ROOT=$(cd "$HERE/../.." && pwd)
BUDGET=${WEIGHTCAST_GPU_CHECK_BUDGET:-295}
START=$(date +%s)
DEADLINE=$((START + BUDGET))
RESERVE=8  # seconds kept for the table
SPARE=20   # seconds the caps leave unused: `timeout -k` grace, process start-up, slow disks
WORK=${WEIGHTCAST_GPU_CHECK_WORK:-${TMPDIR:-/tmp}/weightcast-gpu-check}
((DRY)) && WORK=$OUT/work
PARAMS=${WEIGHTCAST_GPU_CHECK_PARAMS:-1B}  # BF16: ~2 GB (whole layers: synth rounds)
RESULTS=$OUT/results.tsv
COMMANDS=$OUT/commands.tsv
DIGESTS=$OUT/digests.tsv
FAILED=0
mkdir -p "$WORK"
: >"$RESULTS"
: >"$DIGESTS"
((DRY)) && : >"$COMMANDS"

# Each command's cap, seconds; NAME.digests is the comparison of step NAME's reports with the
# host digests. install makes the venv and installs the wheel into it; probe bounds step 0's
# other commands (nvidia-smi, the library search, --version, the Python import probe). The two-rank steps run over loopback sockets on
# NCCL < 2.30 (correctness, not speed). Their sum must leave RESERVE + SPARE (checked below).
declare -A CAPS=(
  [install]=15 [probe]=18 [synth]=18 [host]=8 [host.digests]=5
  [py_fsdp2]=30
  [nccl2]=14 [nccl2.digests]=2 [nccl2_fsdp]=14 [nccl2_fsdp.digests]=5 [nccl2_kill]=16
  [py_cuda]=35
  [warm]=10 [warm.digests]=2 [direct]=12 [direct.digests]=2
  [tests]=22 [scatter]=15
  [h2d]=6 [pieces]=7 [nccl_groups]=6 [readback]=5
)
caps_sum=0
for k in "${!CAPS[@]}"; do caps_sum=$((caps_sum + CAPS[$k])); done
spare=$((BUDGET - RESERVE - caps_sum))
if ((spare < SPARE)); then
  echo "gpu_check: the caps add up to ${caps_sum} s: the ${BUDGET} s budget less ${RESERVE} s for the table leaves ${spare} s spare, under ${SPARE} s" >&2
  exit 70
fi

left() { echo $((DEADLINE - $(date +%s) - RESERVE)); }
step() { printf '\n==== [%3s s left] %s\n' "$(left)" "$*"; }
note() { printf '  -- %s\n' "$*"; }
# cap NAME: the step's cap, cut to what is left; 0 when too little is left to start it. The
# dry run takes no time, so each step shows its full cap.
cap() {
  local c=${CAPS[$1]} l
  ((DRY)) && { echo "$c"; return; }
  l=$(left)
  if ((l < 3)); then echo 0; elif ((l < c)); then echo "$l"; else echo "$c"; fi
}
# record WHAT STATUS GBPS RSS_BYTES NOTE   (STATUS: pass, fail, skip, timeout; dry). An empty
# field is written as "-": read back with IFS=tab, two tabs in a row would shift the columns.
record() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "${3:--}" "${4:--}" "${5:--}" >>"$RESULTS"
  case "$2" in fail | timeout) FAILED=1 ;; esac
}
# checked_against STEP HOW: what STEP's bytes are compared with (OUT/digests.tsv; the dry-run
# test requires a line for every step that moves tensor bytes).
checked_against() { printf '%s\t%s\n' "$1" "$2" >>"$DIGESTS"; }
# Keeps the tail of a log in OUT (only small files come back from the GPU machine).
keep_log() { [ -f "$WORK/$1.log" ] && tail -c 12000 "$WORK/$1.log" >"$OUT/$1.log"; }

# dry NAME SECONDS CMD...: the dry run's line for a command: on stdout and in commands.tsv.
dry() {
  local name=$1 seconds=$2 line
  shift 2
  line=$(printf '%q ' "$@")
  printf '%s\t%s\t%s\n' "$name" "$seconds" "${line% }" >>"$COMMANDS"
  printf '  [cap %3s s] %s: %s\n' "$seconds" "$name" "${line% }"
}

# measure NAME SECONDS CMD...: runs CMD under `timeout`, output to $WORK/NAME.log, peak RSS
# (bytes) to $WORK/NAME.rss. Returns CMD's status (124: timed out). The dry run prints it.
# `timeout` signals its whole process group on expiry, so ranks started in the background
# by two_ranks.sh end with it.
measure() {
  local name=$1 seconds=$2 status=0
  shift 2
  if ((DRY)); then
    dry "$name" "$seconds" "$@"
    : >"$WORK/$name.log"
    return 0
  fi
  if [ -x /usr/bin/time ]; then
    timeout -k 3 "$seconds" /usr/bin/time -v -o "$WORK/$name.time" "$@" >"$WORK/$name.log" 2>&1 || status=$?
    awk -F': ' '/Maximum resident set size/ {print $2 * 1024}' "$WORK/$name.time" >"$WORK/$name.rss" 2>/dev/null
  else
    timeout -k 3 "$seconds" python3 -c '
import resource, subprocess, sys
r = subprocess.run(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.exit(r.returncode)' "$WORK/$name.rss" "$@" >"$WORK/$name.log" 2>&1 || status=$?
  fi
  keep_log "$name"
  return "$status"
}
rss_of() { cat "$WORK/$1.rss" 2>/dev/null || echo "-"; }
outcome() {
  if ((DRY)); then echo dry; elif (($1 == 0)); then echo pass; elif (($1 == 124 || $1 == 137)); then echo timeout; else echo fail; fi
}

print_table() {
  {
    echo "| step | result | GB/s | peak RSS | note |"
    echo "| --- | --- | ---: | ---: | --- |"
    while IFS=$'\t' read -r what status gbps rss extra; do
      if [[ "$rss" =~ ^[0-9]+$ ]]; then rss="$((rss / 1048576)) MiB"; fi
      echo "| $what | $status | $gbps | $rss | $extra |"
    done <"$RESULTS"
  } >"$OUT/table.md"
  echo
  cat "$OUT/table.md"
}
trap print_table EXIT

# What every Python row imports: a GPU host that lacks one fails the rows, naming it.
PY_NEEDS="torch torch.cuda torch.distributed torch.distributed.fsdp torch.distributed.checkpoint safetensors.torch weightcast weightcast.dcp"

# ---- 0: the machine, the wheel in a venv, the CUDA runtime and NCCL, Python --------------
step "0 machine, the wheel installed into a venv, CUDA runtime and NCCL, Python prerequisites"
PROBE_END=$((START + CAPS[install] + CAPS[probe]))
# probe_t WANT: a timeout for one probe command: WANT, cut to what is left of the probe's cap
# (at least 1 s, so every probe command still runs under a cap).
probe_t() {
  local l=$((PROBE_END - $(date +%s)))
  ((l < 1)) && l=1
  ((l < $1)) && echo "$l" || echo "$1"
}
# The wheel, and the bundle beside this script (bin/weightcast_tests, bin/h2d_bench, lib/,
# wheels/): BUNDLE/tests/gpu/gpu_check.sh, or out/gpu-bundle of the source tree.
BUNDLE=
for candidate in "$ROOT" "$ROOT/out/gpu-bundle"; do
  [ -d "$candidate/bin" ] && [ -d "$candidate/wheels" ] && BUNDLE=$(cd "$candidate" && pwd) && break
done
if [ -z "$WHEEL" ]; then
  for candidate in ${BUNDLE:+"$BUNDLE"/wheels/weightcast-*.whl} "$ROOT"/dist/weightcast-*.whl; do
    [ -f "$candidate" ] && WHEEL=$candidate && break
  done
fi
[ -n "$WHEEL" ] && [ -f "$WHEEL" ] && WHEEL=$(cd "$(dirname "$WHEEL")" && pwd)/${WHEEL##*/}
VENV=$WORK/venv
WC=$VENV/bin/weightcast PY=$VENV/bin/python
TESTS= H2D= XXHASH=
if [ -n "$BUNDLE" ]; then
  [ -x "$BUNDLE/bin/weightcast_tests" ] && TESTS=$BUNDLE/bin/weightcast_tests
  [ -x "$BUNDLE/bin/h2d_bench" ] && H2D=$BUNDLE/bin/h2d_bench
  # libxxhash for recomputing digests from the files (the wheel links its copy in).
  [ -e "$BUNDLE/lib/libxxhash.so.0" ] && XXHASH=$BUNDLE/lib/libxxhash.so.0
fi
no_tests_why="no weightcast_tests here: the bundle (tests/gpu/gpu_bundle.sh) is not beside this script"
no_h2d_why="no h2d_bench here: the bundle (tests/gpu/gpu_bundle.sh) is not beside this script"
# install.sh WHEEL VENV WHEELS_DIR: the venv on the host's python3 with its site-packages
# (torch and its nvidia-* wheels), the wheel into it from the file alone (--no-index), and
# safetensors from WHEELS_DIR only where the host's python3 has none. A python3 without
# ensurepip (Debian without python3-venv) gets a venv without pip, installed into by the
# host's pip (--python, pip >= 22.3).
cat >"$WORK/install.sh" <<'SH'
set -e
wheel=$1 venv=$2 wheels=$3
rm -rf "$venv"
if python3 -m venv --system-site-packages "$venv" 2>"$venv.err"; then
  pip=("$venv/bin/python" -m pip)
else
  echo "python3 -m venv with pip failed ($(tail -1 "$venv.err")): a venv without pip, the host's pip"
  python3 -m venv --system-site-packages --without-pip "$venv"
  pip=(python3 -m pip --python "$venv/bin/python")
fi
# --system-site-packages reaches the base interpreter's folders only: where python3 is itself
# a venv's, or torch is in the user's site-packages, its folders go to the venv by a .pth
# (after the venv's own, so the wheel's weightcast comes first).
python3 -c 'import os, site, sys
print("\n".join(p for p in sys.path + [site.getusersitepackages()]
                if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p)))' \
  >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_host_python3.pth"
start=$(date +%s.%N)
# --ignore-installed: a weightcast the host's python3 already has is not this wheel.
"${pip[@]}" install --quiet --no-index --no-deps --ignore-installed --disable-pip-version-check "$wheel"
if "$venv/bin/python" -c 'import safetensors' 2>/dev/null; then
  :
elif ls "$wheels"/safetensors-*.whl >/dev/null 2>&1; then
  "${pip[@]}" install --quiet --no-index --no-deps --disable-pip-version-check --find-links "$wheels" safetensors
  echo "safetensors installed from $wheels"
else
  # The Python rows' probe names it missing.
  echo "no safetensors on the host's python3${wheels:+ and none in $wheels}"
fi
echo "installed $(basename "$wheel") in $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
SH
# The Python import probe (step 0): prints `notes: ...` and `missing: ...` (empty when every
# module imports, CUDA is available to torch and its NCCL backend is built).
cat >"$WORK/py_probe.py" <<'PY'
import importlib, sys
needs = sys.argv[1:]
missing, notes = [], []
for name in needs:
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any failure to import is the prerequisite missing
        missing.append(f"{name} ({type(e).__name__}: {str(e)[:80]})")
if not missing:
    import safetensors
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    if not torch.cuda.is_available():
        missing.append(f"torch.cuda.is_available() (torch {torch.__version__}, CUDA "
                       f"{torch.version.cuda})")
    if not dist.is_nccl_available():
        missing.append("torch.distributed's NCCL backend")
    notes.insert(0, f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA "
                 f"{torch.version.cuda}), safetensors {safetensors.__version__}")
print("notes:", "; ".join(notes))
print("missing:", "; ".join(missing))
PY
if ((DRY)); then
  # What the real run would find on a GPU host, assumed: the commands come out as they would
  # run there (the bundle's paths; the NCCL version picks the two-rank setting).
  [ -n "$BUNDLE" ] || BUNDLE=$ROOT/out/gpu-bundle
  [ -n "$WHEEL" ] || WHEEL=$BUNDLE/wheels/weightcast-VERSION-cp312-abi3-manylinux_2_28_x86_64.whl
  TESTS=$BUNDLE/bin/weightcast_tests H2D=$BUNDLE/bin/h2d_bench XXHASH=$BUNDLE/lib/libxxhash.so.0
  GPUS_SEEN=1 PROBE_GPUS=1 HAVE_GPU=1
  PY_OK=1 PY_WHY="dry run"
  NCCL_RAN="NCCL ${WEIGHTCAST_GPU_CHECK_DRY_NCCL:-2.28.9}"
  gpu_skip_reason="dry run"
  note "dry run: nothing runs. Assumed: a GPU, python3 with torch (CUDA, NCCL) and safetensors, the wheel $WHEEL, the bundle at $BUNDLE, $NCCL_RAN (run time)"
  note "budget: the caps add up to $caps_sum s; the $BUDGET s budget less $RESERVE s for the table leaves $spare s spare (at least $SPARE)"
  dry install "${CAPS[install]}" bash "$WORK/install.sh" "$WHEEL" "$VENV" "$BUNDLE/wheels"
  dry probe "${CAPS[probe]}" "$PY" "$WORK/py_probe.py" $PY_NEEDS
  record "dry run" dry - - "caps $caps_sum s of the $BUDGET s budget less $RESERVE s: $spare s spare; $NCCL_RAN assumed"
else
cat "$BUNDLE/BUNDLE.txt" 2>/dev/null | sed 's/^/  /'
GPUS_SEEN=0
if command -v nvidia-smi >/dev/null; then
  timeout "$(probe_t 5)" nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/  nvidia-smi: /'
  GPUS_SEEN=$(timeout "$(probe_t 5)" nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
else
  note "nvidia-smi: not found"
fi
if [ -z "$WHEEL" ] || [ ! -f "$WHEEL" ]; then
  record "wheel installed" fail - - "no wheel: none given (--wheel), none in ${BUNDLE:-the bundle}/wheels or $ROOT/dist (scripts/wheel.sh)"
  exit 69
fi
if ! command -v python3 >/dev/null; then
  record "wheel installed" fail - - "no python3 to install $WHEEL with"
  exit 69
fi
if ! measure install "$(cap install)" bash "$WORK/install.sh" "$WHEEL" "$VENV" "${BUNDLE:+$BUNDLE/wheels}"; then
  record "wheel installed" fail - - "${WHEEL##*/}: $(grep -v '^ *$' "$WORK/install.log" | tail -2 | tr '\n' ' ' | head -c 300)"
  exit 69
fi
sed 's/^/  /' "$WORK/install.log"
if ! timeout "$(probe_t 8)" "$WC" --version >"$WORK/version.log" 2>&1; then
  keep_log version
  record "wheel installed" fail - - "the venv's weightcast --version failed: $(tail -1 "$WORK/version.log" | head -c 200)"
  exit 69
fi
sed 's/^/  /' "$WORK/version.log"
keep_log version
# The console script passes torch's library folders to the CLI; --version names the files
# it loaded.
record "wheel installed" pass - - "$(grep -m1 '^installed ' "$WORK/install.log"); $(sed -n 's/^loaded: //p' "$WORK/version.log" | head -c 300)"
# The libraries for the bundle's weightcast_tests (which loads them as weightcast does, but
# has no console script) and h2d_bench (which links the CUDA runtime): torch's nvidia wheels
# (nvidia/nccl/lib, nvidia/cu13/lib), then the CUDA toolkit's, then the loader's default path.
HOST_LIBS=$(timeout "$(probe_t 5)" "$PY" -c '
import glob, os, site
dirs = []
for base in site.getsitepackages() + [site.getusersitepackages()]:
    for pattern in ("nvidia/nccl/lib", "nvidia/cu13/lib", "nvidia/cuda_runtime/lib"):
        for d in glob.glob(os.path.join(base, pattern)):
            if d not in dirs:
                dirs.append(d)
print(":".join(dirs))' 2>/dev/null)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && HOST_LIBS=${HOST_LIBS:+$HOST_LIBS:}$d
done
export LD_LIBRARY_PATH=${HOST_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
note "library path for the bundle's binaries: ${HOST_LIBS:-none found, the dynamic loader defaults}"
# (-h: Catch2's --list-* exit with the count they listed.)
if [ -n "$TESTS" ] && ! why=$(timeout "$(probe_t 5)" "$TESTS" -h 2>&1 >/dev/null); then
  if echo "$why" | grep -q 'GLIBCXX\|libstdc++\|libgcc_s'; then
    # The host's C++ runtime is older than the build's: the bundle's.
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$BUNDLE/lib/compat
    note "the host's libstdc++ is older than the build's: using the bundle's lib/compat"
    why=$(timeout "$(probe_t 5)" "$TESTS" -h 2>&1 >/dev/null) || { no_tests_why="the bundle's weightcast_tests cannot run here: $(tail -1 <<<"$why")"; TESTS= H2D=; }
  else
    no_tests_why="the bundle's weightcast_tests cannot run here: $(tail -1 <<<"$why")"
    TESTS=
  fi
fi
PROBE_GPUS=$(grep -o 'run time: .*' "$WORK/version.log" | grep -o '[0-9]* CUDA device' | grep -o '^[0-9]*' || echo 0)
NCCL_RAN=$(grep -o 'NCCL [0-9.]*$' "$WORK/version.log" | tail -1)
note "nvidia-smi sees $GPUS_SEEN GPU(s); the CUDA runtime probe sees ${PROBE_GPUS:-0}; run-time ${NCCL_RAN:-NCCL unknown}"
if ((GPUS_SEEN > 0)) && ((${PROBE_GPUS:-0} == 0)); then
  record "GPU probe" fail - - "nvidia-smi sees $GPUS_SEEN GPU(s) but the CUDA runtime none: $(grep -o 'no CUDA device ([^)]*)' "$WORK/version.log")"
elif ((GPUS_SEEN > 0)); then
  record "GPU probe" pass - - "$PROBE_GPUS device(s); $(grep -o 'driver [0-9.]*' "$WORK/version.log"), ${NCCL_RAN:-NCCL ?} (run time)"
else
  record "GPU probe" skip - - "no GPU: nvidia-smi sees none; the GPU steps below skip"
fi
HAVE_GPU=$(( ${PROBE_GPUS:-0} > 0 ))
gpu_skip_reason="no usable CUDA device: $(sed -n 's/.*no CUDA device (\(.*\)), NCCL.*/\1/p' "$WORK/version.log" | head -1)"

# Python: every module a Python row imports, in the venv (the wheel's weightcast, the host's
# torch). On a host where nvidia-smi sees a GPU a missing one is a failure naming it, never a
# skip: a Python row that cannot run proves nothing.
PY_OK=0 PY_WHY= PY_NOTES=
t=$(probe_t 15)
if py_info=$(timeout "$t" "$PY" "$WORK/py_probe.py" $PY_NEEDS 2>&1); then
  PY_MISSING=$(sed -n 's/^missing: //p' <<<"$py_info")
  PY_NOTES=$(sed -n 's/^notes: //p' <<<"$py_info")
  if [ -z "$PY_MISSING" ]; then
    PY_OK=1
  else
    PY_WHY="the venv's python lacks what the Python rows import: $PY_MISSING"
  fi
else
  PY_WHY="the import probe (py_probe.py: $PY_NEEDS) failed or did not finish within $t s: $(tail -1 <<<"$py_info")"
fi
if ((PY_OK)); then
  record "python prerequisites" pass - - "$PY_NOTES"
elif ((GPUS_SEEN > 0)); then
  record "python prerequisites" fail - - "$PY_WHY"
else
  record "python prerequisites" skip - - "no GPU; $PY_WHY"
fi
note "python: ${PY_NOTES:-$PY_WHY}"
fi

# Two ranks on the one GPU. NCCL refuses two ranks on one GPU of one host unless, from 2.30,
# NCCL_MULTI_RANK_GPU_ENABLE=1 (experimental, up to 2 ranks per GPU); before 2.30 a distinct
# NCCL_HOSTID per rank makes them two hosts, which then talk over sockets (NCCL_IB_DISABLE=1,
# the loopback interface): correctness, not speed.
nccl_version=$(grep -o '[0-9][0-9.]*' <<<"${NCCL_RAN:-}" | head -1)
if [ -n "$nccl_version" ] && printf '2.30\n%s\n' "$nccl_version" | sort -V -C; then
  TWO_RANKS=multi
  two_ranks_why="NCCL $nccl_version: NCCL_MULTI_RANK_GPU_ENABLE=1"
else
  TWO_RANKS=hostid
  two_ranks_why="NCCL ${nccl_version:-unknown} (< 2.30): NCCL_HOSTID per rank, sockets over loopback"
fi
note "2 ranks on the one GPU: $two_ranks_why"
for r in 0 1; do
  if [ "$TWO_RANKS" = multi ]; then
    note "  rank $r: RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 NCCL_MULTI_RANK_GPU_ENABLE=1"
  else
    note "  rank $r: RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 NCCL_HOSTID=weightcast-gpu-check-rank$r NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
  fi
done
# NCCL's refusal of two ranks on one GPU, word for word, as each version words it (init.cc's
# WARN): before 2.30 "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000";
# from 2.30 (without NCCL_MULTI_RANK_GPU_ENABLE) "Multiple Ranks are using the same
# GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.". Only these
# are a refusal; any other failure of a two-rank step (a pairing bug in weightcast's groups
# too) fails the step, and so does a refusal where NCCL_MULTI_RANK_GPU_ENABLE=1 was set.
NCCL_REFUSAL='Duplicate GPU detected : rank [0-9]+ and rank [0-9]+ both on CUDA device [0-9a-fA-F]+|Multiple Ranks are using the same GPU/Partition\. Set NCCL_MULTI_RANK_GPU_ENABLE=1'

# two_ranks.sh MODE KILL CMD...: CMD as ranks 0 and 1 of 2 on the one GPU, with torchrun's
# variables. KILL `progress`: rank 1 gets SIGKILL as soon as rank 0 prints its first progress
# line (`weightcast[rank 0]: NN%`: chunks are flowing), polled every 50 ms; `0`: no kill.
# Exit status: rank 0's when rank 1 was to be killed (1 when rank 0 ended before any
# progress line, so the kill never landed mid-load), else the first nonzero one.
cat >"$WORK/two_ranks.sh" <<'SH'
mode=$1 kill_on=$2
shift 2
logs=$(mktemp -d)
pids=()
# gpu_check.sh's `timeout` signals the whole process group; the trap ends the ranks at once
# on a signal sent to this script alone.
trap 'kill -9 "${pids[@]}" 2>/dev/null; exit 124' TERM INT
for r in 0 1; do
  if [ "$mode" = multi ]; then
    nccl=(NCCL_MULTI_RANK_GPU_ENABLE=1)
  else
    nccl=(NCCL_HOSTID="weightcast-gpu-check-rank$r" NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo)
  fi
  env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT="${MASTER_PORT:-29581}" NCCL_DEBUG="${NCCL_DEBUG:-WARN}" "${nccl[@]}" "$@" \
    >"$logs/rank$r" 2>&1 &
  pids+=($!)
done
if [ "$kill_on" = progress ]; then
  start=$(date +%s.%N)
  killed=0
  while kill -0 "${pids[0]}" 2>/dev/null; do
    if grep -qE 'weightcast\[rank 0\]: +[0-9]+%' "$logs/rank0"; then
      kill -9 "${pids[1]}" 2>/dev/null && killed=1
      break
    fi
    sleep 0.05
  done
  at=$(date +%s.%N)
  wait "${pids[0]}"
  status=$?
  since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }
  if ((killed)); then
    echo "rank 1 killed at rank 0's first progress line, $(awk -v a="$start" -v b="$at" 'BEGIN {printf "%.1f", b - a}') s in ($(grep -m1 -oE 'weightcast\[rank 0\]: +[0-9]+%' "$logs/rank0")); rank 0 ended with $status $(since "$at") s after the kill"
  else
    echo "rank 1 not killed: rank 0 ended with $status before printing any progress line (a load under 2 s prints none)"
    ((status == 0)) && status=1
  fi
  wait "${pids[1]}" 2>/dev/null
else
  status=0
  for pid in "${pids[@]}"; do wait "$pid" || { s=$?; ((status == 0)) && status=$s; }; done
fi
for r in 0 1; do sed "s/^/[rank $r] /" "$logs/rank$r"; done
rm -rf "$logs"
exit "$status"
SH

# ---- 1: a synthetic checkpoint ----------------------------------------------------------
step "1 synthetic checkpoint: $PARAMS params (BF16) in $WORK"
CKPT=$WORK/ckpt-$PARAMS
SHARDS=()
BYTES=0
synth_seconds=reused
if ((DRY)); then
  measure synth "$(cap synth)" "$WC" synth "$CKPT" --params "$PARAMS"
  SHARDS=("$CKPT/model-00001-of-00001.safetensors")  # what synth writes is known only after
  record "synth $PARAMS" dry - - "$CKPT"
else
  if [ -e "$CKPT/model.safetensors.index.json" ] || [ -e "$CKPT/model.safetensors" ]; then
    note "reusing $CKPT"
  else
    rm -rf "$CKPT"
    t=$(cap synth)
    synth_start=$(date +%s)
    if ((t == 0)) || ! measure synth "$t" "$WC" synth "$CKPT" --params "$PARAMS"; then
      rm -rf "$CKPT"
      record "synth $PARAMS" fail - - "writing the checkpoint failed or ran out of its ${t} s (see synth.log)"
    fi
    synth_seconds="$(($(date +%s) - synth_start)) s"
  fi
  if [ -d "$CKPT" ]; then
    mapfile -t SHARDS < <(find "$CKPT" -name '*.safetensors' | sort)
    BYTES=$(du -cb "${SHARDS[@]}" | tail -1 | cut -f1)
    record "synth $PARAMS" pass - "$(rss_of synth)" "${#SHARDS[@]} shard(s), $BYTES B, $synth_seconds, $(stat -f -c %T "$WORK") filesystem"
  fi
fi

# ---- 2: the reference: digests computed on the host from the files -----------------------
# One host load (no GPU) writes every tensor's XXH3-64; gpu_check_digests.py recomputes each
# from the files with libxxhash, so the reference is the files' own. Every GPU row's report
# is compared with it. Needs no GPU: it runs (and is checked) on any host. It also leaves
# the checkpoint in the page cache for the GPU rows.
step "2 host digests of the checkpoint (weightcast run --set device=host --report)"
HOST_REPORT=$WORK/host.report.json
HAVE_HOST=0
DIGESTS_PY=$HERE/gpu_check_digests.py
if ((${#SHARDS[@]} == 0)); then
  record "host digests from the files" fail - - "no checkpoint"
else
  rm -f "$HOST_REPORT"
  measure host "$(cap host)" "$WC" run --set "checkpoint=$CKPT" --set device=host --set transport=local \
    --set chunk_size=16MiB --report "$HOST_REPORT"
  status=$?
  if ((DRY == 0 && status != 0)); then
    record "host digests from the files" "$(outcome $status)" - "$(rss_of host)" "the host load failed (exit $status): see host.log"
  else
    host_gbps=$(grep -o '[0-9.]* GB/s' "$WORK/host.log" | head -1 | cut -d' ' -f1)
    measure host.digests "$(cap host.digests)" "$PY" "$DIGESTS_PY" --checkpoint "$CKPT" \
      --xxhash "${XXHASH:-none}" host "$HOST_REPORT"
    status=$?
    cat "$WORK/host.digests.log" | sed 's/^/  /' | head -12
    ((DRY || status == 0)) && HAVE_HOST=1
    record "host digests from the files" "$(outcome $status)" "${host_gbps:--}" "$(rss_of host)" "$(head -1 "$WORK/host.digests.log" | head -c 240)"
  fi
fi
# compare_digests STEP ROW REPORT...: STEP's per-rank reports against the host digests (whole
# tensors) and the files (shards), capped as STEP.digests. Returns 0 when equal; records
# nothing (the caller's row says it).
DIGEST_NOTE=
compare_digests() {
  local name=$1 status
  shift
  checked_against "$name" "host digests: $name.digests compares its --report with $HOST_REPORT"
  if ((DRY)); then
    DIGEST_NOTE="bytes compared with the host digests"
  elif ((HAVE_HOST == 0)); then
    DIGEST_NOTE="no host digests to compare with"
    return 1
  fi
  measure "$name.digests" "$(cap "$name.digests")" "$PY" "$DIGESTS_PY" --checkpoint "$CKPT" \
    --xxhash "${XXHASH:-none}" rows "$HOST_REPORT" "$@"
  status=$?
  sed 's/^/  /' "$WORK/$name.digests.log" | head -12
  ((DRY)) && return 0
  DIGEST_NOTE=$(head -1 "$WORK/$name.digests.log" | head -c 200)
  [ -n "$DIGEST_NOTE" ] || DIGEST_NOTE="the digest comparison ended with $status"
  return "$status"
}

# two_rank_row NAME ROW KILL EXPECT CMD...: CMD on 2 ranks (two_ranks.sh); the row passes
# when rank 0 (KILL progress: rank 0; else both) ends with EXPECT and, where CMD wrote
# reports ($WORK/NAME.r0.json, .r1.json), they equal the host digests. NCCL's refusal of two
# ranks on one GPU is a skip where the setting is NCCL_HOSTID (it did not take), a failure
# under NCCL_MULTI_RANK_GPU_ENABLE=1; anything else that fails, fails.
two_rank_row() {
  local name=$1 row=$2 kill_on=$3 expect=$4 t status refusal reports=()
  shift 4
  t=$(cap "$name")
  if ((HAVE_GPU == 0)); then record "$row" skip - - "$gpu_skip_reason"; return; fi
  if ((t == 0)); then record "$row" skip - - "no time left"; return; fi
  rm -f "$WORK/$name".r*.json
  measure "$name" "$t" bash "$WORK/two_ranks.sh" "$TWO_RANKS" "$kill_on" "$@"
  status=$?
  tail -4 "$WORK/$name.log" | sed 's/^/  /'
  refusal=$(grep -oE -m1 "$NCCL_REFUSAL" "$WORK/$name.log")
  if [[ "$*" == *"--report $WORK/$name.r{rank}.json"* ]]; then
    reports=("$WORK/$name.r0.json" "$WORK/$name.r1.json")
  fi
  if ((DRY)); then
    ((${#reports[@]})) && compare_digests "$name" "${reports[@]}"
    record "$row" dry - - "$two_ranks_why; expects exit $expect"
  elif [ -n "$refusal" ] && [ "$TWO_RANKS" = multi ]; then
    record "$row" fail - - "NCCL refused two ranks on one GPU although NCCL_MULTI_RANK_GPU_ENABLE=1 was set: $refusal"
  elif [ -n "$refusal" ]; then
    record "$row" skip - - "NCCL refused two ranks on one GPU ($two_ranks_why did not take): $refusal"
  elif ((status != expect)); then
    record "$row" "$(outcome $status)" - - "exit $status, expected $expect ($two_ranks_why): $(grep -m1 -E 'FAIL|error|rank 1 (not )?killed' "$WORK/$name.log" | head -c 200)"
  elif ((${#reports[@]})) && ! compare_digests "$name" "${reports[@]}"; then
    record "$row" fail - "$(rss_of "$name")" "$two_ranks_why; bytes differ from the files: $DIGEST_NOTE"
  else
    record "$row" pass "$(grep -o '[0-9.]* GB/s' "$WORK/$name.log" | head -1 | cut -d' ' -f1)" "$(rss_of "$name")" "$two_ranks_why; $(grep -m1 -o 'rank 0 ended with [^;]*\|load_into(FSDP2) ordered[^;]*\|bit-exact[^;]*\|All tests passed[^;]*' "$WORK/$name.log" | head -c 160)${DIGEST_NOTE:+; $DIGEST_NOTE}"
  fi
  DIGEST_NOTE=
}
# py_ready ROW: whether the Python rows can run; records the row's skip or failure if not.
py_ready() {
  if ((HAVE_GPU == 0)); then record "$1" skip - - "$gpu_skip_reason"; return 1; fi
  ((PY_OK)) && return 0
  # nvidia-smi sees a GPU here: a missing prerequisite fails the row, naming it.
  record "$1" fail - - "$PY_WHY"
  return 1
}

# ---- 3: Python load_into of an FSDP2 model, ordered after the caller's queued work --------
step "3 Python load_into(FSDP2), 2 ranks on the one GPU, after queued GPU work ($two_ranks_why)"
mkdir -p "$WORK/fsdp2"
row="python load_into(FSDP2) after queued work, 2 ranks one GPU"
checked_against py_fsdp2 "torch.equal of every full_tensor() against safetensors.torch.load_file of the file"
if py_ready "$row"; then
  two_rank_row py_fsdp2 "$row" 0 0 \
    "$PY" "$HERE/gpu_check_fsdp2.py" "$WORK/fsdp2" 29594
fi

# ---- 4: two ranks on the one GPU over NCCL: broadcast, fsdp send/recv, a rank killed -------
step "4 nccl transport, 2 ranks on the one GPU ($two_ranks_why)"
if ((${#SHARDS[@]} == 0)); then
  for row in "nccl broadcast, 2 ranks one GPU" "nccl fsdp send/recv, 2 ranks one GPU" \
    "nccl rank 1 killed mid-load"; do record "$row" fail - - "no checkpoint"; done
else
  two_rank_row nccl2 "nccl broadcast, 2 ranks one GPU" 0 0 \
    "$WC" run --set "checkpoint=$CKPT" --set device=cuda --set transport=nccl --set timeout=15s \
    --set rendezvous.port=29591 --set chunk_size=16MiB --report "$WORK/nccl2.r{rank}.json"
  two_rank_row nccl2_fsdp "nccl fsdp send/recv, 2 ranks one GPU" 0 0 \
    "$WC" run --set "checkpoint=$CKPT" --set device=cuda --set transport=nccl --set timeout=15s \
    --set rendezvous.port=29592 --set placement=fsdp --set chunk_size=16MiB \
    --report "$WORK/nccl2_fsdp.r{rank}.json"
  # Small chunks and a shallow ring stretch the load over seconds (progress lines start 2 s
  # in), so the kill at rank 0's first progress line lands mid-load; rank 0 must end with 69
  # (a peer gone) within its 8 s timeout, not hang. It fails by design: no digests.
  two_rank_row nccl2_kill "nccl rank 1 killed mid-load" progress 69 \
    "$WC" run --set "checkpoint=$CKPT" --set device=cuda --set transport=nccl --set timeout=8s \
    --set rendezvous.port=29593 --set chunk_size=32KiB --set buffer_depth=2
fi

# ---- 5: Python on one GPU: load(cuda), the DCP reader, load_into against load_state_dict --
step "5 Python: load(device=cuda), DCP reader, load_into vs load_state_dict(load_file(cuda))"
rows=("python weightcast.load(device=cuda); DCP reader" "python load_into vs load_state_dict(load_file(cuda))")
checked_against py_cuda "torch.equal of every tensor against safetensors.torch.load_file of the same shard"
if ((${#SHARDS[@]} == 0)); then
  for row in "${rows[@]}"; do record "$row" fail - - "no checkpoint"; done
elif ! py_ready "${rows[0]}"; then
  py_ready "${rows[1]}"  # records the same skip or failure for the second row
else
  t=$(cap py_cuda)
  if ((t == 0)); then
    for row in "${rows[@]}"; do record "$row" skip - - "no time left"; done
  else
    mkdir -p "$WORK/dcp"
    measure py_cuda "$t" "$PY" "$HERE/gpu_check_cuda.py" "$CKPT" "$WORK/dcp"
    status=$?
    grep -E '^(PASS|FAIL|  )' "$WORK/py_cuda.log" | sed 's/^/  /'
    # A row per part: PASS/FAIL lines; a part with neither did not run (the process died or
    # timed out before it).
    part_row() {  # ROW GBPS_PATTERN PART...
      local row=$1 pattern=$2 p line verdict=pass notes=()
      shift 2
      for p in "$@"; do
        line=$(grep -m1 -E "^(PASS|FAIL) $p: " "$WORK/py_cuda.log")
        if ((DRY)); then verdict=dry notes=("$p: torch.equal against safetensors.load_file"); continue; fi
        if [ -z "$line" ]; then
          verdict=$(outcome "$status")
          [ "$verdict" = pass ] && verdict=fail
          notes+=("$p did not run (exit $status)")
        else
          [[ "$line" == FAIL* ]] && verdict=fail
          notes+=("${line#* }")
        fi
      done
      # Notes joined with "; ": a "|" would open a new column of the table.
      local joined
      joined=$(printf '%s; ' "${notes[@]}")
      record "$row" "$verdict" "$(grep -m1 -oE "$pattern" "$WORK/py_cuda.log" | grep -oE '[0-9.]+ GB/s' | cut -d' ' -f1)" "$(rss_of py_cuda)" "$(printf '%s' "${joined%; }" | head -c 400)"
    }
    part_row "${rows[0]}" "weightcast.load\(device='cuda'\): .* GB/s" load dcp
    part_row "${rows[1]}" 'load_into [0-9.]+ GB/s' bench
  fi
fi

# ---- 6: weightcast run to the GPU, world size 1: page cache, then O_DIRECT ----------------
step "6 weightcast run, device cuda, world size 1: page cache, then O_DIRECT"
# The page cache is warm: synth wrote the files and the host load read them.
run_weightcast() {  # NAME ROW SETS...
  local name=$1 row=$2 t status
  shift 2
  local sets=()
  for kv in "$@"; do sets+=(--set "$kv"); done
  t=$(cap "$name")
  if ((HAVE_GPU == 0)); then record "$row" skip - - "$gpu_skip_reason"; return; fi
  if ((${#SHARDS[@]} == 0)); then record "$row" fail - - "no checkpoint"; return; fi
  if ((t == 0)); then record "$row" skip - - "no time left"; return; fi
  rm -f "$WORK/$name.report.json"
  measure "$name" "$t" "$WC" run --set "checkpoint=$CKPT" --set device=cuda --set transport=local \
    --set chunk_size=16MiB --set buffer_depth=8 "${sets[@]}" --report "$WORK/$name.report.json"
  status=$?
  grep '^# ' "$WORK/$name.log" | tail -4 | sed 's/^/  /'
  local gbps reader
  gbps=$(grep -o '[0-9.]* GB/s' "$WORK/$name.log" | head -1 | cut -d' ' -f1)
  reader=$(grep -o '# reader [^,]*' "$WORK/$name.log" | head -1 | cut -c3-)
  # The device digests (read back from GPU memory) against the files'.
  if ((DRY == 0 && status != 0)); then
    record "$row" "$(outcome $status)" "${gbps:--}" "$(rss_of "$name")" "exit $status: see $name.log"
  elif ! compare_digests "$name" "$WORK/$name.report.json"; then
    record "$row" fail "${gbps:--}" "$(rss_of "$name")" "bytes differ from the files: $DIGEST_NOTE"
  else
    record "$row" "$(outcome 0)" "${gbps:--}" "$(rss_of "$name")" "$BYTES B; ${reader:-}; $(grep -o 'upload [0-9.]* GB/s' "$WORK/$name.log" | head -1); $DIGEST_NOTE"
  fi
  DIGEST_NOTE=
}
run_weightcast warm "weightcast cuda, page cache" direct_io=off
run_weightcast direct "weightcast cuda, O_DIRECT" direct_io=on

# ---- 7: the [gpu] tests --------------------------------------------------------------------
step "7 [gpu] tests"
if [ -d "${WEIGHTCAST_CORPUS:-/nonexistent}/real" ]; then
  # The [placement][gpu] tests run in a row of their own, with 2 ranks.
  filter="[gpu]~[placement],[pinned],[gpu-info]"
  why_filter="with the corpus at $WEIGHTCAST_CORPUS"
else
  # Without the corpus (it does not travel): the tests that read it are left out.
  filter="[gpu]~[corpus]~[placement],[pinned],[gpu-info]~[run]"
  why_filter="the corpus tests left out (no WEIGHTCAST_CORPUS)"
fi
require=0
((GPUS_SEEN > 0)) && require=1
t=$(cap tests)
if [ -z "$TESTS" ]; then
  record "[gpu] tests" skip - - "$no_tests_why"
elif ((t == 0)); then
  record "[gpu] tests" skip - - "no time left"
else
  measure tests "$t" env WEIGHTCAST_REQUIRE_GPU=$require WEIGHTCAST_CLI="$WC" "$TESTS" "$filter" --durations yes
  status=$?
  summary=$(grep -E '^(All tests passed|test cases:)' "$WORK/tests.log" | tail -1)
  skipped=$(grep -c 'skipped: ' "$WORK/tests.log" || true)
  record "[gpu] tests" "$(outcome $status)" - "$(rss_of tests)" "$filter: ${summary:-exit $status}; $skipped skip warning(s); REQUIRE_GPU=$require; $why_filter"
fi

# ---- 8: the [placement][gpu] tests, 2 ranks through `weightcast launch` -------------------
# `launch` cannot give each rank its own NCCL_HOSTID: they take two ranks on one GPU only
# where NCCL 2.30's setting does.
step "8 [placement][gpu] tests"
# The step's cap covers --list-tags (5 s at most; `scatter.tags` in the dry run) and the run.
has_placement=1
if ((DRY)); then
  dry scatter.tags 5 "$TESTS" --list-tags
elif [ -z "$TESTS" ]; then
  has_placement=0
elif ((HAVE_GPU)) && ! timeout 5 "$TESTS" --list-tags 2>/dev/null | grep -q '\[placement\]'; then
  has_placement=0
fi
t=$(cap scatter)
((t > 5)) && t=$((t - 5))
if ((HAVE_GPU == 0)); then
  record "placement [placement][gpu] tests" skip - - "$gpu_skip_reason"
elif [ -z "$TESTS" ]; then
  record "placement [placement][gpu] tests" skip - - "$no_tests_why"
elif ((has_placement == 0)); then
  record "placement [placement][gpu] tests" skip - - "not in this build (no [placement] tests)"
elif ((t == 0)); then
  record "placement [placement][gpu] tests" skip - - "no time left"
else
  two=()
  [ "$TWO_RANKS" = multi ] && two=(NCCL_MULTI_RANK_GPU_ENABLE=1 WEIGHTCAST_TEST_TWO_RANKS_PER_GPU=1)
  measure scatter "$t" env WEIGHTCAST_REQUIRE_GPU=1 WEIGHTCAST_CLI="$WC" "${two[@]}" "$TESTS" "[placement][gpu]" --durations yes
  status=$?
  summary=$(grep -E '^(All tests passed|test cases:)' "$WORK/scatter.log" | tail -1)
  skipped=$(grep -o 'skipped: needs 2 CUDA devices[^;]*' "$WORK/scatter.log" | head -1)
  refusal=$(grep -oE -m1 "$NCCL_REFUSAL" "$WORK/scatter.log")
  record "placement [placement][gpu] tests" "$(outcome $status)" - "$(rss_of scatter)" "[placement][gpu]: ${summary:-exit $status}${skipped:+; fsdp between ranks $skipped}${refusal:+; NCCL refused two ranks on one GPU: $refusal}"
fi

# ---- 9: h2d_bench: pinned H2D, uploads by piece, nccl groups, read-back -----------------
step "9 h2d_bench: pinned H2D, uploads, nccl group cost, read-back"
# Each row names h2d_bench's mode word (bench/h2d_bench.cpp): without it the arguments read as
# the plain H2D mode's BYTES ITERATIONS. h2d, pieces and readback read the device bytes back
# and compare their XXH3-64 with the source's, computed on the host (`verify ... equal`
# lines; a difference exits 70). nccl moves no bytes at world size 1 (rank 0 to itself).
bench_row() {  # NAME ROW MODE ARGS...
  local name=$1 row=$2 mode=$3 t status
  shift 2
  t=$(cap "$name")
  [ "$mode" = nccl ] || checked_against "$name" "h2d_bench $mode: the device bytes read back against the XXH3-64 of the source computed on the host"
  if ((HAVE_GPU == 0)); then record "$row" skip - - "$gpu_skip_reason"; return; fi
  if [ -z "$H2D" ]; then record "$row" skip - - "$no_h2d_why"; return; fi
  if ((t == 0)); then record "$row" skip - - "no time left"; return; fi
  measure "$name" "$t" "$H2D" "$@"
  status=$?
  sed 's/^/  /' "$WORK/$name.log" | tail -8
  local gbps=- extra verify
  verify=$(grep -m1 '^verify ' "$WORK/$name.log")
  if [ "$name" = h2d ]; then
    gbps=$(awk '/^h2d_gbps/ {print $2}' "$WORK/$name.log")
    extra="256 MiB cudaMemcpyAsync from cudaHostAlloc"
  elif [ "$name" = pieces ]; then
    gbps=$(awk '/one_copy_per_chunk_waited/ {print $3}' "$WORK/$name.log")
    extra=$(awk '/^upload_gbps/ && !/warmup/ {printf "%s %s; ", $2, $3}' "$WORK/$name.log")
  elif [ "$name" = nccl_groups ]; then
    extra=$(awk '/^nccl_group/ {printf "%s %s; ", $2, $3}' "$WORK/$name.log")
  else
    extra=$(grep '^readback' "$WORK/$name.log" | tr '\n' ';')
  fi
  if ((DRY == 0 && status == 0)) && [ "$mode" != nccl ] && [[ "$verify" != *" equal"* ]]; then
    status=1
    verify="no 'verify ... equal' line: the device bytes were not checked"
  fi
  record "$row" "$(outcome $status)" "${gbps:--}" "$(rss_of "$name")" "$extra${verify:+; $verify}"
}
bench_row h2d "pinned H2D (h2d_bench)" h2d $((256 << 20)) 20
bench_row pieces "Device::upload 16 MiB chunks, 64 pieces" pieces $((16 << 20)) 64 64
bench_row nccl_groups "nccl group enqueue, world size 1" nccl 200 $((16 << 20))
bench_row readback "Arena::read_back, 1000 x 64 KiB" readback 1000 65536

# ---- the table -------------------------------------------------------------------------------
if ((DRY)); then
  step "dry run: $(wc -l <"$COMMANDS") commands in $COMMANDS; the caps add up to $caps_sum s of the ${BUDGET} s budget (less $RESERVE s for the table): $spare s spare"
  exit 0
fi
step "results: $BYTES B checkpoint, 1 GB = 1e9 B; $(( $(date +%s) - START )) s of the ${BUDGET} s budget used"
ratio() {  # ROW_A ROW_B
  awk -F'\t' -v a="$1" -v b="$2" '$1 == a {x = $3} $1 == b {y = $3}
    END {if (x + 0 > 0 && y + 0 > 0) printf "%s / %s: %.2f\n", a, b, x / y}' "$RESULTS"
}
{
  ratio "weightcast cuda, page cache" "pinned H2D (h2d_bench)"
  ratio "weightcast cuda, O_DIRECT" "pinned H2D (h2d_bench)"
  grep -o 'load_into [0-9.]* GB/s, load_state_dict(load_file(cuda)) [0-9.]* GB/s ([0-9.]*x)' "$WORK/py_cuda.log" 2>/dev/null
} | tee "$OUT/ratios.txt"
exit "$FAILED"
