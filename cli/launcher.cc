#include "cli/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "common/deadline.h"
#include "common/errno_check.h"
#include "common/termination_message.h"

extern char** environ;

namespace lockstep::cli {
namespace {

// The self-pipe the signal handlers write to. One per process: the handlers are process-wide.
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int signal_number) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  // Non-blocking: when the pipe is full a wake-up is already pending, so dropping is harmless
  // for SIGCHLD; SIGINT/SIGTERM are never 64 KiB behind.
  ssize_t ignored = write(g_signal_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved_errno;
}

constexpr int kHandledSignals[] = {SIGCHLD, SIGINT, SIGTERM};
struct sigaction g_previous_actions[3];

const char* SignalName(int signal_number) {
  switch (signal_number) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGTERM:
      return "SIGTERM";
    default:
      return nullptr;
  }
}

// Everything the child needs, prepared before fork: between fork and exec in a multi-threaded
// process only async-signal-safe calls are allowed, so no allocation happens there.
struct ExecImage {
  std::vector<std::string> argv_storage;
  std::vector<std::string> env_storage;
  std::vector<char*> argv;
  std::vector<char*> envp;
};

ExecImage BuildExecImage(const WorkerCommand& command) {
  ExecImage image;
  image.argv_storage = command.argv;
  std::map<std::string, bool> overridden;
  for (const auto& [key, value] : command.env) overridden[key] = true;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string item(*entry);
    std::string key = item.substr(0, item.find('='));
    if (overridden.count(key) == 0) image.env_storage.push_back(std::move(item));
  }
  for (const auto& [key, value] : command.env) image.env_storage.push_back(key + "=" + value);
  for (std::string& arg : image.argv_storage) image.argv.push_back(arg.data());
  image.argv.push_back(nullptr);
  for (std::string& item : image.env_storage) image.envp.push_back(item.data());
  image.envp.push_back(nullptr);
  return image;
}

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

std::string WorkerExit::Describe() const {
  if (!signaled) return "exit code " + std::to_string(exit_code);
  const char* name = SignalName(signal);
  std::string text = "signal " + std::to_string(signal);
  if (name != nullptr) text += std::string(" (") + name + ")";
  return text;
}

RestartPolicy::Decision RestartOnFailure::OnWorkerFailed(const WorkerExit& exit,
                                                         int32_t restarts_so_far) {
  Decision decision;
  if (restarts_so_far >= backoff_limit_) {
    decision.refusal = "backoffLimit " + std::to_string(backoff_limit_) + " reached";
    return decision;
  }
  decision.restart = true;
  int64_t backoff_ms = initial_backoff_ms_;
  for (int32_t i = 0; i < restarts_so_far && backoff_ms < max_backoff_ms_; ++i) backoff_ms *= 2;
  decision.backoff_ms = std::min(backoff_ms, max_backoff_ms_);
  return decision;
}

RestartPolicy::Decision RunPolicyRestarts::OnWorkerFailed(const WorkerExit& exit,
                                                          int32_t restarts_so_far) {
  Decision decision;
  const int status = exit.ShellStatus();
  if (!exit.signaled && exit.exit_code == 2) {
    decision.refusal = "exit code 2 means bad input, which a restart cannot fix";
    return decision;
  }
  // The agents hold an exec job's budget and apply its policy to the command; a worker whose
  // agents gave up says so (its termination message) and is not replaced. One that ended
  // otherwise (an agent killed, a crash) is a lost pod: the policy below decides, as the
  // operator's does.
  if (workers_restart_their_commands_ &&
      exit.termination_message.rfind(kGaveUpPrefix, 0) == 0) {
    decision.refusal =
        "its agents gave up: " + exit.termination_message.substr(std::strlen(kGaveUpPrefix));
    return decision;
  }
  switch (policy_.restart_policy) {
    case spec::RestartPolicy::kNever:
      decision.refusal = "restartPolicy Never";
      return decision;
    case spec::RestartPolicy::kExitCode: {
      const std::vector<int32_t>& listed = policy_.retryable_exit_codes;
      const bool retryable = status == 130 || status == 137 || status == 143 ||
                             std::find(listed.begin(), listed.end(), status) != listed.end();
      if (!retryable) {
        decision.refusal = "restartPolicy ExitCode: " + std::to_string(status) +
                           " is not retryable (130, 137, 143 and "
                           "spec.runPolicy.retryableExitCodes are)";
        return decision;
      }
      break;
    }
    case spec::RestartPolicy::kOnFailure:
      break;
  }
  if (restarts_so_far >= policy_.backoff_limit) {
    decision.refusal = "spec.runPolicy.backoffLimit " + std::to_string(policy_.backoff_limit) +
                       " reached (" + std::to_string(restarts_so_far) + " restarts)";
    return decision;
  }
  decision.restart = true;
  int64_t backoff_ms = initial_backoff_ms_;
  for (int32_t i = 0; i < restarts_so_far && backoff_ms < max_backoff_ms_; ++i) backoff_ms *= 2;
  decision.backoff_ms = std::min(backoff_ms, max_backoff_ms_);
  return decision;
}

