#!/usr/bin/env bash
# Configures and builds Lockstep into build/ (binaries in build/bin). The CUDA code is built when
# nvcc is found (/usr/local/cuda/bin/nvcc or on PATH); pass -DLOCKSTEP_WITH_CUDA=OFF to skip it.
# Extra arguments go to cmake.
# Two parallel jobs by default (LOCKSTEP_BUILD_JOBS overrides): the reference machine has 2 cores.
# LOCKSTEP_BUILD_TARGETS (space-separated ninja targets, e.g. "lockstep lockstep-worker") builds
# only those and what they need; unset: everything, tests and benchmarks included.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=()
read -r -a targets <<<"${LOCKSTEP_BUILD_TARGETS:-}"
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
ninja -C build -j "${LOCKSTEP_BUILD_JOBS:-2}" "${targets[@]}"
