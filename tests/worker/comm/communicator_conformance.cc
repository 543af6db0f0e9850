#include "tests/worker/comm/communicator_conformance.h"

#include <cctype>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <ostream>
#include <thread>

#include "tests/worker/comm/memory_store.h"
#include "worker/comm/gloo/half_reduce.h"

namespace lockstep::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTimeoutMs = kConformanceTimeoutMs;

class HostBufferSpace : public BufferSpace {
 public:
  void* Allocate(size_t bytes) override { return ::operator new(bytes > 0 ? bytes : 1); }
  void Free(void* data) override { ::operator delete(data); }
  void CopyIn(void* to, const void* host, size_t bytes) override { std::memcpy(to, host, bytes); }
  void CopyOut(void* host, const void* from, size_t bytes) override {
    std::memcpy(host, from, bytes);
  }
};

// A value that differs per rank and per element, small enough to be exact in every type.
int64_t Value(int rank, size_t i) {
  return static_cast<int64_t>((i % 61) + 1) * (rank + 1) - 3 * rank;
}

template <typename V>
V Reduce(V a, V b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kMin:
      return std::min(a, b);
  }
  return a;
}

int64_t Expected(int world, size_t i, ReduceOp op) {
  int64_t result = Value(0, i);
  for (int rank = 1; rank < world; ++rank) result = Reduce(result, Value(rank, i), op);
  return result;
}

template <typename T>
Status CheckAllReduce(int rank, int world, Communicator& comm, BufferSpace& space, size_t count,
                      DataType type, ReduceOp op) {
  std::vector<T> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<T>(Value(rank, i));
  SpaceBuffer<T> buffer(space, values);
  LOCKSTEP_RETURN_IF_ERROR(comm.AllReduce(buffer.data(), count, type, op, kTimeoutMs));
  const std::vector<T> data = buffer.Read();
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

// ReduceScatter leaves this rank's part (PartBegin's partition) reduced; the rest is unspecified.
template <typename T>
Status CheckReduceScatter(int rank, int world, Communicator& comm, BufferSpace& space,
                          size_t count, DataType type, ReduceOp op) {
  std::vector<T> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<T>(Value(rank, i));
  SpaceBuffer<T> buffer(space, values);
  LOCKSTEP_RETURN_IF_ERROR(comm.ReduceScatter(buffer.data(), count, type, op, kTimeoutMs));
  const std::vector<T> data = buffer.Read();
  const size_t end = PartBegin(count, world, rank + 1);
  for (size_t i = PartBegin(count, world, rank); i < end; ++i) {
    if (data[i] != static_cast<T>(Expected(world, i, op))) {
      return InternalError(std::string("reduce-scatter ") + DataTypeName(type) + " count " +
                           std::to_string(count) + ": element " + std::to_string(i) + " is " +
                           std::to_string(data[i]) + ", expected " +
                           std::to_string(Expected(world, i, op)));
    }
  }
  return OkStatus();
}

}  // namespace

BufferSpace& HostSpace() {
  static HostBufferSpace space;
  return space;
}

Status RunRanks(const CommunicatorBackend& backend, int world,
                const std::function<Status(int, Communicator&)>& body,
                rendezvous::KeyValueStore* shared_store) {
  testing::MemoryKeyValueStore own_store;
  rendezvous::KeyValueStore& store = shared_store != nullptr ? *shared_store : own_store;
  std::mutex first_failure_mu;
  Status first_failure;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      auto communicator = backend.create(rank, world, store, kTimeoutMs);
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

// Sizes 1, odd, several chunks of a 64 KiB shm slot (100003 elements of 8 bytes are ~12 chunks
// at 2 ranks), and 4 MiB of each type.
Status CheckEveryAllReduce(int rank, int world, Communicator& comm, BufferSpace& space) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{1001}, size_t{100003}}) {
      LOCKSTEP_RETURN_IF_ERROR(
          CheckAllReduce<float>(rank, world, comm, space, count, DataType::kFloat32, op));
      LOCKSTEP_RETURN_IF_ERROR(
          CheckAllReduce<double>(rank, world, comm, space, count, DataType::kFloat64, op));
      LOCKSTEP_RETURN_IF_ERROR(
          CheckAllReduce<int64_t>(rank, world, comm, space, count, DataType::kInt64, op));
    }
    LOCKSTEP_RETURN_IF_ERROR(
        CheckAllReduce<float>(rank, world, comm, space, (4u << 20) / 4, DataType::kFloat32, op));
    LOCKSTEP_RETURN_IF_ERROR(
        CheckAllReduce<double>(rank, world, comm, space, (4u << 20) / 8, DataType::kFloat64, op));
    LOCKSTEP_RETURN_IF_ERROR(
        CheckAllReduce<int64_t>(rank, world, comm, space, (4u << 20) / 8, DataType::kInt64, op));
  }
  return OkStatus();
}

