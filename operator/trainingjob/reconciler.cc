#include "operator/trainingjob/reconciler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "common/deadline.h"
#include "common/logging.h"
#include "common/rendezvous/client.h"
#include "common/tls/certificates.h"
#include "operator/trainingjob/admission.h"
#include "operator/trainingjob/job_status.h"
#include "operator/trainingjob/pod_cache.h"
#include "operator/trainingjob/reconciler_work.h"

namespace lockstep::op::trainingjob {

using json = nlohmann::json;
using controller::ObjectPtr;
namespace res = kube::resources;
using kube::IsAlreadyExists;

TrainingJobReconciler::TrainingJobReconciler(ReconcilerDeps deps, ReconcilerOptions options)
    : deps_(deps), options_(std::move(options)) {}

double TrainingJobReconciler::Now() const {
  if (options_.now_unix_seconds) return options_.now_unix_seconds();
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {

// A job's token for one purpose: the master key's HMAC of the purpose and the job's identity, so
// a restarted operator derives it again and one purpose's token is no other's.
std::string DerivedToken(const std::string& master_key, const std::string& purpose,
                         const spec::TrainingJob& job) {
  return tls::HmacSha256Hex(master_key, purpose + "/" + job.metadata.namespace_ + "/" +
                                            job.metadata.name + "/" + job.metadata.uid);
}

}  // namespace

std::string TrainingJobReconciler::Token(const spec::TrainingJob& job) const {
  return DerivedToken(options_.master_key, "rendezvous-token", job);
}

std::string TrainingJobReconciler::ParameterServerToken(const spec::TrainingJob& job) const {
  return DerivedToken(options_.master_key, "parameter-server-token", job);
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
  } else if (old_pod && new_pod) {
    // As client-go's ReplicaSet controller does: a pod being deleted counts as deleted for the
    // expectations. It keeps its index until it is gone (nothing is created twice, a terminating
    // failed pod is not counted again), and a pod whose deletion no kubelet will confirm (a lost
    // node) does not hold the job's reconciles, DeleteIfNodeLost among them, until the TTL.
    if (IsTerminating(*new_pod) && !IsTerminating(*old_pod)) {
      deps_.expectations->DeletionObserved(key, (*new_pod)["metadata"].value("uid", ""));
    }
  }
  if (old_pod && new_pod && deps_.rendezvous) {
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
    straggler_records_.erase(key);
    store_refusals_told_.erase(key);
    placement_warned_.erase(key);
    counted_failures_.erase(key);
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
    w.job.metadata.name = object["metadata"].value("name", "");
    w.job.metadata.namespace_ = object["metadata"].value("namespace", "default");
    w.job.metadata.uid = uid;
    // The labels say whether Kueue holds a group for it (CleanUpFinished ends it).
    // Named: a range-for over a temporary's items() would read the temporary after it died.
    const json labels = object["metadata"].value("labels", json::object());
    for (const auto& [key, value] : labels.items()) {
      if (value.is_string()) w.job.metadata.labels[key] = value.get<std::string>();
    }
    // Finished: what its end left undone (a pod not stopped or not marked, the TTL) is retried.
    if (JobFinished(w.old_status)) return CleanUpFinished(w);
    const std::string& message = parsed.status().message();
    Status s = Finish(w, /*succeeded=*/false, "InvalidSpec", message);
    w.result->terminal = s.ok();
    return s;
  }
  w.job = std::move(*parsed);
  const spec::RunPolicy& policy = w.job.spec.run_policy;
  w.status["observedGeneration"] = w.job.metadata.generation;
  w.status["selector"] = PodSelector(w.job.metadata.name);

  // 3. Finished jobs.
  if (JobFinished(w.old_status)) return CleanUpFinished(w);

  // 4. Suspend and resume.
  std::vector<ObjectPtr> pods = deps_.pods->ByIndex(kJobIndex, w.key);
  KueueGroup(w, pods);
  if (policy.suspend) {
    if (!deps_.expectations->Satisfied(w.key)) {
      w.RequeueAfter(1000);
      return OkStatus();
    }
    // Kueue would hold the group's quota for its pods' replacements; the resume queues anew.
    // Pods deleted before they say so could leave the group open: they wait for a retry.
    Status ended = w.kueue ? MarkKueueGroupDone(w) : OkStatus();
    if (!ended.ok() && w.error.ok()) w.error = ended;
    for (const ObjectPtr& pod : ended.ok() ? pods : std::vector<ObjectPtr>{}) {
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
    if (HasCondition(w.status, kQueued)) {
      SetCondition(&w.status, kQueued, false, "Suspended", "the job is suspended", w.now);
    }
    w.status["phase"] = "Suspended";
    ComputeStatus(w);
    w.status["phase"] = "Suspended";
    Status write = WriteStatus(w);
    return w.error.ok() ? write : w.error;
  }
  if (HasCondition(w.status, kSuspended)) {
    SetCondition(&w.status, kSuspended, false, "Resumed", "spec.runPolicy.suspend is false", w.now);
    // Like a Job's: the deadline counts from the resume (under Kueue, from the admission).
    if (w.kueue) {
      w.status.erase("startTime");
    } else {
      w.status["startTime"] = w.now;
    }
    deps_.events->Record(object, controller::EventType::kNormal, "Resumed",
                         "job resumed: creating its worker pods");
  }
  // A job Kueue queues starts when Kueue admits it (ComputeStatus): the queue is not run time.
  if (!w.status.contains("startTime") && !w.kueue) w.status["startTime"] = w.now;

  // 5. activeDeadlineSeconds.
  if (policy.active_deadline_seconds && w.status.contains("startTime")) {
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
    if (JobPhase(w.status).empty()) w.status["phase"] = "Pending";
    Status write = WriteStatus(w);
    (void)write;
    return children;
  }
  ReportPlaces(w);
  CheckPlacementLevel(w);
  Status pods_status = ReconcilePods(w);
  if (JobFinished(w.status)) return pods_status;
  Status servers_status = ReconcileParameterServers(w);
  if (JobFinished(w.status)) return servers_status;
  if (pods_status.ok()) pods_status = servers_status;

  // 9.
  ComputeStatus(w);
  Status write = WriteStatus(w);
  if (write.ok()) ReplaceRestartedPods(w);
  if (!w.error.ok()) return w.error;
  if (!pods_status.ok()) return pods_status;
  if (!JobFinished(w.status)) {
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
    if (job.spec.parameter_servers.replicas > 0) {
      LOCKSTEP_RETURN_IF_ERROR(create(res::kServices, DesiredParameterServerService(job)));
    }
    if (job.spec.parameter_servers.replicas > 0 && job.spec.trainer.has_value()) {
      // TLS exactly when the rendezvous has it: the server pods mount a certificate then.
      const tls::KeyPair ca{options_.settings.rendezvous_ca_pem, options_.ca_key_pem};
      const bool tls = !ca.cert_pem.empty();
      if (tls && ca.key_pem.empty()) {
        return FailedPreconditionError(
            "parameter servers: the operator has no CA key to sign "
            "their certificate (ReconcilerOptions::ca_key_pem)");
      }
      LOCKSTEP_ASSIGN_OR_RETURN(
          json secret,
          DesiredParameterServerSecret(job, ParameterServerToken(job), tls ? &ca : nullptr));
      LOCKSTEP_RETURN_IF_ERROR(create(res::kSecrets, secret));
    }
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
    // elastic moves both; with standbys the largest generation is replicas): register again.
    // Members rejoin the new registration with their state.
    // So do new store limits (spec.rendezvous.store).
    const std::string registration = uid + "|" + std::to_string(job.spec.elastic.min_replicas) +
                                     "/" + std::to_string(spec::MaxWorld(job.spec)) + "|" +
                                     std::to_string(job.spec.rendezvous.store.max_keys) + "/" +
                                     std::to_string(job.spec.rendezvous.store.max_bytes);
    auto it = hosted_.find(w.key);
    if (it == hosted_.end() || it->second != registration) {
      // A registration anew counts its store refusals from 0: told again from the first.
      store_refusals_told_.erase(w.key);
      // Generations are numbered on from the newest any registration reached: the status (a
      // previous operator's) or, registering again, this service's own.
      int64_t last_generation = 0;
      // A generation was training (by the status, or this service's own): its members may
      // resume it here rather than re-form (proto/rendezvous.proto, step 4).
      bool training = false;
      if (w.status.contains("rendezvous") && w.status["rendezvous"].is_object()) {
        const json& generation = w.status["rendezvous"].value("generation", json(0));
        if (generation.is_number_integer()) last_generation = generation.get<int64_t>();
        const json& rendezvous = w.status["rendezvous"];
        training = rendezvous.contains("worldSize") &&
                   rendezvous["worldSize"].is_number_integer() &&
                   rendezvous["worldSize"].get<int64_t>() > 0;
      }
      if (it != hosted_.end()) {
        StatusOr<rendezvous::JobSnapshot> hosted = deps_.rendezvous->Snapshot(w.key);
        if (hosted.ok()) {
          last_generation = std::max(last_generation, hosted->generation);
          training = hosted->generation_active;
        }
        (void)deps_.rendezvous->RemoveJob(w.key);
      }
      rendezvous::JobConfig config;
      config.first_generation = std::max<int64_t>(last_generation, 0) + 1;
      config.job = w.key;
      config.token = Token(job);
      config.min_members = job.spec.elastic.min_replicas;
      config.max_members = spec::MaxWorld(job.spec);
      config.initial_members = job.spec.replicas;
      config.ranks_per_pod = job.spec.ranks_per_worker;  // members count pods
      config.pods_multiple = spec::PodsPerPipelineReplicas(job.spec);
      config.last_call_ms = options_.rendezvous_last_call_ms;
      config.heartbeat_interval_ms = options_.rendezvous_heartbeat_interval_ms;
      config.heartbeat_timeout_ms = options_.rendezvous_heartbeat_timeout_ms;
      config.order_by_topology = !options_.topology_keys.empty();
      config.store_limits = config.store_limits.SetByJob(job.spec.rendezvous.store.max_keys,
                                                         job.spec.rendezvous.store.max_bytes);
      // Its members come back within a heartbeat timeout of each other, plus one connection
      // attempt that hung on the old leader's address.
      if (training) {
        config.resume_window_ms =
            options_.rendezvous_heartbeat_timeout_ms + rendezvous::kConnectAttemptTimeoutMs;
      }
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

}  // namespace lockstep::op::trainingjob
