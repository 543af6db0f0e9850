#include "worker/trainer/training_checkpointer.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "common/logging.h"
#include "worker/checkpoint/checkpoint_deletion.h"
#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/trainer/checkpoint_state.h"

namespace lockstep::trainer {

StatusOr<std::unique_ptr<TrainingCheckpointer>> TrainingCheckpointer::Create(
    TrainingCheckpointerOptions options, const spec::TrainerSpec& spec,
    const ParameterLayout& layout, WorkerMetrics* metrics) {
  LOCKSTEP_ASSIGN_OR_RETURN(checkpoint::StorageUri uri,
                            checkpoint::ParseStorageUri(options.checkpoint.uri));
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::Storage> storage,
                            checkpoint::OpenStorage(uri.uri, {}));
  return std::unique_ptr<TrainingCheckpointer>(new TrainingCheckpointer(
      std::move(options), std::move(uri), std::move(storage), spec, layout, metrics));
}

TrainingCheckpointer::TrainingCheckpointer(TrainingCheckpointerOptions options,
                                           checkpoint::StorageUri uri,
                                           std::shared_ptr<checkpoint::Storage> storage,
                                           const spec::TrainerSpec& spec,
                                           const ParameterLayout& layout, WorkerMetrics* metrics)
    : options_(std::move(options)),
      uri_(std::move(uri)),
      storage_(std::move(storage)),
      spec_(spec),
      layout_(layout),
      metrics_(metrics) {}

TrainingCheckpointer::~TrainingCheckpointer() {
  EndGeneration();
  for (std::thread& thread : retiring_) thread.join();
}

std::string TrainingCheckpointer::last_checkpoint_uri() const {
  const int64_t step = last_step_.load();
  if (step < 0) return "";
  std::string root = options_.checkpoint.uri;
  while (!root.empty() && root.back() == '/') root.pop_back();
  return root + "/" + checkpoint::StepDirName(step);
}

StatusOr<int64_t> TrainingCheckpointer::Restore(TrainingState& state) {
  FinishCapture();  // `state` is about to change
  const double started = MonotonicSeconds();
  // A checkpoint that does not fit this model is skipped like a damaged one, so an older one
  // that fits (or a fresh start) is used rather than failing the job.
  StatusOr<checkpoint::LoadedCheckpoint> loaded = checkpoint::LoadNewestValid(
      *storage_, uri_.path, Deadline::AfterMs(options_.restore_timeout_ms),
      [this, &state](const checkpoint::Manifest& manifest) {
        return CheckpointFitsModel(manifest, state, layout_);
      });
  if (loaded.status().code() == StatusCode::kNotFound) {
    LOCKSTEP_LOG(INFO) << "no valid checkpoint under " << options_.checkpoint.uri << ": "
                       << loaded.status().message();
    return int64_t{-1};
  }
  if (!loaded.ok()) return loaded.status().WithContext("reading " + options_.checkpoint.uri);
  for (const checkpoint::SkippedCheckpoint& skipped : loaded->skipped) {
    LOCKSTEP_LOG(WARNING) << "skipped checkpoint of step " << skipped.step << ": "
                          << skipped.problem;
  }
  LOCKSTEP_RETURN_IF_ERROR(RestoreFromCheckpointState(loaded->state, layout_, spec_, &state));
  last_step_ = loaded->state.step;
  LOCKSTEP_LOG(INFO) << "restored step " << loaded->state.step << " from " << loaded->dir << " ("
                     << loaded->manifest.total_bytes << " bytes, written by "
                     << loaded->manifest.world_size << " ranks) in "
                     << static_cast<int64_t>((MonotonicSeconds() - started) * 1000) << " ms";
  return loaded->state.step;
}

void TrainingCheckpointer::SetPipelineStages(std::vector<LayerRange> stages) {
  stages_ = std::move(stages);
}

StatusOr<int64_t> TrainingCheckpointer::NewestFitting(int64_t below, const TrainingState& state) {
  const Deadline deadline = Deadline::AfterMs(options_.restore_timeout_ms);
  StatusOr<std::vector<int64_t>> steps =
      checkpoint::StepsNewestFirst(*storage_, uri_.path, deadline);
  if (steps.status().code() == StatusCode::kNotFound) return int64_t{-1};
  if (!steps.ok()) return steps.status().WithContext("reading " + options_.checkpoint.uri);
  // The whole model's tensors: every stage's part must be there.
  const std::vector<checkpoint::TensorEntry> wanted =
      CheckpointTable(layout_, WholeScope(layout_), state.optimizer,
                      static_cast<int64_t>(state.sample_counts.size()));
  for (int64_t step : *steps) {
    if (step >= below) continue;
    Status fits = checkpoint::CheckStepDir(
        *storage_, checkpoint::JoinPath(uri_.path, checkpoint::StepDirName(step)),
        checkpoint::VerifyLevel::kSizes, nullptr, nullptr, deadline,
        [&](const checkpoint::Manifest& manifest) {
          return CheckpointFitsTable(manifest, wanted, state.optimizer.TypeName());
        });
    if (fits.ok()) return step;
    if (fits.code() != StatusCode::kDataLoss) {
      return fits.WithContext("reading " + options_.checkpoint.uri);
    }
    LOCKSTEP_LOG(WARNING) << "skipped checkpoint of step " << step << ": " << fits.message();
  }
  LOCKSTEP_LOG(INFO) << "no valid checkpoint under " << options_.checkpoint.uri
                     << (below < std::numeric_limits<int64_t>::max()
                             ? " below step " + std::to_string(below)
                             : std::string());
  return int64_t{-1};
}

