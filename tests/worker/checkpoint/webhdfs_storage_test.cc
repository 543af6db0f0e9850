#include "worker/checkpoint/storage/webhdfs/webhdfs_storage.h"

#include <gtest/gtest.h>

#include <string>

#include "common/deadline.h"
#include "tests/support/webhdfs/webhdfs_test_server.h"

namespace lockstep::checkpoint {
namespace {

using lockstep::testing::WebHdfsTestServer;

class WebHdfsStorageTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto server = WebHdfsTestServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value().release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    ASSERT_TRUE(server_->Admin("/clear").ok());
    StorageOptions options;
    options.user = "tester";
    options.request_timeout_ms = 5000;
    options.retry_initial_backoff_ms = 20;
    options.retry_max_backoff_ms = 200;
    auto storage = OpenStorage(server_->uri(), options);
    ASSERT_TRUE(storage.ok()) << storage.status();
    storage_ = std::move(storage).value();
    dir_ = "/t/" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  static Deadline deadline() { return Deadline::AfterMs(15000); }

  // Requests of the log to `server` ("namenode" | "datanode") with operation `op`.
  static int CountRequests(const std::string& server, const std::string& op) {
    int count = 0;
    for (const auto& entry : server_->RequestLog()) {
      if (entry["server"] == server && entry["op"] == op) ++count;
    }
    return count;
  }

  static WebHdfsTestServer* server_;
  std::unique_ptr<Storage> storage_;
  std::string dir_;
};

WebHdfsTestServer* WebHdfsStorageTest::server_ = nullptr;

std::string PatternBytes(size_t size) {
  std::string bytes(size, '\0');
  uint32_t x = 12345;
  for (size_t i = 0; i < size; ++i) {
    // Every byte value appears in each 256-byte run, in an order that differs between runs.
    x = x * 1103515245u + 12345u;
    bytes[i] = static_cast<char>((i + (x >> 24)) & 0xff);
    if (i < 256) bytes[i] = static_cast<char>(i);
  }
  return bytes;
}

TEST_F(WebHdfsStorageTest, WriteThenReadIsBinaryExactForAllByteValuesAndMebibytes) {
  const std::string bytes = PatternBytes(3 * 1024 * 1024 + 17);
  const std::string path = dir_ + "/data.bin";
  ASSERT_TRUE(storage_->Write(path, bytes, {}, deadline()).ok());
  auto read = storage_->Read(path, 0, -1, deadline());
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), bytes.size());
  EXPECT_TRUE(std::equal(read->begin(), read->end(), bytes.begin(),
                         [](uint8_t a, char b) { return a == static_cast<uint8_t>(b); }));
  auto part = storage_->Read(path, 1000, 300, deadline());
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(std::string(part->begin(), part->end()), bytes.substr(1000, 300));
  auto info = storage_->Stat(path, deadline());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->size_bytes, static_cast<int64_t>(bytes.size()));
}

TEST_F(WebHdfsStorageTest, CreateAndOpenGoThroughTheDatanodeRedirect) {
  const std::string path = dir_ + "/f";
  ASSERT_TRUE(storage_->Write(path, "payload", {}, deadline()).ok());
  EXPECT_EQ(CountRequests("namenode", "CREATE"), 1);
  EXPECT_EQ(CountRequests("datanode", "CREATE"), 1);
  auto read = storage_->Read(path, 0, -1, deadline());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(std::string(read->begin(), read->end()), "payload");
  EXPECT_EQ(CountRequests("namenode", "OPEN"), 1);
  EXPECT_EQ(CountRequests("datanode", "OPEN"), 1);
  for (const auto& entry : server_->RequestLog()) {
    EXPECT_EQ(entry["query"].value("user.name", ""), "tester") << entry.dump();
  }
}

