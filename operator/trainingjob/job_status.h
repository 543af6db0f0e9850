// TrainingJob status: conditions, phase and the decisions that depend only on what the pods
// report. Pure functions, table-tested.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/spec/training_job.h"

namespace lockstep::op::trainingjob {

using json = nlohmann::json;

// Condition types, in the order the CRD lists them.
inline constexpr char kCreated[] = "Created";
inline constexpr char kRunning[] = "Running";
inline constexpr char kRestarting[] = "Restarting";
inline constexpr char kScaling[] = "Scaling";
inline constexpr char kSucceeded[] = "Succeeded";
inline constexpr char kFailed[] = "Failed";
inline constexpr char kSuspended[] = "Suspended";
// True while a scheduling gate holds worker pods back: Kueue has not admitted the job's pod
// group yet (or preempted it and queued it again).
inline constexpr char kQueued[] = "Queued";
// True while the rendezvous service names a worker whose compute time per step stays well above
// its peers' (status.stragglers lists them).
inline constexpr char kStraggler[] = "Straggler";
// True once the job's rendezvous store refused a member's call past one of its limits (keys,
// bytes, held gets): a member of this job stores more than a job of its size needs.
inline constexpr char kStoreLimit[] = "StoreLimit";

// Sets (adds or replaces) status.conditions[type]. lastTransitionTime changes only when `status`
// changes; lastUpdateTime whenever reason or message change. now: RFC 3339 ("2026-11-22T10:00:00Z").
void SetCondition(json* job_status, const std::string& type, bool status,
                  const std::string& reason, const std::string& message, const std::string& now);
// status.conditions[type]; null when the job has none of that type.
json FindCondition(const json& job_status, const std::string& type);
// The condition's status is "True".
bool HasCondition(const json& job_status, const std::string& type);

// The job's status.phase ("" before the first status write), and whether it is terminal
// (Succeeded or Failed). `job_status` is the job's status object.
std::string JobPhase(const json& job_status);
bool JobFinished(const json& job_status);

// RFC 3339 UTC with seconds, as Kubernetes writes metav1.Time.
std::string Rfc3339(double unix_seconds);
// Parses Rfc3339 (and the fractional-seconds form); -1 when it is not one.
double ParseRfc3339(const std::string& text);

// What a finished worker pod means.
enum class ExitDecision {
  kSucceeded,     // exit 0
  kRestart,       // replace the pod (counts against backoffLimit)
  kFailJob,       // the job fails: restartPolicy Never, or ExitCode with a permanent code
};

// OnFailure: any non-zero exit restarts. ExitCode: 130, 137, 143 and run_policy's
// retryable_exit_codes restart; other codes fail the job (PyTorchJob's convention). Never: any
// failure fails the job.
ExitDecision DecideExit(const spec::RunPolicy& policy, int32_t exit_code);

// The exit code of a pod's "worker" container (status.containerStatuses[].state.terminated
// .exitCode), or -1 when not terminated / not reported. An evicted pod (phase Failed without a
// container exit, reason Evicted) is -1: it is replaced as retryable.
int32_t WorkerExitCode(const json& pod);

// Why a pod's "worker" container cannot start until someone changes something: the kubelet's
// waiting reasons that do not pass by themselves (CreateContainerConfigError, e.g. "container
// has runAsNonRoot and image will run as root"; CreateContainerError; ErrImagePull,
// ImagePullBackOff, InvalidImageName), as "<reason>: <message>". Empty for a container that is
// starting, running or done.
std::string WorkerStuckReason(const json& pod);
bool IsStuckWaitingReason(const std::string& reason);

// The worker container's termination message (what it wrote to its terminationMessagePath as it
// exited: its error), without surrounding whitespace. A container the kernel killed for memory
// wrote none: then "OOMKilled: ..." from the kubelet's reason. Empty otherwise.
std::string WorkerTerminationMessage(const json& pod);

// Why the worker's exec agents gave up, from its terminated container's termination message
// ("lockstep: gave up: <why>", common/termination_message.h); empty when it says nothing so.
std::string WorkerGaveUpMessage(const json& pod);

// Seconds until `total_steps` at the reported pace: the samples a step takes so far
// (samples / step, which holds for the built-in trainer and for an exec program that reports
// global samples) over samples per second. -1 when any of them is unknown (0) or the run is done.
double EstimatedSecondsRemaining(int64_t step, int64_t total_steps, int64_t samples,
                                 double samples_per_second);

// status.progress.display: the figures as `kubectl get tj` prints them (1.20's printer columns
// cannot format a number). A rate as a whole number ("37604"), one decimal below 10 ("2.5"); a
// share as a whole percentage ("16%"); seconds as kubectl prints an age ("45s", "4m10s", "2h5m",
// "3d4h").
std::string DisplayRate(double per_second);
std::string DisplayPercent(double share);
std::string DisplayDuration(double seconds);

}  // namespace lockstep::op::trainingjob
