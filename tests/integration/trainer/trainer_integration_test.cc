// Real lockstep-worker processes against a RendezvousServer hosted in the test process.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/rendezvous/server.h"
#include "tests/integration/trainer/worker_process.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kFashionDir[] = "/usr/share/datasets/fashion-mnist";
constexpr char kDigitsCsv[] = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
constexpr char kToken[] = "integration-test-token";

fs::path MakeTempDir(const std::string& name) {
  std::string pattern = (fs::temp_directory_path() / ("lockstep-" + name + "-XXXXXX")).string();
  const char* made = mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr);
  return fs::path(pattern);
}

// A test's scratch directory (manifests, worker logs, dumps), removed at the end unless the test
// failed, so that the logs of a failure stay for reading.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name) : path_(MakeTempDir(name)) {}
  ~ScratchDir() {
    if (!::testing::Test::HasFailure()) {
      std::error_code ignored;
      fs::remove_all(path_, ignored);
    }
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  operator const fs::path&() const { return path_; }  // NOLINT: used where a path is

 private:
  fs::path path_;
};

struct RunResult {
  std::vector<int> exit_codes;
  std::string logs;
  rendezvous::JobSnapshot snapshot;
};

// One job on this machine: a rendezvous server hosted in the test process and `replicas`
// lockstep-worker processes on `manifest`.
class LocalJob {
 public:
  LocalJob(const fs::path& dir, const std::string& manifest, int replicas, const std::string& job,
           const std::map<std::string, std::string>& extra_env, int min_replicas = 0)
      : job_(job) {
    auto server = rendezvous::RendezvousServer::Start({"127.0.0.1:0", "", ""});
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return;
    server_ = std::move(server).value();
    rendezvous::JobConfig config;
    config.job = job;
    config.token = kToken;
    config.min_members = min_replicas > 0 ? min_replicas : replicas;
    config.max_members = replicas;
    EXPECT_TRUE(server_->AddJob(config).ok());

    const fs::path manifest_path = dir / (job.substr(job.find('/') + 1) + ".yaml");
    std::ofstream(manifest_path) << manifest;
    for (int i = 0; i < replicas; ++i) {
      std::map<std::string, std::string> env = extra_env;
      env["LOCKSTEP_RENDEZVOUS"] = "127.0.0.1:" + std::to_string(server_->port());
      env["LOCKSTEP_JOB"] = job;
      env["LOCKSTEP_JOB_TOKEN"] = kToken;
      env["LOCKSTEP_POD"] = "worker-" + std::to_string(i);
      env["LOCKSTEP_HOST"] = "127.0.0.1";
      env["LOCKSTEP_METRICS_PORT"] = "0";
      env["LOCKSTEP_JOIN_TIMEOUT_MS"] = "60000";
      workers_.push_back(std::make_unique<testing::WorkerProcess>(
          // With LOCKSTEP_SPEC in the environment the worker reads the manifest from there.
          extra_env.count("LOCKSTEP_SPEC") > 0
              ? std::vector<std::string>{LOCKSTEP_WORKER_BINARY, "train"}
              : std::vector<std::string>{LOCKSTEP_WORKER_BINARY, "train", "--manifest",
                                         manifest_path.string()},
          env,
          (dir / (job.substr(job.find('/') + 1) + "-worker-" + std::to_string(i) + ".log"))
              .string()));
      EXPECT_GT(workers_.back()->pid(), 0);
    }
  }

  ~LocalJob() {
    workers_.clear();  // kills what still runs
    if (server_) server_->Shutdown(5000);
  }

  testing::WorkerProcess& worker(int i) { return *workers_[static_cast<size_t>(i)]; }
  rendezvous::RendezvousServer& server() { return *server_; }

