// Pipeline parallelism with real lockstep-worker processes against a RendezvousServer hosted in
// the test process: P stages x D replicas of a 4-hidden-layer MLP on Fashion-MNIST end with the
// parameters of one data-parallel worker training the same global batch.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/job/job.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

using testing::JobRun;
using testing::ReadFloats;
using testing::RunLocalJob;

constexpr char kFashionDir[] = "/usr/share/datasets/fashion-mnist";
constexpr int kGlobalBatch = 32;

struct PipelineCase {
  int stages;  // 1: the data-parallel reference
  int replicas;
  const char* schedule;
  bool recompute;
  const char* precision;
};

std::string Manifest(const std::string& name, const PipelineCase& c) {
  std::ostringstream m;
  m << "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: " << name
    << "}\nspec:\n  replicas: " << c.stages * c.replicas << "\n  trainer:\n"
    << "    model: {type: mlp, hidden: [64, 48, 32, 24], activation: gelu}\n"
    << "    data:\n      format: idx\n"
    << "      train: [" << kFashionDir << "/train-images-idx3-ubyte.gz, " << kFashionDir
    << "/train-labels-idx1-ubyte.gz]\n"
    << "    batchSize: " << kGlobalBatch / c.replicas << "\n    steps: 20\n"
    << "    optimizer: {type: sgd, learningRate: 0.05, momentum: 0.9}\n"
    << "    seed: 5\n"
    << "    precision: " << c.precision << "\n"
    << "    allreduce: {bucketMiB: 0.005, timeoutSeconds: 60}\n"
    << "    logIntervalSteps: 5\n";
  if (c.stages > 1) {
    m << "    pipeline: {stages: " << c.stages << ", microBatches: 4, schedule: " << c.schedule
      << ", recompute: " << (c.recompute ? "true" : "false") << "}\n";
  }
  m << "  metrics: {port: 0}\n";
  return m.str();
}

class PipelineEquivalenceTest : public ::testing::TestWithParam<PipelineCase> {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(fs::path(kFashionDir) / "train-images-idx3-ubyte.gz")) return;
    dir_ = testing::MakeTempDir("lockstep-pipeline");
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

  static std::optional<std::vector<float>> Train(const std::string& name, const PipelineCase& c) {
    const fs::path dump = dir_ / (name + ".params");
    JobRun run = RunLocalJob(dir_,
                             {.job = "default/" + name,
                              .manifest = Manifest(name, c),
                              .replicas = c.stages * c.replicas,
                              .env = {{"LOCKSTEP_DUMP_PARAMS", dump.string()}}},
                             std::chrono::seconds(90));
    for (int code : run.exit_codes) {
      EXPECT_EQ(code, 0) << run.logs;
      if (code != 0) return std::nullopt;
    }
    return ReadFloats(dump);
  }

  // One data-parallel worker with the whole global batch, per precision, trained once.
  static const std::optional<std::vector<float>>& Reference(const std::string& precision) {
    auto [it, inserted] = references_.try_emplace(precision);
    if (inserted) {
      it->second = Train("reference-" + precision, {1, 1, "", false, precision.c_str()});
      if (!it->second.has_value()) any_failed_ = true;
    }
    return it->second;
  }

  static inline fs::path dir_;
  static inline bool any_failed_ = false;
  static inline std::map<std::string, std::optional<std::vector<float>>> references_;
};

TEST_P(PipelineEquivalenceTest, StagesAndReplicasEndWithTheParametersOfOneWorker) {
  if (dir_.empty()) GTEST_SKIP() << "Fashion-MNIST is not installed at " << kFashionDir;
  const PipelineCase c = GetParam();
  const std::optional<std::vector<float>>& reference = Reference(c.precision);
  ASSERT_TRUE(reference.has_value()) << "the one-worker reference run failed";
  const std::string name = "pipe-" + std::to_string(c.stages) + "x" + std::to_string(c.replicas) +
                           "-" + c.schedule + (c.recompute ? "-recompute-" : "-") + c.precision;
  const std::optional<std::vector<float>> params = Train(name, c);
  ASSERT_TRUE(params.has_value());
  ASSERT_EQ(params->size(), reference->size());
  double max_difference = 0, max_magnitude = 0;
  for (size_t i = 0; i < params->size(); ++i) {
    max_difference =
        std::max(max_difference, std::fabs(double((*params)[i]) - double((*reference)[i])));
    max_magnitude = std::max(max_magnitude, std::fabs(double((*reference)[i])));
  }
  std::printf("%s: max |difference| %.3g, max |parameter| %.3g\n", name.c_str(), max_difference,
              max_magnitude);
  // Only the order of the sums over micro-batches and replicas differs.
  EXPECT_LE(max_difference / max_magnitude, 1e-5)
      << "max |difference| " << max_difference << ", max |parameter| " << max_magnitude;
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineEquivalenceTest,
                         ::testing::Values(PipelineCase{2, 2, "1f1b", false, "fp32"},
                                           PipelineCase{2, 2, "gpipe", true, "fp32"},
                                           PipelineCase{4, 1, "1f1b", true, "fp32"},
                                           PipelineCase{4, 1, "gpipe", false, "fp32"},
                                           PipelineCase{2, 2, "1f1b", false, "bf16"}),
                         [](const auto& info) {
                           const PipelineCase& c = info.param;
                           return std::to_string(c.stages) + "Stages" + std::to_string(c.replicas) +
                                  "Replicas" +
                                  (std::string(c.schedule) == "gpipe" ? "GPipe" : "OneFOneB") +
                                  (c.recompute ? "Recompute" : "") +
                                  (std::string(c.precision) == "bf16" ? "Bf16" : "");
                         });

}  // namespace
}  // namespace lockstep
