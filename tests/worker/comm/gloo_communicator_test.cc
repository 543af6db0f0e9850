// Behaviour of the Gloo communicator: every rank runs as a thread of this process, bootstrapping
// through one in-memory store; each rank's first failure is surfaced by RunRanks.
#include "worker/comm/gloo/gloo_communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/worker/comm/memory_store.h"
#include "worker/comm/gloo/half_reduce.h"

namespace lockstep::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTimeoutMs = 20000;

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// Runs body(rank, communicator) on `world` threads and returns the first failure in time
// (prefixed with its rank), or OK. A failing rank drops its communicator, which makes its peers
// fail too; reporting the earliest failure surfaces the cause, not the consequence.
Status RunRanks(int world, const std::function<Status(int, Communicator&)>& body) {
  testing::MemoryKeyValueStore store;
  std::mutex first_failure_mu;
  Status first_failure;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions options;
      options.rank = rank;
      options.size = world;
      options.connect_timeout_ms = kTimeoutMs;
      auto communicator = CreateGlooCommunicator(options, store);
      Status status = communicator.ok() ? body(rank, **communicator) : communicator.status();
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(first_failure_mu);
        if (first_failure.ok()) first_failure = status.WithContext("rank " + std::to_string(rank));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return first_failure;
}

// A value that differs per rank and per element, small enough to be exact in every type.
int64_t Value(int rank, size_t i) {
  return static_cast<int64_t>((i % 61) + 1) * (rank + 1) - 3 * rank;
}

int64_t HalfValue(int rank, size_t i) { return static_cast<int64_t>(i % 13) + rank; }

int64_t Expected(int world, size_t i, ReduceOp op) {
  int64_t result = Value(0, i);
  for (int rank = 1; rank < world; ++rank) {
    const int64_t v = Value(rank, i);
    switch (op) {
      case ReduceOp::kSum:
        result += v;
        break;
      case ReduceOp::kMax:
        result = std::max(result, v);
        break;
      case ReduceOp::kMin:
        result = std::min(result, v);
        break;
    }
  }
  return result;
}

template <typename T>
Status CheckAllReduce(int rank, int world, Communicator& comm, size_t count, DataType type,
                      ReduceOp op) {
  std::vector<T> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = static_cast<T>(Value(rank, i));
  LOCKSTEP_RETURN_IF_ERROR(comm.AllReduce(data.data(), count, type, op, kTimeoutMs));
  for (size_t i = 0; i < count; ++i) {
    if (data[i] != static_cast<T>(Expected(world, i, op))) {
      return InternalError(std::string(DataTypeName(type)) + " count " + std::to_string(count) +
                           " op " + std::to_string(static_cast<int>(op)) + ": element " +
                           std::to_string(i) + " is " + std::to_string(data[i]) + ", expected " +
                           std::to_string(Expected(world, i, op)));
    }
  }
  return OkStatus();
}

class GlooCommunicatorWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooCommunicatorWorldTest, AllReduceComputesExactSumMaxMinForEveryTypeAndSize) {
  const int world = GetParam();
  const std::vector<size_t> byte_sizes_of_4mib = {4u << 20};
  Status status = RunRanks(world, [world](int rank, Communicator& comm) -> Status {
    EXPECT_EQ(comm.backend(), "gloo");
    EXPECT_EQ(comm.size(), world);
    EXPECT_EQ(comm.rank(), rank);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{1001}}) {
        LOCKSTEP_RETURN_IF_ERROR(
            CheckAllReduce<float>(rank, world, comm, count, DataType::kFloat32, op));
        LOCKSTEP_RETURN_IF_ERROR(
            CheckAllReduce<double>(rank, world, comm, count, DataType::kFloat64, op));
        LOCKSTEP_RETURN_IF_ERROR(
            CheckAllReduce<int64_t>(rank, world, comm, count, DataType::kInt64, op));
      }
      // 4 MiB of each type.
      LOCKSTEP_RETURN_IF_ERROR(
          CheckAllReduce<float>(rank, world, comm, (4u << 20) / 4, DataType::kFloat32, op));
      LOCKSTEP_RETURN_IF_ERROR(
          CheckAllReduce<double>(rank, world, comm, (4u << 20) / 8, DataType::kFloat64, op));
      LOCKSTEP_RETURN_IF_ERROR(
          CheckAllReduce<int64_t>(rank, world, comm, (4u << 20) / 8, DataType::kInt64, op));
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(GlooCommunicatorWorldTest, AllReduceReusesTheSameBufferAcrossSteps) {
  const int world = GetParam();
  Status status = RunRanks(world, [world](int rank, Communicator& comm) -> Status {
    std::vector<float> gradients(100003);
    for (int step = 0; step < 5; ++step) {
      std::fill(gradients.begin(), gradients.end(), static_cast<float>(rank + step));
      LOCKSTEP_RETURN_IF_ERROR(comm.AllReduce(gradients.data(), gradients.size(),
                                              DataType::kFloat32, ReduceOp::kSum, kTimeoutMs));
      const float expected = static_cast<float>(world * (world - 1) / 2 + world * step);
      for (float g : gradients) {
        if (g != expected)
          return InternalError("step " + std::to_string(step) + ": got " + std::to_string(g));
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(GlooCommunicatorWorldTest, AllReduceOfHalfTypesSumsExactlyRepresentableValues) {
  const int world = GetParam();
  Status status = RunRanks(world, [world](int rank, Communicator& comm) -> Status {
    for (DataType type : {DataType::kBFloat16, DataType::kFloat16}) {
      auto to_half = type == DataType::kBFloat16 ? &FloatToBFloat16 : &FloatToFloat16;
      auto to_float = type == DataType::kBFloat16 ? &BFloat16ToFloat : &Float16ToFloat;
      for (size_t count : {size_t{1}, size_t{9}, size_t{2u << 20}}) {
        std::vector<uint16_t> data(count);
        // Small values, so that every partial sum along the ring is exact in 8 bits too.
        for (size_t i = 0; i < count; ++i)
          data[i] = to_half(static_cast<float>(HalfValue(rank, i)));
        LOCKSTEP_RETURN_IF_ERROR(
            comm.AllReduce(data.data(), count, type, ReduceOp::kSum, kTimeoutMs));
        for (size_t i = 0; i < count; ++i) {
          float expected = 0;
          for (int r = 0; r < world; ++r) expected += static_cast<float>(HalfValue(r, i));
          if (to_float(data[i]) != expected) {
            return InternalError(std::string(DataTypeName(type)) + " element " + std::to_string(i) +
                                 ": got " + std::to_string(to_float(data[i])) + ", expected " +
                                 std::to_string(expected));
          }
        }
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(GlooCommunicatorWorldTest, BroadcastFromEveryRootReachesEveryRank) {
  const int world = GetParam();
  Status status = RunRanks(world, [world](int rank, Communicator& comm) -> Status {
    for (int root = 0; root < world; ++root) {
      for (size_t bytes : {size_t{1}, size_t{13}, size_t{4u << 20}}) {
        std::vector<uint8_t> data(bytes, static_cast<uint8_t>(0xA0 + rank));
        LOCKSTEP_RETURN_IF_ERROR(comm.Broadcast(data.data(), bytes, root, kTimeoutMs));
        for (uint8_t b : data) {
          if (b != static_cast<uint8_t>(0xA0 + root)) {
            return InternalError("root " + std::to_string(root) + " bytes " +
                                 std::to_string(bytes) + ": got byte " + std::to_string(b));
          }
        }
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(GlooCommunicatorWorldTest, AllGatherPlacesEveryRanksBytesInItsSlot) {
  const int world = GetParam();
  Status status = RunRanks(world, [world](int rank, Communicator& comm) -> Status {
    for (size_t bytes : {size_t{1}, size_t{17}, size_t{1u << 20}}) {
      std::vector<uint8_t> in(bytes);
      for (size_t i = 0; i < bytes; ++i) in[i] = static_cast<uint8_t>(rank * 31 + i);
      std::vector<uint8_t> out(bytes * world, 0xFF);
      LOCKSTEP_RETURN_IF_ERROR(comm.AllGather(in.data(), bytes, out.data(), kTimeoutMs));
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < bytes; ++i) {
          if (out[r * bytes + i] != static_cast<uint8_t>(r * 31 + i)) {
            return InternalError("slot of rank " + std::to_string(r) + " byte " +
                                 std::to_string(i) + " wrong");
          }
        }
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(GlooCommunicatorWorldTest, BarrierReleasesNoRankBeforeAllArrive) {
  const int world = GetParam();
  std::atomic<int> arrived{0};
  Status status = RunRanks(world, [&](int rank, Communicator& comm) -> Status {
    for (int round = 1; round <= 3; ++round) {
      arrived.fetch_add(1);
      LOCKSTEP_RETURN_IF_ERROR(comm.Barrier(kTimeoutMs));
      if (arrived.load() < round * world) {
        return InternalError("left barrier round " + std::to_string(round) + " with only " +
                             std::to_string(arrived.load()) + " arrivals");
      }
      // Second barrier so that no rank starts the next round's arrival before all checked.
      LOCKSTEP_RETURN_IF_ERROR(comm.Barrier(kTimeoutMs));
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooCommunicatorWorldTest, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "World" + std::to_string(info.param); });

TEST(GlooCommunicatorTest, CollectiveWithAbsentRankReturnsDeadlineExceededWithinTimeout) {
  constexpr int64_t kShortTimeoutMs = 500;
  std::promise<void> rank0_done;
  auto rank0_done_future = rank0_done.get_future();
  Status status = RunRanks(2, [&](int rank, Communicator& comm) -> Status {
    if (rank == 1) {
      // Joined the mesh but never takes part; stays alive until rank 0 has its answer.
      if (rank0_done_future.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
        return InternalError("rank 0 never finished");
      }
      return OkStatus();
    }
    std::vector<float> data(1000, 1.0f);
    const auto start = Clock::now();
    Status result = comm.AllReduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum,
                                   kShortTimeoutMs);
    const int64_t elapsed_ms = MsSince(start);
    rank0_done.set_value();
    EXPECT_EQ(result.code(), StatusCode::kDeadlineExceeded) << result;
    EXPECT_GE(elapsed_ms, kShortTimeoutMs - 50);
    EXPECT_LT(elapsed_ms, kShortTimeoutMs + 2000);
    // After an error the communicator refuses further work at once.
    Status later = comm.Barrier(kShortTimeoutMs);
    EXPECT_FALSE(later.ok());
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

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

// libgloo 0.5 cannot wake a call already blocked in a collective (see Abort() in
// gloo_communicator.cc): that call returns ABORTED at its own deadline; the peers fail at once
// because Abort() resets the connections, and later calls fail at once.
TEST(GlooCommunicatorTest, AbortMakesBlockedAndLaterCallsFailWithAborted) {
  constexpr int64_t kBlockedTimeoutMs = 1500;
  std::promise<void> rank0_done;
  auto rank0_done_future = rank0_done.get_future();
  Status status = RunRanks(2, [&](int rank, Communicator& comm) -> Status {
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
    EXPECT_LT(elapsed_ms, kBlockedTimeoutMs + 2000);
    comm.Abort("again");  // idempotent
    const auto later_start = Clock::now();
    for (Status later :
         {comm.Barrier(kTimeoutMs), comm.Broadcast(data.data(), 4, 0, kTimeoutMs),
          comm.AllGather(data.data(), 4, data.data() + 8, kTimeoutMs),
          comm.AllReduce(data.data(), 1, DataType::kFloat32, ReduceOp::kMax, kTimeoutMs)}) {
      EXPECT_EQ(later.code(), StatusCode::kAborted) << later;
    }
    EXPECT_LT(MsSince(later_start), 100);
    rank0_done.set_value();
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GlooCommunicatorTest, CreateWithoutPeersReturnsDeadlineExceeded) {
  testing::MemoryKeyValueStore store;
  GlooOptions options{0, 2, "127.0.0.1", 300};
  const auto start = Clock::now();
  auto comm = CreateGlooCommunicator(options, store);
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_LT(MsSince(start), 300 + 2000);
}

TEST(GlooCommunicatorTest, InvalidArgumentsAreRejected) {
  testing::MemoryKeyValueStore store;
  GlooOptions options{2, 2, "127.0.0.1", 300};
  EXPECT_EQ(CreateGlooCommunicator(options, store).status().code(), StatusCode::kInvalidArgument);
  Status status = RunRanks(1, [](int, Communicator& comm) -> Status {
    float x = 1;
    EXPECT_EQ(comm.Broadcast(&x, 4, 1, kTimeoutMs).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.AllReduce(&x, 1, DataType::kFloat32, ReduceOp::kSum, 0).code(),
              StatusCode::kInvalidArgument);
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
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
