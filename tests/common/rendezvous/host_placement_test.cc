// Where each member sits among a generation's hosts, as the rendezvous service tells it (and as
// the client works it out from an older service's member list).
#include "common/rendezvous/host_placement.h"

#include <gtest/gtest.h>

#include "common/rendezvous/wire.h"

namespace lockstep::rendezvous {
namespace {

TEST(HostPlacementTest, HostsAreNumberedByFirstRankAndLocalRanksByRank) {
  const std::vector<HostPlacement> placed = PlaceOnHosts({"b", "b", "a", "a", "c", "c"});
  ASSERT_EQ(placed.size(), 6u);
  for (int rank = 0; rank < 6; ++rank) {
    EXPECT_EQ(placed[rank].host_rank, rank / 2) << rank;
    EXPECT_EQ(placed[rank].local_rank, rank % 2) << rank;
    EXPECT_EQ(placed[rank].local_size, 2) << rank;
    EXPECT_EQ(placed[rank].host_count, 3) << rank;
    EXPECT_TRUE(placed[rank].contiguous) << rank;
  }
}

TEST(HostPlacementTest, InterleavedOrUnequalHostsAreNotContiguous) {
  const std::vector<HostPlacement> interleaved = PlaceOnHosts({"a", "b", "a", "b"});
  EXPECT_FALSE(interleaved[0].contiguous);
  EXPECT_EQ(interleaved[2].host_rank, 0);
  EXPECT_EQ(interleaved[2].local_rank, 1);
  EXPECT_EQ(interleaved[3].local_size, 2);

  const std::vector<HostPlacement> unequal = PlaceOnHosts({"a", "a", "b"});
  EXPECT_FALSE(unequal[0].contiguous);
  EXPECT_EQ(unequal[0].local_size, 2);
  EXPECT_EQ(unequal[2].local_size, 1);
  EXPECT_EQ(unequal[2].host_count, 2);
}

TEST(HostPlacementTest, OneHostAndOneRankPerHostAreContiguous) {
  const std::vector<HostPlacement> one_host = PlaceOnHosts({"127.0.0.1", "127.0.0.1", "127.0.0.1"});
  EXPECT_EQ(one_host[2].host_count, 1);
  EXPECT_EQ(one_host[2].local_rank, 2);
  EXPECT_EQ(one_host[2].local_size, 3);
  EXPECT_TRUE(one_host[2].contiguous);
  const std::vector<HostPlacement> spread = PlaceOnHosts({"a", "b", "c"});
  EXPECT_EQ(spread[1].host_rank, 1);
  EXPECT_EQ(spread[1].local_size, 1);
  EXPECT_TRUE(spread[1].contiguous);
  EXPECT_TRUE(PlaceOnHosts({}).empty());
}

// A service of an older version sends every member's record and no placement: the client places
// the member from the list, so exec mode's LOCAL_RANK and the communicator's choice stay right.
TEST(HostPlacementTest, AnOlderServicesMemberListPlacesTheMember) {
  v1::JoinResponse response;
  response.set_rank(3);
  response.set_world_size(4);
  for (const char* host : {"10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"}) {
    response.add_members()->set_host(host);
  }
  const Assignment a = FromProto(response);
  EXPECT_EQ(a.first_host, "10.0.0.1");
  EXPECT_EQ(a.host.host_rank, 1);
  EXPECT_EQ(a.host.host_count, 2);
  EXPECT_EQ(a.host.local_rank, 1);
  EXPECT_EQ(a.host.local_size, 2);
  EXPECT_TRUE(a.host.contiguous);
}

}  // namespace
}  // namespace lockstep::rendezvous
