#!/usr/bin/env bash
# Training throughput, Lockstep vs PyTorch DDP, side by side on this machine.
#
# The job on both sides: a 784-256-10 ReLU MLP on Fashion-MNIST, per-worker batch 64, SGD with
# momentum 0.9, 1 and 2 worker processes on loopback, one compute thread per process (Lockstep:
# one OpenBLAS thread; PyTorch: torch.set_num_threads(1)), gloo for the all-reduce on both.
# Lockstep: lockstep-worker processes run by train_bench_launcher (the rendezvous service
# in-process, as `lockstep run` does). PyTorch: Debian's python3-torch, DistributedDataParallel.
# Both figures are global samples/s over the timed training steps (setup and data loading
# excluded); each configuration runs REPEATS times and the best run counts (the machine is
# shared; the best run is the one least disturbed).
#
# Usage: bench/train/run.sh [BUILD_DIR] [STEPS] [REPEATS]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD_DIR=${1:-$ROOT/build}
STEPS=${2:-1000}
REPEATS=${3:-3}
BIN=$BUILD_DIR/bin
PYTHON=/usr/bin/python3
WORK=$(mktemp -d /tmp/lockstep-train-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

for tool in "$BIN/lockstep-worker" "$BIN/train_bench_launcher"; do
  [[ -x $tool ]] || { echo "missing $tool: build with -DLOCKSTEP_BUILD_BENCH=ON" >&2; exit 1; }
done
"$PYTHON" -c 'import torch' 2>/dev/null || { echo "python3-torch is not installed" >&2; exit 1; }

# shellcheck source=mlp_job.sh
source "$ROOT/bench/train/mlp_job.sh"
write_mlp_job "$WORK/job.yaml" train-bench 1 1 "$STEPS"

export LOCKSTEP_LOG_LEVEL=warning
# keep_best FIELD BEST LINE: of two JSON lines, the one with the larger FIELD.
keep_best() {
  printf '%s\n%s\n' "$2" "$3" | "$PYTHON" -c "
import json, sys
lines = [json.loads(l) for l in sys.stdin if l.strip()]
print(json.dumps(max(lines, key=lambda x: x['$1'])))"
}

printf '%-8s %16s %16s %8s %18s %12s\n' workers lockstep_samp/s pytorch_samp/s ratio \
    exposed_comm_share efficiency
for world in 1 2; do
  lockstep=""
  torch=""
  # Interleaved, so a change in the machine's load hits both sides alike.
  for _ in $(seq "$REPEATS"); do
    line=$(timeout 900 "$BIN/train_bench_launcher" "$BIN/lockstep-worker" "$WORK/job.yaml" \
        "$world" | tail -n 1)
    lockstep=$(keep_best samples_per_second "$lockstep" "$line")
    line=$(timeout 900 "$PYTHON" "$ROOT/bench/train/torch_ddp.py" --world "$world" \
        --steps "$STEPS" --batch 64 --hidden 256 | tail -n 1)
    torch=$(keep_best samples_per_second "$torch" "$line")
  done
  "$PYTHON" - "$world" "$lockstep" "$torch" <<'PY'
import json, sys
world, lockstep, torch = int(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
ratio = lockstep["samples_per_second"] / torch["samples_per_second"]
exposed = "%.3f" % lockstep["comm_exposed_fraction"] if world > 1 else "-"
efficiency = "%.3f" % lockstep["scaling_efficiency"] if world > 1 else "-"
print("%-8d %16.0f %16.0f %7.2fx %18s %12s" % (world, lockstep["samples_per_second"],
      torch["samples_per_second"], ratio, exposed, efficiency))
PY
done
