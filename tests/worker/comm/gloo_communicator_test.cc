// Behaviour of the Gloo communicator: the collectives, deadlines and refusals every backend
// shares (communicator_conformance.h) at worlds of 1, 2 and 4 ranks, and what is Gloo's own: a
// peer whose connections close, an abort that cannot wake a blocked call, half conversion. Every
// rank runs as a thread of this process, bootstrapping through one in-memory store.
#include "worker/comm/gloo/gloo_communicator.h"

#include <gloo/transport/tcp/address.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/worker/comm/communicator_conformance.h"
#include "tests/worker/comm/memory_store.h"
#include "worker/comm/gloo/full_mesh.h"
#include "worker/comm/gloo/half_reduce.h"

namespace lockstep::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTimeoutMs = kConformanceTimeoutMs;

const CommunicatorBackend& Gloo() {
  static const CommunicatorBackend backend{
      .name = "gloo",
      .create =
          [](int rank, int world, rendezvous::KeyValueStore& store, int64_t connect_timeout_ms) {
            GlooOptions options;
            options.rank = rank;
            options.size = world;
            options.connect_timeout_ms = connect_timeout_ms;
            return CreateGlooCommunicator(options, store);
          },
      // TCP: a deadline is kept to within a few scheduler quanta either way.
      .deadline_early_ms = 50,
      .deadline_late_ms = 4500,
      .connect_late_ms = 2700,
      .code_after_error = std::nullopt,
  };
  return backend;
}

INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceCases(Gloo(), {1, 2, 4})),
                         ConformanceCaseName);
INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorErrorTest, ::testing::Values(&Gloo()), BackendName);

TEST(GlooCommunicatorTest, PeerDestroyedMidRunMakesNextCollectiveFailBeforeDeadline) {
  testing::MemoryKeyValueStore store;
  std::promise<void> rank1_destroyed;
  auto rank1_destroyed_future = rank1_destroyed.get_future();
  Status rank0_status;
  Status rank0_result;
  int64_t rank0_elapsed_ms = -1;
  std::thread rank0([&] {
    GlooOptions options{0, 2, "127.0.0.1", kTimeoutMs};
    auto comm = CreateGlooCommunicator(options, store);
    if (!comm.ok()) {
      rank0_status = comm.status();
      return;
    }
    std::vector<double> data(4096, 1.0);
    rank0_status = (*comm)->AllReduce(data.data(), data.size(), DataType::kFloat64, ReduceOp::kSum,
                                      kTimeoutMs);
    if (rank1_destroyed_future.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      rank0_status = InternalError("rank 1 never destroyed its communicator");
      return;
    }
    const auto start = Clock::now();
    rank0_result = (*comm)->AllReduce(data.data(), data.size(), DataType::kFloat64, ReduceOp::kSum,
                                      kTimeoutMs);
    rank0_elapsed_ms = MsSince(start);
  });
  std::thread rank1([&] {
    GlooOptions options{1, 2, "127.0.0.1", kTimeoutMs};
    auto comm = CreateGlooCommunicator(options, store);
    if (comm.ok()) {
      std::vector<double> data(4096, 2.0);
      Status status = (*comm)->AllReduce(data.data(), data.size(), DataType::kFloat64,
                                         ReduceOp::kSum, kTimeoutMs);
      EXPECT_TRUE(status.ok()) << status;
      comm = InternalError("destroyed");  // drops the communicator
    }
    rank1_destroyed.set_value();
  });
  rank0.join();
  rank1.join();
  ASSERT_TRUE(rank0_status.ok()) << rank0_status;
  EXPECT_EQ(rank0_result.code(), StatusCode::kUnavailable) << rank0_result;
  EXPECT_NE(rank0_result.message().find("rank 1"), std::string::npos) << rank0_result;
  EXPECT_LT(rank0_elapsed_ms, kTimeoutMs);
}

