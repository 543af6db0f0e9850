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
# Compiles go through ccache where it is installed (scripts/setup.sh installs it), with its cache
# outside the tree, in ${LOCKSTEP_CACHE_DIR:-~/.cache/lockstep}/ccache. ccache keys each
# object by the compiler, its flags and the preprocessed source, paths taken relative to the tree
# (base_dir, no cwd in the key), so a second clone or the next CI run on the same machine compiles
# only what changed. The settings travel in the launcher, so a later `ninja -C build` uses them too.
# (Without cwd in the key, an object's debug information may name another clone's build folder.)
# Without ccache, a launcher left in build/ from an earlier run is dropped.
launcher=(-UCMAKE_C_COMPILER_LAUNCHER -UCMAKE_CXX_COMPILER_LAUNCHER -UCMAKE_CUDA_COMPILER_LAUNCHER)
if command -v ccache >/dev/null; then
  cache_dir=${LOCKSTEP_CACHE_DIR:-${HOME:-/tmp}/.cache/lockstep}/ccache
  ccache_env="/usr/bin/env;CCACHE_DIR=$cache_dir;CCACHE_BASEDIR=$(pwd -P);CCACHE_NOHASHDIR=1"
  ccache_env+=";CCACHE_MAXSIZE=8G;ccache"
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER="$ccache_env" -DCMAKE_CXX_COMPILER_LAUNCHER="$ccache_env"
            -DCMAKE_CUDA_COMPILER_LAUNCHER="$ccache_env")
fi
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" "$@"
ninja -C build -j "${LOCKSTEP_BUILD_JOBS:-2}" "${targets[@]}"
