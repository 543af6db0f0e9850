// CreateCommunicator: picks the Communicator backend for a generation and builds it.
//
// Backends, in order of preference:
//  - nccl (nccl/): the ranks train on GPUs (device: cuda). Their tensors are device memory, which
//    only NCCL reduces in place, so it is the only choice there: LOCKSTEP_COMM=gloo or shm with
//    device: cuda is refused (FAILED_PRECONDITION) rather than silently staged through the host.
//  - shm (shm/): every member of the generation runs on this member's host (their rendezvous
//    host strings are equal, as under `lockstep run`, where every worker is 127.0.0.1). One
//    shared-memory segment instead of TCP over loopback: ~5-10x the all-reduce bandwidth.
//  - shm+gloo (hierarchical/): the members are on several hosts with the same number (> 1) of
//    consecutive ranks on each (pods of ranksPerWorker > 1): shared memory inside each host, Gloo
//    between hosts, so only 1/N of the bytes per rank cross the network.
//  - gloo (gloo/): everything else, over TCP.
// The environment variable LOCKSTEP_COMM overrides the choice: "auto" (or unset) as above,
// "gloo" always Gloo (flat, over every rank), "shm" always shared memory (an error when the
// members are not on one host), "shm+gloo" the hierarchy (an error where it does not apply).
// Every member must see the same value, or members pick different backends and the bootstrap
// fails at its deadline; the launcher and the operator give every worker the same
// environment. Set LOCKSTEP_COMM=gloo where members report the same host but do not share
// /dev/shm or a pid namespace (e.g. separate containers with host networking).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/rendezvous/host_placement.h"
#include "common/rendezvous/kv_store.h"
#include "common/status.h"
#include "worker/comm/communicator.h"

namespace lockstep::comm {

struct CommunicatorOptions {
  int rank = 0;
  int size = 1;
  // Where this member sits among the generation's hosts, as the rendezvous service reports it
  // (Assignment::host; PlaceOnHosts for a list of hosts). The default: every member on one host.
  rendezvous::HostPlacement placement;
  // This member's host: the address Gloo listens on.
  std::string host = "127.0.0.1";
  // Names the shared-memory segment (for tracing a leaked one).
  std::string job_name;
  int64_t generation = 0;
  // Deadline for the bootstrap (Gloo's full mesh, every rank attaching to the segment, or NCCL's
  // unique id exchange and connection setup).
  int64_t connect_timeout_ms = 30000;
  // The trainer's tensors are on a CUDA device: nccl is chosen, on device `cuda_device`, with its
  // collectives ordered after the work queued on `cuda_stream` (a cudaStream_t; the device's
  // side queue, kernels/device.h).
  bool cuda = false;
  int cuda_device = 0;
  void* cuda_stream = nullptr;
};

// "nccl", "shm", "shm+gloo" or "gloo" for these options and a LOCKSTEP_COMM value (nullptr:
// unset). INVALID_ARGUMENT for an unknown value; FAILED_PRECONDITION for "shm" across hosts,
// "shm+gloo" where the hosts hold no equal groups of several ranks, a CPU backend with cuda, and
// nccl without it.
StatusOr<std::string> ChooseCommunicatorBackend(const CommunicatorOptions& options,
                                                const char* lockstep_comm);

// Builds this member's communicator with the backend ChooseCommunicatorBackend picks for
// getenv("LOCKSTEP_COMM"), bootstrapping through `store` (scoped to the generation), and logs
// the choice. Blocks at most connect_timeout_ms. Errors: those of the choice and of the
// backend's Create function.
StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const CommunicatorOptions& options,
                                                           rendezvous::KeyValueStore& store);

}  // namespace lockstep::comm
