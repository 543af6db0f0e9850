// TrainingJobReconciler::Work: one reconcile's state, shared by the reconciler's parts
// (reconciler.cc: the job and its children; reconciler_pods.cc: the worker pods;
// reconciler_status.cc: status and the end of a job). Internal to operator/trainingjob.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "operator/trainingjob/reconciler.h"

namespace lockstep::op::trainingjob {

struct TrainingJobReconciler::Work {
  std::string key;
  controller::ObjectPtr object;
  spec::TrainingJob job;
  nlohmann::json old_status;
  nlohmann::json status;
  std::string now;
  controller::Result* result = nullptr;
  std::map<int32_t, controller::ObjectPtr> by_index;  // pods of this incarnation with a valid index
  bool any_succeeded = false;
  bool created_pods = false;
  std::vector<std::string> created_names;  // pods this reconcile created (not yet cached)
  // Failed workers this reconcile counts as restarts (status.restarts in `status`): their pods
  // are deleted only once that status is stored (ReplaceRestartedPods), so that a write that
  // conflicts with a stale cache loses no count.
  struct Restart {
    controller::ObjectPtr pod;
    std::string what;  // "pod x failed with exit code 137"
    int64_t number = 0;
  };
  std::vector<Restart> restarts;
  // Kueue queues the job (a plain pod group, reconciler_kueue.cc). Its group keeps the size
  // Kueue admitted: when spec.replicas asks for another, job.spec.replicas holds the group's
  // and this the spec's.
  bool kueue = false;
  std::string kueue_group;  // the pod group the job's pods join
  bool kueue_stopped = false;  // a pod Kueue stopped is still in the API: the group was evicted
  // spec.placement asks for a level no node carries (CheckPlacementLevel): why, for status.
  std::string placement_problem;
  int32_t kueue_spec_replicas = 0;
  Status error;  // the first failure worth retrying
  void RequeueAfter(int64_t ms) {
    if (ms <= 0) ms = 1;
    if (result->requeue_after_ms == 0 || ms < result->requeue_after_ms) {
      result->requeue_after_ms = ms;
    }
  }
};

}  // namespace lockstep::op::trainingjob
