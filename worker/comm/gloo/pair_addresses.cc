#include "worker/comm/gloo/pair_addresses.h"

#include "common/utf8.h"

namespace lockstep::comm {

namespace {
// Each attempt at the mesh has its own keys: its pairs listen on new ports.
std::string KeyOf(int attempt, int rank) {
  return "gloo/pairs/" + std::to_string(attempt) + "/" + std::to_string(rank);
}
std::string ConnectedKeyOf(int attempt, int rank) {
  return "gloo/connected/" + std::to_string(attempt) + "/" + std::to_string(rank);
}
std::string VerdictKeyOf(int attempt) { return "gloo/verdict/" + std::to_string(attempt); }

// What a rank says of its pairs, and the verdict: "" when connected; else a mark (whether a new
// attempt may mend it) and the reason, cut so that a long message cannot grow the store.
constexpr char kRetry = 'r';
constexpr char kFinal = 'f';
constexpr size_t kReasonBytes = 512;

std::string Said(const Status& status) {
  if (status.ok()) return "";
  const char mark = status.code() == StatusCode::kUnavailable ? kRetry : kFinal;
  return std::string(1, mark) + Utf8Prefix(status.message(), kReasonBytes);
}
}  // namespace

StatusOr<std::vector<std::string>> ExchangePairAddresses(rendezvous::KeyValueStore& store,
                                                         int rank, int size,
                                                         const std::vector<std::string>& mine,
                                                         int attempt, const Deadline& deadline) {
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
  LOCKSTEP_RETURN_IF_ERROR(store.Set(KeyOf(attempt, rank), list, deadline.remaining_ms())
                               .WithContext("gloo pair addresses"));
  // Lower ranks list this rank at index rank - 1, higher ranks at index rank.
  auto read = [&](int from, int to, size_t index) -> Status {
    if (from >= to) return OkStatus();
    std::vector<std::string> keys;
    for (int peer = from; peer < to; ++peer) keys.push_back(KeyOf(attempt, peer));
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

Status AgreeOnConnect(rendezvous::KeyValueStore& store, int rank, int size, int attempt,
                      const Status& mine, bool may_retry, const Deadline& deadline) {
  if (size == 1) return mine;
  LOCKSTEP_RETURN_IF_ERROR(store.Set(ConnectedKeyOf(attempt, rank), Said(mine),
                                     deadline.remaining_ms())
                               .WithContext("gloo connect verdict"));
  if (rank == 0) {
    std::vector<std::string> keys;
    keys.reserve(static_cast<size_t>(size));
    for (int peer = 0; peer < size; ++peer) keys.push_back(ConnectedKeyOf(attempt, peer));
    StatusOr<std::vector<std::string>> said = store.Get(keys, deadline.remaining_ms());
    if (!said.ok()) return said.status().WithContext("gloo connect verdict");
    // The first rank that could not connect, or the first whose failure no attempt mends.
    std::string verdict;
    for (int peer = 0; peer < size; ++peer) {
      const std::string& one = (*said)[static_cast<size_t>(peer)];
      if (one.empty()) continue;
      if (verdict.empty() || (verdict[0] == kRetry && one[0] == kFinal)) {
        verdict = one.substr(0, 1) + "rank " + std::to_string(peer) + ": " + one.substr(1);
      }
    }
    if (!verdict.empty() && !may_retry) verdict[0] = kFinal;
    LOCKSTEP_RETURN_IF_ERROR(store.Set(VerdictKeyOf(attempt), verdict, deadline.remaining_ms())
                                 .WithContext("gloo connect verdict"));
  }
  StatusOr<std::vector<std::string>> verdict =
      store.Get({VerdictKeyOf(attempt)}, deadline.remaining_ms());
  if (!verdict.ok()) return verdict.status().WithContext("gloo connect verdict");
  const std::string& said = verdict->front();
  if (said.empty()) return OkStatus();
  const std::string reason = "not every rank connected: " + said.substr(1);
  return said[0] == kRetry ? UnavailableError(reason) : InternalError(reason);
}

}  // namespace lockstep::comm
