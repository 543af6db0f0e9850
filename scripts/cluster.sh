#!/usr/bin/env bash
# A two-node Kubernetes 1.20 cluster on this machine, with the project's images and the operator
# installed from its chart (docs/cluster.md):
#
#   scripts/cluster.sh up       # start it; the last line printed is the kubeconfig's path
#   scripts/cluster.sh down     # stop it: no process, mount, namespace, cgroup or rule is left
#   scripts/cluster.sh status   # what runs
#   scripts/cluster.sh kill-node NODE   # the node off the network, then SIGKILL to its daemons and
#                                       # containers (a node lost)
#   scripts/cluster.sh start-node NODE  # start a stopped node again (containerd, kubelet, kube-proxy)
#   scripts/cluster.sh build-image DIR NAME     # DIR's Dockerfile as image NAME, with buildah; prints
#                                               # its archive (docker-archive), cached by content
#   scripts/cluster.sh load-image ARCHIVE...    # an image archive into every node (as `kind load`)
#   scripts/cluster.sh shared-volume NS NAME    # a ReadWriteMany claim NAME in namespace NS on the
#                                               # storage both nodes share (GlusterFS)
#
# Control plane in the host's network namespace on the bridge address 172.30.0.1: etcd, kube-
# apiserver, kube-controller-manager, kube-scheduler. Nodes lockstep-node-1 and -2: each its own
# network and mount namespace and cgroup, with containerd (runc), kubelet and kube-proxy
# (iptables); GlusterFS serves storage both nodes share. Kubernetes comes from
# scripts/kubernetes.sh, the images from the Dockerfile
# (cached under ${LOCKSTEP_CACHE_DIR:-~/.cache/lockstep}); needs root and the packages
# `scripts/setup.sh` installs (Helm installs the chart), and a build of the project.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=cluster/common.sh
source "$here/cluster/common.sh"
source "$here/cluster/pki.sh"
source "$here/cluster/network.sh"
source "$here/cluster/control_plane.sh"
source "$here/cluster/images.sh"
source "$here/cluster/node.sh"
source "$here/cluster/operator.sh"
source "$here/cluster/shared_storage.sh"

usage() { sed -n '2,23p' "$0"; }

cluster_up() {
  [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, mounts, cgroups)"
  if [[ -e "$state/up" ]]; then
    say "a cluster is already up ($state); 'down' first"
    echo "$state/admin.kubeconfig"
    return 0
  fi
  [[ -f "$cgroup_root/pids/cgroup.procs" ]] ||
    die "needs cgroup v1 with the pids controller at $cgroup_root/pids (kubelet 1.20, cgroupfs)"
  if [[ ! -d /proc/sys/net/bridge ]]; then
    modprobe br_netfilter 2>/dev/null || true  # left loaded: kube-proxy's nodes need it
    [[ -d /proc/sys/net/bridge ]] || die "needs the br_netfilter kernel module"
  fi
  if [[ -e "$state" ]]; then cluster_down; fi
  local start=$SECONDS
  k8s_bin=$("$repo/scripts/kubernetes.sh" --bin-dir)
  build_images
  mkdir -p "$state"
  touch "$state/.lockstep-cluster"  # what `down` checks before it removes anything
  echo "$k8s_bin" >"$state/k8s-bin"
  make_pki
  make_network
  start_control_plane
  start_shared_storage
  local node
  for node in "${nodes[@]}"; do
    make_node_namespace "$node"
    write_node_config "$node"
    start_node "$node"
    load_images "$node"
    start_kubelet "$node"
  done
  wait_for 90 "both nodes Ready" nodes_ready
  publish_shared_storage
  install_operator
  touch "$state/up"
  say "up in $((SECONDS - start))s; kubectl --kubeconfig $state/admin.kubeconfig get nodes"
  echo "$state/admin.kubeconfig"
}

nodes_ready() {
  local ready
  ready=$(kubectl_admin get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
          grep -c True)
  [[ "$ready" == "${#nodes[@]}" ]]
}