Supervisor::Supervisor(SupervisorOptions options, std::unique_ptr<RestartPolicy> policy)
    : options_(options), policy_(std::move(policy)) {
  if (!policy_) policy_ = std::make_unique<NeverRestart>();
}

Supervisor::~Supervisor() {
  StopAll();
  if (handlers_installed_) {
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      sigaction(kHandledSignals[i], &g_previous_actions[i], nullptr);
    }
    close(g_signal_pipe[0]);
    close(g_signal_pipe[1]);
    g_signal_pipe[0] = g_signal_pipe[1] = -1;
  }
}

Status Supervisor::Start(const std::vector<WorkerCommand>& commands) {
  if (!handlers_installed_) {
    if (g_signal_pipe[0] >= 0) {
      return FailedPreconditionError("another Supervisor owns this process's signal handlers");
    }
    if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return ErrnoStatus("pipe2", errno);
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      struct sigaction action {};
      action.sa_handler = OnSignal;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART | (kHandledSignals[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
      sigaction(kHandledSignals[i], &action, &g_previous_actions[i]);
    }
    handlers_installed_ = true;
  }
  for (const WorkerCommand& command : commands) {
    StatusOr<pid_t> pid = Spawn(command);
    if (!pid.ok()) {
      StopAll();
      return pid.status().WithContext("starting " + command.member_id);
    }
    Slot slot;
    slot.command = command;
    slot.pid = *pid;
    slots_.push_back(std::move(slot));
  }
  return OkStatus();
}

StatusOr<pid_t> Supervisor::Spawn(const WorkerCommand& command) {
  if (command.argv.empty()) return InvalidArgumentError("empty command");
  ExecImage image = BuildExecImage(command);
  if (!command.termination_log.empty()) {
    // What an earlier incarnation left there is not this one's word.
    LOCKSTEP_RETURN_IF_ERROR(WriteTerminationMessage(command.termination_log, ""));
  }

  int log_fd;
  LOCKSTEP_SYSCALL_RETRY(
      log_fd, open(command.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (log_fd < 0) return ErrnoStatus("open " + command.log_path, errno);
  FdCloser log_closer(log_fd);
  int null_fd;
  LOCKSTEP_SYSCALL_RETRY(null_fd, open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (null_fd < 0) return ErrnoStatus("open /dev/null", errno);
  FdCloser null_closer(null_fd);
  // The child reports a failed exec through this pipe; a successful exec closes it (CLOEXEC).
  int exec_pipe[2];
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) return ErrnoStatus("pipe2", errno);
  FdCloser exec_read(exec_pipe[0]);

  const pid_t parent_pid = getpid();
  // Signals stay blocked across fork so no handler of ours runs in the child before it resets
  // them to the default.
  sigset_t all_signals, previous_mask;
  sigfillset(&all_signals);
  pthread_sigmask(SIG_SETMASK, &all_signals, &previous_mask);
  const pid_t pid = fork();
  if (pid == 0) {
    for (int signal_number : kHandledSignals) ::signal(signal_number, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent_pid) _exit(127);  // the launcher died before prctl took effect
    dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    sigset_t empty;
    sigemptyset(&empty);
    sigprocmask(SIG_SETMASK, &empty, nullptr);
    execve(image.argv[0], image.argv.data(), image.envp.data());
    const int exec_errno = errno;
    ssize_t ignored = write(exec_pipe[1], &exec_errno, sizeof(exec_errno));
    (void)ignored;
    _exit(127);
  }
  const int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &previous_mask, nullptr);
  close(exec_pipe[1]);
  if (pid < 0) return ErrnoStatus("fork", fork_errno);
  // Both sides set the group, so it is in place whichever runs first (the classic race).
  setpgid(pid, pid);

  struct pollfd pfd {
    exec_read.get(), POLLIN, 0
  };
  int ready;
  LOCKSTEP_SYSCALL_RETRY(ready, poll(&pfd, 1, static_cast<int>(options_.exec_timeout_ms)));
  int exec_errno = 0;
  ssize_t got = 0;
  if (ready > 0)
    LOCKSTEP_SYSCALL_RETRY(got, read(exec_read.get(), &exec_errno, sizeof(exec_errno)));
  if (ready == 0 || got == static_cast<ssize_t>(sizeof(exec_errno))) {
    // Exec failed (or hung past the deadline): make sure the child is gone and reaped.
    kill(pid, SIGKILL);
    int status;
    Deadline deadline = Deadline::AfterMs(options_.kill_wait_ms);
    while (waitpid(pid, &status, WNOHANG) == 0 && !deadline.expired()) WaitForSignals(10);
    if (ready == 0) return DeadlineExceededError("exec " + command.argv[0] + " did not complete");
    return ErrnoStatus("exec " + command.argv[0], exec_errno);
  }
  return pid;
}

void Supervisor::WaitForSignals(int64_t timeout_ms) {
  struct pollfd pfd {
    g_signal_pipe[0], POLLIN, 0
  };
  int ready;
  LOCKSTEP_SYSCALL_RETRY(ready, poll(&pfd, 1, static_cast<int>(std::max<int64_t>(0, timeout_ms))));
  if (ready <= 0) return;
  unsigned char buffer[64];
  ssize_t got;
  while ((got = read(g_signal_pipe[0], buffer, sizeof(buffer))) > 0) {
    for (ssize_t i = 0; i < got; ++i) {
      if (buffer[i] != SIGCHLD) pending_signals_.push_back(buffer[i]);
    }
  }
}

void Supervisor::Reap(std::vector<SupervisorEvent>* events) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    if (slot.pid == 0) continue;
    int status = 0;
    pid_t result;
    LOCKSTEP_SYSCALL_RETRY(result, waitpid(slot.pid, &status, WNOHANG));
    if (result != slot.pid) continue;
    // The worker's own children (exec mode) share its group; none may outlive it.
    kill(-slot.pid, SIGKILL);
    SupervisorEvent event;
    event.kind = SupervisorEvent::Kind::kWorkerExited;
    event.exit.slot = static_cast<int>(i);
    event.exit.member_id = slot.command.member_id;
    event.exit.pid = slot.pid;
    event.exit.signaled = WIFSIGNALED(status);
    event.exit.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
    event.exit.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    event.exit.termination_message = ReadTerminationMessage(slot.command.termination_log);
    slot.pid = 0;
    // Replace's SIGKILL ended it. A worker that had exited on its own before the signal (not
    // yet reaped) is reported as what it was: a completion, or a failure for the policy.
    if (slot.replacing && !(event.exit.signaled && event.exit.signal == SIGKILL)) {
      slot.replacing = false;
    }
    if (slot.replacing && !stopping_) {
      slot.restart_pending = true;
      slot.restart_at = MonotonicSeconds();
      event.restart_scheduled = true;
      event.replaced = true;
    } else if (!event.exit.success() && !stopping_ && !slot.command.restartable) {
      event.no_restart_reason = "not restartable";
    } else if (!event.exit.success() && !stopping_) {
      RestartPolicy::Decision decision = policy_->OnWorkerFailed(event.exit, restarts_);
      if (decision.restart) {
        slot.restart_pending = true;
        slot.restart_at = MonotonicSeconds() + decision.backoff_ms / 1000.0;
        event.restart_scheduled = true;
        event.restart_backoff_ms = decision.backoff_ms;
      } else {
        event.no_restart_reason = decision.refusal;
      }
    }
    events->push_back(std::move(event));
  }
}

