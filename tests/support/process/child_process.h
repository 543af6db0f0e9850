// A program run as a child process with a deadline: its output captured (to temporary files, or
// to a log file that stays), waited for with a deadline, killed with its whole process group when
// it runs past it. A hung command fails its test instead of hanging the suite.
//
//   ProcessResult result = RunProcess({LOCKSTEP_BINARY, "validate", path}, {}, 30000);
//   EXPECT_EQ(result.exit_code, 2) << result.err;
//
//   ChildProcess worker({LOCKSTEP_WORKER_BINARY, "train"}, env, dir / "worker-0.log");
//   EXPECT_EQ(worker.WaitUntil(deadline).code(), 0) << worker.StdoutSoFar();
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::testing {

using Environment = std::vector<std::pair<std::string, std::string>>;

struct ProcessResult {
  bool timed_out = false;
  bool signaled = false;
  int exit_code = -1;  // when !signaled
  int signal = 0;      // when signaled
  std::string out;     // captured stdout (with a log file: stdout and stderr)
  std::string err;     // captured stderr (with a log file: empty)
  double seconds = 0;  // from start to exit

  // One number for the whole outcome: the exit code; 256 + the signal when a signal ended it (so
  // a worker that exits 143 itself is told apart from one killed by SIGTERM's default action);
  // -1 when it ran past its deadline and was killed.
  int code() const { return timed_out ? -1 : signaled ? 256 + signal : exit_code; }
};

class ChildProcess {
 public:
  // Starts argv with the current environment plus `env` (overriding it; of two entries for one
  // key the later wins), in its own process group
  // (so the test's own signals do not reach it and a timeout kill reaches its children), stdin
  // from /dev/null. With an empty `log_path` stdout and stderr go to temporary files that Wait
  // reads and removes; otherwise both go to `log_path`, which stays (a failed test's logs are
  // for reading). Fails the test (ADD_FAILURE; pid() is then 0) when fork fails.
  ChildProcess(const std::vector<std::string>& argv, const Environment& env,
               const std::string& log_path = "");
  // Kills what still runs (its process group) and reaps it.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to timeout_ms for the child to exit; past it, SIGKILLs the group and reports
  // timed_out. Collects the captured output either way. Later calls return the same result at
  // once.
  ProcessResult Wait(int64_t timeout_ms);
  ProcessResult WaitUntil(std::chrono::steady_clock::time_point deadline);
  // What the child has written to stdout so far (with a log file: stdout and stderr).
  std::string StdoutSoFar() const;

 private:
  pid_t pid_ = 0;
  std::string out_path_;
  std::string err_path_;  // empty with a log file: stderr goes to out_path_
  bool remove_output_ = true;
  double started_at_ = 0;
  bool waited_ = false;
  ProcessResult result_;
};

ProcessResult RunProcess(const std::vector<std::string>& argv, const Environment& env,
                         int64_t timeout_ms);

}  // namespace lockstep::testing
