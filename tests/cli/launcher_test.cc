// The Supervisor of `lockstep run` with /bin/sh standing in for workers.
#include "cli/launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "tests/support/process/process.h"

namespace lockstep::cli {
namespace {

using lockstep::testing::MakeTempDir;
using lockstep::testing::ReadFile;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

WorkerCommand ShellWorker(const std::string& dir, const std::string& member_id,
                          const std::string& script) {
  WorkerCommand command;
  command.member_id = member_id;
  command.argv = {"/bin/sh", "-c", script};
  command.env = {{"LOCKSTEP_POD", member_id}};
  command.log_path = dir + "/" + member_id + ".log";
  return command;
}

// Polls the supervisor until `count` events arrived or 10 s passed.
std::vector<SupervisorEvent> CollectEvents(Supervisor& supervisor, size_t count) {
  std::vector<SupervisorEvent> all;
  const double deadline = Now() + 10;
  while (all.size() < count && Now() < deadline) {
    StatusOr<std::vector<SupervisorEvent>> events = supervisor.Poll(200);
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) break;
    all.insert(all.end(), events->begin(), events->end());
  }
  return all;
}

// A pipe whose write end the workers inherit as fd `ready_fd`: a worker writes a line to it when
// it is ready, and the test reads it with a deadline (instead of sleeping).
class ReadyPipe {
 public:
  ReadyPipe() {
    EXPECT_EQ(pipe(fds_), 0);
    fcntl(fds_[0], F_SETFD, FD_CLOEXEC);
  }
  ~ReadyPipe() {
    close(fds_[0]);
    if (fds_[1] >= 0) close(fds_[1]);
  }
  int write_fd() const { return fds_[1]; }
  void CloseWriteEnd() {
    close(fds_[1]);
    fds_[1] = -1;
  }
  // Reads until `lines` newlines arrived or timeout_ms passed.
  std::string ReadLines(int lines, int64_t timeout_ms) {
    std::string text;
    const double deadline = Now() + timeout_ms / 1000.0;
    while (std::count(text.begin(), text.end(), '\n') < lines && Now() < deadline) {
      struct pollfd pfd {
        fds_[0], POLLIN, 0
      };
      if (poll(&pfd, 1, static_cast<int>((deadline - Now()) * 1000) + 1) <= 0) continue;
      char buffer[256];
      const ssize_t got = read(fds_[0], buffer, sizeof(buffer));
      if (got <= 0) break;
      text.append(buffer, static_cast<size_t>(got));
    }
    return text;
  }

 private:
  int fds_[2] = {-1, -1};
};

TEST(SupervisorTest, ReportsEachWorkersExitCode) {
  const std::string dir = MakeTempDir("supervisor");
  Supervisor supervisor({}, std::make_unique<NeverRestart>());
  ASSERT_TRUE(
      supervisor.Start({ShellWorker(dir, "w-0", "exit 0"), ShellWorker(dir, "w-1", "exit 3")})
          .ok());
  std::vector<SupervisorEvent> events = CollectEvents(supervisor, 2);
  ASSERT_EQ(events.size(), 2u);
  for (const SupervisorEvent& event : events) {
    EXPECT_EQ(event.kind, SupervisorEvent::Kind::kWorkerExited);
    EXPECT_FALSE(event.exit.signaled);
    EXPECT_FALSE(event.restart_scheduled);
    if (event.exit.member_id == "w-0") {
      EXPECT_TRUE(event.exit.success());
    }
    if (event.exit.member_id == "w-1") {
      EXPECT_EQ(event.exit.exit_code, 3);
      EXPECT_EQ(event.exit.Describe(), "exit code 3");
    }
  }
  EXPECT_EQ(supervisor.running(), 0);
}

TEST(SupervisorTest, WorkerGetsItsEnvironmentAndWritesToItsLog) {
  const std::string dir = MakeTempDir("supervisor");
  Supervisor supervisor({}, nullptr);
  ASSERT_TRUE(
      supervisor.Start({ShellWorker(dir, "w-0", "echo \"pod=$LOCKSTEP_POD\"; echo oops >&2")})
          .ok());
  ASSERT_EQ(CollectEvents(supervisor, 1).size(), 1u);
  EXPECT_EQ(ReadFile(dir + "/w-0.log"), "pod=w-0\noops\n");
}

// Replace (a straggler): the worker is killed and started again at once, although the policy
// restarts nothing, and the replacement is not counted as a restart.
TEST(SupervisorTest, AReplacedWorkerStartsAgainAtOnceWithoutCountingARestart) {
  const std::string dir = MakeTempDir("supervisor");
  ReadyPipe ready;
  Supervisor supervisor({}, std::make_unique<NeverRestart>());
  const std::string script =
      "echo ready >&" + std::to_string(ready.write_fd()) + "; while :; do sleep 1; done";
  ASSERT_TRUE(supervisor.Start({ShellWorker(dir, "w-0", script)}).ok());
  ASSERT_EQ(ready.ReadLines(1, 10000), "ready\n");
  const pid_t first = supervisor.pid(0);
  ASSERT_TRUE(supervisor.Replace(0).ok());
  std::vector<SupervisorEvent> events = CollectEvents(supervisor, 2);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, SupervisorEvent::Kind::kWorkerExited);
  EXPECT_TRUE(events[0].replaced);
  EXPECT_TRUE(events[0].restart_scheduled);
  EXPECT_EQ(events[0].exit.signal, SIGKILL);
  EXPECT_EQ(events[1].kind, SupervisorEvent::Kind::kWorkerRestarted);
  EXPECT_TRUE(events[1].replaced);
  EXPECT_NE(events[1].exit.pid, first);
  EXPECT_EQ(ready.ReadLines(1, 10000), "ready\n") << "the replacement runs";
  EXPECT_EQ(supervisor.restarts(), 0);
  EXPECT_EQ(supervisor.running(), 1);