Status TrainingCheckpointer::RestoreStage(int64_t step, int stage, TrainingState& state) {
  FinishCapture();  // `state` is about to change
  const double started = MonotonicSeconds();
  const Deadline deadline = Deadline::AfterMs(options_.restore_timeout_ms);
  const std::string dir = checkpoint::JoinPath(uri_.path, checkpoint::StepDirName(step));
  const CheckpointScope scope = StageScope(stages_, stage);
  const std::vector<checkpoint::TensorEntry> wanted = CheckpointTable(
      layout_, scope, state.optimizer, static_cast<int64_t>(state.sample_counts.size()));
  checkpoint::Manifest manifest;
  // DATA_LOSS only for damage; a checkpoint of another model is FAILED_PRECONDITION.
  LOCKSTEP_RETURN_IF_ERROR(checkpoint::CheckStepDir(*storage_, dir, checkpoint::VerifyLevel::kSizes,
                                                    &manifest, nullptr, deadline));
  LOCKSTEP_RETURN_IF_ERROR(CheckpointFitsTable(manifest, wanted, state.optimizer.TypeName())
                               .WithContext("checkpoint of step " + std::to_string(step)));
  std::set<std::string> names;
  for (const checkpoint::TensorEntry& tensor : wanted) {
    // Counts the checkpoint lacks are reset, as in RestoreFromCheckpointState.
    if (tensor.name != "accounting/sample_counts" ||
        std::any_of(manifest.tensors.begin(), manifest.tensors.end(),
                    [&](const checkpoint::TensorEntry& t) { return t.name == tensor.name; })) {
      names.insert(tensor.name);
    }
  }
  LOCKSTEP_ASSIGN_OR_RETURN(checkpoint::CheckpointState read,
                            checkpoint::ReadTensors(*storage_, dir, manifest, names, deadline));
  LOCKSTEP_RETURN_IF_ERROR(RestoreFromCheckpointState(read, layout_, spec_, &state, scope));
  last_step_ = step;
  int64_t bytes = 0;
  for (const checkpoint::NamedTensor& tensor : read.tensors) bytes += tensor.bytes.size();
  LOCKSTEP_LOG(INFO) << "restored stage " << stage << " (layers " << scope.layers.first << ".."
                     << scope.layers.last - 1 << ") of step " << step << " from " << dir << " ("
                     << bytes << " of its " << manifest.total_bytes << " bytes, written by "
                     << manifest.stages << " stage(s)) in "
                     << static_cast<int64_t>((MonotonicSeconds() - started) * 1000) << " ms";
  return OkStatus();
}

Status TrainingCheckpointer::DiscardStep(int64_t step) {
  LOCKSTEP_RETURN_IF_ERROR(checkpoint::DeleteStepDir(
      *storage_, uri_.path, step, Deadline::AfterMs(options_.restore_timeout_ms)));
  LOCKSTEP_LOG(WARNING) << "deleted the damaged checkpoint of step " << step << " under "
                        << options_.checkpoint.uri;
  return OkStatus();
}

