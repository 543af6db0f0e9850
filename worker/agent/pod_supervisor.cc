#include "worker/agent/pod_supervisor.h"

#include <signal.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include "common/deadline.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/spec/training_job.h"
#include "worker/agent/child_process.h"
#include "worker/agent/wake_pipe.h"
#include "worker/agent/worker_command_line.h"

namespace lockstep::agent {
namespace {

constexpr int kExitFailure = 1;
// How often a stopping supervisor checks whether its ranks are gone.
constexpr int64_t kReapPollMs = 10;
// The longest a wait for an event sleeps; SIGCHLD wakes it sooner.
constexpr int64_t kIdlePollMs = 1000;

// SIGTERM or SIGINT among what woke the supervisor (the first), else 0.
int StopSignal(const std::vector<unsigned char>& woken) {
  for (unsigned char what : woken) {
    if (what == SIGTERM || what == SIGINT) return what;
  }
  return 0;
}

using Ranks = std::vector<std::unique_ptr<ChildProcess>>;

// Sends `signal` to every rank still running, then waits up to timeout_ms for all of them;
// true when all are gone.
bool SignalAndWait(Ranks& ranks, int signal, int64_t timeout_ms) {
  for (auto& rank : ranks) {
    if (!rank->TryReap()) rank->Signal(signal);
  }
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  while (true) {
    bool gone = true;
    for (auto& rank : ranks) gone = rank->TryReap().has_value() && gone;
    if (gone) return true;
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(kReapPollMs));
  }
}

// SIGTERM to every running rank, up to grace_ms for all of them together, then SIGKILL to the
// rest and up to kill_wait_ms (a rank stuck even then is left to ChildProcess's destructor).
void StopAll(Ranks& ranks, const PodOptions& options) {
  if (SignalAndWait(ranks, SIGTERM, options.grace_ms)) return;
  LOCKSTEP_LOG(WARNING) << "pod: ranks still running " << options.grace_ms
                        << " ms after SIGTERM; killing them";
  SignalAndWait(ranks, SIGKILL, options.kill_wait_ms);
}

}  // namespace

std::vector<std::string> RankEnvironment(const std::vector<std::string>& inherited,
                                         int32_t local_rank, int32_t ranks) {
  std::vector<std::string> env;
  for (const std::string& entry : inherited) {
    if (entry.rfind("LOCKSTEP_LOCAL_RANK=", 0) == 0) continue;
    if (entry.rfind("LOCKSTEP_LOCAL_WORLD_SIZE=", 0) == 0) continue;
    env.push_back(entry);
  }
  env.push_back("LOCKSTEP_LOCAL_RANK=" + std::to_string(local_rank));
  env.push_back("LOCKSTEP_LOCAL_WORLD_SIZE=" + std::to_string(ranks));
  return env;
}

int RunPod(const std::vector<std::string>& argv, int32_t ranks, const PodOptions& options) {
  if (Status installed = InstallWakePipe({SIGTERM, SIGINT, SIGCHLD}); !installed.ok()) {
    LOCKSTEP_LOG(ERROR) << "pod: " << installed;
    return kExitFailure;
  }
  const std::vector<std::string> inherited = CurrentEnvironment();

  Ranks children;
  for (int32_t r = 0; r < ranks; ++r) {
    ChildProcess::Options child;
    child.argv = argv;
    child.env = RankEnvironment(inherited, r, ranks);
    // A rank stops what it started itself (an exec agent its command): SIGTERM goes to the rank
    // alone, never twice to the command.
    child.signal_descendants = false;
    StatusOr<std::unique_ptr<ChildProcess>> started = ChildProcess::Start(child);
    if (!started.ok()) {
      LOCKSTEP_LOG(ERROR) << "pod: cannot start local rank " << r << ": "
                          << started.status().ToString();
      StopAll(children, options);
      return kExitFailure;
    }
    children.push_back(std::move(started).value());
  }
  LOCKSTEP_LOG(INFO) << "pod: started " << ranks << " ranks";

  while (true) {
    const int stop_signal = StopSignal(WaitForWakes(kIdlePollMs));
    if (stop_signal != 0) {
      LOCKSTEP_LOG(WARNING) << "pod: received signal " << stop_signal << "; stopping its ranks";
      StopAll(children, options);
      return 128 + stop_signal;
    }
    int succeeded = 0;
    for (size_t r = 0; r < children.size(); ++r) {
      const std::optional<ChildExit> exit = children[r]->TryReap();
      if (!exit) continue;
      if (exit->success()) {
        ++succeeded;
        continue;
      }
      // One rank failed: the pod did. Its siblings' generation has ended anyway.
      LOCKSTEP_LOG(ERROR) << "pod: local rank " << r << " failed (" << exit->Describe()
                          << "); stopping the pod's other ranks";
      StopAll(children, options);
      return exit->ShellStatus();
    }
    if (succeeded == ranks) return 0;
  }
}

int32_t RanksToSupervise(const std::vector<std::string>& args) {
  if (!EnvString("LOCKSTEP_LOCAL_RANK", "").empty()) return 1;
  if (args.empty() || (args[0] != "train" && args[0] != "exec")) return 1;
  // A command line the worker will refuse: one rank, which refuses it.
  StatusOr<WorkerCommandLine> line = ParseWorkerCommandLine(
      args[0] == "exec" ? WorkerMode::kExec : WorkerMode::kTrain, {args.begin() + 1, args.end()});
  if (!line.ok() || line->help) return 1;
  const std::string& path = line->manifest_path;
  if (path.empty() && EnvString("LOCKSTEP_SPEC", "").empty()) return 1;
  StatusOr<spec::TrainingJob> job = spec::LoadTrainingJobFileOrEnv(path);
  return job.ok() ? job->spec.ranks_per_worker : 1;
}

}  // namespace lockstep::agent
