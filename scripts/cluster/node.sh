# A node: a mount namespace whose /var/lib/kubelet, /var/lib/containerd, /run/containerd,
# /var/log/pods, /var/lib/cni, /etc/cni/net.d and /run/netns are directories of its own (two
# kubelets on one filesystem would garbage-collect each other's pod logs), containerd with runc,
# the kubelet and kube-proxy, all in the node's network namespace and cgroup. Sourced.

node_dir() { echo "$state/nodes/$1"; }

# The persistent mount namespace of NODE, made once: $state/ns is a private bind mount so that
# the namespace files on it do not propagate (mount namespaces cannot hold themselves).
make_node_namespace() {
  local node=$1 dir p
  dir=$(node_dir "$node")
  if ! mountpoint -q "$state/ns"; then
    mkdir -p "$state/ns"
    mount --bind "$state/ns" "$state/ns"
    mount --make-private "$state/ns"
  fi
  touch "$state/ns/$node"
  for p in "${node_paths[@]}"; do
    mkdir -p "$dir/fs$p"
    # A host path made here for the bind's target is recorded, to be removed by `down`.
    if [[ ! -e "$p" ]]; then mkdir -p "$p"; echo "$p" >>"$state/made-paths"; fi
  done
  unshare --mount="$state/ns/$node" --propagation private -- bash -euc '
    dir=$1; shift
    for p in "$@"; do mount --bind "$dir/fs$p" "$p"; done' _ "$dir" "${node_paths[@]}"
}

write_node_config() {
  local node=$1 dir
  dir=$(node_dir "$node")
  mkdir -p "$dir/fs/etc/cni/net.d"
  # Debian's CNI plugins: a bridge with host-local addresses from the node's pod subnet, and
  # portmap for hostPort.
  cat >"$dir/fs/etc/cni/net.d/10-lockstep.conflist" <<CNI
{
  "cniVersion": "0.4.0",
  "name": "lockstep",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "${node_pod_cidr[$node]}"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
CNI
  # restrict_oom_score_adj: this VM refuses even root a lower oom_score_adj, and runc fails the
  # sandbox's -998 without it. The pause image is the one `up` imports (never pulled).
  cat >"$dir/containerd.toml" <<TOML
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
TOML
  # No cluster DNS here (docs/cluster.md), and the host's name server does not answer pods (their
  # addresses are not masqueraded): pods get a resolv.conf whose lookups fail at once instead of
  # after the resolver's timeouts (PyTorch's c10d looks its peers' names up: init_process_group
  # of 2 ranks took 20 s).
  printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$dir/resolv.conf"
  # Image garbage collection off (the images are imported, never pulled back); eviction
  # thresholds low enough for a shared build machine's disk.
  cat >"$dir/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ${node_ip[$node]}
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $pki/kubelet-$node-serving.crt
tlsPrivateKeyFile: $pki/kubelet-$node-serving.key
cgroupDriver: cgroupfs
cgroupRoot: /$node
cgroupsPerQOS: true
clusterDomain: cluster.local
resolvConf: $dir/resolv.conf
failSwapOn: false
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}
nodeStatusUpdateFrequency: 10s
YAML
  cat >"$dir/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $cluster_cidr
hostnameOverride: $node
bindAddress: ${node_ip[$node]}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
clientConnection: {kubeconfig: $state/kube-proxy.kubeconfig}
# A network namespace cannot set the host's conntrack table size or timeouts: leave them.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
}

start_node() {
  local node=$1 dir
  dir=$(node_dir "$node")
  make_cgroup "$node/system"
  start_daemon "containerd-$node" --node "$node" -- containerd --config "$dir/containerd.toml"
  wait_for 30 "containerd on $node" node_exec "$node" ctr --address /run/containerd/containerd.sock version
}

start_kubelet() {
  local node=$1 dir
  dir=$(node_dir "$node")
  start_daemon "kubelet-$node" --node "$node" -- "$k8s_bin/kubelet" \
    --config="$dir/kubelet.yaml" --kubeconfig="$state/kubelet-$node.kubeconfig" \
    --container-runtime=remote \
    --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
    --hostname-override="$node" --node-ip="${node_ip[$node]}" \
    --node-labels="${node_labels[$node]}" --v=1
  start_daemon "kube-proxy-$node" --node "$node" -- "$k8s_bin/kube-proxy" \
    --config="$dir/kube-proxy.yaml" --v=1
}

# node_exec NODE COMMAND...: runs COMMAND in NODE's network and mount namespaces.
node_exec() {
  local node=$1; shift
  nsenter --net="/run/netns/$node" --mount="$state/ns/$node" -- "$@"
}

# Stops NODE: its daemons, then every process left in its cgroup (containers, shims), then its
# mounts (by leaving the namespace) and cgroups.
stop_node() {
  local node=$1
  stop_daemon "kube-proxy-$node" 5
  stop_daemon "kubelet-$node" 5
  stop_daemon "containerd-$node" 5
  kill_node_processes "$node"
  if [[ -e "$state/ns/$node" ]]; then
    umount "$state/ns/$node" 2>/dev/null || true
    rm -f "$state/ns/$node"
  fi
  remove_cgroup "$node"
}

# SIGKILL to every process of NODE's cgroup until none is left (a node losing power).
kill_node_processes() {
  local node=$1 pids deadline=$((SECONDS + 20))
  while pids=$(cgroup_pids "$node") && [[ -n "$pids" ]]; do
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    ((SECONDS < deadline)) || { say "processes of $node survive SIGKILL: $pids"; return 1; }
    sleep 0.1
  done
}
