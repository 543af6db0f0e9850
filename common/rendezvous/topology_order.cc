#include "common/rendezvous/topology_order.h"

#include <algorithm>
#include <cstddef>
#include <map>

namespace lockstep::rendezvous {
namespace {

struct Entry {
  const std::string* pod;
  const TopologyPath* path;
  size_t group = 0;  // at the level being ordered
};

// The value of `level` in a path; past its end, "" (a shorter path is a group of its own there).
const std::string& LevelOf(const TopologyPath& path, size_t level) {
  static const std::string kNone;
  return level < path.size() ? path[level] : kNone;
}

// Orders entries[begin, end), which share every level above `level`, in place.
void OrderLevel(std::vector<Entry>& entries, size_t begin, size_t end, size_t level,
                size_t depth) {
  if (end - begin < 2 || level >= depth) return;
  // Groups numbered in the order of their first pod; a stable sort by number keeps pods in order.
  std::map<std::string, size_t> first_seen;
  for (size_t i = begin; i < end; ++i) {
    entries[i].group =
        first_seen.emplace(LevelOf(*entries[i].path, level), first_seen.size()).first->second;
  }
  if (first_seen.size() > 1) {
    std::stable_sort(entries.begin() + static_cast<std::ptrdiff_t>(begin),
                     entries.begin() + static_cast<std::ptrdiff_t>(end),
                     [](const Entry& a, const Entry& b) { return a.group < b.group; });
  }
  for (size_t i = begin; i < end;) {
    size_t j = i + 1;
    while (j < end && entries[j].group == entries[i].group) ++j;
    OrderLevel(entries, i, j, level + 1, depth);
    i = j;
  }
}

}  // namespace

std::vector<std::string> OrderByTopology(
    const std::vector<std::string>& pods,
    const std::unordered_map<std::string, TopologyPath>& places) {
  static const TopologyPath kNowhere;
  std::vector<Entry> entries;
  entries.reserve(pods.size());
  size_t depth = 0;
  for (const std::string& pod : pods) {
    auto it = places.find(pod);
    const TopologyPath* path = it == places.end() ? &kNowhere : &it->second;
    depth = std::max(depth, path->size());
    entries.push_back({&pod, path});
  }
  OrderLevel(entries, 0, entries.size(), 0, depth);
  std::vector<std::string> ordered;
  ordered.reserve(entries.size());
  for (const Entry& entry : entries) ordered.push_back(*entry.pod);
  return ordered;
}

}  // namespace lockstep::rendezvous
