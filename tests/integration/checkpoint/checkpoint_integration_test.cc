// How training uses checkpoints, with real lockstep-worker processes against a RendezvousServer
// hosted in the test process: every worker killed (also mid-checkpoint) and the job started
// again, a damaged newest checkpoint, storage that goes down, and sample accounting across a
// world-size change.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/rendezvous/server.h"
#include "tests/support/job/job.h"
#include "tests/support/webhdfs/webhdfs_test_server.h"
#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/checkpoint/storage/storage.h"

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

std::string ReadBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool WriteDigitsSplit(const fs::path& train, const fs::path& test) {
  gzFile in = gzopen(kDigitsCsv, "rb");
  if (in == nullptr) return false;
  std::ofstream train_out(train), test_out(test);
  char line[4096];
  int row = 0;
  while (gzgets(in, line, sizeof(line)) != nullptr) (++row % 6 == 0 ? test_out : train_out) << line;
  gzclose(in);
  return row > 6;
}

std::string DigitsManifest(const std::string& name, int replicas, int steps,
                           const std::string& checkpoint) {
  return "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: " + name +
         "}\nspec:\n  replicas: " + std::to_string(replicas) +
         "\n  trainer:\n"
         "    model: {type: mlp, hidden: [128], activation: relu}\n"
         "    data: {format: csv, train: [train.csv], test: [test.csv]}\n"
         "    batchSize: 16\n    steps: " +
         std::to_string(steps) +
         "\n    optimizer: {type: adamw, learningRate: 0.002}\n"
         "    seed: 5\n    logIntervalSteps: 5\n"
         "  checkpoint: " +
         checkpoint + "\n  metrics: {port: 0}\n";
}

// Every step-* directory under `root` (a local path), each verified with checksums.
std::vector<checkpoint::CheckpointInfo> ListVerified(const std::string& root) {
  auto storage = checkpoint::OpenStorage("file://" + root, {});
  EXPECT_TRUE(storage.ok());
  auto list = checkpoint::ListCheckpoints(**storage, root, checkpoint::VerifyLevel::kChecksums,
                                          Deadline::AfterMs(60000));
  EXPECT_TRUE(list.ok()) << list.status();
  return list.ok() ? *list : std::vector<checkpoint::CheckpointInfo>{};
}

// Waits (up to 60 s) until the job's rendezvous knows of a committed checkpoint of `step` or later.
bool WaitForCommittedCheckpoint(LocalJob& job, const std::string& key, int64_t step) {
  return testing::PollUntil(
      [&] {
        auto snapshot = job.rendezvous().server().Snapshot(key);
        return snapshot.ok() && snapshot->progress.last_checkpoint_step >= step;
      },
      60000, 5);
}

// One incarnation of `job` run to its end; `tag` names its manifest and logs apart from the
// other incarnations' in the same directory.
JobRun RunToEnd(const fs::path& dir, const std::string& manifest, int replicas,
                const std::string& job, const testing::Environment& env, const std::string& tag) {
  return RunLocalJob(
      dir, {.job = job, .manifest = manifest, .replicas = replicas, .env = env, .tag = tag},
      std::chrono::seconds(120));
}

class DigitsCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kDigitsCsv)) GTEST_SKIP() << "sklearn's digits are not installed";
    ASSERT_TRUE(WriteDigitsSplit(dir_ / "train.csv", dir_ / "test.csv"));
  }
  ScratchDir dir_{"ckpt-digits"};
};

