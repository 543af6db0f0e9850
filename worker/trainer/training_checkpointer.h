// TrainingCheckpointer: how training uses checkpoints (spec.checkpoint), for one worker process.
//
//   - Restore (rank 0 only, when no member of a generation holds state): the newest valid
//     checkpoint under spec.checkpoint.uri (damaged ones are reported and skipped), or nothing.
//   - OnStep (every committed step, at the step boundary): every intervalSteps, the state is
//     snapshotted in memory and persisted by an AsyncCheckpointer in the background (async:
//     true), or persisted before training goes on (async: false). With async, even the copy
//     into the snapshot runs in the background, while the next step's forward and backward
//     read the state: the trainer calls WaitForCapture() before it changes the state (the
//     optimizer update), which is the only point where training may wait for the copy (see
//     Trainer::SetBeforeStateChange). Every rank writes its shard;
//     the attempt id ("g<generation>-<nonce rank 0 drew>") is the same on every rank of a
//     generation and differs between generations and between incarnations of the job.
//   - SnapshotFinal / WaitForFinal: the state at the end of training, persisted before Leave
//     (bounded wait).
//   - Pipelines (SetPipelineStages): replica 0's rank of each stage writes that stage's part of
//     the checkpoint (checkpoint_state.h, checkpoint_writer.h); the other replicas write nothing.
//     NewestFitting and RestoreStage serve the pipeline's state agreement: rank 0 picks the
//     checkpoint and each stage reads only its own tensors of it.
// A failed persist is retried with back-off and reported (log, lockstep_checkpoint_failures_total)
// and never stops training; nothing is ever renamed over a complete checkpoint, so the previous
// one stays valid. When a generation ends (EndGeneration), its AsyncCheckpointer is retired on a
// helper thread: the write in flight finishes or fails on its own (bounded by
// attempt_timeout_ms) without holding up the next generation; its writer only ever renames a
// complete directory, so an abandoned write leaves at most a .tmp- directory, which the next
// commit's retention removes.
//
// Thread safety: every method is called by the training thread; last_checkpoint_step/uri may be
// read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/spec/training_job.h"
#include "common/status.h"
#include "kernels/device.h"
#include "worker/checkpoint/async_checkpointer.h"
#include "worker/checkpoint/storage/storage.h"
#include "worker/comm/communicator.h"
#include "worker/metrics.h"
#include "worker/trainer/checkpoint_state.h"
#include "worker/trainer/model.h"
#include "worker/trainer/training_state.h"

namespace lockstep::trainer {

struct TrainingCheckpointerOptions {
  spec::CheckpointSpec checkpoint;  // uri (non-empty), intervalSteps, keep, async
  // Limit of one persist attempt. Smaller: a write that cannot finish (a peer died before writing
  // its shard) is given up sooner; larger: a slow storage can still take a big checkpoint.
  int64_t attempt_timeout_ms = 60000;
  // Attempts per checkpoint (the first included) and the pause before the second, doubling.
  int max_attempts = 5;
  int64_t retry_initial_backoff_ms = 1000;
  int64_t retry_max_backoff_ms = 30000;
  // Limit of reading the newest valid checkpoint at a restore.
  int64_t restore_timeout_ms = 300000;
  // Asynchronous snapshots: whether the state is first copied into a second copy on its own
  // device, in the compute stream's order at the step boundary, and captured from there (kAuto:
  // on a GPU, where that copy takes well under a millisecond and the capture to the host tens of
  // them). The trainer then waits for a capture only when the next checkpoint comes before it
  // has finished; the cost is one more copy of the
  // parameters and optimizer state in device memory (without room for it, the state is captured
  // directly, as on the CPU).
  enum class DeviceCopy { kAuto, kAlways, kNever };
  DeviceCopy device_copy = DeviceCopy::kAuto;
};

class TrainingCheckpointer {
 public:
  // INVALID_ARGUMENT for a malformed URI. metrics may be null.
  static StatusOr<std::unique_ptr<TrainingCheckpointer>> Create(TrainingCheckpointerOptions options,
                                                                const spec::TrainerSpec& spec,
                                                                const ParameterLayout& layout,
                                                                WorkerMetrics* metrics);
  // Retires the current checkpointer and waits for every retired one (each bounded by
  // attempt_timeout_ms). Call WaitForFinal first to keep the final checkpoint.
  ~TrainingCheckpointer();

  // Restores `state` from the newest valid checkpoint; returns its step, -1 when there is none
  // (the state is untouched). Errors: the storage's (unreachable), FAILED_PRECONDITION when the
  // checkpoint does not fit the manifest's model.
  StatusOr<int64_t> Restore(TrainingState& state);

  // The pipeline's stages (Trainer::pipeline_plan), before the first generation. Without it (or
  // with one stage) every rank holds the whole state.
  void SetPipelineStages(std::vector<LayerRange> stages);

