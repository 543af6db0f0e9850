// KvStoreAdapter: presents a Lockstep KeyValueStore as the gloo::rendezvous::Store that
// gloo::rendezvous::Context::connectFullMesh needs.
//
// Gloo's Store interface reports failure only by throwing, so a failed store call is recorded as
// a Status and rethrown as gloo::IoException; the caller catches it at its boundary and reads
// the original Status back with last_error() (so DEADLINE_EXCEEDED from the store stays
// DEADLINE_EXCEEDED instead of becoming a parsed exception message).
//
// Every call is bounded by the adapter's deadline: the whole bootstrap shares one budget.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/rendezvous/kv_store.h"
#include "common/status.h"

namespace lockstep::comm {

class KvStoreAdapter : public ::gloo::rendezvous::Store {
 public:
  // Keys are written as prefix + key. The store must outlive the adapter.
  KvStoreAdapter(rendezvous::KeyValueStore& store, std::string prefix, Deadline deadline);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The Status of the first failed call, OK if none failed. Thread-safe.
  Status last_error() const;

 private:
  // Records `status` (the first one wins) and throws it as gloo::IoException.
  [[noreturn]] void Fail(const Status& status);
  // Remaining budget, capped by `timeout_ms` when it is positive.
  int64_t CallTimeoutMs(int64_t timeout_ms = -1) const;

  rendezvous::KeyValueStore& store_;
  const std::string prefix_;
  const Deadline deadline_;
  mutable std::mutex mu_;
  Status last_error_;
};

}  // namespace lockstep::comm
