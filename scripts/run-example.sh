#!/usr/bin/env bash
# Sets up what the main example needs (its Debian packages; the `lockstep` and `lockstep-worker`
# programs, nothing else) and runs it: Fashion-MNIST on 4 local workers. Arguments go to
# `lockstep run`, e.g. `scripts/run-example.sh --replicas 2`. scripts/test.sh sets up and builds
# the rest.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --example
LOCKSTEP_BUILD_TARGETS="lockstep lockstep-worker" scripts/build.sh
exec build/bin/lockstep run examples/fashion-mnist.yaml "$@"