void TrainingCheckpointer::BeginGeneration(const std::string& attempt_id, int rank, int world_size,
                                           const TrainingState& state) {
  EndGeneration();
  rank_ = rank;
  checkpoint::CheckpointWriterOptions writer_options;
  writer_options.keep = options_.checkpoint.keep;
  writer_options.attempt_id = attempt_id;
  int writer_rank = rank;
  int writers = world_size;
  scope_.reset();
  if (stages_.size() > 1) {
    // Replica 0's rank of each stage writes that stage's part; the other replicas hold copies.
    const int stages = static_cast<int>(stages_.size());
    const int stage = rank % stages;
    if (rank / stages != 0) return;
    scope_ = StageScope(stages_, stage);
    for (int s = 0; s < stages; ++s) {
      writer_options.parts.push_back(
          CheckpointTable(layout_, StageScope(stages_, s), state.optimizer,
                          static_cast<int64_t>(state.sample_counts.size())));
    }
    writer_rank = stage;
    writers = stages;
  }
  auto writer = std::make_unique<checkpoint::CheckpointWriter>(*storage_, uri_.path, writer_rank,
                                                               writers, writer_options);
  checkpoint::AsyncCheckpointerOptions async_options;
  async_options.attempt_timeout_ms = options_.attempt_timeout_ms;
  async_options.max_attempts = options_.max_attempts;
  async_options.retry_initial_backoff_ms = options_.retry_initial_backoff_ms;
  async_options.retry_max_backoff_ms = options_.retry_max_backoff_ms;
  WorkerMetrics* metrics = metrics_;
  std::atomic<int64_t>* last_step = &last_step_;
  current_ = std::make_unique<checkpoint::AsyncCheckpointer>(
      std::move(writer), async_options,
      [metrics, last_step, rank = writer_rank,
       attempt_id](const checkpoint::PersistReport& report) {
        // Background thread of the checkpointer (also after it was retired): touches only what
        // outlives it (metrics and this object's atomic; the destructor joins retired ones).
        if (metrics != nullptr) metrics->ObserveCheckpoint("persist", report.persist_seconds);
        if (report.status.ok()) {
          // Only rank 0 commits (manifest + rename): another rank's success means only that its
          // shard was written, so only rank 0's success advances the last checkpoint it reports.
          if (rank == 0) {
            int64_t previous = last_step->load();
            while (previous < report.step &&
                   !last_step->compare_exchange_weak(previous, report.step)) {
            }
            if (metrics != nullptr) metrics->SetCheckpointSuccess(report.step, report.unix_seconds);
          }
          LOCKSTEP_LOG(INFO) << "checkpoint of step " << report.step
                             << (rank == 0 ? " committed" : ": shard written") << " in "
                             << static_cast<int64_t>(report.persist_seconds * 1000) << " ms ("
                             << attempt_id << ", attempt " << report.attempt << ")";
        } else {
          if (metrics != nullptr) metrics->IncrementCheckpointFailures();
          LOCKSTEP_LOG(WARNING) << "checkpoint of step " << report.step << " failed (" << attempt_id
                                << ", attempt " << report.attempt << "): " << report.status
                                << (report.final ? "; given up, training goes on" : "; retrying");
        }
      });
}

void TrainingCheckpointer::EndGeneration() {
  if (!current_) return;
  // The next generation may change the state at once (the state agreement), and the spare
  // buffer taken below is only returned once the capture has queued its own.
  FinishCapture();
  // Keep the retiring checkpointer's spare buffer so the next generation's first snapshot does
  // not allocate the whole state again.
  if (checkpoint::CheckpointState spare = current_->TakeRecycledState(); !spare.tensors.empty()) {
    carried_over_ = std::move(spare);
  }
  // The destructor drops a waiting snapshot and awaits the attempt in flight (bounded by
  // attempt_timeout_ms): done on a helper thread so the next generation does not wait for it.
  retiring_.emplace_back(
      [retired = std::move(current_), storage = storage_]() mutable { retired.reset(); });
  current_.reset();
}

void TrainingCheckpointer::WaitForCapture() {
  // A capture of the device copy leaves the trainer's state free at once.
  if (capture_reads_copy_) return;
  FinishCapture();
}

void TrainingCheckpointer::FinishCapture() {
  if (!capture_pending_) return;
  const double started = MonotonicSeconds();
  if (current_) current_->WaitForCapture();
  capture_pending_ = false;
  capture_reads_copy_ = false;
  // The stall of a background snapshot: its hand-over plus what training waited here (with the
  // device copy: only when the next checkpoint, or the end, came before the capture finished).
  const double stall_seconds = capture_handover_seconds_ + (MonotonicSeconds() - started);
  if (metrics_ != nullptr) metrics_->ObserveCheckpoint("snapshot", stall_seconds);
}

bool TrainingCheckpointer::TakeDeviceCopy(const TrainingState& state) {
  kernels::Device& device = *state.params.device();
  const bool wanted = options_.device_copy == TrainingCheckpointerOptions::DeviceCopy::kAlways ||
                      (options_.device_copy == TrainingCheckpointerOptions::DeviceCopy::kAuto &&
                       device.type() == kernels::DeviceType::kCuda);
  if (!wanted || device_copy_failed_) return false;
  const int64_t n = state.params.size();
  if (!device_copy_ || device_copy_->params.size() != n ||
      device_copy_->params.device() != &device) {
    device_copy_.reset();
    StatusOr<TrainingState> made = MakeTrainingState(n, spec_.optimizer, device);
    if (!made.ok()) {
      device_copy_failed_ = true;
      LOCKSTEP_LOG(WARNING) << "checkpoint snapshots read the state directly (the trainer waits "
                               "for each capture): no room for its copy on "
                            << device.name() << ": " << made.status();
      return false;
    }
    device_copy_ = std::move(made).value();
  }
  TrainingState& copy = *device_copy_;
  const auto from = state.optimizer.StateBuffers();
  const auto to = copy.optimizer.StateBuffers();
  bool fits = from.size() == to.size();
  for (size_t b = 0; fits && b < from.size(); ++b) fits = from[b].second == to[b].second;
  if (!fits) {
    // Not expected (the copy is made from the trainer's own optimizer spec): say so once.
    device_copy_failed_ = true;
    LOCKSTEP_LOG(WARNING) << "checkpoint snapshots read the state directly: its optimizer "
                             "buffers do not match the device copy's";
    return false;
  }
  // In the compute stream's order: after this step's update, before the next step's.
  CopyTrainingState(state, copy);
  return true;
}

