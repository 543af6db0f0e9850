// Which NCCL IB settings the worker adds, from fake sysfs trees of the nodes users run on.
#include "worker/comm/rdma/nccl_rdma_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include "tests/worker/comm/rdma/fake_sysfs.h"
#include "worker/comm/rdma/nccl_rdma_setup.h"

namespace lockstep::rdma {
namespace {

using ::testing::Contains;
using testing::FakeGid;
using testing::FakeSysfs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;
using Env = std::map<std::string, std::string>;

const spec::NetworkMode kRoce = spec::NetworkMode::kRoce;
const spec::NetworkMode kInfiniband = spec::NetworkMode::kInfiniband;
const spec::NetworkMode kTcp = spec::NetworkMode::kTcp;

// The usual GID table of a ConnectX port with one IPv4 address on its interface.
std::vector<FakeGid> RoceGids(const std::string& ipv4, const std::string& netdev) {
  return {{"fe80::268a:7ff:fe55:4660", "IB/RoCE v1", netdev},
          {"fe80::268a:7ff:fe55:4660", "RoCE v2", netdev},
          {"::ffff:" + ipv4, "IB/RoCE v1", netdev},
          {"::ffff:" + ipv4, "RoCE v2", netdev}};
}

NcclRdmaEnv DecideFor(const FakeSysfs& sysfs, spec::NetworkMode mode, const Env& environment = {},
                      const Env& nccl_env = {}) {
  StatusOr<std::vector<RdmaDevice>> devices = ReadRdmaDevicesFromSysfs(sysfs.root());
  EXPECT_TRUE(devices.ok()) << devices.status();
  return DecideNcclRdmaEnv(devices.ok() ? *devices : std::vector<RdmaDevice>{}, mode, environment,
                           nccl_env);
}

TEST(NcclRdmaEnvTest, InfiniBandHcaSetsHcaButNoGidIndex) {
  FakeSysfs sysfs;
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "InfiniBand",
                {{"fe80::ec0d:9a03:ca:2f4c", "IB/RoCE v1", ""}});

  NcclRdmaEnv decision = DecideFor(sysfs, kInfiniband);

  EXPECT_THAT(decision.set, UnorderedElementsAre(Pair("NCCL_IB_HCA", "=mlx5_0:1")));
  EXPECT_THAT(decision.log_lines, Contains("mlx5_0 port 1: InfiniBand, active"));
}

TEST(NcclRdmaEnvTest, RoceNicGetsTheRoceV2GidOfItsIpv4Address) {
  FakeSysfs sysfs;
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "Ethernet", RoceGids("10.0.0.5", "net1"));

  NcclRdmaEnv decision = DecideFor(sysfs, kRoce);

  EXPECT_THAT(decision.set, UnorderedElementsAre(Pair("NCCL_IB_HCA", "=mlx5_0:1"),
                                                 Pair("NCCL_IB_GID_INDEX", "3")));
  EXPECT_THAT(decision.log_lines,
              Contains("mlx5_0 port 1: Ethernet (RoCE), active, GID index 3 (RoCE v2, "
                       "10.0.0.5 on net1)"));
}

TEST(NcclRdmaEnvTest, OnlyTheActivePortIsUsed) {
  FakeSysfs sysfs;
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "Ethernet", RoceGids("10.0.0.5", "net1"));
  sysfs.AddPort("mlx5_0", 2, "1: DOWN", "Ethernet", {});

  NcclRdmaEnv decision = DecideFor(sysfs, kRoce);

  EXPECT_THAT(decision.set, UnorderedElementsAre(Pair("NCCL_IB_HCA", "=mlx5_0:1"),
                                                 Pair("NCCL_IB_GID_INDEX", "3")));
  EXPECT_THAT(decision.log_lines,
              Contains("mlx5_0 port 2: Ethernet (RoCE), down [not used: not active]"));
}

TEST(NcclRdmaEnvTest, SeveralNicsAreListedExactlyAndAgreeOnTheGidIndex) {
  FakeSysfs sysfs;
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "Ethernet", RoceGids("10.0.0.5", "net1"));
  sysfs.AddPort("mlx5_1", 1, "4: ACTIVE", "Ethernet", RoceGids("10.0.1.5", "net2"));

  NcclRdmaEnv decision = DecideFor(sysfs, kRoce);

  EXPECT_THAT(decision.set, UnorderedElementsAre(Pair("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1"),
                                                 Pair("NCCL_IB_GID_INDEX", "3")));
}

