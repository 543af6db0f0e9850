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
#include <vector>

#include "common/rendezvous/actions.h"
#include "common/status.h"

namespace lockstep::rendezvous {

class GenerationStores {
 public:
  void Set(int64_t generation, const std::string& key, const std::string& value, Actions& out);
  // Adds delta to the key's integer value (absent: 0) and returns the sum; INVALID_ARGUMENT when
  // the stored value is not an integer.
  StatusOr<int64_t> Add(int64_t generation, const std::string& key, int64_t delta, Actions& out);
  // Answers `call` at once when every key is present; with timeout_ms <= 0 fails at once with
  // DEADLINE_EXCEEDED naming the missing keys; else waits until now + timeout_ms.
  void Get(CallId call, int64_t generation, const std::vector<std::string>& keys,
           int64_t timeout_ms, TimePoint now, Actions& out);
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
    int64_t timeout_ms = 0;
    TimePoint deadline;
  };

  bool TryAnswer(const Waiter& waiter, Actions& out) const;
  void Wake(int64_t generation, Actions& out);
  std::string MissingKeys(const Waiter& waiter) const;

  std::map<int64_t, std::map<std::string, std::string>> keys_;  // by generation
  std::map<CallId, Waiter> waiters_;
};

}  // namespace lockstep::rendezvous
