// Test helper: runs lockstep-worker processes with a given environment, output to a log file,
// and waits for them with a deadline.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace lockstep::testing {

class WorkerProcess {
 public:
  // Starts `argv` with the test's environment plus `env` (overriding), stdout and stderr to
  // `log_path`. Check pid() > 0.
  WorkerProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                const std::string& log_path);
  // Kills the process (SIGKILL) if it still runs.
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Waits until the process exits or the deadline passes. Returns its exit code, 256 + signal
  // when a signal killed it (so a worker that exits 143 itself is told apart from one killed by
  // SIGTERM's default action), or -1 on timeout (the process is then killed).
  int Wait(std::chrono::steady_clock::time_point deadline);
  std::string Log() const;

 private:
  pid_t pid_ = -1;
  int exit_code_ = -2;  // -2: not reaped yet
  std::string log_path_;
};

}  // namespace lockstep::testing
