// What RDMA hardware this process can use: each device, each port's state and link layer, and the
// port's GID table with each entry's type (IB, RoCE v1, RoCE v2) and address. The worker logs it
// and derives NCCL's IB settings from it (nccl_rdma_env.h).
//
//   StatusOr<std::vector<RdmaDevice>> devices = ProbeRdmaDevices();   // libibverbs
//   for (const RdmaDevice& device : *devices) ... device.ports[i].gids ...
//
// Two sources, one result type:
//  - ProbeRdmaDevices: libibverbs (Debian's libibverbs-dev, rdma-core). It lists only devices the
//    kernel exposes through uverbs, and a device this process cannot open (in a container, one
//    whose /dev/infiniband/uverbsN was not given to the pod) is reported with open_error set and
//    no ports: NCCL could not open it either. GIDs come from ibv_query_gid_table (rdma-core >= 32;
//    bookworm ships 44), which asks the kernel and falls back to sysfs by itself on old kernels;
//    with an older rdma-core the table is read from sysfs as below.
//  - ReadRdmaDevicesFromSysfs: the kernel's sysfs files, under a root the caller names (tests
//    point it at a tree they build). The layout, from the kernel's
//    Documentation/ABI/stable/sysfs-class-infiniband and drivers/infiniband/core/sysfs.c:
//      <root>/class/infiniband/<device>/ports/<port>/state            "4: ACTIVE" ("%d: %s")
//      <root>/class/infiniband/<device>/ports/<port>/link_layer       "InfiniBand" | "Ethernet"
//      <root>/class/infiniband/<device>/ports/<port>/gids/<index>     "fe80:0000:...:0001" (%pI6)
//      <root>/class/infiniband/<device>/ports/<port>/gid_attrs/types/<index>
//                                                        "IB/RoCE v1" | "RoCE v2"
//      <root>/class/infiniband/<device>/ports/<port>/gid_attrs/ndevs/<index>   "eth0"
//    An unused GID entry reads as all zeros and its type file fails to read (EINVAL); both mean
//    "no entry". "IB/RoCE v1" is IB on an InfiniBand port and RoCE v1 on an Ethernet one: the
//    same rule rdma-core's sysfs fallback (libibverbs/verbs.c) and NCCL (net_ib) apply.
//
// Both are cheap (a few ioctls or file reads per port), never block on the network, and are safe
// to call from any thread; neither changes any state.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep::rdma {

enum class RdmaLinkLayer { kUnknown, kInfiniBand, kEthernet };
enum class RdmaGidType { kIb, kRoceV1, kRoceV2 };

// "InfiniBand" | "Ethernet (RoCE)" | "unknown link layer"
const char* ToString(RdmaLinkLayer link_layer);
// "IB" | "RoCE v1" | "RoCE v2"
const char* ToString(RdmaGidType type);

// IB port states (the InfiniBand specification's PortState; ibv_port_state and sysfs agree).
constexpr int kPortStateDown = 1;
constexpr int kPortStateActive = 4;

struct RdmaGid {
  int index = 0;
  std::array<uint8_t, 16> raw{};  // network byte order
  RdmaGidType type = RdmaGidType::kIb;
  std::string netdev;  // the Ethernet interface a RoCE GID belongs to; empty when unknown

  // ::ffff:a.b.c.d, the form a RoCE GID of an interface's IPv4 address takes.
  bool IsIpv4Mapped() const;
  // "10.0.0.5" for an IPv4-mapped GID, else the IPv6 text form ("fe80::268a:7ff:fe55:4660").
  std::string Address() const;
};

struct RdmaPort {
  int number = 1;
  int state = 0;           // kPortStateActive, ...
  std::string state_name;  // "ACTIVE", "DOWN", ...
  RdmaLinkLayer link_layer = RdmaLinkLayer::kUnknown;
  std::vector<RdmaGid> gids;  // valid entries only, by index

  bool active() const { return state == kPortStateActive; }
};

struct RdmaDevice {
  std::string name;             // "mlx5_0"
  std::vector<RdmaPort> ports;  // by number
  std::string open_error;  // set when the device is listed but cannot be opened (no ports then)
};

struct RdmaProbeOptions {
  // Where sysfs is mounted. ProbeRdmaDevices reads it only for GID tables, and only when built
  // against an rdma-core without ibv_query_gid_table.
  std::string sysfs_root = "/sys";
};

// The devices libibverbs reports, by name. No devices (including a kernel without RDMA support,
// where libibverbs fails with ENOSYS) is an empty list, not an error. Unavailable when Lockstep was
// built without libibverbs ("libibverbs not available"); Internal when listing the devices fails.
StatusOr<std::vector<RdmaDevice>> ProbeRdmaDevices(const RdmaProbeOptions& options = {});

// The devices under <sysfs_root>/class/infiniband, by name. A missing class/infiniband directory
// is an empty list; a device or port whose files cannot be read is skipped (its name goes into
// open_error), so one odd device never hides the others.
StatusOr<std::vector<RdmaDevice>> ReadRdmaDevicesFromSysfs(const std::string& sysfs_root);

// The valid GID entries of one port from sysfs (the layout above). `link_layer` decides what
// "IB/RoCE v1" means.
std::vector<RdmaGid> ReadGidTableFromSysfs(const std::string& sysfs_root, const std::string& device,
                                           int port, RdmaLinkLayer link_layer);

// True when this build has the libibverbs probe.
bool RdmaVerbsAvailable();

}  // namespace lockstep::rdma
