// Which NCCL IB settings the worker adds for the RDMA devices it found: a pure function of the
// devices, the network mode, the process's environment and spec.network.ncclEnv, so that every
// rule is tested without hardware.
//
//   NcclRdmaEnv decision = DecideNcclRdmaEnv(*devices, job.spec.network.mode, environment,
//                                            job.spec.network.nccl_env);
//   for (const std::string& line : decision.log_lines) LOCKSTEP_LOG(INFO) << line;
//   for (const auto& [name, value] : decision.set) setenv(name.c_str(), value.c_str(), 1);
//
// The rules (docs/rdma.md says why):
//  - Only for network mode roce or infiniband; with tcp nothing is set (the operator sets
//    NCCL_IB_DISABLE=1 there). Nothing is set either when NCCL_IB_DISABLE is non-zero or
//    NCCL_NET names a network other than IB: NCCL will not use the verbs transport.
//  - The ports used are the active ports of the mode's link layer: InfiniBand for infiniband,
//    Ethernet for roce. A port that is down, a device that cannot be opened, and a port of the
//    other link layer are logged and left out.
//  - NCCL_IB_HCA lists them with NCCL's exact-match prefix: "=mlx5_0:1,mlx5_1:1" (without the
//    "=", "mlx5_1" would also select mlx5_10..mlx5_19).
//  - NCCL_IB_GID_INDEX, for roce only: the index of the port's RoCE v2 GID whose address is an
//    IPv4-mapped one (the lowest such index per port), when every port used has one and all of
//    them have the same index; NCCL_IB_GID_INDEX is one value for all devices. Otherwise it is not
//    set, and NCCL (>= 2.21) picks a GID per device itself.
//  - Never overrides: a variable that spec.network.ncclEnv names takes ncclEnv's value (ncclEnv
//    always wins, as in the operator's pods; `set` carries it when the environment lacks it or
//    differs, e.g. under `lockstep run`), and one already in the environment is kept. The
//    NCCL_IB_HCA filter in force (ours, the environment's or ncclEnv's) decides which ports the
//    GID index must agree on.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/spec/training_job.h"
#include "worker/comm/rdma/rdma_devices.h"

namespace lockstep::rdma {

struct NcclRdmaEnv {
  std::map<std::string, std::string> set;  // variables to add to the process environment
  // One line per port (or unusable device), e.g.
  //   "mlx5_0 port 1: Ethernet (RoCE), active, GID index 3 (RoCE v2, 10.0.0.5 on net1)",
  // then one per decision ("NCCL_IB_HCA==mlx5_0:1 (set: ...)"), or "no RDMA devices found".
  std::vector<std::string> log_lines;
};

NcclRdmaEnv DecideNcclRdmaEnv(const std::vector<RdmaDevice>& devices, spec::NetworkMode mode,
                              const std::map<std::string, std::string>& environment,
                              const std::map<std::string, std::string>& nccl_env);

// Whether NCCL would use port `port` of `device` under the NCCL_IB_HCA value `filter`: a comma
// list of name[:port] entries, prefix matches unless the list starts with "=" (exact), and an
// exclude list when it starts with "^" ("^=mlx5_1"). An empty filter selects everything.
bool NcclHcaFilterSelects(const std::string& filter, const std::string& device, int port);

}  // namespace lockstep::rdma
