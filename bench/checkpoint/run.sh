#!/usr/bin/env bash
# Checkpoint cost benchmark (see checkpoint_bench.cc): async vs sync stall, and checkpoint write
# throughput vs a plain fwrite+fsync writer, on the same file system, side by side in one run.
#   bench/checkpoint/run.sh [BUILD_DIR] [DIR] [REPEATS]   (DIR: where to write; default a temp dir)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
dir=${2:-$(mktemp -d -t lockstep-ckpt-bench-XXXXXX)}
repeats=${3:-7}
for optimizer in sgd adamw; do
  "$build/bin/checkpoint_bench" --dir "$dir/$optimizer" --hidden 2048,2048 \
    --optimizer "$optimizer" --repeats "$repeats"
done
rm -rf "$dir"
