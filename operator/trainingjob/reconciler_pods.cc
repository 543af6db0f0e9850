// TrainingJobReconciler, the worker pods (step 8 of reconciler.h): failed workers replaced or
// failing the job under the run policy, scale-down, missing pods created.
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/logging.h"
#include "operator/trainingjob/job_status.h"
#include "operator/trainingjob/pod_cache.h"
#include "operator/trainingjob/reconciler.h"
#include "operator/trainingjob/reconciler_work.h"

namespace lockstep::op::trainingjob {

namespace res = kube::resources;
using json = nlohmann::json;
using controller::ObjectPtr;
using kube::IsAlreadyExists;
using kube::IsConflict;
using kube::IsInvalid;
using kube::IsNotFound;

Status TrainingJobReconciler::DeletePod(Work& w, const json& pod, const std::string& why,
                                        std::optional<int64_t> grace_seconds) {
  const std::string name = pod["metadata"].value("name", "");
  const std::string uid = pod["metadata"].value("uid", "");
  // A pod already terminating counted as deleted when it began to (OnPodEvent); deleting it again
  // (grace 0 on a lost node) may leave it in the API under a finalizer, with no event to wait for.
  const bool terminating = IsTerminating(pod);
  if (!terminating) deps_.expectations->ExpectDeletions(w.key, {uid});
  kube::DeleteOptions options;
  options.precondition_uid = uid;
  options.grace_period_seconds = grace_seconds;
  Status s = deps_.client->Delete(res::kPods, w.job.metadata.namespace_, name, options);
  if (s.ok()) {
    deps_.events->Record(*w.object, controller::EventType::kNormal, "SuccessfulDeletePod",
                         "deleted pod " + name + ": " + why);
    if (deps_.rendezvous) deps_.rendezvous->RemoveMember(w.key, name, why);
    return OkStatus();
  }
  // Gone already (or another incarnation): the informer's delete event settles the expectation;
  // if it never comes, the expectation expires.
  if (IsNotFound(s) || IsConflict(s)) {
    deps_.expectations->DeletionObserved(w.key, uid);
    return OkStatus();
  }
  deps_.expectations->DeletionObserved(w.key, uid);
  deps_.events->Record(*w.object, controller::EventType::kWarning, "FailedDeletePod",
                       "deleting pod " + name + ": " + s.message());
  return s;
}

void TrainingJobReconciler::ReplaceRestartedPods(Work& w) {
  const int64_t limit = w.job.spec.run_policy.backoff_limit;
  for (const Work::Restart& restart : w.restarts) {
    const std::string uid = (*restart.pod)["metadata"].value("uid", "");
    const std::string number = std::to_string(restart.number);
    if (restart.number > 0) {
      deps_.events->Record(*w.object, controller::EventType::kWarning, "RestartingWorker",
                           restart.what + "; restart " + number + "/" + std::to_string(limit));
      if (deps_.metrics) deps_.metrics->JobRestarted();
    }
    Status s = DeletePod(w, *restart.pod,
                         restart.what + (restart.number > 0
                                             ? "; replacing it (restart " + number +
                                                   " of at most " + std::to_string(limit) + ")"
                                             : "; replacing it (its restart is counted)"));
    std::lock_guard<std::mutex> lock(mutex_);
    if (s.ok()) {
      auto it = counted_failures_.find(w.key);
      if (it != counted_failures_.end() && it->second.erase(uid) && it->second.empty()) {
        counted_failures_.erase(it);
      }
      continue;
    }
    counted_failures_[w.key].insert(uid);
    if (w.error.ok()) w.error = s;
  }
}

// A pod being deleted stays in the API until its kubelet confirms that its containers are gone;
// on a node that stopped answering that never happens, and a pod evicted from it (the not-ready
// and unreachable taints, after the tolerationSeconds DesiredPod sets) stays Terminating for
// ever, its name taken, and the job can only wait (Kubeflow training-operator#2072). Past the
// end of its grace period (deletionTimestamp) plus a margin for a slow kubelet, a pod whose node
// is gone or not Ready is deleted with grace 0. Its containers may still run on a partitioned
// node; they cannot rejoin the job's training: the rendezvous service already dropped the member
// (its heartbeats stopped) and its replacement takes its place in the next generation.
void TrainingJobReconciler::DeleteIfNodeLost(Work& w, const json& pod) {
  constexpr double kMarginSeconds = 15;
  const json& meta = pod["metadata"];
  const double ends = ParseRfc3339(meta.value("deletionTimestamp", ""));
  if (ends < 0) return;
  const double now = Now();
  if (now < ends + kMarginSeconds) {
    w.RequeueAfter(static_cast<int64_t>(std::ceil((ends + kMarginSeconds - now) * 1000)));
    return;
  }
  const std::string node = NodeNameOf(pod);
  if (node.empty()) return;  // never scheduled: the API server deletes it at once
  std::string why;
  StatusOr<json> got = deps_.client->Get(res::kNodes, "", node);
  if (!got.ok() && !IsNotFound(got.status())) {
    w.RequeueAfter(5000);  // cannot tell; ask again
    return;
  }
  if (!got.ok()) {
    why = "its node " + node + " no longer exists";
  } else {
    std::string ready = "Unknown", reason;
    for (const json& c : got->value("status", json::object()).value("conditions", json::array())) {
      if (c.value("type", "") == "Ready") {
        ready = c.value("status", "Unknown");
        reason = c.value("reason", "");
      }
    }
    if (ready == "True") {
      w.RequeueAfter(10000);  // the kubelet answers; it will finish the deletion
      return;
    }
    why = "its node " + node + " is not Ready (" + ready + (reason.empty() ? "" : ", " + reason) +
          ")";
  }
  const std::string name = meta.value("name", "");
  Status s = DeletePod(w, pod,
                       "deleted with grace 0: " + why + " and no kubelet confirmed its deletion",
                       /*grace_seconds=*/0);
  if (s.ok()) {
    LOCKSTEP_LOG(WARNING) << w.key << ": pod " << name << " deleted with grace 0: " << why;
  } else if (w.error.ok()) {
    w.error = s;
  }
}

std::optional<Status> TrainingJobReconciler::CountRestart(Work& w, const ObjectPtr& pod,
                                                          const std::string& what,
                                                          const std::string& replacement,
                                                          const char* reason) {
  const spec::RunPolicy& policy = w.job.spec.run_policy;
  bool counted = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = counted_failures_.find(w.key);
    counted =
        it != counted_failures_.end() && it->second.count((*pod)["metadata"].value("uid", "")) > 0;
  }
  if (counted) {  // its restart is stored; an earlier deletion failed
    w.restarts.push_back({pod, what, 0});
    return std::nullopt;
  }
  const int64_t restarts = w.status.value("restarts", int64_t{0});
  if (restarts >= policy.backoff_limit) {
    return Finish(w, false, "BackoffLimitExceeded",
                  what + "; the job was restarted " + std::to_string(restarts) +
                      " times, spec.runPolicy.backoffLimit is " +
                      std::to_string(policy.backoff_limit));
  }
  // Counted in the status written at the end of this reconcile, with the cached
  // resourceVersion; the pod goes only once that write is stored (ReplaceRestartedPods). A
  // write that conflicts (the cache was stale) leaves the failed pod in place for the next
  // reconcile to count on fresh data; deleting it first would lose the count with the pod.
  w.status["restarts"] = restarts + 1;
  w.restarts.push_back({pod, what + replacement, restarts + 1});
  SetCondition(&w.status, kRestarting, true, reason, what, w.now);
  return std::nullopt;
}

