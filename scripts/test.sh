#!/usr/bin/env bash
# Sets everything up (dependencies, build) and runs the whole test suite. .ci/run calls this.
# Arguments go to ctest, e.g. `scripts/test.sh -L unit` or `scripts/test.sh -R Supervisor`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j2 --timeout 300 "$@"
