#!/usr/bin/env bash
# spec.trainer.sync on a slow link: 2 pods x 2 ranks (spec.ranksPerWorker: 2), each pod a network
# namespace ("host") joined to a bridge by a veth pair whose both directions are limited with tc's
# token bucket filter, as bench/pods/run.sh builds them. Needs root (ip netns, tc).
#
#   bench/sync/run.sh [BUILD_DIR]      RATES="1gbit 100mbit" STEPS=200 HIDDEN=1024
#
# The job: a 784-HIDDEN-10 ReLU MLP on Fashion-MNIST (the wider layer makes communication
# matter), batch 64 per rank, SGD with momentum 0.9, one BLAS thread per rank, the same STEPS
# (the same samples) for every strategy: plain fp32 all-reduce, bf16 compression, localSGD with
# H = 4, 8, 16, and dgc at 99.9% sparsity (warm-up over the first quarter of the steps), run one
# after the other on the same link. Per run: global samples/s over the timed steps and the
# test accuracy after the STEPS, as rank 0 reported them at Leave, the time the STEPS took at that
# rate, and the bytes rank 0 handed to the collectives per step.
set -euo pipefail
BUILD_DIR=${1:-$(cd "$(dirname "$0")/../.." && pwd)/build}
RATES=${RATES:-1gbit 100mbit}
STEPS=${STEPS:-200}
HIDDEN=${HIDDEN:-1024}
for tool in lockstep-worker train_bench_launcher; do
  [[ -x $BUILD_DIR/bin/$tool ]] || { echo "no $BUILD_DIR/bin/$tool: build it" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "bench/sync/run.sh needs root (network namespaces, tc)" >&2; exit 1; }

ID=$$
NET=10.233.$((ID % 250 + 1))
BRIDGE=lsb$ID
WORK=$(mktemp -d /tmp/lockstep-sync-bench.XXXXXX)
cleanup() {
  for h in 0 1; do ip netns delete lsn$ID-$h 2>/dev/null || true; done
  ip link delete "$BRIDGE" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

ip link add "$BRIDGE" type bridge
ip addr add "$NET.1/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
for h in 0 1; do
  ip netns add lsn$ID-$h
  ip link add lsv${ID}o$h type veth peer name lsv${ID}i$h
  ip link set lsv${ID}i$h netns lsn$ID-$h
  ip link set lsv${ID}o$h master "$BRIDGE" up
  ip -n lsn$ID-$h addr add "$NET.$((10 + h))/24" dev lsv${ID}i$h
  ip -n lsn$ID-$h link set lsv${ID}i$h up
  ip -n lsn$ID-$h link set lo up
done

limit() {
  for h in 0 1; do
    tc qdisc replace dev lsv${ID}o$h root tbf rate "$1" burst 1250kb latency 50ms
    ip netns exec lsn$ID-$h tc qdisc replace dev lsv${ID}i$h root tbf rate "$1" burst 1250kb latency 50ms
  done
}

# write_job FILE SYNC COMPRESSION
write_job() {
  cat >"$1" <<YAML
apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: sync-bench}
spec:
  replicas: 2
  ranksPerWorker: 2
  trainer:
    model: {type: mlp, hidden: [$HIDDEN], activation: relu}
    data:
      format: idx
      train: [file:///usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz,
              file:///usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz]
      test: [file:///usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz,
             file:///usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz]
    batchSize: 64
    steps: $STEPS
    optimizer: {type: sgd, learningRate: 0.05, momentum: 0.9}
    seed: 1
    logIntervalSteps: 100000
    allreduce: {compression: $3}
    sync: $2
  metrics: {port: 0}
YAML
}

# run NAME SYNC COMPRESSION: one line of figures.
run() {
  write_job "$WORK/job.yaml" "$2" "$3"
  local out
  out=$(OPENBLAS_NUM_THREADS=1 timeout 900 "$BUILD_DIR/bin/train_bench_launcher" \
      "$BUILD_DIR/bin/lockstep-worker" "$WORK/job.yaml" 2 --ranks-per-pod 2 --listen "$NET.1" \
      --pod-netns "lsn$ID-0,lsn$ID-1" --pod-hosts "$NET.10,$NET.11" | tail -n 1)
  python3 - "$RATE" "$1" "$STEPS" "$out" <<'PY'
import json, sys
rate, name, steps, line = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
r = json.loads(line)
sps = r["samples_per_second"]
seconds = steps * 256 / sps if sps > 0 else float("nan")
print(f"{rate:<8} {name:<14} {sps:12.0f} {seconds:10.1f} {100 * r['eval_accuracy']:9.2f} "
      f"{r['wire_bytes_per_step'] / 1e6:14.3f}")
PY
}

export LOCKSTEP_LOG_LEVEL=warning
printf '%-8s %-14s %12s %10s %9s %14s\n' link strategy samples/s seconds accuracy MB/step/rank
for RATE in $RATES; do
  limit "$RATE"
  run allreduce "{strategy: allreduce}" none
  run bf16 "{strategy: allreduce}" bf16
  for h in 4 8 16; do run "localSGD-H$h" "{strategy: localSGD, localSGD: {period: $h}}" none; done
  run dgc-99.9% "{strategy: dgc, dgc: {sparsity: 0.999, warmupSteps: $((STEPS / 4))}}" none
done
