// Pipeline parallelism with real lockstep-worker processes against a RendezvousServer hosted in
// the test process: P stages x D replicas of a 4-hidden-layer MLP on Fashion-MNIST end with the
// parameters of one data-parallel worker training the same global batch.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/job/job.h"
#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/checkpoint/storage/local/local_storage.h"

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

// `steps` steps; `more` is appended to the spec (a checkpoint section).
std::string Manifest(const std::string& name, const PipelineCase& c, int steps = 20,
                     const std::string& more = "") {
  std::ostringstream m;
  m << "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: " << name
    << "}\nspec:\n  replicas: " << c.stages * c.replicas << "\n  trainer:\n"
    << "    model: {type: mlp, hidden: [64, 48, 32, 24], activation: gelu}\n"
    << "    data:\n      format: idx\n"
    << "      train: [" << kFashionDir << "/train-images-idx3-ubyte.gz, " << kFashionDir
    << "/train-labels-idx1-ubyte.gz]\n"
    << "    batchSize: " << kGlobalBatch / c.replicas << "\n    steps: " << steps << "\n"
    << "    optimizer: {type: sgd, learningRate: 0.05, momentum: 0.9}\n"
    << "    seed: 5\n"
    << "    precision: " << c.precision << "\n"
    << "    allreduce: {bucketMiB: 0.005, timeoutSeconds: 60}\n"
    << "    logIntervalSteps: 5\n";
  if (c.stages > 1) {
    m << "    pipeline: {stages: " << c.stages << ", microBatches: 4, schedule: " << c.schedule
      << ", recompute: " << (c.recompute ? "true" : "false") << "}\n";
  }
  m << "  metrics: {port: 0}\n" << more;
  return m.str();
}

// Runs of the manifest above as real local jobs, in one directory per suite, and the one-worker
// reference they are compared with.
class PipelineRunsTest : public ::testing::Test {
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

  // The parameters it ended with; `logs`, when given, receives the workers' logs.
  static std::optional<std::vector<float>> Train(const std::string& name, const PipelineCase& c,
                                                 int steps = 20, const std::string& more = "",
                                                 std::string* logs = nullptr) {
    const fs::path dump = dir_ / (name + ".params");
    JobRun run = RunLocalJob(dir_,
                             {.job = "default/" + name,
                              .manifest = Manifest(name, c, steps, more),
                              .replicas = c.stages * c.replicas,
                              .env = {{"LOCKSTEP_DUMP_PARAMS", dump.string()}}},
                             std::chrono::seconds(90));
    if (logs != nullptr) *logs = run.logs;
    for (int code : run.exit_codes) {
      EXPECT_EQ(code, 0) << run.logs;
      if (code != 0) return std::nullopt;
    }
    return ReadFloats(dump);
  }

  // The largest difference between two parameter vectors relative to the largest parameter.
  static double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
    double max_difference = 0, max_magnitude = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_difference = std::max(max_difference, std::fabs(double(a[i]) - double(b[i])));
      max_magnitude = std::max(max_magnitude, std::fabs(double(b[i])));
    }
    return max_difference / max_magnitude;
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

class PipelineEquivalenceTest : public PipelineRunsTest,
                                public ::testing::WithParamInterface<PipelineCase> {};

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

// Checkpoints of a pipeline: each stage writes its layers, and any number of stages (one
// included) reads them back by name.
class PipelineCheckpointTest : public PipelineRunsTest {
 protected:
  // The spec section of a checkpoint under `root` every 10 steps.
  static std::string CheckpointAt(const fs::path& root) {
    return "  checkpoint: {uri: \"file://" + root.string() + "\", intervalSteps: 10, keep: 5}\n";
  }
  // A copy of `root` for a run that resumes from it (and writes more into it).
  static fs::path CopyOf(const fs::path& root, const std::string& name) {
    const fs::path copy = dir_ / name;
    fs::copy(root, copy, fs::copy_options::recursive);
    return copy;
  }
};

