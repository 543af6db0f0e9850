// The informers' view of worker pods and TrainingJobs: the pods' index by job, what the caches
// keep of each object (at 4,000 pods every field kept costs hundreds of KB), and how the
// reconciler reads a cached pod. Pure functions of JSON, tested through the reconciler's tests.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lockstep::op::trainingjob {

// The pod informer's index: "namespace/<job-name label>".
inline constexpr char kJobIndex[] = "job";
std::vector<std::string> JobIndexOfPod(const nlohmann::json& pod);

// The informers' transforms: what the caches keep of pods and jobs (1,000 jobs in a few MB).
// TrimPod keeps only what the reconciler and the pod handlers read (see the .cc for the fields);
// TrimJob drops managedFields and kubectl's last-applied annotation.
nlohmann::json TrimPod(nlohmann::json pod);
nlohmann::json TrimJob(nlohmann::json job);

// Reading a (trimmed) worker pod: `pod` must be a pod object with metadata, as the informer
// delivers it (TrimPod keeps metadata).
// "namespace/<job-name label>"; "" when the pod has no job-name label.
std::string JobKeyOfPod(const nlohmann::json& pod);
// status.phase; "Pending" until the kubelet reports one.
std::string PodPhase(const nlohmann::json& pod);
// spec.nodeName; "" until the pod is scheduled.
std::string NodeNameOf(const nlohmann::json& pod);
// metadata.deletionTimestamp is set: the pod is going, whatever its phase says.
bool IsTerminating(const nlohmann::json& pod);
// Its Ready condition is True.
bool IsReady(const nlohmann::json& pod);
// metadata.labels[key]; "" when absent.
std::string LabelOf(const nlohmann::json& pod, const std::string& key);
// The replica-index label; -1 when the pod carries no valid index.
int32_t PodIndex(const nlohmann::json& pod);
// Its controller ownerReference names `uid` (a pod of this incarnation of the job).
bool OwnedBy(const nlohmann::json& pod, const std::string& uid);
// metadata.creationTimestamp (RFC 3339, so later sorts after); "" when absent.
std::string CreationTimestampOf(const nlohmann::json& pod);
// metadata.annotations[key]; "" when absent.
std::string AnnotationOf(const nlohmann::json& pod, const std::string& key);
// What holds the pod back from scheduling, "" when nothing does: the names of its
// spec.schedulingGates (Kubernetes 1.26+; Kueue's is kueue.x-k8s.io/admission), or, where the
// server does not show the gates, "a scheduling gate" when its PodScheduled condition is False
// with reason SchedulingGated (what kube-scheduler writes for a gated pod, KEP-3521).
std::string SchedulingGatedBy(const nlohmann::json& pod);
// Whether the pod is past its scheduling gate, if it had one: no gate holds it and it is bound to
// a node or running. A queued job's worker that is, is one Kueue admitted.
bool PastItsSchedulingGate(const nlohmann::json& pod);
// Why the cluster stopped the pod rather than its program failing: "<reason>: <message>" of its
// DisruptionTarget condition (Kubernetes 1.26+: PreemptionByScheduler, EvictionByEvictionAPI,
// DeletionByTaintManager, TerminationByKubelet) or of Kueue's TerminationTarget (written before
// Kueue deletes a preempted or evicted group's pods), when one is True; "" otherwise.
std::string DisruptedBy(const nlohmann::json& pod);
// Kueue stopped the pod (its TerminationTarget condition is True): it evicted or preempted the
// pod's group, which is queued again.
bool StoppedByKueue(const nlohmann::json& pod);
// Whether Kueue counts the pod in its group (KEP-976, "runnable or succeeded"): not Failed, and
// not deleted before it was scheduled. A pod it does not count is replaced at once, while
// Kueue's finalizer may keep it in the API until the replacement exists.
bool KueueCountsPod(const nlohmann::json& pod);

}  // namespace lockstep::op::trainingjob
