#include "worker/agent/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <vector>
#include <thread>

#include "common/cpu_priority.h"
#include "common/deadline.h"
#include "common/errno_check.h"
#include "common/logging.h"
#include "common/process_stat.h"
#include "common/program_path.h"

extern char** environ;

namespace lockstep::agent {
namespace {

// A line longer than this is relayed in pieces (each still prefixed).
constexpr size_t kMaxLineBytes = 64 * 1024;
// Relay threads check for a stop request this often while the pipe is quiet.
constexpr int kRelayPollMs = 100;
// After the program exited, how long the relays may take to drain what it wrote.
constexpr int64_t kRelayDrainMs = 2000;
// Reaping polls at this period while waiting for an exit (Stop only).
constexpr int64_t kReapPollMs = 10;
// The destructor's bound on reaping a SIGKILLed program.
constexpr int64_t kDestructorKillWaitMs = 5000;

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t written;
    LOCKSTEP_SYSCALL_RETRY(written, write(fd, data, size));
    if (written <= 0) return;  // the agent's output is gone: nothing useful to do
    data += written;
    size -= static_cast<size_t>(written);
  }
}

ChildExit FromWaitStatus(int status) {
  ChildExit exit;
  if (WIFSIGNALED(status)) {
    exit.signaled = true;
    exit.signal = WTERMSIG(status);
  } else {
    exit.exit_code = WEXITSTATUS(status);
  }
  return exit;
}

}  // namespace

std::string ChildExit::Describe() const {
  std::string text;
  if (signaled) {
    text = "signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  } else {
    text = "exit code " + std::to_string(exit_code);
  }
  if (!start_error.empty()) text += " (" + start_error + ")";
  return text;
}

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> entries;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    entries.emplace_back(*entry);
  }
  return entries;
}

StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(const Options& options) {
  if (options.argv.empty()) return InvalidArgumentError("exec: empty command");
  std::unique_ptr<ChildProcess> child(new ChildProcess());
  child->output_prefix_ = options.output_prefix;
  child->signal_descendants_ = options.signal_descendants;

  std::string path_env = "/usr/local/bin:/usr/bin:/bin";
  for (const std::string& entry : options.env) {
    if (entry.rfind("PATH=", 0) == 0) path_env = entry.substr(5);
  }
  StatusOr<std::string> program = ResolveProgram(options.argv[0], path_env);

  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return ErrnoStatus("exec: pipe", errno);
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int error = errno;
    close(out_pipe[0]), close(out_pipe[1]);
    return ErrnoStatus("exec: pipe", error);
  }
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) {
    const int error = errno;
    close(out_pipe[0]), close(out_pipe[1]), close(err_pipe[0]), close(err_pipe[1]);
    return ErrnoStatus("exec: pipe", error);
  }

  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv;
  for (const std::string& arg : options.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& entry : options.env) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);
  const std::string program_path = program.ok() ? *program : std::string();
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], exec_pipe[0], exec_pipe[1]})
      close(fd);
    return ErrnoStatus("exec: fork", error);
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the agent died before prctl took effect
    struct sigaction action {};
    action.sa_handler = SIG_DFL;
    sigemptyset(&action.sa_mask);
    for (int s : {SIGTERM, SIGINT, SIGCHLD, SIGPIPE, SIGHUP}) sigaction(s, &action, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    if (options.inherit_fd >= 0) fcntl(options.inherit_fd, F_SETFD, 0);  // survives execve
    int error = ENOENT;
    if (!program_path.empty()) {
      execve(program_path.c_str(), argv.data(), envp.data());
      error = errno;
    }
    [[maybe_unused]] ssize_t ignored = write(exec_pipe[1], &error, sizeof(error));
    _exit(error == ENOENT || error == ENOTDIR ? 127 : 126);
  }
  setpgid(pid, pid);  // also in the parent: no race with a Signal() right after Start
  child->pid_ = pid;
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_pipe[1]);
  child->StartRelay(out_pipe[0], STDOUT_FILENO);
  child->StartRelay(err_pipe[0], STDERR_FILENO);

  // The exec pipe closes (CLOEXEC) when execve succeeds, or carries errno when it fails.
  int exec_errno = 0;
  struct pollfd waiting {
    exec_pipe[0], POLLIN, 0
  };
  int ready;
  LOCKSTEP_SYSCALL_RETRY(ready, poll(&waiting, 1, static_cast<int>(options.exec_timeout_ms)));
  if (ready > 0) {
    ssize_t got;
    LOCKSTEP_SYSCALL_RETRY(got, read(exec_pipe[0], &exec_errno, sizeof(exec_errno)));
    if (got != static_cast<ssize_t>(sizeof(exec_errno))) exec_errno = 0;
  } else {
    LOCKSTEP_LOG(WARNING) << "exec of " << options.argv[0] << " not confirmed within "
                          << options.exec_timeout_ms << " ms; supervising it anyway";
  }
  close(exec_pipe[0]);
  if (exec_errno != 0) {
    // The child _exits at once; reap it here so the failure carries the reason.
    const Deadline deadline = Deadline::AfterMs(options.exec_timeout_ms);
    while (child->running() && !deadline.expired()) {
      if (!child->TryReap()) std::this_thread::sleep_for(std::chrono::milliseconds(kReapPollMs));
    }
    const std::string shown = program_path.empty() ? options.argv[0] : program_path;
    std::string reason = "cannot execute " + shown + ": " + std::strerror(exec_errno) + " (errno " +
                         std::to_string(exec_errno) + ")";
    if (!program.ok()) {
      reason = program.status().message();
    } else if (exec_errno == ENOENT) {
      // The file is there: what it needs to run is not (an image without that shell or loader).
      if (const std::string missing = MissingInterpreter(program_path); !missing.empty()) {
        reason = "cannot execute " + shown + ": the interpreter it names, " + missing +
                 ", is not in this filesystem (an image without it?)";
      }
    }
    if (child->exit_) {
      child->exit_->start_error = reason;
    } else {
      ChildExit exit;
      exit.exit_code = exec_errno == ENOENT ? 127 : 126;
      exit.start_error = reason;
      child->exit_ = exit;
    }
  } else if (options.idle_priority && ready > 0) {  // executed: never before its exec
    child->EnterIdle(options.argv[0]);
  }
  return child;
}

StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Adopt(pid_t pid, int stdout_fd,
                                                           int stderr_fd, const Options& options) {
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    const int error = errno;
    close(stdout_fd);
    close(stderr_fd);
    return FailedPreconditionError("adopt: pid " + std::to_string(pid) +
                                   " is not a child of this process (" + std::strerror(error) +
                                   ")");
  }
  std::unique_ptr<ChildProcess> child(new ChildProcess());
  child->pid_ = pid;
  child->output_prefix_ = options.output_prefix;
  child->signal_descendants_ = options.signal_descendants;
  child->StartRelay(stdout_fd, STDOUT_FILENO);
  child->StartRelay(stderr_fd, STDERR_FILENO);
  if (options.idle_priority) child->EnterIdle("pid " + std::to_string(pid));
  return child;
}

void ChildProcess::EnterIdle(const std::string& shown) {
  if (Status idle = EnterIdlePriority(pid_); idle.ok()) {
    idle_priority_ = true;
  } else {
    LOCKSTEP_LOG(WARNING) << shown << " runs at normal CPU priority: " << idle;
    return;
  }
  // What the program started between its exec and this call did not inherit the policy (a shell
  // forks at once); what it starts from now on does.
  for (pid_t started : DescendantsOf(pid_)) {
    Status idle = EnterIdlePriority(started);
    if (!idle.ok() && idle.code() != StatusCode::kNotFound) {
      LOCKSTEP_LOG(WARNING) << shown << ": process " << started
                            << " runs at normal CPU priority: " << idle;
    }
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && running()) {
    kill(-pid_, SIGKILL);
    const Deadline deadline = Deadline::AfterMs(kDestructorKillWaitMs);
    while (!TryReap() && !deadline.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kReapPollMs));
    }
  }
  JoinRelays(kRelayDrainMs);
}

