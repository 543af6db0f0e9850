#include "worker/comm/shm/shm_segment.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>

#include "common/process_stat.h"

namespace lockstep::comm::shm {

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

void WakeAll(std::atomic<uint32_t>* word) { Futex(word, FUTEX_WAKE, INT_MAX, nullptr); }

int SpinIterations() {
  static const int spins = [] {
    const char* value = std::getenv("LOCKSTEP_SHM_SPIN");
    if (value != nullptr && *value != '\0') return std::max(0, std::atoi(value));
    return 2000;
  }();
  return spins;
}

bool ProcessIsGone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  const std::optional<ProcessStat> stat = ReadProcessStat(pid);
  return stat && (stat->state == 'Z' || stat->state == 'X');
}

}  // namespace lockstep::comm::shm
