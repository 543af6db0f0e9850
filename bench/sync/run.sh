#!/usr/bin/env bash
# spec.trainer.sync on a slow link: 2 pods x 2 ranks (spec.ranksPerWorker: 2), each pod a network
# namespace ("host") joined to a bridge by a veth pair whose both directions are limited with tc's
# token bucket filter, as bench/pods/run.sh builds them. Needs root (ip netns, tc).
#
#   bench/sync/run.sh [BUILD_DIR]      RATES="1gbit 100mbit" STEP_COUNTS="50 100 150 200"
#                                      HIDDEN=1024
#
# The job: a 784-HIDDEN-10 ReLU MLP on Fashion-MNIST (the wider layer makes communication
# matter), batch 64 per rank, SGD with momentum 0.9, one BLAS thread per rank. Strategies: plain
# fp32 all-reduce, bf16 compression, localSGD with H = 4, 8, 16, and dgc at 99.9% sparsity
# (warm-up over 50 steps), one after the other on the same link. Each is trained for every count
# of STEP_COUNTS (a fresh run each: the same samples in the same order, so a shorter run is the
# longer one's beginning) to time how soon it reaches the target accuracy: the fp32 all-reduce's
# after the largest count, minus 1 point. Per strategy: global samples/s over the timed steps of
# the longest run (rank 0's report at Leave), its test accuracy, the time to the target (the
# shortest run reaching it: its steps x 256 samples / its samples/s; "-" if none does) and the
# bytes rank 0 handed to the collectives per step.
set -euo pipefail
BUILD_DIR=${1:-$(cd "$(dirname "$0")/../.." && pwd)/build}
RATES=${RATES:-1gbit 100mbit}
STEP_COUNTS=${STEP_COUNTS:-50 100 150 200}
HIDDEN=${HIDDEN:-1024}
for tool in lockstep-worker train_bench_launcher; do
  [[ -x $BUILD_DIR/bin/$tool ]] || { echo "no $BUILD_DIR/bin/$tool: build it" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "bench/sync/run.sh needs root (network namespaces, tc)" >&2; exit 1; }

# shellcheck source=../netns_hosts.sh
source "$(dirname "$0")/../netns_hosts.sh"
# shellcheck source=../train/mlp_job.sh
source "$(dirname "$0")/../train/mlp_job.sh"
WORK=$(mktemp -d /tmp/lockstep-sync-bench.XXXXXX)
cleanup() {
  netns_hosts_down
  rm -rf "$WORK"
}
trap cleanup EXIT
netns_hosts_up ls 233
NET=$NETNS_NET

# write_job FILE SYNC COMPRESSION STEPS
write_job() {
  write_mlp_job "$1" sync-bench 2 2 "$4" "$HIDDEN" "    allreduce: {compression: $3}
    sync: $2"
}

# run NAME SYNC COMPRESSION: one line per step count in $WORK/NAME.runs (steps samples/s
# accuracy bytes/step).
run() {
  : >"$WORK/$1.runs"
  for steps in $STEP_COUNTS; do
    write_job "$WORK/job.yaml" "$2" "$3" "$steps"
    OPENBLAS_NUM_THREADS=1 timeout 900 "$BUILD_DIR/bin/train_bench_launcher" \
        "$BUILD_DIR/bin/lockstep-worker" "$WORK/job.yaml" 2 --ranks-per-pod 2 --listen "$NET.1" \
        --pod-netns "lsn$$-0,lsn$$-1" --pod-hosts "$NETNS_HOST0,$NETNS_HOST1" | tail -n 1 |
      python3 -c 'import json, sys; r = json.loads(sys.stdin.read()); print(sys.argv[1],
          r["samples_per_second"], r["eval_accuracy"], r["wire_bytes_per_step"])' "$steps" \
      >>"$WORK/$1.runs"
  done
}

# report RATE NAME...: one row per strategy against the target set by the first NAME.
report() {
  python3 - "$WORK" "$@" <<'PY'
import sys
work, rate, names = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = {n: [tuple(float(x) for x in line.split()) for line in open(f"{work}/{n}.runs")]
        for n in names}
target = runs[names[0]][-1][2] - 0.01
for n in names:
    steps, sps, accuracy, wire = runs[n][-1]
    reached = [r for r in runs[n] if r[2] >= target and r[1] > 0]
    to_target = f"{reached[0][0] * 256 / reached[0][1]:.1f} s @ {int(reached[0][0])}" if reached else "-"
    print(f"{rate:<8} {n:<14} {sps:10.0f} {100 * accuracy:9.2f} {to_target:>14} "
          f"{wire / 1e6:13.3f}")
print(f"{rate:<8} target: {100 * target:.2f}% (fp32 all-reduce after {int(runs[names[0]][-1][0])} steps, minus 1 point)")
PY
}

export LOCKSTEP_LOG_LEVEL=warning
printf '%-8s %-14s %10s %9s %14s %13s\n' link strategy samples/s accuracy to_target MB/step/rank
for RATE in $RATES; do
  netns_hosts_limit "$RATE"
  run allreduce "{strategy: allreduce}" none
  run bf16 "{strategy: allreduce}" bf16
  for h in 4 8 16; do run "localSGD-H$h" "{strategy: localSGD, localSGD: {period: $h}}" none; done
  run dgc-99.9% "{strategy: dgc, dgc: {sparsity: 0.999, warmupSteps: 50}}" none
  report "$RATE" allreduce bf16 localSGD-H4 localSGD-H8 localSGD-H16 dgc-99.9%
done
