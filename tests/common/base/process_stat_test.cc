// ReadProcessStat (common/process_stat.h) against real processes: this one, a zombie child, one
// whose name holds ") ", and one that does not exist.
#include "common/process_stat.h"

#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace lockstep {
namespace {

TEST(ProcessStatTest, ReadsTheStateAndParentOfALiveProcess) {
  const std::optional<ProcessStat> self = ReadProcessStat(getpid());
  ASSERT_TRUE(self.has_value());
  EXPECT_EQ(self->state, 'R');
  EXPECT_EQ(self->parent, getppid());
}

TEST(ProcessStatTest, ANameWithParenthesesAndSpacesDoesNotShiftTheFields) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    prctl(PR_SET_NAME, "a) b (c");
    _exit(0);
  }
  // A zombie until reaped: its stat stays readable, state Z, parent us.
  std::optional<ProcessStat> stat;
  for (int i = 0; i < 500; ++i) {
    stat = ReadProcessStat(child);
    if (stat && stat->state == 'Z') break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(stat.has_value());
  EXPECT_EQ(stat->state, 'Z');
  EXPECT_EQ(stat->parent, getpid());
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(ReadProcessStat(child).has_value());
}

TEST(ProcessStatTest, TheProcessTableHoldsThisProcessWithItsParent) {
  bool found = false;
  for (const ProcessEntry& process : ProcessTable()) {
    if (process.pid != getpid()) continue;
    found = true;
    EXPECT_EQ(process.stat.parent, getppid());
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace lockstep
