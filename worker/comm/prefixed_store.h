// A view of a KeyValueStore under a key prefix, so that several communicators can bootstrap
// through one generation's store without their keys colliding (the hierarchical communicator's
// per-host and per-local-rank groups; gloo::rendezvous::PrefixStore is the model).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/rendezvous/kv_store.h"

namespace lockstep::comm {

class PrefixedStore : public rendezvous::KeyValueStore {
 public:
  // `base` must outlive this view.
  PrefixedStore(rendezvous::KeyValueStore& base, std::string prefix)
      : base_(base), prefix_(std::move(prefix)) {}

  Status Set(const std::string& key, const std::string& value, int64_t timeout_ms) override;
  StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                         int64_t timeout_ms) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta, int64_t timeout_ms) override;
  StatusOr<std::vector<std::string>> GetRange(const std::vector<std::string>& keys, size_t offset,
                                              size_t length, int64_t timeout_ms) override;

 private:
  std::vector<std::string> Prefixed(const std::vector<std::string>& keys) const;

  rendezvous::KeyValueStore& base_;
  std::string prefix_;
};

}  // namespace lockstep::comm
