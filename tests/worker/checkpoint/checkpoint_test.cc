#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/webhdfs/webhdfs_test_server.h"
#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/checksum.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/storage/local/local_storage.h"

namespace lockstep::checkpoint {
namespace {

Deadline TestDeadline() { return Deadline::AfterMs(20000); }

CheckpointState MakeState(int64_t step, size_t bytes_per_tensor = 1000) {
  CheckpointState state;
  state.step = step;
  state.epoch = step / 100;
  state.cursor = {step / 100, step * 64};
  state.rng_state = "pcg:" + std::to_string(step * 7919);
  state.optimizer = {"sgd", step};
  for (int t = 0; t < 3; ++t) {
    NamedTensor tensor;
    tensor.name = (t == 2 ? "optimizer/w" : "w") + std::to_string(t);
    tensor.dtype = "u8";
    tensor.bytes.resize(bytes_per_tensor + t);  // sizes not multiples of the world size
    tensor.shape = {static_cast<int64_t>(tensor.bytes.size())};
    for (size_t i = 0; i < tensor.bytes.size(); ++i) {
      tensor.bytes[i] = static_cast<uint8_t>((i * 31 + t * 7 + step) & 0xff);
    }
    state.tensors.push_back(std::move(tensor));
  }
  return state;
}

void ExpectSameState(const CheckpointState& a, const CheckpointState& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.cursor.epoch, b.cursor.epoch);
  EXPECT_EQ(a.cursor.offset, b.cursor.offset);
  EXPECT_EQ(a.rng_state, b.rng_state);
  EXPECT_EQ(a.optimizer.type, b.optimizer.type);
  EXPECT_EQ(a.optimizer.step, b.optimizer.step);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].dtype, b.tensors[i].dtype);
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    EXPECT_EQ(a.tensors[i].bytes, b.tensors[i].bytes) << a.tensors[i].name;
  }
}

// Runs every rank's writer in its own thread, as W workers would; returns each rank's status.
std::vector<Status> WriteFromAllRanks(Storage& storage, const std::string& root,
                                      const CheckpointState& state, int world_size, int keep,
                                      const std::string& attempt = "a") {
  std::vector<Status> statuses(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      CheckpointWriterOptions options;
      options.keep = keep;
      options.attempt_id = attempt;
      CheckpointWriter writer(storage, root, rank, world_size, options);
      statuses[rank] = writer.Write(state, TestDeadline());
    });
  }
  for (std::thread& thread : threads) thread.join();
  return statuses;
}

class CheckpointTest : public ::testing::Test {
 public:  // the corruption table below uses the helpers
  void SetUp() override {
    char pattern[] = "/tmp/checkpoint-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    root_ = std::string(pattern) + "/ckpt";
  }
  void TearDown() override {
    (void)storage_.Delete(ParentPath(root_), true, Deadline::AfterMs(10000));
  }
  void WriteStep(int64_t step, int world_size = 2, int keep = 0) {
    for (const Status& status :
         WriteFromAllRanks(storage_, root_, MakeState(step), world_size, keep)) {
      ASSERT_TRUE(status.ok()) << status;
    }
  }
  std::string StepPath(int64_t step, const std::string& file) {
    return JoinPath(JoinPath(root_, StepDirName(step)), file);
  }
  void Overwrite(const std::string& path, std::vector<uint8_t> bytes) {
    WriteOptions overwrite;
    overwrite.overwrite = true;
    ASSERT_TRUE(
        storage_.Write(path, std::string(bytes.begin(), bytes.end()), overwrite, TestDeadline())
            .ok());
  }
  // Rewrites step `dir`'s manifest.json after `edit` changed its JSON (checksum left as it was).
  void EditManifest(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
    const std::vector<uint8_t> bytes = ReadAll(dir + "/manifest.json");
    nlohmann::json json = nlohmann::json::parse(bytes.begin(), bytes.end());
    edit(json);
    const std::string text = json.dump(1);
    Overwrite(dir + "/manifest.json", std::vector<uint8_t>(text.begin(), text.end()));
  }
  std::vector<uint8_t> ReadAll(const std::string& path) {
    auto bytes = storage_.Read(path, 0, -1, TestDeadline());
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? *bytes : std::vector<uint8_t>();
  }

  LocalStorage storage_;
  std::string root_;
};

