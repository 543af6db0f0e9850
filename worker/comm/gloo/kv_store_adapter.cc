#include "worker/comm/gloo/kv_store_adapter.h"

#include <gloo/common/error.h>

#include <algorithm>
#include <utility>

namespace lockstep::comm {

KvStoreAdapter::KvStoreAdapter(rendezvous::KeyValueStore& store, std::string prefix,
                               Deadline deadline)
    : store_(store), prefix_(std::move(prefix)), deadline_(deadline) {}

void KvStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  Status status = store_.Set(prefix_ + key, std::string(data.begin(), data.end()), CallTimeoutMs());
  if (!status.ok()) Fail(status.WithContext("rendezvous store set " + prefix_ + key));
}

std::vector<char> KvStoreAdapter::get(const std::string& key) {
  auto values = store_.Get({prefix_ + key}, CallTimeoutMs());
  if (!values.ok()) Fail(values.status().WithContext("rendezvous store get " + prefix_ + key));
  const std::string& value = values->at(0);
  return std::vector<char>(value.begin(), value.end());
}

void KvStoreAdapter::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(-1));
}

void KvStoreAdapter::wait(const std::vector<std::string>& keys,
                          const std::chrono::milliseconds& timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& key : keys) prefixed.push_back(prefix_ + key);
  auto values = store_.Get(prefixed, CallTimeoutMs(timeout.count()));
  if (!values.ok()) {
    std::string names;
    for (const auto& key : prefixed) names += (names.empty() ? "" : ",") + key;
    Fail(values.status().WithContext("rendezvous store wait for " + names));
  }
}

Status KvStoreAdapter::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void KvStoreAdapter::Fail(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (last_error_.ok()) last_error_ = status;
  }
  throw ::gloo::IoException(status.ToString());
}

int64_t KvStoreAdapter::CallTimeoutMs(int64_t timeout_ms) const {
  int64_t remaining_ms = deadline_.remaining_ms();
  return timeout_ms > 0 ? std::min(timeout_ms, remaining_ms) : remaining_ms;
}

}  // namespace lockstep::comm