TEST_F(PipelineCheckpointTest,
       ACheckpointOfTwoStagesResumesAtFourStagesAndAtOneWithTheSameParameters) {
  if (dir_.empty()) GTEST_SKIP() << "Fashion-MNIST is not installed at " << kFashionDir;
  const fs::path root = dir_ / "two-stages-ckpt";
  const std::optional<std::vector<float>> written =
      Train("two-stages", {2, 1, "1f1b", false, "fp32"}, 10, CheckpointAt(root));
  ASSERT_TRUE(written.has_value());
  // Stage s of 2 wrote shard s.
  ASSERT_TRUE(fs::exists(root / "step-000000000010" / "shard-1-of-2.bin"));

  // Resumed at the step it was written at, a job trains nothing: what it holds is what it read.
  for (const PipelineCase& c :
       {PipelineCase{4, 1, "1f1b", false, "fp32"}, PipelineCase{1, 1, "", false, "fp32"}}) {
    const std::string name = "resumed-" + std::to_string(c.stages) + "-stages";
    std::string logs;
    const std::optional<std::vector<float>> resumed =
        Train(name, c, 10, CheckpointAt(CopyOf(root, name + "-ckpt")), &logs);
    ASSERT_TRUE(resumed.has_value());
    EXPECT_EQ(*resumed, *written) << name << " restored other parameters than were written";
    if (c.stages > 1) {
      EXPECT_THAT(logs,
                  ::testing::ContainsRegex("restored stage 3 \\(layers [0-9.]+\\) of step 10"))
          << logs;
    } else {
      EXPECT_THAT(logs, ::testing::HasSubstr("restored step 10 from")) << logs;
    }
  }
}

TEST_F(PipelineCheckpointTest, AStageThatFindsItsShardDamagedSendsEveryStageToTheOlderCheckpoint) {
  if (dir_.empty()) GTEST_SKIP() << "Fashion-MNIST is not installed at " << kFashionDir;
  const PipelineCase two_stages{2, 1, "1f1b", false, "fp32"};
  const fs::path root = dir_ / "damaged-ckpt";
  const std::optional<std::vector<float>> written =
      Train("undamaged", two_stages, 20, CheckpointAt(root));
  ASSERT_TRUE(written.has_value());
  // Stage 1's shard of step 20 loses a byte in the middle: only stage 1 reads it.
  const fs::path shard = root / "step-000000000020" / "shard-1-of-2.bin";
  ASSERT_TRUE(fs::exists(shard));
  {
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    char byte = 0;
    file.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    file.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    file.write(&byte, 1);
  }
  std::string logs;
  const std::optional<std::vector<float>> retrained =
      Train("after-damage", two_stages, 20, CheckpointAt(root), &logs);
  ASSERT_TRUE(retrained.has_value());
  EXPECT_THAT(logs, ::testing::HasSubstr("stage 1 cannot restore checkpoint step 20")) << logs;
  EXPECT_THAT(logs, ::testing::HasSubstr("from checkpoint step 10")) << logs;
  // Steps 11 to 20 again, as the same stages computed them the first time.
  EXPECT_EQ(*retrained, *written);
  // And step 20 was deleted, then written again rather than kept as committed: it checks out.
  checkpoint::LocalStorage storage;
  Status verified =
      checkpoint::VerifyCheckpoint(storage, root.string(), 20, Deadline::AfterMs(60000));
  EXPECT_TRUE(verified.ok()) << verified;
  EXPECT_THAT(logs, ::testing::HasSubstr("deleted the damaged checkpoint of step 20"));
}

TEST_F(PipelineCheckpointTest, DataParallelReplicasCheckpointTrainsOnAsStagesLikeOneWorker) {
  if (dir_.empty()) GTEST_SKIP() << "Fashion-MNIST is not installed at " << kFashionDir;
  const std::optional<std::vector<float>>& reference = Reference("fp32");
  ASSERT_TRUE(reference.has_value()) << "the one-worker reference run failed";
  // Two data-parallel ranks split the stream evenly: some layers' tensors straddle the shards.
  const fs::path root = dir_ / "replicas-ckpt";
  ASSERT_TRUE(Train("replicas", {1, 2, "", false, "fp32"}, 10, CheckpointAt(root)).has_value());
  // Four stages; and two stages of two replicas, whose second replica receives its stage from
  // the first.
  for (const PipelineCase& c :
       {PipelineCase{4, 1, "gpipe", false, "fp32"}, PipelineCase{2, 2, "1f1b", false, "fp32"}}) {
    const std::string name = "on-as-" + std::to_string(c.stages) + "x" + std::to_string(c.replicas);
    std::string logs;
    const std::optional<std::vector<float>> params =
        Train(name, c, 20, CheckpointAt(CopyOf(root, name + "-ckpt")), &logs);
    ASSERT_TRUE(params.has_value());
    EXPECT_THAT(logs, ::testing::HasSubstr("from checkpoint step 10")) << logs;
    ASSERT_EQ(params->size(), reference->size());
    // The data order, the optimizer's momentum and the counters went on from step 10.
    EXPECT_LE(RelativeDifference(*params, *reference), 1e-5) << name;
  }
}

}  // namespace
}  // namespace lockstep