void PrintTo(const ConformanceCase& param, std::ostream* os) {
  *os << param.backend->name << " world " << param.world;
}

std::vector<ConformanceCase> ConformanceCases(const CommunicatorBackend& backend,
                                              std::initializer_list<int> worlds) {
  std::vector<ConformanceCase> cases;
  for (int world : worlds) cases.push_back({&backend, world});
  return cases;
}

std::string ConformanceCaseName(const ::testing::TestParamInfo<ConformanceCase>& info) {
  return "World" + std::to_string(info.param.world);
}

std::string BackendName(const ::testing::TestParamInfo<const CommunicatorBackend*>& info) {
  // A test name holds letters, digits and '_' only ("shm+gloo" -> "shm_gloo").
  std::string name = info.param->name;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

void CommunicatorConformanceTest::SetUp() {
  const std::string reason = backend().unavailable_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
}

void CommunicatorErrorTest::SetUp() {
  const std::string reason = backend().unavailable_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
}

// Only the backends that can run two ranks here instantiate it (not NCCL on one GPU).
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CommunicatorErrorTest);

namespace {

TEST_P(CommunicatorConformanceTest, AllReduceComputesExactSumMaxMinForEveryTypeAndSize) {
  const int world = this->world();
  const CommunicatorBackend& backend = this->backend();
  Status status = RunRanks(backend, world, [&](int rank, Communicator& comm) -> Status {
    EXPECT_EQ(comm.backend(), backend.name);
    EXPECT_EQ(comm.size(), world);
    EXPECT_EQ(comm.rank(), rank);
    return CheckEveryAllReduce(rank, world, comm, *backend.space);
  });
  EXPECT_TRUE(status.ok()) << status;
}

// Counts: fewer elements than ranks (empty parts), uneven parts, several shm rounds, 4 MiB.
TEST_P(CommunicatorConformanceTest, ReduceScatterLeavesEachRankItsPartReduced) {
  const int world = this->world();
  BufferSpace& space = *backend().space;
  Status status = RunRanks(backend(), world, [&](int rank, Communicator& comm) -> Status {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (size_t count : {size_t{1}, size_t{5}, size_t{1001}, size_t{100003}, size_t{1} << 20}) {
        LOCKSTEP_RETURN_IF_ERROR(
            CheckReduceScatter<float>(rank, world, comm, space, count, DataType::kFloat32, op));
        LOCKSTEP_RETURN_IF_ERROR(
            CheckReduceScatter<int64_t>(rank, world, comm, space, count, DataType::kInt64, op));
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(CommunicatorConformanceTest, AllReduceReusesTheSameBufferAcrossSteps) {
  const int world = this->world();
  BufferSpace& space = *backend().space;
  Status status = RunRanks(backend(), world, [&](int rank, Communicator& comm) -> Status {
    SpaceBuffer<float> gradients(space, std::vector<float>(100003));
    for (int step = 0; step < 5; ++step) {
      const std::vector<float> values(100003, static_cast<float>(rank + step));
      space.CopyIn(gradients.data(), values.data(), gradients.Bytes());
      LOCKSTEP_RETURN_IF_ERROR(comm.AllReduce(gradients.data(), values.size(), DataType::kFloat32,
                                              ReduceOp::kSum, kTimeoutMs));
      const float expected = static_cast<float>(world * (world - 1) / 2 + world * step);
      for (float g : gradients.Read()) {
        if (g != expected)
          return InternalError("step " + std::to_string(step) + ": got " + std::to_string(g));
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// Small integers, rank added and subtracted: every value and every partial sum along a ring is
// exact in bf16's 8 bits of precision.
TEST_P(CommunicatorConformanceTest, AllReduceOfHalfTypesReducesExactlyRepresentableValues) {
  const int world = this->world();
  BufferSpace& space = *backend().space;
  Status status = RunRanks(backend(), world, [&](int rank, Communicator& comm) -> Status {
    for (DataType type : {DataType::kBFloat16, DataType::kFloat16}) {
      auto to_half = type == DataType::kBFloat16 ? &FloatToBFloat16 : &FloatToFloat16;
      auto to_float = type == DataType::kBFloat16 ? &BFloat16ToFloat : &Float16ToFloat;
      for (int sign : {1, -1}) {
        auto value = [sign](int r, size_t i) {
          return static_cast<float>(static_cast<int64_t>(i % 13) + sign * r);
        };
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
          for (size_t count : {size_t{1}, size_t{9}, size_t{100003}, size_t{2u << 20}}) {
            std::vector<uint16_t> values(count);
            for (size_t i = 0; i < count; ++i) values[i] = to_half(value(rank, i));
            SpaceBuffer<uint16_t> buffer(space, values);
            LOCKSTEP_RETURN_IF_ERROR(comm.AllReduce(buffer.data(), count, type, op, kTimeoutMs));
            const std::vector<uint16_t> data = buffer.Read();
            for (size_t i = 0; i < count; ++i) {
              float expected = value(0, i);
              for (int r = 1; r < world; ++r) expected = Reduce(expected, value(r, i), op);
              if (to_float(data[i]) != expected) {
                return InternalError(std::string(DataTypeName(type)) + " op " +
                                     std::to_string(static_cast<int>(op)) + " element " +
                                     std::to_string(i) + ": got " +
                                     std::to_string(to_float(data[i])) + ", expected " +
                                     std::to_string(expected));
              }
            }
          }
        }
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(CommunicatorConformanceTest, BroadcastFromEveryRootReachesEveryRank) {
  const int world = this->world();
  BufferSpace& space = *backend().space;
  Status status = RunRanks(backend(), world, [&](int rank, Communicator& comm) -> Status {
    for (int root = 0; root < world; ++root) {
      // 1 byte, odd, several times a shm slot area, and 4 MiB.
      for (size_t bytes : {size_t{1}, size_t{13}, size_t{1u << 20} + 5, size_t{4u << 20}}) {
        std::vector<uint8_t> values(bytes);
        for (size_t i = 0; i < bytes; ++i) values[i] = static_cast<uint8_t>(rank * 7 + i);
        SpaceBuffer<uint8_t> buffer(space, values);
        LOCKSTEP_RETURN_IF_ERROR(comm.Broadcast(buffer.data(), bytes, root, kTimeoutMs));
        const std::vector<uint8_t> data = buffer.Read();
        for (size_t i = 0; i < bytes; ++i) {
          if (data[i] != static_cast<uint8_t>(root * 7 + i)) {
            return InternalError("root " + std::to_string(root) + " bytes " +
                                 std::to_string(bytes) + ": byte " + std::to_string(i) + " wrong");
          }
        }
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(CommunicatorConformanceTest, AllGatherPlacesEveryRanksBytesInItsSlot) {
  const int world = this->world();
  BufferSpace& space = *backend().space;
  Status status = RunRanks(backend(), world, [&](int rank, Communicator& comm) -> Status {
    for (size_t bytes : {size_t{1}, size_t{17}, size_t{300001}, size_t{1u << 20}}) {
      std::vector<uint8_t> values(bytes);
      for (size_t i = 0; i < bytes; ++i) values[i] = static_cast<uint8_t>(rank * 31 + i);
      SpaceBuffer<uint8_t> in(space, values);
      SpaceBuffer<uint8_t> out(space, std::vector<uint8_t>(bytes * world, 0xFF));
      LOCKSTEP_RETURN_IF_ERROR(comm.AllGather(in.data(), bytes, out.data(), kTimeoutMs));
      const std::vector<uint8_t> gathered = out.Read();
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < bytes; ++i) {
          if (gathered[r * bytes + i] != static_cast<uint8_t>(r * 31 + i)) {
            return InternalError("bytes " + std::to_string(bytes) + ": slot of rank " +
                                 std::to_string(r) + " byte " + std::to_string(i) + " wrong");
          }
        }
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// A rank that returns from a collective may leave at once (the job's last step, a worker that
// is told to stop): its peers must still receive all of that collective. A collective returns on
// its sender once the bytes are handed to the transport, not once the peer has them; Gloo once
// reset its connections on close and threw away what the kernel still held ("connection reset
// by peer" on a peer still reading). Several rounds, because whether bytes are still in flight
// when the sender leaves is up to the scheduler.
TEST_P(CommunicatorConformanceTest, PeersReceiveAllOfACollectiveWhoseSenderLeavesRightAfter) {
  const int world = this->world();
  if (world == 1) GTEST_SKIP() << "no peer to receive";
  BufferSpace& space = *backend().space;
  constexpr size_t kBytes = size_t{8} << 20;
  for (int round = 0; round < 3; ++round) {
    Status status = RunRanks(backend(), world, [&](int rank, Communicator& comm) -> Status {
      std::vector<uint8_t> values(kBytes);
      for (size_t i = 0; i < kBytes; ++i) values[i] = static_cast<uint8_t>(round * 13 + i);
      SpaceBuffer<uint8_t> in(space, values);
      if (rank == 0) return comm.Broadcast(in.data(), kBytes, 0, kTimeoutMs);  // and leaves
      SpaceBuffer<uint8_t> received(space, std::vector<uint8_t>(kBytes, 0));
      LOCKSTEP_RETURN_IF_ERROR(comm.Broadcast(received.data(), kBytes, 0, kTimeoutMs));
      if (received.Read() != values) {
        return InternalError("round " + std::to_string(round) + ": broadcast bytes wrong");
      }
      return OkStatus();
    });
    ASSERT_TRUE(status.ok()) << "round " << round << ": " << status;
  }
}

// What DDP with a compressed layer does every step: an all-reduce, then at once an all-gather
// (or a broadcast) of other bytes. The all-reduce's result must be complete on every rank however
// far ahead a peer already is in the next collective (the shm backend once let a fast rank's
// all-gather overwrite the reduced slice a slow peer was still copying out).
TEST_P(CommunicatorConformanceTest, AllReduceResultSurvivesAnAllGatherOrBroadcastRightAfter) {
  const int world = this->world();
  BufferSpace& space = *backend().space;
  constexpr size_t kCount = 4099;           // every rank reduces a slice, uneven
  constexpr size_t kGatherBytes = 1 << 16;  // reaches into every rank's reduced slice
  Status status = RunRanks(backend(), world, [&](int rank, Communicator& comm) -> Status {
    SpaceBuffer<float> values(space, std::vector<float>(kCount));
    SpaceBuffer<uint8_t> in(space, std::vector<uint8_t>(kGatherBytes, static_cast<uint8_t>(rank)));
    SpaceBuffer<uint8_t> out(space, std::vector<uint8_t>(kGatherBytes * world));
    for (int round = 0; round < 200; ++round) {
      std::vector<float> mine(kCount);
      for (size_t i = 0; i < kCount; ++i) mine[i] = static_cast<float>(rank + round + i % 7);
      space.CopyIn(values.data(), mine.data(), values.Bytes());
      LOCKSTEP_RETURN_IF_ERROR(
          comm.AllReduce(values.data(), kCount, DataType::kFloat32, ReduceOp::kSum, kTimeoutMs));
      if (round % 2 == 0) {
        LOCKSTEP_RETURN_IF_ERROR(comm.AllGather(in.data(), kGatherBytes, out.data(), kTimeoutMs));
      } else {
        LOCKSTEP_RETURN_IF_ERROR(comm.Broadcast(in.data(), kGatherBytes, round % world, kTimeoutMs));
      }
      const std::vector<float> reduced = values.Read();
      for (size_t i = 0; i < kCount; ++i) {
        const float expected =
            static_cast<float>(world * (world - 1) / 2 + world * (round + static_cast<int>(i % 7)));
        if (reduced[i] != expected) {
          return InternalError("round " + std::to_string(round) + ", element " +
                               std::to_string(i) + ": " + std::to_string(reduced[i]) +
                               ", expected " + std::to_string(expected));
        }
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(CommunicatorConformanceTest, BarrierReleasesNoRankBeforeAllArrive) {
  const int world = this->world();
  std::atomic<int> arrived{0};
  Status status = RunRanks(backend(), world, [&](int rank, Communicator& comm) -> Status {
    for (int round = 1; round <= 50; ++round) {
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

// Pipeline stages in a chain 0 -> 1 -> ... -> W-1: each micro-batch's activations travel
// forward with Send/Recv, each rank adding its own term, and their gradients travel back; in
// between, every rank all-reduces (the data-parallel gradients of a stage run beside the
// pipeline's messages), so the messages must match by order between two ranks alone. Sizes
// from empty to several shm slots.
TEST_P(CommunicatorConformanceTest, PipelineStagesPassActivationsForwardAndGradientsBack) {
  if (!backend().point_to_point_limit.empty()) GTEST_SKIP() << backend().point_to_point_limit;
  const int world = this->world();
  if (world == 1) GTEST_SKIP() << "no second stage";
  BufferSpace& space = *backend().space;
  Status status = RunRanks(backend(), world, [&](int rank, Communicator& comm) -> Status {
    const std::vector<size_t> sizes = {0, 1, 13, (size_t{9} << 20) / 4 + 3, size_t{1} << 18};
    for (size_t m = 0; m < sizes.size(); ++m) {
      const size_t count = sizes[m];
      std::vector<float> values(count, 0.0f);
      SpaceBuffer<float> activations(space, values);
      if (rank > 0) {
        LOCKSTEP_RETURN_IF_ERROR(
            comm.Recv(activations.data(), count * sizeof(float), rank - 1, kTimeoutMs));
      }
      values = activations.Read();
      for (size_t i = 0; i < count && rank > 0; ++i) {
        const float expected = static_cast<float>(rank * (rank - 1) / 2) + m + (i % 7);
        if (values[i] != expected) {
          return InternalError("micro-batch " + std::to_string(m) + " forward: element " +
                               std::to_string(i) + " is " + std::to_string(values[i]) +
                               ", expected " + std::to_string(expected));
        }
        values[i] += rank;
      }
      if (rank == 0) {
        for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(m + (i % 7));
      }
      SpaceBuffer<float> out(space, values);
      if (rank + 1 < world) {
        LOCKSTEP_RETURN_IF_ERROR(
            comm.Send(out.data(), count * sizeof(float), rank + 1, kTimeoutMs));
      }
      SpaceBuffer<float> reduced(space, std::vector<float>(5, 1.0f));
      LOCKSTEP_RETURN_IF_ERROR(
          comm.AllReduce(reduced.data(), 5, DataType::kFloat32, ReduceOp::kSum, kTimeoutMs));
      // Backward: the last stage starts the gradient, each stage passes it on, minus its rank.
      SpaceBuffer<float> grad(space, std::vector<float>(count, static_cast<float>(1000 + m)));
      if (rank + 1 < world) {
        LOCKSTEP_RETURN_IF_ERROR(
            comm.Recv(grad.data(), count * sizeof(float), rank + 1, kTimeoutMs));
      }
      std::vector<float> g = grad.Read();
      float expected = 1000.0f + m;
      for (int later = world - 1; later > rank; --later) expected -= later;
      for (size_t i = 0; i < count; ++i) {
        if (g[i] != expected) {
          return InternalError("micro-batch " + std::to_string(m) + " backward: element " +
                               std::to_string(i) + " is " + std::to_string(g[i]) + ", expected " +
                               std::to_string(expected));
        }
        g[i] -= rank;
      }
      SpaceBuffer<float> back(space, g);
      if (rank > 0) {
        LOCKSTEP_RETURN_IF_ERROR(
            comm.Send(back.data(), count * sizeof(float), rank - 1, kTimeoutMs));
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// 1F1B's steady state: a stage sends one micro-batch's activations forward while it receives an
// earlier one's gradient from the same neighbour, both at once (SendRecv), and a ring shift
// where every rank sends to its successor and receives from its predecessor. Two plain Sends
// would each wait for the other's Recv; SendRecv must not.
TEST_P(CommunicatorConformanceTest, SendRecvExchangesBothWaysAtOnce) {
  if (!backend().point_to_point_limit.empty()) GTEST_SKIP() << backend().point_to_point_limit;
  const int world = this->world();
  if (world == 1) GTEST_SKIP() << "no peer";
  BufferSpace& space = *backend().space;
  Status status = RunRanks(backend(), world, [&](int rank, Communicator& comm) -> Status {
    for (size_t bytes : {size_t{1}, size_t{4099}, (size_t{9} << 20) + 1}) {
      const int next = (rank + 1) % world;
      const int previous = (rank + world - 1) % world;
      std::vector<uint8_t> mine(bytes);
      for (size_t i = 0; i < bytes; ++i) mine[i] = static_cast<uint8_t>(rank * 37 + i);
      SpaceBuffer<uint8_t> send(space, mine);
      SpaceBuffer<uint8_t> recv(space, std::vector<uint8_t>(bytes, 0));
      LOCKSTEP_RETURN_IF_ERROR(
          comm.SendRecv(send.data(), bytes, next, recv.data(), bytes, previous, kTimeoutMs));
      std::vector<uint8_t> got = recv.Read();
      for (size_t i = 0; i < bytes; ++i) {
        if (got[i] != static_cast<uint8_t>(previous * 37 + i)) {
          return InternalError("ring shift of " + std::to_string(bytes) + " bytes: byte " +
                               std::to_string(i) + " is not rank " + std::to_string(previous) +
                               "'s");
        }
      }
      // Pairs (0,1), (2,3), ...: each sends to the other and receives from it at once, with
      // different sizes each way.
      const int partner = rank ^ 1;
      if (partner >= world) continue;
      const size_t out_bytes = bytes + rank, in_bytes = bytes + partner;
      std::vector<uint8_t> out_values(out_bytes, static_cast<uint8_t>(rank + 1));
      SpaceBuffer<uint8_t> out(space, out_values);
      SpaceBuffer<uint8_t> in(space, std::vector<uint8_t>(in_bytes, 0));
      LOCKSTEP_RETURN_IF_ERROR(
          comm.SendRecv(out.data(), out_bytes, partner, in.data(), in_bytes, partner, kTimeoutMs));
      if (in.Read() != std::vector<uint8_t>(in_bytes, static_cast<uint8_t>(partner + 1))) {
        return InternalError("exchange of " + std::to_string(bytes) + " bytes with rank " +
                             std::to_string(partner) + " received the wrong bytes");
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// Several messages of different sizes from one rank to another in a row arrive in order, whole.
// Only the two ranks take part: the others call nothing meanwhile.
TEST_P(CommunicatorConformanceTest, MessagesBetweenTwoRanksArriveInOrderWhileOthersCallNothing) {
  if (!backend().point_to_point_limit.empty()) GTEST_SKIP() << backend().point_to_point_limit;
  const int world = this->world();
  if (world == 1) GTEST_SKIP() << "no peer";
  BufferSpace& space = *backend().space;
  const int last = world - 1;
  Status status = RunRanks(backend(), world, [&](int rank, Communicator& comm) -> Status {
    constexpr int kMessages = 6;
    if (rank == 0) {
      for (int n = 0; n < kMessages; ++n) {
        const size_t bytes = 1 + n * 100003;
        SpaceBuffer<uint8_t> out(space, std::vector<uint8_t>(bytes, static_cast<uint8_t>(n)));
        LOCKSTEP_RETURN_IF_ERROR(comm.Send(out.data(), bytes, last, kTimeoutMs));
      }
    } else if (rank == last) {
      for (int n = 0; n < kMessages; ++n) {
        const size_t bytes = 1 + n * 100003;
        SpaceBuffer<uint8_t> in(space, std::vector<uint8_t>(bytes, 0xEE));
        LOCKSTEP_RETURN_IF_ERROR(comm.Recv(in.data(), bytes, 0, kTimeoutMs));
        if (in.Read() != std::vector<uint8_t>(bytes, static_cast<uint8_t>(n))) {
          return InternalError("message " + std::to_string(n) + " out of order or damaged");
        }
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// Rank 1 joins but never takes part (it stays alive until rank 0 has its answer); rank 0's
// `call`, given the short timeout, must return DEADLINE_EXCEEDED within the backend's precision
// of it, and a later call must fail too.
void ExpectDeadlineWithAnAbsentPeer(
    const CommunicatorBackend& backend,
    const std::function<Status(Communicator&, BufferSpace&, int64_t timeout_ms)>& call) {
  constexpr int64_t kShortTimeoutMs = 500;
  std::promise<void> rank0_done;
  auto rank0_done_future = rank0_done.get_future();
  Status status = RunRanks(backend, 2, [&](int rank, Communicator& comm) -> Status {
    if (rank == 1) {
      if (rank0_done_future.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
        return InternalError("rank 0 never finished");
      }
      return OkStatus();
    }
    const auto start = Clock::now();
    Status result = call(comm, *backend.space, kShortTimeoutMs);
    const int64_t elapsed_ms = MsSince(start);
    EXPECT_EQ(result.code(), StatusCode::kDeadlineExceeded) << result;
    EXPECT_GE(elapsed_ms, kShortTimeoutMs - backend.deadline_early_ms);
    EXPECT_LT(elapsed_ms, kShortTimeoutMs + backend.deadline_late_ms);
    // After an error the communicator refuses further work at once.
    Status later = comm.Barrier(kShortTimeoutMs);
    EXPECT_FALSE(later.ok());
    if (backend.code_after_error) {
      EXPECT_EQ(later.code(), *backend.code_after_error) << later;
    }
    rank0_done.set_value();
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(CommunicatorErrorTest, CollectiveWithAbsentRankReturnsDeadlineExceededWithinTimeout) {
  ExpectDeadlineWithAnAbsentPeer(
      backend(), [](Communicator& comm, BufferSpace& space, int64_t timeout_ms) {
        SpaceBuffer<float> data(space, std::vector<float>(1000, 1.0f));
        return comm.AllReduce(data.data(), 1000, DataType::kFloat32, ReduceOp::kSum, timeout_ms);
      });
}

TEST_P(CommunicatorErrorTest, RecvFromAnAbsentPeerReturnsDeadlineExceededWithinTimeout) {
  ExpectDeadlineWithAnAbsentPeer(
      backend(), [](Communicator& comm, BufferSpace& space, int64_t timeout_ms) {
        SpaceBuffer<float> data(space, std::vector<float>(1000, 1.0f));
        return comm.Recv(data.data(), 4000, 1, timeout_ms);
      });
}

TEST_P(CommunicatorErrorTest, SendToAnAbsentPeerReturnsDeadlineExceededWithinTimeout) {
  ExpectDeadlineWithAnAbsentPeer(
      backend(), [](Communicator& comm, BufferSpace& space, int64_t timeout_ms) {
        SpaceBuffer<float> data(space, std::vector<float>(1000, 1.0f));
        return comm.Send(data.data(), 4000, 1, timeout_ms);
      });
}

// A Recv of another size than the message sent fails with INVALID_ARGUMENT naming both sizes,
// and the sender fails too, promptly (not at its deadline), whichever is larger; nothing writes
// past the receiver's buffer. NCCL cannot detect it (its behaviour is undefined).
TEST_P(CommunicatorErrorTest, AMessageOfAnotherSizeThanTheRecvFailsBothRanksNamingTheSizes) {
  if (backend().name == "nccl") GTEST_SKIP() << "NCCL cannot detect a size mismatch";
  for (size_t sent : {size_t{8}, size_t{4096}}) {
    const size_t expected = sent == 8 ? 4096 : 8;
    Status status = RunRanks(backend(), 2, [&](int rank, Communicator& comm) -> Status {
      std::vector<uint8_t> bytes(std::max(sent, expected) + 64, 0xAB);
      SpaceBuffer<uint8_t> buffer(*backend().space, bytes);
      const auto start = Clock::now();
      Status result = rank == 0 ? comm.Send(buffer.data(), sent, 1, kTimeoutMs)
                                : comm.Recv(buffer.data(), expected, 0, kTimeoutMs);
      if (result.ok()) return InternalError("a size mismatch went unnoticed");
      if (MsSince(start) >= kTimeoutMs) return InternalError("failed only at the deadline");
      if (rank == 1) {
        if (result.code() != StatusCode::kInvalidArgument ||
            result.message().find("sent a message of " + std::to_string(sent) + " bytes where " +
                                  std::to_string(expected) + " were expected") ==
                std::string::npos) {
          return InternalError("receiver: " + result.ToString());
        }
        const std::vector<uint8_t> after = buffer.Read();
        for (size_t i = expected; i < after.size(); ++i) {
          if (after[i] != 0xAB) return InternalError("written past the receive buffer");
        }
      }
      return OkStatus();
    });
    EXPECT_TRUE(status.ok()) << "sent " << sent << ": " << status;
  }
}

TEST(CheckSendRecvTest, BuffersThatOverlapOrAreMissingAreRefusedNamingWhich) {
  char bytes[16] = {};
  Status overlap = CheckSendRecv("gloo", 0, 2, bytes, 8, 1, bytes + 4, 8, 1);
  EXPECT_EQ(overlap.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(overlap.message().find("gloo send/recv on rank 0: the send and recv buffers overlap"),
            std::string::npos)
      << overlap;
  EXPECT_TRUE(CheckSendRecv("gloo", 0, 2, bytes, 8, 1, bytes + 8, 8, 1).ok());
  EXPECT_NE(CheckSendRecv("shm", 1, 2, bytes, 8, 0, nullptr, 8, 0).message().find(
                "a null recv buffer for 8 bytes"),
            std::string::npos);
  EXPECT_TRUE(CheckSendRecv("shm", 1, 2, nullptr, 0, 0, nullptr, 0, 0).ok()) << "empty messages";
}

TEST_P(CommunicatorErrorTest, CreateWithoutPeersReturnsDeadlineExceeded) {
  testing::MemoryKeyValueStore store;
  const auto start = Clock::now();
  auto comm = backend().create(0, 2, store, 300);
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_LT(MsSince(start), 300 + backend().connect_late_ms);
}

TEST_P(CommunicatorErrorTest, InvalidArgumentsAreRejected) {
  testing::MemoryKeyValueStore store;
  EXPECT_EQ(backend().create(2, 2, store, 300).status().code(), StatusCode::kInvalidArgument);
  Status status = RunRanks(backend(), 1, [&](int, Communicator& comm) -> Status {
    SpaceBuffer<float> x(*backend().space, {1.0f});
    EXPECT_EQ(comm.Broadcast(x.data(), 4, 1, kTimeoutMs).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.AllReduce(x.data(), 1, DataType::kFloat32, ReduceOp::kSum, 0).code(),
              StatusCode::kInvalidArgument);
    Status to_self = comm.Send(x.data(), 4, 0, kTimeoutMs);
    EXPECT_EQ(to_self.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(to_self.message().find("send peer 0 is this rank itself"), std::string::npos)
        << to_self;
    Status outside = comm.Recv(x.data(), 4, 3, kTimeoutMs);
    EXPECT_EQ(outside.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(outside.message().find("recv peer 3 outside world of 1"), std::string::npos)
        << outside;
    EXPECT_EQ(comm.SendRecv(x.data(), 4, -1, x.data(), 4, -1, kTimeoutMs).code(),
              StatusCode::kInvalidArgument);
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace lockstep::comm
