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
#include <string>

#include "common/status.h"

namespace lockstep {

// Set by the operator in every worker container to the container's terminationMessagePath;
// unset (lockstep run): no termination message is written.
inline constexpr char kTerminationLogEnv[] = "LOCKSTEP_TERMINATION_LOG";
// Kubernetes' default terminationMessagePath.
inline constexpr char kTerminationLogPath[] = "/dev/termination-log";
inline constexpr char kGaveUpPrefix[] = "lockstep: gave up: ";
// The kubelet reads at most this much of the file.
inline constexpr size_t kMaxTerminationMessageBytes = 4096;

// Writes `message`, cut to what the kubelet reads (at a UTF-8 boundary), to the termination
// message file at `path`, replacing what was there; "" empties it. Errors name the path.
Status WriteTerminationMessage(const std::string& path, const std::string& message);

// What the file at `path` holds, at most kMaxTerminationMessageBytes, as the kubelet reads;
// "" when `path` is empty or there is no such file.
std::string ReadTerminationMessage(const std::string& path);

// A worker's fatal error, said for everyone who reads it: one line (newlines folded to ';') on
// stderr, "<program>: error: <line>", which the launcher shows, and the same line in the
// termination message file of LOCKSTEP_TERMINATION_LOG when that is set, which the kubelet reads
// into the container's status and the operator quotes. Returns `code` (the exit status).
int ReportFatalError(const std::string& program, int code, const std::string& message);

}  // namespace lockstep
