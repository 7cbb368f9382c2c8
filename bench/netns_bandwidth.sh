#!/usr/bin/env bash
# Bandwidth against the wire's limit: N nodes × S ranks of scripts/netns_cluster.sh, the
# checkpoint on node 0 only, node 1's link shaped with `tc tbf` to each RATE; for each placement
# the bytes that left node 0 (its eth0's tx_bytes, before and after the job) against the
# least the placement needs, and the load time against those bytes ÷ the link rate.
#
#   sudo bench/netns_bandwidth.sh [BUILD_DIR] [PARAMS]
#   env: RATES ("200mbit 1gbit"; "none": no shaping, what the CPUs manage), PLACEMENTS
#        ("fsdp replicate"), NODES (2), SLOTS (2), BENCH_DIR (/tmp: where the checkpoint goes),
#        JOB_TIMEOUT (120 s per mpirun), CHUNK_SIZE (the config's default), TRANSPORT (mpi;
#        tcp: weightcast's own data plane, started by mpirun all the same)
#
# The least a placement needs to send off node 0, from the checkpoint's header (not from
# weightcast): fsdp, the local shards of the ranks on other nodes (dim 0 in world-size chunks
# of ceil(rows / world), 0-dim tensors whole, torch's FSDP2 Shard(0)); replicate, the tensor
# bytes once to each other node (a per-node relay, as transport tcp has; MPI's broadcast tree
# may send more, which the ratio shows). With 2 nodes node 0's bytes all go to node 1, so shaping node 1's link
# (its switch port p1, traffic towards the node) bounds them at RATE. The bytes off node 0
# count everything the job sent: Open MPI's launch and wire-up, the control plane, TCP/IP.
# Load s is the slowest rank's report `seconds` (first read to last landing); mpirun wall s
# adds the launch, the rendezvous and the plan.
#
# Pick rates well below what the CPUs reach unshaped (RATES=none prints it): above that the
# load is bound by the CPUs, not the wire, and the ratio to bytes ÷ rate means nothing.
set -u
self=$(realpath "$0")
here=$(dirname "$self")
cluster=$(cd "$here/../scripts" && pwd)/netns_cluster.sh