  // A later failure is the policy's again: never restarted.
  ASSERT_TRUE(supervisor.SignalWorker(0, SIGKILL).ok());
  events = CollectEvents(supervisor, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_FALSE(events[0].replaced);
  EXPECT_FALSE(events[0].restart_scheduled);
  EXPECT_EQ(supervisor.running(), 0);
  EXPECT_FALSE(supervisor.Replace(0).ok()) << "nothing runs in the slot to replace";
}

// A worker that completed just before Replace's signal (exited, not yet reaped: the signal reaches
// a zombie) is reported as the completion it was, not replaced.
TEST(SupervisorTest, AWorkerThatExitedBeforeItsReplacementIsReportedAsItEnded) {
  const std::string dir = MakeTempDir("supervisor");
  Supervisor supervisor({}, std::make_unique<NeverRestart>());
  ASSERT_TRUE(supervisor.Start({ShellWorker(dir, "w-0", "exit 0")}).ok());
  const pid_t pid = supervisor.pid(0);
  // No Poll has reaped it yet: wait until it is a zombie.
  ASSERT_TRUE(lockstep::testing::PollUntil(
      [&] {
        return ReadFile("/proc/" + std::to_string(pid) + "/stat").find(") Z") !=
               std::string::npos;
      },
      10000, 5));
  ASSERT_TRUE(supervisor.Replace(0).ok());
  std::vector<SupervisorEvent> events = CollectEvents(supervisor, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(events[0].exit.success());
  EXPECT_FALSE(events[0].replaced);
  EXPECT_FALSE(events[0].restart_scheduled);
  StatusOr<std::vector<SupervisorEvent>> later = supervisor.Poll(300);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_TRUE(later->empty()) << "nothing is started again";
  EXPECT_EQ(supervisor.running(), 0);
}

TEST(SupervisorTest, KilledWorkerIsReportedWithItsSignal) {
  const std::string dir = MakeTempDir("supervisor");
  ReadyPipe ready;
  Supervisor supervisor({}, nullptr);
  const std::string script =
      "echo ready >&" + std::to_string(ready.write_fd()) + "; while :; do sleep 1; done";
  ASSERT_TRUE(supervisor.Start({ShellWorker(dir, "w-0", script)}).ok());
  ASSERT_EQ(ready.ReadLines(1, 10000), "ready\n");
  ASSERT_TRUE(supervisor.SignalWorker(0, SIGKILL).ok());
  std::vector<SupervisorEvent> events = CollectEvents(supervisor, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(events[0].exit.signaled);
  EXPECT_EQ(events[0].exit.signal, SIGKILL);
  EXPECT_EQ(events[0].exit.Describe(), "signal 9 (SIGKILL)");
  EXPECT_EQ(events[0].exit.ShellStatus(), 137);
}

TEST(SupervisorTest, StopAllEscalatesToSigkillAfterTheGracePeriod) {
  const std::string dir = MakeTempDir("supervisor");
  ReadyPipe ready;
  SupervisorOptions options;
  options.grace_period_ms = 300;
  Supervisor supervisor(options, nullptr);
  const std::string fd = std::to_string(ready.write_fd());
  ASSERT_TRUE(supervisor
                  .Start({ShellWorker(dir, "polite",
                                      "trap 'exit 143' TERM; echo ready >&" + fd +
                                          "; while :; do sleep 0.1; done"),
                          ShellWorker(dir, "stubborn",
                                      "trap '' TERM; echo ready >&" + fd +
                                          "; while :; do sleep 0.1; done")})
                  .ok());
  ASSERT_EQ(ready.ReadLines(2, 10000), "ready\nready\n");
  const double started = Now();
  std::vector<WorkerExit> exits = supervisor.StopAll();
  const double took = Now() - started;
  EXPECT_EQ(supervisor.running(), 0);
  ASSERT_EQ(exits.size(), 2u);
  for (const WorkerExit& exit : exits) {
    if (exit.member_id == "polite") {
      EXPECT_EQ(exit.ShellStatus(), 143);
    }
    if (exit.member_id == "stubborn") {
      EXPECT_EQ(exit.ShellStatus(), 128 + SIGKILL);
    }
  }
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 5.0);
}

TEST(SupervisorTest, SecondSignalDuringStopSkipsTheGracePeriod) {
  const std::string dir = MakeTempDir("supervisor");
  ReadyPipe ready;
  SupervisorOptions options;
  options.grace_period_ms = 20000;
  Supervisor supervisor(options, nullptr);
  // The worker ignores SIGTERM but, on receiving it, signals the launcher again: a user pressing
  // Ctrl-C a second time while the workers are being stopped.
  ASSERT_TRUE(supervisor
                  .Start({ShellWorker(dir, "w-0",
                                      "trap 'kill -TERM $PPID' TERM; echo ready >&" +
                                          std::to_string(ready.write_fd()) +
                                          "; while :; do sleep 0.1; done")})
                  .ok());
  ASSERT_EQ(ready.ReadLines(1, 10000), "ready\n");
  const double started = Now();
  std::vector<WorkerExit> exits = supervisor.StopAll();
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].signal, SIGKILL);
  EXPECT_LT(Now() - started, 10.0);
}

