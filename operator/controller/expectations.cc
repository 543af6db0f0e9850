#include "operator/controller/expectations.h"

#include "common/deadline.h"

namespace lockstep::op::controller {

void Expectations::ExpectCreations(const std::string& key, const std::set<std::string>& names) {
  std::lock_guard<std::mutex> lock(mutex_);
  Pending& pending = pending_[key];
  pending.creations.insert(names.begin(), names.end());
  pending.set_at = MonotonicSeconds();
}

void Expectations::ExpectDeletions(const std::string& key, const std::set<std::string>& uids) {
  std::lock_guard<std::mutex> lock(mutex_);
  Pending& pending = pending_[key];
  pending.deletions.insert(uids.begin(), uids.end());
  pending.set_at = MonotonicSeconds();
}

void Expectations::CreationObserved(const std::string& key, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pending_.find(key);
  if (it == pending_.end()) return;
  it->second.creations.erase(name);
  if (it->second.creations.empty() && it->second.deletions.empty()) pending_.erase(it);
}

void Expectations::DeletionObserved(const std::string& key, const std::string& uid) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pending_.find(key);
  if (it == pending_.end()) return;
  it->second.deletions.erase(uid);
  if (it->second.creations.empty() && it->second.deletions.empty()) pending_.erase(it);
}

bool Expectations::Satisfied(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pending_.find(key);
  if (it == pending_.end()) return true;
  const Pending& pending = it->second;
  if (pending.creations.empty() && pending.deletions.empty()) return true;
  // Expired: an event was lost (or the object never came); let the reconciler look again.
  return (MonotonicSeconds() - pending.set_at) * 1000.0 >= static_cast<double>(ttl_ms_);
}

void Expectations::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.erase(key);
}

}  // namespace lockstep::op::controller
