// `lockstep run` end to end: the real binary, real lockstep-worker processes, real data.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/job/job.h"

namespace lockstep::cli {
namespace {

using lockstep::testing::ChildProcess;
using lockstep::testing::FindProcessesWithEnv;
using lockstep::testing::MakeTempDir;
using lockstep::testing::PollUntil;
using lockstep::testing::ProcessResult;
using lockstep::testing::ReadFile;
using lockstep::testing::RunProcess;
using lockstep::testing::WorkerOfLauncher;
using lockstep::testing::WorkersOfLauncher;
using lockstep::testing::WriteFile;

const std::string kSource = LOCKSTEP_SOURCE_DIR;
constexpr char kDigits[] = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

// A digits job that trains far longer than any test waits: the failure tests stop it midway.
// Its name is unique per test so /proc searches find only this run's workers.
std::string LongDigitsManifest(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name + ".yaml";
  WriteFile(path,
            "apiVersion: lockstep.io/v1alpha1\n"
            "kind: TrainingJob\n"
            "metadata: {name: " +
                name +
                "}\n"
                "spec:\n"
                "  replicas: 2\n"
                "  trainer:\n"
                "    model: {type: mlp, hidden: [32], activation: relu}\n"
                "    data: {format: csv, train: [file://" +
                std::string(kDigits) +
                "]}\n"
                "    batchSize: 16\n"
                "    steps: 100000000\n"
                "  runPolicy: {restartPolicy: Never}\n"
                "  metrics: {port: 0}\n");
  return path;
}

// A 10-step CSV job of `replicas` workers written to `path` (returned). `metadata` is the flow
// mapping after "metadata: "; `extra` holds indented YAML lines appended to the spec ("    device:
// cuda\n" for the trainer, "  metrics: {port: 0}\n" for the spec itself).
std::string ShortManifest(const std::string& path, const std::string& metadata, int replicas,
                          const std::string& extra = "", const std::string& data = kDigits) {
  WriteFile(path, "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: " + metadata +
                      "\nspec:\n  replicas: " + std::to_string(replicas) +
                      "\n  trainer:\n    data: {format: csv, train: [file://" + data +
                      "]}\n    steps: 10\n" + extra);
  return path;
}

bool FileExists(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0;
}

// Waits until the run has trained at least one step (its progress display says "step N/" with
// N > 0, or plain lines appear), so failures hit a running generation.
bool WaitForTraining(ChildProcess& run, int64_t timeout_ms) {
  return PollUntil(
      [&] {
        const std::string out = run.StdoutSoFar();
        return out.find("loss ") != std::string::npos;
      },
      timeout_ms, 100);
}

TEST(RunCommandTest, DigitsTrainsToHighAccuracyOnTwoWorkers) {
  const std::string dir = MakeTempDir("lockstep-run");
  const std::string summary_path = dir + "/summary.json";
  ProcessResult result =
      RunProcess({LOCKSTEP_BINARY, "run", kSource + "/examples/digits.yaml", "--replicas", "2",
                  "--summary", summary_path, "--log-dir", dir + "/logs"},
                 {}, 240000);
  ASSERT_FALSE(result.timed_out) << result.out << result.err;
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  nlohmann::json summary = nlohmann::json::parse(ReadFile(summary_path));
  for (const char* key :
       {"steps", "world_size", "final_loss", "eval_accuracy", "samples_per_second", "restarts",
        "generations", "resumed_from_step", "recovery_seconds", "wall_seconds", "job"}) {
    EXPECT_TRUE(summary.contains(key)) << key << " in " << summary.dump();
  }
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_EQ(summary["steps"], 600);
  EXPECT_EQ(summary["job"], "default/digits");
  EXPECT_GE(summary["eval_accuracy"].get<double>(), 0.95) << summary.dump();
  EXPECT_EQ(summary["restarts"], 0);
  EXPECT_GE(summary["generations"].get<int64_t>(), 1);
  EXPECT_TRUE(FileExists(dir + "/logs/worker-0.log"));
  EXPECT_TRUE(FileExists(dir + "/logs/worker-1.log"));
  EXPECT_NE(result.out.find("test accuracy"), std::string::npos) << result.out;
}

TEST(RunCommandTest, FashionMnistExampleReaches85PercentTestAccuracy) {
  const std::string dir = MakeTempDir("lockstep-run");
  const std::string summary_path = dir + "/summary.json";
  // The example as shipped, except for its metrics ports (9400 + i): other runs on a shared
  // machine may hold them, and this test is about training, not the endpoint.
  std::string manifest = ReadFile(kSource + "/examples/fashion-mnist.yaml");
  const size_t metrics = manifest.find("metrics: {port: 9400}");
  ASSERT_NE(metrics, std::string::npos) << "the example's metrics line changed; update this test";
  manifest.replace(metrics, std::string("metrics: {port: 9400}").size(), "metrics: {port: 0}");
  const std::string manifest_path = dir + "/fashion-mnist.yaml";
  WriteFile(manifest_path, manifest);
  ProcessResult result = RunProcess({LOCKSTEP_BINARY, "run", manifest_path, "--summary",
                                     summary_path, "--log-dir", dir + "/logs"},
                                    {}, 840000);
  ASSERT_FALSE(result.timed_out) << result.out << result.err;
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  nlohmann::json summary = nlohmann::json::parse(ReadFile(summary_path));
  EXPECT_EQ(summary["world_size"], 4);
  EXPECT_GE(summary["eval_accuracy"].get<double>(), 0.85) << summary.dump();
  std::cout << "fashion-mnist: " << summary.dump() << "\n";
}

TEST(RunCommandTest, KilledWorkerEndsTheRunPromptlyAndIsNamed) {
  const std::string dir = MakeTempDir("lockstep-run");
  const std::string name = "kill-" + std::to_string(getpid());
  ChildProcess run({LOCKSTEP_BINARY, "run", LongDigitsManifest(dir, name), "--log-dir",
                    dir + "/logs", "--summary", dir + "/summary.json"},
                   {});
  ASSERT_TRUE(WaitForTraining(run, 120000)) << run.StdoutSoFar();
  const pid_t victim = WorkerOfLauncher(run.pid(), name, name + "-worker-1");
  ASSERT_NE(victim, 0) << "worker-1 not found among the launcher's children";
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  ProcessResult result = run.Wait(30000);
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_NE(result.err.find(name + "-worker-1"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("signal 9"), std::string::npos) << result.err;
  EXPECT_TRUE(WorkersOfLauncher(run.pid(), name).empty());
  EXPECT_TRUE(FindProcessesWithEnv("LOCKSTEP_JOB", "default/" + name).empty());
  nlohmann::json summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  EXPECT_EQ(summary["failed_worker"], name + "-worker-1");
}

TEST(RunCommandTest, SigintStopsEveryWorkerAndExits130) {
  const std::string dir = MakeTempDir("lockstep-run");
  const std::string name = "sigint-" + std::to_string(getpid());
  ChildProcess run(
      {LOCKSTEP_BINARY, "run", LongDigitsManifest(dir, name), "--log-dir", dir + "/logs"}, {});
  ASSERT_TRUE(WaitForTraining(run, 120000)) << run.StdoutSoFar();
  ASSERT_EQ(WorkersOfLauncher(run.pid(), name).size(), 2u);
  ASSERT_EQ(kill(run.pid(), SIGINT), 0);
  ProcessResult result = run.Wait(30000);
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 130) << result.out << result.err;
  // No process of this job is left: the launcher reaped its workers before exiting.
  EXPECT_TRUE(FindProcessesWithEnv("LOCKSTEP_JOB", "default/" + name).empty());
}

// A stand-in worker (LOCKSTEP_WORKER_BINARY) that leaves a mark if it is ever started.
struct StartMarkingWorker {
  explicit StartMarkingWorker(const std::string& dir)
      : binary(dir + "/fake-worker"), marker(dir + "/worker-started") {
    WriteFile(binary, "#!/bin/sh\ntouch " + marker + "\n");
    chmod(binary.c_str(), 0755);
  }
  std::string binary;
  std::string marker;
};

TEST(RunCommandTest, BadManifestExits2BeforeStartingAnyWorker) {
  const std::string dir = MakeTempDir("lockstep-run");
  // Valid schema, missing data: the problem only a data check finds.
  const std::string manifest = ShortManifest(dir + "/missing-data.yaml", "{name: missing}", 2, "",
                                             "/nonexistent/train.csv");
  const StartMarkingWorker worker_stand_in(dir);
  const std::string& marker = worker_stand_in.marker;
  const std::string& fake_worker = worker_stand_in.binary;
  // Schema problem: no replicas.
  const std::string bad_schema = ShortManifest(dir + "/no-replicas.yaml", "{name: bad}", 0);
  for (const std::string& path : {manifest, bad_schema}) {
    SCOPED_TRACE(path);
    ProcessResult result = RunProcess({LOCKSTEP_BINARY, "run", path, "--log-dir", dir + "/logs"},
                                      {{"LOCKSTEP_WORKER_BINARY", fake_worker}}, 60000);
    EXPECT_EQ(result.exit_code, 2) << result.out << result.err;
    EXPECT_FALSE(result.err.empty());
    EXPECT_FALSE(FileExists(marker));
    EXPECT_FALSE(FileExists(dir + "/logs"));
  }
  ProcessResult missing = RunProcess({LOCKSTEP_BINARY, "run", manifest}, {}, 60000);
  EXPECT_NE(missing.err.find("/nonexistent/train.csv"), std::string::npos) << missing.err;
}

TEST(RunCommandTest, MoreRanksThanOneMachineRunsExit2BeforeStartingAnyWorker) {
  // Valid for a cluster (replicas is within spec's bound), too many processes for one machine:
  // before the bound the launcher tried to start them all.
  const std::string dir = MakeTempDir("lockstep-run-ranks");
  const std::string manifest = ShortManifest(dir + "/many.yaml", "{name: many}", 40000);
  const StartMarkingWorker worker_stand_in(dir);
  ProcessResult result =
      RunProcess({LOCKSTEP_BINARY, "run", manifest, "--log-dir", dir + "/logs"},
                 {{"LOCKSTEP_WORKER_BINARY", worker_stand_in.binary}}, 60000);
  EXPECT_EQ(result.exit_code, 2) << result.out << result.err;
  EXPECT_NE(result.err.find("spec.replicas: 40000 workers x ranksPerWorker 1 = 40000 processes, "
                            "more than lockstep run starts on one machine (1024)"),
            std::string::npos)
      << result.err;
  EXPECT_FALSE(FileExists(worker_stand_in.marker));
  EXPECT_FALSE(FileExists(dir + "/logs"));
}

// A stand-in worker (LOCKSTEP_WORKER_BINARY) that records its arguments and environment in
// `dir`, then runs `tail` (shell code).
std::string FakeWorker(const std::string& dir, const std::string& tail) {
  const std::string path = dir + "/fake-worker";
  WriteFile(path,
            "#!/bin/sh\n"
            "{ echo \"args=$*\"; env | grep -E '^(LOCKSTEP_|OPENBLAS_NUM_THREADS=)'; } > " +
                dir + "/env-$LOCKSTEP_POD\n" + tail + "\n");
  chmod(path.c_str(), 0755);
  return path;
}

std::string TinyManifest(const std::string& dir, int metrics_port) {
  return ShortManifest(dir + "/tiny.yaml", "{name: tiny, namespace: team}", 3,
                       "  metrics: {port: " + std::to_string(metrics_port) + "}\n");
}

TEST(RunCommandTest, WorkersGetTheDocumentedEnvironmentAndTheTokenStaysSecret) {
  const std::string dir = MakeTempDir("lockstep-run");
  const std::string fake = FakeWorker(dir, "exit 0");
  ProcessResult result = RunProcess({LOCKSTEP_BINARY, "run", TinyManifest(dir, 9400), "--log-dir",
                                     dir + "/logs", "--summary", dir + "/summary.json"},
                                    {{"LOCKSTEP_WORKER_BINARY", fake}}, 60000);
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  std::string token;
  for (int i = 0; i < 3; ++i) {
    const std::string env = ReadFile(dir + "/env-tiny-worker-" + std::to_string(i));
    SCOPED_TRACE(env);
    EXPECT_NE(env.find("args=train --manifest " + dir + "/logs/manifest.json"), std::string::npos);
    EXPECT_NE(env.find("LOCKSTEP_JOB=team/tiny\n"), std::string::npos);
    EXPECT_NE(env.find("LOCKSTEP_POD=tiny-worker-" + std::to_string(i) + "\n"), std::string::npos);
    EXPECT_NE(env.find("LOCKSTEP_HOST=127.0.0.1\n"), std::string::npos);
    EXPECT_NE(env.find("LOCKSTEP_RENDEZVOUS=127.0.0.1:"), std::string::npos);
    EXPECT_NE(env.find("LOCKSTEP_METRICS_PORT=" + std::to_string(9400 + i) + "\n"),
              std::string::npos);
    const size_t at = env.find("LOCKSTEP_JOB_TOKEN=");
    ASSERT_NE(at, std::string::npos);
    const std::string this_token = env.substr(at + 19, env.find('\n', at) - at - 19);
    EXPECT_EQ(this_token.size(), 64u);
    if (!token.empty()) {
      EXPECT_EQ(this_token, token) << "one token per job";
    }
    token = this_token;
  }
  ASSERT_FALSE(token.empty());
  for (const std::string& text : {result.out, result.err, ReadFile(dir + "/logs/manifest.json"),
                                  ReadFile(dir + "/summary.json")}) {
    EXPECT_EQ(text.find(token), std::string::npos) << "the job token leaked: " << text;
  }
}

TEST(RunCommandTest, MetricsPortZeroGivesEveryWorkerPortZero) {
  const std::string dir = MakeTempDir("lockstep-run");
  ProcessResult result =
      RunProcess({LOCKSTEP_BINARY, "run", TinyManifest(dir, 0), "--log-dir", dir + "/logs"},
                 {{"LOCKSTEP_WORKER_BINARY", FakeWorker(dir, "exit 0")}}, 60000);
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(
        ReadFile(dir + "/env-tiny-worker-" + std::to_string(i)).find("LOCKSTEP_METRICS_PORT=0\n"),
        std::string::npos);
  }
}

TEST(RunCommandTest, CudaWithoutAUsableGpuExits2NamingTheFieldAndTheReason) {
  // This test is about machines without a GPU (CI's); on a GPU machine trainer_device_test and
  // scripts/gpu-check.sh cover the other side.
  const std::string dir = MakeTempDir("lockstep-run-cuda");
  const std::string manifest =
      ShortManifest(dir + "/cuda.yaml", "{name: on-gpu}", 1, "    device: cuda\n");
  const StartMarkingWorker worker_stand_in(dir);
  const std::string& marker = worker_stand_in.marker;
  const std::string& fake_worker = worker_stand_in.binary;
  ProcessResult validated = RunProcess({LOCKSTEP_BINARY, "validate", manifest}, {}, 60000);
  EXPECT_EQ(validated.exit_code, 0) << validated.out << validated.err;
  EXPECT_NE(validated.out.find("valid"), std::string::npos) << validated.out;
  EXPECT_NE(validated.out.find("needs a GPU"), std::string::npos) << validated.out;
  ProcessResult result = RunProcess({LOCKSTEP_BINARY, "run", manifest, "--log-dir", dir + "/logs"},
                                    {{"LOCKSTEP_WORKER_BINARY", fake_worker}}, 60000);
  if (validated.out.find("(0 visible here)") == std::string::npos) {
    GTEST_SKIP() << "this machine has a GPU";
  }
  EXPECT_EQ(result.exit_code, 2) << result.out << result.err;
  EXPECT_NE(result.err.find("spec.trainer.device: cuda cannot be used on this machine: "),
            std::string::npos)
      << result.err;
  EXPECT_FALSE(FileExists(marker)) << "no worker may start";
  EXPECT_FALSE(FileExists(dir + "/logs"));
  // The worker refuses the same way where it is started directly (a pod without a GPU).
  ProcessResult worker = RunProcess(
      {LOCKSTEP_WORKER_BINARY, "train", "--manifest", manifest},
      {{"LOCKSTEP_RENDEZVOUS", "127.0.0.1:1"}, {"LOCKSTEP_JOB", "default/on-gpu"},
       {"LOCKSTEP_JOB_TOKEN", "t"}, {"LOCKSTEP_POD", "on-gpu-worker-0"}},
      60000);
  EXPECT_EQ(worker.exit_code, 2) << worker.out << worker.err;
  EXPECT_NE((worker.out + worker.err).find("spec.trainer.device: cuda cannot be used here"),
            std::string::npos)
      << worker.out << worker.err;
}

TEST(RunCommandTest, WorkerReportingBadInputMakesTheRunExit2WithItsError) {
  const std::string dir = MakeTempDir("lockstep-run");
  const std::string fake =
      FakeWorker(dir,
                 "if [ \"$LOCKSTEP_POD\" = tiny-worker-2 ]; then\n"
                 "  echo 'lockstep-worker: error: spec.trainer.data: unusable' >&2; exit 2\n"
                 "fi\nexec sleep 600");
  ProcessResult result = RunProcess(
      {LOCKSTEP_BINARY, "run", TinyManifest(dir, 0), "--log-dir", dir + "/logs"},
      {{"LOCKSTEP_WORKER_BINARY", fake}, {"LOCKSTEP_RUN_GRACE_PERIOD_MS", "1000"}}, 60000);
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 2) << result.out << result.err;
  EXPECT_NE(result.err.find("tiny-worker-2"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("exit code 2"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("lockstep-worker: error: spec.trainer.data: unusable"),
            std::string::npos)
      << result.err;
  EXPECT_LT(result.seconds, 30);
}

}  // namespace
}  // namespace lockstep::cli