TEST(SupervisorTest, StopAllStopsTheWorkersOwnChildren) {
  const std::string dir = MakeTempDir("supervisor");
  ReadyPipe ready;
  Supervisor supervisor({}, nullptr);
  // The worker starts a child and reports its pid; stopping the worker must stop the child too.
  ASSERT_TRUE(
      supervisor
          .Start({ShellWorker(
              dir, "w-0", "sleep 1000 & echo $! >&" + std::to_string(ready.write_fd()) + "; wait")})
          .ok());
  const std::string line = ready.ReadLines(1, 10000);
  ASSERT_FALSE(line.empty());
  const pid_t grandchild = static_cast<pid_t>(std::stol(line));
  supervisor.StopAll();
  // Orphans are reaped by init (or linger as zombies where init does not reap): either way the
  // process no longer runs.
  EXPECT_TRUE(lockstep::testing::PollUntil(
      [&] {
        const std::string stat = ReadFile("/proc/" + std::to_string(grandchild) + "/stat");
        return stat.empty() || stat.find(") Z") != std::string::npos;
      },
      5000, 20));
}

TEST(SupervisorTest, StartNamesTheMemberWhoseProgramCannotRun) {
  const std::string dir = MakeTempDir("supervisor");
  Supervisor supervisor({}, nullptr);
  WorkerCommand command = ShellWorker(dir, "w-7", "");
  command.argv = {dir + "/no-such-program"};
  Status status = supervisor.Start({command});
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("w-7"), std::string::npos) << status;
  EXPECT_NE(status.message().find("no-such-program"), std::string::npos) << status;
  EXPECT_EQ(supervisor.running(), 0);
}

TEST(SupervisorTest, RestartOnFailureReplacesWorkerWithSameMemberIdUpToBackoffLimit) {
  const std::string dir = MakeTempDir("supervisor");
  Supervisor supervisor({}, std::make_unique<RestartOnFailure>(/*backoff_limit=*/2,
                                                               /*initial_backoff_ms=*/10,
                                                               /*max_backoff_ms=*/20));
  ASSERT_TRUE(
      supervisor.Start({ShellWorker(dir, "w-0", "echo \"start $LOCKSTEP_POD\"; exit 1")}).ok());
  // exit, restart, exit, restart, exit (the limit is reached: no third restart).
  std::vector<SupervisorEvent> events = CollectEvents(supervisor, 5);
  ASSERT_EQ(events.size(), 5u);
  const SupervisorEvent::Kind kExited = SupervisorEvent::Kind::kWorkerExited;
  const SupervisorEvent::Kind kRestarted = SupervisorEvent::Kind::kWorkerRestarted;
  EXPECT_EQ(events[0].kind, kExited);
  EXPECT_TRUE(events[0].restart_scheduled);
  EXPECT_EQ(events[1].kind, kRestarted);
  EXPECT_EQ(events[2].kind, kExited);
  EXPECT_EQ(events[3].kind, kRestarted);
  EXPECT_EQ(events[4].kind, kExited);
  EXPECT_FALSE(events[4].restart_scheduled);
  for (const SupervisorEvent& event : events) EXPECT_EQ(event.exit.member_id, "w-0");
  EXPECT_EQ(supervisor.restarts(), 2);
  EXPECT_EQ(ReadFile(dir + "/w-0.log"), "start w-0\nstart w-0\nstart w-0\n");
}

