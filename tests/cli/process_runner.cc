#include "tests/cli/process_runner.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

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

ChildProcess::ChildProcess(const std::vector<std::string>& argv,
                           const std::vector<std::pair<std::string, std::string>>& env) {
  const std::string dir = MakeTempDir("lockstep-child");
  out_path_ = dir + "/stdout";
  err_path_ = dir + "/stderr";
  std::map<std::string, std::string> overrides(env.begin(), env.end());
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
  const int err_fd = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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

ProcessResult ChildProcess::Wait(int64_t timeout_ms) {
  ProcessResult result;
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
  result.err = ReadFile(err_path_);
  // The output is in the result now: leave nothing behind in /tmp (curl-based API requests in
  // the Kubernetes tests start thousands of children).
  std::error_code ignored;
  std::filesystem::remove_all(std::filesystem::path(out_path_).parent_path(), ignored);
  return result;
}

ProcessResult RunProcess(const std::vector<std::string>& argv,
                         const std::vector<std::pair<std::string, std::string>>& env,
                         int64_t timeout_ms) {
  ChildProcess child(argv, env);
  return child.Wait(timeout_ms);
}

std::string MakeTempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << pattern << ": " << std::strerror(errno);
  }
  return pattern;
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::trunc);
  file << text;
  if (!file) ADD_FAILURE() << "cannot write " << path;
}

std::vector<pid_t> FindProcessesWithEnv(const std::string& key, const std::string& value) {
  std::vector<pid_t> pids;
  const std::string wanted = key + "=" + value;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    const std::string environ_text = ReadFile("/proc/" + std::string(entry->d_name) + "/environ");
    std::istringstream items(environ_text);
    std::string item;
    while (std::getline(items, item, '\0')) {
      if (item == wanted) {
        pids.push_back(static_cast<pid_t>(pid));
        break;
      }
    }
  }
  closedir(proc);
  return pids;
}

pid_t ParentPid(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so parse after the last ')'.
  const size_t close_paren = stat.rfind(')');
  if (close_paren == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close_paren + 1));
  char state = 0;
  long ppid = -1;
  rest >> state >> ppid;
  return static_cast<pid_t>(ppid);
}

bool PollUntil(const std::function<bool()>& condition, int64_t timeout_ms, int64_t interval_ms) {
  const double deadline = Now() + timeout_ms / 1000.0;
  while (true) {
    if (condition()) return true;
    if (Now() >= deadline) return condition();
    poll(nullptr, 0, static_cast<int>(interval_ms));
  }
}

}  // namespace lockstep::testing