  // Waits until the job's reported progress reaches `step`, or the deadline.
  bool WaitForStep(int64_t step, Clock::time_point deadline) {
    while (Clock::now() < deadline) {
      auto snapshot = server_->Snapshot(job_);
      if (snapshot.ok() && snapshot->progress.step >= step) return true;
      // Bounded polling of the server's state; nothing here waits on a sleep for correctness.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  RunResult WaitAll(std::chrono::seconds timeout) {
    RunResult result;
    const auto deadline = Clock::now() + timeout;
    for (auto& worker : workers_) {
      result.exit_codes.push_back(worker->Wait(deadline));
      result.logs += worker->Log();
    }
    auto snapshot = server_->Snapshot(job_);
    if (snapshot.ok()) result.snapshot = *snapshot;
    return result;
  }

 private:
  std::string job_;
  std::unique_ptr<rendezvous::RendezvousServer> server_;
  std::vector<std::unique_ptr<testing::WorkerProcess>> workers_;
};

RunResult RunJob(const fs::path& dir, const std::string& manifest, int replicas,
                 const std::string& job, const std::map<std::string, std::string>& extra_env,
                 std::chrono::seconds timeout) {
  LocalJob local(dir, manifest, replicas, job, extra_env);
  return local.WaitAll(timeout);
}

std::vector<float> ReadFloats(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

std::string FashionManifest(const std::string& name, int replicas, int batch_size) {
  std::ostringstream m;
  m << "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: " << name
    << "}\nspec:\n  replicas: " << replicas << "\n  trainer:\n"
    << "    model: {type: mlp, hidden: [64, 32], activation: relu}\n"
    << "    data:\n      format: idx\n"
    << "      train: [" << kFashionDir << "/train-images-idx3-ubyte.gz, " << kFashionDir
    << "/train-labels-idx1-ubyte.gz]\n"
    << "    batchSize: " << batch_size << "\n    steps: 20\n"
    << "    optimizer: {type: sgd, learningRate: 0.05, momentum: 0.9}\n"
    << "    seed: 3\n"
    // 0.005 MiB: the three layers (330, 2080 and 50240 floats) make three buckets, the
    // largest over the cap, so the engine overlaps two all-reduces with backward.
    << "    allreduce: {bucketMiB: 0.005, compression: none, timeoutSeconds: 60}\n"
    << "    logIntervalSteps: 5\n"
    << "  metrics: {port: 0}\n";
  return m.str();
}

// Data-parallel equivalence: N workers with per-worker batch B train the same parameters as one
// worker with batch N x B, since the global batch, its order and the gradient's scaling are the
// same and only the summation order of the floats differs.
class DataParallelEquivalenceTest : public ::testing::TestWithParam<int> {
 protected:
  static constexpr int kGlobalBatch = 32;

  static void SetUpTestSuite() {
    if (!fs::exists(fs::path(kFashionDir) / "train-images-idx3-ubyte.gz")) return;
    dir_ = MakeTempDir("equivalence");
    reference_ = Train(1);
    if (!reference_.has_value()) any_failed_ = true;
  }

  static void TearDownTestSuite() {
    if (!dir_.empty() && !any_failed_) {
      std::error_code ignored;
      fs::remove_all(dir_, ignored);
    }
  }

  void TearDown() override {
    if (HasFailure()) any_failed_ = true;
  }

  static std::optional<std::vector<float>> Train(int replicas) {
    const fs::path dump = dir_ / ("params-" + std::to_string(replicas) + ".bin");
    const std::string name = "equiv-" + std::to_string(replicas);
    RunResult run = RunJob(dir_, FashionManifest(name, replicas, kGlobalBatch / replicas), replicas,
                           "default/" + name, {{"LOCKSTEP_DUMP_PARAMS", dump.string()}},
                           std::chrono::seconds(60));
    for (int code : run.exit_codes) {
      EXPECT_EQ(code, 0) << run.logs;
      if (code != 0) return std::nullopt;
    }
    return ReadFloats(dump);
  }

  static inline fs::path dir_;
  static inline bool any_failed_ = false;
  static inline std::optional<std::vector<float>> reference_;
};

TEST_P(DataParallelEquivalenceTest, WorkersEndWithTheParametersOfOneWorkerWithTheGlobalBatch) {
  if (dir_.empty()) GTEST_SKIP() << "Fashion-MNIST is not installed at " << kFashionDir;
  ASSERT_TRUE(reference_.has_value()) << "the 1-worker reference run failed";
  const int replicas = GetParam();
  std::optional<std::vector<float>> params = replicas == 1 ? reference_ : Train(replicas);
  ASSERT_TRUE(params.has_value());
  ASSERT_EQ(params->size(), reference_->size());
  ASSERT_EQ(params->size(), 784u * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10);
  double max_difference = 0, max_magnitude = 0;
  for (size_t i = 0; i < params->size(); ++i) {
    max_difference =
        std::max(max_difference, std::fabs(double((*params)[i]) - double((*reference_)[i])));
    max_magnitude = std::max(max_magnitude, std::fabs(double((*reference_)[i])));
  }
  std::printf("%d workers: max |difference| %.3g, max |parameter| %.3g\n", replicas, max_difference,
              max_magnitude);
  // Relative to the largest parameter: per element, values near zero have no meaningful
  // relative error.
  EXPECT_LE(max_difference / max_magnitude, 1e-5)
      << "max |difference| " << max_difference << ", max |parameter| " << max_magnitude;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DataParallelEquivalenceTest, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "Workers"; });

// Splits sklearn's digits (1797 rows) into a train file and a held-out test file (every
// `test_every`-th row; the rows are grouped by writer, so a contiguous tail would test on unseen
// writers only), so the accuracy measures generalisation.
bool WriteDigitsSplit(const fs::path& train, const fs::path& test, int test_every) {
  gzFile in = gzopen(kDigitsCsv, "rb");
  if (in == nullptr) return false;
  std::ofstream train_out(train), test_out(test);
  char line[4096];
  int row = 0;
  while (gzgets(in, line, sizeof(line)) != nullptr) {
    (++row % test_every == 0 ? test_out : train_out) << line;
  }
  gzclose(in);
  return row > test_every;
}

std::string DigitsManifest(const std::string& name, int epochs, const std::string& compression) {
  return "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: " + name +
         "}\nspec:\n  replicas: 2\n  trainer:\n"
         "    model: {type: mlp, hidden: [128], activation: relu}\n"
         "    data: {format: csv, train: [train.csv], test: [test.csv]}\n"
         "    batchSize: 32\n    epochs: " +
         std::to_string(epochs) +
         "\n"
         "    optimizer: {type: sgd, learningRate: 0.05, momentum: 0.9}\n"
         "    allreduce: {compression: " +
         compression +
         "}\n"
         "    seed: 1\n    logIntervalSteps: 20\n"
         "  metrics: {port: 0}\n";
}

TEST(DigitsTrainingTest, TwoWorkersReachNinetyFivePercentHeldOutAccuracy) {
  if (!fs::exists(kDigitsCsv)) GTEST_SKIP() << "sklearn's digits are not installed";
  const ScratchDir dir("digits");
  ASSERT_TRUE(WriteDigitsSplit(dir / "train.csv", dir / "test.csv", 6));  // 1498 + 299
  const std::string manifest = DigitsManifest("digits", 30, "none");
  RunResult run = RunJob(dir, manifest, 2, "default/digits", {}, std::chrono::seconds(60));
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << run.logs;
  EXPECT_EQ(run.snapshot.completed_members, 2);
  std::printf("digits: held-out accuracy %.4f after %lld steps\n",
              run.snapshot.final_progress.eval_accuracy,
              static_cast<long long>(run.snapshot.final_progress.step));
  EXPECT_GE(run.snapshot.final_progress.eval_accuracy, 0.95) << run.logs;
  // 30 epochs of 1498 samples at a global batch of 64: 24 steps per epoch (the last partial).
  EXPECT_EQ(run.snapshot.final_progress.step, 30 * 24);
}

// fp16 compression packs every bucket to half precision with a dynamic loss scale; the job must
// still learn (the scale keeps small gradients from flushing to zero).
TEST(DigitsTrainingTest, Fp16CompressedGradientsStillReachNinetyFivePercent) {
  if (!fs::exists(kDigitsCsv)) GTEST_SKIP() << "sklearn's digits are not installed";
  const ScratchDir dir("digits-fp16");
  ASSERT_TRUE(WriteDigitsSplit(dir / "train.csv", dir / "test.csv", 6));
  RunResult run = RunJob(dir, DigitsManifest("digits-fp16", 30, "fp16"), 2, "default/digits-fp16",
                         {}, std::chrono::seconds(60));
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << run.logs;
  std::printf("digits fp16: held-out accuracy %.4f\n", run.snapshot.final_progress.eval_accuracy);
  EXPECT_GE(run.snapshot.final_progress.eval_accuracy, 0.95) << run.logs;
}

TEST(WorkerSignalTest, SigtermStopsPromptlyWithExitCode143WithoutCompleting) {
  if (!fs::exists(kDigitsCsv)) GTEST_SKIP() << "sklearn's digits are not installed";
  const ScratchDir dir("sigterm");
  ASSERT_TRUE(WriteDigitsSplit(dir / "train.csv", dir / "test.csv", 6));
  LocalJob job(dir, DigitsManifest("sigterm", 100000, "none"), 2, "default/sigterm", {});
  ASSERT_TRUE(job.WaitForStep(20, Clock::now() + std::chrono::seconds(30))) << job.worker(0).Log();
  ASSERT_EQ(kill(job.worker(0).pid(), SIGTERM), 0);
  const auto stopped_by = Clock::now() + std::chrono::seconds(10);
  EXPECT_EQ(job.worker(0).Wait(stopped_by), 143) << job.worker(0).Log();
  // The survivor sees its generation end and tries to join the next one; SIGTERM stops it too,
  // within the grace period even though its Join cannot be interrupted.
  ASSERT_EQ(kill(job.worker(1).pid(), SIGTERM), 0);
  EXPECT_EQ(job.worker(1).Wait(Clock::now() + std::chrono::seconds(10)), 143)
      << job.worker(1).Log();
  auto snapshot = job.server().Snapshot("default/sigterm");
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->completed_members, 0);
}

