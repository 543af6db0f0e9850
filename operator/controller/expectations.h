// Expectations: what the reconciler has asked the API server to create or delete and not yet
// seen in its informer's cache. A reconcile that runs before the cache caught up would otherwise
// count the pods it just created as missing and create them twice (client-go's
// ControllerExpectations; Kubeflow's training operator uses the same idea).
//
//   if (!expectations.Satisfied(job_key)) return requeue;         // the cache is behind
//   expectations.ExpectCreations(job_key, {"fashion-worker-3"});   // before the Create calls
//   ... Create fails with anything but AlreadyExists -> expectations.CreationObserved(job_key, name)
//   pod informer add handler -> expectations.CreationObserved(job_key, pod name)
//   pod informer delete handler -> expectations.DeletionObserved(job_key, pod uid)
//
// Expectations expire after ttl_ms (5 min, as client-go), so a lost watch event cannot wedge a
// job for ever. Thread safety: every method from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

namespace lockstep::op::controller {

class Expectations {
 public:
  explicit Expectations(int64_t ttl_ms = 5 * 60 * 1000) : ttl_ms_(ttl_ms) {}

  // Adds names (creations) or uids (deletions) to what `key` waits for.
  void ExpectCreations(const std::string& key, const std::set<std::string>& names);
  void ExpectDeletions(const std::string& key, const std::set<std::string>& uids);
  void CreationObserved(const std::string& key, const std::string& name);
  void DeletionObserved(const std::string& key, const std::string& uid);

  // True when nothing is outstanding for key, or what is has expired.
  bool Satisfied(const std::string& key) const;
  void Forget(const std::string& key);  // the job is gone

 private:
  struct Pending {
    std::set<std::string> creations;
    std::set<std::string> deletions;
    double set_at = 0;  // MonotonicSeconds() of the latest Expect
  };
  int64_t ttl_ms_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Pending> pending_;
};

}  // namespace lockstep::op::controller
