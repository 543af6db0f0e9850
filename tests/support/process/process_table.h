// What the system's process table (/proc) says about processes a test did not start itself: the
// workers a launcher or an agent started, found by their environment and parent.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::testing {

// Pids of processes whose environment holds `key=value` (read from /proc/<pid>/environ; processes
// of other users and zombies are skipped).
std::vector<pid_t> FindProcessesWithEnv(const std::string& key, const std::string& value);
// The children of `parent` whose environment holds every key=value of `env` (at least one).
std::vector<pid_t> ChildrenWithEnv(pid_t parent,
                                   const std::vector<std::pair<std::string, std::string>>& env);
// The parent pid of `pid`, or -1 when it is gone.
pid_t ParentPid(pid_t pid);
// Waits up to timeout_ms until thread `tid` sleeps in the kernel (state S or D: waiting on a
// lock, a condition variable, a join, I/O); false past the deadline. For a test that must act
// only once another thread of its own waits, where the code under test offers no hook to say so.
bool WaitUntilThreadSleeps(pid_t tid, int64_t timeout_ms);

}  // namespace lockstep::testing
