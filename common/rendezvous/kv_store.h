// KeyValueStore: the narrow store interface that communicator bootstrap needs (Gloo's
// rendezvous::Store is the model). The rendezvous client provides one scoped to a generation;
// tests may use the in-memory one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep::rendezvous {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  // Thread-safe. Each call returns within timeout_ms (DEADLINE_EXCEEDED otherwise).
  virtual Status Set(const std::string& key, const std::string& value, int64_t timeout_ms) = 0;
  // Waits until every key exists, then returns their values in order.
  virtual StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                                 int64_t timeout_ms) = 0;
  // Adds delta to the integer at key (0 when missing) and returns the new value.
  virtual StatusOr<int64_t> Add(const std::string& key, int64_t delta, int64_t timeout_ms) = 0;
};

// A process-local store (mutex and condition variable) with the same contract, for tests and for
// single-process use. Values written by Add are decimal text, as in the service's store.
std::unique_ptr<KeyValueStore> NewInMemoryStore();

}  // namespace lockstep::rendezvous
