// TrainingJobReconciler, the parameter servers (spec.parameterServers; children.h, "Parameter
// servers"): one pod per server created when missing; a failed server replaced (it restores its
// shard's newest checkpoint), counted against backoffLimit as a worker's restart, or, without
// spec.checkpoint.uri, the job failed: its shard of the model is lost. A job Kueue queues gets
// its servers once Kueue has admitted its workers (KueueHoldsTheWorkers).
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "operator/trainingjob/job_status.h"
#include "operator/trainingjob/pod_cache.h"
#include "operator/trainingjob/reconciler.h"
#include "operator/trainingjob/reconciler_work.h"

namespace lockstep::op::trainingjob {

namespace res = kube::resources;
using json = nlohmann::json;
using controller::ObjectPtr;
using kube::IsAlreadyExists;

namespace {

// The server index of a pod of the job's servers; -1 for any other pod.
int32_t ServerIndex(const json& pod) {
  if (LabelOf(pod, kReplicaTypeLabel) != "ps") return -1;
  const std::string text = LabelOf(pod, kParameterServerIndexLabel);
  if (text.empty() || text.size() > 6 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::stoi(text);
}

}  // namespace

// Whether the job waits for Kueue: it is queued and none of its workers is past the gate yet
// (none bound to a node or running). Its servers are then not created: they would hold their CPU
// and memory, outside the group's quota, while the workers wait in the queue. The servers stay
// out of the pod group because Kueue never recreates a pod and counts a group done when all its
// pods succeeded, while a server is replaced by the operator and stops only when told: as
// members, they would need a group of their own rules. Once created they stay through a re-queue
// (a preemption of the workers): they hold the model. A suspend deletes them with every pod.
bool TrainingJobReconciler::KueueHoldsTheWorkers(const Work& w) {
  if (!w.kueue) return false;
  for (const auto& [index, pod] : w.by_index) {
    if (IsTerminating(*pod)) continue;
    const std::string phase = PodPhase(*pod);
    if (phase == "Succeeded" || phase == "Failed") continue;
    if (PastItsSchedulingGate(*pod)) return false;
  }
  return true;
}

Status TrainingJobReconciler::ReconcileParameterServers(Work& w) {
  const spec::TrainingJob& job = w.job;
  const int32_t servers = job.spec.parameter_servers.replicas;
  if (servers == 0) return OkStatus();
  std::map<int32_t, ObjectPtr> by_shard;
  for (const ObjectPtr& pod : deps_.pods->ByIndex(kJobIndex, w.key)) {
    const int32_t shard = ServerIndex(*pod);
    if (shard < 0 || !OwnedBy(*pod, job.metadata.uid)) continue;
    auto [it, inserted] = by_shard.emplace(shard, pod);
    if (!inserted && CreationTimestampOf(*pod) > CreationTimestampOf(*it->second)) {
      it->second = pod;
    }
  }
  int32_t ready = 0;
  for (const auto& [shard, pod] : by_shard) {
    const std::string name = (*pod)["metadata"].value("name", "");
    if (IsTerminating(*pod)) {
      DeleteIfNodeLost(w, *pod);
      continue;
    }
    if (shard >= servers) {
      // The job's servers are fixed when it starts (the rows are sharded by their count);
      // a pod past them is another incarnation's, or edited.
      Status s = DeletePod(w, *pod, "spec.parameterServers.replicas is " + std::to_string(servers));
      if (!s.ok() && w.error.ok()) w.error = s;
      continue;
    }
    const std::string phase = PodPhase(*pod);
    if (phase == "Running" && IsReady(*pod)) ++ready;
    if (phase != "Failed" && phase != "Succeeded") continue;
    if (w.any_succeeded) continue;  // training completed: the servers are being stopped
    const int32_t exit_code = WorkerExitCode(*pod);
    std::string what =
        "parameter server " + name + " " +
        (phase == "Succeeded"
             ? std::string("stopped")
             : "failed" + (exit_code >= 0 ? " with exit code " + std::to_string(exit_code)
                                          : std::string()));
    if (const std::string error = WorkerTerminationMessage(*pod); !error.empty()) {
      what += " (" + error + ")";
    }
    // The built-in trainer's server holds the model: without a checkpoint its shard is gone. A
    // TensorFlow job's ps task is replaced like a worker; its program restores its variables.
    if (job.spec.trainer.has_value() && job.spec.checkpoint.uri.empty()) {
      return Finish(w, false, "ParameterServerLost",
                    what +
                        ": its shard of the model is lost (set spec.checkpoint.uri for the "
                        "servers to checkpoint their shards and restore them)");
    }
    // Stopped by the cluster (preempted, evicted, drained: a server exits 0 only when told to
    // stop), not by its own failure: replaced without counting a restart, as a worker is.
    const std::string disruption = DisruptedBy(*pod);
    if (!disruption.empty() || phase == "Succeeded") {
      Status s =
          DeletePod(w, *pod,
                    what + (disruption.empty() ? "" : " by the cluster (" + disruption + ")") +
                        "; replacing it without counting a restart");
      if (!s.ok() && w.error.ok()) w.error = s;
      continue;
    }
    // Its replacement restores the shard's newest checkpoint while the workers wait for it.
    const std::string replacement = job.spec.trainer.has_value()
                                        ? "; its replacement restores its shard's newest checkpoint"
                                        : "";
    if (std::optional<Status> finished =
            CountRestart(w, pod, what, replacement, "ParameterServerFailed")) {
      return *finished;
    }
  }
  w.status["parameterServers"] = {{"replicas", servers}, {"ready", ready}};
  if (w.any_succeeded) return OkStatus();

  std::set<std::string> names;
  std::string created_names;
  for (int32_t shard = 0; shard < servers; ++shard) {
    if (by_shard.count(shard) == 0) names.insert(ParameterServerPodName(job.metadata.name, shard));
  }
  if (names.empty()) return OkStatus();
  if (by_shard.empty() && KueueHoldsTheWorkers(w)) return OkStatus();
  deps_.expectations->ExpectCreations(w.key, names);
  for (int32_t shard = 0; shard < servers; ++shard) {
    if (by_shard.count(shard) != 0) continue;
    const std::string name = ParameterServerPodName(job.metadata.name, shard);
    StatusOr<json> created =
        deps_.client->Create(res::kPods, job.metadata.namespace_,
                             DesiredParameterServerPod(job, shard, options_.settings));
    if (created.ok()) {
      w.created_pods = true;
      created_names += (created_names.empty() ? "" : ", ") + name;
      continue;
    }
    deps_.expectations->CreationObserved(w.key, name);
    if (IsAlreadyExists(created.status())) continue;
    deps_.events->Record(*w.object, controller::EventType::kWarning, "FailedCreatePod",
                         "creating pod " + name + ": " + created.status().message());
    if (w.error.ok()) w.error = created.status().WithContext("creating pod " + name);
  }
  if (!created_names.empty()) {
    deps_.events->Record(
        *w.object, controller::EventType::kNormal, "SuccessfulCreatePod",
        "created parameter-server pod" +
            std::string(created_names.find(',') != std::string::npos ? "s " : " ") + created_names);
  }
  return OkStatus();
}

}  // namespace lockstep::op::trainingjob