TEST_F(CheckpointTest, MultiRankWriteReadsBackIdentical) {
  for (int world_size : {1, 2, 3, 4}) {
    const CheckpointState state = MakeState(100 + world_size);
    for (const Status& status : WriteFromAllRanks(storage_, root_, state, world_size, 0)) {
      ASSERT_TRUE(status.ok()) << status;
    }
    auto loaded = LoadNewestValid(storage_, root_, TestDeadline());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->manifest.world_size, world_size);
    EXPECT_TRUE(loaded->skipped.empty());
    ExpectSameState(loaded->state, state);
    for (int rank = 0; rank < world_size; ++rank) {
      EXPECT_TRUE(
          storage_.Stat(StepPath(state.step, ShardFileName(rank, world_size)), TestDeadline())
              .ok());
    }
  }
}

TEST_F(CheckpointTest, LayoutHasZeroPaddedStepDirectoryAndNoTemporaryLeftOver) {
  WriteStep(300);
  auto entries = storage_.List(root_, TestDeadline());
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].name, "step-000000000300");
  auto files = storage_.List(JoinPath(root_, "step-000000000300"), TestDeadline());
  ASSERT_TRUE(files.ok());
  std::vector<std::string> names;
  for (const FileInfo& file : *files) names.push_back(file.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"manifest.json", "shard-0-of-2.bin", "shard-1-of-2.bin"}));
}

TEST_F(CheckpointTest, ReaderNeverSeesAPartialCheckpoint) {
  WriteStep(100);
  // Rank 1 of step 200 never writes its shard: rank 0 gives up and nothing named step-200 appears.
  CheckpointWriterOptions options;
  options.attempt_id = "x";
  CheckpointWriter rank0(storage_, root_, 0, 2, options);
  Status status = rank0.Write(MakeState(200), Deadline::AfterMs(300));
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find("shard-1-of-2.bin"), std::string::npos) << status;
  EXPECT_EQ(storage_.Stat(JoinPath(root_, StepDirName(200)), TestDeadline()).status().code(),
            StatusCode::kNotFound);
  auto loaded = LoadNewestValid(storage_, root_, TestDeadline());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.step, 100);
  // The abandoned temporary directory goes with the next commit.
  WriteStep(300);
  auto entries = storage_.List(root_, TestDeadline());
  ASSERT_TRUE(entries.ok());
  for (const FileInfo& entry : *entries) EXPECT_EQ(entry.name.rfind(".tmp", 0), std::string::npos);
}

struct Corruption {
  const char* name;
  std::function<void(CheckpointTest*, Storage&, const std::string& dir)> apply;
  const char* expected_in_message;
};