// A member that dies ends the generation; the survivor keeps its state in memory, joins the
// next generation alone and finishes the job.
TEST(WorkerGenerationTest, SurvivorRejoinsAfterAPeerDiesAndFinishesTheJob) {
  if (!fs::exists(kDigitsCsv)) GTEST_SKIP() << "sklearn's digits are not installed";
  const ScratchDir dir("survivor");
  ASSERT_TRUE(WriteDigitsSplit(dir / "train.csv", dir / "test.csv", 6));
  std::string manifest = DigitsManifest("survivor", 1, "none");
  // Long enough that the kill lands mid-run even on the shared-memory backend (~5k steps/s).
  manifest.replace(manifest.find("epochs: 1"), 9, "steps: 20000");
  LocalJob job(dir, manifest, 2, "default/survivor", {}, /*min_replicas=*/1);
  ASSERT_TRUE(job.WaitForStep(100, Clock::now() + std::chrono::seconds(30))) << job.worker(0).Log();
  ASSERT_EQ(kill(job.worker(1).pid(), SIGKILL), 0);
  EXPECT_EQ(job.worker(1).Wait(Clock::now() + std::chrono::seconds(10)), 256 + SIGKILL);
  // What `lockstep run` does when it sees a worker exit.
  job.server().RemoveMember("default/survivor", "worker-1", "exited (killed by the test)");
  EXPECT_EQ(job.worker(0).Wait(Clock::now() + std::chrono::seconds(60)), 0) << job.worker(0).Log();
  auto snapshot = job.server().Snapshot("default/survivor");
  ASSERT_TRUE(snapshot.ok());
  EXPECT_GE(snapshot->history.size(), 2u);
  EXPECT_EQ(snapshot->final_progress.step, 20000);
  EXPECT_GE(snapshot->final_progress.eval_accuracy, 0.9);
}