// Abort() wakes a call already blocked in a collective (socket_shutdown.h: libgloo 0.5 cannot
// itself), so it returns ABORTED long before its own deadline, even when no peer resets its
// connection first (the peer here never joins); the peers fail at once, and later calls too.
TEST(GlooCommunicatorTest, AbortMakesBlockedAndLaterCallsFailWithAbortedAtOnce) {
  constexpr int64_t kBlockedTimeoutMs = 60000;
  std::promise<void> rank0_done;
  auto rank0_done_future = rank0_done.get_future();
  Status status = RunRanks(Gloo(), 2, [&](int rank, Communicator& comm) -> Status {
    if (rank == 1) {
      // Never joins the collective; once rank 0 aborted, its own next call must fail promptly
      // because the aborting rank closed its connections.
      if (rank0_done_future.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
        return InternalError("rank 0 never finished");
      }
      const auto start = Clock::now();
      Status next = comm.Barrier(kTimeoutMs);
      EXPECT_EQ(next.code(), StatusCode::kUnavailable) << next;
      EXPECT_LT(MsSince(start), kTimeoutMs / 4);
      return OkStatus();
    }
    std::promise<void> entered;
    auto entered_future = entered.get_future();
    std::thread aborter([&] {
      entered_future.wait();
      // Not synchronisation: whether Abort lands before or during the call, the call must
      // return ABORTED; the pause only makes "during" the likely case.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      comm.Abort("test abort");
    });
    std::vector<float> data(1 << 16, 1.0f);
    const auto start = Clock::now();
    entered.set_value();
    Status blocked = comm.AllReduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum,
                                    kBlockedTimeoutMs);
    const int64_t elapsed_ms = MsSince(start);
    aborter.join();
    EXPECT_EQ(blocked.code(), StatusCode::kAborted) << blocked;
    EXPECT_NE(blocked.message().find("test abort"), std::string::npos) << blocked;
    EXPECT_LT(elapsed_ms, kBlockedTimeoutMs / 10) << "woken by the abort, not its deadline";
    comm.Abort("again");  // idempotent
    const auto later_start = Clock::now();
    for (Status later :
         {comm.Barrier(kTimeoutMs), comm.Broadcast(data.data(), 4, 0, kTimeoutMs),
          comm.AllGather(data.data(), 4, data.data() + 8, kTimeoutMs),
          comm.AllReduce(data.data(), 1, DataType::kFloat32, ReduceOp::kMax, kTimeoutMs)}) {
      EXPECT_EQ(later.code(), StatusCode::kAborted) << later;
    }
    // At once, not at their deadline: a tenth of it (2 s for 4 calls) is far above any stall.
    EXPECT_LT(MsSince(later_start), kTimeoutMs / 10);
    rank0_done.set_value();
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// A store through which every pair's listening port also receives a stray connection, made and
// closed just before the rank that will connect there reads the address: what libgloo takes for
// the peer when a client still retrying some server that has gone reaches a port the kernel handed
// out again. `attempts` says which tries at the mesh get strays.
class StrayConnectionStore : public testing::MemoryKeyValueStore {
 public:
  explicit StrayConnectionStore(int attempts) : attempts_(attempts) {}

  StatusOr<std::vector<std::string>> GetRange(const std::vector<std::string>& keys, size_t offset,
                                              size_t length, int64_t timeout_ms) override {
    auto records = KeyValueStore::GetRange(keys, offset, length, timeout_ms);
    if (!records.ok() || !ForAStrayedAttempt(keys)) return records;
    for (const std::string& record : *records) {
      const sockaddr_storage address =
          ::gloo::transport::tcp::Address(std::vector<char>(record.begin(), record.end()))
              .getSockaddr();
      const int fd = socket(address.ss_family, SOCK_STREAM, 0);
      if (fd < 0) continue;
      if (connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(sockaddr_in)) == 0) {
        ++strays;
      }
      close(fd);
    }
    return records;
  }

  std::atomic<int> strays{0};

 private:
  bool ForAStrayedAttempt(const std::vector<std::string>& keys) const {
    for (int attempt = 0; attempt < attempts_; ++attempt) {
      if (keys.front().rfind("gloo/pairs/" + std::to_string(attempt) + "/", 0) == 0) return true;
    }
    return false;
  }
  const int attempts_;
};

bool Has(testing::MemoryKeyValueStore& store, const std::string& key) {
  return store.Get({key}, 0).ok();
}

TEST(GlooCommunicatorTest, AStrayConnectionToAPairsPortIsMendedByConnectingTheMeshAgain) {
  constexpr int kWorld = 3;
  StrayConnectionStore store(/*attempts=*/1);
  Status status = RunRanks(
      Gloo(), kWorld,
      [&](int rank, Communicator& comm) -> Status {
        std::vector<double> data(1000, rank + 1.0);
        LOCKSTEP_RETURN_IF_ERROR(comm.AllReduce(data.data(), data.size(), DataType::kFloat64,
                                                ReduceOp::kSum, kTimeoutMs));
        if (data.front() != 6.0 || data.back() != 6.0) return InternalError("wrong sum");
        return OkStatus();
      },
      &store);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_GT(store.strays.load(), 0);
  // The first attempt failed, and every rank agreed; the second connected.
  auto first = store.Get({"gloo/verdict/0"}, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_NE(first->front().find("rank "), std::string::npos) << first->front();
  auto second = store.Get({"gloo/verdict/1"}, 0);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->front(), "");
  EXPECT_FALSE(Has(store, "gloo/pairs/2/0"));
}

TEST(GlooCommunicatorTest, AMeshThatNeverConnectsFailsOnEveryRankAfterItsLastAttempt) {
  constexpr int kWorld = 3;
  StrayConnectionStore store(/*attempts=*/kConnectAttempts);
  std::vector<Status> results(kWorld);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      auto comm = CreateGlooCommunicator(GlooOptions{rank, kWorld, "127.0.0.1", kTimeoutMs}, store);
      results[rank] = comm.status();
    });
  }
  for (auto& rank : ranks) rank.join();
  // Every pair of every rank failed at every attempt, and every rank still reached the
  // verdict: a failed pair did not stop a rank connecting its others.
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_EQ(results[rank].code(), StatusCode::kUnavailable) << "rank " << rank << ": "
                                                              << results[rank];
  }
  EXPECT_TRUE(Has(store, "gloo/verdict/" + std::to_string(kConnectAttempts - 1)));
  EXPECT_FALSE(Has(store, "gloo/pairs/" + std::to_string(kConnectAttempts) + "/0"));
}

