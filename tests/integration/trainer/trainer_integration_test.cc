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
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/rendezvous/server.h"
#include "tests/support/job/job.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kFashionDir[] = "/usr/share/datasets/fashion-mnist";
constexpr char kDigitsCsv[] = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

using testing::JobRun;
using testing::LocalJob;
using testing::RunLocalJob;
using testing::ScratchDir;
using testing::ReadFloats;

std::string FashionManifest(const std::string& name, int replicas, int batch_size,
                            const std::string& precision = "fp32") {
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
    << "    precision: " << precision << "\n"
    // 0.005 MiB: the three layers (330, 2080 and 50240 floats) make three buckets, the
    // largest over the cap, so the engine overlaps two all-reduces with backward.
    << "    allreduce: {bucketMiB: 0.005, compression: none, timeoutSeconds: 60}\n"
    << "    logIntervalSteps: 5\n"
    << "  metrics: {port: 0}\n";
  return m.str();
}

// Data-parallel equivalence: N workers with per-worker batch B train the same parameters as one
// worker with batch N x B, since the global batch, its order and the gradient's scaling are the
// same and only the summation order of the floats differs. In fp32 and in bf16 mixed precision,
// whose rounding of activations is per sample and whose gradients are summed in fp32.
struct EquivalenceCase {
  int replicas;
  const char* precision;
};

class DataParallelEquivalenceTest : public ::testing::TestWithParam<EquivalenceCase> {
 protected:
  static constexpr int kGlobalBatch = 32;

  static void SetUpTestSuite() {
    if (!fs::exists(fs::path(kFashionDir) / "train-images-idx3-ubyte.gz")) return;
    dir_ = testing::MakeTempDir("lockstep-equivalence");
  }