TEST_F(WebHdfsStorageTest, WriteWithoutOverwriteRefusesAnExistingFile) {
  const std::string path = dir_ + "/f";
  ASSERT_TRUE(storage_->Write(path, "one", {}, deadline()).ok());
  Status second = storage_->Write(path, "two", {}, deadline());
  EXPECT_EQ(second.code(), StatusCode::kAlreadyExists) << second;
  EXPECT_NE(second.message().find("FileAlreadyExistsException"), std::string::npos) << second;
  WriteOptions overwrite;
  overwrite.overwrite = true;
  ASSERT_TRUE(storage_->Write(path, "three", overwrite, deadline()).ok());
  auto read = storage_->Read(path, 0, -1, deadline());
  EXPECT_EQ(std::string(read->begin(), read->end()), "three");
}

TEST_F(WebHdfsStorageTest, MakeDirsListStatAndDelete) {
  ASSERT_TRUE(storage_->MakeDirs(dir_ + "/a/b", deadline()).ok());
  ASSERT_TRUE(storage_->Write(dir_ + "/a/x", "12345", {}, deadline()).ok());
  auto entries = storage_->List(dir_ + "/a", deadline());
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].name, "b");
  EXPECT_TRUE((*entries)[0].is_dir);
  EXPECT_EQ((*entries)[1].name, "x");
  EXPECT_EQ((*entries)[1].size_bytes, 5);
  auto info = storage_->Stat(dir_ + "/a/b", deadline());
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->is_dir);
  EXPECT_EQ(storage_->List(dir_ + "/a/x", deadline()).status().code(),
            StatusCode::kFailedPrecondition);
  Status not_empty = storage_->Delete(dir_ + "/a", /*recursive=*/false, deadline());
  EXPECT_EQ(not_empty.code(), StatusCode::kFailedPrecondition) << not_empty;
  ASSERT_TRUE(storage_->Delete(dir_ + "/a", /*recursive=*/true, deadline()).ok());
  EXPECT_EQ(storage_->Stat(dir_ + "/a", deadline()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(storage_->Delete(dir_ + "/a", true, deadline()).code(), StatusCode::kNotFound);
}

TEST_F(WebHdfsStorageTest, MissingFileIsNotFoundNamingThePath) {
  auto read = storage_->Read(dir_ + "/absent.bin", 0, -1, deadline());
  EXPECT_EQ(read.status().code(), StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find(dir_ + "/absent.bin"), std::string::npos) << read.status();
  EXPECT_NE(read.status().message().find("FileNotFoundException"), std::string::npos);
}

TEST_F(WebHdfsStorageTest, RenameMovesAndRefusalsBecomeClearErrors) {
  ASSERT_TRUE(storage_->Write(dir_ + "/tmp/f", "x", {}, deadline()).ok());
  ASSERT_TRUE(storage_->MakeDirs(dir_ + "/taken", deadline()).ok());
  // HDFS would move tmp into taken/; the Storage contract refuses.
  EXPECT_EQ(storage_->Rename(dir_ + "/tmp", dir_ + "/taken", deadline()).code(),
            StatusCode::kAlreadyExists);
  EXPECT_TRUE(storage_->Stat(dir_ + "/tmp/f", deadline()).ok());
  ASSERT_TRUE(storage_->Rename(dir_ + "/tmp", dir_ + "/final", deadline()).ok());
  EXPECT_TRUE(storage_->Stat(dir_ + "/final/f", deadline()).ok());
  // The namenode answers {"boolean": false} for these; the client says why.
  Status missing = storage_->Rename(dir_ + "/nope", dir_ + "/other", deadline());
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find("boolean false"), std::string::npos) << missing;
  Status no_parent = storage_->Rename(dir_ + "/final", dir_ + "/no/such/parent", deadline());
  EXPECT_EQ(no_parent.code(), StatusCode::kNotFound) << no_parent;
  EXPECT_NE(no_parent.message().find("parent"), std::string::npos) << no_parent;
}

