// EventRecorder: core/v1 Events about an object, what `kubectl describe` shows under "Events".
//
//   events.Record(job, EventType::kWarning, "FailedCreatePod",
//                 "creating pod fashion-worker-2: pods \"...\" is forbidden: ...");
//
// Repeats of the same (object, type, reason, message) within 10 minutes update one Event's count
// and lastTimestamp instead of creating another (what the kubelet's and client-go's recorders
// do), so a crash-looping job cannot flood etcd. Recording never blocks the caller: events go to
// a bounded queue (oldest dropped when full, counted) that a thread writes; failures are logged,
// never returned. Thread safety: Record from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "operator/kube/kube_client.h"

namespace lockstep::op::controller {

enum class EventType { kNormal, kWarning };

class EventRecorder {
 public:
  // component: the Event's source.component ("lockstep-operator").
  EventRecorder(kube::KubeClient* client, std::string component, size_t max_queued = 1000);
  ~EventRecorder();  // writes what is queued (bounded: 5 s), then stops

  // `object` is the involved object (apiVersion, kind, metadata.namespace/name/uid/
  // resourceVersion are read).
  void Record(const nlohmann::json& object, EventType type, const std::string& reason,
              const std::string& message);

  // Blocks until every event recorded so far was written or timeout_ms passed (tests).
  bool Flush(int64_t timeout_ms);
  int64_t dropped() const;

 private:
  struct Pending;
  void Loop();
  kube::KubeClient* client_;
  std::string component_;
  size_t max_queued_;
  // implementation state
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep::op::controller
