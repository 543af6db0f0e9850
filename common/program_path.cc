#include "common/program_path.h"

#include <sys/stat.h>
#include <unistd.h>

namespace lockstep {

StatusOr<std::string> ResolveProgram(const std::string& name, const std::string& path_env) {
  if (name.empty()) return InvalidArgumentError("empty command");
  if (name.find('/') != std::string::npos) return name;
  std::string first_existing;
  size_t start = 0;
  while (start <= path_env.size()) {
    size_t end = path_env.find(':', start);
    if (end == std::string::npos) end = path_env.size();
    std::string dir = path_env.substr(start, end - start);
    if (dir.empty()) dir = ".";  // POSIX: an empty PATH entry is the current directory
    const std::string candidate = dir + "/" + name;
    struct stat info {};
    if (stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode)) {
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
      if (first_existing.empty()) first_existing = candidate;
    }
    start = end + 1;
  }
  if (!first_existing.empty()) return first_existing;
  return NotFoundError("command not found: " + name + " (searched PATH=" + path_env + ")");
}

}  // namespace lockstep
