// Click logs in files (worker/ps/click_log_file.h): what lockstep-click-log writes reads back as
// the same samples, and a file that is not a click log is refused naming the line.
#include "worker/ps/click_log_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

namespace lockstep::ps {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "click-" + std::to_string(getpid()) + "-" + name;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

TEST(ClickLogFileTest, AWrittenLogReadsBackAsTheSameSamplesPlainOrGzip) {
  ClickLogSpec spec;
  spec.samples = 500;
  spec.fields = 4;
  spec.vocabulary = 50;
  const ClickLog log = GenerateClickLog(spec);
  for (const std::string name : {"log.tsv", "log.tsv.gz"}) {
    const std::string path = TempPath(name);
    ASSERT_TRUE(WriteClickLogFile(log, path).ok());
    StatusOr<ClickLog> read = ReadClickLogFile("spec.trainer.data.train[0]", path, 4);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->samples, 500);
    EXPECT_EQ(read->labels, log.labels);
    // The features come back hashed from their text: the same feature is the same id, distinct
    // ones distinct, each in its own field.
    std::map<uint64_t, uint64_t> id_of;
    for (size_t i = 0; i < log.ids.size(); ++i) {
      EXPECT_EQ(read->ids[i] >> 40, log.ids[i] >> 40);
      auto [it, added] = id_of.emplace(log.ids[i], read->ids[i]);
      EXPECT_EQ(it->second, read->ids[i]) << "sample " << i / 4;
    }
    std::map<uint64_t, int> distinct;
    for (const auto& [original, hashed] : id_of) ++distinct[hashed];
    EXPECT_EQ(distinct.size(), id_of.size());
    std::remove(path.c_str());
  }
}

TEST(ClickLogFileTest, TheSameTextInTwoFieldsIsTwoFeatures) {
  const std::string path = TempPath("fields.tsv");
  Write(path, "1\tabc\tabc\n0\t\tabc\n");
  StatusOr<ClickLog> read = ReadClickLogFile("data", path, 2);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->labels, (std::vector<int32_t>{1, 0}));
  EXPECT_NE(read->ids[0], read->ids[1]);
  EXPECT_EQ(read->ids[1], read->ids[3]);
  EXPECT_EQ(read->ids[1], ClickFeatureId(1, "abc"));
  EXPECT_EQ(read->ids[2], ClickFeatureId(0, ""));  // a missing feature is a feature too
  std::remove(path.c_str());
}

TEST(ClickLogFileTest, AFileThatIsNotAClickLogIsRefusedNamingTheFieldFileAndLine) {
  const std::string path = TempPath("bad.tsv");
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {"1\ta\tb\n2\ta\tb\n", "line 2: label \"2\" is not 0 or 1"},
           {"1\ta\tb\n\n0\ta\n", "line 3: 1 features, but model.embedding.fields is 2"},
           {"1\ta\tb\tc\n", "line 1: 3 features, but model.embedding.fields is 2"},
           {"", "holds no samples"},
           {"yes\ta\tb\n", "line 1: label \"yes\" is not 0 or 1"}}) {
    Write(path, text);
    StatusOr<ClickLog> read = ReadClickLogFile("spec.trainer.data.train[0]", path, 2);
    ASSERT_FALSE(read.ok()) << text;
    EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(read.status().message().find("spec.trainer.data.train[0]: " + path + ": " + expected),
              std::string::npos)
        << read.status();
  }
  std::remove(path.c_str());
  StatusOr<ClickLog> missing = ReadClickLogFile("spec.trainer.data.test[0]", path, 2);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status();
}

}  // namespace
}  // namespace lockstep::ps
