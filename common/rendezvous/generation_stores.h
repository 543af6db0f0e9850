// GenerationStores: the rendezvous service's key-value store, one namespace per generation, with
// the waiters of StoreGet. Part of the job's state machine (see job_state.h): no locks, threads or
// clock; answers and wake-ups are Actions.
//
// Which generations may be read is the job's call (JobState checks it first); this class keeps
// the keys and the waiters, answers a waiter as soon as all its keys are there, and fails one at
// its deadline or when its generation is dropped.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/rendezvous/actions.h"
#include "common/status.h"

namespace lockstep::rendezvous {

// Which bytes of each value a Get answers with: length 0, the whole value.
struct ByteRange {
  size_t offset = 0;
  size_t length = 0;
};

// A waiter is indexed by the keys it still misses, so that a Set looks only at the waiters of
// its key: the cost of a Gloo full-mesh bootstrap (N waiters of N keys each) stays N^2 in all,
// not N^3.
class GenerationStores {
 public:
  void Set(int64_t generation, const std::string& key, const std::string& value, Actions& out);
  // Adds delta to the key's integer value (absent: 0) and returns the sum; INVALID_ARGUMENT when
  // the stored value is not an integer.
  StatusOr<int64_t> Add(int64_t generation, const std::string& key, int64_t delta, Actions& out);
  // Answers `call` at once when every key is present; with timeout_ms <= 0 fails at once with
  // DEADLINE_EXCEEDED naming the missing keys; else waits until now + timeout_ms.
  void Get(CallId call, int64_t generation, const std::vector<std::string>& keys,
           int64_t timeout_ms, TimePoint now, Actions& out, ByteRange range = {});
  // The call went away; its transport finishes it. Unknown ids are ignored.
  void Cancel(CallId call);
  // Fails the waiters whose deadline is at or before `now`.
  void Expire(TimePoint now, Actions& out);
  // Drops every generation before `generation`, failing their waiters.
  void DropBefore(int64_t generation, Actions& out);
  // Fails every waiter with `status` and forgets them.
  void FailAll(const Status& status, Actions& out);

 private:
  struct Waiter {
    CallId call = 0;
    int64_t generation = 0;
    std::vector<std::string> keys;
    ByteRange range;
    int64_t timeout_ms = 0;
    TimePoint deadline;
    size_t missing = 0;  // keys (with repeats) not yet present
  };

  // Answers `waiter` with its values; every key must be present.
  void Answer(const Waiter& waiter, Actions& out) const;
  // `key` of `generation` now exists: answers the waiters that missed only it.
  void Arrived(int64_t generation, const std::string& key, Actions& out);
  std::string MissingKeys(const Waiter& waiter) const;

  std::map<int64_t, std::unordered_map<std::string, std::string>> keys_;  // by generation
  std::map<CallId, Waiter> waiters_;
  // By generation: a missing key -> the waiters missing it (once per time they list it). Entries
  // of waiters that went away are skipped when the key arrives.
  std::map<int64_t, std::unordered_map<std::string, std::vector<CallId>>> waiting_on_;
};

}  // namespace lockstep::rendezvous
