// AsyncCheckpointer: checkpoints without stopping training for the write.
//
// The training thread fills a state buffer at a step boundary (the only time it waits) and hands
// it over with Snapshot(), which moves it in without copying and returns; a background thread
// persists it through a CheckpointWriter. Buffers are recycled: TakeRecycledState() returns one
// whose persist has ended, so filling it again copies the state without allocating, and the
// stall of a checkpoint is one memcpy of the state. A failed persist is retried with exponential
// back-off and reported through the callback; the previous checkpoint stays valid because
// nothing is renamed over it.
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
//     CheckpointState state = checkpointer.TakeRecycledState();
//     FillCheckpointState(training_state, ..., &state);  // the stall: one copy, no allocation
//     checkpointer.Snapshot(std::move(state));
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
  double persist_seconds = 0;
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
  // into its tensors. Never blocks on storage (a short lock).
  void Snapshot(CheckpointState state);

  // Waits until nothing is queued or in flight. Returns the status of the last snapshot's
  // final attempt (OK if there was none), DEADLINE_EXCEEDED if still busy at `deadline`.
  Status Flush(Deadline deadline);

  AsyncCheckpointerStats stats() const;

 private:
  void Run();

  std::unique_ptr<CheckpointWriter> writer_;
  AsyncCheckpointerOptions options_;
  ReportCallback on_report_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::unique_ptr<CheckpointState> pending_;  // latest snapshot not yet started
  std::unique_ptr<CheckpointState> spare_;    // persisted or replaced: for TakeRecycledState
  bool busy_ = false;                         // a snapshot is being persisted
  bool stopping_ = false;
  Status last_status_;
  AsyncCheckpointerStats stats_;
  std::thread thread_;  // last: starts after every other member exists
};

}  // namespace lockstep::checkpoint
