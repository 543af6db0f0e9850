// Pods of several ranks (spec.ranksPerWorker), as a user sees them:
//  - ranks in pods train the same parameters as the same number of single-rank pods, on one
//    host (shared memory) and with the pods on separate hosts (network namespaces: shared
//    memory inside a pod, Gloo between pods);
//  - one local rank killed takes its whole pod out: an elastic job's other pod trains on, a
//    fixed-size job's pod is restarted once, with the exact step count and sample accounting.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/job/job.h"
#include "tests/support/netns/netns_hosts.h"
#include "tests/support/process/process_table.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::ChildrenWithEnv;
using testing::ExpectExactSampleAccounting;
using testing::JobRun;
using testing::LatestStep;
using testing::MakeTempDir;
using testing::NetnsHosts;
using testing::PollUntil;
using testing::ProcessResult;
using testing::ReadFloats;
using testing::ReadRunSummary;
using testing::RunLocalJob;
using testing::WorkerOfLauncher;
using testing::WriteFile;

constexpr char kDigits[] = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
constexpr int64_t kRunTimeoutMs = 180000;

struct PodJob {
  std::string name;
  int pods = 2;
  int ranks_per_pod = 2;
  int batch_size = 16;  // per rank
  int64_t steps = 40;
  std::string elastic{};  // "" or "{minReplicas: .., maxReplicas: ..}"
  std::string run_policy = "{restartPolicy: Never}";
};

std::string Manifest(const PodJob& job) {
  std::ostringstream yaml;
  yaml << "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: " << job.name
       << "}\nspec:\n  replicas: " << job.pods << "\n  ranksPerWorker: " << job.ranks_per_pod
       << "\n";
  if (!job.elastic.empty()) yaml << "  elastic: " << job.elastic << "\n";
  yaml << "  trainer:\n"
       << "    model: {type: mlp, hidden: [256], activation: relu}\n"
       << "    data: {format: csv, train: [file://" << kDigits << "], test: [file://" << kDigits
       << "]}\n"
       << "    batchSize: " << job.batch_size << "\n    steps: " << job.steps << "\n"
       << "    optimizer: {type: sgd, learningRate: 0.05, momentum: 0.9}\n"
       << "    seed: 11\n"
       // Three buckets: the engine overlaps all-reduces with backward, across pods too.
       << "    allreduce: {bucketMiB: 0.05, compression: none, timeoutSeconds: 60}\n"
       << "    logIntervalSteps: 1\n"
       << "  runPolicy: " << job.run_policy << "\n"
       << "  metrics: {port: 0}\n";
  return yaml.str();
}

// ---------------------------------------------------------------------------------------------
// Data-parallel equivalence across pod shapes: 4 ranks with batch 16 each, as 4 pods of 1 (the
// reference), 1 pod of 4, and 2 pods of 2 on two hosts.

class PodEquivalenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kDigits)) return;
    dir_ = MakeTempDir("lockstep-pods");
    reference_ = Train(4, 1, nullptr, nullptr);
  }

  // Trains `pods` pods of `ranks` ranks (4 in all); the final parameters, and in `logs` the
  // workers' logs.
  static std::optional<std::vector<float>> Train(int pods, int ranks, const NetnsHosts* hosts,
                                                 std::string* logs) {
    const std::string name = "pods-" + std::to_string(pods) + "x" + std::to_string(ranks);
    const fs::path dump = dir_ / (name + ".bin");
    PodJob job{.name = name, .pods = pods, .ranks_per_pod = ranks};
    JobRun run = RunLocalJob(dir_,
                             {.job = "default/" + name,
                              .manifest = Manifest(job),
                              .replicas = pods,
                              .env = {{"LOCKSTEP_DUMP_PARAMS", dump.string()}},
                              .ranks_per_pod = ranks,
                              .hosts = hosts},
                             std::chrono::seconds(120));
    if (logs != nullptr) *logs = run.logs;
    for (int code : run.exit_codes) {
      EXPECT_EQ(code, 0) << run.logs;
      if (code != 0) return std::nullopt;
    }
    EXPECT_EQ(run.snapshot.world_size, 4);
    return ReadFloats(dump);
  }

  void ExpectSameParameters(const std::vector<float>& params) {
    ASSERT_TRUE(reference_.has_value()) << "the 4 x 1 reference run failed";
    ASSERT_EQ(params.size(), reference_->size());
    ASSERT_EQ(params.size(), 64u * 256 + 256 + 256 * 10 + 10);
    double max_difference = 0, max_magnitude = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      max_difference =
          std::max(max_difference, std::fabs(double(params[i]) - double((*reference_)[i])));
      max_magnitude = std::max(max_magnitude, std::fabs(double((*reference_)[i])));
    }
    // Only the summation order of the floats differs (relative to the largest parameter).
    EXPECT_LE(max_difference / max_magnitude, 1e-5)
        << "max |difference| " << max_difference << ", max |parameter| " << max_magnitude;
  }

  static inline fs::path dir_;
  static inline std::optional<std::vector<float>> reference_;
};

TEST_F(PodEquivalenceTest, OnePodOfFourRanksTrainsLikeFourPodsOfOneRank) {
  if (dir_.empty()) GTEST_SKIP() << "sklearn's digits are not installed";
  std::string logs;
  std::optional<std::vector<float>> params = Train(1, 4, nullptr, &logs);
  ASSERT_TRUE(params.has_value());
  ExpectSameParameters(*params);
  EXPECT_NE(logs.find("communicator backend shm for 4 member(s) on one host"), std::string::npos)
      << logs;
}

TEST_F(PodEquivalenceTest, TwoPodsOfTwoRanksOnTwoHostsUseShmInsideAndGlooBetween) {
  if (dir_.empty()) GTEST_SKIP() << "sklearn's digits are not installed";
  NetnsHosts hosts(2);
  if (!hosts.ok()) GTEST_SKIP() << "no test hosts: " << hosts.skip_reason();
  std::string logs;
  std::optional<std::vector<float>> params = Train(2, 2, &hosts, &logs);
  ASSERT_TRUE(params.has_value());
  ExpectSameParameters(*params);
  EXPECT_NE(logs.find("communicator backend shm+gloo for 4 member(s) on several hosts"),
            std::string::npos)
      << logs;
  // The pods really are apart: the Gloo pairs between them listen on the hosts' addresses.
  EXPECT_NE(logs.find("on " + hosts.address(0)), std::string::npos) << logs;
  EXPECT_NE(logs.find("on " + hosts.address(1)), std::string::npos) << logs;
}

// ---------------------------------------------------------------------------------------------
// A killed local rank, through `lockstep run`.

struct KillOutcome {
  ProcessResult result;
  nlohmann::json summary;
  std::string accounting;
};

