#include "common/rendezvous/host_placement.h"

#include <unordered_map>

namespace lockstep::rendezvous {

std::vector<HostPlacement> PlaceOnHosts(const std::vector<std::string>& hosts_by_rank) {
  std::unordered_map<std::string, int32_t> index;  // host -> host_rank
  std::vector<int32_t> ranks_on;                   // by host_rank
  std::vector<HostPlacement> placements(hosts_by_rank.size());
  for (size_t rank = 0; rank < hosts_by_rank.size(); ++rank) {
    auto [it, added] = index.emplace(hosts_by_rank[rank], static_cast<int32_t>(ranks_on.size()));
    if (added) ranks_on.push_back(0);
    placements[rank].host_rank = it->second;
    placements[rank].local_rank = ranks_on[it->second]++;
  }
  const int32_t host_count = static_cast<int32_t>(ranks_on.size());
  bool contiguous = host_count > 0;
  for (int32_t count : ranks_on) contiguous = contiguous && count == ranks_on[0];
  for (size_t rank = 0; contiguous && rank < placements.size(); ++rank) {
    const HostPlacement& p = placements[rank];
    contiguous = static_cast<size_t>(p.host_rank) * ranks_on[0] + p.local_rank == rank;
  }
  for (HostPlacement& p : placements) {
    p.host_count = host_count;
    p.local_size = ranks_on[p.host_rank];
    p.contiguous = contiguous;
  }
  return placements;
}

}  // namespace lockstep::rendezvous
