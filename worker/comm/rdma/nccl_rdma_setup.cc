#include "worker/comm/rdma/nccl_rdma_setup.h"

#include <cstdlib>

#include "common/env.h"
#include "common/logging.h"

extern char** environ;

namespace lockstep::rdma {

std::map<std::string, std::string> CurrentEnvironment() {
  std::map<std::string, std::string> environment;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const size_t equals = text.find('=');
    if (equals == std::string::npos) continue;
    environment.emplace(text.substr(0, equals), text.substr(equals + 1));
  }
  return environment;
}

NcclRdmaEnv SetUpNcclRdmaEnvironment(const spec::NetworkSpec& network,
                                     const RdmaProbeOptions& options) {
  const std::string sysfs_root = EnvString("LOCKSTEP_RDMA_SYSFS_ROOT", "");
  StatusOr<std::vector<RdmaDevice>> devices =
      sysfs_root.empty() ? ProbeRdmaDevices(options) : ReadRdmaDevicesFromSysfs(sysfs_root);
  if (!sysfs_root.empty()) {
    LOCKSTEP_LOG(INFO) << "rdma: devices read from " << sysfs_root
                       << " (LOCKSTEP_RDMA_SYSFS_ROOT), not from libibverbs";
  }
  if (!devices.ok()) {
    // Unavailable (built without libibverbs) is expected on a tcp job; say it quietly then.
    if (network.mode == spec::NetworkMode::kTcp) {
      LOCKSTEP_LOG(INFO) << "rdma: " << devices.status().message();
    } else {
      LOCKSTEP_LOG(WARNING) << "rdma: " << devices.status().message()
                            << "; NCCL's IB settings left to NCCL";
    }
    return {};
  }
  NcclRdmaEnv decision =
      DecideNcclRdmaEnv(*devices, network.mode, CurrentEnvironment(), network.nccl_env);
  for (const std::string& line : decision.log_lines) LOCKSTEP_LOG(INFO) << "rdma: " << line;
  for (const auto& [name, value] : decision.set) {
    if (setenv(name.c_str(), value.c_str(), /*overwrite=*/1) != 0) {
      LOCKSTEP_LOG(WARNING) << "rdma: setenv " << name << " failed";
    }
  }
  return decision;
}

}  // namespace lockstep::rdma
