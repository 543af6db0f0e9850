#include "cli/progress_display.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>

namespace lockstep::cli {
namespace {

ProgressSample Training(int64_t step) {
  ProgressSample sample;
  sample.step = step;
  sample.total_steps = 1000;
  sample.loss = 0.5;
  sample.samples_per_second = 2560;
  sample.world_size = 4;
  sample.generation = 1;
  sample.workers_running = 4;
  return sample;
}

TEST(ProgressDisplayTest, LineShowsStepPercentLossRateWorldAndGeneration) {
  const std::string line = ProgressDisplay::FormatLine(Training(250), /*steps_per_second=*/10);
  EXPECT_NE(line.find("step 250/1000"), std::string::npos) << line;
  EXPECT_NE(line.find("25.0%"), std::string::npos) << line;
  EXPECT_NE(line.find("loss 0.5000"), std::string::npos) << line;
  EXPECT_NE(line.find("2560 samples/s"), std::string::npos) << line;
  EXPECT_NE(line.find("1m 15s left"), std::string::npos) << line;  // 750 steps at 10/s
  EXPECT_NE(line.find("world 4"), std::string::npos) << line;
  EXPECT_NE(line.find("gen 1"), std::string::npos) << line;
}

TEST(ProgressDisplayTest, LineShowsRestartsAndReforming) {
  ProgressSample sample = Training(250);
  EXPECT_EQ(ProgressDisplay::FormatLine(sample, -1).find("restarts"), std::string::npos);
  sample.restarts = 2;
  sample.generation_active = false;
  const std::string line = ProgressDisplay::FormatLine(sample, -1);
  EXPECT_NE(line.find("restarts 2"), std::string::npos) << line;
  EXPECT_NE(line.find("re-forming"), std::string::npos) << line;
}

TEST(ProgressDisplayTest, AnExecProgramsLineShowsOnlyWhatItReported) {
  ProgressSample sample = Training(0);
  sample.steps_reported = false;
  sample.elapsed_seconds = 65;
  std::string line = ProgressDisplay::FormatLine(sample, -1);
  EXPECT_EQ(line.rfind("running 1m 05s (no progress reported)", 0), 0u) << line;
  EXPECT_EQ(line.find("step"), std::string::npos) << line;
  sample = Training(250);
  sample.has_loss = false;
  sample.samples_per_second = 0;
  line = ProgressDisplay::FormatLine(sample, -1);
  EXPECT_NE(line.find("step 250/1000"), std::string::npos) << line;
  EXPECT_EQ(line.find("loss"), std::string::npos) << line;
  EXPECT_EQ(line.find("samples/s"), std::string::npos) << line;
}

TEST(ProgressDisplayTest, WorldSizeChangesAreWrittenAsTheyHappen) {
  std::ostringstream out;
  ProgressDisplayOptions options;
  options.plain_interval_ms = 1000000;  // only the world size lines, no periodic ones
  ProgressDisplay display(out, options);
  ProgressSample sample = Training(10);
  sample.world_size = 3;
  display.Update(sample, 0.0);
  sample.generation = 2;
  sample.world_size = 2;
  display.Update(sample, 0.1);
  sample.generation = 3;
  sample.world_size = 3;
  display.Update(sample, 0.2);
  EXPECT_NE(out.str().find("world size 3 -> 2 (generation 2)"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("world size 2 -> 3 (generation 3)"), std::string::npos) << out.str();
}

TEST(ProgressDisplayTest, BeforeTheFirstGenerationItSaysItIsWaiting) {
  ProgressSample sample;
  sample.workers_running = 2;
  const std::string line = ProgressDisplay::FormatLine(sample, -1);
  EXPECT_NE(line.find("waiting"), std::string::npos) << line;
}

TEST(ProgressDisplayTest, TerminalRedrawsOneLineInPlace) {
  std::ostringstream out;
  ProgressDisplayOptions options;
  options.tty = true;
  ProgressDisplay display(out, options);
  display.Update(Training(10), 100.0);
  display.Update(Training(20), 100.3);
  display.Update(Training(30), 100.35);  // within the redraw period: not drawn
  display.Clear();
  const std::string text = out.str();
  EXPECT_EQ(text.find('\n'), std::string::npos) << "a terminal display never scrolls";
  EXPECT_EQ(std::count(text.begin(), text.end(), '\r'), 3);  // two draws and the clear
  EXPECT_NE(text.find("\033[K"), std::string::npos);
  EXPECT_NE(text.find("step 20/1000"), std::string::npos);
  EXPECT_EQ(text.find("step 30/1000"), std::string::npos);
}

TEST(ProgressDisplayTest, TerminalLineIsCutToTheWidth) {
  std::ostringstream out;
  ProgressDisplayOptions options;
  options.tty = true;
  options.columns = 20;
  ProgressDisplay display(out, options);
  display.Update(Training(10), 1.0);
  const std::string text = out.str();
  // "\r" + 19 columns + "\033[K"
  EXPECT_EQ(text.size(), 1u + 19u + 3u) << text;
}

TEST(ProgressDisplayTest, PlainOutputPrintsOneLinePerPeriod) {
  std::ostringstream out;
  ProgressDisplayOptions options;
  options.tty = false;
  options.plain_interval_ms = 5000;
  ProgressDisplay display(out, options);
  for (int i = 0; i <= 40; ++i) display.Update(Training(i * 10), 100.0 + i * 0.25);  // 10 s
  const std::string text = out.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3) << text;  // at 0 s, 5 s, 10 s
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find('\033'), std::string::npos);
}

TEST(ProgressDisplayTest, TimeLeftFollowsTheRecentStepRate) {
  std::ostringstream out;
  ProgressDisplay display(out, {});
  EXPECT_LT(display.StepsPerSecond(), 0) << "unknown before any progress";
  for (int i = 0; i <= 8; ++i) display.Update(Training(i * 20), 10.0 + i * 0.5);  // 40 steps/s
  EXPECT_NEAR(display.StepsPerSecond(), 40.0, 1e-9);
}

}  // namespace
}  // namespace lockstep::cli
