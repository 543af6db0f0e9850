#include "tests/support/job/launcher_workers.h"

#include <algorithm>
#include <cstdlib>

#include "tests/support/process/process_table.h"

namespace lockstep::testing {

std::vector<pid_t> WorkersOfLauncher(pid_t launcher, const std::string& job) {
  return ChildrenWithEnv(launcher, {{"LOCKSTEP_JOB", "default/" + job}});
}

pid_t WorkerOfLauncher(pid_t launcher, const std::string& job, const std::string& member) {
  const std::vector<pid_t> workers =
      ChildrenWithEnv(launcher, {{"LOCKSTEP_JOB", "default/" + job}, {"LOCKSTEP_POD", member}});
  return workers.empty() ? 0 : workers.front();
}

// The highest "step N/" the launcher's progress lines have shown; -1 before any.
int64_t LatestStep(const std::string& out) {
  int64_t latest = -1;
  for (size_t at = out.find("step "); at != std::string::npos; at = out.find("step ", at + 5)) {
    char* end = nullptr;
    const long long step = std::strtoll(out.c_str() + at + 5, &end, 10);
    if (end != out.c_str() + at + 5 && *end == '/') latest = std::max<int64_t>(latest, step);
  }
  return latest;
}

}  // namespace lockstep::testing
