// Ranks that follow the network. A ring all-reduce (NCCL's inter-node ring, Gloo's ring) passes
// data from each rank to the next, so the order of ranks is the order the ring crosses the
// network: pods numbered without regard to it send every ring step across the spine, pods
// numbered switch by switch cross it once per ring.
//
// A pod's place is its node's path from the coarsest level to the finest (region, zone, block,
// rack, node: the values of the operator's --topology-keys, then the node's name). OrderByTopology
// groups pods level by level so that pods under the same switch are contiguous, and otherwise
// changes as little as it can: groups keep the order of their first pod in `pods`, and pods keep
// their order within a group. A formation that starts from the previous generation's order then
// gives the survivors the same relative order, and pods with no known place (empty path) are a
// group of their own.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

namespace lockstep::rendezvous {

using TopologyPath = std::vector<std::string>;

// `pods` reordered so that pods sharing a path prefix are contiguous at every level.
std::vector<std::string> OrderByTopology(
    const std::vector<std::string>& pods,
    const std::unordered_map<std::string, TopologyPath>& places);

}  // namespace lockstep::rendezvous
