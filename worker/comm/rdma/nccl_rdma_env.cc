#include "worker/comm/rdma/nccl_rdma_env.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <optional>
#include <string>

namespace lockstep::rdma {
namespace {

constexpr char kHcaVariable[] = "NCCL_IB_HCA";
constexpr char kGidIndexVariable[] = "NCCL_IB_GID_INDEX";

struct PortRef {
  const RdmaDevice* device;
  const RdmaPort* port;
  std::string Name() const { return device->name + ":" + std::to_string(port->number); }
};

// The value in force for `name`: ncclEnv's, else the environment's.
std::optional<std::string> Effective(const std::string& name,
                                     const std::map<std::string, std::string>& environment,
                                     const std::map<std::string, std::string>& nccl_env) {
  if (auto it = nccl_env.find(name); it != nccl_env.end()) return it->second;
  if (auto it = environment.find(name); it != environment.end()) return it->second;
  return std::nullopt;
}

// The lowest-index RoCE v2 GID with an IPv4-mapped address: RoCE v2 is routed (UDP/IP), so it
// crosses the subnets of a cluster fabric, and the IPv4 entry is the one built from the address
// the cluster network gave the interface (the one peers reach); fe80:: entries are link-local.
const RdmaGid* PreferredRoceGid(const RdmaPort& port) {
  for (const RdmaGid& gid : port.gids) {
    if (gid.type == RdmaGidType::kRoceV2 && gid.IsIpv4Mapped()) return &gid;
  }
  return nullptr;
}

std::string Lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string DescribePort(const RdmaDevice& device, const RdmaPort& port, bool used,
                         const std::string& unused_reason) {
  std::string line =
      device.name + " port " + std::to_string(port.number) + ": " + ToString(port.link_layer) +
      ", " +
      (port.state_name.empty() ? "state " + std::to_string(port.state) : Lower(port.state_name));
  if (port.link_layer == RdmaLinkLayer::kEthernet && port.active()) {
    if (const RdmaGid* gid = PreferredRoceGid(port)) {
      line += ", GID index " + std::to_string(gid->index) + " (" + ToString(gid->type) + ", " +
              gid->Address() + (gid->netdev.empty() ? "" : " on " + gid->netdev) + ")";
    } else {
      line +=
          ", no RoCE v2 GID with an IPv4 address (" + std::to_string(port.gids.size()) + " GIDs)";
    }
  }
  if (!used) line += " [not used: " + unused_reason + "]";
  return line;
}

// Applies the never-override rule to one variable: ncclEnv's value, else the environment's, else
// `ours` (when there is one). Returns the value in force afterwards (empty: none).
std::string Decide(const std::string& name, const std::optional<std::string>& ours,
                   const std::string& why, const std::map<std::string, std::string>& environment,
                   const std::map<std::string, std::string>& nccl_env, NcclRdmaEnv* out) {
  const std::string instead = ours ? "; found " + *ours : "";
  if (auto it = nccl_env.find(name); it != nccl_env.end()) {
    auto env = environment.find(name);
    if (env == environment.end() || env->second != it->second) out->set[name] = it->second;
    out->log_lines.push_back(name + "=" + it->second + " (from spec.network.ncclEnv" + instead +
                             ")");
    return it->second;
  }
  if (auto it = environment.find(name); it != environment.end()) {
    out->log_lines.push_back(name + "=" + it->second + " (already in the environment, kept" +
                             instead + ")");
    return it->second;
  }
  if (!ours) return "";
  out->set[name] = *ours;
  out->log_lines.push_back(name + "=" + *ours + " (set: " + why + ")");
  return *ours;
}

}  // namespace

bool NcclHcaFilterSelects(const std::string& filter, const std::string& device, int port) {
  size_t pos = 0;
  const bool exclude = pos < filter.size() && filter[pos] == '^';
  if (exclude) ++pos;
  const bool exact = pos < filter.size() && filter[pos] == '=';
  if (exact) ++pos;
  bool any_entry = false;
  bool matched = false;
  while (pos <= filter.size()) {
    size_t end = filter.find(',', pos);
    if (end == std::string::npos) end = filter.size();
    std::string entry = filter.substr(pos, end - pos);
    pos = end + 1;
    int entry_port = -1;
    if (size_t colon = entry.find(':'); colon != std::string::npos) {
      entry_port = std::atoi(entry.c_str() + colon + 1);
      entry.resize(colon);
    }
    if (entry.empty()) continue;
    any_entry = true;
    const bool name_matches = exact ? device == entry : device.rfind(entry, 0) == 0;
    if (name_matches && (entry_port == -1 || entry_port == port)) matched = true;
  }
  if (!any_entry) return true;
  return matched != exclude;
}

NcclRdmaEnv DecideNcclRdmaEnv(const std::vector<RdmaDevice>& devices, spec::NetworkMode mode,
                              const std::map<std::string, std::string>& environment,
                              const std::map<std::string, std::string>& nccl_env) {
  NcclRdmaEnv out;
  size_t port_count = 0;
  for (const RdmaDevice& device : devices) port_count += device.ports.size();

  // Why nothing will be set, if so; the per-port lines say it too.
  std::string skip_reason;
  if (mode == spec::NetworkMode::kTcp) {
    skip_reason = "network mode tcp";
  } else if (auto disable = Effective("NCCL_IB_DISABLE", environment, nccl_env);
             disable && std::atoi(disable->c_str()) != 0) {
    skip_reason = "NCCL_IB_DISABLE=" + *disable;
  } else if (auto net = Effective("NCCL_NET", environment, nccl_env);
             net && !net->empty() && Lower(*net) != "ib") {
    skip_reason = "NCCL_NET=" + *net;
  }
  const RdmaLinkLayer wanted =
      mode == spec::NetworkMode::kRoce ? RdmaLinkLayer::kEthernet : RdmaLinkLayer::kInfiniBand;

  std::vector<PortRef> used;
  for (const RdmaDevice& device : devices) {
    if (!device.open_error.empty() && device.ports.empty()) {
      out.log_lines.push_back(device.name + ": cannot be used (" + device.open_error + ")");
      continue;
    }
    if (!device.open_error.empty()) {
      out.log_lines.push_back(device.name + ": some ports unreadable (" + device.open_error + ")");
    }
    for (const RdmaPort& port : device.ports) {
      std::string reason;
      if (!skip_reason.empty()) {
        reason = skip_reason;
      } else if (!port.active()) {
        reason = "not active";
      } else if (port.link_layer != wanted) {
        reason = std::string("network mode ") + spec::ToString(mode) + " uses " + ToString(wanted) +
                 " ports";
      }
      out.log_lines.push_back(DescribePort(device, port, reason.empty(), reason));
      if (reason.empty()) used.push_back({&device, &port});
    }
  }

  if (port_count == 0) {
    out.log_lines.push_back(devices.empty()
                                ? "no RDMA devices found; NCCL's IB settings left alone"
                                : "no usable RDMA port found; NCCL's IB settings left alone");
    return out;
  }
  if (!skip_reason.empty()) {
    out.log_lines.push_back(skip_reason + ": NCCL's IB settings left alone");
    return out;
  }
  if (used.empty()) {
    out.log_lines.push_back(std::string("no active ") + ToString(wanted) +
                            " port: NCCL_IB_HCA and NCCL_IB_GID_INDEX left to NCCL");
    return out;
  }

  std::string hca = "=";
  for (size_t i = 0; i < used.size(); ++i) hca += (i == 0 ? "" : ",") + used[i].Name();
  const std::string hca_in_force =
      Decide(kHcaVariable, hca, std::string("the active ") + ToString(wanted) + " ports",
             environment, nccl_env, &out);

  if (wanted != RdmaLinkLayer::kEthernet) return out;  // InfiniBand: GID index 0 is right

  // The GID index must suit every port NCCL will use: those the filter in force selects.
  std::vector<PortRef> selected;
  for (const PortRef& ref : used) {
    if (NcclHcaFilterSelects(hca_in_force, ref.device->name, ref.port->number)) {
      selected.push_back(ref);
    }
  }
  std::string gid_problem;
  std::optional<int> index;
  std::string per_port;
  for (const PortRef& ref : selected) {
    const RdmaGid* gid = PreferredRoceGid(*ref.port);
    per_port += (per_port.empty() ? "" : ", ") + ref.Name() + " -> " +
                (gid ? std::to_string(gid->index) : std::string("none"));
    if (gid == nullptr) {
      gid_problem = ref.Name() + " has no RoCE v2 GID with an IPv4 address";
    } else if (index && *index != gid->index && gid_problem.empty()) {
      gid_problem = "the ports' RoCE v2 IPv4 GIDs have different indices";
    }
    if (gid && !index) index = gid->index;
  }
  if (selected.empty()) gid_problem = "NCCL_IB_HCA=" + hca_in_force + " selects none of them";
  if (!gid_problem.empty()) {
    if (Effective(kGidIndexVariable, environment, nccl_env)) {
      Decide(kGidIndexVariable, std::nullopt, "", environment, nccl_env, &out);
    } else {
      out.log_lines.push_back(std::string(kGidIndexVariable) + " not set: " + gid_problem +
                              (per_port.empty() ? "" : " (" + per_port + ")") +
                              "; NCCL picks a GID per device");
    }
    return out;
  }
  Decide(kGidIndexVariable, std::to_string(*index),
         "RoCE v2 GID with an IPv4 address on " + std::to_string(selected.size()) +
             (selected.size() == 1 ? " port" : " ports"),
         environment, nccl_env, &out);
  return out;
}

}  // namespace lockstep::rdma