// Runs `job` with `lockstep run` and SIGKILLs local rank `local_rank` of pod `pod` once the
// job passed a tenth of its steps: early, so that a replacement pod (two processes to start)
// rejoins while the other pod still trains, even on a fast machine.
KillOutcome RunAndKillOneRank(const std::string& dir, const PodJob& job, int pod, int local_rank) {
  KillOutcome outcome;
  const std::string manifest = dir + "/" + job.name + ".yaml";
  WriteFile(manifest, Manifest(job));
  outcome.accounting = dir + "/" + job.name + "-accounting.jsonl";
  ChildProcess run({LOCKSTEP_BINARY, "run", manifest, "--summary", dir + "/" + job.name + ".json",
                    "--log-dir", dir + "/logs-" + job.name},
                   {{"LOCKSTEP_RUN_PROGRESS_INTERVAL_MS", "50"},
                    {"LOCKSTEP_RUN_RESTART_BACKOFF_MS", "20"},
                    {"LOCKSTEP_SAMPLE_ACCOUNTING", outcome.accounting}});
  EXPECT_TRUE(PollUntil([&] { return LatestStep(run.StdoutSoFar()) >= job.steps / 10; }, 60000, 10))
      << run.StdoutSoFar();
  const std::string member = job.name + "-worker-" + std::to_string(pod);
  const pid_t supervisor = WorkerOfLauncher(run.pid(), job.name, member);
  EXPECT_NE(supervisor, 0) << member << " not found";
  const std::vector<pid_t> ranks =
      ChildrenWithEnv(supervisor, {{"LOCKSTEP_LOCAL_RANK", std::to_string(local_rank)}});
  EXPECT_EQ(ranks.size(), 1u) << "local rank " << local_rank << " of " << member;
  if (ranks.size() == 1) kill(ranks[0], SIGKILL);
  outcome.result = run.Wait(kRunTimeoutMs);
  outcome.summary = ReadRunSummary(dir + "/" + job.name + ".json");
  return outcome;
}

TEST(PodFailureTest, KilledRankTakesItsPodOutAndTheOtherPodTrainsOn) {
  if (!fs::exists(kDigits)) GTEST_SKIP() << "sklearn's digits are not installed";
  const std::string dir = MakeTempDir("lockstep-pods");
  PodJob job{.name = "pods-elastic-" + std::to_string(getpid()),
             .steps = 600,
             .elastic = "{minReplicas: 1, maxReplicas: 2}"};
  KillOutcome outcome = RunAndKillOneRank(dir, job, /*pod=*/1, /*local_rank=*/1);
  const std::string output = outcome.result.out + outcome.result.err;
  ASSERT_FALSE(outcome.result.timed_out) << output;
  ASSERT_EQ(outcome.result.exit_code, 0) << output;
  EXPECT_EQ(outcome.summary["steps"], job.steps) << outcome.summary.dump();
  // The pod left as one member (both its ranks), the other pod's two ranks finished.
  EXPECT_EQ(outcome.summary["world_size"], 2) << outcome.summary.dump();
  EXPECT_EQ(outcome.summary["restarts"], 0) << outcome.summary.dump();
  // The pod failed once, with the killed rank's status (128 + SIGKILL).
  EXPECT_NE(output.find("worker " + job.name + "-worker-1 failed (exit code 137)"),
            std::string::npos)
      << output;
  ExpectExactSampleAccounting(outcome.accounting, "elastic pods");
}

TEST(PodFailureTest, KilledRankRestartsItsPodOnceAndTheJobFinishesAtFullSize) {
  if (!fs::exists(kDigits)) GTEST_SKIP() << "sklearn's digits are not installed";
  const std::string dir = MakeTempDir("lockstep-pods");
  // Long enough that the survivors still train when the replacement pod (a pod's exit, a
  // restart, two processes' start-up: 1.6 s on the loaded 2-core VM) rejoins.
  PodJob job{.name = "pods-fixed-" + std::to_string(getpid()),
             .steps = 6000,
             .run_policy = "{restartPolicy: OnFailure, backoffLimit: 3}"};
  KillOutcome outcome = RunAndKillOneRank(dir, job, /*pod=*/0, /*local_rank=*/0);
  const std::string output = outcome.result.out + outcome.result.err;
  ASSERT_FALSE(outcome.result.timed_out) << output;
  ASSERT_EQ(outcome.result.exit_code, 0) << output;
  EXPECT_EQ(outcome.summary["steps"], job.steps) << outcome.summary.dump();
  // One failure of one pod, counted once, however many ranks it stopped.
  EXPECT_EQ(outcome.summary["restarts"], 1) << outcome.summary.dump();
  EXPECT_EQ(outcome.summary["world_size"], 4) << outcome.summary.dump();
  ExpectExactSampleAccounting(outcome.accounting, "fixed-size pods");
}

}  // namespace
}  // namespace lockstep