TEST_F(CheckpointTest, EachKindOfDamageIsDetectedNamedAndSkipped) {
  const std::vector<Corruption> corruptions = {
      {"flip a byte in shard 0",
       [](CheckpointTest* t, Storage& s, const std::string& dir) {
         auto bytes = t->ReadAll(dir + "/shard-0-of-2.bin");
         bytes[bytes.size() / 2] ^= 0x01;
         t->Overwrite(dir + "/shard-0-of-2.bin", bytes);
       },
       "shard-0-of-2.bin: xxh3_128 mismatch"},
      {"flip a byte in shard 1",
       [](CheckpointTest* t, Storage& s, const std::string& dir) {
         auto bytes = t->ReadAll(dir + "/shard-1-of-2.bin");
         bytes[0] ^= 0x80;
         t->Overwrite(dir + "/shard-1-of-2.bin", bytes);
       },
       "shard-1-of-2.bin: xxh3_128 mismatch"},
      {"truncate shard 1",
       [](CheckpointTest* t, Storage& s, const std::string& dir) {
         auto bytes = t->ReadAll(dir + "/shard-1-of-2.bin");
         bytes.resize(bytes.size() - 10);
         t->Overwrite(dir + "/shard-1-of-2.bin", bytes);
       },
       "shard-1-of-2.bin: size"},
      {"delete shard 0",
       [](CheckpointTest* t, Storage& s, const std::string& dir) {
         ASSERT_TRUE(s.Delete(dir + "/shard-0-of-2.bin", false, TestDeadline()).ok());
       },
       "missing shard-0-of-2.bin"},
      {"truncate the manifest",
       [](CheckpointTest* t, Storage& s, const std::string& dir) {
         auto bytes = t->ReadAll(dir + "/manifest.json");
         bytes.resize(120);
         t->Overwrite(dir + "/manifest.json", bytes);
       },
       "manifest.json: truncated JSON at byte"},
      {"garbage manifest",
       [](CheckpointTest* t, Storage& s, const std::string& dir) {
         t->Overwrite(dir + "/manifest.json", {'{', '"', 'x', 0xff, '}', '!', '!'});
       },
       "manifest.json: malformed JSON"},
      {"manifest missing a field",
       [](CheckpointTest* t, Storage& s, const std::string& dir) {
         const std::string text = "{\"format_version\": 1, \"step\": 200}";
         t->Overwrite(dir + "/manifest.json", std::vector<uint8_t>(text.begin(), text.end()));
       },
       "manifest.json: missing field 'epoch'"},
      {"point a tensor's offset at another tensor's bytes",
       [](CheckpointTest* t, Storage& s, const std::string& dir) {
         t->EditManifest(dir, [](nlohmann::json& json) { json["tensors"][1]["offset"] = 0; });
       },
       "manifest.json: manifest_sha256 mismatch"},
      {"give a tensor four times its bytes",
       [](CheckpointTest* t, Storage& s, const std::string& dir) {
         t->EditManifest(dir, [](nlohmann::json& json) {
           json["tensors"][0]["shape"][0] = json["tensors"][0]["shape"][0].get<int64_t>() / 4;
         });
       },
       "manifest.json: manifest_sha256 mismatch"},
      {"rename a tensor",
       [](CheckpointTest* t, Storage& s, const std::string& dir) {
         t->EditManifest(dir, [](nlohmann::json& json) { json["tensors"][0]["name"] = "zz"; });
       },
       "manifest.json: manifest_sha256 mismatch"},
      {"drop the manifest's checksum",
       [](CheckpointTest* t, Storage& s, const std::string& dir) {
         t->EditManifest(dir, [](nlohmann::json& json) { json.erase("manifest_sha256"); });
       },
       "manifest.json: missing field 'manifest_sha256'"},
      {"delete the manifest",
       [](CheckpointTest* t, Storage& s, const std::string& dir) {
         ASSERT_TRUE(s.Delete(dir + "/manifest.json", false, TestDeadline()).ok());
       },
       "missing manifest.json"},
  };
  WriteStep(100);
  for (const Corruption& corruption : corruptions) {
    SCOPED_TRACE(corruption.name);
    WriteStep(200);
    const std::string dir = JoinPath(root_, StepDirName(200));
    corruption.apply(this, storage_, dir);

    Status verified = VerifyCheckpoint(storage_, root_, std::nullopt, TestDeadline());
    EXPECT_EQ(verified.code(), StatusCode::kDataLoss) << verified;
    EXPECT_NE(verified.message().find("step-000000000200"), std::string::npos) << verified;
    EXPECT_NE(verified.message().find(corruption.expected_in_message), std::string::npos)
        << verified;

    auto loaded = LoadNewestValid(storage_, root_, TestDeadline());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->state.step, 100);
    ASSERT_EQ(loaded->skipped.size(), 1u);
    EXPECT_EQ(loaded->skipped[0].step, 200);
    EXPECT_NE(loaded->skipped[0].problem.find(corruption.expected_in_message), std::string::npos);
    ExpectSameState(loaded->state, MakeState(100));

    auto listed = ListCheckpoints(storage_, root_, VerifyLevel::kChecksums, TestDeadline());
    ASSERT_TRUE(listed.ok());
    ASSERT_EQ(listed->size(), 2u);
    EXPECT_TRUE((*listed)[0].valid);
    EXPECT_FALSE((*listed)[1].valid);
    ASSERT_TRUE(storage_.Delete(dir, true, TestDeadline()).ok());
  }
}