void ChildProcess::StartRelay(int fd, int target_fd) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  relay_done_.push_back(done);
  relays_.emplace_back([this, fd, target_fd, done] {
    std::string pending;
    char buffer[16384];
    auto emit = [&](const std::string& line) {
      std::string out;
      {
        std::lock_guard<std::mutex> lock(prefix_mu_);
        out = output_prefix_;
      }
      out += line + "\n";
      WriteAll(target_fd, out.data(), out.size());
      if (target_fd == STDERR_FILENO && line.find_first_not_of(" \t\r") != std::string::npos) {
        std::lock_guard<std::mutex> lock(tail_mu_);
        error_tail_.push_back(line.substr(0, kErrorTailLineBytes));
        if (error_tail_.size() > kErrorTailLines) error_tail_.pop_front();
      }
    };
    while (true) {
      struct pollfd readable {
        fd, POLLIN, 0
      };
      const int ready = poll(&readable, 1, kRelayPollMs);
      if (ready == 0) {
        if (stop_relays_.load()) break;
        continue;
      }
      if (ready < 0) {
        if (errno == EINTR) continue;
        break;
      }
      ssize_t got;
      LOCKSTEP_SYSCALL_RETRY(got, read(fd, buffer, sizeof(buffer)));
      if (got <= 0) break;  // end of file: every writer closed
      pending.append(buffer, static_cast<size_t>(got));
      size_t start = 0;
      for (size_t newline; (newline = pending.find('\n', start)) != std::string::npos;) {
        emit(pending.substr(start, newline - start));
        start = newline + 1;
      }
      pending.erase(0, start);
      while (pending.size() >= kMaxLineBytes) {
        emit(pending.substr(0, kMaxLineBytes));
        pending.erase(0, kMaxLineBytes);
      }
    }
    if (!pending.empty()) emit(pending);
    close(fd);
    done->store(true);
  });
}

void ChildProcess::SetOutputPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(prefix_mu_);
  output_prefix_ = prefix;
}

void ChildProcess::JoinRelays(int64_t timeout_ms) {
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  for (const auto& done : relay_done_) {
    while (!done->load() && !deadline.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kReapPollMs));
    }
  }
  // A grandchild that escaped the group may still hold the pipe: stop reading it.
  stop_relays_.store(true);
  for (std::thread& relay : relays_) {
    if (relay.joinable()) relay.join();
  }
  relays_.clear();
  relay_done_.clear();
}

std::optional<ChildExit> ChildProcess::TryReap() {
  if (exit_) return exit_;
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    if (errno != ECHILD) return std::nullopt;
    // Not our child any more: something else reaped it (a waitpid(-1) of another part).
    ChildExit lost;
    lost.exit_code = 255;
    lost.start_error = "pid " + std::to_string(pid_) + " is not a child of this process";
    exit_ = lost;
    JoinRelays(kRelayDrainMs);
    return exit_;
  }
  if (info.si_pid == 0) return std::nullopt;
  kill(-pid_, SIGKILL);  // the rest of the group; the zombie leader keeps the group id ours
  int status = 0;
  pid_t got;
  LOCKSTEP_SYSCALL_RETRY(got, waitpid(pid_, &status, 0));  // exited already: returns at once
  if (got != pid_) return std::nullopt;
  exit_ = FromWaitStatus(status);
  JoinRelays(kRelayDrainMs);
  std::lock_guard<std::mutex> lock(tail_mu_);
  exit_->last_error_lines.assign(error_tail_.begin(), error_tail_.end());
  return exit_;
}

int64_t ChildProcess::MsSinceSigterm() const {
  if (sigterm_at_ < 0) return -1;
  return static_cast<int64_t>((MonotonicSeconds() - sigterm_at_) * 1000);
}

void ChildProcess::Signal(int signal) {
  if (pid_ <= 0 || !running()) return;
  if (signal == SIGTERM && sigterm_at_ < 0) sigterm_at_ = MonotonicSeconds();
  if (signal == SIGKILL) sigkill_sent_ = true;
  // What left the group (setsid, setpgid) is still below the program. Listed before the group
  // is signalled: what a handler starts after the signal is not signalled again.
  std::vector<pid_t> outside_group;
  if (signal_descendants_ || signal == SIGKILL) {
    for (pid_t descendant : DescendantsOf(pid_)) {
      if (getpgid(descendant) != pid_) outside_group.push_back(descendant);
    }
  }
  kill(-pid_, signal);
  for (pid_t descendant : outside_group) kill(descendant, signal);
}

