#include "worker/checkpoint/ckpt_command.h"

#include <cstdio>
#include <optional>

#include "common/env.h"
#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/checkpoint/storage/storage.h"

namespace lockstep::checkpoint {
namespace {

// How long one `ckpt` command may wait on storage in all.
LOCKSTEP_PARAM_INT(CkptTimeoutMs, "LOCKSTEP_CKPT_TIMEOUT_MS", 120000);

constexpr char kUsage[] =
    "usage: lockstep ckpt ls URI [--checksums]\n"
    "       lockstep ckpt verify URI [--step N]\n";

std::string HumanBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

}  // namespace

int RunCkptCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.size() < 2 || (args[0] != "ls" && args[0] != "verify")) {
    err << kUsage;
    return 2;
  }
  const std::string& verb = args[0];
  bool checksums = false;
  std::optional<int64_t> step;
  for (size_t i = 2; i < args.size(); ++i) {
    if (verb == "ls" && args[i] == "--checksums") {
      checksums = true;
    } else if (verb == "verify" && args[i] == "--step" && i + 1 < args.size()) {
      const std::string& value = args[++i];
      if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos ||
          value.size() > 18) {
        err << "lockstep ckpt verify: --step wants a non-negative integer, got '" << value << "'\n";
        return 2;
      }
      step = std::stoll(value);
    } else {
      err << "lockstep ckpt " << verb << ": unexpected argument '" << args[i] << "'\n" << kUsage;
      return 2;
    }
  }
  StatusOr<StorageUri> uri = ParseStorageUri(args[1]);
  if (!uri.ok()) {
    err << "lockstep ckpt " << verb << ": " << uri.status().message() << "\n";
    return 2;
  }
  StatusOr<std::unique_ptr<Storage>> storage = OpenStorage(uri->uri, StorageOptions());
  if (!storage.ok()) {
    err << "lockstep ckpt " << verb << ": " << storage.status().message() << "\n";
    return 2;
  }
  const Deadline deadline = Deadline::AfterMs(CkptTimeoutMs());

  if (verb == "verify") {
    Status status = VerifyCheckpoint(**storage, uri->path, step, deadline);
    if (!status.ok()) {
      err << "lockstep ckpt verify: " << status.ToString() << "\n";
      return 1;
    }
    out << "valid\n";
    return 0;
  }

  StatusOr<std::vector<CheckpointInfo>> checkpoints = ListCheckpoints(
      **storage, uri->path, checksums ? VerifyLevel::kChecksums : VerifyLevel::kSizes, deadline);
  if (!checkpoints.ok()) {
    err << "lockstep ckpt ls: " << checkpoints.status().ToString() << "\n";
    return 1;
  }
  char line[256];
  std::snprintf(line, sizeof(line), "%-14s %-8s %6s %6s %12s  %s\n", "STEP", "STATE", "WORLD",
                "STAGES", "SIZE", "CREATED");
  out << line;
  for (const CheckpointInfo& info : *checkpoints) {
    if (info.valid) {
      std::snprintf(line, sizeof(line), "%-14lld %-8s %6d %6d %12s  %s\n",
                    static_cast<long long>(info.step), "valid", info.world_size, info.stages,
                    HumanBytes(info.total_bytes).c_str(), info.created_at.c_str());
      out << line;
    } else {
      std::snprintf(line, sizeof(line), "%-14lld %-8s %6s %6s %12s  %s\n",
                    static_cast<long long>(info.step), "damaged", "-", "-", "-", "-");
      out << line << "    " << info.problem << "\n";
    }
  }
  return 0;
}

}  // namespace lockstep::checkpoint
