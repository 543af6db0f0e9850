#!/usr/bin/env bash
# Sets everything up (dependencies, build) and runs the main example: Fashion-MNIST on 4 local
# workers. Arguments go to `lockstep run`, e.g. `scripts/run-example.sh --replicas 2`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
scripts/build.sh
exec build/bin/lockstep run examples/fashion-mnist.yaml "$@"
