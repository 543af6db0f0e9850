// The device discovery: the sysfs reader against trees laid out as the kernel lays them out, and
// the libibverbs probe on this machine.
#include "worker/comm/rdma/rdma_devices.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/worker/comm/rdma/fake_sysfs.h"

namespace lockstep::rdma {
namespace {

using testing::FakeSysfs;

TEST(RdmaDevicesTest, ReadsRoceGidTableWithTypesAddressesAndInterfaces) {
  FakeSysfs sysfs;
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "Ethernet",
                {{"fe80::268a:7ff:fe55:4660", "IB/RoCE v1", "net1"},
                 {"fe80::268a:7ff:fe55:4660", "RoCE v2", "net1"},
                 {"::ffff:10.0.0.5", "IB/RoCE v1", "net1"},
                 {"::ffff:10.0.0.5", "RoCE v2", "net1"}});

  StatusOr<std::vector<RdmaDevice>> devices = ReadRdmaDevicesFromSysfs(sysfs.root());
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 1u);
  const RdmaDevice& device = (*devices)[0];
  EXPECT_EQ(device.name, "mlx5_0");
  ASSERT_EQ(device.ports.size(), 1u);
  const RdmaPort& port = device.ports[0];
  EXPECT_EQ(port.number, 1);
  EXPECT_TRUE(port.active());
  EXPECT_EQ(port.state_name, "ACTIVE");
  EXPECT_EQ(port.link_layer, RdmaLinkLayer::kEthernet);
  // The four valid entries; the zero entries after them are not GIDs.
  ASSERT_EQ(port.gids.size(), 4u);
  EXPECT_EQ(port.gids[0].type, RdmaGidType::kRoceV1);  // "IB/RoCE v1" on Ethernet
  EXPECT_FALSE(port.gids[0].IsIpv4Mapped());
  EXPECT_EQ(port.gids[0].Address(), "fe80::268a:7ff:fe55:4660");
  EXPECT_EQ(port.gids[1].type, RdmaGidType::kRoceV2);
  EXPECT_EQ(port.gids[3].index, 3);
  EXPECT_EQ(port.gids[3].type, RdmaGidType::kRoceV2);
  EXPECT_TRUE(port.gids[3].IsIpv4Mapped());
  EXPECT_EQ(port.gids[3].Address(), "10.0.0.5");
  EXPECT_EQ(port.gids[3].netdev, "net1");
}

TEST(RdmaDevicesTest, InfiniBandGidsAreIbTypeAndPortsComeInNumericOrder) {
  FakeSysfs sysfs;
  for (int port = 1; port <= 10; ++port) {
    sysfs.AddPort("mlx5_1", port, port == 2 ? "1: DOWN" : "4: ACTIVE", "InfiniBand",
                  {{"fe80::ec0d:9a03:ca:2f4c", "IB/RoCE v1", ""}});
  }
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "InfiniBand", {{"fe80::1", "IB/RoCE v1", ""}});

  StatusOr<std::vector<RdmaDevice>> devices = ReadRdmaDevicesFromSysfs(sysfs.root());
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 2u);
  EXPECT_EQ((*devices)[0].name, "mlx5_0");
  const RdmaDevice& device = (*devices)[1];
  ASSERT_EQ(device.ports.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(device.ports[i].number, i + 1);
  EXPECT_EQ(device.ports[1].state, kPortStateDown);
  EXPECT_FALSE(device.ports[1].active());
  EXPECT_EQ(device.ports[0].link_layer, RdmaLinkLayer::kInfiniBand);
  ASSERT_EQ(device.ports[0].gids.size(), 1u);
  EXPECT_EQ(device.ports[0].gids[0].type, RdmaGidType::kIb);
}

TEST(RdmaDevicesTest, NoInfinibandClassIsNoDevices) {
  FakeSysfs sysfs;  // an empty sysfs: no class/infiniband, as on a machine without RDMA
  StatusOr<std::vector<RdmaDevice>> devices = ReadRdmaDevicesFromSysfs(sysfs.root());
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_TRUE(devices->empty());
}

// The real probe of this machine. Where libibverbs is built in, it lists what the kernel
// offers; a machine without RDMA (no /sys/class/infiniband; libibverbs then fails with ENOSYS)
// is an empty list, not an error. The per-device part of the probe (open, query ports, GID
// table) needs a device and runs only where one exists.
TEST(RdmaDevicesTest, RealProbeOnThisMachine) {
  StatusOr<std::vector<RdmaDevice>> devices = ProbeRdmaDevices();
  if (!RdmaVerbsAvailable()) {
    ASSERT_FALSE(devices.ok());
    EXPECT_EQ(devices.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(devices.status().message().find("libibverbs not available"), std::string::npos);
    return;
  }
  ASSERT_TRUE(devices.ok()) << devices.status();
  if (!std::filesystem::exists("/sys/class/infiniband")) {
    EXPECT_TRUE(devices->empty());
    return;
  }
  // A machine with RDMA devices: sysfs and libibverbs agree on the ports both can see.
  StatusOr<std::vector<RdmaDevice>> from_sysfs = ReadRdmaDevicesFromSysfs("/sys");
  ASSERT_TRUE(from_sysfs.ok()) << from_sysfs.status();
  for (const RdmaDevice& device : *devices) {
    if (!device.open_error.empty()) continue;
    for (const RdmaDevice& other : *from_sysfs) {
      if (other.name != device.name) continue;
      ASSERT_EQ(other.ports.size(), device.ports.size()) << device.name;
      for (size_t i = 0; i < device.ports.size(); ++i) {
        EXPECT_EQ(other.ports[i].link_layer, device.ports[i].link_layer) << device.name;
      }
    }
  }
}

TEST(RdmaDevicesTest, RealSysfsReadsWithoutError) {
  StatusOr<std::vector<RdmaDevice>> devices = ReadRdmaDevicesFromSysfs("/sys");
  ASSERT_TRUE(devices.ok()) << devices.status();
  if (!std::filesystem::exists("/sys/class/infiniband")) {
    EXPECT_TRUE(devices->empty());
  }
}

}  // namespace
}  // namespace lockstep::rdma