void TrainingCheckpointer::Snapshot(const TrainingState& state) {
  if (!current_) return;
  FinishCapture();
  const double started = MonotonicSeconds();
  // The checkpointer's spent buffer, or the one carried over from the previous generation: either
  // way FillCheckpointState only copies, and the checkpointer takes the buffer without copying.
  checkpoint::CheckpointState staging = current_->TakeRecycledState();
  if (staging.tensors.empty()) std::swap(staging, carried_over_);
  last_snapshot_step_ = state.step;
  if (options_.checkpoint.async) {
    // The copy runs on the checkpointer's capture thread while training reads on; the trainer
    // waits for it (WaitForCapture) before the next optimizer update changes `state`.
    // The device state as of this step boundary: the capture thread's copies wait for this
    // event, not for the next step's work that the training thread queues meanwhile.
    // With the device copy, the capture reads the copy, and the trainer may change its state
    // at once: the compute stream runs the copy before the next step's work.
    kernels::Device& device = *state.params.device();
    const TrainingState* source = TakeDeviceCopy(state) ? &*device_copy_ : &state;
    if (!state_ready_) state_ready_ = device.CreateEvent();
    device.Record(*state_ready_, device.compute());
    current_->SnapshotInBackground(
        std::move(staging), [this, source](checkpoint::CheckpointState* out) {
          FillCheckpointState(*source, layout_, spec_, out, state_ready_.get(), scope_);
        });
    capture_pending_ = true;
    capture_reads_copy_ = source != &state;
    capture_handover_seconds_ = MonotonicSeconds() - started;
    return;
  }
  FillCheckpointState(state, layout_, spec_, &staging, nullptr, scope_);
  current_->Snapshot(std::move(staging));
  if (metrics_ != nullptr) metrics_->ObserveCheckpoint("snapshot", MonotonicSeconds() - started);
  // Synchronous checkpoints: training waits for the write (and its retries), but never longer
  // than one attempt's limit; a write still failing then goes on in the background.
  Status flushed = current_->Flush(Deadline::AfterMs(options_.attempt_timeout_ms));
  if (!flushed.ok()) {
    LOCKSTEP_LOG(WARNING) << "synchronous checkpoint of step " << state.step
                          << " not persisted: " << flushed << "; training goes on";
  }
}

Status TrainingCheckpointer::OnStep(const TrainingState& state, comm::Communicator& communicator,
                                    int64_t timeout_ms) {
  const int64_t interval = options_.checkpoint.interval_steps;
  if (interval <= 0 || state.step % interval != 0) return OkStatus();
  // The previous snapshot's copy must have been queued before the busy check counts it (without
  // the device copy the trainer has waited for it before its optimizer update anyway; with it,
  // this waits only for a capture that outlasted the interval).
  FinishCapture();
  int64_t busy = 0;
  if (current_) {
    const checkpoint::AsyncCheckpointerStats stats = current_->stats();
    busy = stats.snapshots - stats.persisted - stats.dropped > 0 ? 1 : 0;
  }
  LOCKSTEP_RETURN_IF_ERROR(
      communicator.AllReduce(&busy, 1, comm::DataType::kInt64, comm::ReduceOp::kMax, timeout_ms)
          .WithContext("checkpoint: all-reduce of the writers' state"));
  if (busy != 0) {
    LOCKSTEP_LOG(INFO) << "checkpoint of step " << state.step
                       << " skipped: an earlier one is still being persisted";
    return OkStatus();
  }
  Snapshot(state);
  return OkStatus();
}

void TrainingCheckpointer::SnapshotFinal(const TrainingState& state) {
  if (state.step == last_snapshot_step_) return;
  Snapshot(state);
}

Status TrainingCheckpointer::WaitForFinal(Deadline deadline) {
  FinishCapture();
  if (!current_) return OkStatus();
  return current_->Flush(deadline);
}

}  // namespace lockstep::trainer