# ---- on node 0 (inside the cluster) -----------------------------------------------------------
if [[ ${1:-} == inner ]]; then
  cli=$2 ckpt=$3
  tx() { ip -j -s link show dev eth0 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["bytes"])'; }
  np=$(($(wc -w <<<"$NETNS_CLUSTER_NODES") * SLOTS))
  chunk=()
  [[ -n ${CHUNK_SIZE:-} ]] && chunk=(--set "chunk_size=$CHUNK_SIZE")
  port=29600  # a port of its own for each job: none waits on the last one's
  for rate in $RATES; do
    # Node 1's link only: with more nodes the others stay at the bridge's speed.
    ip netns exec "$NETNS_CLUSTER_SWITCH" tc qdisc del dev p1 root 2>/dev/null
    if [[ $rate != none ]]; then
      ip netns exec "$NETNS_CLUSTER_SWITCH" tc qdisc add dev p1 root tbf rate "$rate" burst 1mb latency 50ms ||
        { echo "cannot shape p1 to $rate" >&2; exit 1; }
    fi
    for placement in $PLACEMENTS; do
      port=$((port + 1))
      for node in $NETNS_CLUSTER_NODES; do "$NETNS_CLUSTER_AGENT" "$node" 'rm -f /tmp/bw.*.json'; done
      before=$(tx)
      begin=$(date +%s.%N)
      timeout "${JOB_TIMEOUT:-120}" mpirun --allow-run-as-root --hostfile "$NETNS_CLUSTER_HOSTFILE" \
        --mca plm_rsh_agent "$NETNS_CLUSTER_AGENT" -np "$np" \
        "$cli" run --set "checkpoint=$ckpt" --set device=host --set "transport=${TRANSPORT:-mpi}" \
        --set "placement=$placement" --set timeout=60s --set "rendezvous.port=$port" "${chunk[@]}" \
        --report '/tmp/bw.{rank}.json' --quiet >/tmp/bw.job 2>&1
      status=$?
      end=$(date +%s.%N)
      after=$(tx)
      [[ $status == 0 ]] || { cat /tmp/bw.job >&2; echo "the $placement job at $rate ended with $status" >&2; exit 1; }
      # Each rank's report lies in its own node's /tmp (one line each here): "rank:seconds:bytes".
      ranks=""
      for node in $NETNS_CLUSTER_NODES; do
        # shellcheck disable=SC2016  # expanded on the node
        ranks+=$("$NETNS_CLUSTER_AGENT" "$node" 'for f in /tmp/bw.*.json; do tr -d "\n" <"$f"; echo; done' |
          python3 -c 'import json,sys
for line in sys.stdin:
    if line.strip():
        r = json.loads(line); print("%d:%s:%d" % (r["rank"], r["seconds"], r["bytes"]), end=" ")')
      done
      echo "RESULT $placement $rate $((after - before)) $(echo "$end - $begin" | bc -l) $ranks"
    done
  done
  exit 0
fi

# ---- on this host -----------------------------------------------------------------------------
build=${1:-build}
params=${2:-64M}
cli="$build/tools/weightcast"
[[ -x $cli ]] || cli="$build/weightcast"
[[ -x $cli ]] || { echo "no weightcast CLI in $build" >&2; exit 1; }
cli=$(realpath "$cli")
why=$("$cluster" check) || { echo "SKIPPED: $why"; exit 77; }
command -v mpirun >/dev/null || { echo "SKIPPED: no mpirun"; exit 77; }
export RATES=${RATES:-200mbit 1gbit} PLACEMENTS=${PLACEMENTS:-fsdp replicate}
export SLOTS=${SLOTS:-2} TRANSPORT=${TRANSPORT:-mpi}
nodes=${NODES:-2}

ckpt=$(mktemp -d "${BENCH_DIR:-/tmp}/weightcast-netns-bw.XXXXXX")
trap 'rm -rf "$ckpt"' EXIT
"$cli" synth --params "$params" --dtype BF16 "$ckpt" >/dev/null || { echo "synth failed" >&2; exit 1; }
results=$("$cluster" run -n "$nodes" --slots "$SLOTS" --only-on-node0 "$ckpt" -- \
  bash "$self" inner "$cli" "$ckpt") || { echo "the cluster run failed" >&2; exit 1; }

python3 - "$ckpt" "$nodes" "$SLOTS" "$params" "$results" <<'EOF'
import glob, json, re, struct, sys
ckpt, nodes, slots, params, results = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
world = nodes * slots
dtype_bytes = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
tensors = []  # (shape, bytes per element)
for path in sorted(glob.glob(f"{ckpt}/*.safetensors")):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    tensors += [(t["shape"], dtype_bytes[t["dtype"]]) for k, t in header.items() if k != "__metadata__"]
def elements(shape):
    n = 1
    for d in shape: n *= d
    return n
def local_bytes(shape, size, rank):  # dim 0 in chunks of ceil(rows / world); 0-dim whole
    if not shape: return size
    c = -(-shape[0] // world)
    rows = max(0, min(shape[0], c * (rank + 1)) - min(shape[0], c * rank))
    return rows * elements(shape[1:]) * size
total = sum(elements(s) * b for s, b in tensors)
off_node0 = [r for r in range(world) if r // slots != 0]  # mpirun's by-slot mapping
minimum = {"fsdp": sum(local_bytes(s, b, r) for s, b in tensors for r in off_node0),
           "replicate": total * (nodes - 1)}
print(f"checkpoint: weightcast synth --params {params} --dtype BF16: {len(tensors)} tensors, {total} B of tensor data; "
      f"{nodes} nodes x {slots} ranks; fsdp minimum = local shards of ranks {off_node0[0]}-{off_node0[-1]}")
print()
print("| placement | link rate | bytes off node 0 | placement's minimum | bytes ÷ minimum | load s (slowest rank) | mpirun wall s | bytes ÷ rate, s | load ÷ (bytes ÷ rate) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
for line in results.splitlines():
    if not line.startswith("RESULT "): continue
    _, placement, rate, sent, wall, *ranks = line.split()
    sent, wall = int(sent), float(wall)
    per_rank = {int(r): (float(s), int(b)) for r, s, b in (x.split(":") for x in ranks)}
    if len(per_rank) != world:
        sys.exit(f"{placement} at {rate}: reports from {sorted(per_rank)} only, not all {world} ranks")
    load = max(s for s, _ in per_rank.values())
    if placement == "fsdp":  # weightcast's own count of the far ranks' local shards
        theirs = sum(per_rank[r][1] for r in off_node0)
        if theirs != minimum["fsdp"]:
            print(f"<!-- note: the reports' local-shard bytes of ranks {off_node0} = {theirs}, the header's {minimum['fsdp']} -->")
    m = re.fullmatch(r"([0-9.]+)(kbit|mbit|gbit)", rate)
    ideal = sent * 8 / (float(m[1]) * units[m[2]]) if m else None
    cells = [placement, rate, f"{sent:,}", f"{minimum[placement]:,}", f"{sent / minimum[placement]:.3f}",
             f"{load:.2f}", f"{wall:.2f}", f"{ideal:.2f}" if ideal else "—",
             f"{load / ideal:.2f}" if ideal else f"{sent * 8 / load / 1e9:.2f} Gbit/s reached"]
    print("| " + " | ".join(cells) + " |")
EOF
