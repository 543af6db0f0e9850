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

// What one job may hold, so that one job cannot take the memory every job's rendezvous shares
// (one operator hosts them all). Bytes count each stored key, its value and kKeyOverheadBytes for
// the map's node, over the generations still held (the current one and the one before), and each
// held get's keys (twice: the call keeps them and the index of missing keys names them). A Set
// or Add past a bound, a Get past max_waiters held calls or the byte bound, or a Get whose answer
// would pass max_answer_bytes, fails with RESOURCE_EXHAUSTED naming the bound; nothing already
// stored is lost.
//
// A job may hold what its size needs: a fixed allowance plus, per rank of its current and its
// previous generation (the larger), a few keys and held gets, and per pair of ranks the bytes
// of Gloo full-mesh bootstraps (each rank publishes about 136 bytes per peer, client.h): two
// meshes' worth in each of the two generations held, for a pipeline's stage and replica groups
// beside the world's. A 4-rank job may hold about 16 MiB; one of 1,000 ranks about 576 MB more,
// which its bootstraps need. The ranks are the generation's, not the declared maximum, so a job
// that declares 50,000 replicas and runs one gets one rank's allowance.
struct StoreLimits {
  static constexpr size_t kKeyOverheadBytes = 64;
  size_t max_keys = 4096;
  size_t max_bytes = size_t{16} << 20;
  size_t max_waiters = 1024;
  // An answer larger than this is refused before it is built: the clients refuse a message past
  // kMaxRendezvousRequestBytes (client.h) anyway.
  size_t max_answer_bytes = size_t{8} << 20;
  size_t keys_per_rank = 16;
  size_t waiters_per_rank = 16;
  size_t bytes_per_rank_pair = 2 * 2 * 144;

  // With the job's own limits where it sets them (spec.rendezvous.store; <= 0: not set): an
  // absolute limit in place of the default and its per-rank term.
  StoreLimits SetByJob(int64_t job_max_keys, int64_t job_max_bytes) const {
    StoreLimits set = *this;
    if (job_max_keys > 0) {
      set.max_keys = static_cast<size_t>(job_max_keys);
      set.keys_per_rank = 0;
    }
    if (job_max_bytes > 0) {
      set.max_bytes = static_cast<size_t>(job_max_bytes);
      set.bytes_per_rank_pair = 0;
    }
    return set;
  }

  // The absolute limits of a job of `ranks` ranks (the per-rank terms folded in).
  StoreLimits ScaledTo(int64_t ranks) const {
    const auto n = static_cast<size_t>(ranks > 0 ? ranks : 0);
    StoreLimits scaled = *this;
    scaled.max_keys = max_keys + keys_per_rank * n;
    scaled.max_bytes = max_bytes + bytes_per_rank_pair * n * n;
    scaled.max_waiters = max_waiters + waiters_per_rank * n;
    scaled.keys_per_rank = scaled.waiters_per_rank = scaled.bytes_per_rank_pair = 0;
    return scaled;
  }
};

// A waiter is indexed by the keys it still misses, so that a Set looks only at the waiters of
// its key: the cost of a Gloo full-mesh bootstrap (N waiters of N keys each) stays N^2 in all,
// not N^3.
class GenerationStores {
 public:
  // `limits` as they stand (their per-rank terms are not applied: ScaledTo first).
  explicit GenerationStores(StoreLimits limits = {}) : limits_(limits) {}
  // New limits (a generation formed with another size); what is held already stays.
  void SetLimits(const StoreLimits& limits) { limits_ = limits; }

  // RESOURCE_EXHAUSTED when the value would take the job past its limits (the old value stays).
  Status Set(int64_t generation, const std::string& key, const std::string& value, Actions& out);
  // Adds delta to the key's integer value (absent: 0) and returns the sum; INVALID_ARGUMENT when
  // the stored value is not an integer.
  StatusOr<int64_t> Add(int64_t generation, const std::string& key, int64_t delta, Actions& out);
  // Answers `call` at once when every key is present; with timeout_ms <= 0 fails at once with
  // DEADLINE_EXCEEDED naming the missing keys; else waits until now + timeout_ms (or fails at
  // once with RESOURCE_EXHAUSTED when max_waiters calls are held already).
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

  // What the job holds: held gets, and bytes as StoreLimits counts them.
  size_t waiters() const { return waiters_.size(); }
  // Calls refused past a limit so far (RESOURCE_EXHAUSTED, reason kReasonStoreLimit), and the
  // last refusal's message: what the operator shows in the job's condition.
  int64_t refusals() const { return refusals_; }
  const std::string& last_refusal() const { return last_refusal_; }
  size_t bytes() const { return total_bytes_; }

 private:
  struct Waiter {
    CallId call = 0;
    int64_t generation = 0;
    std::vector<std::string> keys;
    ByteRange range;
    int64_t timeout_ms = 0;
    TimePoint deadline;
    size_t missing = 0;  // keys (with repeats) not yet present
    size_t bytes = 0;    // what it holds, as StoreLimits counts it
  };

  // Answers `waiter` with its values (every key must be present), or RESOURCE_EXHAUSTED when
  // they would pass max_answer_bytes.
  void Answer(const Waiter& waiter, Actions& out);
  // Takes a held waiter out of the index of missing keys and gives back its bytes.
  void Forget(const Waiter& waiter);
  // `key` of `generation` now exists: answers the waiters that missed only it.
  void Arrived(int64_t generation, const std::string& key, Actions& out);
  std::string MissingKeys(const Waiter& waiter) const;

  // Set and Add: stores `value` under `key` within the limits (`call` names it in a refusal).
  Status Store(const char* call, int64_t generation, const std::string& key, std::string value,
               Actions& out);
  // RESOURCE_EXHAUSTED unless `added_keys` more keys and `added_bytes` more bytes fit; `what`
  // names the call in the message.
  Status CheckRoom(const std::string& what, size_t added_keys, size_t added_bytes);
  // Counts a refusal and returns it: RESOURCE_EXHAUSTED with reason kReasonStoreLimit.
  Status Refuse(const std::string& message);
  static size_t EntryBytes(const std::string& key, const std::string& value) {
    return key.size() + value.size() + StoreLimits::kKeyOverheadBytes;
  }

  StoreLimits limits_;
  int64_t refusals_ = 0;
  std::string last_refusal_;
  std::map<int64_t, std::unordered_map<std::string, std::string>> keys_;  // by generation
  std::map<int64_t, size_t> bytes_;  // by generation, as EntryBytes counts them
  size_t total_keys_ = 0;
  size_t total_bytes_ = 0;  // stored entries and held waiters
  std::map<CallId, Waiter> waiters_;
  // By generation: a missing key -> the waiters missing it (once per time they list it). A
  // waiter that goes away (answered, cancelled, expired) takes its entries out.
  std::map<int64_t, std::unordered_map<std::string, std::vector<CallId>>> waiting_on_;
};

}  // namespace lockstep::rendezvous
