#include "worker/checkpoint/async_checkpointer.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/process/poll_until.h"
#include "tests/support/process/process_table.h"
#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/checkpoint/storage/local/local_storage.h"

namespace lockstep::checkpoint {
namespace {

using ::lockstep::testing::PollUntil;
using ::lockstep::testing::WaitUntilThreadSleeps;

// LocalStorage whose writes can be made to fail, or to wait until released.
class ControllableStorage : public LocalStorage {
 public:
  // LocalStorage::Write goes through WritePieces too, so this sees every write.
  Status WritePieces(const std::string& path, const std::vector<std::string_view>& pieces,
                     const WriteOptions& options, Deadline deadline) override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ++writes_started_;
      changed_.notify_all();
      if (!changed_.wait_until(lock, deadline.at(), [this] { return !blocked_; })) {
        return DeadlineExceededError("write " + path + ": still blocked");
      }
      if (failures_left_ > 0) {
        --failures_left_;
        return UnavailableError("write " + path + ": injected outage");
      }
    }
    return LocalStorage::WritePieces(path, pieces, options, deadline);
  }
  void Block(bool blocked) {
    std::lock_guard<std::mutex> lock(mutex_);
    blocked_ = blocked;
    changed_.notify_all();
  }
  void FailNext(int count) {
    std::lock_guard<std::mutex> lock(mutex_);
    failures_left_ = count;
  }
  bool WaitForWritesStarted(int count, Deadline deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_until(lock, deadline.at(), [&] { return writes_started_ >= count; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool blocked_ = false;
  int failures_left_ = 0;
  int writes_started_ = 0;
};

CheckpointState LargeState(int64_t step) {
  CheckpointState state;
  state.step = step;
  state.optimizer = {"sgd", step};
  NamedTensor tensor;
  tensor.name = "w";
  tensor.dtype = "u8";
  tensor.bytes.assign(1 << 20, static_cast<uint8_t>(step));
  tensor.shape = {1 << 20};
  state.tensors.push_back(tensor);
  return state;
}

class AsyncCheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/async-checkpointer-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override { (void)storage_.Delete(root_, true, Deadline::AfterMs(10000)); }

  std::unique_ptr<AsyncCheckpointer> MakeCheckpointer(AsyncCheckpointerOptions options) {
    CheckpointWriterOptions writer_options;
    writer_options.keep = 2;
    return std::make_unique<AsyncCheckpointer>(
        std::make_unique<CheckpointWriter>(storage_, root_, 0, 1, writer_options), options,
        [this](const PersistReport& report) {
          std::lock_guard<std::mutex> lock(reports_mutex_);
          reports_.push_back(report);
        });
  }

  ControllableStorage storage_;
  std::string root_;
  std::mutex reports_mutex_;
  std::vector<PersistReport> reports_;
};

TEST_F(AsyncCheckpointerTest, SnapshotReturnsWhilePersistHappensInTheBackground) {
  auto checkpointer = MakeCheckpointer({});
  storage_.Block(true);  // the persist cannot finish until released
  checkpointer->Snapshot(LargeState(100));
  // Snapshot returned although the storage has not taken a byte.
  ASSERT_TRUE(storage_.WaitForWritesStarted(1, Deadline::AfterMs(10000)));
  EXPECT_EQ(checkpointer->stats().in_flight_step.value_or(-1), 100);
  EXPECT_EQ(LoadNewestValid(storage_, root_, Deadline::AfterMs(10000)).status().code(),
            StatusCode::kNotFound);
  storage_.Block(false);
  ASSERT_TRUE(checkpointer->Flush(Deadline::AfterMs(10000)).ok());
  auto loaded = LoadNewestValid(storage_, root_, Deadline::AfterMs(10000));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.step, 100);
  EXPECT_EQ(checkpointer->stats().last_success_step.value_or(-1), 100);
}

TEST_F(AsyncCheckpointerTest, FailedPersistIsRetriedThenReported) {
  AsyncCheckpointerOptions options;
  options.retry_initial_backoff_ms = 1;
  options.max_attempts = 5;
  auto checkpointer = MakeCheckpointer(options);
  storage_.FailNext(2);
  checkpointer->Snapshot(LargeState(100));
  ASSERT_TRUE(checkpointer->Flush(Deadline::AfterMs(10000)).ok());
  std::lock_guard<std::mutex> lock(reports_mutex_);
  ASSERT_EQ(reports_.size(), 3u);
  EXPECT_EQ(reports_[0].status.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(reports_[0].final);
  EXPECT_EQ(reports_[2].attempt, 3);
  EXPECT_TRUE(reports_[2].status.ok());
  EXPECT_TRUE(reports_[2].final);
}

TEST_F(AsyncCheckpointerTest, StorageOutageIsReportedAndThePreviousCheckpointStaysValid) {
  AsyncCheckpointerOptions options;
  options.retry_initial_backoff_ms = 1;
  options.max_attempts = 3;
  auto checkpointer = MakeCheckpointer(options);
  checkpointer->Snapshot(LargeState(100));
  ASSERT_TRUE(checkpointer->Flush(Deadline::AfterMs(10000)).ok());
  storage_.FailNext(1000);
  checkpointer->Snapshot(LargeState(200));
  Status status = checkpointer->Flush(Deadline::AfterMs(10000));
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status;
  {
    std::lock_guard<std::mutex> lock(reports_mutex_);
    ASSERT_FALSE(reports_.empty());
    EXPECT_EQ(reports_.back().step, 200);
    EXPECT_TRUE(reports_.back().final);
    EXPECT_FALSE(reports_.back().status.ok());
  }
  EXPECT_EQ(checkpointer->stats().last_success_step.value_or(-1), 100);
  auto loaded = LoadNewestValid(storage_, root_, Deadline::AfterMs(10000));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.step, 100);
  // Storage back: the next snapshot goes through.
  storage_.FailNext(0);
  checkpointer->Snapshot(LargeState(300));
  ASSERT_TRUE(checkpointer->Flush(Deadline::AfterMs(10000)).ok());
  EXPECT_EQ(LoadNewestValid(storage_, root_, Deadline::AfterMs(10000))->state.step, 300);
}

TEST_F(AsyncCheckpointerTest, NewerSnapshotReplacesAWaitingOne) {
  auto checkpointer = MakeCheckpointer({});
  storage_.Block(true);
  checkpointer->Snapshot(LargeState(100));
  ASSERT_TRUE(storage_.WaitForWritesStarted(1, Deadline::AfterMs(10000)));
  checkpointer->Snapshot(LargeState(200));  // waits
  checkpointer->Snapshot(LargeState(300));  // replaces 200
  storage_.Block(false);
  ASSERT_TRUE(checkpointer->Flush(Deadline::AfterMs(10000)).ok());
  const AsyncCheckpointerStats stats = checkpointer->stats();
  EXPECT_EQ(stats.snapshots, 3);
  EXPECT_EQ(stats.persisted, 2);
  EXPECT_EQ(stats.dropped, 1);
  EXPECT_EQ(stats.last_success_step.value_or(-1), 300);
}

TEST_F(AsyncCheckpointerTest, PersistedSnapshotsMemoryIsRecycledForTheNextOne) {
  auto checkpointer = MakeCheckpointer({});
  EXPECT_TRUE(checkpointer->TakeRecycledState().tensors.empty());  // nothing persisted yet
  CheckpointState first = LargeState(100);
  const uint8_t* first_bytes = first.tensors[0].bytes.data();
  checkpointer->Snapshot(std::move(first));
  ASSERT_TRUE(checkpointer->Flush(Deadline::AfterMs(10000)).ok());

  // The next snapshot is filled into the persisted one's memory: no allocation, one copy.
  CheckpointState second = checkpointer->TakeRecycledState();
  ASSERT_EQ(second.tensors.size(), 1u);
  EXPECT_EQ(second.tensors[0].bytes.data(), first_bytes);
  second.step = 200;
  std::fill(second.tensors[0].bytes.begin(), second.tensors[0].bytes.end(), uint8_t{200});
  checkpointer->Snapshot(std::move(second));
  ASSERT_TRUE(checkpointer->Flush(Deadline::AfterMs(10000)).ok());
  auto loaded = LoadNewestValid(storage_, root_, Deadline::AfterMs(10000));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.step, 200);
  EXPECT_EQ(loaded->state.tensors[0].bytes, std::vector<uint8_t>(1 << 20, uint8_t{200}));
}

