#include "worker/comm/prefixed_store.h"

namespace lockstep::comm {

Status PrefixedStore::Set(const std::string& key, const std::string& value, int64_t timeout_ms) {
  return base_.Set(prefix_ + key, value, timeout_ms);
}

std::vector<std::string> PrefixedStore::Prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) prefixed.push_back(prefix_ + key);
  return prefixed;
}

StatusOr<std::vector<std::string>> PrefixedStore::Get(const std::vector<std::string>& keys,
                                                      int64_t timeout_ms) {
  return base_.Get(Prefixed(keys), timeout_ms);
}

StatusOr<std::vector<std::string>> PrefixedStore::GetRange(const std::vector<std::string>& keys,
                                                           size_t offset, size_t length,
                                                           int64_t timeout_ms) {
  return base_.GetRange(Prefixed(keys), offset, length, timeout_ms);
}

StatusOr<int64_t> PrefixedStore::Add(const std::string& key, int64_t delta, int64_t timeout_ms) {
  return base_.Add(prefix_ + key, delta, timeout_ms);
}

}  // namespace lockstep::comm
