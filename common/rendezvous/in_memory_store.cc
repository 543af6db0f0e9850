#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

#include "common/deadline.h"
#include "common/rendezvous/kv_store.h"

namespace lockstep::rendezvous {
namespace {

class InMemoryStore : public KeyValueStore {
 public:
  Status Set(const std::string& key, const std::string& value, int64_t timeout_ms) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
    }
    cv_.notify_all();
    return OkStatus();
  }

  StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                         int64_t timeout_ms) override {
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    std::unique_lock<std::mutex> lock(mu_);
    auto all_present = [&] {
      for (const auto& key : keys) {
        if (values_.count(key) == 0) return false;
      }
      return true;
    };
    if (!cv_.wait_until(lock, deadline.at(), all_present)) {
      std::string missing;
      for (const auto& key : keys) {
        if (values_.count(key) == 0) missing += (missing.empty() ? "" : ", ") + key;
      }
      return DeadlineExceededError("store get: keys still missing after " +
                                   std::to_string(timeout_ms) + " ms: " + missing);
    }
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& key : keys) out.push_back(values_[key]);
    return out;
  }

  StatusOr<int64_t> Add(const std::string& key, int64_t delta, int64_t timeout_ms) override {
    int64_t value = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = values_.find(key);
      if (it != values_.end()) {
        try {
          value = std::stoll(it->second);
        } catch (const std::exception&) {
          return InvalidArgumentError("store add: value of key " + key + " is not an integer");
        }
      }
      value += delta;
      values_[key] = std::to_string(value);
    }
    cv_.notify_all();
    return value;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

}  // namespace

std::unique_ptr<KeyValueStore> NewInMemoryStore() { return std::make_unique<InMemoryStore>(); }

}  // namespace lockstep::rendezvous
