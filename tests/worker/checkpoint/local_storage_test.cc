#include "worker/checkpoint/storage/local/local_storage.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <vector>

namespace lockstep::checkpoint {
namespace {

class LocalStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/local-storage-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    (void)storage_.Delete(root_, /*recursive=*/true, Deadline::AfterMs(10000));
  }
  Deadline deadline() const { return Deadline::AfterMs(10000); }

  LocalStorage storage_;
  std::string root_;
};

std::string AllByteValues() {
  std::string bytes;
  for (int round = 0; round < 4; ++round) {
    for (int value = 0; value < 256; ++value) bytes.push_back(static_cast<char>(value));
  }
  return bytes;
}

TEST_F(LocalStorageTest, WriteCreatesParentsAndReadsBackEveryByteValue) {
  const std::string bytes = AllByteValues();
  const std::string path = root_ + "/a/b/c.bin";
  ASSERT_TRUE(storage_.Write(path, bytes, {}, deadline()).ok());
  auto read = storage_.Read(path, 0, -1, deadline());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(std::string(read->begin(), read->end()), bytes);
  auto part = storage_.Read(path, 10, 5, deadline());
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(std::string(part->begin(), part->end()), bytes.substr(10, 5));
  auto tail = storage_.Read(path, bytes.size() - 3, 100, deadline());
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail->size(), 3u);
}

TEST_F(LocalStorageTest, ManyPiecesAcrossWritebackChunksReadBackInOrder) {
  // Pieces of odd sizes adding up to more than two of the 8 MiB chunks after which writeback is
  // started early: the file is their exact concatenation.
  std::vector<std::string> pieces;
  for (size_t size : {size_t{1}, size_t{5} << 20, size_t{3}, size_t{9} << 20, size_t{4097}}) {
    std::string piece(size, '\0');
    for (size_t i = 0; i < size; ++i) piece[i] = static_cast<char>((i * 31 + pieces.size()) & 0xff);
    pieces.push_back(std::move(piece));
  }
  std::vector<std::string_view> views(pieces.begin(), pieces.end());
  const std::string path = root_ + "/big.bin";
  ASSERT_TRUE(storage_.WritePieces(path, views, {}, deadline()).ok());
  auto read = storage_.Read(path, 0, -1, deadline());
  ASSERT_TRUE(read.ok()) << read.status();
  std::string joined;
  for (const std::string& piece : pieces) joined += piece;
  EXPECT_TRUE(std::string(read->begin(), read->end()) == joined);
}

TEST_F(LocalStorageTest, WriteLeavingTheDirectorySyncToTheCallerStillWritesEverything) {
  WriteOptions options;
  options.sync_directory = false;
  const std::string path = root_ + "/new/dir/f.bin";
  ASSERT_TRUE(storage_.Write(path, "content", options, deadline()).ok());
  ASSERT_TRUE(storage_.SyncDirectory(root_ + "/new/dir", deadline()).ok());
  auto read = storage_.Read(path, 0, -1, deadline());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(std::string(read->begin(), read->end()), "content");
  EXPECT_EQ(storage_.SyncDirectory(root_ + "/missing", deadline()).code(), StatusCode::kNotFound);
}

TEST_F(LocalStorageTest, InPlaceWriteKeepsTheOverwriteRulesAndLeavesNoOtherName) {
  WriteOptions in_place;
  in_place.atomic = false;
  const std::string path = root_ + "/m.json";
  ASSERT_TRUE(storage_.Write(path, "first", in_place, deadline()).ok());
  EXPECT_EQ(storage_.Write(path, "second", in_place, deadline()).code(),
            StatusCode::kAlreadyExists);
  auto read = storage_.Read(path, 0, -1, deadline());
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(std::string(read->begin(), read->end()), "first");
  in_place.overwrite = true;
  ASSERT_TRUE(storage_.Write(path, "new", in_place, deadline()).ok());
  read = storage_.Read(path, 0, -1, deadline());
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(std::string(read->begin(), read->end()), "new");
  auto entries = storage_.List(root_, deadline());
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].name, "m.json");
}

TEST_F(LocalStorageTest, WriteWithoutOverwriteRefusesAnExistingFile) {
  const std::string path = root_ + "/x";
  ASSERT_TRUE(storage_.Write(path, "one", {}, deadline()).ok());
  EXPECT_EQ(storage_.Write(path, "two", {}, deadline()).code(), StatusCode::kAlreadyExists);
  WriteOptions overwrite;
  overwrite.overwrite = true;
  ASSERT_TRUE(storage_.Write(path, "three", overwrite, deadline()).ok());
  auto read = storage_.Read(path, 0, -1, deadline());
  EXPECT_EQ(std::string(read->begin(), read->end()), "three");
}