TEST_F(WebHdfsStorageTest, AccessControlExceptionIsPermissionDenied) {
  ASSERT_TRUE(server_->Admin("/deny?path=" + dir_ + "/secret").ok());
  Status status = storage_->Write(dir_ + "/secret/f", "x", {}, deadline());
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  EXPECT_NE(status.message().find("Permission denied"), std::string::npos) << status;
}

TEST_F(WebHdfsStorageTest, UnavailableNamenodeIsRetriedUntilItAnswers) {
  ASSERT_TRUE(storage_->Write(dir_ + "/f", "x", {}, deadline()).ok());
  ASSERT_TRUE(server_->Admin("/fault?target=namenode&kind=unavailable&count=3").ok());
  auto info = storage_->Stat(dir_ + "/f", deadline());
  EXPECT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(CountRequests("namenode", "GETFILESTATUS"), 4);
}

TEST_F(WebHdfsStorageTest, RefusedConnectionsForAWhileThenWriteSucceeds) {
  ASSERT_TRUE(server_->Admin("/fault?target=namenode&kind=refuse&ms=400").ok());
  ASSERT_TRUE(server_->Admin("/fault?target=datanode&kind=unavailable&count=2").ok());
  const std::string path = dir_ + "/f";
  Status status = storage_->Write(path, "after the outage", {}, deadline());
  ASSERT_TRUE(status.ok()) << status;
  auto read = storage_->Read(path, 0, -1, deadline());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(std::string(read->begin(), read->end()), "after the outage");
}

TEST_F(WebHdfsStorageTest, DownPastTheDeadlineFailsWithinTheDeadline) {
  ASSERT_TRUE(server_->Admin("/fault?target=namenode&kind=unavailable&ms=5000").ok());
  const double start = MonotonicSeconds();
  auto info = storage_->Stat(dir_ + "/f", Deadline::AfterMs(500));
  const double elapsed = MonotonicSeconds() - start;
  EXPECT_EQ(info.status().code(), StatusCode::kDeadlineExceeded) << info.status();
  EXPECT_NE(info.status().message().find("RetriableException"), std::string::npos) << info.status();
  EXPECT_LT(elapsed, 2.0);
  ASSERT_TRUE(server_->Admin("/clear").ok());
}

TEST_F(WebHdfsStorageTest, SlowResponseIsCutAtTheDeadline) {
  ASSERT_TRUE(server_->Admin("/fault?target=namenode&kind=slow&ms=3000&count=1").ok());
  const double start = MonotonicSeconds();
  auto info = storage_->Stat(dir_ + "/f", Deadline::AfterMs(300));
  EXPECT_EQ(info.status().code(), StatusCode::kDeadlineExceeded) << info.status();
  EXPECT_LT(MonotonicSeconds() - start, 1.5);
}

TEST_F(WebHdfsStorageTest, TransferCutShortIsRetriedAndNeverReturnsShortData) {
  const std::string bytes = PatternBytes(256 * 1024);
  const std::string path = dir_ + "/f";
  ASSERT_TRUE(storage_->Write(path, bytes, {}, deadline()).ok());
  ASSERT_TRUE(server_->Admin("/clear").ok());
  ASSERT_TRUE(server_->Admin("/fault?target=datanode&kind=truncate&count=1").ok());
  auto read = storage_->Read(path, 0, -1, deadline());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->size(), bytes.size());
  EXPECT_EQ(CountRequests("datanode", "OPEN"), 2);
}

TEST_F(WebHdfsStorageTest, TransferAlwaysCutShortIsAnError) {
  const std::string path = dir_ + "/f";
  ASSERT_TRUE(storage_->Write(path, PatternBytes(64 * 1024), {}, deadline()).ok());
  ASSERT_TRUE(server_->Admin("/fault?target=datanode&kind=truncate&count=1000").ok());
  auto read = storage_->Read(path, 0, -1, Deadline::AfterMs(700));
  EXPECT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("cut short"), std::string::npos) << read.status();
  ASSERT_TRUE(server_->Admin("/clear").ok());
}

}  // namespace
}  // namespace lockstep::checkpoint
