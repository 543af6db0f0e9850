#!/usr/bin/env bash
# Point-to-point bandwidth, 2 ranks as 2 processes on loopback: each iteration the ranks exchange
# the same bytes both ways at once (two pipeline stages in 1F1B's steady state):
#   lockstep = Lockstep's Communicator::SendRecv on Gloo, shm = the same on shared memory (what
#   `lockstep run` uses), mpi = OpenMPI's MPI_Sendrecv (its vader shared-memory transport).
# Bandwidth = bytes / time, each direction. Usage: sendrecv.sh [BUILD_DIR] [ITERS] [WARMUP]
set -euo pipefail
BUILD_DIR=${1:-$(cd "$(dirname "$0")/../.." && pwd)/build}
ITERS=${2:-20}
WARMUP=${3:-5}
SIZES=${SIZES_MIB:-0.0625,1,16,64}
BIN=$BUILD_DIR/bin
WORK=$(mktemp -d /tmp/lockstep-sendrecv-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

run_pair() {
  local name=$1; shift
  mkdir -p "$WORK/$name.store"
  timeout 600 "$BIN/allreduce_bench" "$@" --op sendrecv --rank 1 --size 2 \
      --dir "$WORK/$name.store" --iters "$ITERS" --warmup "$WARMUP" --sizes-mib "$SIZES" \
      >/dev/null &
  local peer=$!
  timeout 600 "$BIN/allreduce_bench" "$@" --op sendrecv --rank 0 --size 2 \
      --dir "$WORK/$name.store" --iters "$ITERS" --warmup "$WARMUP" --sizes-mib "$SIZES" \
      >"$WORK/$name.txt"
  wait "$peer"
}

export LOCKSTEP_LOG_LEVEL=warning
run_pair lockstep --impl lockstep
run_pair shm --impl shm
if [[ -x $BIN/mpi_allreduce_bench ]]; then
  timeout 600 mpirun --allow-run-as-root --oversubscribe -np 2 \
      "$BIN/mpi_allreduce_bench" "$ITERS" "$WARMUP" "$SIZES" sendrecv >"$WORK/mpi.txt"
else
  : >"$WORK/mpi.txt"
fi

printf '%-10s %14s %10s %10s %10s\n' size lockstep_GB/s shm_GB/s mpi_GB/s shm/mpi
paste -d' ' "$WORK/lockstep.txt" "$WORK/shm.txt" |
  while read -r bytes _ lbw _ _ sbw; do
    mbw=$(awk -v b="$bytes" '$1 == b {print $3}' "$WORK/mpi.txt")
    printf '%-10s %14s %10s %10s %10s\n' "$((bytes >> 10))KiB" "$lbw" "$sbw" "${mbw:-n/a}" \
        "$(awk -v s="$sbw" -v m="${mbw:-0}" 'BEGIN {if (m > 0) printf "%.2f", s / m; else print "n/a"}')"
  done
