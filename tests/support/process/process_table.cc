#include "tests/support/process/process_table.h"

#include <dirent.h>

#include <cstdlib>
#include <sstream>

#include "common/process_stat.h"
#include "tests/support/process/poll_until.h"
#include "tests/support/process/scratch_files.h"

namespace lockstep::testing {

std::vector<pid_t> FindProcessesWithEnv(const std::string& key, const std::string& value) {
  std::vector<pid_t> pids;
  const std::string wanted = key + "=" + value;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    const std::string environ_text = ReadFile("/proc/" + std::string(entry->d_name) + "/environ");
    std::istringstream items(environ_text);
    std::string item;
    while (std::getline(items, item, '\0')) {
      if (item == wanted) {
        pids.push_back(static_cast<pid_t>(pid));
        break;
      }
    }
  }
  closedir(proc);
  return pids;
}

std::vector<pid_t> ChildrenWithEnv(pid_t parent,
                                   const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<pid_t> children;
  if (env.empty()) return children;
  for (pid_t pid : FindProcessesWithEnv(env[0].first, env[0].second)) {
    if (ParentPid(pid) != parent) continue;
    const std::string environ_text = ReadFile("/proc/" + std::to_string(pid) + "/environ");
    bool holds_all = true;
    for (const auto& [key, value] : env) {
      // Entries are NUL-separated; the text starts with one or follows a NUL.
      const std::string entry = key + "=" + value + '\0';
      holds_all = holds_all && (environ_text.rfind(entry, 0) == 0 ||
                                environ_text.find('\0' + entry) != std::string::npos);
    }
    if (holds_all) children.push_back(pid);
  }
  return children;
}

pid_t ParentPid(pid_t pid) {
  const std::optional<ProcessStat> stat = ReadProcessStat(pid);
  return stat ? stat->parent : -1;
}

bool WaitUntilThreadSleeps(pid_t tid, int64_t timeout_ms) {
  return PollUntil(
      [tid] {
        const std::optional<ProcessStat> stat = ReadProcessStat(tid);
        return stat && (stat->state == 'S' || stat->state == 'D');
      },
      timeout_ms, 1);
}

}  // namespace lockstep::testing
