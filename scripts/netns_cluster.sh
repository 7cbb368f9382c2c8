#!/usr/bin/env bash
# A cluster of N nodes on this machine, for tests of what only a real cluster does (ranks on
# other hosts, TCP between them, files on one node only, a link that breaks):
#
#   scripts/netns_cluster.sh run [-n N] [--slots S] [--only-on-node0 DIR] -- COMMAND...
#
# Each node is a network namespace (its own 10.99.0.x/24 on a bridge that lives in a namespace
# of its own: nothing is added to this host's network, and no node has a route out), a UTS
# namespace (host name nodeI, which every node resolves through its own /etc/hosts) and a mount
# namespace (a private /tmp and /dev/shm; DIR is an empty tmpfs on the other nodes). Every node
# still sees this project's tree where it is (bound back over the private /tmp when the tree
# lies under /tmp, as a CI clone may), as a real node sees its installed binaries.
# COMMAND runs on node 0 with:
#   NETNS_CLUSTER_AGENT     an rsh agent for Open MPI: `mpirun --mca plm_rsh_agent "$AGENT"
#                           --hostfile "$NETNS_CLUSTER_HOSTFILE"` starts ranks on the nodes; also
#                           `"$AGENT" nodeI COMMAND...` runs COMMAND on node I (as ssh would:
#                           a shell command line, a clean environment but PATH and HOME)
#   NETNS_CLUSTER_HOSTFILE  "nodeI slots=S" for each node
#   NETNS_CLUSTER_NODES     "node0 node1 ..."; NETNS_CLUSTER_ADDRS their addresses
#   NETNS_CLUSTER_SWITCH    the bridge's namespace; node I's link is its interface "pI"
#                           (`ip netns exec "$NETNS_CLUSTER_SWITCH" ip link set p1 down` cuts
#                           node 1 off; `tc qdisc add dev p1 root tbf ...` slows it)
#   NETNS_CLUSTER_PIDS      "nodeI:PID ...": a process holding each node's namespaces
# and the script exits with COMMAND's status (69 when the cluster cannot be made: not root, no
# `ip`, no namespaces). Everything is removed when COMMAND ends, and on SIGINT, SIGTERM and
# SIGHUP; a run killed with SIGKILL is removed by the next run (its namespaces carry its pid).
#
#   scripts/netns_cluster.sh check    exits 0 where a cluster can be made, else prints why, 77
#   scripts/netns_cluster.sh reap     removes what killed runs left
set -u

readonly tag=wcns  # every namespace of a run is wcns<pid hex>-<node>; see reap
readonly subnet=10.99.0
tree=$(cd "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/.." && pwd)
readonly tree

die() { echo "netns_cluster: $*" >&2; exit 69; }

can_make() {
  [[ $(id -u) == 0 ]] || { echo "not root (network namespaces need CAP_SYS_ADMIN)"; return 1; }
  command -v ip >/dev/null || { echo "no 'ip' (iproute2)"; return 1; }
  command -v nsenter >/dev/null && command -v unshare >/dev/null ||
    { echo "no nsenter/unshare (util-linux)"; return 1; }
  local probe="${tag}probe$$"
  ip netns add "$probe" 2>/dev/null || { echo "cannot create a network namespace here"; return 1; }
  ip netns del "$probe"
}

