// ProbeRdmaDevices through libibverbs (rdma_devices.h). Built when CMake finds libibverbs.
#include <infiniband/verbs.h>
#include <net/if.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "worker/comm/rdma/rdma_devices.h"

namespace lockstep::rdma {
namespace {

const char* PortStateName(int state) {
  switch (state) {
    case IBV_PORT_NOP:
      return "NOP";
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
      return "ACTIVE_DEFER";
    default:
      return "UNKNOWN";
  }
}

RdmaLinkLayer LinkLayer(uint8_t link_layer) {
  switch (link_layer) {
    case IBV_LINK_LAYER_ETHERNET:
      return RdmaLinkLayer::kEthernet;
    // UNSPECIFIED is what drivers older than the link_layer attribute report: InfiniBand.
    case IBV_LINK_LAYER_INFINIBAND:
    case IBV_LINK_LAYER_UNSPECIFIED:
      return RdmaLinkLayer::kInfiniBand;
    default:
      return RdmaLinkLayer::kUnknown;
  }
}

#if LOCKSTEP_HAVE_IBV_QUERY_GID_TABLE
// The port's valid GID entries through ibv_query_gid_table (one ioctl for the device, or the
// sysfs fallback inside rdma-core on kernels without it).
std::vector<RdmaGid> QueryGidTable(ibv_context* context, const ibv_device_attr& device_attr,
                                   const ibv_port_attr& port_attr, int port,
                                   const RdmaProbeOptions& options) {
  std::vector<RdmaGid> gids;
  // The table covers every port of the device: room for all of them.
  const size_t capacity =
      static_cast<size_t>(port_attr.gid_tbl_len) * std::max<int>(1, device_attr.phys_port_cnt);
  std::vector<ibv_gid_entry> entries(capacity);
  const ssize_t count = ibv_query_gid_table(context, entries.data(), entries.size(), 0);
  if (count < 0) {
    // Fall back to sysfs rather than report no GIDs: the answer is the same table.
    return ReadGidTableFromSysfs(options.sysfs_root, ibv_get_device_name(context->device), port,
                                 LinkLayer(port_attr.link_layer));
  }
  for (ssize_t i = 0; i < count; ++i) {
    const ibv_gid_entry& entry = entries[i];
    if (static_cast<int>(entry.port_num) != port) continue;
    RdmaGid gid;
    gid.index = static_cast<int>(entry.gid_index);
    std::memcpy(gid.raw.data(), entry.gid.raw, gid.raw.size());
    switch (entry.gid_type) {
      case IBV_GID_TYPE_ROCE_V2:
        gid.type = RdmaGidType::kRoceV2;
        break;
      case IBV_GID_TYPE_ROCE_V1:
        gid.type = RdmaGidType::kRoceV1;
        break;
      default:
        gid.type = RdmaGidType::kIb;
        break;
    }
    char name[IF_NAMESIZE] = {};
    if (entry.ndev_ifindex != 0 && if_indextoname(entry.ndev_ifindex, name) != nullptr) {
      gid.netdev = name;
    }
    gids.push_back(std::move(gid));
  }
  std::sort(gids.begin(), gids.end(),
            [](const RdmaGid& a, const RdmaGid& b) { return a.index < b.index; });
  return gids;
}
#endif

RdmaDevice DescribeDevice(ibv_device* ibv_device_handle, const RdmaProbeOptions& options) {
  RdmaDevice device;
  device.name = ibv_get_device_name(ibv_device_handle);
  std::unique_ptr<ibv_context, int (*)(ibv_context*)> context(ibv_open_device(ibv_device_handle),
                                                              ibv_close_device);
  if (!context) {
    device.open_error = std::string("ibv_open_device: ") + std::strerror(errno);
    return device;
  }
  ibv_device_attr device_attr{};
  if (int error = ibv_query_device(context.get(), &device_attr); error != 0) {
    device.open_error = std::string("ibv_query_device: ") + std::strerror(error);
    return device;
  }
  for (int port = 1; port <= device_attr.phys_port_cnt; ++port) {
    ibv_port_attr port_attr{};
    if (ibv_query_port(context.get(), static_cast<uint8_t>(port), &port_attr) != 0) continue;
    RdmaPort out;
    out.number = port;
    out.state = port_attr.state;
    out.state_name = PortStateName(port_attr.state);
    out.link_layer = LinkLayer(port_attr.link_layer);
#if LOCKSTEP_HAVE_IBV_QUERY_GID_TABLE
    out.gids = QueryGidTable(context.get(), device_attr, port_attr, port, options);
#else
    out.gids = ReadGidTableFromSysfs(options.sysfs_root, device.name, port, out.link_layer);
#endif
    device.ports.push_back(std::move(out));
  }
  return device;
}

}  // namespace

bool RdmaVerbsAvailable() { return true; }

StatusOr<std::vector<RdmaDevice>> ProbeRdmaDevices(const RdmaProbeOptions& options) {
  std::vector<RdmaDevice> devices;
  int count = 0;
  errno = 0;
  std::unique_ptr<ibv_device*, void (*)(ibv_device**)> list(ibv_get_device_list(&count),
                                                            ibv_free_device_list);
  if (!list) {
    // ENOSYS: the kernel has no uverbs (no RDMA driver loaded, or none visible in this
    // container); that is a machine without devices, not a failure.
    if (errno == ENOSYS || errno == 0) return devices;
    return InternalError(std::string("ibv_get_device_list: ") + std::strerror(errno));
  }
  for (int i = 0; i < count; ++i) devices.push_back(DescribeDevice(list.get()[i], options));
  std::sort(devices.begin(), devices.end(),
            [](const RdmaDevice& a, const RdmaDevice& b) { return a.name < b.name; });
  return devices;
}

}  // namespace lockstep::rdma
