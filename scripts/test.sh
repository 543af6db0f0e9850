#!/usr/bin/env bash
# Sets everything up (dependencies, build) and runs the whole test suite. .ci/run calls this.
# Arguments go to ctest, e.g. `scripts/test.sh -L unit` or `scripts/test.sh -R Supervisor`.
# The end-to-end tests (label e2e: a real cluster on this machine, tests/e2e) run last and one at a
# time, so that the cluster's pods have the machine to themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# torch 2.6 from Debian trixie, for the exec tests' second interpreter (needs root: as root only).
# Not fatal: without it the torch 2.6 tests fail and say why, the rest of the suite still runs.
if [[ $(id -u) -eq 0 ]]; then scripts/trixie-torch.sh >/dev/null || true; fi
scripts/build.sh
status=0
ctest --test-dir build --output-on-failure -j2 --timeout 300 -LE e2e "$@" || status=$?
ctest --test-dir build --output-on-failure -j1 -L e2e "$@" || status=$?
exit "$status"
