#include "tests/support/job/launcher_workers.h"

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

}  // namespace lockstep::testing
