#include "worker/agent/pod_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include "common/deadline.h"
#include "common/errno_check.h"
#include "common/logging.h"
#include "worker/agent/child_process.h"

extern char** environ;

namespace lockstep::agent {
namespace {

constexpr int kExitFailure = 1;
// How often a stopping supervisor checks whether its ranks are gone.
constexpr int64_t kReapPollMs = 10;
// The longest a wait for an event sleeps; SIGCHLD wakes it sooner.
constexpr int kIdlePollMs = 1000;

int g_pod_pipe[2] = {-1, -1};

extern "C" void WakePod(int signal_number) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  [[maybe_unused]] ssize_t ignored = write(g_pod_pipe[1], &byte, 1);
  errno = saved_errno;
}

bool InstallHandlers() {
  if (g_pod_pipe[0] < 0 && pipe2(g_pod_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  struct sigaction action {};
  action.sa_handler = WakePod;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int s : {SIGTERM, SIGINT, SIGCHLD}) {
    if (sigaction(s, &action, nullptr) != 0) return false;
  }
  signal(SIGPIPE, SIG_IGN);
  return true;
}

// Waits up to `timeout_ms` for a signal; returns SIGTERM/SIGINT if one arrived, else 0.
int WaitForSignal(int timeout_ms) {
  pollfd fd{g_pod_pipe[0], POLLIN, 0};
  int ready = 0;
  LOCKSTEP_SYSCALL_RETRY(ready, poll(&fd, 1, timeout_ms));
  int stop_signal = 0;
  unsigned char bytes[64];
  ssize_t got = 0;
  while ((got = read(g_pod_pipe[0], bytes, sizeof(bytes))) > 0) {
    for (ssize_t i = 0; i < got; ++i) {
      if ((bytes[i] == SIGTERM || bytes[i] == SIGINT) && stop_signal == 0) stop_signal = bytes[i];
    }
  }
  return stop_signal;
}

using Ranks = std::vector<std::unique_ptr<ChildProcess>>;

// SIGTERM to every running rank, then up to grace_ms for all of them together, then SIGKILL.
void StopAll(Ranks& ranks, const PodOptions& options) {
  for (auto& rank : ranks) {
    if (!rank->TryReap()) rank->Signal(SIGTERM);
  }
  const Deadline deadline = Deadline::AfterMs(options.grace_ms);
  auto all_gone = [&] {
    bool gone = true;
    for (auto& rank : ranks) gone = rank->TryReap().has_value() && gone;
    return gone;
  };
  while (!all_gone() && !deadline.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(kReapPollMs));
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r]->running()) {
      LOCKSTEP_LOG(WARNING) << "pod: local rank " << r << " still running " << options.grace_ms
                            << " ms after SIGTERM; killing it";
      ranks[r]->Stop(/*grace_ms=*/0, options.kill_wait_ms);
    }
  }
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
  if (!InstallHandlers()) {
    LOCKSTEP_LOG(ERROR) << "pod: cannot install the signal handlers: " << std::strerror(errno);
    return kExitFailure;
  }
  std::vector<std::string> inherited;
  for (char** entry = environ; *entry != nullptr; ++entry) inherited.emplace_back(*entry);

  Ranks children;
  for (int32_t r = 0; r < ranks; ++r) {
    ChildProcess::Options child;
    child.argv = argv;
    child.env = RankEnvironment(inherited, r, ranks);
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
    const int stop_signal = WaitForSignal(kIdlePollMs);
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

}  // namespace lockstep::agent
