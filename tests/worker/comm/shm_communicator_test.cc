// Behaviour of the shared-memory communicator. Most tests run every rank as a thread of this
// process; each rank maps the segment on its own (as separate processes would), so they see the
// shared memory only through their own mappings. The tests that need real processes (a killed
// peer; the data path across address spaces) fork ranks and bootstrap through a file store.
#include "worker/comm/shm/shm_communicator.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/allreduce/file_kv_store.h"
#include "tests/worker/comm/memory_store.h"
#include "worker/comm/gloo/half_reduce.h"

namespace lockstep::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTimeoutMs = 20000;
// Small slots, so that modest buffers already take several chunks.
constexpr size_t kSlotBytes = 64 << 10;

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

ShmOptions TestOptions(int rank, int world) {
  ShmOptions options;
  options.rank = rank;
  options.size = world;
  options.job_name = "test/shm";
  options.generation = 7;
  options.slot_bytes = kSlotBytes;
  options.connect_timeout_ms = kTimeoutMs;
  return options;
}

// Runs body(rank, communicator) on `world` threads and returns the first failure in time
// (prefixed with its rank), or OK.
Status RunRanks(int world, const std::function<Status(int, Communicator&)>& body,
                rendezvous::KeyValueStore* shared_store = nullptr) {
  testing::MemoryKeyValueStore own_store;
  rendezvous::KeyValueStore& store = shared_store != nullptr ? *shared_store : own_store;
  std::mutex first_failure_mu;
  Status first_failure;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      auto communicator = CreateShmCommunicator(TestOptions(rank, world), store);
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

int64_t Expected(int world, size_t i, ReduceOp op) {
  int64_t result = Value(0, i);
  for (int rank = 1; rank < world; ++rank) {
    const int64_t v = Value(rank, i);
    if (op == ReduceOp::kSum) result += v;
    if (op == ReduceOp::kMax) result = std::max(result, v);
    if (op == ReduceOp::kMin) result = std::min(result, v);
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

// Every type and op at sizes 1, odd, and several chunks (kSlotBytes is 64 KiB; 100003 elements
// of 8 bytes are ~12 chunks at 2 ranks).
Status CheckEveryAllReduce(int rank, int world, Communicator& comm) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{1001}, size_t{100003}}) {
      LOCKSTEP_RETURN_IF_ERROR(
          CheckAllReduce<float>(rank, world, comm, count, DataType::kFloat32, op));
      LOCKSTEP_RETURN_IF_ERROR(
          CheckAllReduce<double>(rank, world, comm, count, DataType::kFloat64, op));
      LOCKSTEP_RETURN_IF_ERROR(
          CheckAllReduce<int64_t>(rank, world, comm, count, DataType::kInt64, op));
    }
  }
  return OkStatus();
}

class ShmCommunicatorWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(ShmCommunicatorWorldTest, AllReduceComputesExactSumMaxMinForEveryTypeAndSize) {
  const int world = GetParam();
  Status status = RunRanks(world, [world](int rank, Communicator& comm) -> Status {
    EXPECT_EQ(comm.backend(), "shm");
    EXPECT_EQ(comm.size(), world);
    EXPECT_EQ(comm.rank(), rank);
    return CheckEveryAllReduce(rank, world, comm);
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(ShmCommunicatorWorldTest, AllReduceReusesTheSameBufferAcrossSteps) {
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

TEST_P(ShmCommunicatorWorldTest, AllReduceOfHalfTypesReducesExactlyRepresentableValues) {
  const int world = GetParam();
  Status status = RunRanks(world, [world](int rank, Communicator& comm) -> Status {
    for (DataType type : {DataType::kBFloat16, DataType::kFloat16}) {
      auto to_half = type == DataType::kBFloat16 ? &FloatToBFloat16 : &FloatToFloat16;
      auto to_float = type == DataType::kBFloat16 ? &BFloat16ToFloat : &Float16ToFloat;
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        for (size_t count : {size_t{1}, size_t{9}, size_t{100003}}) {
          std::vector<uint16_t> data(count);
          // Small integers: every value and sum is exact in bf16's 8 bits of precision.
          for (size_t i = 0; i < count; ++i) {
            data[i] = to_half(static_cast<float>(static_cast<int64_t>(i % 13) - rank));
          }
          LOCKSTEP_RETURN_IF_ERROR(comm.AllReduce(data.data(), count, type, op, kTimeoutMs));
          for (size_t i = 0; i < count; ++i) {
            float expected = static_cast<float>(i % 13);
            for (int r = 1; r < world; ++r) {
              const float v = static_cast<float>(static_cast<int64_t>(i % 13) - r);
              if (op == ReduceOp::kSum) expected += v;
              if (op == ReduceOp::kMax) expected = std::max(expected, v);
              if (op == ReduceOp::kMin) expected = std::min(expected, v);
            }
            if (to_float(data[i]) != expected) {
              return InternalError(
                  std::string(DataTypeName(type)) + " element " + std::to_string(i) + ": got " +
                  std::to_string(to_float(data[i])) + ", expected " + std::to_string(expected));
            }
          }
        }
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(ShmCommunicatorWorldTest, BroadcastFromEveryRootReachesEveryRank) {
  const int world = GetParam();
  Status status = RunRanks(world, [world](int rank, Communicator& comm) -> Status {
    for (int root = 0; root < world; ++root) {
      // 1 byte, odd, and several times the whole slot area.
      for (size_t bytes : {size_t{1}, size_t{13}, size_t{1u << 20} + 5}) {
        std::vector<uint8_t> data(bytes);
        for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(rank * 7 + i);
        LOCKSTEP_RETURN_IF_ERROR(comm.Broadcast(data.data(), bytes, root, kTimeoutMs));
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

TEST_P(ShmCommunicatorWorldTest, AllGatherPlacesEveryRanksBytesInItsSlot) {
  const int world = GetParam();
  Status status = RunRanks(world, [world](int rank, Communicator& comm) -> Status {
    for (size_t bytes : {size_t{1}, size_t{17}, size_t{300001}}) {
      std::vector<uint8_t> in(bytes);
      for (size_t i = 0; i < bytes; ++i) in[i] = static_cast<uint8_t>(rank * 31 + i);
      std::vector<uint8_t> out(bytes * world, 0xFF);
      LOCKSTEP_RETURN_IF_ERROR(comm.AllGather(in.data(), bytes, out.data(), kTimeoutMs));
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < bytes; ++i) {
          if (out[r * bytes + i] != static_cast<uint8_t>(r * 31 + i)) {
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

TEST_P(ShmCommunicatorWorldTest, BarrierReleasesNoRankBeforeAllArrive) {
  const int world = GetParam();
  std::atomic<int> arrived{0};
  Status status = RunRanks(world, [&](int rank, Communicator& comm) -> Status {
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

TEST_P(ShmCommunicatorWorldTest, SegmentNameIsUnlinkedOnceEveryRankAttached) {
  const int world = GetParam();
  testing::MemoryKeyValueStore store;
  Status status = RunRanks(
      world, [](int, Communicator& comm) -> Status { return comm.Barrier(kTimeoutMs); }, &store);
  ASSERT_TRUE(status.ok()) << status;
  auto name = store.Get({kShmSegmentKey}, 1000);
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(name->at(0).rfind("/lockstep-test_shm-g7-", 0), 0u) << name->at(0);
  const int fd = shm_open(name->at(0).c_str(), O_RDWR, 0600);
  EXPECT_EQ(fd, -1) << name->at(0) << " still exists";
  EXPECT_EQ(errno, ENOENT);
  if (fd >= 0) close(fd);
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmCommunicatorWorldTest, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "World" + std::to_string(info.param); });

TEST(ShmCommunicatorTest, CollectiveWithAbsentRankReturnsDeadlineExceededWithinTimeout) {
  constexpr int64_t kShortTimeoutMs = 500;
  std::promise<void> rank0_done;
  auto rank0_done_future = rank0_done.get_future();
  Status status = RunRanks(2, [&](int rank, Communicator& comm) -> Status {
    if (rank == 1) {
      // Attached but never takes part; stays alive until rank 0 has its answer.
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
    EXPECT_EQ(result.code(), StatusCode::kDeadlineExceeded) << result;
    EXPECT_GE(elapsed_ms, kShortTimeoutMs - 5);
    EXPECT_LT(elapsed_ms, kShortTimeoutMs + 500);
    // After an error the communicator refuses further work at once.
    EXPECT_EQ(comm.Barrier(kShortTimeoutMs).code(), StatusCode::kFailedPrecondition);
    rank0_done.set_value();
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(ShmCommunicatorTest, AbortUnblocksBlockedCallsOfEveryRankWithAborted) {
  std::promise<void> entered;
  std::shared_future<void> entered_future = entered.get_future().share();
  std::promise<void> blocked_ranks_done[2];
  std::shared_future<void> blocked_done[2] = {blocked_ranks_done[0].get_future().share(),
                                              blocked_ranks_done[1].get_future().share()};
  Status status = RunRanks(3, [&](int rank, Communicator& comm) -> Status {
    std::vector<float> data(1 << 16, 1.0f);
    if (rank == 2) {
      // Attached but absent: ranks 0 and 1 stay blocked until the abort.
      for (auto& done : blocked_done) done.wait();
    } else {
      std::thread aborter;
      if (rank == 0) {
        aborter = std::thread([&] {
          entered_future.wait();
          // Not synchronisation: whether Abort lands before or during the calls, both must
          // return ABORTED at once; the pause only makes "during" the likely case.
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          comm.Abort("test abort");
        });
        entered.set_value();
      }
      const auto start = Clock::now();
      // Rank 0 blocks in an all-reduce and rank 1 in a barrier, each for up to 20 s.
      Status blocked = rank == 0 ? comm.AllReduce(data.data(), data.size(), DataType::kFloat32,
                                                  ReduceOp::kSum, kTimeoutMs)
                                 : (entered_future.wait(), comm.Barrier(kTimeoutMs));
      const int64_t elapsed_ms = MsSince(start);
      if (aborter.joinable()) aborter.join();
      blocked_ranks_done[rank].set_value();
      EXPECT_EQ(blocked.code(), StatusCode::kAborted) << "rank " << rank << ": " << blocked;
      EXPECT_NE(blocked.message().find("test abort"), std::string::npos) << blocked;
      EXPECT_LT(elapsed_ms, 2000) << "rank " << rank;
    }
    // Later calls of every rank fail at once, also on the rank that was never blocked.
    const auto later_start = Clock::now();
    for (Status later :
         {comm.Barrier(kTimeoutMs), comm.Broadcast(data.data(), 4, 0, kTimeoutMs),
          comm.AllGather(data.data(), 4, data.data() + 8, kTimeoutMs),
          comm.AllReduce(data.data(), 1, DataType::kFloat32, ReduceOp::kMax, kTimeoutMs)}) {
      EXPECT_EQ(later.code(), StatusCode::kAborted) << "rank " << rank << ": " << later;
    }
    EXPECT_LT(MsSince(later_start), 100);
    comm.Abort("again");  // idempotent
    EXPECT_EQ(comm.Barrier(kTimeoutMs).code(), StatusCode::kAborted);
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(ShmCommunicatorTest, PeerDestroyedMidRunMakesBlockedCollectiveFailWithUnavailable) {
  std::promise<void> rank0_entered;
  auto rank0_entered_future = rank0_entered.get_future();
  Status status = RunRanks(2, [&](int rank, Communicator& comm) -> Status {
    if (rank == 1) {
      rank0_entered_future.wait();
      return OkStatus();  // RunRanks drops rank 1's communicator now
    }
    std::vector<double> data(4096, 1.0);
    const auto start = Clock::now();
    rank0_entered.set_value();
    Status result =
        comm.AllReduce(data.data(), data.size(), DataType::kFloat64, ReduceOp::kSum, kTimeoutMs);
    EXPECT_EQ(result.code(), StatusCode::kUnavailable) << result;
    EXPECT_NE(result.message().find("rank 1"), std::string::npos) << result;
    EXPECT_LT(MsSince(start), 2000);
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(ShmCommunicatorTest, CreateWithoutPeersReturnsDeadlineExceeded) {
  testing::MemoryKeyValueStore store;
  ShmOptions options = TestOptions(0, 2);
  options.connect_timeout_ms = 300;
  const auto start = Clock::now();
  auto comm = CreateShmCommunicator(options, store);
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_LT(MsSince(start), 300 + 1000);
  // The failed bootstrap left no segment behind.
  auto name = store.Get({kShmSegmentKey}, 1000);
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(shm_open(name->at(0).c_str(), O_RDWR, 0600), -1);
}

TEST(ShmCommunicatorTest, InvalidArgumentsAreRejected) {
  testing::MemoryKeyValueStore store;
  EXPECT_EQ(CreateShmCommunicator(TestOptions(2, 2), store).status().code(),
            StatusCode::kInvalidArgument);
  ShmOptions tiny = TestOptions(0, 4);
  tiny.slot_bytes = 100;
  EXPECT_EQ(CreateShmCommunicator(tiny, store).status().code(), StatusCode::kInvalidArgument);
  Status status = RunRanks(1, [](int, Communicator& comm) -> Status {
    float x = 1;
    EXPECT_EQ(comm.Broadcast(&x, 4, 1, kTimeoutMs).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.AllReduce(&x, 1, DataType::kFloat32, ReduceOp::kSum, 0).code(),
              StatusCode::kInvalidArgument);
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// --- Ranks as processes -------------------------------------------------------------------

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/lockstep-shm-test.XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~TempDir() { std::system(("rm -rf " + path_).c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Waits for `pid` to exit within timeout_ms (killing it if it does not) and returns its exit
// code, or -1 if it did not exit normally.
int WaitForExit(pid_t pid, int64_t timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, WNOHANG) == 0) {
    if (Clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &wstatus, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling an exit, bounded
  }
  return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
}

// Forks a process that bootstraps rank `rank` through the file store in `dir` and exits with
// body's verdict (0: OK). Returns the child's pid.
pid_t ForkRank(const std::string& dir, int rank, int world,
               const std::function<Status(Communicator&)>& body) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  bench::FileKeyValueStore store(dir);
  auto comm = CreateShmCommunicator(TestOptions(rank, world), store);
  Status status = comm.ok() ? body(**comm) : comm.status();
  if (!status.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
  std::fflush(stderr);
  _exit(status.ok() ? 0 : 1);
}

TEST(ShmCommunicatorProcessTest, RanksInSeparateProcessesComputeExactAllReduces) {
  constexpr int kWorld = 3;
  TempDir dir;
  std::vector<pid_t> children;
  for (int rank = 1; rank < kWorld; ++rank) {
    children.push_back(ForkRank(dir.path(), rank, kWorld, [rank](Communicator& comm) {
      return CheckEveryAllReduce(rank, kWorld, comm);
    }));
  }
  bench::FileKeyValueStore store(dir.path());
  auto comm = CreateShmCommunicator(TestOptions(0, kWorld), store);
  ASSERT_TRUE(comm.ok()) << comm.status();
  Status status = CheckEveryAllReduce(0, kWorld, **comm);
  EXPECT_TRUE(status.ok()) << status;
  for (pid_t child : children) EXPECT_EQ(WaitForExit(child, kTimeoutMs), 0);
}

TEST(ShmCommunicatorProcessTest, KilledPeerProcessMakesSurvivorFailWithUnavailablePromptly) {
  TempDir dir;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = ForkRank(dir.path(), 1, 2, [&](Communicator&) -> Status {
    const char byte = 1;
    if (write(ready[1], &byte, 1) != 1) return InternalError("pipe");
    for (;;) pause();  // attached, never takes part: only SIGKILL ends it
  });
  bench::FileKeyValueStore store(dir.path());
  auto comm = CreateShmCommunicator(TestOptions(0, 2), store);
  ASSERT_TRUE(comm.ok()) << comm.status();
  char byte;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  close(ready[0]);
  close(ready[1]);
  auto result = std::async(std::launch::async, [&] {
    std::vector<float> data(1000, 1.0f);
    return (*comm)->AllReduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum,
                              kTimeoutMs);
  });
  const auto killed_at = Clock::now();
  ASSERT_EQ(kill(child, SIGKILL), 0);
  // Not reaped yet: the survivor must also recognise a zombie as dead.
  ASSERT_EQ(result.wait_for(std::chrono::milliseconds(kTimeoutMs)), std::future_status::ready);
  const int64_t elapsed_ms = MsSince(killed_at);
  Status status = result.get();
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("rank 1"), std::string::npos) << status;
  EXPECT_LT(elapsed_ms, 1000);
  WaitForExit(child, kTimeoutMs);
}

}  // namespace
}  // namespace lockstep::comm
