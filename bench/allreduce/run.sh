#!/usr/bin/env bash
# All-reduce bus bandwidth, 2 ranks as 2 processes on loopback, float32 sum:
#   lockstep = Lockstep's Communicator (Gloo backend), shm = Lockstep's Communicator (shared-memory
#   backend, what `lockstep run` uses), gloo = gloo::allreduce called directly
#   (ring, the faster of its algorithms at these sizes), mpi = OpenMPI's MPI_Allreduce.
# busbw = 2(n-1)/n * bytes / time (nccl-tests). Usage: run.sh [BUILD_DIR] [ITERS] [WARMUP]
set -euo pipefail
BUILD_DIR=${1:-$(cd "$(dirname "$0")/../.." && pwd)/build-comm}
ITERS=${2:-20}
WARMUP=${3:-5}
SIZES=${SIZES_MIB:-1,16,64}
BIN=$BUILD_DIR/bin
WORK=$(mktemp -d /tmp/lockstep-allreduce-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# Runs both ranks of one implementation; rank 0's lines go to $WORK/$1.txt.
run_pair() {
  local name=$1; shift
  mkdir -p "$WORK/$name.store"
  timeout 600 "$BIN/allreduce_bench" "$@" --rank 1 --size 2 --dir "$WORK/$name.store" \
      --iters "$ITERS" --warmup "$WARMUP" --sizes-mib "$SIZES" >/dev/null &
  local peer=$!
  timeout 600 "$BIN/allreduce_bench" "$@" --rank 0 --size 2 --dir "$WORK/$name.store" \
      --iters "$ITERS" --warmup "$WARMUP" --sizes-mib "$SIZES" >"$WORK/$name.txt"
  wait "$peer"
}

export LOCKSTEP_LOG_LEVEL=warning
run_pair lockstep --impl lockstep
run_pair shm --impl shm
run_pair gloo --impl gloo --algo "${GLOO_ALGO:-ring}"
if [[ -x $BIN/mpi_allreduce_bench ]]; then
  timeout 600 mpirun --allow-run-as-root --oversubscribe -np 2 \
      "$BIN/mpi_allreduce_bench" "$ITERS" "$WARMUP" "$SIZES" >"$WORK/mpi.txt"
else
  : >"$WORK/mpi.txt"
fi

printf '%-10s %14s %10s %12s %12s %16s %12s\n' size lockstep_GB/s shm_GB/s gloo_GB/s mpi_GB/s \
    lockstep/gloo shm/mpi
paste -d' ' "$WORK/lockstep.txt" "$WORK/shm.txt" "$WORK/gloo.txt" |
  while read -r bytes _ lbw _ _ sbw _ _ gbw; do
    mbw=$(awk -v b="$bytes" '$1 == b {print $3}' "$WORK/mpi.txt")
    printf '%-10s %14s %10s %12s %12s %16s %12s\n' "$((bytes >> 20))MiB" "$lbw" "$sbw" "$gbw" \
        "${mbw:-n/a}" "$(awk -v l="$lbw" -v g="$gbw" 'BEGIN {printf "%.2f", l / g}')" \
        "$(awk -v s="$sbw" -v m="${mbw:-0}" 'BEGIN {if (m > 0) printf "%.2f", s / m; else print "n/a"}')"
  done
