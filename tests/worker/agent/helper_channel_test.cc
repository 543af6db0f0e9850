// The agent's end of the helper channel (helper_channel.h): what the Python helper says reaches
// the agent's loop, what the agent says reaches the program, and a program that breaks the
// protocol is cut off instead of growing the agent's memory.
#include "worker/agent/helper_channel.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/process/poll_until.h"
#include "worker/agent/wake_pipe.h"

namespace lockstep::agent {
namespace {

using lockstep::testing::PollUntil;

class HelperChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(InstallWakePipe({}).ok());
    StatusOr<HelperChannel::Pair> pair = HelperChannel::Create();
    ASSERT_TRUE(pair.ok()) << pair.status();
    channel_ = std::move(pair->channel);
    program_fd_ = pair->program_fd;
  }
  void TearDown() override {
    if (program_fd_ >= 0) close(program_fd_);
  }
  void ProgramWrites(const std::string& text) {
    ASSERT_EQ(write(program_fd_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  std::string ProgramReadsLine() {
    std::string line;
    char c;
    while (read(program_fd_, &c, 1) == 1 && c != '\n') line += c;
    return line;
  }

  std::unique_ptr<HelperChannel> channel_;
  int program_fd_ = -1;
};

TEST_F(HelperChannelTest, TheHelpersMessagesArriveInOrder) {
  ProgramWrites("{\"type\":\"hello\",\"protocol\":1,\"pid\":7}\n{\"type\":\"training\",");
  ProgramWrites("\"generation\":2,\"step\":30}\n{\"type\":\"left\",\"generation\":2}\n");
  std::vector<HelperMessage> got;
  ASSERT_TRUE(PollUntil(
      [&] {
        for (const HelperMessage& m : channel_->Drain()) got.push_back(m);
        return got.size() >= 3;
      },
      5000, 5));
  EXPECT_EQ(got[0].type, HelperMessage::Type::kHello);
  EXPECT_EQ(got[1].type, HelperMessage::Type::kTraining);
  EXPECT_EQ(got[1].generation, 2);
  EXPECT_EQ(got[1].step, 30);
  EXPECT_EQ(got[2].type, HelperMessage::Type::kLeft);
  EXPECT_FALSE(channel_->closed());
}

TEST_F(HelperChannelTest, TheAssignmentCarriesTheGenerationAndTheCommandsVariables) {
  rendezvous::Assignment a;
  a.generation = 5;
  a.rank = 2;
  a.world_size = 4;
  GenerationPlan plan;
  plan.master_addr = "10.0.0.3";
  plan.master_port = 29500;
  plan.restart_count = 1;
  ASSERT_TRUE(channel_->Send(EncodeAssignment(a, plan, {{"RANK", "2"}})).ok());
  ASSERT_TRUE(channel_->Send(EncodeGenerationEnded(5)).ok());
  const nlohmann::json assign = nlohmann::json::parse(ProgramReadsLine());
  EXPECT_EQ(assign["type"], "assign");
  EXPECT_EQ(assign["generation"], 5);
  EXPECT_EQ(assign["rank"], 2);
  EXPECT_EQ(assign["world_size"], 4);
  EXPECT_EQ(assign["master_addr"], "10.0.0.3");
  EXPECT_EQ(assign["master_port"], 29500);
  EXPECT_EQ(assign["env"]["RANK"], "2");
  EXPECT_EQ(nlohmann::json::parse(ProgramReadsLine())["type"], "ended");
}

TEST_F(HelperChannelTest, AMalformedMessageClosesTheChannelNamingWhatIsWrong) {
  ProgramWrites("{\"type\":\"training\",\"generation\":-1,\"step\":3}\n");
  ASSERT_TRUE(PollUntil([&] { return channel_->closed(); }, 5000, 5));
  EXPECT_NE(channel_->error().find("generation"), std::string::npos) << channel_->error();
}

TEST_F(HelperChannelTest, ALineWithoutEndIsCutOffAtTheBound) {
  const std::string chunk(8192, 'x');
  for (size_t sent = 0; sent <= kMaxHelperLineBytes && !channel_->closed(); sent += chunk.size()) {
    if (write(program_fd_, chunk.data(), chunk.size()) < 0) break;
  }
  ASSERT_TRUE(PollUntil([&] { return channel_->closed(); }, 5000, 5));
  EXPECT_NE(channel_->error().find("longer than"), std::string::npos) << channel_->error();
}

TEST_F(HelperChannelTest, TheProgramsExitClosesTheChannel) {
  close(program_fd_);
  program_fd_ = -1;
  ASSERT_TRUE(PollUntil([&] { return channel_->closed(); }, 5000, 5));
  EXPECT_EQ(channel_->error(), "");
  EXPECT_FALSE(channel_->Send("{}").ok());
}

TEST(HelperMessage, UnknownTypesAndNonObjectsAreRefused) {
  EXPECT_FALSE(ParseHelperMessage("[1]").ok());
  EXPECT_FALSE(ParseHelperMessage("{\"type\":\"reboot\"}").ok());
  EXPECT_FALSE(ParseHelperMessage("{\"type\":\"left\"}").ok());
  EXPECT_TRUE(ParseHelperMessage("{\"type\":\"hello\"}").ok());
}

TEST(HelperMessage, AProgramThatAskedForItsRankTooEarlySaysWhichVariable) {
  StatusOr<HelperMessage> message =
      ParseHelperMessage("{\"type\":\"awaiting\",\"variable\":\"RANK\"}");
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(message->type, HelperMessage::Type::kAwaiting);
  EXPECT_EQ(message->variable, "RANK");
  EXPECT_FALSE(ParseHelperMessage("{\"type\":\"awaiting\"}").ok());
  EXPECT_FALSE(ParseHelperMessage("{\"type\":\"awaiting\",\"variable\":7}").ok());
}

}  // namespace
}  // namespace lockstep::agent
