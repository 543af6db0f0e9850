// Test helper: runs a program (usually the `lockstep` binary) as a child process with its stdout
// and stderr captured to files, and waits for it with a deadline. A child still running at the
// deadline is killed (its whole process group), so a hung command fails its test instead of
// hanging the suite.
//
//   ProcessResult result = RunProcess({LOCKSTEP_BINARY, "validate", path}, {}, 30000);
//   EXPECT_EQ(result.exit_code, 2) << result.err;
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::testing {

struct ProcessResult {
  bool timed_out = false;
  bool signaled = false;
  int exit_code = -1;  // when !signaled
  int signal = 0;      // when signaled
  std::string out;     // captured stdout
  std::string err;     // captured stderr
  double seconds = 0;  // from start to exit
};

class ChildProcess {
 public:
  // Starts argv with the current environment plus `env` (overriding), in its own process group
  // (so the test's own signals do not reach it and a timeout kill reaches its children).
  // Aborts the test binary (ADD_FAILURE + returns a child with pid 0) when fork fails.
  ChildProcess(const std::vector<std::string>& argv,
               const std::vector<std::pair<std::string, std::string>>& env);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to timeout_ms for the child to exit; past it, SIGKILLs the group and reports
  // timed_out. Collects the captured output either way. Call once.
  ProcessResult Wait(int64_t timeout_ms);
  // What the child has written to stdout so far.
  std::string StdoutSoFar() const;

 private:
  pid_t pid_ = 0;
  std::string out_path_;
  std::string err_path_;
  double started_at_ = 0;
  bool waited_ = false;
};

ProcessResult RunProcess(const std::vector<std::string>& argv,
                         const std::vector<std::pair<std::string, std::string>>& env,
                         int64_t timeout_ms);

// A fresh empty directory under $TMPDIR (or /tmp); removed by the caller if wanted.
std::string MakeTempDir(const std::string& prefix);
std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& text);

// Pids of processes whose environment holds `key=value` (read from /proc/<pid>/environ; processes
// of other users and zombies are skipped).
std::vector<pid_t> FindProcessesWithEnv(const std::string& key, const std::string& value);
// The parent pid of `pid`, or -1 when it is gone.
pid_t ParentPid(pid_t pid);

// Calls `condition` until it returns true or timeout_ms passes, waiting `interval_ms` between
// calls; returns its last result. For conditions only observable by polling (/proc, files).
bool PollUntil(const std::function<bool()>& condition, int64_t timeout_ms, int64_t interval_ms);

}  // namespace lockstep::testing
