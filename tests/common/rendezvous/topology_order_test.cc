// OrderByTopology: pods grouped level by level (zone, block, rack, node), groups in the order of
// their first pod, pods in order within a group.
#include "common/rendezvous/topology_order.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace lockstep::rendezvous {
namespace {

using Places = std::unordered_map<std::string, TopologyPath>;
using Pods = std::vector<std::string>;

TEST(TopologyOrderTest, PodsOfARackBecomeContiguousInTheOrderOfEachRacksFirstPod) {
  const Places places = {{"a", {"r2"}}, {"b", {"r1"}}, {"c", {"r2"}}, {"d", {"r1"}},
                         {"e", {"r3"}}, {"f", {"r2"}}};
  EXPECT_EQ(OrderByTopology({"a", "b", "c", "d", "e", "f"}, places),
            (Pods{"a", "c", "f", "b", "d", "e"}));
}

TEST(TopologyOrderTest, EveryLevelIsContiguousWithinTheOneAboveIt) {
  // Two zones; in zone z1 two racks, interleaved with zone z2's pods.
  const Places places = {{"p0", {"z1", "r1", "n0"}}, {"p1", {"z2", "r3", "n1"}},
                         {"p2", {"z1", "r2", "n2"}}, {"p3", {"z2", "r3", "n3"}},
                         {"p4", {"z1", "r1", "n4"}}, {"p5", {"z1", "r2", "n2"}}};
  EXPECT_EQ(OrderByTopology({"p0", "p1", "p2", "p3", "p4", "p5"}, places),
            (Pods{"p0", "p4", "p2", "p5", "p1", "p3"}));
}

TEST(TopologyOrderTest, PodsOfOneNodeAreNeighbours) {
  const Places places = {{"a", {"r1", "n1"}}, {"b", {"r1", "n2"}}, {"c", {"r1", "n1"}}};
  EXPECT_EQ(OrderByTopology({"a", "b", "c"}, places), (Pods{"a", "c", "b"}));
}

TEST(TopologyOrderTest, AnOrderAlreadyFollowingTheNetworkIsKept) {
  const Places places = {{"a", {"r1"}}, {"b", {"r1"}}, {"c", {"r2"}}, {"d", {"r2"}}};
  EXPECT_EQ(OrderByTopology({"a", "b", "c", "d"}, places), (Pods{"a", "b", "c", "d"}));
  EXPECT_EQ(OrderByTopology({"c", "d", "a", "b"}, places), (Pods{"c", "d", "a", "b"}));
}

TEST(TopologyOrderTest, PodsWithoutAPlaceAreAGroupOfTheirOwn) {
  const Places places = {{"a", {"r1"}}, {"c", {"r1"}}};
  EXPECT_EQ(OrderByTopology({"x", "a", "y", "c"}, places), (Pods{"x", "y", "a", "c"}));
  EXPECT_EQ(OrderByTopology({"x", "y"}, {}), (Pods{"x", "y"}));
  EXPECT_TRUE(OrderByTopology({}, places).empty());
}

TEST(TopologyOrderTest, AShorterPathIsAGroupOfItsOwnAtTheLevelsItLacks) {
  // b's node has no rack label: under zone z1 it is apart from z1's racks.
  const Places places = {{"a", {"z1", "r1"}}, {"b", {"z1"}}, {"c", {"z1", "r1"}}};
  EXPECT_EQ(OrderByTopology({"a", "b", "c"}, places), (Pods{"a", "c", "b"}));
}

// 16,384 pods, 64 racks of 256, arriving round-robin over the racks: each rack one run.
TEST(TopologyOrderTest, ALargeInterleavedJobEndsWithOneRunPerRack) {
  constexpr int kRacks = 64, kPods = 16384;
  Places places;
  Pods pods;
  for (int i = 0; i < kPods; ++i) {
    pods.push_back("pod-" + std::to_string(i));
    places[pods.back()] = {"block-" + std::to_string(i % kRacks / 8),
                           "rack-" + std::to_string(i % kRacks)};
  }
  const Pods ordered = OrderByTopology(pods, places);
  ASSERT_EQ(ordered.size(), pods.size());
  EXPECT_EQ(std::set<std::string>(ordered.begin(), ordered.end()).size(), pods.size());
  int runs = 1;
  for (size_t i = 1; i < ordered.size(); ++i) {
    if (places.at(ordered[i])[1] != places.at(ordered[i - 1])[1]) ++runs;
  }
  EXPECT_EQ(runs, kRacks);
}

}  // namespace
}  // namespace lockstep::rendezvous
