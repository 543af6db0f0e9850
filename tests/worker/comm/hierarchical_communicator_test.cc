// Behaviour of the hierarchical communicator (shm inside a host, Gloo between hosts): the
// collectives, deadlines and refusals every backend shares (communicator_conformance.h), with
// the ranks of each world spread over hosts of two ranks each; and the layout it derives from
// the members' hosts. Every rank is a thread of this process; "hosts" are loopback addresses
// 127.0.0.1, 127.0.0.2, ... (Linux routes all of 127/8 to lo), so the Gloo pairs between hosts
// really connect address to address. The same communicator between network namespaces is
// tested by the pods test (tests/integration/pods).
#include "worker/comm/hierarchical/hierarchical_communicator.h"

#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tests/worker/comm/communicator_conformance.h"

namespace lockstep::comm {
namespace {

// Two ranks per host where the world allows it (else one), hosts numbered by rank / 2.
std::vector<std::string> LoopbackHosts(int world) {
  const int per_host = world >= 4 && world % 2 == 0 ? 2 : 1;
  std::vector<std::string> hosts;
  for (int rank = 0; rank < world; ++rank) {
    hosts.push_back("127.0.0." + std::to_string(1 + rank / per_host));
  }
  return hosts;
}

// The backend with each world's ranks placed on hosts by `hosts_of(world)`.
CommunicatorBackend OverHosts(std::function<std::vector<std::string>(int world)> hosts_of) {
  return CommunicatorBackend{
      .name = "shm+gloo",
      .create =
          [hosts_of](int rank, int world, rendezvous::KeyValueStore& store,
                     int64_t connect_timeout_ms) {
            HierarchicalOptions options;
            options.rank = rank;
            const std::vector<std::string> hosts = hosts_of(world);
            std::optional<HostLayout> layout = LayoutByHost(hosts);
            if (!layout) return StatusOr<std::unique_ptr<Communicator>>(InternalError("layout"));
            options.layout = *std::move(layout);
            // A rank outside the world (the refusal test) listens on the first host.
            options.host = rank < world ? hosts[rank] : hosts[0];
            options.job_name = "test/hierarchical";
            options.connect_timeout_ms = connect_timeout_ms;
            return CreateHierarchicalCommunicator(options, store);
          },
      // Gloo's TCP between hosts sets the precision.
      .deadline_early_ms = 50,
      .deadline_late_ms = 4500,
      .connect_late_ms = 2700,
      .code_after_error = std::nullopt,
      .point_to_point_limit =
          "shm+gloo connects a rank to its host's ranks and to the same local index on other "
          "hosts only (HierarchicalCommunicatorTest tests those)",
  };
}

const CommunicatorBackend& Hierarchical() {
  static const CommunicatorBackend backend = OverHosts(LoopbackHosts);
  return backend;
}

// 2 = 2 hosts x 1, 4 = 2 x 2, 6 = 3 x 2, 8 = 4 x 2.
INSTANTIATE_TEST_SUITE_P(Hierarchical, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceCases(Hierarchical(), {2, 4, 6, 8})),
                         ConformanceCaseName);
INSTANTIATE_TEST_SUITE_P(Hierarchical, CommunicatorErrorTest, ::testing::Values(&Hierarchical()),
                         BackendName);

TEST(HostLayoutTest, HostsAreNumberedByFirstRankAndRanksByRankOrder) {
  const std::optional<HostLayout> layout =
      LayoutByHost({"10.0.0.2", "10.0.0.1", "10.0.0.2", "10.0.0.1"});
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(layout->host_count, 2);
  EXPECT_EQ(layout->ranks_per_host, 2);
  EXPECT_EQ(layout->host_of, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(layout->local_of, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(layout->RankAt(0, 1), 2);
  EXPECT_EQ(layout->RankAt(1, 0), 1);
}

TEST(HostLayoutTest, ContiguousLayoutIsTheLayoutOfConsecutiveHosts) {
  const std::optional<HostLayout> by_host = LayoutByHost({"a", "a", "a", "b", "b", "b"});
  ASSERT_TRUE(by_host.has_value());
  const HostLayout contiguous = ContiguousLayout(2, 3);
  EXPECT_EQ(contiguous.host_count, by_host->host_count);
  EXPECT_EQ(contiguous.ranks_per_host, by_host->ranks_per_host);
  EXPECT_EQ(contiguous.host_of, by_host->host_of);
  EXPECT_EQ(contiguous.local_of, by_host->local_of);
  EXPECT_EQ(contiguous.ranks_of_host, by_host->ranks_of_host);
}

TEST(HostLayoutTest, UnequalHostsHaveNoLayout) {
  EXPECT_FALSE(LayoutByHost({"a", "a", "b"}).has_value());
  EXPECT_FALSE(LayoutByHost({}).has_value());
  EXPECT_TRUE(LayoutByHost({"a"}).has_value());
}

// Ranks interleaved over hosts (rank 0 and 2 on one host): every collective still answers by
// global rank.
TEST(HierarchicalCommunicatorTest, InterleavedRanksGatherAndBroadcastByGlobalRank) {
  const CommunicatorBackend interleaved = OverHosts([](int) {
    return std::vector<std::string>{"127.0.0.1", "127.0.0.2", "127.0.0.1", "127.0.0.2"};
  });
  Status status = RunRanks(interleaved, 4, [](int rank, Communicator& comm) -> Status {
    int64_t mine = 100 + rank;
    std::vector<int64_t> all(4);
    LOCKSTEP_RETURN_IF_ERROR(
        comm.AllGather(&mine, sizeof(mine), all.data(), kConformanceTimeoutMs));
    if (all != std::vector<int64_t>{100, 101, 102, 103}) return InternalError("all-gather order");
    int64_t value = rank == 3 ? 42 : -1;
    LOCKSTEP_RETURN_IF_ERROR(comm.Broadcast(&value, sizeof(value), 3, kConformanceTimeoutMs));
    if (value != 42) return InternalError("broadcast from rank 3 gave " + std::to_string(value));
    return CheckEveryAllReduce(rank, 4, comm);
  });
  EXPECT_TRUE(status.ok()) << status.ToString();
}

// Point to point goes through the communicator that connects the two ranks: a pipeline's
// stages on one host over shared memory, the same stage of two hosts over Gloo. A pair that
// neither connects (another host, another local index) is refused, naming both ranks' places.
TEST(HierarchicalCommunicatorTest, PointToPointReachesTheHostsRanksAndTheSameLocalIndexElsewhere) {
  // 2 hosts x 2: ranks 0, 1 on 127.0.0.1 and 2, 3 on 127.0.0.2.
  Status status = RunRanks(Hierarchical(), 4, [](int rank, Communicator& comm) -> Status {
    const int partner_on_host = rank ^ 1, same_index_elsewhere = rank ^ 2;
    for (int peer : {partner_on_host, same_index_elsewhere}) {
      std::vector<int64_t> out(1000, 100 * rank + peer), in(1000, -1);
      LOCKSTEP_RETURN_IF_ERROR(comm.SendRecv(out.data(), out.size() * 8, peer, in.data(),
                                             in.size() * 8, peer, kConformanceTimeoutMs));
      if (in != std::vector<int64_t>(1000, 100 * peer + rank)) {
        return InternalError("exchange with rank " + std::to_string(peer) + " received " +
                             std::to_string(in[0]));
      }
    }
    // Rank 0 and 3: another host and another local index.
    if (rank == 0 || rank == 3) {
      int64_t value = rank;
      Status refused = comm.Send(&value, sizeof(value), 3 - rank, kConformanceTimeoutMs);
      if (refused.code() != StatusCode::kUnimplemented ||
          refused.message().find("has no connection to rank " + std::to_string(3 - rank)) ==
              std::string::npos) {
        return InternalError("unconnected pair: " + refused.ToString());
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status.ToString();
}

}  // namespace
}  // namespace lockstep::comm
