#include "common/cpu_priority.h"

#include <dirent.h>
#include <sched.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/errno_check.h"

namespace lockstep {
namespace {

// A few passes catch a thread started between a pass's read of /proc and its last change; a
// process that keeps starting idle threads beyond that is reported rather than chased.
constexpr int kMaxPasses = 8;

bool ProbeReversible() {
  bool reversible = false;
  // The probe's thread ends right after: whatever it is left with dies with it.
  std::thread probe([&reversible] {
    const sched_param none{};
    if (sched_setscheduler(0, SCHED_IDLE, &none) != 0) return;
    reversible = sched_setscheduler(0, SCHED_OTHER, &none) == 0;
  });
  probe.join();
  return reversible;
}

const char* PolicyName(int policy) { return policy == SCHED_IDLE ? "SCHED_IDLE" : "SCHED_OTHER"; }

Status MoveThreads(pid_t pid, int from, int to) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  const std::string what = std::string("move process ") + std::to_string(pid) + " from " +
                           PolicyName(from) + " to " + PolicyName(to);
  const sched_param none{};
  for (int pass = 0; pass < kMaxPasses; ++pass) {
    DIR* dir = opendir(tasks.c_str());
    if (dir == nullptr) return ErrnoStatus(what + ": " + tasks, errno);
    int moved = 0;
    Status failed;
    while (const dirent* entry = readdir(dir)) {
      char* end = nullptr;
      const long tid = std::strtol(entry->d_name, &end, 10);
      if (end == entry->d_name || *end != '\0') continue;  // "." and ".."
      // Another policy already, or exited meanwhile (-1, ESRCH).
      if (sched_getscheduler(static_cast<pid_t>(tid)) != from) continue;
      if (sched_setscheduler(static_cast<pid_t>(tid), to, &none) == 0) {
        ++moved;
      } else if (errno != ESRCH && failed.ok()) {
        failed = ErrnoStatus(what + ": thread " + std::to_string(tid), errno);
      }
    }
    closedir(dir);
    if (!failed.ok()) return failed;
    if (moved == 0) return OkStatus();
  }
  return UnavailableError(what + ": threads still under " + PolicyName(from) + " after " +
                          std::to_string(kMaxPasses) + " passes");
}

}  // namespace

bool IdlePriorityIsReversible() {
  static const bool reversible = ProbeReversible();
  return reversible;
}

Status EnterIdlePriority(pid_t pid) { return MoveThreads(pid, SCHED_OTHER, SCHED_IDLE); }

Status LeaveIdlePriority(pid_t pid) { return MoveThreads(pid, SCHED_IDLE, SCHED_OTHER); }

}  // namespace lockstep
