#include "worker/comm/gloo/pair_addresses.h"

namespace lockstep::comm {

namespace {
constexpr char kPairAddressesKeyPrefix[] = "gloo/pairs/";

std::string KeyOf(int rank) { return kPairAddressesKeyPrefix + std::to_string(rank); }
}  // namespace

StatusOr<std::vector<std::string>> ExchangePairAddresses(rendezvous::KeyValueStore& store,
                                                         int rank, int size,
                                                         const std::vector<std::string>& mine,
                                                         const Deadline& deadline) {
  if (size < 1 || rank < 0 || rank >= size || static_cast<int>(mine.size()) != size) {
    return InvalidArgumentError("gloo pair addresses: rank " + std::to_string(rank) + " of " +
                                std::to_string(size) + " with " + std::to_string(mine.size()) +
                                " addresses");
  }
  std::vector<std::string> theirs(size);
  if (size == 1) return theirs;
  const size_t record = mine[rank == 0 ? 1 : 0].size();
  std::string list;
  list.reserve(record * static_cast<size_t>(size - 1));
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    if (mine[peer].size() != record || record == 0) {
      return InvalidArgumentError("gloo pair addresses: the address for peer " +
                                  std::to_string(peer) + " is " +
                                  std::to_string(mine[peer].size()) + " bytes, not " +
                                  std::to_string(record));
    }
    list += mine[peer];
  }
  LOCKSTEP_RETURN_IF_ERROR(store.Set(KeyOf(rank), list, deadline.remaining_ms())
                               .WithContext("gloo pair addresses"));
  // Lower ranks list this rank at index rank - 1, higher ranks at index rank.
  auto read = [&](int from, int to, size_t index) -> Status {
    if (from >= to) return OkStatus();
    std::vector<std::string> keys;
    for (int peer = from; peer < to; ++peer) keys.push_back(KeyOf(peer));
    LOCKSTEP_ASSIGN_OR_RETURN(
        std::vector<std::string> records,
        store.GetRange(keys, index * record, record, deadline.remaining_ms()));
    for (int peer = from; peer < to; ++peer) {
      std::string& got = records[static_cast<size_t>(peer - from)];
      if (got.size() != record) {
        return InternalError("gloo pair addresses: rank " + std::to_string(peer) +
                             "'s list has no " + std::to_string(record) + "-byte record " +
                             std::to_string(index) + " (its addresses differ in size?)");
      }
      theirs[peer] = std::move(got);
    }
    return OkStatus();
  };
  LOCKSTEP_RETURN_IF_ERROR(read(0, rank, static_cast<size_t>(rank - 1)).WithContext("gloo pair addresses"));
  LOCKSTEP_RETURN_IF_ERROR(read(rank + 1, size, static_cast<size_t>(rank)).WithContext("gloo pair addresses"));
  return theirs;
}

}  // namespace lockstep::comm