// Every process of the job is SIGKILLed while checkpoints are being written (interval 1: a write
// is always in flight), then the job is started again: it resumes from the newest valid
// checkpoint, finishes at the exact step count, and ends with exactly the parameters of an
// uninterrupted run of the same world size. The first incarnation is asked for far more steps
// than it can train before the kill (a short job can finish between the poll that sees step 150
// and the kill); the resumed and the reference runs then stop at the same step past the resume
// point (the learning rate does not depend on the step count, so the trajectories are the same).
TEST_F(DigitsCheckpointTest,
       KillingEveryWorkerMidCheckpointResumesAndEndsBitwiseLikeAnUninterruptedRun) {
  constexpr int kNeverReached = 1000000;
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string checkpoint = "{uri: \"file://" + ckpt + "\", intervalSteps: 1, keep: 3}";
  {
    LocalJob first(dir_.path(),
                   {.job = "default/killall",
                    .manifest = DigitsManifest("killall", 2, kNeverReached, checkpoint),
                    .replicas = 2,
                    .tag = "-first"});
    ASSERT_TRUE(first.WaitForStep(150, 60000)) << first.worker(0).StdoutSoFar();
    // And a checkpoint past step 100 committed: with one always in flight, the writer drops the
    // steps it cannot keep up with, so on a loaded machine the newest can lag the training by
    // far more than the 50 steps above (80 at step 150 in one run on 2 busy cores).
    ASSERT_TRUE(WaitForCommittedCheckpoint(first, "default/killall", 100))
        << first.worker(0).StdoutSoFar();
    first.KillAll();
  }
  // Whatever the kill interrupted, no step-* directory that retention keeps is partial or
  // damaged: the newest `keep` (3) are valid. KNOWN ISSUE (worker/checkpoint, reported): the
  // writer's retention deletes an old step-* in place, so a kill in the middle of that delete
  // leaves a step-* older than the kept ones without its manifest; it is never chosen (older than
  // valid ones) and the next commit's retention removes it. Tolerated below, and printed.
  std::vector<checkpoint::CheckpointInfo> left = ListVerified(ckpt);
  ASSERT_FALSE(left.empty());
  std::vector<checkpoint::CheckpointInfo> valid;
  for (const auto& info : left) {
    if (info.valid) valid.push_back(info);
  }
  ASSERT_GE(valid.size(), 3u);
  const int64_t oldest_kept = valid[valid.size() - 3].step;
  for (const auto& info : left) {
    if (info.step >= oldest_kept) {
      EXPECT_TRUE(info.valid) << info.dir << ": " << info.problem;
    } else if (!info.valid) {
      std::printf("retention leftover older than the kept checkpoints: %s\n", info.problem.c_str());
    }
  }
  const int64_t newest = left.back().step;
  ASSERT_GE(newest, 100);
  std::printf("killed with %zu valid checkpoints left, the newest of step %lld\n", left.size(),
              static_cast<long long>(newest));

  const int steps = static_cast<int>(newest) + 100;
  const fs::path reference_dump = dir_ / "reference.bin";
  JobRun reference = RunToEnd(
      dir_.path(),
      DigitsManifest("killall", 2, steps,
                     "{uri: \"file://" + (dir_ / "ref-ckpt").string() + "\", intervalSteps: 1}"),
      2, "default/killall", {{"LOCKSTEP_DUMP_PARAMS", reference_dump.string()}}, "-ref");
  ASSERT_EQ(reference.exit_codes, (std::vector<int>{0, 0})) << reference.logs;
  EXPECT_EQ(reference.snapshot.final_progress.resumed_from_step, -1);

  const fs::path dump = dir_ / "resumed.bin";
  JobRun resumed =
      RunToEnd(dir_.path(), DigitsManifest("killall", 2, steps, checkpoint), 2, "default/killall",
               {{"LOCKSTEP_DUMP_PARAMS", dump.string()}}, "-second");
  ASSERT_EQ(resumed.exit_codes, (std::vector<int>{0, 0})) << resumed.logs;
  EXPECT_EQ(resumed.snapshot.final_progress.step, steps);
  EXPECT_EQ(resumed.snapshot.final_progress.resumed_from_step, newest) << resumed.logs;
  EXPECT_EQ(resumed.snapshot.final_progress.last_checkpoint_step, steps);
  const std::string expected = ReadBytes(reference_dump);
  ASSERT_FALSE(expected.empty());
  EXPECT_TRUE(ReadBytes(dump) == expected) << "resumed parameters differ from the reference run";
  // The resumed run's commits retained the newest three, all valid, and removed the rest.
  std::vector<checkpoint::CheckpointInfo> final_list = ListVerified(ckpt);
  ASSERT_EQ(final_list.size(), 3u);
  for (const auto& info : final_list) EXPECT_TRUE(info.valid) << info.problem;
  EXPECT_EQ(final_list.back().step, steps);
}

