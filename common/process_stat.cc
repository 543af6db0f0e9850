#include "common/process_stat.h"

#include <cstdio>
#include <filesystem>
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

std::vector<ProcessEntry> ProcessTable() {
  std::vector<ProcessEntry> table;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (std::optional<ProcessStat> stat = ReadProcessStat(pid)) table.push_back({pid, *stat});
  }
  return table;
}

}  // namespace lockstep