// A manifest whose checksum is right (a buggy or hostile writer) is still checked against
// itself: every way the tensor table can contradict itself is named.
TEST(ManifestTest, TensorTableThatContradictsItselfIsDamageNamingTheTensor) {
  const CheckpointState state = MakeState(100);
  struct Case {
    const char* name;
    std::function<void(Manifest&)> edit;
    const char* expected_in_message;
  };
  const std::vector<Case> cases = {
      {"overlapping tensors", [](Manifest& m) { m.tensors[1].offset = 0; },
       "tensor 'w1' begins at byte 0, the previous one ends at 1000"},
      {"bytes four times the shape", [](Manifest& m) { m.tensors[0].shape[0] /= 4; },
       "tensor 'w0' holds 1000 bytes; its shape [250] of u8 needs 250"},
      {"duplicate name", [](Manifest& m) { m.tensors[1].name = "w0"; },
       "tensor 'w0' appears twice"},
      {"unknown dtype", [](Manifest& m) { m.tensors[2].dtype = "q4"; },
       "tensor 'optimizer/w2' has unknown dtype 'q4'"},
      {"negative dimension", [](Manifest& m) { m.tensors[0].shape = {-1000, -1}; },
       "tensor 'w0' has shape [-1000,-1]"},
      {"a gap before the end", [](Manifest& m) { m.tensors.pop_back(); },
       "the tensors cover 2001 of the state's 3003 bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Manifest manifest = BuildManifest(state, 2, /*hash_shards=*/true);
    ASSERT_TRUE(ParseManifest(SerializeManifest(manifest)).ok());
    c.edit(manifest);
    StatusOr<Manifest> parsed = ParseManifest(SerializeManifest(manifest));
    EXPECT_EQ(parsed.status().code(), StatusCode::kDataLoss) << parsed.status();
    EXPECT_NE(parsed.status().message().find(c.expected_in_message), std::string::npos)
        << parsed.status();
    EXPECT_EQ(CheckTensorTable(manifest).code(), StatusCode::kDataLoss);
  }
}

TEST(ChecksumTest, ShardChecksumsAreTheOnesXxhsumAndSha256sumPrint) {
  // `xxhsum -H2` and `sha256sum` of an empty file and of a file holding "lockstep".
  EXPECT_EQ(ShardChecksumHex(ShardChecksum::kXxh3_128, "", 0), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(ShardChecksumHex(ShardChecksum::kXxh3_128, "lockstep", 8),
            "b4ead11c934f0a1e75345b2b871d8c38");
  EXPECT_EQ(ShardChecksumHex(ShardChecksum::kSha256, "lockstep", 8),
            "b3e2087f587654ac1c93325104785b14b1b4033f66016a8d56b67abcc62e0b3d");
  // Fed in pieces, as a shard that spans several tensors is.
  ShardHasher hasher(ShardChecksum::kXxh3_128);
  hasher.Update("lock", 4);
  hasher.Update("", 0);
  hasher.Update("step", 4);
  EXPECT_EQ(hasher.FinishHex(), "b4ead11c934f0a1e75345b2b871d8c38");
}

TEST_F(CheckpointTest, ANewCheckpointChecksItsShardsWithXxh3) {
  WriteStep(100);
  const std::vector<uint8_t> text = ReadAll(StepPath(100, "manifest.json"));
  StatusOr<Manifest> manifest = ParseManifest(std::string(text.begin(), text.end()));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->format_version, 3);
  for (const ShardEntry& shard : manifest->shards) {
    const std::vector<uint8_t> bytes = ReadAll(StepPath(100, shard.file));
    EXPECT_EQ(shard.checksum,
              ShardChecksumHex(ShardChecksum::kXxh3_128, bytes.data(), bytes.size()))
        << shard.file;
  }
  EXPECT_NE(std::string(text.begin(), text.end()).find("\"xxh3_128\""), std::string::npos);
}

TEST_F(CheckpointTest, CheckpointsOfFormatsOneAndTwoWithSha256ShardsAreStillReadAndChecked) {
  for (int version : {1, 2}) {
    SCOPED_TRACE("format_version " + std::to_string(version));
    const int64_t step = 100 * version;
    WriteStep(step);
    // Rewritten as that version's writer wrote it: SHA-256 per shard, and for version 1 no
    // manifest checksum.
    const std::vector<uint8_t> text = ReadAll(StepPath(step, "manifest.json"));
    StatusOr<Manifest> manifest = ParseManifest(std::string(text.begin(), text.end()));
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    manifest->format_version = version;
    std::vector<std::string> hashes = HashShards(MakeState(step), *manifest);
    for (size_t rank = 0; rank < hashes.size(); ++rank) {
      EXPECT_EQ(hashes[rank].size(), 64u);
      manifest->shards[rank].checksum = hashes[rank];
    }
    const std::string old = SerializeManifest(*manifest);
    EXPECT_NE(old.find("\"sha256\""), std::string::npos);
    EXPECT_EQ(old.find("\"xxh3_128\""), std::string::npos);
    EXPECT_EQ(old.find("manifest_sha256") != std::string::npos, version == 2);
    Overwrite(StepPath(step, "manifest.json"), std::vector<uint8_t>(old.begin(), old.end()));

    EXPECT_TRUE(VerifyCheckpoint(storage_, root_, step, TestDeadline()).ok());
    auto loaded = LoadNewestValid(storage_, root_, TestDeadline());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ExpectSameState(loaded->state, MakeState(step));

    std::vector<uint8_t> shard = ReadAll(StepPath(step, "shard-1-of-2.bin"));
    shard[3] ^= 0x10;
    Overwrite(StepPath(step, "shard-1-of-2.bin"), shard);
    Status damaged = VerifyCheckpoint(storage_, root_, step, TestDeadline());
    EXPECT_EQ(damaged.code(), StatusCode::kDataLoss) << damaged;
    EXPECT_NE(damaged.message().find("shard-1-of-2.bin: sha256 mismatch"), std::string::npos)
        << damaged;
  }
}

TEST_F(CheckpointTest, ACheckpointTheLoaderRejectsIsSkippedForTheNewestItAccepts) {
  WriteStep(100);
  // Step 200 was written for another model: its first tensor is larger.
  CheckpointState other = MakeState(200, 2000);
  for (const Status& status : WriteFromAllRanks(storage_, root_, other, 2, 0)) {
    ASSERT_TRUE(status.ok()) << status;
  }
  auto fits = [](const Manifest& manifest) -> Status {
    if (manifest.tensors[0].bytes != 1000) {
      return FailedPreconditionError("tensor w0 is u8[" + std::to_string(manifest.tensors[0].bytes) +
                                     "], this model's u8[1000]");
    }
    return OkStatus();
  };
  auto loaded = LoadNewestValid(storage_, root_, TestDeadline(), fits);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.step, 100);
  ASSERT_EQ(loaded->skipped.size(), 1u);
  EXPECT_EQ(loaded->skipped[0].step, 200);
  EXPECT_NE(loaded->skipped[0].problem.find(
                "step-000000000200/manifest.json: tensor w0 is u8[2000], this model's u8[1000]"),
            std::string::npos)
      << loaded->skipped[0].problem;
  ExpectSameState(loaded->state, MakeState(100));
}

