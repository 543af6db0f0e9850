// Stragglers under `lockstep run`, end to end: the real launcher and 4 lockstep-worker processes
// on Fashion-MNIST. One worker slowed by a SIGSTOP/SIGCONT duty cycle (stopped half the time, as a
// throttled CPU or a noisy neighbour would leave it) is named, by its index, on the console and
// in the summary, and nobody else is; a run where nobody is slowed names nobody.
//
// Detection takes three windows of at least 5 s (common/rendezvous/straggler_detector.h), each
// closed by a heartbeat: the bound waited for below is far above that on a loaded machine.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "tests/support/job/job.h"

namespace lockstep::cli {
namespace {

using lockstep::testing::ChildProcess;
using lockstep::testing::DutyCycle;
using lockstep::testing::LatestStep;
using lockstep::testing::MakeTempDir;
using lockstep::testing::PollUntil;
using lockstep::testing::ProcessResult;
using lockstep::testing::ReadRunSummary;
using lockstep::testing::WorkerOfLauncher;
using lockstep::testing::WriteFile;

constexpr char kFashion[] = "/usr/share/datasets/fashion-mnist";
constexpr int64_t kNamedWithinMs = 120000;
constexpr int64_t kRunTimeoutMs = 300000;

// A job whose steps are mostly compute (a 2048-wide layer on 784 inputs, about 15 ms a step on
// 2 cores): a slowdown shows where real ones do, in the compute time of the slowed rank. (In a
// step that is mostly waiting on the all-reduce, a SIGSTOP mostly lands in the wait.)
// `extra`: more lines under spec (two-space indented), e.g. elastic.
std::string WriteManifest(const std::string& dir, const std::string& name, int64_t steps,
                          const std::string& extra = "  runPolicy: {restartPolicy: Never}\n") {
  const std::string path = dir + "/" + name + ".yaml";
  const std::string data = std::string("file://") + kFashion;
  std::ostringstream yaml;
  yaml << "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\n"
       << "metadata: {name: " << name << "}\n"
       << "spec:\n  replicas: 4\n  trainer:\n"
       << "    model: {type: mlp, hidden: [2048], activation: relu}\n"
       << "    data: {format: idx, train: [" << data << "/train-images-idx3-ubyte.gz, " << data
       << "/train-labels-idx1-ubyte.gz]}\n"
       << "    batchSize: 64\n    steps: " << steps << "\n"
       << "    optimizer: {type: sgd, learningRate: 0.05, momentum: 0.9}\n"
       << extra << "  metrics: {port: 0}\n";
  WriteFile(path, yaml.str());
  return path;
}

bool FashionInstalled() {
  return access((std::string(kFashion) + "/train-images-idx3-ubyte.gz").c_str(), R_OK) == 0;
}

// Once `run` trains, slows its worker 2 by a duty cycle until `seen(console)` holds or the bound
// passes; false (with the console in the failure) when it never held.
template <typename Seen>
bool SlowWorkerTwoUntil(ChildProcess& run, const std::string& name, Seen seen) {
  if (!PollUntil([&] { return LatestStep(run.StdoutSoFar()) > 0; }, 60000, 10)) {
    ADD_FAILURE() << "never trained: " << run.StdoutSoFar();
    return false;
  }
  const pid_t slowed = WorkerOfLauncher(run.pid(), name, name + "-worker-2");
  if (slowed == 0) {
    ADD_FAILURE() << name << "-worker-2 not found";
    return false;
  }
  DutyCycle duty(slowed);
  if (PollUntil([&] { return seen(run.StdoutSoFar()); }, kNamedWithinMs, 50)) return true;
  ADD_FAILURE() << run.StdoutSoFar();
  return false;
}

TEST(StragglerTest, AWorkerSlowedByHalfIsNamedByItsIndexAndNobodyElseIs) {
  if (!FashionInstalled()) GTEST_SKIP() << "Fashion-MNIST is not installed (scripts/setup.sh)";
  const std::string dir = MakeTempDir("lockstep-straggler");
  const std::string name = "straggler-" + std::to_string(getpid());
  ChildProcess run({LOCKSTEP_BINARY, "run", WriteManifest(dir, name, 100000000), "--summary",
                    dir + "/summary.json", "--log-dir", dir + "/logs"},
                   {{"LOCKSTEP_RUN_PROGRESS_INTERVAL_MS", "200"}});
  ASSERT_TRUE(SlowWorkerTwoUntil(run, name, [](const std::string& console) {
    return console.find("straggler: worker 2 ") != std::string::npos;
  }));
  kill(run.pid(), SIGINT);
  ProcessResult result = run.Wait(kRunTimeoutMs);
  ASSERT_FALSE(result.timed_out) << result.out;
  for (const char* other : {"straggler: worker 0 ", "straggler: worker 1 ",
                            "straggler: worker 3 "}) {
    EXPECT_EQ(result.out.find(other), std::string::npos) << result.out;
  }
  const nlohmann::json summary = ReadRunSummary(dir + "/summary.json");
  ASSERT_EQ(summary["stragglers"].size(), 1u) << summary.dump();
  EXPECT_EQ(summary["stragglers"][0]["worker"], 2) << summary.dump();
  EXPECT_EQ(summary["stragglers"][0]["member_id"], name + "-worker-2") << summary.dump();
  EXPECT_GE(summary["stragglers"][0]["ratio"].get<double>(), 1.5) << summary.dump();
  std::cout << "straggler named: " << summary["stragglers"].dump() << "\n";
}

// spec.elastic.replaceStragglers: the straggler's process is killed and started again at once,
// not as a restart (backoffLimit 0 would refuse one), and the run trains to its step count.
TEST(StragglerTest, AStragglerIsReplacedWhenTheJobAsksAndTheRunFinishes) {
  if (!FashionInstalled()) GTEST_SKIP() << "Fashion-MNIST is not installed (scripts/setup.sh)";
  const std::string dir = MakeTempDir("lockstep-replace");
  const std::string name = "replace-" + std::to_string(getpid());
  // About a minute undisturbed on 2 cores: outlasts detection.
  constexpr int64_t kSteps = 3000;
  ChildProcess run({LOCKSTEP_BINARY, "run",
                    WriteManifest(dir, name, kSteps,
                                  "  elastic: {replaceStragglers: true}\n"
                                  "  runPolicy: {restartPolicy: OnFailure, backoffLimit: 0}\n"),
                    "--summary", dir + "/summary.json", "--log-dir", dir + "/logs"},
                   {{"LOCKSTEP_RUN_PROGRESS_INTERVAL_MS", "200"}});
  ASSERT_TRUE(SlowWorkerTwoUntil(run, name, [](const std::string& console) {
    return console.find("straggler: worker 2 ") != std::string::npos &&
           console.find("replacing it") != std::string::npos;
  }));
  ProcessResult result = run.Wait(kRunTimeoutMs);
  ASSERT_FALSE(result.timed_out) << result.out;
  ASSERT_EQ(result.exit_code, 0) << result.out;
  EXPECT_NE(result.out.find("a straggler's: not a restart"), std::string::npos) << result.out;
  const nlohmann::json summary = ReadRunSummary(dir + "/summary.json");
  EXPECT_EQ(summary["steps"], kSteps) << summary.dump();
  EXPECT_EQ(summary["restarts"], 0) << summary.dump();
  ASSERT_GE(summary["stragglers"].size(), 1u) << summary.dump();
  EXPECT_EQ(summary["stragglers"][0]["worker"], 2) << summary.dump();
  EXPECT_EQ(summary["stragglers"][0]["replaced"], true) << summary.dump();
}

// Exec mode: a program that reports its compute time (lockstep.progress.computing()) is paced as
// the built-in trainer is. Its slowed process (the program, not its agent) is named by index.
constexpr char kComputingProgram[] = R"(from lockstep import progress
step = 0
while True:
    with progress.computing():
        total = 0
        for i in range(150000):
            total += i * i
    step += 1
    progress.report(step=step, samples=step * 32, total_steps=100000000)
)";

TEST(StragglerTest, AnExecProgramReportingItsComputeTimeIsNamedWhenSlowed) {
  const std::string dir = MakeTempDir("lockstep-exec-straggler");
  const std::string name = "exec-straggler-" + std::to_string(getpid());
  WriteFile(dir + "/program.py", kComputingProgram);
  WriteFile(dir + "/job.yaml",
            "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\n"
            "metadata: {name: " +
                name +
                "}\nspec:\n  replicas: 4\n"
                "  command: [python3, " +
                dir +
                "/program.py]\n"
                "  runPolicy: {restartPolicy: Never}\n  metrics: {port: 0}\n");
  ChildProcess run({LOCKSTEP_BINARY, "run", dir + "/job.yaml", "--summary", dir + "/summary.json",
                    "--log-dir", dir + "/logs", "--console", "none"},
                   {{"LOCKSTEP_RUN_PROGRESS_INTERVAL_MS", "200"}});
  ASSERT_TRUE(PollUntil([&] { return LatestStep(run.StdoutSoFar()) > 0; }, 60000, 10))
      << run.StdoutSoFar();
  // The program: the process of worker 2's member that is not its agent.
  const std::string member = name + "-worker-2";
  const pid_t agent = WorkerOfLauncher(run.pid(), name, member);
  pid_t program = 0;
  ASSERT_TRUE(PollUntil(
      [&] {
        for (pid_t pid : lockstep::testing::FindProcessesWithEnv("LOCKSTEP_POD", member)) {
          if (pid != agent) program = pid;
        }
        return program != 0;
      },
      30000, 10));
  {
    DutyCycle duty(program);
    EXPECT_TRUE(PollUntil(
        [&] { return run.StdoutSoFar().find("straggler: worker 2 ") != std::string::npos; },
        kNamedWithinMs, 50))
        << run.StdoutSoFar();
  }
  kill(run.pid(), SIGINT);
  ProcessResult result = run.Wait(kRunTimeoutMs);
  ASSERT_FALSE(result.timed_out) << result.out;
  for (const char* other :
       {"straggler: worker 0 ", "straggler: worker 1 ", "straggler: worker 3 "}) {
    EXPECT_EQ(result.out.find(other), std::string::npos) << result.out;
  }
  const nlohmann::json summary = ReadRunSummary(dir + "/summary.json");
  ASSERT_EQ(summary["stragglers"].size(), 1u) << summary.dump();
  EXPECT_EQ(summary["stragglers"][0]["worker"], 2) << summary.dump();
}

TEST(StragglerTest, ARunWhereNobodyIsSlowedNamesNobody) {
  if (!FashionInstalled()) GTEST_SKIP() << "Fashion-MNIST is not installed (scripts/setup.sh)";
  const std::string dir = MakeTempDir("lockstep-calm");
  const std::string name = "calm-" + std::to_string(getpid());
  // About 30 s on 2 cores: five windows of every worker.
  ProcessResult result = lockstep::testing::RunProcess(
      {LOCKSTEP_BINARY, "run", WriteManifest(dir, name, 2000), "--summary",
       dir + "/summary.json", "--log-dir", dir + "/logs"},
      {}, kRunTimeoutMs);
  ASSERT_FALSE(result.timed_out) << result.out << result.err;
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_EQ(result.out.find("straggler: "), std::string::npos) << result.out;
  const nlohmann::json summary = ReadRunSummary(dir + "/summary.json");
  EXPECT_TRUE(summary["stragglers"].empty()) << summary.dump();
  std::cout << "calm run: " << summary["wall_seconds"] << " s, no straggler\n";
}

}  // namespace
}  // namespace lockstep::cli