Status TrainingJobReconciler::ReconcilePods(Work& w) {
  const spec::TrainingJob& job = w.job;
  const spec::RunPolicy& policy = job.spec.run_policy;
  // replicas, then the standbys: every pod is alike, the rendezvous decides which trains.
  const int32_t desired = spec::WorkersToRun(job.spec);
  const std::string& uid = job.metadata.uid;

  // Under Kueue a pod that Kueue no longer counts in its group (failed, or deleted before it
  // was scheduled) gives up its index at once, though Kueue's finalizer may keep it in the API
  // until its replacement exists: the replacement then takes a name of its own.
  auto released = [&](const json& pod) {
    return w.kueue && IsTerminating(pod) && !KueueCountsPod(pod);
  };
  for (const ObjectPtr& pod : deps_.pods->ByIndex(kJobIndex, w.key)) {
    const int32_t index = PodIndex(*pod);
    // A pod of an earlier job of the same name, or one whose labels were edited: not ours to
    // count. Pods of an earlier incarnation go with their owner; others are left alone.
    if (index < 0 || !OwnedBy(*pod, uid)) continue;
    if (PodPhase(*pod) == "Succeeded") w.any_succeeded = true;
    if (w.kueue && StoppedByKueue(*pod)) w.kueue_stopped = true;
    auto [it, inserted] = w.by_index.emplace(index, pod);
    if (inserted) continue;
    // Two pods for one index: only a released pod and its replacement (Kueue), as every other
    // pod of an index has the same name. The one that holds the index wins, else the newest.
    const bool held = !released(*pod), other_held = !released(*it->second);
    if (held != other_held ? held : CreationTimestampOf(*pod) >= CreationTimestampOf(*it->second)) {
      it->second = pod;
    }
  }

  // A counted failure whose pod is gone needs no more deleting.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto counted = counted_failures_.find(w.key);
    if (counted != counted_failures_.end()) {
      // Every pod of the job: the parameter servers' counted failures too (reconciler_ps.cc).
      std::set<std::string> present;
      for (const ObjectPtr& pod : deps_.pods->ByIndex(kJobIndex, w.key)) {
        present.insert((*pod)["metadata"].value("uid", ""));
      }
      for (auto uid = counted->second.begin(); uid != counted->second.end();) {
        uid = present.count(*uid) > 0 ? std::next(uid) : counted->second.erase(uid);
      }
      if (counted->second.empty()) counted_failures_.erase(counted);
    }
  }

  // Pods whose deletion no kubelet will confirm (their node is lost) hold their names, which
  // their replacements need.
  for (auto& [index, pod] : w.by_index) {
    if (IsTerminating(*pod)) DeleteIfNodeLost(w, *pod);
  }

  // Failed workers first: they may fail the job, and then nothing else is created.
  for (auto& [index, pod] : w.by_index) {
    if (index >= desired || IsTerminating(*pod) || PodPhase(*pod) != "Failed") continue;
    if (w.any_succeeded) continue;  // training completed; a late failure changes nothing
    const std::string name = (*pod)["metadata"].value("name", "");
    // Stopped by the cluster (preempted, evicted, its node drained), not by its program: a
    // replacement, not a restart counted against backoffLimit.
    if (const std::string disruption = DisruptedBy(*pod); !disruption.empty()) {
      const std::string what = "pod " + name + " was stopped by the cluster (" + disruption + ")";
      Status s = DeletePod(w, *pod, what + "; replacing it without counting a restart");
      if (!s.ok() && w.error.ok()) w.error = s;
      deps_.events->Record(*w.object, controller::EventType::kNormal, "WorkerDisrupted",
                           what + "; replacing it");
      continue;
    }
    const int32_t exit_code = WorkerExitCode(*pod);
    std::string what =
        "pod " + name + " failed" +
        (exit_code >= 0
             ? " with exit code " + std::to_string(exit_code)
             : " (" + (*pod)["status"].value("reason", std::string("no exit code")) + ")");
    // The exec agents gave up: they hold the job's restart budget and already applied the run
    // policy; a replacement pod would read the same give-up and exit again.
    if (const std::string gave_up = WorkerGaveUpMessage(*pod); !gave_up.empty()) {
      return Finish(w, false, "WorkersGaveUp", what + ": " + gave_up);
    }
    // The worker's own error, through the kubelet's termination message.
    if (const std::string error = WorkerTerminationMessage(*pod); !error.empty()) {
      what += " (" + error + ")";
    }
    const ExitDecision decision = DecideExit(policy, exit_code);
    if (decision == ExitDecision::kFailJob) {
      return Finish(w, false, "PodFailed",
                    what + "; spec.runPolicy.restartPolicy " +
                        spec::ToString(policy.restart_policy) + " does not retry it");
    }
    if (std::optional<Status> finished = CountRestart(w, pod, what, "", "WorkerFailed")) {
      return *finished;
    }
  }

  // Scale-down: only the pods past the new replica count go.
  for (auto& [index, pod] : w.by_index) {
    if (index < desired || IsTerminating(*pod)) continue;
    const std::string phase = PodPhase(*pod);
    if (phase == "Succeeded") continue;
    Status s = DeletePod(w, *pod,
                         "spec.replicas + spec.elastic.standby is " + std::to_string(desired) +
                             " (scaled down)");
    if (!s.ok() && w.error.ok()) w.error = s;
  }

  // Missing workers: scale-up, deleted or replaced pods.
  if (w.any_succeeded) return OkStatus();
  // index -> its name: PodName, or for the replacement of a released pod still in the API,
  // PodName and the first 5 characters of the released pod's uid.
  std::map<int32_t, std::string> missing;
  for (int32_t index = 0; index < desired; ++index) {
    auto it = w.by_index.find(index);
    if (it == w.by_index.end()) {
      missing[index] = PodName(job.metadata.name, index);
    } else if (released(*it->second)) {
      missing[index] = PodName(job.metadata.name, index) + "-" +
                       (*it->second)["metadata"].value("uid", "").substr(0, 5);
    }
  }
  if (missing.empty()) return OkStatus();
  std::set<std::string> names;
  for (const auto& [index, name] : missing) names.insert(name);
  const std::vector<std::string> avoid_nodes = StragglerNodes(w);  // where stragglers were replaced
  deps_.expectations->ExpectCreations(w.key, names);
  for (const auto& [index, name] : missing) {
    StatusOr<json> created =
        deps_.client->Create(res::kPods, job.metadata.namespace_,
                             DesiredPod(job, index, options_.settings, avoid_nodes, name,
                                        w.kueue_group));
    if (created.ok()) {
      w.created_pods = true;
      w.created_names.push_back(name);
      continue;
    }
    deps_.expectations->CreationObserved(w.key, name);
    if (IsAlreadyExists(created.status())) continue;  // the cache will show it
    deps_.events->Record(*w.object, controller::EventType::kWarning, "FailedCreatePod",
                         "creating pod " + name + ": " + created.status().message());
    if (IsInvalid(created.status())) {
      // The API server refuses the pod the spec describes (e.g. spec.template): retrying cannot
      // help.
      return Finish(w, false, "InvalidPodTemplate",
                    "the API server refused pod " + name + ": " + created.status().message());
    }
    SetCondition(&w.status, kCreated, false, "FailedCreatePod",
                 "creating pod " + name + ": " + created.status().message(), w.now);
    if (w.error.ok()) w.error = created.status().WithContext("creating pod " + name);
  }
  // One Event per reconcile, not per pod: at a thousand jobs a per-pod Event doubles the
  // operator's writes and overflows the recorder's queue.
  if (!w.created_names.empty()) {
    std::string names;
    for (const std::string& name : w.created_names) names += (names.empty() ? "" : ", ") + name;
    deps_.events->Record(
        *w.object, controller::EventType::kNormal, "SuccessfulCreatePod",
        "created pod" + std::string(w.created_names.size() > 1 ? "s " : " ") + names);
  }
  return OkStatus();
}

}  // namespace lockstep::op::trainingjob
