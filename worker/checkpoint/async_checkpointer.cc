#include "worker/checkpoint/async_checkpointer.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>

#include "common/logging.h"

namespace lockstep::checkpoint {
namespace {

double UnixSecondsNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Marks the capture thread as background work (SCHED_BATCH: the same share of the CPU as any
// other thread, but it never preempts a running thread when it wakes up). Otherwise, on a machine
// whose other cores are busy, the scheduler puts the freshly woken copy on the training thread's
// core and the training thread waits in the run queue for the copy it was meant to overlap. The
// persist thread is left as it is, so that a commit's many wake-ups (each fsync, each poll for a
// shard) are not each put off to the end of a time slice on cores that are all training. Best
// effort: a refusal leaves the thread as it was.
void MarkAsBackgroundWork() {
  sched_param param{};
  param.sched_priority = 0;
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
}

}  // namespace

AsyncCheckpointer::AsyncCheckpointer(std::unique_ptr<CheckpointWriter> writer,
                                     AsyncCheckpointerOptions options, ReportCallback on_report)
    : writer_(std::move(writer)),
      options_(std::move(options)),
      on_report_(std::move(on_report)),
      thread_([this] { Run(); }),
      capture_thread_([this] { RunCaptures(); }) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  std::unique_ptr<CheckpointState> dropped_capture;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    if (pending_) ++stats_.dropped;
    pending_.reset();
    if (capture_fill_) {
      // Requested but not started: nothing has read the caller's state yet.
      ++stats_.dropped;
      capture_fill_ = nullptr;
      dropped_capture = std::move(capture_buffer_);
      capturing_ = false;
    }
  }
  changed_.notify_all();
  // A fill already running finishes first: the caller's state stays valid until we return.
  capture_thread_.join();
  thread_.join();
}

CheckpointState AsyncCheckpointer::TakeRecycledState() {
  std::unique_ptr<CheckpointState> spare;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    spare = std::move(spare_);
  }
  return spare ? std::move(*spare) : CheckpointState();
}

void AsyncCheckpointer::QueueLocked(std::unique_ptr<CheckpointState> queued,
                                    std::unique_ptr<CheckpointState>* surplus) {
  if (pending_) {
    LOCKSTEP_LOG(INFO) << "checkpoint of step " << pending_->step << " dropped: step "
                       << queued->step << " is newer";
    ++stats_.dropped;
    // The replaced snapshot's memory is the next one's buffer.
    *surplus = std::move(spare_);
    spare_ = std::move(pending_);
  }
  pending_ = std::move(queued);
}

void AsyncCheckpointer::Snapshot(CheckpointState state) {
  auto queued = std::make_unique<CheckpointState>(std::move(state));
  std::unique_ptr<CheckpointState> surplus;  // freed outside the lock
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return !capturing_; });
    ++stats_.snapshots;
    QueueLocked(std::move(queued), &surplus);
  }
  changed_.notify_all();
}

void AsyncCheckpointer::SnapshotInBackground(CheckpointState buffer,
                                             std::function<void(CheckpointState*)> fill) {
  auto queued = std::make_unique<CheckpointState>(std::move(buffer));
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return !capturing_; });
    // Counted now, so that stats() shows the checkpointer busy from the request on.
    ++stats_.snapshots;
    capture_buffer_ = std::move(queued);
    capture_fill_ = std::move(fill);
    capturing_ = true;
  }
  changed_.notify_all();
}

void AsyncCheckpointer::WaitForCapture() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return !capturing_; });
}

void AsyncCheckpointer::RunCaptures() {
  MarkAsBackgroundWork();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stopping_ || capture_fill_ != nullptr; });
    if (!capture_fill_) return;  // stopping, and no capture was requested
    std::function<void(CheckpointState*)> fill = std::move(capture_fill_);
    capture_fill_ = nullptr;
    std::unique_ptr<CheckpointState> state = std::move(capture_buffer_);
    lock.unlock();
    fill(state.get());
    fill = nullptr;
    lock.lock();
    capturing_ = false;
    std::unique_ptr<CheckpointState> surplus;
    if (stopping_) {
      ++stats_.dropped;
      surplus = std::move(state);
    } else {
      QueueLocked(std::move(state), &surplus);
    }
    changed_.notify_all();
    lock.unlock();
    surplus.reset();
    lock.lock();
  }
}

Status AsyncCheckpointer::Flush(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!changed_.wait_until(lock, deadline.at(),
                           [this] { return !capturing_ && !pending_ && !busy_; })) {
    return DeadlineExceededError("checkpoint flush: step " +
                                 std::to_string(stats_.in_flight_step.value_or(-1)) +
                                 " still being persisted");
  }
  return last_status_;
}

AsyncCheckpointerStats AsyncCheckpointer::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void AsyncCheckpointer::Run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stopping_ || pending_; });
    if (stopping_) return;
    std::unique_ptr<CheckpointState> state = std::move(pending_);
    busy_ = true;
    stats_.in_flight_step = state->step;
    int64_t backoff_ms = std::max<int64_t>(1, options_.retry_initial_backoff_ms);
    for (int attempt = 1;; ++attempt) {
      lock.unlock();
      const double start = MonotonicSeconds();
      Status status = writer_->Commit(*state, Deadline::AfterMs(options_.attempt_timeout_ms));
      PersistReport report;
      report.step = state->step;
      report.status = status;
      report.attempt = attempt;
      report.persist_seconds = MonotonicSeconds() - start;
      report.unix_seconds = UnixSecondsNow();
      if (status.ok()) {
        writer_->ApplyRetention(state->step, Deadline::AfterMs(options_.attempt_timeout_ms));
        report.retention_seconds = MonotonicSeconds() - start - report.persist_seconds;
      }
      lock.lock();
      const bool out_of_attempts = options_.max_attempts > 0 && attempt >= options_.max_attempts;
      report.final = status.ok() || out_of_attempts || stopping_ || pending_ != nullptr;
      if (status.ok()) {
        ++stats_.persisted;
        stats_.last_success_step = state->step;
        stats_.last_success_unix_seconds = report.unix_seconds;
      } else {
        ++stats_.failed_attempts;
        LOCKSTEP_LOG(WARNING) << "checkpoint of step " << state->step << ", attempt " << attempt
                              << ": " << status
                              << (report.final ? " (giving up on this step)" : " (will retry)");
        if (report.final) ++stats_.dropped;
      }
      if (report.final) last_status_ = status;
      if (on_report_) {
        lock.unlock();
        on_report_(report);
        lock.lock();
      }
      if (report.final) break;
      // Back off, but wake at once for a newer snapshot or a stop.
      changed_.wait_for(lock, std::chrono::milliseconds(backoff_ms),
                        [this] { return stopping_ || pending_ != nullptr; });
      if (stopping_ || pending_) {
        ++stats_.dropped;
        last_status_ = report.status;
        break;
      }
      backoff_ms = std::min(backoff_ms * 2, std::max<int64_t>(1, options_.retry_max_backoff_ms));
    }
    busy_ = false;
    stats_.in_flight_step.reset();
    // Kept for TakeRecycledState. One spare is enough: a second would only be needed by a
    // trainer filling two snapshots at once. Any older spare is freed outside the lock.
    std::unique_ptr<CheckpointState> surplus = std::move(spare_);
    spare_ = std::move(state);
    changed_.notify_all();
    lock.unlock();
    surplus.reset();
    lock.lock();
  }
}

}  // namespace lockstep::checkpoint
