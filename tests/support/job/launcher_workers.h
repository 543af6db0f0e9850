// The lockstep-worker processes a `lockstep run` launcher started, found through /proc: its
// children whose environment names the job (LOCKSTEP_JOB=default/<job>) and, for one worker,
// the member (LOCKSTEP_POD=<member>).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::testing {

// Every worker of `job` (a name in namespace default) that `launcher` started and that runs now.
std::vector<pid_t> WorkersOfLauncher(pid_t launcher, const std::string& job);
// The worker of member `member` (e.g. "<job>-worker-1"), or 0 when none runs.
pid_t WorkerOfLauncher(pid_t launcher, const std::string& job, const std::string& member);
// The highest "step N/" a launcher's progress lines (its stdout `out`, not a terminal, with
// LOCKSTEP_RUN_PROGRESS_INTERVAL_MS short) have shown; -1 before any.
int64_t LatestStep(const std::string& out);

}  // namespace lockstep::testing
