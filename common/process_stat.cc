#include "common/process_stat.h"

#include <cstdio>
#include <fstream>
#include <string>

namespace lockstep {

std::optional<ProcessStat> ReadProcessStat(pid_t pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(file, line)) return std::nullopt;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  ProcessStat stat;
  long parent = -1;
  if (std::sscanf(line.c_str() + close + 1, " %c %ld", &stat.state, &parent) != 2) {
    return std::nullopt;
  }
  stat.parent = static_cast<pid_t>(parent);
  return stat;
}

}  // namespace lockstep