  // A generation formed with this process as `rank` of `world_size`; `attempt_id` must be the
  // same on every member and unique to the generation. `state` is what this rank holds after the
  // state agreement (a pipeline stage's: the parts' tables come from it).
  void BeginGeneration(const std::string& attempt_id, int rank, int world_size,
                       const TrainingState& state);

  // Pipeline, rank 0: the newest valid-looking checkpoint (its shards' sizes are checked, their
  // checksums by the stages that read them) of a step below `below` that fits the whole model,
  // -1 when there is none. Damaged or unfitting ones are skipped with a warning; errors are the
  // storage's.
  StatusOr<int64_t> NewestFitting(int64_t below, const TrainingState& state);
  // Pipeline: fills `state`, stage `stage`'s, with that stage's tensors of the checkpoint of
  // `step` (only the shards holding them are read, and checked). DATA_LOSS when it is damaged,
  // FAILED_PRECONDITION when it is not this model's (the caller tries an older one either way),
  // else the storage's errors. `state` is unchanged on any error.
  Status RestoreStage(int64_t step, int stage, TrainingState& state);
  // Pipeline, rank 0: a stage found the checkpoint of `step` damaged: it is deleted (as
  // retention deletes, checkpoint_deletion.h), so that no later write of that step keeps it as
  // committed because its sizes check out. Errors are the storage's (logged by the caller).
  Status DiscardStep(int64_t step);
  int64_t restore_timeout_ms() const { return options_.restore_timeout_ms; }
  // The generation ended (or training did): retires its AsyncCheckpointer.
  void EndGeneration();

  // At every committed step, on every rank: at multiples of intervalSteps the ranks all-reduce
  // whether any of them is still persisting an earlier checkpoint; if none is, every rank
  // snapshots this step, else every rank skips it. So all ranks persist the same steps, and
  // rank 0 never waits for the shard of a step that another rank dropped. Errors are the
  // communicator's.
  Status OnStep(const TrainingState& state, comm::Communicator& communicator, int64_t timeout_ms);
  // With async: the snapshot OnStep took copies the state on a helper thread; until this
  // returns, the state passed to OnStep (or SnapshotFinal) must stay alive and unchanged. Call
  // it before changing the state; cheap when no copy is running, and immediate when the capture
  // reads the device copy (options' device_copy). Every other method of this class waits for
  // the capture itself where it needs to.
  void WaitForCapture();
  // At the end of training: checkpoints the final state unless that step is already queued.
  void SnapshotFinal(const TrainingState& state);
  // Waits until the final checkpoint is persisted (rank 0: committed), bounded by `deadline`.
  Status WaitForFinal(Deadline deadline);

  // The newest checkpoint this process committed (rank 0) or wrote its shard of; -1: none.
  int64_t last_checkpoint_step() const { return last_step_.load(); }
  std::string last_checkpoint_uri() const;

 private:
  TrainingCheckpointer(TrainingCheckpointerOptions options, checkpoint::StorageUri uri,
                       std::shared_ptr<checkpoint::Storage> storage, const spec::TrainerSpec& spec,
                       const ParameterLayout& layout, WorkerMetrics* metrics);
  void Snapshot(const TrainingState& state);
  // Waits for a running capture, whatever it reads.
  void FinishCapture();
  // Copies `state` into device_copy_ on the compute stream (allocating it the first time);
  // false when the device copy is not to be used or cannot be had.
  bool TakeDeviceCopy(const TrainingState& state);

  TrainingCheckpointerOptions options_;
  checkpoint::StorageUri uri_;
  std::shared_ptr<checkpoint::Storage> storage_;
  spec::TrainerSpec spec_;
  ParameterLayout layout_;
  WorkerMetrics* metrics_;

  int rank_ = 0;
  std::vector<LayerRange> stages_;  // empty or one: no pipeline
  // What this rank's snapshots hold: its stage's part (pipeline) or the whole state.
  std::optional<CheckpointScope> scope_;
  std::unique_ptr<checkpoint::AsyncCheckpointer> current_;
  // A background copy was started and WaitForCapture has not yet seen it end; the hand-over's
  // seconds, to which the wait is added for the snapshot stall metric.
  bool capture_pending_ = false;
  bool capture_reads_copy_ = false;  // ... and it reads device_copy_, not the trainer's state
  double capture_handover_seconds_ = 0;
  // The state's copy on its device that captures read (options' device_copy); allocation failed
  // once: not tried again.
  std::optional<TrainingState> device_copy_;
  bool device_copy_failed_ = false;
  int64_t last_snapshot_step_ = -1;
  // A state buffer taken from a retired checkpointer, used by the next generation's first
  // snapshot (later ones reuse the checkpointer's own spare): a snapshot costs one copy, no
  // allocation.
  checkpoint::CheckpointState carried_over_;
  // Recorded on the device's compute stream at each background snapshot's step boundary.
  std::unique_ptr<kernels::DeviceEvent> state_ready_;
  std::vector<std::thread> retiring_;
  std::atomic<int64_t> last_step_{-1};
};

}  // namespace lockstep::trainer