TEST_F(LocalStorageTest, FailedWriteLeavesNoPartialFile) {
  // A directory that cannot be written to makes the temporary file's creation fail; nothing
  // under the target's name or a temporary name may remain.
  if (::geteuid() == 0) {
    // root ignores directory permissions; the deadline path exercises the same cleanup.
    const std::string path = root_ + "/late.bin";
    Status status = storage_.Write(path, std::string(1 << 20, 'x'), {}, Deadline::AfterMs(0));
    EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded);
  } else {
    ASSERT_TRUE(storage_.MakeDirs(root_ + "/ro", deadline()).ok());
    ASSERT_EQ(::chmod((root_ + "/ro").c_str(), 0555), 0);
    EXPECT_FALSE(storage_.Write(root_ + "/ro/f.bin", "data", {}, deadline()).ok());
    ASSERT_EQ(::chmod((root_ + "/ro").c_str(), 0755), 0);
  }
  auto entries = storage_.List(root_, deadline());
  ASSERT_TRUE(entries.ok());
  for (const FileInfo& entry : *entries) {
    EXPECT_TRUE(entry.is_dir) << "left behind: " << entry.name;
    if (entry.is_dir) {
      auto inner = storage_.List(root_ + "/" + entry.name, deadline());
      ASSERT_TRUE(inner.ok());
      EXPECT_TRUE(inner->empty()) << "left behind in " << entry.name;
    }
  }
}

TEST_F(LocalStorageTest, ListStatAndMissingPaths) {
  ASSERT_TRUE(storage_.Write(root_ + "/d/one", "1", {}, deadline()).ok());
  ASSERT_TRUE(storage_.Write(root_ + "/d/two", "22", {}, deadline()).ok());
  ASSERT_TRUE(storage_.MakeDirs(root_ + "/d/sub/deeper", deadline()).ok());
  ASSERT_TRUE(storage_.MakeDirs(root_ + "/d/sub", deadline()).ok());  // idempotent
  auto entries = storage_.List(root_ + "/d", deadline());
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].name, "one");
  EXPECT_EQ((*entries)[0].size_bytes, 1);
  EXPECT_EQ((*entries)[1].name, "sub");
  EXPECT_TRUE((*entries)[1].is_dir);
  EXPECT_EQ((*entries)[2].size_bytes, 2);
  auto info = storage_.Stat(root_ + "/d/two", deadline());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->name, "two");
  EXPECT_FALSE(info->is_dir);
  EXPECT_EQ(storage_.Stat(root_ + "/nope", deadline()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(storage_.List(root_ + "/nope", deadline()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(storage_.Read(root_ + "/nope", 0, -1, deadline()).status().code(),
            StatusCode::kNotFound);
}

TEST_F(LocalStorageTest, RenameMovesDirectoriesAndRefusesAnExistingDestination) {
  ASSERT_TRUE(storage_.Write(root_ + "/tmp/f", "x", {}, deadline()).ok());
  ASSERT_TRUE(storage_.MakeDirs(root_ + "/taken", deadline()).ok());
  EXPECT_EQ(storage_.Rename(root_ + "/tmp", root_ + "/taken", deadline()).code(),
            StatusCode::kAlreadyExists);
  ASSERT_TRUE(storage_.Rename(root_ + "/tmp", root_ + "/final", deadline()).ok());
  EXPECT_TRUE(storage_.Stat(root_ + "/final/f", deadline()).ok());
  EXPECT_EQ(storage_.Stat(root_ + "/tmp", deadline()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(storage_.Rename(root_ + "/missing", root_ + "/m2", deadline()).code(),
            StatusCode::kNotFound);
}

TEST_F(LocalStorageTest, DeleteNeedsRecursiveForANonEmptyDirectory) {
  ASSERT_TRUE(storage_.Write(root_ + "/d/e/f", "x", {}, deadline()).ok());
  EXPECT_EQ(storage_.Delete(root_ + "/d", false, deadline()).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(storage_.Delete(root_ + "/d", true, deadline()).ok());
  EXPECT_EQ(storage_.Stat(root_ + "/d", deadline()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(storage_.Delete(root_ + "/d", true, deadline()).code(), StatusCode::kNotFound);
}

TEST(StorageUriTest, ParsesSchemesAndRejectsBadOnes) {
  auto file = ParseStorageUri("file:///ckpt/job/");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->scheme, "file");
  EXPECT_EQ(file->path, "/ckpt/job");
  auto hdfs = ParseStorageUri("hdfs://nn:9870/ckpt");
  ASSERT_TRUE(hdfs.ok());
  EXPECT_EQ(hdfs->authority, "nn:9870");
  EXPECT_EQ(hdfs->path, "/ckpt");
  EXPECT_EQ(ParseStorageUri("/plain/path")->scheme, "file");
  EXPECT_EQ(ParseStorageUri("s3://bucket/x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseStorageUri("hdfs://nn/ckpt").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseStorageUri("relative/path").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lockstep::checkpoint
