#!/usr/bin/env bash
# Hierarchical (shm+gloo) vs flat (Gloo over every rank) all-reduce for 2 pods x 2 ranks, each pod
# a network namespace ("host") joined to a bridge by a veth pair whose both directions are limited
# with tc's token bucket filter. float32 sum, 1/16/64 MiB; bus bandwidth as nccl-tests defines it
# for 4 ranks: busbw = 2(n-1)/n * bytes / time. Needs root (ip netns, tc).
#
#   bench/pods/run.sh [BUILD_DIR] [ITERS] [WARMUP]     RATES="1gbit 10gbit" SIZES_MIB=1,16,64
#                                                      TRAIN_STEPS=500 TRAIN_REPEATS=2
#
# Then training throughput on the same hosts: the 784-256-10 MLP on Fashion-MNIST (batch 64 per
# rank, one BLAS thread per rank) as 2 pods x 2 ranks (spec.ranksPerWorker: 2), flat
# (LOCKSTEP_COMM=gloo) against hierarchical (shm+gloo), best of TRAIN_REPEATS interleaved runs;
# global samples/s over the timed steps as rank 0 reports it. TRAIN_STEPS=0 skips it.
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
TRAIN_STEPS=${TRAIN_STEPS:-500}
TRAIN_REPEATS=${TRAIN_REPEATS:-2}
BIN=$BUILD_DIR/bin/allreduce_bench
[[ -x $BIN ]] || { echo "no $BIN: build the allreduce_bench target" >&2; exit 1; }
if ((TRAIN_STEPS > 0)); then
  for tool in lockstep-worker train_bench_launcher; do
    [[ -x $BUILD_DIR/bin/$tool ]] || { echo "no $BUILD_DIR/bin/$tool: build it" >&2; exit 1; }
  done
fi
[[ $(id -u) == 0 ]] || { echo "bench/pods/run.sh needs root (network namespaces, tc)" >&2; exit 1; }

ID=$$
# shellcheck source=../netns_hosts.sh
source "$(dirname "$0")/../netns_hosts.sh"
WORK=$(mktemp -d /tmp/lockstep-pods-bench.XXXXXX)
cleanup() {
  netns_hosts_down
  rm -rf "$WORK"
}
trap cleanup EXIT

netns_hosts_up lp 232
NET=$NETNS_NET
HOST0=$NETNS_HOST0
HOST1=$NETNS_HOST1
# Ranks 0,1 in pod 0 and 2,3 in pod 1 (ranks numbered pod by pod).
HOSTS=$HOST0,$HOST0,$HOST1,$HOST1

limit() { netns_hosts_limit "$1"; }

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

((TRAIN_STEPS > 0)) || exit 0

# shellcheck source=../train/mlp_job.sh
source "$(dirname "$0")/../train/mlp_job.sh"
write_mlp_job "$WORK/job.yaml" pods-bench 2 2 "$TRAIN_STEPS"

# Prints the samples/s of one 2 x 2 training run with communicator $1.
train() {
  LOCKSTEP_COMM=$1 OPENBLAS_NUM_THREADS=1 timeout 600 "$BUILD_DIR/bin/train_bench_launcher" \
      "$BUILD_DIR/bin/lockstep-worker" "$WORK/job.yaml" 2 --ranks-per-pod 2 --listen "$NET.1" \
      --pod-netns "lpn$ID-0,lpn$ID-1" --pod-hosts "$HOST0,$HOST1" | tail -n 1 |
      sed -n 's/.*"samples_per_second":\([0-9.e+]*\).*/\1/p'
}

echo
printf '%-8s %18s %18s %10s\n' link flat_samples/s hier_samples/s hier/flat
for rate in $RATES; do
  limit "$rate"
  flat=0
  hier=0
  # Interleaved, so a change in the machine's load hits both alike; the best run counts.
  for _ in $(seq "$TRAIN_REPEATS"); do
    flat=$(printf '%s\n%s\n' "$flat" "$(train gloo)" | sort -g | tail -n 1)
    hier=$(printf '%s\n%s\n' "$hier" "$(train shm+gloo)" | sort -g | tail -n 1)
  done
  awk -v rate="$rate" -v flat="$flat" -v hier="$hier" \
      'BEGIN { printf "%-8s %18.0f %18.0f %9.2fx\n", rate, flat, hier, (flat > 0 ? hier / flat : 0) }'
done
