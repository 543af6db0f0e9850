#!/usr/bin/env bash
# Pipeline parallelism (spec.trainer.pipeline) through `lockstep run`, on the CPU, one process per
# rank:
#  - the bubble: a pipeline of STAGES stages x 1 replica for each schedule (gpipe, 1f1b) and each
#    micro-batch count of MICRO, the share of each stage's pipeline time spent waiting on its
#    neighbours (the worker's "pipeline stage" log line, mean over the stages), beside the theory
#    for stages of equal cost, (P - 1) / (M + P - 1);
#  - activation memory per stage: the bytes of the stage's activation buffers (workspaces, kept
#    inputs, message buffers) for gpipe, 1f1b and 1f1b with recompute;
#  - throughput against pure data parallelism at the same number of ranks and global batch,
#    with `lockstep validate`'s memory per rank beside it.
# The model is a deep GEMM-bound MLP (784-W-...-W-10, DEPTH hidden layers of width W) on
# Fashion-MNIST, a global batch of BATCH, STEPS steps, one BLAS thread per rank.
#
#   bench/pipeline/run.sh [BUILD_DIR]      STAGES=2 MICRO="1 2 4 8 16" WIDTH=1024 DEPTH=6
#                                          BATCH=256 STEPS=40
# Run it with at least STAGES cores: on fewer the stages take turns on a core and the wait
# includes that turn.
set -euo pipefail
BUILD_DIR=${1:-$(cd "$(dirname "$0")/../.." && pwd)/build}
STAGES=${STAGES:-2}
MICRO=${MICRO:-1 2 4 8 16}
WIDTH=${WIDTH:-1024}
DEPTH=${DEPTH:-6}
BATCH=${BATCH:-256}
STEPS=${STEPS:-40}
LOCKSTEP=$BUILD_DIR/bin/lockstep
[[ -x $LOCKSTEP ]] || { echo "no $LOCKSTEP: build it" >&2; exit 1; }
WORK=$(mktemp -d /tmp/lockstep-pipeline-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OPENBLAS_NUM_THREADS=1 LOCKSTEP_LOG_LEVEL=info
DATA=/usr/share/datasets/fashion-mnist

hidden=$(python3 -c "print(', '.join(['$WIDTH'] * $DEPTH))")

# manifest NAME REPLICAS BATCH_PER_REPLICA PIPELINE_LINE
manifest() {
  cat >"$WORK/$1.yaml" <<EOF
apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: $1}
spec:
  replicas: $2
  trainer:
    model: {type: mlp, hidden: [$hidden], activation: relu}
    data:
      format: idx
      train: [$DATA/train-images-idx3-ubyte.gz, $DATA/train-labels-idx1-ubyte.gz]
    batchSize: $3
    steps: $STEPS
    optimizer: {type: sgd, learningRate: 0.01, momentum: 0.9}
    logIntervalSteps: 10
$4
  runPolicy: {restartPolicy: Never}
  metrics: {port: 0}
EOF
  echo "$WORK/$1.yaml"
}

# run NAME MANIFEST: prints "samples/s mean_bubble slot_bytes(max over stages)"
run() {
  local logs=$WORK/$1-logs
  "$LOCKSTEP" run "$2" --summary "$WORK/$1.json" --log-dir "$logs" >/dev/null 2>&1 ||
    { echo "run $1 failed; logs in $logs" >&2; trap - EXIT; exit 1; }
  python3 - "$WORK/$1.json" "$logs" <<'EOF'
import json, pathlib, re, sys
summary = json.load(open(sys.argv[1]))
bubbles, slots = [], []
for log in pathlib.Path(sys.argv[2]).glob("*.log"):
    for m in re.finditer(r"pipeline stage \d+ of \d+: .*\(bubble ([0-9.]+)\).* of (\d+) bytes",
                         log.read_text()):
        bubbles.append(float(m.group(1)))
        slots.append(int(m.group(2)))
bubble = sum(bubbles) / len(bubbles) if bubbles else float("nan")
print(f"{summary['samples_per_second']:.0f} {bubble:.3f} {max(slots) if slots else 0}")
EOF
}

memory() {  # the per-rank estimate lockstep validate prints (with the pipeline when it has one)
  "$LOCKSTEP" validate "$1" | sed -n 's/.*estimated memory per rank: \([0-9.]* [KMG]iB\).*/\1/p'
}

echo "model 784-$(echo "$hidden" | tr -d ' ' | tr ',' '-')-10, global batch $BATCH, $STEPS steps," \
     "$STAGES ranks, $(nproc) cores"
printf '\n%-8s %-6s %9s %9s %10s %12s\n' schedule M bubble theory samples/s slot_bytes
for schedule in gpipe 1f1b; do
  for m in $MICRO; do
    name=p$STAGES-$schedule-m$m
    file=$(manifest "$name" "$STAGES" "$BATCH" \
      "    pipeline: {stages: $STAGES, microBatches: $m, schedule: $schedule}")
    read -r rate bubble slot_bytes < <(run "$name" "$file")
    theory=$(python3 -c "print(f'{($STAGES - 1) / ($m + $STAGES - 1):.3f}')")
    printf '%-8s %-6s %9s %9s %10s %12s\n' "$schedule" "$m" "$bubble" "$theory" "$rate" \
      "$slot_bytes"
  done
done

m=$(echo "$MICRO" | awk '{print $NF}')
file=$(manifest "p$STAGES-recompute" "$STAGES" "$BATCH" \
  "    pipeline: {stages: $STAGES, microBatches: $m, schedule: 1f1b, recompute: true}")
read -r rate bubble slot_bytes < <(run "p$STAGES-recompute" "$file")
printf '%-8s %-6s %9s %9s %10s %12s\n' "1f1b+rc" "$m" "$bubble" "-" "$rate" "$slot_bytes"

echo
printf '%-28s %10s %16s\n' layout samples/s memory/rank
pipe=$(manifest "pipe" "$STAGES" "$BATCH" \
  "    pipeline: {stages: $STAGES, microBatches: $m, schedule: 1f1b}")
read -r rate _ _ < <(run pipe "$pipe")
printf '%-28s %10s %16s\n' "pipeline $STAGES stages, M=$m" "$rate" "$(memory "$pipe")"
dp=$(manifest "dp" "$STAGES" $((BATCH / STAGES)) "")
read -r rate _ _ < <(run dp "$dp")
printf '%-28s %10s %16s\n' "data parallel, $STAGES ranks" "$rate" "$(memory "$dp")"