// `lockstep run` of a parameter-server job: the workers are the first slots, the servers
// follow. A completing job drops its workers' pending replacements, never a server's, which the
// workers still training need.
TEST(SupervisorTest, CancellingTheWorkersPendingRestartsKeepsTheLaterSlots) {
  const std::string dir = MakeTempDir("supervisor");
  Supervisor supervisor({}, std::make_unique<RestartOnFailure>(/*backoff_limit=*/5,
                                                               /*initial_backoff_ms=*/600000,
                                                               /*max_backoff_ms=*/600000));
  ASSERT_TRUE(supervisor
                  .Start({ShellWorker(dir, "worker-0", "exit 1"),
                          ShellWorker(dir, "ps-0", "exit 1")})
                  .ok());
  ASSERT_EQ(CollectEvents(supervisor, 2).size(), 2u);
  EXPECT_EQ(supervisor.pending_restarts(/*end=*/1), 1);
  EXPECT_EQ(supervisor.pending_restarts(/*end=*/2), 2);
  supervisor.CancelPendingRestarts(/*end=*/1);
  EXPECT_EQ(supervisor.pending_restarts(/*end=*/1), 0);
  EXPECT_EQ(supervisor.pending_restarts(/*end=*/2), 1) << "the server's replacement was dropped";
}

TEST(RestartOnFailureTest, BackoffDoublesUpToTheMaximum) {
  RestartOnFailure policy(/*backoff_limit=*/10, /*initial_backoff_ms=*/100,
                          /*max_backoff_ms=*/500);
  WorkerExit exit;
  exit.exit_code = 1;
  EXPECT_EQ(policy.OnWorkerFailed(exit, 0).backoff_ms, 100);
  EXPECT_EQ(policy.OnWorkerFailed(exit, 1).backoff_ms, 200);
  EXPECT_EQ(policy.OnWorkerFailed(exit, 2).backoff_ms, 400);
  EXPECT_EQ(policy.OnWorkerFailed(exit, 3).backoff_ms, 500);
  EXPECT_FALSE(policy.OnWorkerFailed(exit, 10).restart);
}

WorkerExit ExitWithCode(int code) {
  WorkerExit exit;
  exit.exit_code = code;
  return exit;
}

WorkerExit KilledBy(int signal_number) {
  WorkerExit exit;
  exit.signaled = true;
  exit.signal = signal_number;
  return exit;
}

spec::RunPolicy Policy(spec::RestartPolicy kind, int32_t backoff_limit,
                       std::vector<int32_t> retryable = {}) {
  spec::RunPolicy policy;
  policy.restart_policy = kind;
  policy.backoff_limit = backoff_limit;
  policy.retryable_exit_codes = std::move(retryable);
  return policy;
}

TEST(RunPolicyRestartsTest, OnFailureRetriesCrashesAndSignalsButNeverBadInput) {
  RunPolicyRestarts policy(Policy(spec::RestartPolicy::kOnFailure, 3), 100, 1000);
  EXPECT_TRUE(policy.OnWorkerFailed(ExitWithCode(1), 0).restart);
  EXPECT_TRUE(policy.OnWorkerFailed(KilledBy(SIGKILL), 1).restart);
  EXPECT_TRUE(policy.OnWorkerFailed(KilledBy(SIGSEGV), 2).restart);
  const RestartPolicy::Decision bad_input = policy.OnWorkerFailed(ExitWithCode(2), 0);
  EXPECT_FALSE(bad_input.restart);
  EXPECT_NE(bad_input.refusal.find("bad input"), std::string::npos) << bad_input.refusal;
}