// Every rank agrees on what committing a step that already exists damaged does (all write, rank
// 0 replaces it), so the commit completes at once instead of rank 0 waiting out its deadline for
// a shard that rank 1 skipped.
TEST_F(CheckpointTest, CommittingAStepThatExistsDamagedReplacesItFromEveryRank) {
  WriteStep(100);
  WriteStep(200);
  const std::string dir = JoinPath(root_, StepDirName(200));
  ASSERT_TRUE(storage_.Delete(dir + "/shard-1-of-2.bin", false, TestDeadline()).ok());
  ASSERT_EQ(VerifyCheckpoint(storage_, root_, 200, TestDeadline()).code(), StatusCode::kDataLoss);

  for (const Status& status :
       WriteFromAllRanks(storage_, root_, MakeState(200), 2, 0, "again")) {
    EXPECT_TRUE(status.ok()) << status;
  }
  EXPECT_TRUE(VerifyCheckpoint(storage_, root_, 200, TestDeadline()).ok());
  auto loaded = LoadNewestValid(storage_, root_, TestDeadline());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.step, 200);
  EXPECT_TRUE(loaded->skipped.empty());
}

// A valid step directory written for other tensors (the model changed) is replaced, not kept.
TEST_F(CheckpointTest, CommittingAStepThatExistsForOtherTensorsReplacesIt) {
  for (const Status& status : WriteFromAllRanks(storage_, root_, MakeState(200, 2000), 2, 0)) {
    ASSERT_TRUE(status.ok()) << status;
  }
  for (const Status& status :
       WriteFromAllRanks(storage_, root_, MakeState(200), 2, 0, "again")) {
    EXPECT_TRUE(status.ok()) << status;
  }
  auto loaded = LoadNewestValid(storage_, root_, TestDeadline());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameState(loaded->state, MakeState(200));
}

TEST_F(CheckpointTest, AStateWhoseTensorTableContradictsItselfIsNotWritten) {
  CheckpointState state = MakeState(100);
  state.tensors[0].shape = {7};
  CheckpointWriter writer(storage_, root_, 0, 1);
  Status status = writer.Write(state, TestDeadline());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("tensor 'w0' holds 1000 bytes"), std::string::npos) << status;
}