// Asynchronous checkpoints taken from the state's copy on its device (what a GPU does; forced here
// with LOCKSTEP_CHECKPOINT_DEVICE_COPY=1, the trainer then never waiting for a capture before its
// next update): a run that stops at step 200 and is resumed to 300 ends with exactly the
// parameters of a run of 300 steps.
TEST_F(DigitsCheckpointTest, CheckpointsFromTheDeviceCopyResumeBitwiseLikeAnUninterruptedRun) {
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string checkpoint = "{uri: \"file://" + ckpt + "\", intervalSteps: 10, keep: 2}";
  const testing::Environment copy = {{"LOCKSTEP_CHECKPOINT_DEVICE_COPY", "1"}};
  JobRun first = RunToEnd(dir_.path(), DigitsManifest("copy", 2, 200, checkpoint), 2,
                          "default/copy", copy, "-first");
  ASSERT_EQ(first.exit_codes, (std::vector<int>{0, 0})) << first.logs;
  EXPECT_EQ(first.snapshot.final_progress.last_checkpoint_step, 200);

  const fs::path reference_dump = dir_ / "reference.bin";
  JobRun reference = RunToEnd(
      dir_.path(),
      DigitsManifest("copy", 2, 300,
                     "{uri: \"file://" + (dir_ / "ref-ckpt").string() + "\", intervalSteps: 10}"),
      2, "default/copy", {{"LOCKSTEP_DUMP_PARAMS", reference_dump.string()}}, "-ref");
  ASSERT_EQ(reference.exit_codes, (std::vector<int>{0, 0})) << reference.logs;

  const fs::path dump = dir_ / "resumed.bin";
  testing::Environment resumed_env = copy;
  resumed_env.push_back({"LOCKSTEP_DUMP_PARAMS", dump.string()});
  JobRun resumed = RunToEnd(dir_.path(), DigitsManifest("copy", 2, 300, checkpoint), 2,
                            "default/copy", resumed_env, "-second");
  ASSERT_EQ(resumed.exit_codes, (std::vector<int>{0, 0})) << resumed.logs;
  EXPECT_EQ(resumed.snapshot.final_progress.resumed_from_step, 200) << resumed.logs;
  EXPECT_EQ(resumed.snapshot.final_progress.last_checkpoint_step, 300);
  const std::string expected = ReadBytes(reference_dump);
  ASSERT_FALSE(expected.empty());
  EXPECT_TRUE(ReadBytes(dump) == expected) << "resumed parameters differ from the reference run";
  for (const auto& info : ListVerified(ckpt)) EXPECT_TRUE(info.valid) << info.problem;
}

// The newest checkpoint is damaged before the restart: it is reported and skipped, and the job
// resumes from the previous one. Synchronous checkpoints, so that every interval is written: the
// asynchronous writer skips an interval while the previous write is still in flight, and 100
// digits steps take less time than a write.
TEST_F(DigitsCheckpointTest, DamagedNewestCheckpointIsSkippedForThePreviousOne) {
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string checkpoint =
      "{uri: \"file://" + ckpt + "\", intervalSteps: 20, keep: 3, async: false}";
  JobRun first = RunToEnd(dir_.path(), DigitsManifest("damaged", 2, 100, checkpoint), 2,
                          "default/damaged", {}, "-first");
  ASSERT_EQ(first.exit_codes, (std::vector<int>{0, 0})) << first.logs;
  std::vector<checkpoint::CheckpointInfo> checkpoints = ListVerified(ckpt);
  ASSERT_EQ(checkpoints.size(), 3u);
  ASSERT_EQ(checkpoints.back().step, 100);
  // Flip one byte in the middle of a shard of the newest checkpoint.
  const fs::path shard = fs::path(checkpoints.back().dir) / "shard-1-of-2.bin";
  std::string bytes = ReadBytes(shard);
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() / 2] ^= 0x5a;
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;

  // The same job asked for 120 steps: it must continue from the previous valid checkpoint.
  const int64_t previous_step = checkpoints[checkpoints.size() - 2].step;
  EXPECT_EQ(previous_step, 80);
  JobRun resumed = RunToEnd(dir_.path(), DigitsManifest("damaged", 2, 120, checkpoint), 2,
                            "default/damaged", {}, "-second");
  ASSERT_EQ(resumed.exit_codes, (std::vector<int>{0, 0})) << resumed.logs;
  EXPECT_EQ(resumed.snapshot.final_progress.resumed_from_step, previous_step) << resumed.logs;
  EXPECT_EQ(resumed.snapshot.final_progress.step, 120);
  EXPECT_NE(resumed.logs.find("skipped checkpoint of step 100"), std::string::npos) << resumed.logs;
}

