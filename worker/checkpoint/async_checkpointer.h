// AsyncCheckpointer: checkpoints without stopping training for the write, or for the copy.
//
// A snapshot is a copy of the state at a step boundary into a buffer, which a background thread
// then persists through a CheckpointWriter. Buffers are recycled: TakeRecycledState() returns one
// whose persist has ended, so filling it again copies the state without allocating. Two ways to
// hand one over:
//   - Snapshot(): the caller has filled the buffer (one memcpy of the state on its own thread:
//     that copy is its stall) and moves it in.
//   - SnapshotInBackground(): the copy itself runs on the checkpointer's capture thread while
//     the caller goes on with work that only reads the state (the next step's forward and
//     backward). The caller calls WaitForCapture() before it next changes the state (the
//     optimizer update), so the snapshot is bitwise the state of the step boundary; the stall
//     is the hand-over plus whatever of the copy is left at that point (usually nothing).
// A failed persist is retried with exponential back-off and reported through the callback; the
// previous checkpoint stays valid because nothing is renamed over it.
//
// A snapshot taken while another is still being persisted waits in a one-slot queue; a newer
// snapshot replaces a waiting one (latest wins: the newest state is the one worth having, and
// memory stays bounded: one buffer in flight, one waiting, one spare). A persist that is failing
// gives way to a waiting newer snapshot instead of retrying further. Each rank runs its own
// AsyncCheckpointer; if ranks drop different snapshots, rank 0 times out waiting for a shard of
// the dropped step and that step is abandoned (its .tmp- directory is removed by the next
// commit's retention).
//
//   AsyncCheckpointer checkpointer(std::move(writer), {}, [&](const PersistReport& report) {
//     metrics.ObserveCheckpoint("persist", report.persist_seconds);
//     if (report.status.ok()) metrics.SetCheckpointSuccess(report.step, report.unix_seconds);
//   });
//   ... at a step boundary:
//     checkpointer.SnapshotInBackground(checkpointer.TakeRecycledState(),
//         [&](CheckpointState* out) { FillCheckpointState(training_state, ..., out); });
//   ... forward and backward of the next step (reading training_state), then:
//     checkpointer.WaitForCapture();   // before the optimizer changes training_state
//   ... at the end:          LOCKSTEP_RETURN_IF_ERROR(checkpointer.Flush(Deadline::AfterMs(...)));
//
// Thread-safety: every method may be called from any thread; none blocks on storage except
// Flush (until its deadline) and the destructor. The callback runs on the background thread and
// must not call Flush or destroy the checkpointer.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "common/deadline.h"
#include "common/status.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/checkpoint_writer.h"

namespace lockstep::checkpoint {

struct AsyncCheckpointerOptions {
  // Limit of one persist attempt (shard writes, rank 0's wait for the others, rename).
  int64_t attempt_timeout_ms = 600000;
  // Attempts per snapshot before it is given up (reported with final = true). 0: no limit,
  // retry until a newer snapshot arrives or the checkpointer is destroyed.
  int max_attempts = 5;
  // Pause before the second attempt, doubling up to the maximum. Smaller: a blip is overcome
  // sooner; larger: less load on a storage that is struggling.
  int64_t retry_initial_backoff_ms = 1000;
  int64_t retry_max_backoff_ms = 60000;
};

// The outcome of one persist attempt.
struct PersistReport {
  int64_t step = 0;
  Status status;
  int attempt = 1;    // 1-based
  bool final = true;  // no further attempt will be made for this step
  // From the start of the attempt until the checkpoint was committed (rank 0) or the shard
  // written (other ranks), or the attempt failed.
  double persist_seconds = 0;
  // Retention after a commit (rank 0), which runs before the report: not part of persist.
  double retention_seconds = 0;
  double unix_seconds = 0;  // when the attempt ended
};

struct AsyncCheckpointerStats {
  int64_t snapshots = 0;
  int64_t persisted = 0;  // snapshots committed
  int64_t failed_attempts = 0;
  int64_t dropped = 0;  // snapshots replaced before or during their persist, or given up
  std::optional<int64_t> last_success_step;
  double last_success_unix_seconds = 0;
  std::optional<int64_t> in_flight_step;
};

class AsyncCheckpointer {
 public:
  using ReportCallback = std::function<void(const PersistReport&)>;

  AsyncCheckpointer(std::unique_ptr<CheckpointWriter> writer, AsyncCheckpointerOptions options,
                    ReportCallback on_report = nullptr);
  // Stops: a waiting snapshot is dropped, retries end, and the attempt in flight is awaited
  // (bounded by attempt_timeout_ms). Call Flush first to keep the last snapshot.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // A buffer to fill for the next Snapshot: the state of a persist that has ended (or of a
  // snapshot that a newer one replaced), whose tensors keep their memory, so refilling it with the
  // same layout allocates nothing. An empty state when none is spare (the first snapshot).
  CheckpointState TakeRecycledState();

  // Queues `state` for persisting, moved in without a copy: the caller must not keep pointers
  // into its tensors. Never blocks on storage (a short lock); waits for a capture still running
  // (SnapshotInBackground), so snapshots are queued in the order they were taken.
  void Snapshot(CheckpointState state);

  // Runs `fill(&buffer)` on the capture thread, then queues the filled buffer as Snapshot does.
  // Returns at once (after waiting for an earlier capture that is still running). Until
  // WaitForCapture() returns, the caller must not change anything `fill` reads, and it must
  // keep it alive until then or until the checkpointer is destroyed. `buffer` is best
  // TakeRecycledState()'s, so that the copy allocates nothing.
  void SnapshotInBackground(CheckpointState buffer, std::function<void(CheckpointState*)> fill);

  // Blocks until the last SnapshotInBackground's fill has returned; at once when none is
  // running. Bounded by the copy (memory bandwidth), never by storage.
  void WaitForCapture();

  // Waits until nothing is being captured, queued or in flight. Returns the status of the last
  // snapshot's final attempt (OK if there was none), DEADLINE_EXCEEDED if still busy at
  // `deadline`.
  Status Flush(Deadline deadline);

  AsyncCheckpointerStats stats() const;

 private:
  void Run();
  void RunCaptures();
  // Queues `queued` as the pending snapshot (latest wins); a replaced one becomes the spare and
  // the spare it displaces is handed back in `surplus`, to be freed outside the lock.
  void QueueLocked(std::unique_ptr<CheckpointState> queued,
                   std::unique_ptr<CheckpointState>* surplus);

  std::unique_ptr<CheckpointWriter> writer_;
  AsyncCheckpointerOptions options_;
  ReportCallback on_report_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::unique_ptr<CheckpointState> pending_;  // latest snapshot not yet started
  std::unique_ptr<CheckpointState> spare_;    // persisted or replaced: for TakeRecycledState
  bool busy_ = false;                         // a snapshot is being persisted
  // SnapshotInBackground's request: the buffer and what fills it (both set until the capture
  // thread takes them); capturing_ from the request until the fill has returned.
  std::unique_ptr<CheckpointState> capture_buffer_;
  std::function<void(CheckpointState*)> capture_fill_;
  bool capturing_ = false;
  bool stopping_ = false;
  Status last_status_;
  AsyncCheckpointerStats stats_;
  // Last: they start after every other member exists.
  std::thread thread_;          // persists
  std::thread capture_thread_;  // runs SnapshotInBackground's fills
};

}  // namespace lockstep::checkpoint
