// The supervised command: how it is started, how its end is reported, how it is stopped.
#include "worker/agent/child_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "common/program_path.h"
#include "common/cpu_priority.h"
#include "common/deadline.h"
#include "tests/support/process/process.h"

namespace lockstep::agent {
namespace {

constexpr int64_t kWaitMs = 10000;

std::unique_ptr<ChildProcess> Start(const std::vector<std::string>& argv) {
  ChildProcess::Options options;
  options.argv = argv;
  options.env = {"PATH=/usr/bin:/bin"};
  options.output_prefix = "[rank 3] ";
  StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(options);
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? std::move(*child) : nullptr;
}

// True when `pid` no longer runs (gone, or a zombie waiting for its new parent to reap it).
bool NoLongerRuns(pid_t pid) {
  const std::string stat = testing::ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t close_paren = stat.rfind(')');
  return close_paren == std::string::npos || stat.compare(close_paren, 3, ") Z") == 0;
}

ChildExit WaitForExit(ChildProcess& child) {
  EXPECT_TRUE(testing::PollUntil([&] { return child.TryReap().has_value(); }, kWaitMs, 10));
  return child.exit().value_or(ChildExit{});
}

TEST(ChildProcess, MissingProgramIsExit127NamingPathAndErrno) {
  auto child = Start({"/nonexistent/dir/train"});
  ASSERT_NE(child, nullptr);
  const ChildExit exit = WaitForExit(*child);
  EXPECT_EQ(exit.ShellStatus(), 127);
  EXPECT_NE(exit.start_error.find("/nonexistent/dir/train"), std::string::npos) << exit.start_error;
  EXPECT_NE(exit.start_error.find("No such file or directory (errno 2)"), std::string::npos)
      << exit.start_error;
}

TEST(ChildProcess, NameNotOnPathIsExit127NamingThePath) {
  auto child = Start({"lockstep-no-such-command"});
  ASSERT_NE(child, nullptr);
  const ChildExit exit = WaitForExit(*child);
  EXPECT_EQ(exit.ShellStatus(), 127);
  EXPECT_NE(exit.start_error.find("command not found: lockstep-no-such-command"), std::string::npos)
      << exit.start_error;
}

// Writes `contents` as an executable `name` and starts it: exec fails with ENOENT although the
// file is there, and the exit must name what is missing, `missing`.
void ExpectMissingInterpreterNamed(const std::string& name, const std::string& contents,
                                   const std::string& missing) {
  const std::string path = testing::MakeTempDir("child") + "/" + name;
  testing::WriteFile(path, contents);
  chmod(path.c_str(), 0755);
  auto child = Start({path});
  ASSERT_NE(child, nullptr);
  const ChildExit exit = WaitForExit(*child);
  EXPECT_EQ(exit.ShellStatus(), 127);
  EXPECT_EQ(exit.start_error, "cannot execute " + path + ": the interpreter it names, " + missing +
                                  ", is not in this filesystem (an image without it?)");
}

TEST(ChildProcess, AScriptWhoseShellIsMissingSaysWhichInterpreter) {
  ExpectMissingInterpreterNamed("train.sh", "#!/no/such/bash -e\nexit 0\n", "/no/such/bash");
}

TEST(ChildProcess, AProgramWhoseLoaderIsMissingSaysWhichLoader) {
  // /bin/true for a C library this filesystem lacks: its PT_INTERP renamed in place.
  std::string binary = testing::ReadFile("/bin/true");
  const std::string loader = "/lib64/ld-linux-x86-64.so.2";
  const size_t at = binary.find(loader);
  ASSERT_NE(at, std::string::npos) << "/bin/true names no " << loader;
  binary.replace(at, loader.size(), "/lib64/ld-linux-x86-64.so.9");  // same length
  ExpectMissingInterpreterNamed("true", binary, "/lib64/ld-linux-x86-64.so.9");
}

TEST(ChildProcess, AFailedProgramsLastErrorLinesAreKept) {
  std::string script = "for i in $(seq 1 20); do echo out $i; echo err $i >&2; done; exit 3";
  auto child = Start({"/bin/sh", "-c", script});
  ASSERT_NE(child, nullptr);
  const ChildExit exit = WaitForExit(*child);
  EXPECT_EQ(exit.ShellStatus(), 3);
  std::vector<std::string> expected;
  for (int i = 20 - static_cast<int>(kErrorTailLines) + 1; i <= 20; ++i) {
    expected.push_back("err " + std::to_string(i));
  }
  EXPECT_EQ(exit.last_error_lines, expected) << "stderr's last lines, not stdout's";
}

TEST(ChildProcess, NonExecutableFileIsExit126) {
  const std::string path = testing::MakeTempDir("child") + "/train.sh";
  testing::WriteFile(path, "#!/bin/sh\nexit 0\n");
  chmod(path.c_str(), 0644);
  auto child = Start({path});
  ASSERT_NE(child, nullptr);
  const ChildExit exit = WaitForExit(*child);
  EXPECT_EQ(exit.ShellStatus(), 126);
  EXPECT_NE(exit.start_error.find("Permission denied"), std::string::npos) << exit.start_error;
}

TEST(ChildProcess, ExitCodesAndSignalsAreReportedAsTheyAre) {
  auto exits3 = Start({"/bin/sh", "-c", "exit 3"});
  ASSERT_NE(exits3, nullptr);
  ChildExit exit = WaitForExit(*exits3);
  EXPECT_FALSE(exit.signaled);
  EXPECT_EQ(exit.exit_code, 3);
  EXPECT_EQ(exit.Describe(), "exit code 3");

  auto killed = Start({"/bin/sh", "-c", "kill -9 $$"});
  ASSERT_NE(killed, nullptr);
  exit = WaitForExit(*killed);
  EXPECT_TRUE(exit.signaled);
  EXPECT_EQ(exit.signal, SIGKILL);
  EXPECT_EQ(exit.ShellStatus(), 137);
  EXPECT_FALSE(exit.stopped_by_agent);
}

TEST(ChildProcess, StopEscalatesToSigkillAfterTheGracePeriod) {
  const std::string ready = testing::MakeTempDir("child") + "/ready";
  auto child =
      Start({"/bin/sh", "-c", "trap '' TERM; touch " + ready + "; while :; do sleep 0.05; done"});
  ASSERT_NE(child, nullptr);
  ASSERT_TRUE(testing::PollUntil([&] { return access(ready.c_str(), F_OK) == 0; }, kWaitMs, 10));
  const double started = MonotonicSeconds();
  const ChildExit exit = child->Stop(/*grace_ms=*/300, /*kill_wait_ms=*/5000);
  const double seconds = MonotonicSeconds() - started;
  EXPECT_TRUE(exit.signaled);
  EXPECT_EQ(exit.signal, SIGKILL);
  EXPECT_TRUE(exit.stopped_by_agent);
  EXPECT_GE(seconds, 0.3);
  EXPECT_LT(seconds, 5.0);
}

TEST(ChildProcess, StopEndsEverythingTheCommandStarted) {
  const std::string pid_file = testing::MakeTempDir("child") + "/pid";
  auto child = Start({"/bin/sh", "-c",
                      "sleep 60 & echo $! > " + pid_file + ".tmp; mv " + pid_file + ".tmp " +
                          pid_file + "; wait"});
  ASSERT_NE(child, nullptr);
  ASSERT_TRUE(testing::PollUntil([&] { return access(pid_file.c_str(), F_OK) == 0; }, kWaitMs, 10));
  const pid_t grandchild = std::stoi(testing::ReadFile(pid_file));
  const ChildExit exit = child->Stop(/*grace_ms=*/2000, /*kill_wait_ms=*/5000);
  EXPECT_EQ(exit.ShellStatus(), 128 + SIGTERM);
  EXPECT_TRUE(testing::PollUntil([&] { return NoLongerRuns(grandchild); }, kWaitMs, 10))
      << "the background sleep outlived its command";
}

TEST(ChildProcess, OutputIsRelayedLineByLineWithThePrefix) {
  const std::string out_path = testing::MakeTempDir("child") + "/out";
  const int saved = dup(STDOUT_FILENO);
  const int file = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(file, 0);
  fflush(stdout);
  dup2(file, STDOUT_FILENO);
  {
    auto child = Start({"/bin/sh", "-c", "printf 'one\\ntwo\\nno newline'"});
    if (child != nullptr) WaitForExit(*child);
  }
  dup2(saved, STDOUT_FILENO);
  close(saved);
  close(file);
  EXPECT_EQ(testing::ReadFile(out_path), "[rank 3] one\n[rank 3] two\n[rank 3] no newline\n");
}

TEST(ChildProcess, AProgramStartedAtIdlePriorityAndWhatItStartedLeaveItTogether) {
  if (!IdlePriorityIsReversible()) GTEST_SKIP() << "no CAP_SYS_NICE nor RLIMIT_NICE >= 20 here";
  ChildProcess::Options options;
  // A program that starts a child of its own while idle (a worker pool, say), then waits.
  options.argv = {"/bin/sh", "-c", "sleep 60 & wait"};
  options.env = {"PATH=/usr/bin:/bin"};
  options.idle_priority = true;
  StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(options);
  ASSERT_TRUE(child.ok()) << child.status();
  const pid_t program = (*child)->pid();
  EXPECT_EQ(sched_getscheduler(program), SCHED_IDLE);
  std::vector<pid_t> started;
  ASSERT_TRUE(testing::PollUntil(
      [&] { return !(started = DescendantsOf(program)).empty(); }, kWaitMs, 10));
  EXPECT_EQ(sched_getscheduler(started[0]), SCHED_IDLE);  // inherited

  ASSERT_TRUE((*child)->LeaveIdlePriority().ok());
  EXPECT_EQ(sched_getscheduler(program), SCHED_OTHER);
  EXPECT_EQ(sched_getscheduler(started[0]), SCHED_OTHER);
  (*child)->Stop(/*grace_ms=*/0, kWaitMs);
}

TEST(ChildProcess, LeavingIdlePriorityLeavesAProgramsOwnIdleThreadsAlone) {
  ChildProcess::Options options;
  options.argv = {"/bin/sleep", "60"};
  options.env = {"PATH=/usr/bin:/bin"};
  StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(options);
  ASSERT_TRUE(child.ok()) << child.status();
  const sched_param none{};
  ASSERT_EQ(sched_setscheduler((*child)->pid(), SCHED_IDLE, &none), 0);  // its own choice
  EXPECT_TRUE((*child)->LeaveIdlePriority().ok());
  EXPECT_EQ(sched_getscheduler((*child)->pid()), SCHED_IDLE);
  (*child)->Stop(/*grace_ms=*/0, kWaitMs);
}

TEST(ChildProcess, ResolvesNamesOnPath) {
  StatusOr<std::string> sh = ResolveProgram("sh", "/nonexistent:/bin");
  ASSERT_TRUE(sh.ok()) << sh.status();
  EXPECT_EQ(*sh, "/bin/sh");
  EXPECT_EQ(ResolveProgram("./x", "/bin").value(), "./x");
  EXPECT_EQ(ResolveProgram("lockstep-no-such-command", "/bin").status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace lockstep::agent
