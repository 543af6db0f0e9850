// TrainingJobReconciler, status and the end of a job (step 9 and steps 3, 5 of reconciler.h):
// the status computed from the pods and the rendezvous snapshot, written only when it changed;
// a job's end (conditions, Event, metrics) and what is cleaned up after it (pods, the
// rendezvous registration, the job itself after ttlSecondsAfterFinished).
#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "common/logging.h"
#include "operator/trainingjob/job_status.h"
#include "operator/trainingjob/pod_cache.h"
#include "operator/trainingjob/reconciler.h"
#include "operator/trainingjob/reconciler_work.h"

namespace lockstep::op::trainingjob {

using json = nlohmann::json;
using controller::ObjectPtr;
using kube::IsConflict;
using kube::IsNotFound;

namespace {

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
  json display = json::object();
  if (progress.contains("samplesPerSecond")) {
    display["samplesPerSecond"] = DisplayRate(p.samples_per_second);
  }
  if (progress.contains("scalingEfficiency")) {
    display["scalingEfficiency"] = DisplayPercent(p.scaling_efficiency);
  }
  if (left >= 0) display["remaining"] = DisplayDuration(left);
  if (!display.empty()) progress["display"] = display;
  return progress;
}

}  // namespace

void TrainingJobReconciler::ComputeStatus(Work& w) {
  const int32_t desired = spec::WorkersToRun(w.job.spec);  // pods, standbys included
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

  // What the workers report through rendezvous; with standbys, which pods train.
  std::set<std::string> training_pods;
  bool knows_training_pods = false;
  if (deps_.rendezvous) {
    StatusOr<rendezvous::JobSnapshot> snapshot = deps_.rendezvous->Snapshot(w.key);
    // Not hosted (suspended, or not registered yet): nobody trains, so nobody is slow.
    if (!snapshot.ok()) ReportStragglers(w, {});
    if (snapshot.ok()) {
      const rendezvous::JobSnapshot& s = *snapshot;
      if (s.resuming && w.old_status.contains("rendezvous")) {
        // Its members are resuming their generation here (a new leader): they train in what
        // the status says until every rank is back.
        w.status["rendezvous"] = w.old_status["rendezvous"];
      } else if (s.generation > 0) {
        w.status["rendezvous"] = {{"generation", s.generation}, {"worldSize", s.world_size}};
        if (w.job.spec.elastic.standby > 0) {
          // Pods: a standby pod of several ranks waits with all of them.
          w.status["rendezvous"]["standby"] =
              rendezvous::StandbyCount(s) / std::max(1, w.job.spec.ranks_per_worker);
        }
      }
      for (const rendezvous::MemberInfo& member : s.members) {
        training_pods.insert(member.pod.empty() ? member.member_id : member.pod);
      }
      knows_training_pods = s.generation > 0 && !s.resuming;
      const rendezvous::ProgressReport& p =
          s.final_progress.step > 0 ? s.final_progress : s.progress;
      if (p.step > 0) w.status["progress"] = ProgressStatus(p);
      ReportStragglers(w, s.stragglers);
      ReportStoreRefusals(w, s);
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

  // Terminal: every worker that was asked for is done, and one at least completed. A standby
  // pod outside the final generation has nothing to finish: it may not even be scheduled (the
  // cluster had no room for it), so it is not waited for; Finish stops it.
  int32_t active_standbys = 0, trained = succeeded;
  if (w.job.spec.elastic.standby > 0 && w.any_succeeded && knows_training_pods) {
    trained = 0;  // a standby told the job completed exits 0 too: count the final generation's
    for (auto& [index, pod] : w.by_index) {
      const std::string phase = PodPhase(*pod);
      const bool training = training_pods.count((*pod)["metadata"].value("name", "")) != 0;
      if (phase == "Succeeded" && training) ++trained;
      if (phase == "Succeeded" || phase == "Failed" || IsTerminating(*pod) || index >= desired) {
        continue;
      }
      if (!training) ++active_standbys;
    }
  }
  if (w.any_succeeded && active - active_standbys == 0) {
    (void)Finish(w, true, "WorkersSucceeded",
                 std::to_string(trained) + " of " + std::to_string(w.job.spec.replicas) +
                     " workers completed training");
    return;
  }

  // The job runs once replicas pods do: a standby still pending changes nothing.
  const int32_t needed = w.job.spec.replicas;
  const bool all_running = running >= needed && active >= needed;
  const bool generation_active =
      !deps_.rendezvous ||
      (w.status.contains("rendezvous") && w.status["rendezvous"].value("worldSize", 0) > 0);
  std::string stuck;  // the first worker that cannot start, and why
  // Active workers a scheduling gate holds back (and what holds them), and those it does not.
  int32_t gated = 0, admitted = 0;
  std::string gate;
  for (auto& [index, pod] : w.by_index) {
    if (index >= desired || IsTerminating(*pod)) continue;
    const std::string why = WorkerStuckReason(*pod);
    if (!why.empty() && stuck.empty()) {
      stuck = "pod " + (*pod)["metadata"].value("name", "") + ": " + why;
    }
    const std::string phase = PodPhase(*pod);
    if (phase == "Succeeded" || phase == "Failed") continue;
    if (std::string by = SchedulingGatedBy(*pod); !by.empty()) {
      ++gated;
      gate = std::move(by);
    } else if (PastItsSchedulingGate(*pod)) {
      ++admitted;
    }
  }
  ReportQueue(w, gated, admitted, gate);
  std::string phase;
  if (previous_desired != 0 && previous_desired != desired) {
    SetCondition(&w.status, kScaling, true, "ReplicasChanged",
                 std::string(w.job.spec.elastic.standby > 0
                                 ? "worker pods (spec.replicas + spec.elastic.standby)"
                                 : "spec.replicas") +
                     " changed from " + std::to_string(previous_desired) + " to " +
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
  if (gated > 0 && admitted == 0) {
    phase = "Queued";
  } else if (HasCondition(w.status, kRestarting)) {
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
      const int32_t standby = w.job.spec.elastic.standby;
      SetCondition(&w.status, kRunning, true, "WorkersRunning",
                   std::to_string(desired - standby) + " workers " +
                       (standby > 0 ? "and " + std::to_string(standby) + " standby " : "") +
                       "running in rendezvous generation " +
                       std::to_string(w.status.contains("rendezvous")
                                          ? w.status["rendezvous"].value("generation", int64_t{0})
                                          : 0),
                   w.now);
    }
  } else if (!w.placement_problem.empty() &&
             w.job.spec.placement.mode == spec::PlacementMode::kRequired) {
    SetCondition(&w.status, kRunning, false, "NoNodeHasTopologyLevel", w.placement_problem,
                 w.now);
  } else if (!stuck.empty()) {
    // A worker that cannot start until someone acts (a root image under runAsNonRoot, an image
    // that cannot be pulled): say so where `kubectl describe tj` shows it.
    SetCondition(&w.status, kRunning, false, "WorkerCannotStart", stuck, w.now);
  } else if (HasCondition(w.status, kRunning) || w.status.contains("conditions")) {
    // Keep the Running condition's history: it turns False while restarting or scaling.
    if (!FindCondition(w.status, kRunning).is_null()) {
      SetCondition(&w.status, kRunning, false, phase,
                   std::to_string(running) + " of " + std::to_string(desired) + " workers running",
                   w.now);
    }
  }
  w.status["phase"] = phase;
}

// The Queued condition and, under Kueue, the job's start (the run deadline counts from the
// admission, as a Job's counts from Kueue unsuspending it) and its group's fixed size. The job
// is queued while a gate holds its workers and none runs: a replacement waiting at the gate of a
// group Kueue admitted (Kueue ungates it at once) leaves the job as it is. Only Kueue's stopping
// the group (an eviction, a preemption: its pods' TerminationTarget) restarts the clock; workers
// that fail together and wait at the gate of the admitted group do not.
void TrainingJobReconciler::ReportQueue(Work& w, int32_t gated, int32_t admitted,
                                        const std::string& gate) {
  const std::string queue = KueueQueue(w.job);
  if (gated > 0 && admitted == 0) {
    const int32_t desired = spec::WorkersToRun(w.job.spec);
    SetCondition(&w.status, kQueued, true, "SchedulingGated",
                 std::to_string(gated) + " of " + std::to_string(desired) +
                     " worker pods wait for admission (" + gate + ")" +
                     (queue.empty() ? ""
                                    : " in Kueue's LocalQueue " + queue + ", pod group " +
                                          w.kueue_group),
                 w.now);
  } else if (admitted > 0) {
    if (HasCondition(w.status, kQueued)) {
      SetCondition(&w.status, kQueued, false, "Admitted",
                   "no scheduling gate holds the job's worker pods back any more", w.now);
    }
    if (w.kueue && !w.status.contains("startTime")) {
      w.status["startTime"] = w.now;
      if (w.job.spec.run_policy.active_deadline_seconds) {
        w.RequeueAfter(*w.job.spec.run_policy.active_deadline_seconds * 1000);
      }
    }
  }
  // Evicted or preempted, the group waits in the queue again: not run time.
  if (w.kueue && w.kueue_stopped && admitted == 0) w.status.erase("startTime");
  const json scaling = FindCondition(w.status, kScaling);
  if (w.kueue_spec_replicas != 0) {
    SetCondition(&w.status, kScaling, false, "KueuePodGroupSizeFixed",
                 "spec.replicas is " + std::to_string(w.kueue_spec_replicas) +
                     ", but Kueue admitted this job's pod group with " +
                     std::to_string(spec::WorkersToRun(w.job.spec)) +
                     " pods (standbys included) and cannot resize it: the job runs with " +
                     std::to_string(w.job.spec.replicas) +
                     " until its group ends (suspend it and resume it to queue it anew)",
                 w.now);
  } else if (scaling.is_object() && scaling.value("reason", "") == "KueuePodGroupSizeFixed") {
    SetCondition(&w.status, kScaling, false, "Scaled",
                 std::to_string(w.job.spec.replicas) + " workers, as spec.replicas asks", w.now);
  }
}

void TrainingJobReconciler::ReportStoreRefusals(Work& w, const rendezvous::JobSnapshot& s) {
  if (s.store_refusals == 0) return;  // this registration refused nothing (yet)
  const std::string refused = "the job's rendezvous store refused " +
                              std::to_string(s.store_refusals) +
                              (s.store_refusals == 1 ? " call" : " calls") + " past its limits";
  const std::string last = "; the last: " + s.last_store_refusal;
  SetCondition(&w.status, kStoreLimit, true, "StoreLimitReached",
               refused +
                   " since the operator last registered the job (a member asks the store for "
                   "more than a job of its size needs)" + last,
               w.now);
  // An Event at the first refusal and each time the count has doubled since the last one told:
  // a member refused without end makes a few dozen, not one per status write. A registration
  // anew (an operator restart) counts from 0: told again from its first.
  bool tell = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    StoreRefusalRecord& record = store_refusals_told_[w.key];
    if (record.uid != w.job.metadata.uid || s.store_refusals < record.told) {
      record = StoreRefusalRecord{w.job.metadata.uid, 0};
    }
    if (record.told == 0 || s.store_refusals >= 2 * record.told) {
      record.told = s.store_refusals;
      tell = true;
    }
  }
  if (tell) {
    const std::string message = refused + last;
    deps_.events->Record(*w.object, controller::EventType::kWarning, "StoreLimitReached",
                         message);
    LOCKSTEP_LOG(WARNING) << w.key << ": " << message;
  }
}

Status TrainingJobReconciler::Finish(Work& w, bool succeeded, const std::string& reason,
                                     const std::string& message) {
  const bool was_finished = JobFinished(w.status);
  // What the server held before this reconcile (WriteStatus below replaces old_status).
  const bool stored_finished = JobFinished(w.old_status);
  w.status["phase"] = succeeded ? "Succeeded" : "Failed";
  SetCondition(&w.status, succeeded ? kSucceeded : kFailed, true, reason, message, w.now);
  w.status.erase("stragglers");  // nobody trains any more, so nobody is slow
  // The conditions that hold end with the job, and so does Running, whatever it read last: a
  // job whose workers complete one after another shows "1 of 4 workers running" otherwise.
  for (const char* type : {kRunning, kRestarting, kScaling, kStraggler, kQueued}) {
    const bool running_shown = type == std::string(kRunning) &&
                               FindCondition(w.status, type).is_object();
    if (HasCondition(w.status, type) || running_shown) {
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
  Status first;
  if (!KueueQueue(w.job).empty()) first = MarkKueueGroupDone(w);
  // Workers still running after the job failed (or after it succeeded without them) are
  // stopped: nothing would ever use them.
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
