#!/usr/bin/env bash
# Ranks that follow the network, measured: 4 hosts in 2 racks, each host a network namespace on
# its rack's bridge, the two bridges joined by one veth pair whose both directions are limited
# with tc's token bucket filter (the link between racks); the links inside a rack are not
# limited. Lockstep's Gloo all-reduce (a ring: each rank sends to the next) runs over the 4 hosts
# with ranks in rack order (r1 r1 r2 r2: what the operator's --topology-keys gives) and
# interleaved (r1 r2 r1 r2: pods numbered as they joined). Needs root (ip netns, tc).
#
#   bench/topology/run.sh [BUILD_DIR]     RATE=200mbit SIZES_MIB=4,16 ITERS=5 WARMUP=2
#                                         TRAIN_STEPS=300 HIDDEN=256
#
# A ring in rack order crosses the inter-rack link once each way; interleaved, every one of its
# four steps crosses it, two flows each way sharing it. Expected: about half the bus bandwidth
# interleaved. Prints busbw (nccl-tests' definition) per size for both orders and their ratio.
# Then the built-in trainer on the same hosts: 4 pods of one rank training a 784-HIDDEN-10 MLP on
# Fashion-MNIST (bench/train/mlp_job.sh), its ranks numbered by the rendezvous service from the
# places train_bench_launcher gives it, as the operator gives it node labels: the racks' order,
# and an interleaving one. Prints global samples/s for both and their ratio.
set -euo pipefail
BUILD_DIR=${1:-$(cd "$(dirname "$0")/../.." && pwd)/build}
RATE=${RATE:-200mbit}
SIZES=${SIZES_MIB:-4,16}
ITERS=${ITERS:-5}
WARMUP=${WARMUP:-2}
BIN=$BUILD_DIR/bin
TRAIN_STEPS=${TRAIN_STEPS:-300}
HIDDEN=${HIDDEN:-256}
for tool in allreduce_bench lockstep-worker train_bench_launcher; do
  [[ -x $BIN/$tool ]] || { echo "no $BIN/$tool: build it" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] ||
  { echo "bench/topology/run.sh needs root (network namespaces, tc)" >&2; exit 1; }

# shellcheck source=../netns_hosts.sh
source "$(dirname "$0")/../netns_hosts.sh"
# shellcheck source=../train/mlp_job.sh
source "$(dirname "$0")/../train/mlp_job.sh"
T=tp$$                          # every name this script makes starts with it
NET=10.234.$(($$ % 250 + 1))    # its own /24
WORK=$(mktemp -d /tmp/lockstep-topology-bench.XXXXXX)
cleanup() {
  for h in 0 1 2 3; do ip netns delete "${T}n$h" 2>/dev/null || true; done
  ip link delete "${T}x0" 2>/dev/null || true   # the inter-rack pair (its peer goes with it)
  for r in 1 2; do ip link delete "${T}r$r" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# Racks: bridges ${T}r1 and ${T}r2, joined by the veth pair ${T}x0 - ${T}x1 (limited).
for r in 1 2; do
  ip link add "${T}r$r" type bridge
  ip link set "${T}r$r" up
done
ip link add "${T}x0" type veth peer name "${T}x1"
ip link set "${T}x0" master "${T}r1" up
ip link set "${T}x1" master "${T}r2" up
for end in x0 x1; do
  tc qdisc replace dev "${T}$end" root tbf rate "$RATE" burst 256kb latency 50ms
done
# Hosts 0 and 1 in rack r1, 2 and 3 in rack r2: ${T}n<h> holding $NET.<10+h>.
for h in 0 1 2 3; do
  netns_host_add "${T}n$h" "${T}v$h" "${T}r$((h / 2 + 1))" "$NET.$((10 + h))/24"
done

# run NAME H0 H1 H2 H3: rank r on host H<r>; rank 0's lines go to $WORK/NAME.txt.
run() {
  local name=$1; shift
  local hosts=("$@") addresses="" r
  for r in 0 1 2 3; do addresses+="${addresses:+,}$NET.$((10 + hosts[r]))"; done
  mkdir -p "$WORK/$name.store"
  local pids=()
  for r in 3 2 1; do
    timeout 600 ip netns exec "${T}n${hosts[r]}" "$BIN/allreduce_bench" --impl lockstep \
        --rank "$r" --size 4 --hosts "$addresses" --dir "$WORK/$name.store" --iters "$ITERS" \
        --warmup "$WARMUP" --sizes-mib "$SIZES" >/dev/null &
    pids+=($!)
  done
  timeout 600 ip netns exec "${T}n${hosts[0]}" "$BIN/allreduce_bench" --impl lockstep \
      --rank 0 --size 4 --hosts "$addresses" --dir "$WORK/$name.store" --iters "$ITERS" \
      --warmup "$WARMUP" --sizes-mib "$SIZES" >"$WORK/$name.txt"
  for pid in "${pids[@]}"; do wait "$pid"; done
}

export LOCKSTEP_LOG_LEVEL=warning
run racks 0 1 2 3
run interleaved 0 2 1 3

echo "4 hosts, 2 racks, inter-rack link $RATE each way; Gloo ring all-reduce, float32"
printf '%-8s %18s %22s %8s\n' size rack_order_GB/s interleaved_GB/s ratio
paste -d' ' "$WORK/racks.txt" "$WORK/interleaved.txt" |
  while read -r bytes _ rbw _ _ ibw; do
    printf '%-8s %18s %22s %8s\n' "$((bytes >> 20))MiB" "$rbw" "$ibw" \
        "$(awk -v r="$rbw" -v i="$ibw" 'BEGIN {printf "%.2f", r / i}')"
  done

# train PLACES: global samples/s of the MLP job with pod h at PLACES[h] (levels joined by '/').
# The rendezvous service listens in rack r1, on the bridge; rack r2 reaches it over the link.
train() {
  OPENBLAS_NUM_THREADS=1 timeout 900 "$BIN/train_bench_launcher" "$BIN/lockstep-worker" \
      "$WORK/job.yaml" 4 --listen "$NET.1" --pod-netns "${T}n0,${T}n1,${T}n2,${T}n3" \
      --pod-hosts "$NET.10,$NET.11,$NET.12,$NET.13" --pod-places "$1" | tail -n 1 |
    python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["samples_per_second"])'
}
ip addr add "$NET.1/24" dev "${T}r1"
write_mlp_job "$WORK/job.yaml" topology-bench 4 1 "$TRAIN_STEPS" "$HIDDEN"
# Racks: hosts 0 1 | 2 3. Interleaved: the groups x = {0, 2} and y = {1, 3} number the hosts
# 0 2 1 3, so every ring step crosses between the racks.
rack_sps=$(train "r1/h0,r1/h1,r2/h2,r2/h3")
interleaved_sps=$(train "x/h0,y/h1,x/h2,y/h3")
echo
echo "MLP 784-$HIDDEN-10 on Fashion-MNIST, 4 pods x 1 rank, batch 64 per rank, $TRAIN_STEPS steps"
printf '%-8s %18s %22s %8s\n' "" rack_order interleaved ratio
printf '%-8s %18.0f %22.0f %8s\n' samples/s "$rack_sps" "$interleaved_sps" \
    "$(awk -v r="$rack_sps" -v i="$interleaved_sps" 'BEGIN {printf "%.2f", r / i}')"
