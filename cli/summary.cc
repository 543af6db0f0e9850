#include "cli/summary.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "common/errno_check.h"

namespace lockstep::cli {

namespace {

template <typename T>
nlohmann::json OrNull(const std::optional<T>& value) {
  return value.has_value() ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

}  // namespace

nlohmann::json ToJson(const RunSummary& summary) {
  nlohmann::json json = {
      {"job", summary.job},
      {"status", summary.status},
      {"mode", summary.mode},
      {"steps", OrNull(summary.steps)},
      {"total_steps", summary.total_steps > 0 ? nlohmann::json(summary.total_steps)
                                              : nlohmann::json(nullptr)},
      {"world_size", summary.world_size},
      {"final_loss", OrNull(summary.final_loss)},
      {"eval_accuracy", OrNull(summary.eval_accuracy)},
      {"eval_auc", summary.eval_auc >= 0 ? nlohmann::json(summary.eval_auc)
                                         : nlohmann::json(nullptr)},
      {"samples_per_second", OrNull(summary.samples_per_second)},
      {"restarts", summary.restarts},
      {"generations", summary.generations},
      {"resumed_from_step", OrNull(summary.resumed_from_step)},
      {"recovery_seconds", summary.recovery_seconds},
      {"wall_seconds", summary.wall_seconds},
      {"log_dir", summary.log_dir},
  };
  json["stragglers"] = nlohmann::json::array();
  for (const RunStraggler& straggler : summary.stragglers) {
    json["stragglers"].push_back({{"worker", straggler.worker},
                                  {"member_id", straggler.member_id},
                                  {"generation", straggler.generation},
                                  {"ratio", straggler.ratio},
                                  {"replaced", straggler.replaced}});
  }
  if (!summary.failed_worker.empty()) {
    json["failed_worker"] = summary.failed_worker;
    json["failed_worker_exit"] = summary.failed_worker_exit;
  }
  return json;
}

Status WriteSummaryFile(const RunSummary& summary, const std::string& path) {
  const std::string text = ToJson(summary).dump(2) + "\n";
  const std::string tmp_path = path + ".tmp." + std::to_string(getpid());
  int fd;
  LOCKSTEP_SYSCALL_RETRY(fd,
                         open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd < 0) return ErrnoStatus("open " + tmp_path, errno);
  size_t written = 0;
  while (written < text.size()) {
    ssize_t n;
    LOCKSTEP_SYSCALL_RETRY(n, write(fd, text.data() + written, text.size() - written));
    if (n < 0) {
      Status status = ErrnoStatus("write " + tmp_path, errno);
      close(fd);
      unlink(tmp_path.c_str());
      return status;
    }
    written += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    Status status = ErrnoStatus("fsync " + tmp_path, errno);
    close(fd);
    unlink(tmp_path.c_str());
    return status;
  }
  close(fd);
  if (rename(tmp_path.c_str(), path.c_str()) != 0) {
    Status status = ErrnoStatus("rename " + tmp_path + " to " + path, errno);
    unlink(tmp_path.c_str());
    return status;
  }
  return OkStatus();
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  char buffer[64];
  if (seconds < 60) {
    std::snprintf(buffer, sizeof(buffer), "%.1fs", seconds);
    return buffer;
  }
  const int64_t total = static_cast<int64_t>(std::llround(seconds));
  const int64_t hours = total / 3600, minutes = (total % 3600) / 60, secs = total % 60;
  if (hours > 0) {
    std::snprintf(buffer, sizeof(buffer), "%lldh %02lldm %02llds", static_cast<long long>(hours),
                  static_cast<long long>(minutes), static_cast<long long>(secs));
  } else {
    std::snprintf(buffer, sizeof(buffer), "%lldm %02llds", static_cast<long long>(minutes),
                  static_cast<long long>(secs));
  }
  return buffer;
}

void PrintResultBlock(const RunSummary& summary, std::ostream& out) {
  std::ostringstream block;
  auto row = [&](const char* label, const std::string& value) {
    block << "  " << std::left << std::setw(16) << label << value << "\n";
  };
  block << summary.job << " " << summary.status << "\n";
  if (summary.steps.has_value()) {
    std::string steps = std::to_string(*summary.steps);
    if (summary.total_steps > 0) steps += " / " + std::to_string(summary.total_steps);
    row("steps", steps);
  }
  if (summary.eval_accuracy.has_value()) {
    std::ostringstream accuracy;
    if (*summary.eval_accuracy >= 0) {
      accuracy << std::fixed << std::setprecision(2) << *summary.eval_accuracy * 100 << "%";
    } else {
      accuracy << "not evaluated";
    }
    row("test accuracy", accuracy.str());
  }
  if (summary.eval_auc >= 0) {
    std::ostringstream auc;
    auc << std::fixed << std::setprecision(4) << summary.eval_auc;
    row("test AUC", auc.str());
  }
  if (summary.final_loss.has_value()) {
    std::ostringstream loss;
    loss << std::setprecision(4) << *summary.final_loss;
    row("final loss", loss.str());
  }
  if (summary.samples_per_second.has_value()) {
    std::ostringstream rate;
    rate << std::fixed << std::setprecision(0) << *summary.samples_per_second;
    row("samples/s", rate.str());
  }
  if (summary.mode == "exec" && !summary.steps.has_value()) {
    row("progress", "not reported by the program (docs/exec.md, \"Progress\")");
  }
  row("wall time", FormatDuration(summary.wall_seconds));
  row("world size", std::to_string(summary.world_size) + " (generations " +
                        std::to_string(summary.generations) + ", restarts " +
                        std::to_string(summary.restarts) + ")");
  if (summary.recovery_seconds > 0) {
    row("recovery", FormatDuration(summary.recovery_seconds) + " (longest, loss to training again)");
  }
  for (const RunStraggler& straggler : summary.stragglers) {
    std::ostringstream line;
    line << "worker " << straggler.worker << ", " << std::fixed << std::setprecision(1)
         << straggler.ratio << "x the median compute time per step (generation "
         << straggler.generation << ")" << (straggler.replaced ? ", replaced" : "");
    row("straggler", line.str());
  }
  row("logs", summary.log_dir);
  out << block.str() << std::flush;
}

}  // namespace lockstep::cli
