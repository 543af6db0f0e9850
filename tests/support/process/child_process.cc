#include "tests/support/process/child_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>

#include "tests/support/process/poll_until.h"
#include "tests/support/process/scratch_files.h"

extern char** environ;

namespace lockstep::testing {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Waits for `pid` to exit for at most timeout_ms, without reaping it. A pidfd makes this one
// poll(2); kernels without pidfd_open fall back to short polls of waitid(WNOWAIT).
bool WaitForExit(pid_t pid, int64_t timeout_ms) {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    struct pollfd pfd {
      pidfd, POLLIN, 0
    };
    const double deadline = Now() + timeout_ms / 1000.0;
    int ready = 0;
    while (true) {
      const int64_t left_ms = static_cast<int64_t>((deadline - Now()) * 1000);
      ready = poll(&pfd, 1, static_cast<int>(left_ms > 0 ? left_ms : 0));
      if (ready >= 0 || errno != EINTR) break;
    }
    close(pidfd);
    return ready > 0;
  }
  return PollUntil(
      [pid] {
        siginfo_t info{};
        return waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
      },
      timeout_ms, 10);
}

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const Environment& env,
                           const std::string& log_path) {
  if (log_path.empty()) {
    const std::string dir = MakeTempDir("lockstep-child");
    out_path_ = dir + "/stdout";
    err_path_ = dir + "/stderr";
  } else {
    out_path_ = log_path;
    remove_output_ = false;
  }
  std::map<std::string, std::string> overrides;
  for (const auto& [key, value] : env) overrides[key] = value;  // a later entry wins
  std::vector<std::string> env_storage;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string item(*entry);
    if (overrides.count(item.substr(0, item.find('='))) == 0) env_storage.push_back(item);
  }
  for (const auto& [key, value] : overrides) env_storage.push_back(key + "=" + value);
  std::vector<char*> argv_ptrs, env_ptrs;
  std::vector<std::string> argv_storage = argv;
  for (std::string& arg : argv_storage) argv_ptrs.push_back(arg.data());
  argv_ptrs.push_back(nullptr);
  for (std::string& item : env_storage) env_ptrs.push_back(item.data());
  env_ptrs.push_back(nullptr);
  const int out_fd = open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err_fd = err_path_.empty()
                         ? fcntl(out_fd, F_DUPFD_CLOEXEC, 0)
                         : open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  started_at_ = Now();
  pid_ = fork();
  if (pid_ == 0) {
    setpgid(0, 0);
    dup2(null_fd, STDIN_FILENO);
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    execve(argv_ptrs[0], argv_ptrs.data(), env_ptrs.data());
    _exit(127);
  }
  close(out_fd);
  close(err_fd);
  close(null_fd);
  if (pid_ < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    pid_ = 0;
    return;
  }
  setpgid(pid_, pid_);
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !waited_) Wait(0);
}

std::string ChildProcess::StdoutSoFar() const { return ReadFile(out_path_); }

ProcessResult ChildProcess::WaitUntil(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return Wait(left.count() > 0 ? left.count() : 0);
}

ProcessResult ChildProcess::Wait(int64_t timeout_ms) {
  if (waited_) return result_;
  ProcessResult& result = result_;
  waited_ = true;
  if (pid_ <= 0) return result;
  if (!WaitForExit(pid_, timeout_ms)) {
    result.timed_out = true;
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
  }
  int status = 0;
  // The child has exited or was just SIGKILLed: this returns promptly.
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  result.seconds = Now() - started_at_;
  result.signaled = WIFSIGNALED(status);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  result.out = ReadFile(out_path_);
  if (!err_path_.empty()) result.err = ReadFile(err_path_);
  if (remove_output_) {
    // The output is in the result now: leave nothing behind in /tmp (curl-based API requests in
    // the Kubernetes tests start thousands of children).
    std::error_code ignored;
    std::filesystem::remove_all(std::filesystem::path(out_path_).parent_path(), ignored);
  }
  return result;
}

ProcessResult RunProcess(const std::vector<std::string>& argv, const Environment& env,
                         int64_t timeout_ms) {
  ChildProcess child(argv, env);
  return child.Wait(timeout_ms);
}

}  // namespace lockstep::testing