TEST_F(CheckpointTest, RetentionKeepsTheNewestK) {
  for (int64_t step : {100, 200, 300, 400, 500}) {
    for (const Status& status :
         WriteFromAllRanks(storage_, root_, MakeState(step), 2, /*keep=*/3)) {
      ASSERT_TRUE(status.ok()) << status;
    }
  }
  auto listed = ListCheckpoints(storage_, root_, VerifyLevel::kChecksums, TestDeadline());
  ASSERT_TRUE(listed.ok());
  std::vector<int64_t> steps;
  for (const CheckpointInfo& info : *listed) {
    EXPECT_TRUE(info.valid) << info.problem;
    steps.push_back(info.step);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{300, 400, 500}));
}

TEST_F(CheckpointTest, RetentionCountsOnlyValidCheckpoints) {
  WriteStep(100, 2, 2);
  WriteStep(200, 2, 2);
  // Damage 200 by size: retention must keep 100 as one of the two valid ones.
  ASSERT_TRUE(storage_.Delete(StepPath(200, "shard-1-of-2.bin"), false, TestDeadline()).ok());
  WriteStep(300, 2, 2);
  auto listed = ListCheckpoints(storage_, root_, VerifyLevel::kSizes, TestDeadline());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_TRUE((*listed)[0].valid);
  EXPECT_FALSE((*listed)[1].valid);
  EXPECT_TRUE((*listed)[2].valid);
}

// LocalStorage whose recursive deletes stop half-way, as if the process were killed during
// them: the manifest is gone, the shards are still there.
class DeleteKilledHalfwayStorage : public LocalStorage {
 public:
  Status Delete(const std::string& path, bool recursive, Deadline deadline) override {
    if (!recursive || !kill_deletes) return LocalStorage::Delete(path, recursive, deadline);
    (void)LocalStorage::Delete(JoinPath(path, kManifestFileName), false, deadline);
    return UnavailableError("delete " + path + ": process killed");
  }
  bool kill_deletes = true;
};

TEST_F(CheckpointTest, RetentionKilledMidDeleteLeavesNoDamagedCheckpointVisible) {
  DeleteKilledHalfwayStorage storage;
  for (int64_t step : {100, 200, 300, 400}) {
    for (const Status& status : WriteFromAllRanks(storage, root_, MakeState(step), 2, /*keep=*/2)) {
      ASSERT_TRUE(status.ok()) << status;
    }
  }
  // Retention's deletes of 100 and 200 were cut short, yet readers see only whole checkpoints.
  auto listed = ListCheckpoints(storage, root_, VerifyLevel::kSizes, TestDeadline());
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::vector<int64_t> steps;
  for (const CheckpointInfo& info : *listed) {
    EXPECT_TRUE(info.valid) << info.problem;
    steps.push_back(info.step);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{300, 400}));
  auto loaded = LoadNewestValid(storage, root_, TestDeadline());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.step, 400);
  EXPECT_TRUE(loaded->skipped.empty());

  // Once deletes work again (a restarted process), the next reader finishes the interrupted ones.
  storage.kill_deletes = false;
  ASSERT_TRUE(ListCheckpoints(storage, root_, VerifyLevel::kSizes, TestDeadline()).ok());
  auto entries = storage.List(root_, TestDeadline());
  ASSERT_TRUE(entries.ok()) << entries.status();
  std::vector<std::string> names;
  for (const FileInfo& entry : *entries) names.push_back(entry.name);
  EXPECT_EQ(names, (std::vector<std::string>{StepDirName(300), StepDirName(400)}));
}

TEST_F(CheckpointTest, VerifyOfAMissingStepIsNotFound) {
  WriteStep(100);
  EXPECT_TRUE(VerifyCheckpoint(storage_, root_, 100, TestDeadline()).ok());
  EXPECT_EQ(VerifyCheckpoint(storage_, root_, 7, TestDeadline()).code(), StatusCode::kNotFound);
  EXPECT_EQ(LoadNewestValid(storage_, root_ + "/none", TestDeadline()).status().code(),
            StatusCode::kNotFound);
}

TEST_F(CheckpointTest, RewritingACommittedStepIsOk) {
  WriteStep(100);
  WriteStep(100);
  auto loaded = LoadNewestValid(storage_, root_, TestDeadline());
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->state.step, 100);
}