void Supervisor::StartDueRestarts(std::vector<SupervisorEvent>* events) {
  if (stopping_) return;
  const double now = MonotonicSeconds();
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    if (!slot.restart_pending || slot.restart_at > now) continue;
    slot.restart_pending = false;
    if (!slot.replacing) ++restarts_;
    SupervisorEvent event;
    event.kind = SupervisorEvent::Kind::kWorkerRestarted;
    event.replaced = slot.replacing;
    slot.replacing = false;
    event.exit.slot = static_cast<int>(i);
    event.exit.member_id = slot.command.member_id;
    StatusOr<pid_t> pid = Spawn(slot.command);
    if (pid.ok()) {
      slot.pid = *pid;
      event.exit.pid = *pid;
    } else {
      // A replacement that cannot even start counts as a failed exit of the slot.
      event.kind = SupervisorEvent::Kind::kWorkerExited;
      event.exit.exit_code = 127;
    }
    events->push_back(std::move(event));
  }
}

StatusOr<std::vector<SupervisorEvent>> Supervisor::Poll(int64_t timeout_ms) {
  if (!handlers_installed_) return FailedPreconditionError("Poll before Start");
  std::vector<SupervisorEvent> events;
  auto collect = [&] {
    Reap(&events);
    StartDueRestarts(&events);
    for (int signal_number : pending_signals_) {
      SupervisorEvent event;
      event.kind = SupervisorEvent::Kind::kSignal;
      event.signal = signal_number;
      events.push_back(event);
    }
    pending_signals_.clear();
  };
  collect();
  if (!events.empty()) return events;

  int64_t wait_ms = timeout_ms;
  if (!stopping_) {
    const double now = MonotonicSeconds();
    for (const Slot& slot : slots_) {
      if (!slot.restart_pending) continue;
      wait_ms = std::min<int64_t>(wait_ms, std::max(0.0, (slot.restart_at - now) * 1000.0) + 1);
    }
  }
  WaitForSignals(wait_ms);
  collect();
  return events;
}