# Removes the namespaces and files of runs whose process is gone (killed with SIGKILL).
reap() {
  local ns owner
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${tag}[0-9a-f]*-"); do
    owner=${ns#"$tag"}
    owner=$((16#${owner%%-*}))
    if ! kill -0 "$owner" 2>/dev/null || ! grep -qa netns_cluster "/proc/$owner/cmdline" 2>/dev/null; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
      ip netns del "$ns" 2>/dev/null
      rm -rf "/etc/netns/$ns"
    fi
  done
}

agent() {
  # Open MPI calls the agent as ssh: HOST, then the remote command as words of one shell line.
  local host=$1; shift
  local pid=""
  for entry in ${NETNS_CLUSTER_PIDS:-}; do
    [[ ${entry%%:*} == "$host" ]] && pid=${entry#*:}
  done
  [[ -n $pid ]] || { echo "netns_cluster agent: no node '$host' (nodes: ${NETNS_CLUSTER_NODES:-none})" >&2; exit 255; }
  exec nsenter --target "$pid" --net --uts --mount -- \
    env -i PATH="$PATH" HOME="${HOME:-/root}" NETNS_CLUSTER_PIDS="$NETNS_CLUSTER_PIDS" \
    NETNS_CLUSTER_NODES="${NETNS_CLUSTER_NODES:-}" NETNS_CLUSTER_AGENT="${NETNS_CLUSTER_AGENT:-}" \
    sh -c "$*"
}

run() {
  local nodes=2 slots=2
  local only_on_node0=""
  while (($#)); do
    case $1 in
      -n) nodes=$2; shift 2 ;;
      --slots) slots=$2; shift 2 ;;
      --only-on-node0) only_on_node0=$(realpath "$2") || die "--only-on-node0 $2: no such directory"; shift 2 ;;
      --) shift; break ;;
      *) die "unknown option '$1' (run [-n N] [--slots S] [--only-on-node0 DIR]... -- COMMAND)" ;;
    esac
  done
  (($#)) || die "no command (run [-n N] -- COMMAND)"
  [[ $nodes =~ ^[0-9]+$ ]] && ((nodes >= 1 && nodes <= 32)) || die "-n $nodes: 1 to 32 nodes"
  local why
  why=$(can_make) || die "cannot make a cluster: $why"
  reap

  local id prefix
  id=$(printf '%x' $$)
  prefix="${tag}${id}"
  local sw="${prefix}-sw"
  local -a holders=()
  child=""
  cleanup() {
    trap - EXIT INT TERM HUP
    [[ -n $child ]] && disown "$child" 2>/dev/null  # killed below; bash would report it
    local ns pid
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${prefix}-"); do
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    done
    for pid in "${holders[@]}"; do kill -9 "$pid" 2>/dev/null; done
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${prefix}-"); do
      ip netns del "$ns" 2>/dev/null
      rm -rf "/etc/netns/$ns"
    done
  }
  trap 'cleanup; exit 69' EXIT
  trap 'cleanup; exit 130' INT
  trap 'cleanup; exit 143' TERM
  trap 'cleanup; exit 129' HUP

  ip netns add "$sw" || die "ip netns add $sw failed"
  ip -n "$sw" link add br0 type bridge || die "no bridge in $sw"
  ip -n "$sw" link set br0 up
  ip -n "$sw" link set lo up
  local hosts="127.0.0.1 localhost"$'\n'
  local names="" addrs="" hostfile
  for ((i = 0; i < nodes; i++)); do
    hosts+="${subnet}.$((i + 1)) node$i"$'\n'
    names+="node$i "
    addrs+="${subnet}.$((i + 1)) "
  done
  for ((i = 0; i < nodes; i++)); do
    local ns="${prefix}-node$i"
    ip netns add "$ns" || die "ip netns add $ns failed"
    mkdir -p "/etc/netns/$ns"
    printf '%s' "$hosts" >"/etc/netns/$ns/hosts"
    printf 'node%s\n' "$i" >"/etc/netns/$ns/hostname"
    ip link add "eth0" netns "$ns" type veth peer name "p$i" netns "$sw" ||
      die "cannot make node $i's link"
    ip -n "$sw" link set "p$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "${subnet}.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    # The node's UTS and mount namespaces, held by a process the agent enters. ip netns exec
    # has bound /etc/netns/NS/hosts over /etc/hosts and mounted the namespace's /sys.
    # The directory only node 0 sees: node 0 binds it back (through a descriptor opened before
    # /tmp was covered, as it may lie under /tmp), the others get an empty tmpfs over it.
    local hide="" dir=$only_on_node0
    if [[ -n $dir ]]; then
      if ((i == 0)); then
        hide="mkdir -p '$dir' && mount --no-canonicalize --bind /proc/self/fd/3 '$dir' &&"
      else
        hide="mkdir -p '$dir' && mount -t tmpfs -o size=1m tmpfs '$dir' &&"
      fi
    fi
    # The project's tree (the CLI, the tests, a venv under build/) comes back the same way.
    local keep="mkdir -p '$tree' && mount --no-canonicalize --bind /proc/self/fd/4 '$tree' &&"
    ip netns exec "$ns" unshare --uts --mount --propagation private sh -c \
      "exec 3<'${dir:-/}' 4<'$tree' && hostname node$i && mount -t tmpfs -o size=256m tmpfs /tmp &&
       mount -t tmpfs -o size=256m tmpfs /dev/shm && $keep $hide exec 3<&- 4<&- &&
       exec sleep 1000000" \
      >/dev/null 2>&1 &
    holders+=("$!")
    disown "$!"  # killed at teardown, which bash would otherwise report
  done
  # Wait until each holder has made its namespaces (its mount table shows the private /tmp).
  local entries=""
  for ((i = 0; i < nodes; i++)); do
    local pid=${holders[$i]} tries=0
    until [[ $(readlink "/proc/$pid/ns/uts" 2>/dev/null) != "$(readlink /proc/self/ns/uts)" ]] &&
      grep -q " /tmp tmpfs " "/proc/$pid/mounts" 2>/dev/null && [[ $(cat /proc/$pid/comm 2>/dev/null) == sleep ]]; do
      kill -0 "$pid" 2>/dev/null || die "node $i's namespaces could not be made"
      ((tries++ < 200)) || die "node $i's namespaces took too long"
      sleep 0.05
    done
    entries+="node$i:$pid "
  done

  # In node 0's own /tmp, seen from here through its holder's root.
  hostfile=/tmp/netns_cluster.hostfile
  for ((i = 0; i < nodes; i++)); do echo "node$i slots=$slots"; done \
    >"/proc/${holders[0]}/root$hostfile" || die "cannot write node 0's hostfile"
  export NETNS_CLUSTER_AGENT
  NETNS_CLUSTER_AGENT=$(realpath "${BASH_SOURCE[0]}")
  export NETNS_CLUSTER_HOSTFILE=$hostfile NETNS_CLUSTER_NODES=${names% }
  export NETNS_CLUSTER_ADDRS=${addrs% } NETNS_CLUSTER_SWITCH=$sw NETNS_CLUSTER_PIDS=${entries% }
  # COMMAND on node 0, with this environment (not the agent's clean one).
  nsenter --target "${holders[0]}" --net --uts --mount -- "$@" &
  child=$!
  wait "$child"
  local status=$?
  trap - EXIT
  cleanup
  exit "$status"
}

case ${1:-} in
  run) shift; run "$@" ;;
  check) why=$(can_make) && exit 0; echo "$why"; exit 77 ;;
  reap) reap ;;
  -h|--help|"") sed -n '2,32p' "$0"; exit 64 ;;
  *) agent "$@" ;;  # as Open MPI's plm_rsh_agent: HOST COMMAND...
esac