TEST(RunPolicyRestartsTest, BackoffLimitCountsReplacementsForTheWholeJobAndIsNamed) {
  RunPolicyRestarts policy(Policy(spec::RestartPolicy::kOnFailure, 2), 100, 150);
  EXPECT_EQ(policy.OnWorkerFailed(KilledBy(SIGKILL), 0).backoff_ms, 100);
  EXPECT_EQ(policy.OnWorkerFailed(KilledBy(SIGKILL), 1).backoff_ms, 150);
  const RestartPolicy::Decision refused = policy.OnWorkerFailed(KilledBy(SIGKILL), 2);
  EXPECT_FALSE(refused.restart);
  EXPECT_NE(refused.refusal.find("backoffLimit 2"), std::string::npos) << refused.refusal;
}

TEST(RunPolicyRestartsTest, ExitCodeRetriesOnlySignalsStoppedFromOutsideAndListedCodes) {
  RunPolicyRestarts policy(Policy(spec::RestartPolicy::kExitCode, 10, {3}), 100, 1000);
  EXPECT_TRUE(policy.OnWorkerFailed(KilledBy(SIGKILL), 0).restart);   // 137
  EXPECT_TRUE(policy.OnWorkerFailed(KilledBy(SIGTERM), 0).restart);   // 143
  EXPECT_TRUE(policy.OnWorkerFailed(KilledBy(SIGINT), 0).restart);    // 130
  EXPECT_TRUE(policy.OnWorkerFailed(ExitWithCode(3), 0).restart);     // listed
  EXPECT_FALSE(policy.OnWorkerFailed(ExitWithCode(1), 0).restart);    // a crash
  EXPECT_FALSE(policy.OnWorkerFailed(KilledBy(SIGSEGV), 0).restart);  // 139
  const RestartPolicy::Decision refused = policy.OnWorkerFailed(ExitWithCode(1), 0);
  EXPECT_NE(refused.refusal.find("not retryable"), std::string::npos) << refused.refusal;
}

TEST(RunPolicyRestartsTest, NeverRetriesNothing) {
  RunPolicyRestarts policy(Policy(spec::RestartPolicy::kNever, 10), 100, 1000);
  const RestartPolicy::Decision refused = policy.OnWorkerFailed(KilledBy(SIGKILL), 0);
  EXPECT_FALSE(refused.restart);
  EXPECT_EQ(refused.refusal, "restartPolicy Never");
}

TEST(RunPolicyRestartsTest, ExecAgentsThatGaveUpAreNotReplacedButALostWorkerIs) {
  RunPolicyRestarts policy(Policy(spec::RestartPolicy::kOnFailure, 3), 100, 1000,
                           /*workers_restart_their_commands=*/true);
  // They give up only when the job's budget is spent or the policy refused, and say so: a
  // replacement would start the command again past backoffLimit + 1.
  WorkerExit gave_up = ExitWithCode(1);
  gave_up.termination_message = "lockstep: gave up: restarts exhausted: 3 of 3";
  const RestartPolicy::Decision exited = policy.OnWorkerFailed(gave_up, 0);
  EXPECT_FALSE(exited.restart);
  EXPECT_EQ(exited.refusal, "its agents gave up: restarts exhausted: 3 of 3");
  // A worker lost otherwise, as a pod is: an agent killed, or a pod of several ranks that exits
  // 137 because one of its agents was.
  EXPECT_TRUE(policy.OnWorkerFailed(KilledBy(SIGKILL), 0).restart);
  EXPECT_TRUE(policy.OnWorkerFailed(ExitWithCode(137), 0).restart);
  EXPECT_FALSE(policy.OnWorkerFailed(ExitWithCode(137), 3).restart) << "within backoffLimit";
}

TEST(SupervisorTest, SigtermToTheLauncherIsReportedAsAnEvent) {
  const std::string dir = MakeTempDir("supervisor");
  ReadyPipe ready;
  Supervisor supervisor({}, nullptr);
  ASSERT_TRUE(supervisor
                  .Start({ShellWorker(dir, "w-0",
                                      "echo ready >&" + std::to_string(ready.write_fd()) +
                                          "; while :; do sleep 0.1; done")})
                  .ok());
  ASSERT_EQ(ready.ReadLines(1, 10000), "ready\n");
  ASSERT_EQ(raise(SIGTERM), 0);
  std::vector<SupervisorEvent> events = CollectEvents(supervisor, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, SupervisorEvent::Kind::kSignal);
  EXPECT_EQ(events[0].signal, SIGTERM);
  // The worker was not touched by the launcher's signal: it runs in its own process group.
  EXPECT_EQ(supervisor.running(), 1);
}

}  // namespace
}  // namespace lockstep::cli