// A pipeline's checkpoint: part p holds the tensors of stage p only (names distinct across the
// parts), of sizes that differ from part to part.
std::vector<CheckpointState> MakeParts(int64_t step, int parts) {
  std::vector<CheckpointState> states;
  for (int p = 0; p < parts; ++p) {
    CheckpointState part = MakeState(step, 500 + 300 * static_cast<size_t>(p));
    for (NamedTensor& tensor : part.tensors)
      tensor.name = "stage" + std::to_string(p) + "/" + tensor.name;
    states.push_back(std::move(part));
  }
  return states;
}

// Every part's writer in its own thread, as the stages' ranks would; each rank's status.
std::vector<Status> WriteParts(Storage& storage, const std::string& root,
                               const std::vector<CheckpointState>& parts) {
  CheckpointWriterOptions options;
  options.keep = 0;
  options.attempt_id = "p";
  for (const CheckpointState& part : parts) options.parts.push_back(TensorTable(part));
  const int count = static_cast<int>(parts.size());
  std::vector<Status> statuses(parts.size());
  std::vector<std::thread> threads;
  for (int p = 0; p < count; ++p) {
    threads.emplace_back([&, p] {
      CheckpointWriter writer(storage, root, p, count, options);
      statuses[static_cast<size_t>(p)] =
          writer.Write(parts[static_cast<size_t>(p)], TestDeadline());
    });
  }
  for (std::thread& thread : threads) thread.join();
  return statuses;
}

TEST_F(CheckpointTest, APipelinesStagesWriteOneCheckpointEachShardItsStagesTensors) {
  const std::vector<CheckpointState> parts = MakeParts(40, 3);
  for (const Status& status : WriteParts(storage_, root_, parts))
    ASSERT_TRUE(status.ok()) << status;

  auto listed = ListCheckpoints(storage_, root_, VerifyLevel::kChecksums, TestDeadline());
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_TRUE((*listed)[0].valid) << (*listed)[0].problem;
  EXPECT_EQ((*listed)[0].stages, 3);
  EXPECT_EQ((*listed)[0].world_size, 3);
  EXPECT_TRUE(VerifyCheckpoint(storage_, root_, std::nullopt, TestDeadline()).ok());

  // Read whole, it is every stage's tensors in stage order, under the metadata all stages share;
  // shard p is stage p's bytes exactly.
  auto loaded = LoadNewestValid(storage_, root_, TestDeadline());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->manifest.stages, 3);
  CheckpointState whole = parts[0];
  for (size_t p = 1; p < parts.size(); ++p) {
    whole.tensors.insert(whole.tensors.end(), parts[p].tensors.begin(), parts[p].tensors.end());
  }
  ExpectSameState(loaded->state, whole);
  for (size_t p = 0; p < parts.size(); ++p) {
    EXPECT_EQ(loaded->manifest.shards[p].bytes, BuildManifest(parts[p], 1, false).total_bytes);
  }
}

TEST_F(CheckpointTest, AStageReadsOnlyTheShardsThatHoldItsTensors) {
  const std::vector<CheckpointState> parts = MakeParts(40, 3);
  for (const Status& status : WriteParts(storage_, root_, parts))
    ASSERT_TRUE(status.ok()) << status;
  const std::string dir = JoinPath(root_, StepDirName(40));
  Manifest manifest;
  ASSERT_TRUE(
      CheckStepDir(storage_, dir, VerifyLevel::kSizes, &manifest, nullptr, TestDeadline()).ok());
  // Damage the other stages' shards: stage 1 still reads its own tensors.
  for (const char* other : {"shard-0-of-3.bin", "shard-2-of-3.bin"}) {
    std::vector<uint8_t> bytes = ReadAll(JoinPath(dir, other));
    bytes[0] ^= 0x01;
    Overwrite(JoinPath(dir, other), bytes);
  }
  std::set<std::string> wanted;
  for (const NamedTensor& tensor : parts[1].tensors) wanted.insert(tensor.name);
  auto read = ReadTensors(storage_, dir, manifest, wanted, TestDeadline());
  ASSERT_TRUE(read.ok()) << read.status();
  CheckpointState expected = parts[1];
  ExpectSameState(*read, expected);

  // A tensor in a damaged shard is damage named by the shard; one nobody wrote is not found.
  auto damaged = ReadTensors(storage_, dir, manifest, {parts[0].tensors[0].name}, TestDeadline());
  EXPECT_EQ(damaged.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(damaged.status().message(), ::testing::HasSubstr("shard-0-of-3.bin: xxh3_128"));
  auto missing = ReadTensors(storage_, dir, manifest, {"layers.9.weight"}, TestDeadline());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), ::testing::HasSubstr("no tensor layers.9.weight"));
}

