#include "operator/trainingjob/reconciler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <utility>

#include "common/deadline.h"
#include "common/logging.h"
#include "common/termination_message.h"
#include "common/utf8.h"
#include "operator/tls/certificates.h"
#include "operator/trainingjob/admission.h"
#include "operator/trainingjob/job_status.h"

namespace lockstep::op::trainingjob {

using json = nlohmann::json;
using controller::ObjectPtr;
namespace res = kube::resources;
using kube::IsAlreadyExists;
using kube::IsConflict;
using kube::IsInvalid;
using kube::IsNotFound;

namespace {

std::string JobKeyOfPod(const json& pod) {
  const json& meta = pod.value("metadata", json::object());
  const json labels = meta.value("labels", json::object());
  if (!labels.is_object() || !labels.contains(kJobNameLabel)) return "";
  return meta.value("namespace", "") + "/" + labels[kJobNameLabel].get<std::string>();
}

std::string PodPhase(const json& pod) {
  if (!pod.contains("status")) return "Pending";
  return pod["status"].value("phase", "Pending");
}

bool IsTerminating(const json& pod) {
  return pod["metadata"].contains("deletionTimestamp") &&
         !pod["metadata"]["deletionTimestamp"].is_null();
}

bool IsReady(const json& pod) {
  if (!pod.contains("status")) return false;
  for (const json& c : pod["status"].value("conditions", json::array())) {
    if (c.value("type", "") == "Ready") return c.value("status", "") == "True";
  }
  return false;
}

// -1 when the pod carries no valid index.
int32_t PodIndex(const json& pod) {
  const json labels = pod["metadata"].value("labels", json::object());
  if (!labels.contains(kReplicaIndexLabel) || !labels[kReplicaIndexLabel].is_string()) return -1;
  const std::string text = labels[kReplicaIndexLabel].get<std::string>();
  if (text.empty() || text.size() > 6 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoi(text);
}

bool OwnedBy(const json& pod, const std::string& uid) {
  for (const json& ref : pod["metadata"].value("ownerReferences", json::array())) {
    if (ref.value("uid", "") == uid && ref.value("controller", false)) return true;
  }
  return false;
}

std::string Phase(const json& status) { return status.value("phase", ""); }

bool Finished(const json& status) {
  const std::string phase = Phase(status);
  return phase == "Succeeded" || phase == "Failed";
}

// A merge patch (RFC 7386) that turns `from` into `to`: keys that disappear become null, in
// nested objects too (a merge patch merges them key by key, so a field status.progress no longer
// has would otherwise stay forever).
json StatusMergePatch(const json& from, const json& to) {
  json patch = to;
  if (from.is_object() && to.is_object()) {
    for (auto it = from.begin(); it != from.end(); ++it) {
      const auto next = to.find(it.key());
      if (next == to.end()) {
        patch[it.key()] = nullptr;
      } else if (it->is_object() && next->is_object()) {
        patch[it.key()] = StatusMergePatch(*it, *next);
      }
    }
  }
  return patch;
}

// status.progress from the workers' report: only what they know; a field they cannot know
// (an exec program that reports no loss or rate) is absent rather than a 0 that reads like one.
json ProgressStatus(const rendezvous::ProgressReport& p) {
  json progress = {{"step", p.step}};
  if (p.total_steps > 0) progress["totalSteps"] = p.total_steps;
  if (p.samples_per_second > 0) progress["samplesPerSecond"] = p.samples_per_second;
  if (p.scaling_efficiency > 0) progress["scalingEfficiency"] = p.scaling_efficiency;
  if (p.has_loss) progress["loss"] = p.loss;
  const double left =
      EstimatedSecondsRemaining(p.step, p.total_steps, p.samples, p.samples_per_second);
  if (left >= 0) progress["estimatedSecondsRemaining"] = std::round(left);
  return progress;
}

}  // namespace

std::vector<std::string> JobIndexOfPod(const json& pod) {
  std::string key = JobKeyOfPod(pod);
  if (key.empty()) return {};
  return {key};
}


json TrimPod(json pod) {
  // Only what the reconciler and the handlers read: at 4,000 pods every field kept costs
  // hundreds of KB (an nlohmann node is ~100 bytes with its key).
  json out = json::object();
  json meta = json::object();
  json& m = pod["metadata"];
  for (const char* field : {"name", "namespace", "uid", "resourceVersion", "deletionTimestamp"}) {
    if (m.contains(field)) meta[field] = std::move(m[field]);
  }
  if (m.contains("labels") && m["labels"].is_object()) {
    json labels = json::object();
    for (const char* label : {kJobNameLabel, kReplicaIndexLabel}) {
      if (m["labels"].contains(label)) labels[label] = std::move(m["labels"][label]);
    }
    meta["labels"] = std::move(labels);
  }
  for (const json& ref : m.value("ownerReferences", json::array())) {
    if (ref.value("controller", false)) {
      meta["ownerReferences"] =
          json::array({{{"uid", ref.value("uid", "")}, {"controller", true}}});
    }
  }
  out["metadata"] = std::move(meta);
  if (pod.contains("status")) {
    json& s = pod["status"];
    json status = json::object();
    if (s.contains("phase")) status["phase"] = std::move(s["phase"]);
    if (s.contains("reason")) status["reason"] = std::move(s["reason"]);
    for (const json& c : s.value("conditions", json::array())) {
      if (c.value("type", "") == "Ready") {
        status["conditions"] =
            json::array({{{"type", "Ready"}, {"status", c.value("status", "")}}});
      }
    }
    json containers = json::array();
    for (const json& c : s.value("containerStatuses", json::array())) {
      if (!c.contains("state") || !c["state"].is_object()) continue;
      const json& state = c["state"];
      if (state.contains("terminated") && state["terminated"].is_object()) {
        json terminated = {{"exitCode", state["terminated"].value("exitCode", -1)}};
        // Kept only when the agents gave up (WorkerGaveUpMessage): that fails the job.
        const json message = state["terminated"].value("message", json());
        if (message.is_string() && message.get<std::string>().rfind(kGaveUpPrefix, 0) == 0) {
          terminated["message"] = Utf8Prefix(message.get<std::string>(), 1024);
        }
        containers.push_back(
            {{"name", c.value("name", "")}, {"state", {{"terminated", std::move(terminated)}}}});
      } else if (state.contains("waiting") && state["waiting"].is_object() &&
                 IsStuckWaitingReason(state["waiting"].value("reason", ""))) {
        // A container that cannot start without a change (WorkerStuckReason).
        containers.push_back(
            {{"name", c.value("name", "")},
             {"state",
              {{"waiting",
                {{"reason", state["waiting"].value("reason", "")},
                 {"message", Utf8Prefix(state["waiting"].value("message", ""), 1024)}}}}}});
      }
    }
    if (!containers.empty()) status["containerStatuses"] = std::move(containers);
    out["status"] = std::move(status);
  }
  return out;
}

json TrimJob(json job) {
  if (job.contains("metadata")) {
    json& m = job["metadata"];
    m.erase("managedFields");
    if (m.contains("annotations") && m["annotations"].is_object()) {
      m["annotations"].erase("kubectl.kubernetes.io/last-applied-configuration");
      if (m["annotations"].empty()) m.erase("annotations");
    }
  }
  return job;
}

struct TrainingJobReconciler::Work {
  std::string key;
  ObjectPtr object;
  spec::TrainingJob job;
  json old_status;
  json status;
  std::string now;
  controller::Result* result = nullptr;
  std::map<int32_t, ObjectPtr> by_index;  // pods of this incarnation with a valid index
  bool any_succeeded = false;
  bool created_pods = false;
  std::vector<std::string> created_names;  // pods this reconcile created (not yet cached)
  bool restarted = false;
  Status error;  // the first failure worth retrying
  void RequeueAfter(int64_t ms) {
    if (ms <= 0) ms = 1;
    if (result->requeue_after_ms == 0 || ms < result->requeue_after_ms) {
      result->requeue_after_ms = ms;
    }
  }
};

TrainingJobReconciler::TrainingJobReconciler(ReconcilerDeps deps, ReconcilerOptions options)
    : deps_(deps), options_(std::move(options)) {}

double TrainingJobReconciler::Now() const {
  if (options_.now_unix_seconds) return options_.now_unix_seconds();
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string TrainingJobReconciler::Token(const spec::TrainingJob& job) const {
  return tls::HmacSha256Hex(options_.master_key, "rendezvous-token/" + job.metadata.namespace_ +
                                                     "/" + job.metadata.name + "/" +
                                                     job.metadata.uid);
}

std::string TrainingJobReconciler::OnPodEvent(const json* old_pod, const json* new_pod) {
  const json& any = new_pod ? *new_pod : *old_pod;
  const std::string key = JobKeyOfPod(any);
  if (key.empty()) return "";
  const std::string name = any["metadata"].value("name", "");
  if (!old_pod && new_pod) {
    deps_.expectations->CreationObserved(key, name);
  } else if (old_pod && !new_pod) {
    deps_.expectations->DeletionObserved(key, (*old_pod)["metadata"].value("uid", ""));
    if (deps_.rendezvous) deps_.rendezvous->RemoveMember(key, name, "pod " + name + " deleted");
  } else if (old_pod && new_pod && deps_.rendezvous) {
    // Tell the rendezvous service at once, so survivors re-form without waiting for missed
    // heartbeats.
    if (PodPhase(*new_pod) == "Failed" && PodPhase(*old_pod) != "Failed") {
      deps_.rendezvous->RemoveMember(
          key, name,
          "pod " + name + " failed (exit code " + std::to_string(WorkerExitCode(*new_pod)) + ")");
    } else if (IsTerminating(*new_pod) && !IsTerminating(*old_pod)) {
      deps_.rendezvous->RemoveMember(key, name, "pod " + name + " is being deleted");
    }
  }
  return key;
}

Status TrainingJobReconciler::Reconcile(const std::string& key, controller::Result* result) {
  Work w;
  w.key = key;
  w.result = result;
  w.object = deps_.jobs->Get(key);
  if (!w.object) {
    // Gone: its children go with it (owner references). Forget what we held for it.
    deps_.expectations->Forget(key);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = hosted_.find(key);
    if (it != hosted_.end()) {
      if (deps_.rendezvous) (void)deps_.rendezvous->RemoveJob(key);
      children_ensured_.erase(it->second.substr(0, it->second.find('|')));
      hosted_.erase(it);
    }
    return OkStatus();
  }
  const json& object = *w.object;
  if (object["metadata"].contains("deletionTimestamp") &&
      !object["metadata"]["deletionTimestamp"].is_null()) {
    return OkStatus();
  }
  w.old_status = object.value("status", json::object());
  if (!w.old_status.is_object()) w.old_status = json::object();
  w.status = w.old_status;
  w.now = Rfc3339(Now());
  return ReconcileJob(w);
}

Status TrainingJobReconciler::ReconcileJob(Work& w) {
  const json& object = *w.object;
  const std::string uid = object["metadata"].value("uid", "");

  // 2. What the schema cannot express: the same validation as `lockstep validate`.
  // The admission webhook refuses such a spec up front; this catches jobs created while it was
  // off or unreachable (failurePolicy Ignore) and rules newer than the job.
  StatusOr<spec::TrainingJob> parsed = ParseTrainingJobObject(object);
  if (!parsed.ok()) {
    if (Finished(w.old_status)) return OkStatus();
    const std::string& message = parsed.status().message();
    w.job.metadata.name = object["metadata"].value("name", "");
    w.job.metadata.namespace_ = object["metadata"].value("namespace", "default");
    w.job.metadata.uid = uid;
    Status s = Finish(w, /*succeeded=*/false, "InvalidSpec", message);
    w.result->terminal = s.ok();
    return s;
  }
  w.job = std::move(*parsed);
  const spec::RunPolicy& policy = w.job.spec.run_policy;
  w.status["observedGeneration"] = w.job.metadata.generation;
  w.status["selector"] = PodSelector(w.job.metadata.name);

  // 3. Finished jobs.
  if (Finished(w.old_status)) return CleanUpFinished(w);

  // 4. Suspend and resume.
  std::vector<ObjectPtr> pods = deps_.pods->ByIndex(kJobIndex, w.key);
  if (policy.suspend) {
    if (!deps_.expectations->Satisfied(w.key)) {
      w.RequeueAfter(1000);
      return OkStatus();
    }
    for (const ObjectPtr& pod : pods) {
      if (!IsTerminating(*pod) && PodPhase(*pod) != "Succeeded" && PodPhase(*pod) != "Failed") {
        Status s = DeletePod(w, *pod, "the job is suspended");
        if (!s.ok() && w.error.ok()) w.error = s;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (hosted_.erase(w.key) && deps_.rendezvous) (void)deps_.rendezvous->RemoveJob(w.key);
    }
    if (!HasCondition(w.status, kSuspended)) {
      deps_.events->Record(object, controller::EventType::kNormal, "Suspended",
                           "job suspended: its worker pods are deleted");
    }
    SetCondition(&w.status, kSuspended, true, "Suspended", "spec.runPolicy.suspend is true", w.now);
    SetCondition(&w.status, kRunning, false, "Suspended", "the job is suspended", w.now);
    w.status["phase"] = "Suspended";
    ComputeStatus(w);
    w.status["phase"] = "Suspended";
    Status write = WriteStatus(w);
    return w.error.ok() ? write : w.error;
  }
  if (HasCondition(w.status, kSuspended)) {
    SetCondition(&w.status, kSuspended, false, "Resumed", "spec.runPolicy.suspend is false", w.now);
    // Like a Job's: the deadline counts from the resume.
    w.status["startTime"] = w.now;
    deps_.events->Record(object, controller::EventType::kNormal, "Resumed",
                         "job resumed: creating its worker pods");
  }
  if (!w.status.contains("startTime")) w.status["startTime"] = w.now;

  // 5. activeDeadlineSeconds.
  if (policy.active_deadline_seconds) {
    const double started = ParseRfc3339(w.status.value("startTime", w.now));
    const double deadline = started + static_cast<double>(*policy.active_deadline_seconds);
    const double left = deadline - Now();
    if (left <= 0) {
      return Finish(w, false, "DeadlineExceeded",
                    "the job ran longer than spec.runPolicy.activeDeadlineSeconds (" +
                        std::to_string(*policy.active_deadline_seconds) + " s)");
    }
    w.RequeueAfter(static_cast<int64_t>(std::ceil(left * 1000)));
  }

  // 6. Our own writes not yet in the cache: acting now could create a pod twice.
  if (!deps_.expectations->Satisfied(w.key)) {
    w.RequeueAfter(1000);
    return OkStatus();
  }

  // 7-8.
  Status children = EnsureChildren(w);
  if (!children.ok()) {
    SetCondition(&w.status, kCreated, false, "FailedCreate", children.message(), w.now);
    if (Phase(w.status).empty()) w.status["phase"] = "Pending";
    Status write = WriteStatus(w);
    (void)write;
    return children;
  }
  Status pods_status = ReconcilePods(w);
  if (Finished(w.status)) return pods_status;

  // 9.
  ComputeStatus(w);
  Status write = WriteStatus(w);
  if (!w.error.ok()) return w.error;
  if (!pods_status.ok()) return pods_status;
  if (Phase(w.status) != "Succeeded" && Phase(w.status) != "Failed") {
    w.RequeueAfter(options_.progress_interval_ms);
  }
  return write;
}

Status TrainingJobReconciler::EnsureChildren(Work& w) {
  const spec::TrainingJob& job = w.job;
  const std::string& ns = job.metadata.namespace_;
  const std::string& uid = job.metadata.uid;
  bool ensure = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = children_ensured_.find(uid);
    ensure = it == children_ensured_.end() ||
             MonotonicSeconds() - it->second > options_.children_recheck_ms / 1000.0;
  }
  if (ensure) {
    auto create = [&](const kube::Resource& resource, const json& object) -> Status {
      StatusOr<json> created = deps_.client->Create(resource, ns, object);
      if (created.ok() || IsAlreadyExists(created.status())) return OkStatus();
      deps_.events->Record(
          *w.object, controller::EventType::kWarning, "FailedCreate" + resource.kind,
          "creating " + resource.kind + " " + object["metadata"].value("name", "") + ": " +
              created.status().message());
      return created.status().WithContext("creating " + resource.kind);
    };
    LOCKSTEP_RETURN_IF_ERROR(
        create(res::kSecrets, DesiredSecret(job, Token(job), options_.settings.rendezvous_ca_pem)));
    LOCKSTEP_RETURN_IF_ERROR(create(res::kServices, DesiredService(job)));
    std::optional<json> group = DesiredPodGroup(job);
    if (group) {
      const bool volcano = job.spec.run_policy.scheduling.gang == spec::GangScheduler::kVolcano;
      if ((volcano && !deps_.has_podgroup_crds_volcano) ||
          (!volcano && !deps_.has_podgroup_crds_scheduler_plugins)) {
        const std::string message =
            std::string("spec.runPolicy.scheduling.gang: ") +
            spec::ToString(job.spec.run_policy.scheduling.gang) +
            " needs the PodGroup CRD, which is not installed in this cluster";
        return FailedPreconditionError(message);
      }
      LOCKSTEP_RETURN_IF_ERROR(
          create(volcano ? res::kVolcanoPodGroups : res::kSchedulerPluginsPodGroups, *group));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (children_ensured_.emplace(uid, MonotonicSeconds()).second && deps_.metrics) {
      deps_.metrics->JobCreated();
    } else {
      children_ensured_[uid] = MonotonicSeconds();
    }
  }
  if (deps_.rendezvous) {
    std::lock_guard<std::mutex> lock(mutex_);
    // A new incarnation of the name, or new membership bounds (scaling a job that is not
    // elastic moves both): register again. Members rejoin the new registration with their state.
    const std::string registration = uid + "|" + std::to_string(job.spec.elastic.min_replicas) +
                                     "/" + std::to_string(job.spec.elastic.max_replicas);
    auto it = hosted_.find(w.key);
    if (it == hosted_.end() || it->second != registration) {
      // Generations are numbered on from the newest any registration reached: the status (a
      // previous operator's) or, registering again, this service's own.
      int64_t last_generation = 0;
      if (w.status.contains("rendezvous") && w.status["rendezvous"].is_object()) {
        const json& generation = w.status["rendezvous"].value("generation", json(0));
        if (generation.is_number_integer()) last_generation = generation.get<int64_t>();
      }
      if (it != hosted_.end()) {
        StatusOr<rendezvous::JobSnapshot> hosted = deps_.rendezvous->Snapshot(w.key);
        if (hosted.ok()) last_generation = std::max(last_generation, hosted->generation);
        (void)deps_.rendezvous->RemoveJob(w.key);
      }
      rendezvous::JobConfig config;
      config.first_generation = std::max<int64_t>(last_generation, 0) + 1;
      config.job = w.key;
      config.token = Token(job);
      config.min_members = job.spec.elastic.min_replicas;
      config.max_members = job.spec.elastic.max_replicas;
      config.initial_members = job.spec.replicas;
      config.ranks_per_pod = job.spec.ranks_per_worker;  // members count pods
      config.last_call_ms = options_.rendezvous_last_call_ms;
      config.heartbeat_interval_ms = options_.rendezvous_heartbeat_interval_ms;
      config.heartbeat_timeout_ms = options_.rendezvous_heartbeat_timeout_ms;
      Status added = deps_.rendezvous->AddJob(config);
      if (!added.ok() && added.code() != StatusCode::kAlreadyExists) return added;
      hosted_[w.key] = registration;
    }
  }
  if (!HasCondition(w.status, kCreated)) {
    SetCondition(&w.status, kCreated, true, "ChildrenCreated",
                 "Secret, Service" + std::string(DesiredPodGroup(job) ? ", PodGroup" : "") +
                     " and rendezvous registration in place",
                 w.now);
  }
  return OkStatus();
}

Status TrainingJobReconciler::DeletePod(Work& w, const json& pod, const std::string& why) {
  const std::string name = pod["metadata"].value("name", "");
  const std::string uid = pod["metadata"].value("uid", "");
  deps_.expectations->ExpectDeletions(w.key, {uid});
  kube::DeleteOptions options;
  options.precondition_uid = uid;
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

Status TrainingJobReconciler::ReconcilePods(Work& w) {
  const spec::TrainingJob& job = w.job;
  const spec::RunPolicy& policy = job.spec.run_policy;
  const int32_t desired = job.spec.replicas;
  const std::string& uid = job.metadata.uid;

  for (const ObjectPtr& pod : deps_.pods->ByIndex(kJobIndex, w.key)) {
    const int32_t index = PodIndex(*pod);
    // A pod of an earlier job of the same name, or one whose labels were edited: not ours to
    // count. Pods of an earlier incarnation go with their owner; others are left alone.
    if (index < 0 || !OwnedBy(*pod, uid)) continue;
    if (PodPhase(*pod) == "Succeeded") w.any_succeeded = true;
    auto [it, inserted] = w.by_index.emplace(index, pod);
    // Two pods for one index cannot be created by us (same name); keep the newest view.
    if (!inserted) it->second = pod;
  }

  // Failed workers first: they may fail the job, and then nothing else is created.
  for (auto& [index, pod] : w.by_index) {
    if (index >= desired || IsTerminating(*pod) || PodPhase(*pod) != "Failed") continue;
    if (w.any_succeeded) continue;  // training completed; a late failure changes nothing
    const std::string name = (*pod)["metadata"].value("name", "");
    const int32_t exit_code = WorkerExitCode(*pod);
    const std::string what =
        "pod " + name + " failed" +
        (exit_code >= 0
             ? " with exit code " + std::to_string(exit_code)
             : " (" + (*pod)["status"].value("reason", std::string("no exit code")) + ")");
    // The exec agents gave up: they hold the job's restart budget and already applied the run
    // policy; a replacement pod would read the same give-up and exit again.
    if (const std::string gave_up = WorkerGaveUpMessage(*pod); !gave_up.empty()) {
      return Finish(w, false, "WorkersGaveUp", what + ": " + gave_up);
    }
    const ExitDecision decision = DecideExit(policy, exit_code);
    if (decision == ExitDecision::kFailJob) {
      return Finish(w, false, "PodFailed",
                    what + "; spec.runPolicy.restartPolicy " +
                        spec::ToString(policy.restart_policy) + " does not retry it");
    }
    const int64_t restarts = w.status.value("restarts", int64_t{0});
    if (restarts >= policy.backoff_limit) {
      return Finish(w, false, "BackoffLimitExceeded",
                    what + "; the job was restarted " + std::to_string(restarts) +
                        " times, spec.runPolicy.backoffLimit is " +
                        std::to_string(policy.backoff_limit));
    }
    // Count first, in the status written below with the cached resourceVersion: if that write
    // conflicts the reconcile runs again on fresh data, and the pending deletion expectation
    // keeps this failure from being counted twice meanwhile.
    w.status["restarts"] = restarts + 1;
    Status s = DeletePod(w, *pod,
                         what + "; replacing it (restart " + std::to_string(restarts + 1) +
                             " of at most " + std::to_string(policy.backoff_limit) + ")");
    if (!s.ok() && w.error.ok()) w.error = s;
    deps_.events->Record(*w.object, controller::EventType::kWarning, "RestartingWorker",
                         what + "; restart " + std::to_string(restarts + 1) + "/" +
                             std::to_string(policy.backoff_limit));
    if (deps_.metrics) deps_.metrics->JobRestarted();
    w.restarted = true;
    SetCondition(&w.status, kRestarting, true, "WorkerFailed", what, w.now);
  }

  // Scale-down: only the pods past the new replica count go.
  for (auto& [index, pod] : w.by_index) {
    if (index < desired || IsTerminating(*pod)) continue;
    const std::string phase = PodPhase(*pod);
    if (phase == "Succeeded") continue;
    Status s = DeletePod(w, *pod, "spec.replicas is " + std::to_string(desired) + " (scaled down)");
    if (!s.ok() && w.error.ok()) w.error = s;
  }

  // Missing workers: scale-up, deleted or replaced pods.
  if (w.any_succeeded) return OkStatus();
  std::vector<int32_t> missing;
  for (int32_t index = 0; index < desired; ++index) {
    auto it = w.by_index.find(index);
    if (it == w.by_index.end()) missing.push_back(index);
  }
  if (missing.empty()) return OkStatus();
  std::set<std::string> names;
  for (int32_t index : missing) names.insert(PodName(job.metadata.name, index));
  deps_.expectations->ExpectCreations(w.key, names);
  for (int32_t index : missing) {
    const std::string name = PodName(job.metadata.name, index);
    StatusOr<json> created = deps_.client->Create(res::kPods, job.metadata.namespace_,
                                                  DesiredPod(job, index, options_.settings));
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

void TrainingJobReconciler::ComputeStatus(Work& w) {
  const int32_t desired = w.job.spec.replicas;
  int32_t active = 0, ready = 0, running = 0, succeeded = 0, failed = 0;
  for (auto& [index, pod] : w.by_index) {
    const std::string phase = PodPhase(*pod);
    if (phase == "Succeeded") {
      ++succeeded;
    } else if (phase == "Failed") {
      ++failed;
    } else if (!IsTerminating(*pod) && index < desired) {
      ++active;
      if (phase == "Running") ++running;
      if (IsReady(*pod)) ++ready;
    }
  }
  // Pods created by this reconcile are not in the cache yet: they are active (Pending), and
  // counting them now saves a second status write when the cache catches up.
  active += static_cast<int32_t>(w.created_names.size());
  const int64_t previous_desired =
      w.old_status.contains("replicas") ? w.old_status["replicas"].value("desired", int64_t{0}) : 0;
  w.status["replicas"] = {{"desired", desired},
                          {"active", active},
                          {"ready", ready},
                          {"succeeded", succeeded},
                          {"failed", failed}};

  // What the workers report through rendezvous.
  if (deps_.rendezvous) {
    StatusOr<rendezvous::JobSnapshot> snapshot = deps_.rendezvous->Snapshot(w.key);
    if (snapshot.ok()) {
      const rendezvous::JobSnapshot& s = *snapshot;
      if (s.generation > 0) {
        w.status["rendezvous"] = {{"generation", s.generation}, {"worldSize", s.world_size}};
      }
      const rendezvous::ProgressReport& p =
          s.final_progress.step > 0 ? s.final_progress : s.progress;
      if (p.step > 0) w.status["progress"] = ProgressStatus(p);
      if (p.last_checkpoint_step >= 0 && !p.last_checkpoint_uri.empty()) {
        const json old = w.old_status.value("lastCheckpoint", json::object());
        const bool same =
            old.is_object() && old.value("step", int64_t{-1}) == p.last_checkpoint_step;
        w.status["lastCheckpoint"] = {{"step", p.last_checkpoint_step},
                                      {"uri", p.last_checkpoint_uri},
                                      {"time", same ? old.value("time", w.now) : w.now}};
      }
    }
  }

  // Terminal: every worker that was asked for is done, and one at least completed.
  if (w.any_succeeded && active == 0) {
    (void)Finish(w, true, "WorkersSucceeded",
                 std::to_string(succeeded) + " of " + std::to_string(desired) +
                     " workers completed training");
    return;
  }

  const bool all_running = running == desired && active == desired;
  const bool generation_active =
      !deps_.rendezvous ||
      (w.status.contains("rendezvous") && w.status["rendezvous"].value("worldSize", 0) > 0);
  std::string stuck;  // the first worker that cannot start, and why
  for (auto& [index, pod] : w.by_index) {
    if (index >= desired || IsTerminating(*pod)) continue;
    const std::string why = WorkerStuckReason(*pod);
    if (!why.empty()) {
      stuck = "pod " + (*pod)["metadata"].value("name", "") + ": " + why;
      break;
    }
  }
  std::string phase;
  if (previous_desired != 0 && previous_desired != desired) {
    SetCondition(&w.status, kScaling, true, "ReplicasChanged",
                 "spec.replicas changed from " + std::to_string(previous_desired) + " to " +
                     std::to_string(desired),
                 w.now);
    deps_.events->Record(*w.object, controller::EventType::kNormal, "Scaling",
                         "scaling from " + std::to_string(previous_desired) + " to " +
                             std::to_string(desired) + " workers");
  }
  if (all_running) {
    if (HasCondition(w.status, kScaling)) {
      SetCondition(&w.status, kScaling, false, "Scaled",
                   std::to_string(desired) + " workers running", w.now);
    }
    if (HasCondition(w.status, kRestarting)) {
      SetCondition(&w.status, kRestarting, false, "WorkersRunning", "every worker is running again",
                   w.now);
    }
  }
  if (HasCondition(w.status, kRestarting)) {
    phase = "Restarting";
  } else if (HasCondition(w.status, kScaling)) {
    phase = "Scaling";
  } else if (all_running && generation_active) {
    phase = "Running";
  } else {
    phase = "Created";
  }
  if (phase == "Running") {
    if (!HasCondition(w.status, kRunning)) {
      SetCondition(&w.status, kRunning, true, "WorkersRunning",
                   std::to_string(desired) + " workers running in rendezvous generation " +
                       std::to_string(w.status.contains("rendezvous")
                                          ? w.status["rendezvous"].value("generation", int64_t{0})
                                          : 0),
                   w.now);
    }
  } else if (!stuck.empty()) {
    // A worker that cannot start until someone acts (a root image under runAsNonRoot, an image
    // that cannot be pulled): say so where `kubectl describe tj` shows it.
    SetCondition(&w.status, kRunning, false, "WorkerCannotStart", stuck, w.now);
  } else if (HasCondition(w.status, kRunning) || w.status.contains("conditions")) {
    // Keep the Running condition's history: it turns False while restarting or scaling.
    bool had = false;
    for (const json& c : w.status.value("conditions", json::array())) {
      if (c.value("type", "") == kRunning) had = true;
    }
    if (had) {
      SetCondition(&w.status, kRunning, false, phase,
                   std::to_string(running) + " of " + std::to_string(desired) + " workers running",
                   w.now);
    }
  }
  w.status["phase"] = phase;
}

Status TrainingJobReconciler::Finish(Work& w, bool succeeded, const std::string& reason,
                                     const std::string& message) {
  const bool was_finished = Finished(w.status);
  // What the server held before this reconcile (WriteStatus below replaces old_status).
  const bool stored_finished = Finished(w.old_status);
  w.status["phase"] = succeeded ? "Succeeded" : "Failed";
  SetCondition(&w.status, succeeded ? kSucceeded : kFailed, true, reason, message, w.now);
  for (const char* type : {kRunning, kRestarting, kScaling}) {
    if (HasCondition(w.status, type)) {
      SetCondition(&w.status, type, false, reason,
                   "the job " + std::string(succeeded ? "succeeded" : "failed"), w.now);
    }
  }
  if (!w.status.contains("completionTime")) w.status["completionTime"] = w.now;
  if (!was_finished) {
    deps_.events->Record(
        *w.object, succeeded ? controller::EventType::kNormal : controller::EventType::kWarning,
        reason, message);
  }
  Status write = WriteStatus(w);
  if (!write.ok()) return write;
  if (!was_finished && !stored_finished && deps_.metrics) {
    succeeded ? deps_.metrics->JobSucceeded() : deps_.metrics->JobFailed();
  }
  LOCKSTEP_LOG(INFO) << w.key << ": " << (succeeded ? "succeeded" : "failed") << " (" << reason
                     << "): " << message;
  return CleanUpFinished(w);
}

Status TrainingJobReconciler::CleanUpFinished(Work& w) {
  // Workers still running after the job failed (or after it succeeded without them) are
  // stopped: nothing would ever use them.
  Status first;
  if (!w.job.metadata.uid.empty()) {
    for (const ObjectPtr& pod : deps_.pods->ByIndex(kJobIndex, w.key)) {
      const std::string phase = PodPhase(*pod);
      if (IsTerminating(*pod) || phase == "Succeeded" || phase == "Failed") continue;
      if (!OwnedBy(*pod, w.job.metadata.uid)) continue;
      Status s = DeletePod(w, *pod, "the job finished");
      if (!s.ok() && first.ok()) first = s;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (hosted_.erase(w.key) && deps_.rendezvous) (void)deps_.rendezvous->RemoveJob(w.key);
  }
  const std::optional<int64_t> ttl = w.job.spec.run_policy.ttl_seconds_after_finished;
  if (ttl) {
    const double completed = ParseRfc3339(w.status.value("completionTime", w.now));
    const double left = completed + static_cast<double>(*ttl) - Now();
    if (left <= 0) {
      kube::DeleteOptions options;
      options.propagation_policy = "Background";
      options.precondition_uid = w.job.metadata.uid;
      Status s = deps_.client->Delete(kube::resources::kTrainingJobs, w.job.metadata.namespace_,
                                      w.job.metadata.name, options);
      if (!s.ok() && !IsNotFound(s) && !IsConflict(s)) return s;
      LOCKSTEP_LOG(INFO) << w.key << ": deleted " << *ttl
                         << " s after it finished (ttlSecondsAfterFinished)";
      return first;
    }
    w.RequeueAfter(static_cast<int64_t>(std::ceil(left * 1000)));
  }
  return first;
}

Status TrainingJobReconciler::WriteStatus(Work& w) {
  if (w.status == w.old_status) return OkStatus();
  json patch = {
      {"metadata", {{"resourceVersion", (*w.object)["metadata"].value("resourceVersion", "")}}},
      {"status", StatusMergePatch(w.old_status, w.status)}};
  StatusOr<json> updated = deps_.client->Patch(
      kube::resources::kTrainingJobs, w.job.metadata.namespace_,
      (*w.object)["metadata"].value("name", ""), kube::PatchType::kMerge, patch, "status");
  if (updated.ok()) {
    // Later steps of this reconcile compare against what is now stored.
    w.old_status = w.status;
    return OkStatus();
  }
  if (IsNotFound(updated.status())) return OkStatus();
  // A conflict means the cache was stale: the informer brings the fresh job and it is queued
  // again; returning the error retries it with back-off meanwhile.
  return updated.status().WithContext("writing status");
}

}  // namespace lockstep::op::trainingjob