TEST(NcclRdmaEnvTest, PortsThatDisagreeOnTheGidIndexLeaveItToNccl) {
  FakeSysfs sysfs;
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "Ethernet", RoceGids("10.0.0.5", "net1"));
  // An extra IPv6 address on net2 comes first: its IPv4 RoCE v2 entry is index 5.
  std::vector<FakeGid> shifted = {
      {"fe80::1", "IB/RoCE v1", "net2"},         {"fe80::1", "RoCE v2", "net2"},
      {"fd00::5", "IB/RoCE v1", "net2"},         {"fd00::5", "RoCE v2", "net2"},
      {"::ffff:10.0.1.5", "IB/RoCE v1", "net2"}, {"::ffff:10.0.1.5", "RoCE v2", "net2"}};
  sysfs.AddPort("mlx5_1", 1, "4: ACTIVE", "Ethernet", shifted);

  NcclRdmaEnv decision = DecideFor(sysfs, kRoce);

  EXPECT_THAT(decision.set, UnorderedElementsAre(Pair("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1")));
  EXPECT_THAT(decision.log_lines,
              Contains(HasSubstr("NCCL_IB_GID_INDEX not set: the ports' RoCE v2 IPv4 GIDs have "
                                 "different indices (mlx5_0:1 -> 3, mlx5_1:1 -> 5)")));

  // The user's NCCL_IB_HCA narrows NCCL to mlx5_1: its index is the one to agree on.
  NcclRdmaEnv narrowed = DecideFor(sysfs, kRoce, {{"NCCL_IB_HCA", "=mlx5_1"}});
  EXPECT_THAT(narrowed.set, UnorderedElementsAre(Pair("NCCL_IB_GID_INDEX", "5")));
}

TEST(NcclRdmaEnvTest, RoceWithoutAnIpv4RoceV2GidSetsOnlyTheHca) {
  FakeSysfs sysfs;
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "Ethernet",
                {{"fe80::1", "IB/RoCE v1", "net1"}, {"fe80::1", "RoCE v2", "net1"}});

  NcclRdmaEnv decision = DecideFor(sysfs, kRoce);

  EXPECT_THAT(decision.set, UnorderedElementsAre(Pair("NCCL_IB_HCA", "=mlx5_0:1")));
  EXPECT_THAT(decision.log_lines,
              Contains(HasSubstr("no RoCE v2 GID with an IPv4 address (2 GIDs)")));
}

TEST(NcclRdmaEnvTest, VariablesTheUserSetAreKept) {
  FakeSysfs sysfs;
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "Ethernet", RoceGids("10.0.0.5", "net1"));

  NcclRdmaEnv decision =
      DecideFor(sysfs, kRoce, {{"NCCL_IB_HCA", "mlx5_0"}, {"NCCL_IB_GID_INDEX", "1"}});

  EXPECT_THAT(decision.set, IsEmpty());
  EXPECT_THAT(decision.log_lines,
              Contains("NCCL_IB_HCA=mlx5_0 (already in the environment, kept; found =mlx5_0:1)"));
  EXPECT_THAT(decision.log_lines,
              Contains("NCCL_IB_GID_INDEX=1 (already in the environment, kept; found 3)"));
}

TEST(NcclRdmaEnvTest, NcclEnvWinsOverTheEnvironmentAndTheProbe) {
  FakeSysfs sysfs;
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "Ethernet", RoceGids("10.0.0.5", "net1"));

  // The operator's pods already carry ncclEnv: nothing to change for NCCL_IB_GID_INDEX.
  NcclRdmaEnv in_pod =
      DecideFor(sysfs, kRoce, {{"NCCL_IB_GID_INDEX", "5"}}, {{"NCCL_IB_GID_INDEX", "5"}});
  EXPECT_THAT(in_pod.set, UnorderedElementsAre(Pair("NCCL_IB_HCA", "=mlx5_0:1")));
  EXPECT_THAT(in_pod.log_lines,
              Contains("NCCL_IB_GID_INDEX=5 (from spec.network.ncclEnv; found 3)"));

  // Elsewhere (lockstep run) ncclEnv's value replaces the environment's.
  NcclRdmaEnv local = DecideFor(sysfs, kRoce, {{"NCCL_IB_GID_INDEX", "1"}},
                                {{"NCCL_IB_GID_INDEX", "5"}, {"NCCL_IB_HCA", "=mlx5_0"}});
  EXPECT_THAT(local.set,
              UnorderedElementsAre(Pair("NCCL_IB_HCA", "=mlx5_0"), Pair("NCCL_IB_GID_INDEX", "5")));
}

TEST(NcclRdmaEnvTest, NoDevicesSetsNothingAndSaysSo) {
  FakeSysfs sysfs;

  NcclRdmaEnv decision = DecideFor(sysfs, kRoce);

  EXPECT_THAT(decision.set, IsEmpty());
  EXPECT_THAT(decision.log_lines,
              UnorderedElementsAre("no RDMA devices found; NCCL's IB settings left alone"));
}

TEST(NcclRdmaEnvTest, TcpModeLogsTheDevicesButSetsNothing) {
  FakeSysfs sysfs;
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "Ethernet", RoceGids("10.0.0.5", "net1"));

  NcclRdmaEnv decision = DecideFor(sysfs, kTcp);

  EXPECT_THAT(decision.set, IsEmpty());
  EXPECT_THAT(decision.log_lines, Contains(HasSubstr("mlx5_0 port 1: Ethernet (RoCE), active")));
  EXPECT_THAT(decision.log_lines, Contains("network mode tcp: NCCL's IB settings left alone"));
}

