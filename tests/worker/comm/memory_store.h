// MemoryKeyValueStore: an in-process KeyValueStore for tests of communicator bootstrap. Ranks
// run as threads sharing one instance; Get blocks on a condition variable until every key
// exists or the timeout passes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/rendezvous/kv_store.h"
#include "common/status.h"

namespace lockstep::testing {

class MemoryKeyValueStore : public rendezvous::KeyValueStore {
 public:
  Status Set(const std::string& key, const std::string& value, int64_t timeout_ms) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
    }
    changed_.notify_all();
    return OkStatus();
  }

  StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                         int64_t timeout_ms) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto all_present = [&] {
      for (const auto& key : keys) {
        if (values_.count(key) == 0) return false;
      }
      return true;
    };
    if (!changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), all_present)) {
      std::string missing;
      for (const auto& key : keys) {
        if (values_.count(key) == 0) missing += (missing.empty() ? "" : ", ") + key;
      }
      return DeadlineExceededError("memory store: keys [" + missing + "] not set within " +
                                   std::to_string(timeout_ms) + " ms");
    }
    std::vector<std::string> result;
    result.reserve(keys.size());
    for (const auto& key : keys) result.push_back(values_.at(key));
    return result;
  }

  StatusOr<int64_t> Add(const std::string& key, int64_t delta, int64_t timeout_ms) override {
    int64_t value;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = values_.find(key);
      value = (it == values_.end() ? 0 : std::stoll(it->second)) + delta;
      values_[key] = std::to_string(value);
    }
    changed_.notify_all();
    return value;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

}  // namespace lockstep::testing
