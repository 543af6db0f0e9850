// CPU priority of a process started ahead of need: every one of its threads under SCHED_IDLE,
// and back to the normal policy.
#include "common/cpu_priority.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/support/process/process.h"

namespace lockstep {
namespace {

constexpr int64_t kWaitMs = 10000;
constexpr int kThreads = 4;

std::vector<pid_t> ThreadsOf(pid_t pid) {
  std::vector<pid_t> tids;
  DIR* dir = opendir(("/proc/" + std::to_string(pid) + "/task").c_str());
  if (dir == nullptr) return tids;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') tids.push_back(static_cast<pid_t>(std::stol(entry->d_name)));
  }
  closedir(dir);
  return tids;
}

// A program with kThreads threads besides its main one, started normally, once every thread runs.
std::unique_ptr<testing::ChildProcess> StartThreadedProgram() {
  auto child = std::make_unique<testing::ChildProcess>(
      std::vector<std::string>{"/usr/bin/python3", "-c",
                               "import threading, time\n"
                               "for _ in range(" + std::to_string(kThreads) + "):\n"
                               "    threading.Thread(target=time.sleep, args=(60,),"
                               " daemon=True).start()\n"
                               "time.sleep(60)\n"},
      testing::Environment{});
  if (child->pid() == 0) return nullptr;
  EXPECT_TRUE(testing::PollUntil(
      [&] { return ThreadsOf(child->pid()).size() == kThreads + 1; }, kWaitMs, 10));
  return child;
}

std::vector<int> PoliciesOf(pid_t pid) {
  std::vector<int> policies;
  for (pid_t tid : ThreadsOf(pid)) policies.push_back(sched_getscheduler(tid));
  return policies;
}

TEST(CpuPriority, EveryThreadOfAProgramGoesToIdlePriorityAndBack) {
  if (!IdlePriorityIsReversible()) GTEST_SKIP() << "no CAP_SYS_NICE nor RLIMIT_NICE >= 20 here";
  auto child = StartThreadedProgram();
  ASSERT_NE(child, nullptr);
  ASSERT_EQ(PoliciesOf(child->pid()), std::vector<int>(kThreads + 1, SCHED_OTHER));

  ASSERT_TRUE(EnterIdlePriority(child->pid()).ok());
  EXPECT_EQ(PoliciesOf(child->pid()), std::vector<int>(kThreads + 1, SCHED_IDLE));
  ASSERT_TRUE(LeaveIdlePriority(child->pid()).ok());
  EXPECT_EQ(PoliciesOf(child->pid()), std::vector<int>(kThreads + 1, SCHED_OTHER));
  // Leaving twice changes nothing.
  EXPECT_TRUE(LeaveIdlePriority(child->pid()).ok());
  EXPECT_EQ(PoliciesOf(child->pid()), std::vector<int>(kThreads + 1, SCHED_OTHER));
}

TEST(CpuPriority, LeavingIdlePriorityOfAProcessThatIsGoneIsNotFound) {
  auto child = StartThreadedProgram();
  ASSERT_NE(child, nullptr);
  const pid_t pid = child->pid();
  child.reset();  // reaped
  const Status left = LeaveIdlePriority(pid);
  EXPECT_EQ(left.code(), StatusCode::kNotFound) << left;
}

}  // namespace
}  // namespace lockstep
