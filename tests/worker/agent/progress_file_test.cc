// Reading the progress lines a program appends to LOCKSTEP_PROGRESS_FILE.
#include "worker/agent/progress_file.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/support/process/process.h"

namespace lockstep::agent {
namespace {

void Append(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::app);
  file << text;
}

TEST(ProgressFile, ParsesTheDocumentedFields) {
  auto line = ParseProgressLine(R"({"step": 12, "samples": 768, "loss": 0.5, "total_steps": 100,
                                    "extra": "ignored"})");
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->step, 12);
  EXPECT_EQ(line->samples, 768);
  EXPECT_TRUE(line->has_loss);
  EXPECT_DOUBLE_EQ(line->loss, 0.5);
  EXPECT_EQ(line->total_steps, 100);
  EXPECT_FALSE(ParseProgressLine(R"({"loss": 1})").has_value());
  EXPECT_FALSE(ParseProgressLine("step 3").has_value());
}

TEST(ProgressFile, ReturnsTheNewestCompleteLineOnce) {
  const std::string dir = testing::MakeTempDir("progress");
  const std::string path = dir + "/progress.jsonl";
  ProgressFileReader reader(path);
  EXPECT_FALSE(reader.ReadNew().has_value()) << "a missing file is no progress";
  Append(path, "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3");
  auto first = reader.ReadNew();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->step, 2) << "the partial line waits for its newline";
  EXPECT_FALSE(reader.ReadNew().has_value());
  Append(path, "}\nnot json\n");
  auto second = reader.ReadNew();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->step, 3);
  EXPECT_EQ(reader.invalid_lines(), 1);
}

TEST(ProgressFile, ReadsATruncatedFileFromItsStart) {
  const std::string dir = testing::MakeTempDir("progress");
  const std::string path = dir + "/progress.jsonl";
  ProgressFileReader reader(path);
  Append(path, "{\"step\": 10, \"samples\": 640}\n{\"step\": 11, \"samples\": 704}\n");
  ASSERT_EQ(reader.ReadNew()->step, 11);
  testing::WriteFile(path, "{\"step\": 5}\n");
  auto line = reader.ReadNew();
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->step, 5);
}

}  // namespace
}  // namespace lockstep::agent
