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

// `value`'s bytes [offset, offset + length), clamped to its size.
inline std::string ValueRange(const std::string& value, size_t offset, size_t length) {
  return offset >= value.size() ? std::string() : value.substr(offset, length);
}

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
  // Get, with each value cut to its bytes [offset, offset + length), clamped to its size: what a
  // rank needs of a list every rank publishes. The rendezvous service cuts them before sending;
  // this default cuts after a whole Get.
  virtual StatusOr<std::vector<std::string>> GetRange(const std::vector<std::string>& keys,
                                                      size_t offset, size_t length,
                                                      int64_t timeout_ms) {
    StatusOr<std::vector<std::string>> values = Get(keys, timeout_ms);
    if (!values.ok()) return values;
    for (std::string& value : *values) value = ValueRange(value, offset, length);
    return values;
  }
};

// A process-local store (mutex and condition variable) with the same contract, for tests and for
// single-process use. Values written by Add are decimal text, as in the service's store.
std::unique_ptr<KeyValueStore> NewInMemoryStore();

}  // namespace lockstep::rendezvous
