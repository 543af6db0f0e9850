#include "cli/summary.h"

#include <dirent.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/support/process/process.h"

namespace lockstep::cli {
namespace {

using lockstep::testing::MakeTempDir;
using lockstep::testing::ReadFile;

RunSummary ExampleSummary() {
  RunSummary summary;
  summary.job = "default/digits";
  summary.status = "succeeded";
  summary.steps = 600;
  summary.total_steps = 600;
  summary.world_size = 2;
  summary.final_loss = 0.05;
  summary.eval_accuracy = 0.981;
  summary.samples_per_second = 12000;
  summary.generations = 1;
  summary.wall_seconds = 4.2;
  summary.log_dir = "/tmp/logs";
  return summary;
}

TEST(SummaryTest, SummaryFileHoldsEveryContractField) {
  const std::string path = MakeTempDir("summary") + "/run.json";
  ASSERT_TRUE(WriteSummaryFile(ExampleSummary(), path).ok());
  nlohmann::json json = nlohmann::json::parse(ReadFile(path));
  for (const char* key :
       {"steps", "world_size", "final_loss", "eval_accuracy", "samples_per_second", "restarts",
        "generations", "resumed_from_step", "recovery_seconds", "wall_seconds", "job"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  EXPECT_EQ(json["steps"], 600);
  EXPECT_EQ(json["job"], "default/digits");
  EXPECT_EQ(json["resumed_from_step"], -1);
  EXPECT_EQ(json["recovery_seconds"], 0);
  EXPECT_DOUBLE_EQ(json["eval_accuracy"].get<double>(), 0.981);
  EXPECT_FALSE(json.contains("failed_worker"));
}

TEST(SummaryTest, RewritingReplacesTheFileAndLeavesNoTemporaryBehind) {
  const std::string dir = MakeTempDir("summary");
  const std::string path = dir + "/run.json";
  RunSummary summary = ExampleSummary();
  ASSERT_TRUE(WriteSummaryFile(summary, path).ok());
  summary.steps = 7;
  ASSERT_TRUE(WriteSummaryFile(summary, path).ok());
  EXPECT_EQ(nlohmann::json::parse(ReadFile(path))["steps"], 7);
  int entries = 0;
  DIR* listing = opendir(dir.c_str());
  while (dirent* entry = readdir(listing)) entries += entry->d_name[0] == '.' ? 0 : 1;
  closedir(listing);
  EXPECT_EQ(entries, 1);
}

TEST(SummaryTest, WriteIntoMissingDirectoryNamesThePath) {
  Status status = WriteSummaryFile(ExampleSummary(), "/nonexistent-dir/run.json");
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("/nonexistent-dir/run.json"), std::string::npos) << status;
}

TEST(SummaryTest, AnExecJobsUnreportedFieldsAreNullAndLeftOutOfTheBlock) {
  RunSummary summary = ExampleSummary();
  summary.mode = "exec";
  summary.steps.reset();
  summary.total_steps = 0;
  summary.final_loss.reset();
  summary.eval_accuracy.reset();
  summary.samples_per_second.reset();
  summary.resumed_from_step.reset();
  summary.restarts = 1;
  const nlohmann::json json = ToJson(summary);
  for (const char* key : {"steps", "total_steps", "final_loss", "eval_accuracy",
                          "samples_per_second", "resumed_from_step"}) {
    ASSERT_TRUE(json.contains(key)) << key << ": the contract's keys stay";
    EXPECT_TRUE(json[key].is_null()) << key << " is " << json[key];
  }
  EXPECT_EQ(json["restarts"], 1);
  EXPECT_EQ(json["mode"], "exec");
  std::ostringstream out;
  PrintResultBlock(summary, out);
  const std::string text = out.str();
  for (const char* label : {"steps ", "test accuracy", "final loss", "samples/s"}) {
    EXPECT_EQ(text.find(label), std::string::npos) << label << " in\n" << text;
  }
  EXPECT_NE(text.find("not reported by the program"), std::string::npos) << text;
  EXPECT_NE(text.find("restarts 1"), std::string::npos) << text;
}

TEST(SummaryTest, ResultBlockShowsStepsAccuracyRateAndWallTime) {
  std::ostringstream out;
  PrintResultBlock(ExampleSummary(), out);
  const std::string text = out.str();
  EXPECT_NE(text.find("default/digits succeeded"), std::string::npos) << text;
  EXPECT_NE(text.find("600 / 600"), std::string::npos) << text;
  EXPECT_NE(text.find("98.10%"), std::string::npos) << text;
  EXPECT_NE(text.find("12000"), std::string::npos) << text;
  EXPECT_NE(text.find("4.2s"), std::string::npos) << text;
}

TEST(SummaryTest, FormatDurationPicksTheUnit) {
  EXPECT_EQ(FormatDuration(12.34), "12.3s");
  EXPECT_EQ(FormatDuration(245), "4m 05s");
  EXPECT_EQ(FormatDuration(3723), "1h 02m 03s");
}

}  // namespace
}  // namespace lockstep::cli
