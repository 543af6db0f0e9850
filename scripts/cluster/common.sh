# Shared by scripts/cluster.sh and its parts: where the cluster lives, its addresses, and how its
# daemons are started and stopped. Sourced, never run.

# Everything `up` creates lies under $state (removed by `down`); builds are cached under $cache.
state=${LOCKSTEP_CLUSTER_DIR:-/var/lib/lockstep-cluster}
cache=${LOCKSTEP_CACHE_DIR:-${HOME:-/tmp}/.cache/lockstep}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build_dir=${LOCKSTEP_BUILD_DIR:-$repo/build}

# The cluster's own addresses (documentation and private ranges no host here uses): the bridge
# that joins the nodes, as kind's docker network joins its node containers; the control plane
# listens on the bridge's address in the host's network namespace.
readonly bridge=lockstep0
readonly bridge_cidr=172.30.0.0/24
readonly control_plane_ip=172.30.0.1
readonly service_cidr=10.96.0.0/16
readonly kubernetes_service_ip=10.96.0.1
readonly cluster_cidr=10.244.0.0/16
readonly apiserver_port=6443
readonly etcd_port=2379
readonly etcd_peer_port=2380

# The nodes: name, address, pod subnet, labels. Each is a network namespace of that name, a mount
# namespace (its /var/lib/kubelet, /var/lib/containerd, /run/containerd, /var/log/pods ... are its
# own, as on a machine of its own), and a cgroup of that name holding its daemons and pods.
readonly nodes=(lockstep-node-1 lockstep-node-2)
declare -A node_ip=([lockstep-node-1]=172.30.0.11 [lockstep-node-2]=172.30.0.12)
declare -A node_pod_cidr=([lockstep-node-1]=10.244.1.0/24 [lockstep-node-2]=10.244.2.0/24)
declare -A node_veth=([lockstep-node-1]=lsv-node-1 [lockstep-node-2]=lsv-node-2)
# Topology a scheduler can place by: one zone and block, a rack each.
declare -A node_labels=(
  [lockstep-node-1]=topology.kubernetes.io/region=local,topology.kubernetes.io/zone=zone-a,topology.lockstep.io/block=block-1,topology.lockstep.io/rack=rack-1
  [lockstep-node-2]=topology.kubernetes.io/region=local,topology.kubernetes.io/zone=zone-a,topology.lockstep.io/block=block-1,topology.lockstep.io/rack=rack-2
)

readonly cgroup_root=/sys/fs/cgroup

say() { echo "cluster.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# The directories a node's mount namespace puts over the host's paths, and where they come from.
node_paths=(/var/lib/kubelet /var/lib/containerd /run/containerd /var/log/pods /var/log/containers
            /var/lib/cni /etc/cni/net.d /run/netns)

# cgroup v1 hierarchies (the controllers' mounts, and the named systemd one) that hold a node.
cgroup_hierarchies() {
  local d
  for d in "$cgroup_root"/*/; do
    d=${d%/}
    [[ -f "$d/cgroup.procs" && "$(basename "$d")" != unified ]] && echo "$d"
  done
}

# Makes cgroup PATH (relative, e.g. lockstep-node-1/system) in every hierarchy; cpuset needs its
# cpus and mems set before a task may join.
make_cgroup() {
  local path=$1 h part sofar
  while read -r h; do
    sofar=$h
    for part in ${path//\// }; do
      sofar+=/$part
      mkdir -p "$sofar"
      if [[ -f "$sofar/cpuset.cpus" && -z "$(cat "$sofar/cpuset.cpus")" ]]; then
        cat "$(dirname "$sofar")/cpuset.cpus" >"$sofar/cpuset.cpus"
        cat "$(dirname "$sofar")/cpuset.mems" >"$sofar/cpuset.mems"
      fi
    done
  done < <(cgroup_hierarchies)
}

# Every process of cgroup PATH and below (from the pids hierarchy, which every task is in).
cgroup_pids() {
  local dir="$cgroup_root/pids/$1"
  [[ -d "$dir" ]] || return 0
  find "$dir" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -un
}

# Removes cgroup PATH and its children from every hierarchy, deepest first (empty ones only).
remove_cgroup() {
  local h
  while read -r h; do
    [[ -d "$h/$1" ]] && find "$h/$1" -depth -type d -exec rmdir {} \; 2>/dev/null
  done < <(cgroup_hierarchies)
  return 0
}

# start_daemon NAME [--node NODE] -- COMMAND...: runs COMMAND in the background, in its own
# session, logging to $state/logs/NAME.log, its pid in $state/pids/NAME. With --node it runs in
# the node's network and mount namespaces and its cgroup NODE/system.
start_daemon() {
  local name=$1; shift
  local node=""
  if [[ $1 == --node ]]; then node=$2; shift 2; fi
  [[ $1 == -- ]] && shift
  mkdir -p "$state/logs" "$state/pids"
  local log="$state/logs/$name.log"
  if [[ -n "$node" ]]; then
    local procs=() h
    while read -r h; do procs+=("$h/$node/system/cgroup.procs"); done < <(cgroup_hierarchies)
    # The wrapper joins the cgroup, then becomes the daemon inside the node's namespaces.
    setsid bash -c '
      n=$1; shift
      for ((i = 0; i < n; i++)); do echo $$ >"$1"; shift; done
      exec nsenter --net="$1" --mount="$2" -- "${@:3}"' \
      _ "${#procs[@]}" "${procs[@]}" "/run/netns/$node" "$state/ns/$node" "$@" \
      </dev/null >>"$log" 2>&1 &
  else
    setsid "$@" </dev/null >>"$log" 2>&1 &
  fi
  echo $! >"$state/pids/$name"
}

daemon_running() {
  local pid
  pid=$(cat "$state/pids/$1" 2>/dev/null) && [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

# stop_pids SECONDS PID...: SIGTERM, then SIGKILL to those still alive after SECONDS.
stop_pids() {
  local seconds=$1; shift
  [[ $# -gt 0 ]] || return 0
  kill -TERM "$@" 2>/dev/null || true
  local deadline=$((SECONDS + seconds)) pid alive
  while ((SECONDS < deadline)); do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.2
  done
  kill -KILL "$@" 2>/dev/null || true
}

stop_daemon() {
  local pid
  pid=$(cat "$state/pids/$1" 2>/dev/null) || return 0
  stop_pids "${2:-10}" "$pid"
  rm -f "$state/pids/$1"
}

# wait_for SECONDS WHAT COMMAND...: runs COMMAND until it succeeds, at most SECONDS.
wait_for() {
  local seconds=$1 what=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { say "$what: not within ${seconds}s"; return 1; }
    sleep 0.3
  done
}

kubectl_admin() { kubectl --kubeconfig "$state/admin.kubeconfig" "$@"; }
