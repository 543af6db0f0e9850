// HierarchicalCommunicator ("shm+gloo"): the Communicator for CPU ranks spread over several
// hosts with several ranks on each (pods of spec.ranksPerWorker > 1), built from two
// communicators per rank: one among the ranks of its host (shared memory), and one among the
// ranks of the same local index on every host (Gloo over TCP). The shape of Horovod's and
// PaddlePaddle's hierarchical all-reduce.
//
// AllReduce of B bytes on H hosts of L ranks each:
//   1. reduce-scatter the buffer among the host's L ranks (shared memory: memory bandwidth), so
//      that local rank l holds the host's sum of the l-th of L equal parts (B / L bytes);
//   2. local rank l all-reduces its part with the l-th ranks of the other hosts (Gloo): L rings
//      of B / L bytes run side by side across the network, so a host sends 2 (H - 1) / H x B
//      bytes in all where a flat ring over H x L ranks sends 2 (HL - 1) / HL x B per rank that
//      crosses hosts;
//   3. all-gather the parts among the host's ranks (shared memory).
// Up to 1 MiB, one ring crosses the hosts instead of L: all-reduce inside the host, local rank 0
// all-reduces the whole buffer with the other hosts' rank 0, broadcast inside the host (the same
// bytes cross the network in fewer rounds and streams; measured faster there, docs/benchmarks.md).
// Every rank ends with bit-identical results: Gloo's rings give every host the same parts, and
// the all-gather (or broadcast) gives every rank of a host the same bytes.
//
// Broadcast goes to the root's local index on every host first (Gloo), then inside each host
// (shm). AllGather gathers inside the host, then exchanges whole hosts' blocks. Barrier is
// host, cross-host, host. Abort aborts both.
//
// Bootstrap: both communicators through the generation's store, under the prefixes
// "host/<host index>/" and "local/<local index>/", within one connect deadline.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/rendezvous/kv_store.h"
#include "common/status.h"
#include "worker/comm/communicator.h"

namespace lockstep::comm {

// Where each rank sits: hosts in the order of their first rank, ranks of a host in rank order.
struct HostLayout {
  int host_count = 0;
  int ranks_per_host = 0;
  std::vector<int> host_of;   // by rank
  std::vector<int> local_of;  // by rank
  std::vector<std::vector<int>> ranks_of_host;

  int RankAt(int host, int local) const { return ranks_of_host[host][local]; }
};

// The layout of `member_hosts` (by rank) when every host has the same number of ranks;
// nullopt when they differ (a hierarchy needs equal groups) or there are no members.
std::optional<HostLayout> LayoutByHost(const std::vector<std::string>& member_hosts);
// `host_count` hosts of `ranks_per_host` consecutive ranks each: rank = host * ranks_per_host +
// local, as the rendezvous numbers pods of several ranks (HostPlacement::contiguous).
HostLayout ContiguousLayout(int host_count, int ranks_per_host);

struct HierarchicalOptions {
  int rank = 0;
  HostLayout layout;                      // LayoutByHost or ContiguousLayout
  std::string host = "127.0.0.1";         // this rank's address, where its Gloo pair listens
  std::string job_name;                   // names the shared-memory segments
  int64_t generation = 0;
  int64_t connect_timeout_ms = 30000;     // for both bootstraps together
};

// Builds this rank's two communicators and joins them. Errors: INVALID_ARGUMENT (an empty layout,
// a rank outside it), and those of CreateShmCommunicator and CreateGlooCommunicator.
StatusOr<std::unique_ptr<Communicator>> CreateHierarchicalCommunicator(
    const HierarchicalOptions& options, rendezvous::KeyValueStore& store);

// The composition alone, over two communicators: `local` among the ranks of this rank's host
// (its rank there is layout.local_of[rank]) and `cross` among the ranks of the same local index
// (its rank there is layout.host_of[rank]). `local` must allow an in-place AllGather (`in` at
// out + rank * bytes_per_rank), as the shm communicator does.
std::unique_ptr<Communicator> ComposeHierarchical(HostLayout layout, int rank,
                                                  std::unique_ptr<Communicator> local,
                                                  std::unique_ptr<Communicator> cross);

}  // namespace lockstep::comm