// A gate the test opens: lets a fill start copying and then hold until released.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  void Arrive() {
    std::unique_lock<std::mutex> lock(mutex_);
    arrived_ = true;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
  }
  bool WaitForArrival(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_until(lock, deadline.at(), [this] { return arrived_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
  bool arrived_ = false;
};

TEST_F(AsyncCheckpointerTest, BackgroundSnapshotHoldsTheStateOfItsStepBoundaryBitwise) {
  auto checkpointer = MakeCheckpointer({});
  // The "trainer's" state, read by the fill on the capture thread.
  CheckpointState live = LargeState(100);
  for (size_t i = 0; i < live.tensors[0].bytes.size(); ++i) {
    live.tensors[0].bytes[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  }
  const std::vector<uint8_t> at_boundary = live.tensors[0].bytes;
  Gate gate;
  checkpointer->SnapshotInBackground(checkpointer->TakeRecycledState(), [&](CheckpointState* out) {
    gate.Arrive();  // held until the test lets it copy
    *out = live;
  });
  // SnapshotInBackground returned while its copy has not been made: the caller trains on.
  ASSERT_TRUE(gate.WaitForArrival(Deadline::AfterMs(10000)));
  EXPECT_EQ(checkpointer->stats().snapshots, 1);
  // The "optimizer update" waits for the copy before it changes the state.
  std::atomic<bool> waited{false};
  std::thread trainer([&] {
    checkpointer->WaitForCapture();
    waited = true;
    std::fill(live.tensors[0].bytes.begin(), live.tensors[0].bytes.end(), uint8_t{0xee});
    live.step = 101;
  });
  gate.Open();
  trainer.join();
  EXPECT_TRUE(waited.load());
  ASSERT_TRUE(checkpointer->Flush(Deadline::AfterMs(10000)).ok());
  auto loaded = LoadNewestValid(storage_, root_, Deadline::AfterMs(10000));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state.step, 100);
  EXPECT_TRUE(loaded->state.tensors[0].bytes == at_boundary);
}

TEST_F(AsyncCheckpointerTest, FlushWaitsForABackgroundCopyAndItsPersist) {
  auto checkpointer = MakeCheckpointer({});
  Gate gate;
  checkpointer->SnapshotInBackground(checkpointer->TakeRecycledState(), [&](CheckpointState* out) {
    gate.Arrive();
    *out = LargeState(100);
  });
  ASSERT_TRUE(gate.WaitForArrival(Deadline::AfterMs(10000)));
  // Still copying: a flush that ends now reports it busy.
  EXPECT_EQ(checkpointer->Flush(Deadline::AfterMs(50)).code(), StatusCode::kDeadlineExceeded);
  gate.Open();
  ASSERT_TRUE(checkpointer->Flush(Deadline::AfterMs(10000)).ok());
  EXPECT_EQ(checkpointer->stats().last_success_step.value_or(-1), 100);
}

TEST_F(AsyncCheckpointerTest, BackgroundSnapshotsReuseThePersistedBuffer) {
  auto checkpointer = MakeCheckpointer({});
  checkpointer->Snapshot(LargeState(100));
  ASSERT_TRUE(checkpointer->Flush(Deadline::AfterMs(10000)).ok());
  CheckpointState recycled = checkpointer->TakeRecycledState();
  ASSERT_EQ(recycled.tensors.size(), 1u);
  const uint8_t* memory = recycled.tensors[0].bytes.data();
  const uint8_t* filled_into = nullptr;
  checkpointer->SnapshotInBackground(std::move(recycled), [&](CheckpointState* out) {
    filled_into = out->tensors[0].bytes.data();
    out->step = 200;
    std::fill(out->tensors[0].bytes.begin(), out->tensors[0].bytes.end(), uint8_t{200});
  });
  checkpointer->WaitForCapture();
  EXPECT_EQ(filled_into, memory);
  ASSERT_TRUE(checkpointer->Flush(Deadline::AfterMs(10000)).ok());
  EXPECT_EQ(LoadNewestValid(storage_, root_, Deadline::AfterMs(10000))->state.step, 200);
}

TEST_F(AsyncCheckpointerTest, DestroyedWhileCopyingLetsTheCopyFinishFirst) {
  auto checkpointer = MakeCheckpointer({});
  Gate gate;
  std::atomic<bool> copied{false};
  checkpointer->SnapshotInBackground(checkpointer->TakeRecycledState(), [&](CheckpointState* out) {
    gate.Arrive();
    *out = LargeState(100);
    copied = true;
  });
  ASSERT_TRUE(gate.WaitForArrival(Deadline::AfterMs(10000)));
  // The fill is held until this thread waits in the destructor (its first sleep after
  // `destroying`), whatever the machine's load: a destructor that did not wait returns with the
  // fill still held, and `copied` is false.
  const auto this_thread = static_cast<pid_t>(syscall(SYS_gettid));
  std::atomic<bool> destroying{false};
  std::thread opener([&] {
    PollUntil([&] { return destroying.load(); }, 10000, 1);
    WaitUntilThreadSleeps(this_thread, 10000);
    gate.Open();
  });
  destroying = true;
  checkpointer.reset();  // must not return while the fill still reads the caller's state
  EXPECT_TRUE(copied.load());
  opener.join();
}

}  // namespace
}  // namespace lockstep::checkpoint