std::vector<WorkerExit> Supervisor::StopAll() {
  std::vector<WorkerExit> exits;
  stopping_ = true;
  for (Slot& slot : slots_) slot.restart_pending = false;
  if (!handlers_installed_) return exits;

  auto reap_into_exits = [&] {
    std::vector<SupervisorEvent> events;
    Reap(&events);
    for (SupervisorEvent& event : events) exits.push_back(std::move(event.exit));
  };
  auto signal_all = [&](int signal_number) {
    for (Slot& slot : slots_) {
      if (slot.pid == 0) continue;
      if (kill(-slot.pid, signal_number) != 0) kill(slot.pid, signal_number);
    }
  };
  // A signal that arrives while stopping (a second Ctrl-C) cuts the grace period short.
  auto wait_until = [&](const Deadline& deadline, bool interruptible) {
    reap_into_exits();
    while (running() > 0 && !deadline.expired() && !(interruptible && !pending_signals_.empty())) {
      WaitForSignals(std::min<int64_t>(deadline.remaining_ms(), 100));
      reap_into_exits();
    }
  };

  reap_into_exits();
  if (running() == 0) return exits;
  signal_all(SIGTERM);
  wait_until(Deadline::AfterMs(options_.grace_period_ms), /*interruptible=*/true);
  if (running() == 0) return exits;
  signal_all(SIGKILL);
  wait_until(Deadline::AfterMs(options_.kill_wait_ms), /*interruptible=*/false);
  return exits;
}

Status Supervisor::SignalWorker(int slot, int signal_number) {
  if (slot < 0 || slot >= size()) return OutOfRangeError("no worker slot " + std::to_string(slot));
  if (slots_[slot].pid == 0)
    return FailedPreconditionError("worker slot " + std::to_string(slot) + " is not running");
  if (kill(-slots_[slot].pid, signal_number) != 0) return ErrnoStatus("kill", errno);
  return OkStatus();
}

Status Supervisor::Replace(int slot) {
  LOCKSTEP_RETURN_IF_ERROR(SignalWorker(slot, SIGKILL));
  slots_[slot].replacing = true;
  return OkStatus();
}

int32_t Supervisor::running() const {
  int32_t count = 0;
  for (const Slot& slot : slots_) count += slot.pid != 0 ? 1 : 0;
  return count;
}

void Supervisor::CancelPendingRestarts(int end) {
  for (int slot = 0; slot < std::min(end, size()); ++slot) slots_[slot].restart_pending = false;
}

int32_t Supervisor::pending_restarts(int end) const {
  int32_t count = 0;
  for (int slot = 0; slot < std::min(end, size()); ++slot) {
    count += slots_[slot].restart_pending ? 1 : 0;
  }
  return count;
}

pid_t Supervisor::pid(int slot) const { return slot >= 0 && slot < size() ? slots_[slot].pid : 0; }

}  // namespace lockstep::cli