TEST(NcclRdmaEnvTest, DisabledIbTransportSetsNothing) {
  FakeSysfs sysfs;
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "InfiniBand", {{"fe80::1", "IB/RoCE v1", ""}});

  EXPECT_THAT(DecideFor(sysfs, kInfiniband, {}, {{"NCCL_IB_DISABLE", "1"}}).set, IsEmpty());
  EXPECT_THAT(DecideFor(sysfs, kInfiniband, {{"NCCL_NET", "Socket"}}).set, IsEmpty());
  // NCCL_IB_DISABLE=0 (what the operator sets for roce/infiniband) changes nothing.
  EXPECT_THAT(DecideFor(sysfs, kInfiniband, {{"NCCL_IB_DISABLE", "0"}}).set,
              UnorderedElementsAre(Pair("NCCL_IB_HCA", "=mlx5_0:1")));
}

TEST(NcclRdmaEnvTest, PortsOfTheOtherLinkLayerAreNotUsed) {
  FakeSysfs sysfs;
  sysfs.AddPort("mlx5_0", 1, "4: ACTIVE", "InfiniBand", {{"fe80::1", "IB/RoCE v1", ""}});
  sysfs.AddPort("mlx5_1", 1, "4: ACTIVE", "Ethernet", RoceGids("10.0.0.5", "eth1"));

  EXPECT_THAT(DecideFor(sysfs, kInfiniband).set,
              UnorderedElementsAre(Pair("NCCL_IB_HCA", "=mlx5_0:1")));

  FakeSysfs ib_only;
  ib_only.AddPort("mlx5_0", 1, "4: ACTIVE", "InfiniBand", {{"fe80::1", "IB/RoCE v1", ""}});
  NcclRdmaEnv decision = DecideFor(ib_only, kRoce);
  EXPECT_THAT(decision.set, IsEmpty());
  EXPECT_THAT(decision.log_lines,
              Contains("no active Ethernet (RoCE) port: NCCL_IB_HCA and NCCL_IB_GID_INDEX left "
                       "to NCCL"));
}

TEST(NcclRdmaEnvTest, DeviceThatCannotBeOpenedIsLoggedAndLeftOut) {
  RdmaDevice closed;
  closed.name = "mlx5_3";
  closed.open_error = "ibv_open_device: No such file or directory";
  RdmaDevice open;
  open.name = "mlx5_4";
  RdmaPort port;
  port.state = kPortStateActive;
  port.state_name = "ACTIVE";
  port.link_layer = RdmaLinkLayer::kInfiniBand;
  open.ports.push_back(port);

  NcclRdmaEnv decision = DecideNcclRdmaEnv({closed, open}, kInfiniband, {}, {});

  EXPECT_THAT(decision.set, UnorderedElementsAre(Pair("NCCL_IB_HCA", "=mlx5_4:1")));
  EXPECT_THAT(decision.log_lines,
              Contains("mlx5_3: cannot be used (ibv_open_device: No such file or directory)"));
}

TEST(NcclHcaFilterTest, FollowsNcclsSyntax) {
  EXPECT_TRUE(NcclHcaFilterSelects("", "mlx5_0", 1));
  EXPECT_TRUE(NcclHcaFilterSelects("mlx5", "mlx5_10", 1));      // prefix
  EXPECT_TRUE(NcclHcaFilterSelects("mlx5_1", "mlx5_10", 1));    // prefix, the trap
  EXPECT_FALSE(NcclHcaFilterSelects("=mlx5_1", "mlx5_10", 1));  // exact
  EXPECT_TRUE(NcclHcaFilterSelects("=mlx5_0:1,mlx5_1:1", "mlx5_1", 1));
  EXPECT_FALSE(NcclHcaFilterSelects("=mlx5_0:1,mlx5_1:1", "mlx5_1", 2));  // port
  EXPECT_FALSE(NcclHcaFilterSelects("^=mlx5_1,mlx5_4", "mlx5_4", 1));     // exclude
  EXPECT_TRUE(NcclHcaFilterSelects("^=mlx5_1,mlx5_4", "mlx5_0", 1));
  EXPECT_FALSE(NcclHcaFilterSelects("^mlx5", "mlx5_0", 1));
}

// On this machine (no RDMA devices, or libibverbs not built in) the start-up call sets nothing.
TEST(NcclRdmaSetupTest, WithoutDevicesTheEnvironmentIsUntouched) {
  const std::map<std::string, std::string> before = CurrentEnvironment();
  spec::NetworkSpec network;
  network.mode = kRoce;
  NcclRdmaEnv decision = SetUpNcclRdmaEnvironment(network);
  if (std::filesystem::exists("/sys/class/infiniband")) GTEST_SKIP() << "this machine has RDMA";
  EXPECT_THAT(decision.set, IsEmpty());
  EXPECT_EQ(CurrentEnvironment(), before);
}

}  // namespace
}  // namespace lockstep::rdma
