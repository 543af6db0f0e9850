// ShmCommunicator: the Communicator for ranks that share one host, over one POSIX shared-memory
// segment (the role of NCCL's SHM transport and OpenMPI's vader BTL). On loopback it replaces
// Gloo's TCP pairs, whose kernel socket copies and wake-ups cap an all-reduce at about 1 GB/s.
//
// Example (every rank of the generation, each in its own process):
//
//   ShmOptions options;
//   options.rank = rank;
//   options.size = world_size;
//   options.job_name = "default/mnist";
//   options.generation = generation;
//   LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
//                             CreateShmCommunicator(options, *generation_store));
//   LOCKSTEP_RETURN_IF_ERROR(comm->AllReduce(grads, count, DataType::kFloat32, ReduceOp::kSum,
//                                            timeout_ms));
//
// Differences from the Gloo backend that callers may rely on:
//  - Abort() wakes every blocked call of every rank at once (ABORTED), not only later calls.
//  - A rank that destroys its communicator makes its peers' blocked and later calls fail at once
//    (UNAVAILABLE), like Gloo's connection reset.
//  - A peer process that dies is noticed within about 100 ms by its waiting peers (UNAVAILABLE
//    naming the rank), even before the rendezvous service ends the generation.
//  - 16-bit floats are reduced in float across all ranks and rounded once (Gloo rounds per hop;
//    at two ranks the results are identical).
//  - Every element's reduction is computed by exactly one rank in rank order 0..W-1 and copied
//    to the others, so every rank holds bit-identical results.
// The shared-memory protocol is described at the top of shm_communicator.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/rendezvous/kv_store.h"
#include "common/status.h"
#include "worker/comm/communicator.h"

namespace lockstep::comm {

struct ShmOptions {
  int rank = 0;
  int size = 1;
  // Name the segment after the job and generation, so a leaked segment (see the .cc) can be
  // traced; a random nonce keeps restarted rendezvous services (generation numbers restart)
  // from colliding.
  std::string job_name;
  int64_t generation = 0;
  // Bytes of each rank's staging slot; the segment holds size × slot_bytes plus a 4 KiB control
  // block. Larger collectives are processed in chunks of size × slot_bytes (all-reduce) and pay
  // two barriers per chunk. Smaller slots: more barriers and less overlap of copies with peers;
  // larger: more shared memory (/dev/shm is often small in containers: 64 MiB in Docker) and no
  // faster once a chunk's barriers cost far less than its copies (8 MiB: ~1 ms of copying
  // against ~10 µs of barriers).
  size_t slot_bytes = size_t{8} << 20;
  // Bytes of each rank's mailbox for point-to-point messages (Send/Recv), which travel in
  // pieces of half this size, two in flight (the sender copies one in while the recipient copies
  // the other out); the segment holds size × that more. 1 MiB: 512 KiB pieces stay in a core's
  // cache, and 2 MiB was slower (bench/allreduce/sendrecv.sh, docs/benchmarks.md).
  size_t mailbox_bytes = size_t{1} << 20;
  // Deadline for every rank to attach to the segment at bootstrap.
  int64_t connect_timeout_ms = 30000;
};

// Creates this rank's communicator. Rank 0 creates the segment and publishes its name through
// `store` (scoped to the generation); the others attach. Returns once every rank has attached,
// by which time the segment's name is unlinked. Errors: INVALID_ARGUMENT (options),
// DEADLINE_EXCEEDED (a rank did not attach within connect_timeout_ms), UNAVAILABLE or INTERNAL
// (the segment could not be created or opened, e.g. /dev/shm full or not shared between the
// ranks' containers).
StatusOr<std::unique_ptr<Communicator>> CreateShmCommunicator(const ShmOptions& options,
                                                              rendezvous::KeyValueStore& store);

// The store key under which rank 0 publishes the segment's name (tests read it to check that
// the name is gone after bootstrap).
extern const char kShmSegmentKey[];

}  // namespace lockstep::comm
