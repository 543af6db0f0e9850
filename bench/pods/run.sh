#!/usr/bin/env bash
# Hierarchical (shm+gloo) vs flat (Gloo over every rank) all-reduce for 2 pods x 2 ranks, each pod
# a network namespace ("host") joined to a bridge by a veth pair whose both directions are limited
# with tc's token bucket filter. float32 sum, 1/16/64 MiB; bus bandwidth as nccl-tests defines it
# for 4 ranks: busbw = 2(n-1)/n * bytes / time. Needs root (ip netns, tc).
#
#   bench/pods/run.sh [BUILD_DIR] [ITERS] [WARMUP]     RATES="1gbit 10gbit" SIZES_MIB=1,16,64
#
# On a limited link a flat ring over 4 ranks in 2 pods sends 1.5x the buffer across it each way
# per all-reduce, the hierarchy 1x (each local rank's 1/2 of the buffer, both directions): 1.5x
# is the ceiling of hierarchical / flat.
set -euo pipefail
BUILD_DIR=${1:-$(cd "$(dirname "$0")/../.." && pwd)/build}
ITERS=${2:-5}
WARMUP=${3:-1}
SIZES=${SIZES_MIB:-1,16,64}
RATES=${RATES:-1gbit 10gbit}
BIN=$BUILD_DIR/bin/allreduce_bench
[[ -x $BIN ]] || { echo "no $BIN: build the allreduce_bench target" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "bench/pods/run.sh needs root (network namespaces, tc)" >&2; exit 1; }

ID=$$
NET=10.232.$((ID % 250 + 1))
BRIDGE=lpb$ID
WORK=$(mktemp -d /tmp/lockstep-pods-bench.XXXXXX)
cleanup() {
  for h in 0 1; do ip netns delete lpn$ID-$h 2>/dev/null || true; done
  ip link delete "$BRIDGE" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

ip link add "$BRIDGE" type bridge
ip addr add "$NET.1/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
for h in 0 1; do
  ip netns add lpn$ID-$h
  ip link add lpv${ID}o$h type veth peer name lpv${ID}i$h
  ip link set lpv${ID}i$h netns lpn$ID-$h
  ip link set lpv${ID}o$h master "$BRIDGE" up
  ip -n lpn$ID-$h addr add "$NET.$((10 + h))/24" dev lpv${ID}i$h
  ip -n lpn$ID-$h link set lpv${ID}i$h up
  ip -n lpn$ID-$h link set lo up
done
HOST0=$NET.10
HOST1=$NET.11
# Ranks 0,1 in pod 0 and 2,3 in pod 1 (ranks numbered pod by pod).
HOSTS=$HOST0,$HOST0,$HOST1,$HOST1

limit() {
  for h in 0 1; do
    tc qdisc replace dev lpv${ID}o$h root tbf rate "$1" burst 1250kb latency 50ms
    ip netns exec lpn$ID-$h tc qdisc replace dev lpv${ID}i$h root tbf rate "$1" burst 1250kb latency 50ms
  done
}

# Runs the 4 ranks of one implementation; rank 0's lines go to $WORK/$1.txt.
run4() {
  local name=$1; shift
  rm -rf "$WORK/$name.store"; mkdir -p "$WORK/$name.store"
  local pids=()
  for rank in 3 2 1; do
    ip netns exec lpn$ID-$((rank / 2)) timeout 600 "$BIN" "$@" --rank $rank --size 4 \
        --hosts "$HOSTS" --dir "$WORK/$name.store" --iters "$ITERS" --warmup "$WARMUP" \
        --sizes-mib "$SIZES" >/dev/null &
    pids+=($!)
  done
  ip netns exec lpn$ID-0 timeout 600 "$BIN" "$@" --rank 0 --size 4 --hosts "$HOSTS" \
      --dir "$WORK/$name.store" --iters "$ITERS" --warmup "$WARMUP" --sizes-mib "$SIZES" \
      >"$WORK/$name.txt"
  wait "${pids[@]}"
}

export LOCKSTEP_LOG_LEVEL=warning
printf '%-8s %-8s %12s %12s %14s\n' link size flat_GB/s hier_GB/s hier/flat
for rate in $RATES; do
  limit "$rate"
  run4 flat --impl lockstep
  run4 hier --impl hierarchical
  paste "$WORK/flat.txt" "$WORK/hier.txt" | awk -v rate="$rate" \
      '{ printf "%-8s %-8s %12.3f %12.3f %13.2fx\n", rate, ($1 / 1048576) "MiB", $3, $6, $6 / $3 }'
done
