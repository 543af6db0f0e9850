# The network: a bridge in the host's namespace joins one network namespace per node (as kind's
# docker network joins its node containers). Each node routes its own pod subnet (the CNI bridge
# inside it) and reaches the other node's through that node's address; the host, where the
# control plane listens, routes both. No masquerading: a pod's address is what its peers see.
# Sourced.

make_network() {
  ip link add "$bridge" type bridge
  ip addr add "$control_plane_ip/24" dev "$bridge"
  ip link set "$bridge" up
  local node other
  for node in "${nodes[@]}"; do
    ip netns add "$node"
    ip link add "${node_veth[$node]}" type veth peer name eth0 netns "$node"
    ip link set "${node_veth[$node]}" master "$bridge" up
    ip -n "$node" addr add "${node_ip[$node]}/24" dev eth0
    ip -n "$node" link set lo up
    ip -n "$node" link set eth0 up
    ip -n "$node" route add default via "$control_plane_ip"
    ip netns exec "$node" sysctl -q -w net.ipv4.ip_forward=1
    # Pod-to-Service traffic between pods of one node's bridge passes iptables (kube-proxy's
    # DNAT is undone on the reply): what kubeadm's preflight asks of every node.
    ip netns exec "$node" sysctl -q -w net.bridge.bridge-nf-call-iptables=1
    for other in "${nodes[@]}"; do
      [[ $other == "$node" ]] && continue
      ip -n "$node" route add "${node_pod_cidr[$other]}" via "${node_ip[$other]}"
    done
    ip route add "${node_pod_cidr[$node]}" via "${node_ip[$node]}" dev "$bridge"
  done
}

# Removes what make_network made (the routes go with the bridge); what is not there is skipped.
remove_network() {
  local node
  for node in "${nodes[@]}"; do
    ip link del "${node_veth[$node]}" 2>/dev/null || true
    ip netns del "$node" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
}
