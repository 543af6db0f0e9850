// HostPlacement: where one member of a generation sits among the generation's hosts (the
// addresses its members joined with). It is what a member needs to choose shared memory, a
// hierarchy or the network, and what torchrun's LOCAL_RANK means for members that share a
// machine, without every member's record: the rendezvous service computes it once per formation
// and sends each member its own (proto/rendezvous.proto, JoinResponse.host).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::rendezvous {

struct HostPlacement {
  int32_t host_rank = 0;   // its host's index among the hosts, in order of each host's first rank
  int32_t host_count = 1;  // hosts in the generation
  int32_t local_rank = 0;  // its index among the ranks on its host, in rank order
  int32_t local_size = 1;  // ranks on its host
  // Every host holds local_size ranks, and they are consecutive:
  // rank = host_rank * local_size + local_rank (pods of several ranks, each on its own host).
  bool contiguous = true;
};

// The placement of every rank of `hosts_by_rank` (rank r's host at index r). Linear in the
// number of ranks.
std::vector<HostPlacement> PlaceOnHosts(const std::vector<std::string>& hosts_by_rank);

}  // namespace lockstep::rendezvous
