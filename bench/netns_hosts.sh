# Sourced by the benchmarks that need two hosts on one machine (bench/pods/run.sh,
# bench/sync/run.sh): network namespaces joined to a bridge by veth pairs, as pods on two nodes
# would be, with tc's token bucket filter to limit the link. Needs root (ip netns, tc).
#
#   netns_hosts_up TAG OCTET   bridge ${TAG}b$$ holding 10.OCTET.<x>.1/24, namespaces
#                              ${TAG}n$$-0 and -1 holding .10 and .11 on veths ${TAG}v$${o,i}<h>;
#                              sets NETNS_NET (the /24's prefix), NETNS_HOST0, NETNS_HOST1;
#                              host h's namespace is ${TAG}n$$-h
#   netns_hosts_limit RATE     both directions of both hosts' links to RATE (tc: 1gbit, 100mbit)
#   netns_hosts_down           removes what netns_hosts_up made (call it from the EXIT trap)
#   netns_host_add NS VETH BRIDGE ADDRESS/LEN [SUFFIX]
#                              one host: namespace NS on BRIDGE through the veth pair
#                              VETHoSUFFIX (on the bridge) - VETHiSUFFIX (in NS, holding
#                              ADDRESS/LEN); bench/topology/run.sh builds its racks with it
#
# Only the script's own addresses are used; $$ keeps concurrent runs apart.
netns_hosts_up() {
  NETNS_PREFIX=$1  # set first: netns_hosts_down removes a half-made set-up too
  local t=$1
  NETNS_NET=10.$2.$(($$ % 250 + 1))
  NETNS_HOST0=$NETNS_NET.10
  NETNS_HOST1=$NETNS_NET.11
  ip link add "${t}b$$" type bridge
  ip addr add "$NETNS_NET.1/24" dev "${t}b$$"
  ip link set "${t}b$$" up
  for h in 0 1; do
    netns_host_add "${t}n$$-$h" "${t}v$$" "${t}b$$" "$NETNS_NET.$((10 + h))/24" "$h"
  done
}

netns_host_add() {
  local ns=$1 outside=$2o${5:-} inside=$2i${5:-}
  ip netns add "$ns"
  ip link add "$outside" type veth peer name "$inside"
  ip link set "$inside" netns "$ns"
  ip link set "$outside" master "$3" up
  ip -n "$ns" addr add "$4" dev "$inside"
  ip -n "$ns" link set "$inside" up
  ip -n "$ns" link set lo up
}

netns_hosts_limit() {
  local t=$NETNS_PREFIX
  for h in 0 1; do
    tc qdisc replace dev "${t}v$$o$h" root tbf rate "$1" burst 1250kb latency 50ms
    ip netns exec "${t}n$$-$h" tc qdisc replace dev "${t}v$$i$h" root tbf rate "$1" \
        burst 1250kb latency 50ms
  done
}

netns_hosts_down() {
  [[ -n ${NETNS_PREFIX:-} ]] || return 0
  local t=$NETNS_PREFIX
  for h in 0 1; do ip netns delete "${t}n$$-$h" 2>/dev/null || true; done
  ip link delete "${t}b$$" 2>/dev/null || true
}