TEST_F(CheckpointTest, TensorsSplitAcrossADataParallelCheckpointsShardsReadWhole) {
  // Three ranks split the stream evenly, so tensors straddle shard boundaries.
  const CheckpointState state = MakeState(70);
  for (const Status& status : WriteFromAllRanks(storage_, root_, state, 3, 0)) {
    ASSERT_TRUE(status.ok()) << status;
  }
  const std::string dir = JoinPath(root_, StepDirName(70));
  Manifest manifest;
  ASSERT_TRUE(
      CheckStepDir(storage_, dir, VerifyLevel::kSizes, &manifest, nullptr, TestDeadline()).ok());
  auto read = ReadTensors(storage_, dir, manifest, {"w1", "optimizer/w2"}, TestDeadline());
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->tensors.size(), 2u);
  EXPECT_EQ(read->tensors[0].bytes, state.tensors[1].bytes);
  EXPECT_EQ(read->tensors[1].bytes, state.tensors[2].bytes);
  EXPECT_EQ(read->step, 70);
}

TEST_F(CheckpointTest, APartWhoseStateIsNotItsTableIsNotWritten) {
  std::vector<CheckpointState> parts = MakeParts(50, 2);
  CheckpointWriterOptions options;
  options.attempt_id = "p";
  for (const CheckpointState& part : parts) options.parts.push_back(TensorTable(part));
  parts[1].tensors.pop_back();
  CheckpointWriter writer(storage_, root_, 1, 2, options);
  Status status = writer.Write(parts[1], TestDeadline());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("part 1's state does not match: it lacks "
                                                     "tensor 'stage1/optimizer/w2'"));
}

TEST_F(CheckpointTest, AStepWrittenByAnotherNumberOfStagesIsNotWrittenAgain) {
  // The same tensors written as two parts and then as one: the second write finds the step
  // committed with the same tensors and leaves it.
  const std::vector<CheckpointState> parts = MakeParts(60, 2);
  for (const Status& status : WriteParts(storage_, root_, parts))
    ASSERT_TRUE(status.ok()) << status;
  CheckpointState whole = parts[0];
  whole.tensors.insert(whole.tensors.end(), parts[1].tensors.begin(), parts[1].tensors.end());
  for (const Status& status : WriteFromAllRanks(storage_, root_, whole, 1, 0)) {
    ASSERT_TRUE(status.ok()) << status;
  }
  auto loaded = LoadNewestValid(storage_, root_, TestDeadline());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->manifest.stages, 2);
}

TEST(ManifestTest, StagesThatDoNotMatchTheWritersAreDamage) {
  CheckpointState part = MakeState(5);
  Manifest manifest = BuildPartedManifest(part, {TensorTable(part), {}});
  EXPECT_EQ(manifest.stages, 2);
  EXPECT_TRUE(ParseManifest(SerializeManifest(manifest)).ok());
  manifest.world_size = 3;
  manifest.shards.push_back({"shard-2-of-3.bin", manifest.total_bytes, 0, ""});
  auto parsed = ParseManifest(SerializeManifest(manifest));
  EXPECT_EQ(parsed.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(parsed.status().message(),
              ::testing::HasSubstr("stages 2 does not match world size 3"));
  // A data-parallel manifest does not mention stages at all.
  EXPECT_EQ(SerializeManifest(BuildManifest(part, 2, true)).find("stages"), std::string::npos);
}

TEST(CheckpointOverWebHdfsTest, MultiRankWriteAndLoadThroughTheTestServer) {
  auto server = lockstep::testing::WebHdfsTestServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  StorageOptions options;
  options.user = "tester";
  auto storage = OpenStorage((*server)->uri(), options);
  ASSERT_TRUE(storage.ok());
  const std::string root = "/ckpt/job";
  for (int64_t step : {100, 200}) {
    for (const Status& status : WriteFromAllRanks(**storage, root, MakeState(step, 100000), 3, 3)) {
      ASSERT_TRUE(status.ok()) << status;
    }
  }
  auto loaded = LoadNewestValid(**storage, root, TestDeadline());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameState(loaded->state, MakeState(200, 100000));
  EXPECT_TRUE(VerifyCheckpoint(**storage, root, 100, TestDeadline()).ok());
}

}  // namespace
}  // namespace lockstep::checkpoint
