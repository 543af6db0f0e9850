// How a worker tells the operator that its job must not be retried: the exec agents gave up
// (restarts exhausted against spec.runPolicy.backoffLimit, or the restart policy refuses the
// failure). The agent writes "lockstep: gave up: <why>" to its container's termination message
// file, the kubelet reports it as state.terminated.message, and the operator fails the job at
// once with that reason instead of replacing the pod (whose agent would only read the give-up
// again and exit).
//
// https://kubernetes.io/docs/tasks/debug/debug-application/determine-reason-pod-failure/
#pragma once

#include <cstddef>

namespace lockstep {

// Set by the operator in exec workers' containers to the container's terminationMessagePath;
// unset (lockstep run): no termination message is written.
inline constexpr char kTerminationLogEnv[] = "LOCKSTEP_TERMINATION_LOG";
// Kubernetes' default terminationMessagePath.
inline constexpr char kTerminationLogPath[] = "/dev/termination-log";
inline constexpr char kGaveUpPrefix[] = "lockstep: gave up: ";
// The kubelet reads at most this much of the file.
inline constexpr size_t kMaxTerminationMessageBytes = 4096;

}  // namespace lockstep
