#include "worker/checkpoint/async_checkpointer.h"

#include <algorithm>
#include <chrono>

#include "common/logging.h"

namespace lockstep::checkpoint {
namespace {

double UnixSecondsNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

AsyncCheckpointer::AsyncCheckpointer(std::unique_ptr<CheckpointWriter> writer,
                                     AsyncCheckpointerOptions options, ReportCallback on_report)
    : writer_(std::move(writer)),
      options_(std::move(options)),
      on_report_(std::move(on_report)),
      thread_([this] { Run(); }) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    if (pending_) ++stats_.dropped;
    pending_.reset();
  }
  changed_.notify_all();
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

void AsyncCheckpointer::Snapshot(CheckpointState state) {
  auto queued = std::make_unique<CheckpointState>(std::move(state));
  std::unique_ptr<CheckpointState> surplus;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.snapshots;
    if (pending_) {
      LOCKSTEP_LOG(INFO) << "checkpoint of step " << pending_->step << " dropped: step "
                         << queued->step << " is newer";
      ++stats_.dropped;
      // The replaced snapshot's memory is the next one's buffer.
      surplus = std::move(spare_);
      spare_ = std::move(pending_);
    }
    pending_ = std::move(queued);
  }
  changed_.notify_all();
}

Status AsyncCheckpointer::Flush(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!changed_.wait_until(lock, deadline.at(), [this] { return !pending_ && !busy_; })) {
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
      Status status = writer_->Write(*state, Deadline::AfterMs(options_.attempt_timeout_ms));
      PersistReport report;
      report.step = state->step;
      report.status = status;
      report.attempt = attempt;
      report.persist_seconds = MonotonicSeconds() - start;
      report.unix_seconds = UnixSecondsNow();
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