ChildExit ChildProcess::Stop(int64_t grace_ms, int64_t kill_wait_ms) {
  if (exit_) return *exit_;
  if (TryReap()) return *exit_;
  auto wait_for_exit = [&](int64_t timeout_ms) {
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    while (!TryReap() && !deadline.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kReapPollMs));
    }
    return exit_.has_value();
  };
  // The grace runs from the first SIGTERM: a program saving in its SIGTERM handler is not
  // interrupted by a second one.
  if (sigterm_at_ < 0) Signal(SIGTERM);
  if (!wait_for_exit(std::max<int64_t>(0, grace_ms - MsSinceSigterm()))) {
    if (grace_ms > 0) {  // with no grace, the caller ends it at once: nothing to warn of
      LOCKSTEP_LOG(WARNING) << "command (pid " << pid_ << ") still running " << grace_ms
                            << " ms after SIGTERM; sending SIGKILL";
    }
    Signal(SIGKILL);
    if (!wait_for_exit(kill_wait_ms)) {
      LOCKSTEP_LOG(ERROR) << "command (pid " << pid_ << ") survived SIGKILL for " << kill_wait_ms
                          << " ms (uninterruptible sleep?); leaving it";
      ChildExit exit;
      exit.signaled = true;
      exit.signal = SIGKILL;
      exit.stopped_by_agent = true;
      return exit;
    }
  }
  exit_->stopped_by_agent = true;
  return *exit_;
}

std::vector<pid_t> DescendantsOf(pid_t root) {
  // The children of every process.
  std::map<pid_t, std::vector<pid_t>> children;
  for (const ProcessEntry& process : ProcessTable()) {
    children[process.stat.parent].push_back(process.pid);
  }
  std::vector<pid_t> out;
  std::vector<pid_t> frontier = {root};
  while (!frontier.empty()) {
    const pid_t parent = frontier.back();
    frontier.pop_back();
    for (pid_t child : children[parent]) {
      out.push_back(child);
      frontier.push_back(child);
    }
  }
  return out;
}

int ReapExitedOrphans(const std::vector<pid_t>& keep) {
  const pid_t self = getpid();
  int reaped = 0;
  for (const ProcessEntry& process : ProcessTable()) {
    if (process.stat.parent != self || process.stat.state != 'Z') continue;
    if (std::find(keep.begin(), keep.end(), process.pid) != keep.end()) continue;
    if (waitpid(process.pid, nullptr, WNOHANG) == process.pid) ++reaped;
  }
  return reaped;
}

int EndDescendants(int64_t timeout_ms, const std::vector<pid_t>& keep) {
  const pid_t self = getpid();
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  int ended = 0;
  while (true) {
    std::vector<pid_t> left = DescendantsOf(self);
    if (!keep.empty()) {
      std::vector<pid_t> kept = keep;
      for (pid_t root : keep) {
        const std::vector<pid_t> below = DescendantsOf(root);
        kept.insert(kept.end(), below.begin(), below.end());
      }
      left.erase(std::remove_if(left.begin(), left.end(),
                                [&](pid_t pid) {
                                  return std::find(kept.begin(), kept.end(), pid) != kept.end();
                                }),
                 left.end());
    }
    if (left.empty() || deadline.expired()) return ended;
    for (pid_t pid : left) {
      if (kill(pid, SIGKILL) == 0) ++ended;
    }
    // Reap what is ours now (a subreaper inherits the orphans); deeper ones come up to us as
    // their parents die, on the next round.
    for (pid_t pid : left) waitpid(pid, nullptr, WNOHANG);
    std::this_thread::sleep_for(std::chrono::milliseconds(kReapPollMs));
  }
}

Status ChildProcess::LeaveIdlePriority() {
  if (!idle_priority_) return OkStatus();
  // The program and whatever it started meanwhile (a forked pool inherits the policy).
  std::vector<pid_t> processes = DescendantsOf(pid_);
  processes.insert(processes.begin(), pid_);
  Status first_error;
  for (pid_t process : processes) {
    Status left = lockstep::LeaveIdlePriority(process);
    if (!left.ok() && left.code() != StatusCode::kNotFound && first_error.ok()) first_error = left;
  }
  if (first_error.ok()) idle_priority_ = false;
  return first_error;
}

}  // namespace lockstep::agent
