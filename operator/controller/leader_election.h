// LeaderElector: one active operator among replicas, through a coordination.k8s.io/v1 Lease
// (client-go's leaderelection with a LeaseLock).
//
//   LeaderElector elector(client, {.lease_namespace = "lockstep-system",
//                                  .lease_name = "lockstep-operator", .identity = pod_name});
//   elector.Run([&] { StartControllers(); }, [&] { StopControllers(); });   // returns at once
//   ... elector.IsLeader() ...
//   elector.Stop();   // releases the lease so a standby takes over without waiting it out
//
// Protocol: a candidate creates the Lease or, when the holder has not renewed it within
// lease_duration_ms (measured on the candidate's own clock from when it last saw the Lease
// change, never by comparing clocks), takes it over with an Update carrying the observed
// resourceVersion (a conflict means someone else won). The leader renews every retry_period_ms;
// if it cannot renew within renew_deadline_ms it stops leading (calls on_stopped_leading) before
// anyone else may take over (renew_deadline_ms < lease_duration_ms), so two leaders never act
// at once.
//
// Thread safety: IsLeader from any thread; callbacks run on the elector's thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "operator/kube/kube_client.h"

namespace lockstep::op::controller {

struct LeaderElectionOptions {
  std::string lease_namespace = "default";
  std::string lease_name = "lockstep-operator";
  std::string identity;  // unique per replica (the pod name); required
  int64_t lease_duration_ms = 15000;
  int64_t renew_deadline_ms = 10000;
  int64_t retry_period_ms = 2000;
};

class LeaderElector {
 public:
  LeaderElector(kube::KubeClient* client, LeaderElectionOptions options);
  ~LeaderElector();  // Stop()

  // Starts campaigning on a thread. on_started_leading runs when this replica becomes leader;
  // on_stopped_leading when it loses or gives up the lease (after having led).
  void Run(std::function<void()> on_started_leading, std::function<void()> on_stopped_leading);
  // Stops campaigning; a leader releases the lease (holderIdentity cleared). Idempotent.
  void Stop();
  bool IsLeader() const { return leader_.load(); }
  // The Lease's holder as this replica last read or wrote it: "" before the first read and while
  // none holds it (client-go's GetLeader).
  std::string ObservedLeader() const;

 private:
  void Loop();
  bool TryAcquireOrRenew();
  void Release();             // a leader's Stop: clears holderIdentity so a standby need not wait
  void SleepFor(int64_t ms);  // woken early by Stop
  void SetObservedHolder(const std::string& holder);

  kube::KubeClient* client_;
  LeaderElectionOptions options_;
  std::function<void()> on_started_, on_stopped_;
  std::atomic<bool> leader_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  // The Lease's spec as last seen and when (our monotonic clock) it last changed: a holder is
  // presumed alive until lease_duration_ms after we saw its record change.
  nlohmann::json observed_spec_;
  double observed_at_ = 0;
  std::string observed_holder_;  // written by the campaign thread under holder_mutex_
  mutable std::mutex holder_mutex_;
};

}  // namespace lockstep::op::controller
