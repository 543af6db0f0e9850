#include "worker/checkpoint/ckpt_command.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <sstream>
#include <thread>

#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/storage/local/local_storage.h"

namespace lockstep::checkpoint {
namespace {

class CkptCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/ckpt-command-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    root_ = pattern;
    for (int64_t step : {100, 200}) {
      CheckpointState state;
      state.step = step;
      state.tensors.push_back({"w", "u8", {64}, std::vector<uint8_t>(64, 7)});
      CheckpointWriter writer(storage_, root_, 0, 1, {});
      ASSERT_TRUE(writer.Write(state, Deadline::AfterMs(10000)).ok());
    }
  }
  void TearDown() override { (void)storage_.Delete(root_, true, Deadline::AfterMs(10000)); }
  int Run(std::vector<std::string> args) {
    out_.str("");
    err_.str("");
    return RunCkptCommand(args, out_, err_);
  }

  LocalStorage storage_;
  std::string root_;
  std::ostringstream out_;
  std::ostringstream err_;
};

TEST_F(CkptCommandTest, LsListsEveryCheckpointWithItsState) {
  EXPECT_EQ(Run({"ls", "file://" + root_}), 0) << err_.str();
  EXPECT_NE(out_.str().find("100"), std::string::npos);
  EXPECT_NE(out_.str().find("200"), std::string::npos);
  EXPECT_NE(out_.str().find("valid"), std::string::npos);
}

TEST_F(CkptCommandTest, LsSaysHowManyPipelineStagesWroteEachCheckpoint) {
  // Step 300 written by a pipeline of two stages, each its own tensors.
  CheckpointState stages[2];
  CheckpointWriterOptions options;
  for (int s = 0; s < 2; ++s) {
    stages[s].step = 300;
    stages[s].tensors.push_back({"layers." + std::to_string(s) + ".weight",
                                 "u8",
                                 {32},
                                 std::vector<uint8_t>(32, static_cast<uint8_t>(s))});
    options.parts.push_back(TensorTable(stages[s]));
  }
  Status written[2];
  std::thread stage1([&] {
    written[1] =
        CheckpointWriter(storage_, root_, 1, 2, options).Write(stages[1], Deadline::AfterMs(10000));
  });
  written[0] =
      CheckpointWriter(storage_, root_, 0, 2, options).Write(stages[0], Deadline::AfterMs(10000));
  stage1.join();
  ASSERT_TRUE(written[0].ok() && written[1].ok()) << written[0] << " " << written[1];
  EXPECT_EQ(Run({"ls", root_}), 0) << err_.str();
  std::istringstream lines(out_.str());
  std::string header, line, last;
  std::getline(lines, header);
  EXPECT_NE(header.find("WORLD STAGES"), std::string::npos) << header;
  while (std::getline(lines, line)) last = line;
  std::istringstream fields(last);
  std::string step, state, world, stage_count;
  fields >> step >> state >> world >> stage_count;
  EXPECT_EQ(step, "300");
  EXPECT_EQ(state, "valid");
  EXPECT_EQ(world, "2");
  EXPECT_EQ(stage_count, "2");
  EXPECT_EQ(Run({"verify", root_}), 0) << err_.str();
}

TEST_F(CkptCommandTest, VerifyExitsOneNamingTheDamage) {
  EXPECT_EQ(Run({"verify", root_}), 0) << err_.str();
  ASSERT_TRUE(
      storage_
          .Delete(root_ + "/step-000000000200/shard-0-of-1.bin", false, Deadline::AfterMs(10000))
          .ok());
  EXPECT_EQ(Run({"verify", root_}), 1);
  EXPECT_NE(err_.str().find("step-000000000200: missing shard-0-of-1.bin"), std::string::npos)
      << err_.str();
  EXPECT_EQ(Run({"verify", root_, "--step", "100"}), 0) << err_.str();
  EXPECT_EQ(Run({"ls", root_}), 0);
  EXPECT_NE(out_.str().find("damaged"), std::string::npos);
}

TEST_F(CkptCommandTest, UsageAndBadUrisExitTwo) {
  EXPECT_EQ(Run({}), 2);
  EXPECT_EQ(Run({"verify"}), 2);
  EXPECT_EQ(Run({"verify", "s3://bucket/x"}), 2);
  EXPECT_EQ(Run({"verify", root_, "--step", "abc"}), 2);
  EXPECT_EQ(Run({"frobnicate", root_}), 2);
}

}  // namespace
}  // namespace lockstep::checkpoint