// Storage refuses every write (WebHDFS AccessControlException) after the first checkpoint:
// training still finishes, the failures are reported, and the checkpoint written before stays
// valid.
TEST_F(DigitsCheckpointTest, TrainingFinishesWhileStorageIsDownAndThePreviousCheckpointStaysValid) {
  auto server = testing::WebHdfsTestServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string checkpoint =
      "{uri: \"" + (*server)->uri() + "/ckpt/down\", intervalSteps: 50, keep: 3}";
  // Long enough that storage goes down mid-run even when training is fast.
  LocalJob job(dir_.path(), {.job = "default/down",
                             .manifest = DigitsManifest("down", 2, 6000, checkpoint),
                             .replicas = 2,
                             .env = {{"LOCKSTEP_CHECKPOINT_ATTEMPT_TIMEOUT_MS", "5000"},
                                     {"LOCKSTEP_CHECKPOINT_RETRY_BACKOFF_MS", "100"},
                                     {"LOCKSTEP_FINAL_CHECKPOINT_TIMEOUT_MS", "3000"}}});
  ASSERT_TRUE(WaitForCommittedCheckpoint(job, "default/down", 50)) << job.worker(0).StdoutSoFar();
  ASSERT_TRUE((*server)->Admin("/deny?path=/ckpt").ok());
  JobRun run = job.WaitAll(std::chrono::seconds(120));
  const std::string& logs = run.logs;
  ASSERT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << logs;
  const rendezvous::JobSnapshot& snapshot = run.snapshot;
  EXPECT_EQ(snapshot.final_progress.step, 6000);
  EXPECT_LT(snapshot.final_progress.last_checkpoint_step, 6000);
  EXPECT_NE(logs.find("failed"), std::string::npos) << logs;
  EXPECT_NE(logs.find("not persisted"), std::string::npos) << logs;
  // What the storage holds, read through its own files: every step-* verifies.
  std::vector<checkpoint::CheckpointInfo> left = ListVerified((*server)->root() + "/fs/ckpt/down");
  ASSERT_FALSE(left.empty());
  for (const auto& info : left) EXPECT_TRUE(info.valid) << info.dir << ": " << info.problem;
  EXPECT_EQ(left.back().step, snapshot.final_progress.last_checkpoint_step);
}

// Sample accounting: one of three workers is killed mid-epoch and the two survivors go on; every
// epoch is still trained exactly once per sample.
TEST(SampleAccountingIntegrationTest, EveryEpochIsCompleteAcrossAWorldSizeChange) {
  if (!fs::exists(fs::path(kFashionDir) / "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed";
  }
  const ScratchDir dir("accounting");
  const fs::path accounting = dir / "accounting.jsonl";
  std::ostringstream manifest;
  manifest << "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: acct}\n"
           << "spec:\n  replicas: 3\n  elastic: {minReplicas: 2, maxReplicas: 3}\n  trainer:\n"
           << "    model: {type: mlp, hidden: [32], activation: relu}\n"
           << "    data:\n      format: idx\n      train: [" << kFashionDir
           << "/train-images-idx3-ubyte.gz, " << kFashionDir << "/train-labels-idx1-ubyte.gz]\n"
           << "    batchSize: 64\n    epochs: 4\n"
           << "    optimizer: {type: sgd, learningRate: 0.05, momentum: 0.9}\n"
           << "    seed: 2\n    logIntervalSteps: 5\n  metrics: {port: 0}\n";
  LocalJob job(dir.path(), {.job = "default/acct",
                            .manifest = manifest.str(),
                            .replicas = 3,
                            .min_replicas = 2,
                            .env = {{"LOCKSTEP_SAMPLE_ACCOUNTING", accounting.string()}}});
  // 60000 samples at a global batch of 192: 313 steps per epoch; kill in the middle of epoch 0
  // (four epochs, so the kill lands well before the end even when training is fast).
  ASSERT_TRUE(job.WaitForStep(150, 90000)) << job.worker(0).StdoutSoFar();
  ASSERT_EQ(kill(job.worker(2).pid(), SIGKILL), 0);
  EXPECT_EQ(job.worker(2).WaitUntil(Clock::now() + std::chrono::seconds(10)).code(), 256 + SIGKILL);
  job.rendezvous().RemoveMember("worker-2", "killed by the test");
  EXPECT_EQ(job.worker(0).WaitUntil(Clock::now() + std::chrono::seconds(120)).code(), 0)
      << job.worker(0).StdoutSoFar();
  EXPECT_EQ(job.worker(1).WaitUntil(Clock::now() + std::chrono::seconds(30)).code(), 0)
      << job.worker(1).StdoutSoFar();

  std::map<int64_t, nlohmann::json> last_by_epoch;
  std::ifstream in(accounting);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json record = nlohmann::json::parse(line);
    EXPECT_EQ(record["more_than_once"], 0) << line;
    last_by_epoch[record["epoch"].get<int64_t>()] = record;
  }
  ASSERT_EQ(last_by_epoch.size(), 4u);
  for (const auto& [epoch, record] : last_by_epoch) {
    EXPECT_TRUE(record["complete"].get<bool>()) << record.dump();
    EXPECT_FALSE(record["partial"].get<bool>()) << record.dump();
    EXPECT_EQ(record["trained_once"], 60000) << record.dump();
  }
}

}  // namespace
}  // namespace lockstep