TEST(WorkerInputTest, ManifestComesFromLockstepSpecWithoutManifestFlag) {
  if (!fs::exists(kDigitsCsv)) GTEST_SKIP() << "sklearn's digits are not installed";
  const ScratchDir dir("specenv");
  ASSERT_TRUE(WriteDigitsSplit(dir / "train.csv", dir / "test.csv", 6));
  // The JSON form of spec::ToJson; data paths absolute, as there is no manifest directory.
  const std::string spec_json =
      R"({"apiVersion": "lockstep.io/v1alpha1", "kind": "TrainingJob",
          "metadata": {"name": "specenv"},
          "spec": {"replicas": 1, "metrics": {"port": 0},
                   "trainer": {"model": {"hidden": [32]}, "batchSize": 32, "steps": 30,
                               "data": {"format": "csv", "train": [")" +
      (dir.path() / "train.csv").string() + R"("], "test": [")" +
      (dir.path() / "test.csv").string() + R"("]}}}})";
  RunResult run = RunJob(dir, "unused", 1, "default/specenv", {{"LOCKSTEP_SPEC", spec_json}},
                         std::chrono::seconds(30));
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0})) << run.logs;
  EXPECT_EQ(run.snapshot.final_progress.step, 30);
  EXPECT_GT(run.snapshot.final_progress.eval_accuracy, 0.5);
}

TEST(WorkerInputTest, MissingDataFileExitsWithCodeTwoAndOneLineMessage) {
  const ScratchDir dir("baddata");
  const std::string manifest =
      "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: bad}\n"
      "spec:\n  replicas: 1\n  trainer:\n"
      "    data: {format: csv, train: [missing.csv]}\n    steps: 5\n  metrics: {port: 0}\n";
  RunResult run = RunJob(dir, manifest, 1, "default/bad", {}, std::chrono::seconds(30));
  ASSERT_EQ(run.exit_codes, (std::vector<int>{2})) << run.logs;
  EXPECT_NE(run.logs.find("lockstep-worker: error: "), std::string::npos) << run.logs;
  EXPECT_NE(run.logs.find("missing.csv"), std::string::npos) << run.logs;
}

// The CUDA kernels are not yet driven by the trainer: a cuda manifest is refused, naming the
// field, rather than quietly trained on the CPU.
TEST(WorkerInputTest, CudaDeviceIsRefusedNamingTheFieldRatherThanTrainedOnTheCpu) {
  const ScratchDir dir("cudadevice");
  const std::string manifest =
      "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: gpu}\n"
      "spec:\n  replicas: 1\n  trainer:\n"
      "    data: {format: csv, train: "
      "[/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz]}\n"
      "    steps: 5\n    device: cuda\n  metrics: {port: 0}\n";
  RunResult run = RunJob(dir, manifest, 1, "default/gpu", {}, std::chrono::seconds(30));
  ASSERT_EQ(run.exit_codes, (std::vector<int>{2})) << run.logs;
  EXPECT_NE(run.logs.find("lockstep-worker: error: spec.trainer.device: cuda"), std::string::npos)
      << run.logs;
}

}  // namespace
}  // namespace lockstep
