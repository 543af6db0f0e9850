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

TEST(ProgressFile, ALineLongerThanTheBoundIsDroppedWithoutBeingHeld) {
  const std::string dir = testing::MakeTempDir("progress");
  const std::string path = dir + "/progress.jsonl";
  ProgressFileReader reader(path);
  // A program that prints without newlines into the file: never held whole, counted once.
  const std::string chunk(48 << 10, 'x');
  Append(path, "{\"step\": 1}\n" + chunk);
  EXPECT_EQ(reader.ReadNew()->step, 1);
  Append(path, chunk);
  EXPECT_FALSE(reader.ReadNew().has_value());
  Append(path, chunk + "{\"step\": 99}\n{\"step\": 2}\n");
  auto line = reader.ReadNew();
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->step, 2) << "the tail of the long line is not taken for progress";
  EXPECT_EQ(reader.invalid_lines(), 1);
}

ProgressLine Line(int64_t step, int64_t samples, double compute_seconds, double time) {
  ProgressLine line;
  line.step = step;
  line.samples = samples;
  line.compute_seconds = compute_seconds;
  line.time = time;
  return line;
}

TEST(ProgressTracker, RatesComeFromTheLinesOwnTimes) {
  ProgressTracker tracker;
  rendezvous::ProgressReport report = tracker.Update(Line(10, 640, 4.0, 1000.0), 5.0);
  EXPECT_EQ(report.step, 10);
  EXPECT_EQ(report.samples_per_second, 0) << "one line gives no rate";
  EXPECT_FALSE(report.has_loss) << "no loss reported yet";
  // Read 0.1 s later, written 2 s later: the lines' times count.
  report = tracker.Update(Line(20, 1280, 5.5, 1002.0), 5.1);
  EXPECT_DOUBLE_EQ(report.samples_per_second, 320.0);
  EXPECT_DOUBLE_EQ(report.scaling_efficiency, 0.75);
  EXPECT_DOUBLE_EQ(report.comm_exposed_fraction, 0.25);
}

TEST(ProgressTracker, EachCountKeepsItsOwnLastReading) {
  ProgressTracker tracker;
  tracker.Update(Line(10, 640, -1, 1000.0), 0);
  tracker.Update(Line(11, -1, -1, 1001.0), 0);  // a line without samples
  const rendezvous::ProgressReport report = tracker.Update(Line(12, 768, -1, 1002.0), 0);
  EXPECT_DOUBLE_EQ(report.samples_per_second, 64.0) << "from the line two back, which had them";
}

TEST(ProgressTracker, WithoutTimesTheReadingTimesCountAndANewProcessStartsAfresh) {
  ProgressTracker tracker;
  tracker.Update(Line(10, 640, -1, -1), 5.0);
  rendezvous::ProgressReport report = tracker.Update(Line(20, 1280, -1, -1), 7.0);
  EXPECT_DOUBLE_EQ(report.samples_per_second, 320.0);
  EXPECT_EQ(report.scaling_efficiency, 0) << "no compute_seconds: no efficiency";
  // A restarted program resumes from its checkpoint: its counts are not compared with the
  // last process's, so no rate from them (the old rate stays until a new one is known).
  tracker.StartProcess();
  tracker.SetRestarts(1);
  report = tracker.Update(Line(12, 768, -1, -1), 8.0);
  EXPECT_DOUBLE_EQ(report.samples_per_second, 320.0);
  EXPECT_EQ(report.restarts, 1);
  report = tracker.Update(Line(22, 1408, -1, -1), 9.0);
  EXPECT_DOUBLE_EQ(report.samples_per_second, 640.0);
}

}  // namespace
}  // namespace lockstep::agent
