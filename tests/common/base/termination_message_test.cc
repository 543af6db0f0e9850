// The termination message file (common/termination_message.h): written and read as the kubelet
// reads it, at most 4096 bytes, never cut inside a UTF-8 character.
#include "common/termination_message.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace lockstep {
namespace {

std::string TempPath() {
  return ::testing::TempDir() + "/termination-" + std::to_string(getpid());
}

TEST(TerminationMessageTest, ALongMessageIsCutToWhatTheKubeletReadsAtACharacterBoundary) {
  const std::string path = TempPath();
  // 4095 ASCII bytes, then a two-byte character across the 4096-byte bound.
  const std::string message = std::string(4095, 'a') + "\xc3\xa9" + "tail";
  ASSERT_TRUE(WriteTerminationMessage(path, message).ok());
  EXPECT_EQ(ReadTerminationMessage(path), std::string(4095, 'a'));
  ASSERT_TRUE(WriteTerminationMessage(path, "").ok());
  EXPECT_EQ(ReadTerminationMessage(path), "") << "an empty message replaces the last one";
  unlink(path.c_str());
  EXPECT_EQ(ReadTerminationMessage(path), "") << "no file";
}

TEST(TerminationMessageTest, AnUnwritablePathIsAnErrorNamingIt) {
  const Status status = WriteTerminationMessage("/nonexistent-dir/termination-log", "x");
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("/nonexistent-dir/termination-log"), std::string::npos);
}

}  // namespace
}  // namespace lockstep
