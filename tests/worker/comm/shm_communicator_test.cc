// Behaviour of the shared-memory communicator: the collectives, deadlines and refusals every
// backend shares (communicator_conformance.h) at worlds of 1, 2 and 4 ranks, and what is shm's
// own: the segment's name and cleanup, slot sizes, an abort that wakes every rank, a peer that
// dies. Most tests run every rank as a thread of this process; each rank maps the segment on its
// own (as separate processes would), so they see the shared memory only through their own
// mappings. The tests that need real processes (a killed peer; the data path across address
// spaces) fork ranks and bootstrap through a file store.
#include "worker/comm/shm/shm_communicator.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/allreduce/file_kv_store.h"
#include "tests/worker/comm/communicator_conformance.h"
#include "tests/worker/comm/memory_store.h"

namespace lockstep::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTimeoutMs = kConformanceTimeoutMs;
// Small slots, so that modest buffers already take several chunks.
constexpr size_t kSlotBytes = 64 << 10;

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

const CommunicatorBackend& Shm() {
  static const CommunicatorBackend backend{
      .name = "shm",
      .create =
          [](int rank, int world, rendezvous::KeyValueStore& store, int64_t connect_timeout_ms) {
            ShmOptions options = TestOptions(rank, world);
            options.connect_timeout_ms = connect_timeout_ms;
            return CreateShmCommunicator(options, store);
          },
      // Deadlines are checked by the waiting rank itself, to within a few milliseconds.
      .deadline_early_ms = 5,
      .deadline_late_ms = 4500,
      .connect_late_ms = 2700,
      .code_after_error = StatusCode::kFailedPrecondition,
  };
  return backend;
}

INSTANTIATE_TEST_SUITE_P(Shm, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceCases(Shm(), {1, 2, 4})),
                         ConformanceCaseName);
INSTANTIATE_TEST_SUITE_P(Shm, CommunicatorErrorTest, ::testing::Values(&Shm()), BackendName);

class ShmCommunicatorWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(ShmCommunicatorWorldTest, SegmentNameIsUnlinkedOnceEveryRankAttached) {
  const int world = GetParam();
  testing::MemoryKeyValueStore store;
  Status status = RunRanks(
      Shm(), world, [](int, Communicator& comm) -> Status { return comm.Barrier(kTimeoutMs); },
      &store);
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

TEST(ShmCommunicatorTest, AbortUnblocksBlockedCallsOfEveryRankWithAborted) {
  std::promise<void> entered;
  std::shared_future<void> entered_future = entered.get_future().share();
  std::promise<void> blocked_ranks_done[2];
  std::shared_future<void> blocked_done[2] = {blocked_ranks_done[0].get_future().share(),
                                              blocked_ranks_done[1].get_future().share()};
  Status status = RunRanks(Shm(), 3, [&](int rank, Communicator& comm) -> Status {
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
    // At once, not at their deadline: a tenth of it (2 s for 4 calls) is far above any stall.
    EXPECT_LT(MsSince(later_start), kTimeoutMs / 10);
    comm.Abort("again");  // idempotent
    EXPECT_EQ(comm.Barrier(kTimeoutMs).code(), StatusCode::kAborted);
    return OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(ShmCommunicatorTest, PeerDestroyedMidRunMakesBlockedCollectiveFailWithUnavailable) {
  std::promise<void> rank0_entered;
  auto rank0_entered_future = rank0_entered.get_future();
  Status status = RunRanks(Shm(), 2, [&](int rank, Communicator& comm) -> Status {
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

TEST(ShmCommunicatorTest, FailedBootstrapLeavesNoSegmentBehind) {
  testing::MemoryKeyValueStore store;
  ShmOptions options = TestOptions(0, 2);
  options.connect_timeout_ms = 300;
  auto comm = CreateShmCommunicator(options, store);
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded) << comm.status();
  auto name = store.Get({kShmSegmentKey}, 1000);
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(shm_open(name->at(0).c_str(), O_RDWR, 0600), -1);
}

TEST(ShmCommunicatorTest, SlotsTooSmallForTheWorldAreRejected) {
  testing::MemoryKeyValueStore store;
  ShmOptions tiny = TestOptions(0, 4);
  tiny.slot_bytes = 100;
  EXPECT_EQ(CreateShmCommunicator(tiny, store).status().code(), StatusCode::kInvalidArgument);
}

// Ranks built with different options are told which one differs, not a size that follows
// from it.
TEST(ShmCommunicatorTest, RanksThatDisagreeOnTheMailboxSizeAreToldWhichValueDiffers) {
  testing::MemoryKeyValueStore store;
  ShmOptions first = TestOptions(0, 2);
  ShmOptions second = TestOptions(1, 2);
  second.mailbox_bytes = first.mailbox_bytes * 2;
  first.connect_timeout_ms = second.connect_timeout_ms = 2000;
  StatusOr<std::unique_ptr<Communicator>> rank0 = InternalError("not run");
  std::thread creator([&] { rank0 = CreateShmCommunicator(first, store); });
  StatusOr<std::unique_ptr<Communicator>> rank1 = CreateShmCommunicator(second, store);
  creator.join();
  EXPECT_EQ(rank1.status().code(), StatusCode::kFailedPrecondition) << rank1.status();
  EXPECT_NE(rank1.status().message().find("was made with mailbox_bytes " +
                                          std::to_string(first.mailbox_bytes) +
                                          ", this rank has " +
                                          std::to_string(second.mailbox_bytes)),
            std::string::npos)
      << rank1.status();
  EXPECT_EQ(rank0.status().code(), StatusCode::kDeadlineExceeded) << rank0.status();
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
