// The Gloo communicator's pair-address exchange (worker/comm/gloo/pair_addresses.h): each rank
// gets exactly the record each peer published for it, and reads no more of the store than those;
// and the verdict after an attempt at the mesh, the same on every rank.
#include "worker/comm/gloo/pair_addresses.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "tests/worker/comm/memory_store.h"

namespace lockstep::comm {
namespace {

// What `rank`'s pair with `peer` listens on, as a record of `bytes` bytes.
std::string Address(int rank, int peer, size_t bytes = 16) {
  std::string address = std::to_string(rank) + "->" + std::to_string(peer);
  address.resize(bytes, '.');
  return address;
}

// Counts the bytes the store answers with.
class CountingStore : public testing::MemoryKeyValueStore {
 public:
  StatusOr<std::vector<std::string>> GetRange(const std::vector<std::string>& keys, size_t offset,
                                              size_t length, int64_t timeout_ms) override {
    auto values = KeyValueStore::GetRange(keys, offset, length, timeout_ms);
    if (values.ok()) {
      for (const auto& value : *values) bytes_read += value.size();
    }
    return values;
  }
  std::atomic<size_t> bytes_read{0};
};

TEST(PairAddressesTest, EveryRankGetsTheRecordEachPeerPublishedForItAndOnlyThose) {
  for (int size : {1, 2, 3, 7}) {
    CountingStore store;
    std::vector<StatusOr<std::vector<std::string>>> results(size, std::vector<std::string>{});
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < size; ++rank) {
      ranks.emplace_back([&, rank] {
        std::vector<std::string> mine(size);
        for (int peer = 0; peer < size; ++peer) {
          if (peer != rank) mine[peer] = Address(rank, peer);
        }
        results[rank] = ExchangePairAddresses(store, rank, size, mine, 0, Deadline::AfterMs(5000));
      });
    }
    for (auto& rank : ranks) rank.join();
    for (int rank = 0; rank < size; ++rank) {
      ASSERT_TRUE(results[rank].ok()) << results[rank].status();
      for (int peer = 0; peer < size; ++peer) {
        EXPECT_EQ((*results[rank])[peer], peer == rank ? "" : Address(peer, rank))
            << "rank " << rank << " of " << size;
      }
    }
    // Each rank received one 16-byte record per peer: (size - 1) * size records in all.
    EXPECT_EQ(store.bytes_read.load(), static_cast<size_t>(size * (size - 1) * 16)) << size;
  }
}

TEST(PairAddressesTest, AddressesOfDifferentSizesAreRefusedNamingThePeer) {
  testing::MemoryKeyValueStore store;
  std::vector<std::string> mine = {"", Address(0, 1), Address(0, 2, 20)};
  auto result = ExchangePairAddresses(store, 0, 3, mine, 0, Deadline::AfterMs(1000));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("peer 2"), std::string::npos) << result.status();
}

TEST(PairAddressesTest, APeerThatNeverPublishesFailsTheExchangeAtItsDeadline) {
  testing::MemoryKeyValueStore store;
  std::vector<std::string> mine = {"", Address(0, 1)};
  auto result = ExchangePairAddresses(store, 0, 2, mine, 0, Deadline::AfterMs(100));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kDeadlineExceeded) << result.status();
}

// Runs AgreeOnConnect on `said.size()` ranks, rank r saying said[r], and returns what each got.
std::vector<Status> Agree(rendezvous::KeyValueStore& store, const std::vector<Status>& said,
                          int attempt = 0, bool rank0_may_retry = true) {
  const int size = static_cast<int>(said.size());
  std::vector<Status> got(size);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < size; ++rank) {
    ranks.emplace_back([&, rank] {
      // Only rank 0's may_retry counts; the others' differs here to show it.
      const bool may_retry = rank == 0 ? rank0_may_retry : !rank0_may_retry;
      got[rank] = AgreeOnConnect(store, rank, size, attempt, said[rank], may_retry,
                                 Deadline::AfterMs(5000));
    });
  }
  for (auto& rank : ranks) rank.join();
  return got;
}

TEST(AgreeOnConnectTest, EveryRankConnectedIsAgreedByAll) {
  testing::MemoryKeyValueStore store;
  for (const Status& got : Agree(store, std::vector<Status>(4))) EXPECT_TRUE(got.ok()) << got;
}

TEST(AgreeOnConnectTest, OneRanksResetConnectionMakesEveryRankTryAgainNamingIt) {
  testing::MemoryKeyValueStore store;
  std::vector<Status> said(4);
  said[2] = UnavailableError("connection reset");
  for (const Status& got : Agree(store, said)) {
    EXPECT_EQ(got.code(), StatusCode::kUnavailable) << got;
    EXPECT_NE(got.message().find("rank 2: connection reset"), std::string::npos) << got;
  }
  // The next attempt's verdict is its own.
  for (const Status& got : Agree(store, std::vector<Status>(4), 1)) EXPECT_TRUE(got.ok()) << got;
}

TEST(AgreeOnConnectTest, AFailureNoAttemptMendsEndsEveryRanksTries) {
  testing::MemoryKeyValueStore store;
  std::vector<Status> said(3);
  said[0] = UnavailableError("connection reset");
  said[2] = InternalError("address family mismatch");
  for (const Status& got : Agree(store, said)) {
    EXPECT_EQ(got.code(), StatusCode::kInternal) << got;
    EXPECT_NE(got.message().find("rank 2: address family mismatch"), std::string::npos) << got;
  }
}

TEST(AgreeOnConnectTest, WhenRankZeroAllowsNoNewAttemptEveryRankStops) {
  testing::MemoryKeyValueStore store;
  std::vector<Status> said(3);
  said[1] = UnavailableError("connection reset");
  for (const Status& got : Agree(store, said, 0, /*rank0_may_retry=*/false)) {
    EXPECT_EQ(got.code(), StatusCode::kInternal) << got;
    EXPECT_NE(got.message().find("rank 1: connection reset"), std::string::npos) << got;
  }
}

TEST(AgreeOnConnectTest, ARankThatNeverSaysEndsTheWaitAtTheDeadline) {
  testing::MemoryKeyValueStore store;
  Status got = AgreeOnConnect(store, 0, 2, 0, OkStatus(), true, Deadline::AfterMs(100));
  EXPECT_EQ(got.code(), StatusCode::kDeadlineExceeded) << got;
}

}  // namespace
}  // namespace lockstep::comm