// libgloo writes with writev(2): a write on a socket an abort shut down (or a peer reset) must fail
// with EPIPE, which the collective turns into an error, and not raise SIGPIPE, whose default
// action would end the whole worker. Creating a communicator sees to it.
TEST(GlooCommunicatorTest, AWriteToAShutDownSocketFailsInsteadOfEndingTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        testing::MemoryKeyValueStore store;
        auto comm = CreateGlooCommunicator(GlooOptions{0, 1, "127.0.0.1", kTimeoutMs}, store);
        if (!comm.ok()) _exit(3);
        int fds[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) _exit(4);
        shutdown(fds[0], SHUT_WR);
        const char byte = 'x';
        const bool failed_with_epipe = write(fds[0], &byte, 1) == -1 && errno == EPIPE;
        _exit(failed_with_epipe ? 0 : 5);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(HalfConversionTest, RoundsToNearestEvenAndKeepsSpecialValues) {
  EXPECT_EQ(FloatToFloat16(1.0f), 0x3C00);
  EXPECT_EQ(FloatToFloat16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToFloat16(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToFloat16(1e6f), 0x7C00);
  EXPECT_EQ(FloatToFloat16(1.0f + 1.0f / 2048), 0x3C00);  // tie rounds to even
  EXPECT_EQ(Float16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_TRUE(std::isnan(Float16ToFloat(FloatToFloat16(std::nanf("")))));
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(BFloat16ToFloat(0x4040), 3.0f);
  EXPECT_EQ(FloatToBFloat16(1.0f + 1.0f / 256), 0x3F80);  // tie rounds to even
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  for (int i = -2048; i <= 2048; ++i) {
    EXPECT_EQ(Float16ToFloat(FloatToFloat16(static_cast<float>(i))), static_cast<float>(i));
  }
}

}  // namespace
}  // namespace lockstep::comm