  // The one-worker run of `precision`, trained once.
  static const std::optional<std::vector<float>>& Reference(const std::string& precision) {
    auto [it, inserted] = references_.try_emplace(precision);
    if (inserted) {
      it->second = Train(1, precision);
      if (!it->second.has_value()) any_failed_ = true;
    }
    return it->second;
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

  static std::optional<std::vector<float>> Train(int replicas, const std::string& precision) {
    const std::string name = "equiv-" + std::to_string(replicas) + "-" + precision;
    const fs::path dump = dir_ / ("params-" + name + ".bin");
    JobRun run = RunLocalJob(dir_,
                             {.job = "default/" + name,
                              .manifest = FashionManifest(name, replicas, kGlobalBatch / replicas,
                                                          precision),
                              .replicas = replicas,
                              .env = {{"LOCKSTEP_DUMP_PARAMS", dump.string()}}},
                             std::chrono::seconds(60));
    for (int code : run.exit_codes) {
      EXPECT_EQ(code, 0) << run.logs;
      if (code != 0) return std::nullopt;
    }
    return ReadFloats(dump);
  }

  static inline fs::path dir_;
  static inline bool any_failed_ = false;
  static inline std::map<std::string, std::optional<std::vector<float>>> references_;
};

TEST_P(DataParallelEquivalenceTest, WorkersEndWithTheParametersOfOneWorkerWithTheGlobalBatch) {
  if (dir_.empty()) GTEST_SKIP() << "Fashion-MNIST is not installed at " << kFashionDir;
  const auto [replicas, precision] = GetParam();
  const std::optional<std::vector<float>>& reference = Reference(precision);
  ASSERT_TRUE(reference.has_value()) << "the 1-worker reference run failed";
  std::optional<std::vector<float>> params =
      replicas == 1 ? reference : Train(replicas, precision);
  ASSERT_TRUE(params.has_value());
  ASSERT_EQ(params->size(), reference->size());
  ASSERT_EQ(params->size(), 784u * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10);
  double max_difference = 0, max_magnitude = 0;
  for (size_t i = 0; i < params->size(); ++i) {
    max_difference =
        std::max(max_difference, std::fabs(double((*params)[i]) - double((*reference)[i])));
    max_magnitude = std::max(max_magnitude, std::fabs(double((*reference)[i])));
  }
  std::printf("%d workers, %s: max |difference| %.3g, max |parameter| %.3g\n", replicas, precision,
              max_difference, max_magnitude);
  // Relative to the largest parameter: per element, values near zero have no meaningful
  // relative error.
  EXPECT_LE(max_difference / max_magnitude, 1e-5)
      << "max |difference| " << max_difference << ", max |parameter| " << max_magnitude;
  if (std::string(precision) == "bf16") {
    // The field reached the trainer: bf16 training is not the fp32 one.
    const std::optional<std::vector<float>>& fp32 = Reference("fp32");
    ASSERT_TRUE(fp32.has_value());
    double from_fp32 = 0;
    for (size_t i = 0; i < params->size(); ++i) {
      from_fp32 = std::max(from_fp32, std::fabs(double((*params)[i]) - double((*fp32)[i])));
    }
    EXPECT_GT(from_fp32 / max_magnitude, 1e-4) << "bf16 trained exactly what fp32 trained";
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DataParallelEquivalenceTest,
                         ::testing::Values(EquivalenceCase{1, "fp32"}, EquivalenceCase{2, "fp32"},
                                           EquivalenceCase{4, "fp32"}, EquivalenceCase{2, "bf16"},
                                           EquivalenceCase{4, "bf16"}),
                         [](const auto& info) {
                           return std::to_string(info.param.replicas) + "Workers" +
                                  (std::string(info.param.precision) == "bf16" ? "Bf16" : "");
                         });

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
  JobRun run = RunLocalJob(dir, {.job = "default/digits", .manifest = manifest, .replicas = 2},
                           std::chrono::seconds(60));
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
  JobRun run = RunLocalJob(dir,
                           {.job = "default/digits-fp16",
                            .manifest = DigitsManifest("digits-fp16", 30, "fp16"),
                            .replicas = 2},
                           std::chrono::seconds(60));
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << run.logs;
  std::printf("digits fp16: held-out accuracy %.4f\n", run.snapshot.final_progress.eval_accuracy);
  EXPECT_GE(run.snapshot.final_progress.eval_accuracy, 0.95) << run.logs;
}

// bf16 mixed precision learns what fp32 learns: two workers, two epochs of Fashion-MNIST, held-out
// accuracy on its 10,000 test images within half a point of the same job in fp32.
TEST(FashionAccuracyTest, Bf16MixedPrecisionIsWithinHalfAPointOfFp32) {
  if (!fs::exists(fs::path(kFashionDir) / "t10k-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << kFashionDir;
  }
  const ScratchDir dir("fashion-precision");
  double accuracy[2] = {0, 0};
  const char* precisions[2] = {"fp32", "bf16"};
  for (int i = 0; i < 2; ++i) {
    const std::string name = std::string("fashion-") + precisions[i];
    const std::string manifest =
        "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: " + name +
        "}\nspec:\n  replicas: 2\n  trainer:\n"
        "    model: {type: mlp, hidden: [128], activation: gelu}\n"
        "    data:\n      format: idx\n"
        "      train: [" + std::string(kFashionDir) + "/train-images-idx3-ubyte.gz, " + kFashionDir +
        "/train-labels-idx1-ubyte.gz]\n"
        "      test: [" + std::string(kFashionDir) + "/t10k-images-idx3-ubyte.gz, " + kFashionDir +
        "/t10k-labels-idx1-ubyte.gz]\n"
        "    batchSize: 64\n    epochs: 2\n"
        "    optimizer: {type: sgd, learningRate: 0.05, momentum: 0.9}\n"
        "    precision: " + precisions[i] + "\n    seed: 2\n    logIntervalSteps: 200\n"
        "  metrics: {port: 0}\n";
    JobRun run = RunLocalJob(dir, {.job = "default/" + name, .manifest = manifest, .replicas = 2},
                             std::chrono::seconds(50));
    ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << run.logs;
    accuracy[i] = run.snapshot.final_progress.eval_accuracy;
  }
  std::printf("fashion-mnist held-out accuracy: fp32 %.4f, bf16 %.4f\n", accuracy[0], accuracy[1]);
  EXPECT_GE(accuracy[0], 0.80);
  EXPECT_NEAR(accuracy[1], accuracy[0], 0.005);
}

TEST(WorkerSignalTest, SigtermStopsPromptlyWithExitCode143WithoutCompleting) {
  if (!fs::exists(kDigitsCsv)) GTEST_SKIP() << "sklearn's digits are not installed";
  const ScratchDir dir("sigterm");
  ASSERT_TRUE(WriteDigitsSplit(dir / "train.csv", dir / "test.csv", 6));
  LocalJob job(dir, {.job = "default/sigterm",
                     .manifest = DigitsManifest("sigterm", 100000, "none"),
                     .replicas = 2});
  ASSERT_TRUE(job.WaitForStep(20, 30000)) << job.worker(0).StdoutSoFar();
  ASSERT_EQ(kill(job.worker(0).pid(), SIGTERM), 0);
  const auto stopped_by = Clock::now() + std::chrono::seconds(10);
  EXPECT_EQ(job.worker(0).WaitUntil(stopped_by).code(), 143) << job.worker(0).StdoutSoFar();
  // The survivor sees its generation end and tries to join the next one; SIGTERM stops it too,
  // within the grace period even though its Join cannot be interrupted.
  ASSERT_EQ(kill(job.worker(1).pid(), SIGTERM), 0);
  EXPECT_EQ(job.worker(1).WaitUntil(Clock::now() + std::chrono::seconds(10)).code(), 143)
      << job.worker(1).StdoutSoFar();
  auto snapshot = job.rendezvous().server().Snapshot("default/sigterm");
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
  LocalJob job(dir,
               {.job = "default/survivor", .manifest = manifest, .replicas = 2, .min_replicas = 1});
  ASSERT_TRUE(job.WaitForStep(100, 30000)) << job.worker(0).StdoutSoFar();
  ASSERT_EQ(kill(job.worker(1).pid(), SIGKILL), 0);
  EXPECT_EQ(job.worker(1).WaitUntil(Clock::now() + std::chrono::seconds(10)).code(), 256 + SIGKILL);
  // What `lockstep run` does when it sees a worker exit.
  job.rendezvous().RemoveMember("worker-1", "exited (killed by the test)");
  EXPECT_EQ(job.worker(0).WaitUntil(Clock::now() + std::chrono::seconds(60)).code(), 0)
      << job.worker(0).StdoutSoFar();
  auto snapshot = job.rendezvous().server().Snapshot("default/survivor");
  ASSERT_TRUE(snapshot.ok());
  EXPECT_GE(snapshot->generations_formed, 2);
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
  JobRun run = RunLocalJob(
      dir, {.job = "default/specenv", .manifest = "unused", .env = {{"LOCKSTEP_SPEC", spec_json}}},
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
  JobRun run =
      RunLocalJob(dir, {.job = "default/bad", .manifest = manifest}, std::chrono::seconds(30));
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
  JobRun run =
      RunLocalJob(dir, {.job = "default/gpu", .manifest = manifest}, std::chrono::seconds(30));
  ASSERT_EQ(run.exit_codes, (std::vector<int>{2})) << run.logs;
  EXPECT_NE(run.logs.find("lockstep-worker: error: spec.trainer.device: cuda"), std::string::npos)
      << run.logs;
}

}  // namespace
}  // namespace lockstep
