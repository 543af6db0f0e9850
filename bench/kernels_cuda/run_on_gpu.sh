#!/usr/bin/env bash
# On a machine with a GPU: runs the CUDA kernel and NCCL communicator tests (label "gpu") and the
# bandwidth benchmark,
# building them first when the build directory lacks them. Logs go to $OUT (the device tool's
# output folder) when set, else to the build directory.
#
#   bench/kernels_cuda/run_on_gpu.sh            # BUILD_DIR defaults to build-cuda
#   BENCH_ELEMENTS=268435456 bench/kernels_cuda/run_on_gpu.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-cuda}
out=${OUT:-$build}
mkdir -p "$out"

if [[ ! -x $build/bin/cuda_kernels_test || ! -x $build/bin/kernels_cuda_bench ||
      ! -x $build/bin/comm_nccl_communicator_test ]]; then
  cmake -G Ninja -S "$root" -B "$build" -DLOCKSTEP_BUILD_BENCH=ON || exit 1
  ninja -C "$build" -j"$(nproc)" cuda_kernels_test kernels_cuda_bench kernels_test \
    comm_nccl_communicator_test || exit 1
fi

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv 2>&1 | tee "$out/gpu.txt"
fi

status=0
"$build/bin/cuda_kernels_test" --gtest_output="xml:$out/cuda_kernels_test.xml" \
  >"$out/cuda_kernels_test.log" 2>&1 || status=1
grep -E '^\[  (PASSED|FAILED) |^\[  SKIPPED \] [0-9]+ test|^\[==========\] [0-9]+ tests.*ran' \
  "$out/cuda_kernels_test.log"
"$build/bin/comm_nccl_communicator_test" >"$out/comm_nccl_communicator_test.log" 2>&1 || status=1
grep -E '^\[ +(OK|FAILED|SKIPPED) \]' "$out/comm_nccl_communicator_test.log"
"$build/bin/kernels_test" >"$out/kernels_test.log" 2>&1 || status=1
tail -n 3 "$out/kernels_test.log"
"$build/bin/kernels_cuda_bench" ${BENCH_ELEMENTS:-} 2>&1 | tee "$out/kernels_cuda_bench.txt" ||
  status=1
exit $status