# Stops everything `up` started, and goes on past a step that fails (a half-finished `up`, a
# killed node), so that one failure does not leave the rest behind; exits non-zero if any step
# failed. Refuses a directory `up` did not make.
cluster_down() {
  if [[ -d "$state" && ! -f "$state/.lockstep-cluster" ]] &&
      [[ -n "$(ls -A "$state" 2>/dev/null)" ]]; then
    die "$state was not made by 'cluster.sh up' (no .lockstep-cluster in it); not removing it"
  fi
  local failed=0 node
  for node in "${nodes[@]}"; do stop_node "$node" || failed=1; done
  stop_shared_storage || failed=1
  stop_control_plane || failed=1
  # Anything of ours a crashed `up` did not record (a daemon started before its pid was written).
  local leftover
  leftover=$(pgrep -f -- "$state/" || true)
  # shellcheck disable=SC2086
  if [[ -n "$leftover" ]]; then stop_pids 5 $leftover || failed=1; fi
  remove_network || failed=1
  if mountpoint -q "$state/ns" 2>/dev/null; then
    umount "$state/ns" 2>/dev/null || umount -l "$state/ns" || failed=1
  fi
  local p
  if [[ -f "$state/made-paths" ]]; then
    while read -r p; do rmdir "$p" 2>/dev/null || true; done <"$state/made-paths"
  fi
  # Mount points left in the host's namespace under $state (none are made there; a check).
  awk -v s="$state/" 'index($2, s) == 1 { print $2 }' /proc/self/mounts | sort -r |
    xargs -r umount -l || failed=1
  rm -rf "$state" || failed=1
  ((failed == 0)) || die "down: some steps failed (see above); run it again"
}

cluster_status() {
  if [[ ! -d "$state" ]]; then echo "down"; return 0; fi
  local name
  for name in "$state"/pids/*; do
    [[ -e "$name" ]] || continue
    name=$(basename "$name")
    if daemon_running "$name"; then echo "running  $name (pid $(cat "$state/pids/$name"))"
    else echo "stopped  $name"; fi
  done
  if [[ -e "$state/up" ]]; then
    kubectl_admin get nodes -o wide 2>&1 || true
    echo "kubeconfig: $state/admin.kubeconfig"
  fi
}

# kill-node: the node drops off the network, then its daemons and every container on it die at
# once, as in a power loss: nothing it held says goodbye (no FIN or RST reaches its peers).
kill_node() {
  local node=$1
  [[ -n "${node_ip[$node]:-}" ]] || die "no node $node (nodes: ${nodes[*]})"
  ip link set "${node_veth[$node]}" down
  kill_node_processes "$node"
}

start_stopped_node() {
  local node=$1
  [[ -n "${node_ip[$node]:-}" ]] || die "no node $node (nodes: ${nodes[*]})"
  if daemon_running "containerd-$node" || daemon_running "kubelet-$node"; then
    die "$node is running; kill-node it first"
  fi
  ip link set "${node_veth[$node]}" up
  k8s_bin=$(cat "$state/k8s-bin")
  start_node "$node"
  start_kubelet "$node"
}

# load-image: each archive into every node's containerd, in the namespace the kubelet's CRI uses;
# a pod then runs it with imagePullPolicy IfNotPresent or Never (no registry is reachable here).
load_image_archives() {
  [[ -e "$state/up" ]] || die "no cluster is up ('up' first)"
  local archive node
  for archive in "$@"; do [[ -s "$archive" ]] || die "no image archive at $archive"; done
  image_archives=("$@")
  for node in "${nodes[@]}"; do
    daemon_running "containerd-$node" || die "$node is stopped ('start-node $node' first)"
    load_images "$node"
  done
  say "loaded into ${nodes[*]}: $*"
}

case "${1:-}" in
  up) cluster_up ;;
  down) cluster_down ;;
  status) cluster_status ;;
  kill-node) [[ $# -eq 2 ]] || { usage; exit 2; }; kill_node "$2" ;;
  start-node) [[ $# -eq 2 ]] || { usage; exit 2; }; start_stopped_node "$2" ;;
  build-image) [[ $# -eq 3 ]] || { usage; exit 2; }
               [[ $(id -u) -eq 0 ]] || die "needs root (buildah's storage is the cluster's)"
               mkdir -p "$images"; build_context_image "$(cd "$2" && pwd)" "$3" ;;
  load-image) [[ $# -ge 2 ]] || { usage; exit 2; }; shift; load_image_archives "$@" ;;
  shared-volume) [[ $# -eq 3 ]] || { usage; exit 2; }
                 [[ -e "$state/up" ]] || die "no cluster is up ('up' first)"
                 shared_volume "$2" "$3" ;;
  -h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac
