// NcclCommunicator: the Communicator for ranks on GPUs, over NCCL (one GPU per rank).
//
//   LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
//                             CreateNcclCommunicator({.rank = r, .size = n, .device = 0}, store));
//   comm->AllReduce(device_gradients, count, DataType::kFloat32, ReduceOp::kSum, 60000);
//
// Bootstrap: rank 0 draws an ncclUniqueId and publishes it in `store` under "nccl/unique-id"
// (the store is scoped to the generation, so every generation uses a fresh id and an aborted
// communicator is never reused); the other ranks read it. The communicator is created
// non-blocking (ncclConfig_t.blocking = 0) so that creation, like every collective, is polled
// against a deadline instead of blocking inside NCCL.
//
// Collectives run on the communicator's own CUDA stream (non-blocking with respect to the legacy
// default stream). Buffers are device memory of `device`, used in place; host memory is accepted
// too and staged through a device buffer (the trainer's small control values: a leave vote, a
// loss sum, a state header), so the one Communicator contract serves both. Each call:
//  1. orders itself after the work already issued on options.input_stream (an event recorded
//     there is waited on by the communication stream: the backward kernels that wrote a bucket
//     finish before NCCL reads it);
//  2. enqueues the NCCL operation;
//  3. waits for it: an event on the communication stream is polled together with the deadline
//     and the abort flag.
// A watchdog thread polls ncclCommGetAsyncError (a peer that died, a network error) and the
// deadline of the operation in flight; on either it calls ncclCommAbort, which makes the waiting
// call return (UNAVAILABLE for an asynchronous error, DEADLINE_EXCEEDED past the deadline,
// ABORTED after Abort()). After any error the communicator is unusable, as the Communicator
// contract says: the worker builds a new one, with a new unique id, for the next generation.
//
// Thread safety: collectives from one thread at a time; Abort from any thread.
#pragma once

#include <cstdint>
#include <memory>

#include "common/rendezvous/kv_store.h"
#include "common/status.h"
#include "worker/comm/communicator.h"

namespace lockstep::comm {

struct NcclCommunicatorOptions {
  int rank = 0;
  int size = 1;
  int device = 0;  // CUDA device ordinal of this rank
  // Bound of the bootstrap: reading the unique id and NCCL's own connection setup.
  int64_t connect_timeout_ms = 60000;
  // How often the watchdog looks at NCCL's asynchronous error and the deadline.
  int64_t watchdog_interval_ms = 5;
  // The cudaStream_t whose work every collective follows (the trainer's compute stream);
  // nullptr: the legacy default stream.
  void* input_stream = nullptr;
};

// Errors: INVALID_ARGUMENT for a bad rank/size/device; UNAVAILABLE when CUDA or NCCL cannot start
// (no device, no driver); DEADLINE_EXCEEDED when the peers do not all arrive in time.
StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const NcclCommunicatorOptions& options, rendezvous::KeyValueStore& store);

}  // namespace lockstep::comm
