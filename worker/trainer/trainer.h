// Trainer: the built-in trainer's data-parallel training loop over one communicator generation.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(job, std::move(splits), metrics));
//   for (each generation) {
//     LOCKSTEP_RETURN_IF_ERROR(trainer->AgreeOnState(*comm, info));   // newest member broadcasts
//     Status s = trainer->Train(*comm, info, stop, on_progress);      // until done, stop or error
//     if (!s.ok()) continue;                                           // next generation
//   }
//   LOCKSTEP_ASSIGN_OR_RETURN(EvalResult eval, trainer->Evaluate(*comm, info));
//
// Each step: the global batch of G samples is the next slice of the seeded global order
// (sampler.h); this rank gathers its RankSlice, runs forward and backward with the loss scaled by
// 1/G, and the DDP engine (gradient_synchronizer.h) SUM-all-reduces the gradient buckets while
// backward proceeds, so every rank ends with the exact global-mean gradient, also for a short
// final batch split unevenly. Then one fused optimizer pass.
//
// spec.trainer.sync picks how the ranks keep one model: the all-reduce above (allreduce); dgc,
// which exchanges only the largest momentum-corrected gradient entries of the larger buckets
// (dgc.h, inside the DDP engine); or localSGD, whose local steps apply each rank's own gradient
// and average the parameters every period steps (local_sgd.h). At a state point (a checkpoint
// step, the last step, leaving a generation) every strategy leaves the whole state equal on every
// rank.
//
// G is spec::GlobalBatchSize: with spec.elastic.globalBatch fixed (a fixed-size job's default)
// it is replicas x ranksPerWorker x batchSize at every world size, so while a failed worker is
// being replaced the survivors train the same samples per step with the same learning rate, and
// the model does not depend on when failures happened. A rank whose slice then exceeds batchSize
// trains it in micro-batches of at most batchSize (the memory it was sized for), accumulating the
// gradient, and only the last micro-batch's backward overlaps the all-reduce: the step costs
// more compute, never another collective. With scaleWithWorld, G = W x batchSize.
//
// Evaluation shards the test split over the ranks in contiguous blocks and all-reduces (loss
// sum, correct, count), so every rank ends with the same result and the work scales with the
// world size.
//
// Devices: spec.trainer.device picks the device (kernels/device.h) that holds the parameters,
// gradients, optimizer state and activations; everything above runs unchanged on either. Per step
// the host gathers the batch (BatchStager copies it over) and queues kernels; it reads nothing
// back except at log intervals (the loss), with fp16 compression (the overflow check) and at
// state agreements and checkpoints, so on a GPU the host runs ahead and the device stays busy.
//
// Pipeline parallelism (spec.trainer.pipeline, docs/pipeline.md; trainer_pipeline.cc): rank r
// is stage r % P of replica r / P; its state holds only its stage's layers. Each step, the
// replica's batch slice runs through the stages (PipelineStage over the pipeline's
// communicator), each stage's gradient is all-reduced over its stage group (the same stage of
// every replica) and every rank steps its own layers. The caller builds both communicators for
// each generation and hands them over with SetPipelineCommunicators before AgreeOnState.
//
// Thread safety: one thread drives a Trainer; `stop` may be set from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/spec/training_job.h"
#include "common/status.h"
#include "kernels/device.h"
#include "worker/comm/communicator.h"
#include "worker/metrics.h"
#include "worker/trainer/buckets.h"
#include "worker/trainer/dataset.h"
#include "worker/trainer/dgc.h"
#include "worker/trainer/model.h"
#include "worker/trainer/pipeline_stage.h"
#include "worker/trainer/sampler.h"
#include "worker/trainer/training_state.h"

namespace lockstep::trainer {

// The manifest's activation (spec.trainer.model.activation) as the kernels name it.
kernels::ActivationType ToKernelActivation(spec::Activation activation);

struct GenerationInfo {
  int64_t generation = 0;
  int rank = 0;
  int world_size = 1;
};

// Progress of the job as of a log interval; loss and rates are global (all-reduced).
struct TrainingProgress {
  int64_t step = 0;
  int64_t total_steps = 0;
  int64_t samples = 0;               // global samples consumed
  double loss = 0;                   // mean per-sample loss over the interval
  double samples_per_second = 0;     // global, over the interval
  double scaling_efficiency = 0;     // this rank's compute / step time over the interval
  double comm_exposed_fraction = 0;  // this rank's exposed communication / step time
};

// Cumulative figures of this process's training, for the final report.
struct TrainingTotals {
  int64_t steps = 0;           // steps this process trained
  int64_t samples = 0;         // global samples of those steps
  double step_seconds = 0;     // wall time of those steps
  double exposed_seconds = 0;  // of which waiting on communication
  int64_t wire_bytes = 0;      // bytes this rank handed to the collectives of those steps
  double wire_bytes_per_step() const {
    return steps > 0 ? static_cast<double>(wire_bytes) / static_cast<double>(steps) : 0;
  }
  double samples_per_second() const { return step_seconds > 0 ? samples / step_seconds : 0; }
  double scaling_efficiency() const {
    return step_seconds > 0 ? 1.0 - exposed_seconds / step_seconds : 0;
  }
};

struct EvalResult {
  int64_t samples = 0;
  int64_t correct = 0;
  double loss = 0;  // mean per-sample loss
  double accuracy() const { return samples > 0 ? static_cast<double>(correct) / samples : 0; }
};

class Trainer {
 public:
  using ProgressFn = std::function<void(const TrainingProgress&)>;
  // Called on the training thread after every committed step whose state every rank holds alike
  // (local SGD: after its full averages only, which include every checkpoint step and the last
  // step), at the step boundary (the state is not modified while the callback runs), on every
  // rank at the same steps,
  // so it may issue collectives. An error ends Train with it (the generation is over).
  using StepFn = std::function<Status(const TrainingState&)>;
  // Called on rank 0 only, when no member of a generation holds state: fills `state` from the
  // newest valid checkpoint and returns its step, or returns -1 and leaves `state` untouched
  // (no checkpoint: training starts from the seed). An error (storage unreachable) ends the
  // generation; the next one tries again.
  using RestoreFn = std::function<StatusOr<int64_t>(TrainingState& state)>;

  // InvalidArgument when the manifest has no trainer or the model does not fit the data;
  // FailedPrecondition naming spec.trainer.device and the reason when device: cuda cannot be used
  // here (no driver, no device, a build without CUDA); ResourceExhausted when the model does not
  // fit the device. metrics may be null. A cuda trainer uses the visible GPU `cuda_ordinal`
  // (rank r of a pod of several ranks uses the pod's GPU r).
  static StatusOr<std::unique_ptr<Trainer>> Create(const spec::TrainingJob& job, DataSplits data,
                                                   WorkerMetrics* metrics, int cuda_ordinal = 0);
  // The visible GPU a cuda trainer uses.
  int cuda_ordinal() const { return cuda_ordinal_; }

  const spec::TrainerSpec& spec() const { return spec_; }
  // The device the trainer computes on (the communicator must reduce its memory).
  kernels::Device& device() const { return *device_; }
  const MlpModel& model() const { return model_; }
  const TrainingState& state() const { return state_; }
  // The step of the state held in memory, -1 before the first agreement (a fresh process holds
  // no state; what the rendezvous Join reports).
  int64_t state_step() const { return has_state_ ? state_.step : -1; }
  // The checkpoint step this process's state was restored from (-1: none), as agreed: every
  // member of the generation that restored it knows it.
  int64_t resumed_from_step() const { return resumed_from_step_; }

  // `wait` runs on the training thread before the trainer changes its state: before every
  // optimizer update (and the loss-scale change that replaces it on an fp16 overflow) and at the
  // start of a state agreement. Work that reads the state the StepFn was given may go on in the
  // background until then: TrainingCheckpointer copies a snapshot while the next step's forward
  // and backward run, and waits here for the copy. Call before the first generation.
  void SetBeforeStateChange(std::function<void()> wait) { before_state_change_ = std::move(wait); }
  // Called on the training thread after every step with totals().steps and the seconds of them
  // spent computing (step time less the time exposed waiting on collectives): this rank's pace,
  // for straggler detection. Must be cheap.
  using PaceFn = std::function<void(int64_t steps, double compute_seconds)>;
  void SetPaceReporter(PaceFn report) { report_pace_ = std::move(report); }

  // Turns on sample accounting (see the file comment of sample_accounting.h); rank 0 appends
  // one JSON line per epoch to `path`. Call before the first generation.
  void EnableSampleAccounting(const std::string& path);
  const TrainingTotals& totals() const { return totals_; }
  const TrainingProgress& last_progress() const { return last_progress_; }
  bool has_test_split() const { return data_.test.has_value(); }
  int64_t collective_timeout_ms() const { return spec_.allreduce.timeout_seconds * 1000; }

  // Samples one step trains at this world size (spec::GlobalBatchSize), with the replicas the
  // members agreed on at the last AgreeOnState (this process's manifest's before the first).
  int64_t GlobalBatchSize(int world_size) const;
  // Steps of the whole job at this world size (for epochs: from the current cursor on).
  int64_t TotalSteps(int world_size) const;
  // Whether the job's steps or epochs are done.
  bool Finished() const;
  // Whether the state after `step` steps, with the data at `cursor`, must be whole and equal on
  // every rank: the last step, or a checkpoint step (spec.checkpoint.intervalSteps).
  bool StatePointAfter(int64_t step, const DataCursor& cursor) const;

  // Runs the state agreement of training_state.h for a freshly formed generation. When no member
  // holds state, rank 0 calls `restore` (may be empty: start from the seed). The members also
  // agree on `replicas` for the global batch: `kubectl scale` changes it while pods started
  // before keep their old manifest, so the value of the newest manifest (metadata.generation,
  // the API server's version of the spec) wins and every rank slices the same global batch.
  Status AgreeOnState(comm::Communicator& communicator, const GenerationInfo& generation,
                      const RestoreFn& restore = nullptr);

  // Trains until Finished() (OK), `stop` is set (CANCELLED), or a collective fails (its error:
  // the generation is over; the state stays at the last completed step). on_progress runs on
  // this thread every log interval and after the last step, on every rank.
  //
  // Leaving together: while *leave_requested is set, this rank votes at every step to leave the
  // generation (gradient_synchronizer.h); once any rank voted, every rank completes that same
  // step and Train returns ABORTED with *left_generation set (the state is consistent and equal
  // on every rank; the caller joins the next generation).
  Status Train(comm::Communicator& communicator, const GenerationInfo& generation,
               const std::atomic<bool>& stop, const ProgressFn& on_progress,
               const StepFn& on_step = nullptr, const std::atomic<bool>* leave_requested = nullptr,
               bool* left_generation = nullptr);

  // Evaluation on the test split (see above). FailedPrecondition without a test split.
  StatusOr<EvalResult> Evaluate(comm::Communicator& communicator, const GenerationInfo& generation);

  // Writes the whole model's flat parameter buffer to `path` as raw little-endian float32: rank
  // 0 alone, or in a pipeline each stage of replica 0 its slice into the file rank 0 sized
  // (every rank calls it, on the generation's communicator; whole only where replica 0's ranks
  // share a filesystem, as under `lockstep run`).
  Status DumpParameters(const std::string& path, comm::Communicator& communicator,
                        const GenerationInfo& generation) const;

  // Pipeline parallelism: whether the job has one, its plan (the stages' layers, micro-batches,
  // schedule), and where rank `rank` sits in it.
  bool pipelined() const { return plan_.stages.size() > 1; }
  const PipelinePlan& pipeline_plan() const { return plan_; }
  static PipelinePlace PlaceInPipeline(int rank, int stages) {
    return {rank % stages, rank / stages};
  }
  // This generation's pipeline communicator (the replica's stages as ranks 0..P-1) and stage
  // group (that stage of every replica, by replica); both outlive the generation's calls. Set
  // before AgreeOnState; nullptr to clear.
  void SetPipelineCommunicators(comm::Communicator* pipe, comm::Communicator* stage_group) {
    pipe_ = pipe;
    stage_group_ = stage_group;
  }
  // Pipeline: the checkpoints the state agreement restores from when the ranks do not hold every
  // stage at one step (TrainingCheckpointer's NewestFitting and RestoreStage). Unset: the seed.
  struct StageCheckpoints {
    // Rank 0: the newest checkpoint step below `below` that fits the whole model (-1: none),
    // given the stage state this rank holds.
    std::function<StatusOr<int64_t>(int64_t below, const TrainingState& state)> newest;
    // A rank of replica 0: `state`, stage `stage`'s, from the checkpoint of `step`.
    std::function<Status(int64_t step, int stage, TrainingState& state)> restore;
    // Rank 0: a stage found the checkpoint of `step` damaged; delete it.
    std::function<Status(int64_t step)> discard;
    // How long `newest` and `restore` may take: the ranks waiting on them wait this much longer
    // than a collective's timeout.
    int64_t timeout_ms = 0;
  };
  void SetStageCheckpoints(StageCheckpoints checkpoints) {
    stage_checkpoints_ = std::move(checkpoints);
  }

 private:
  Trainer(const spec::TrainingJob& job, DataSplits data, MlpModel model,
          std::unique_ptr<kernels::Device> device, WorkerMetrics* metrics);
  Status AllocateState();
  // The replicas agreement of AgreeOnState (see there); one all-gather.
  Status AgreeOnReplicas(comm::Communicator& communicator, int64_t timeout_ms);
  // Whether the job's steps or epochs are done after `step` steps with the data at `cursor`.
  bool FinishedAt(int64_t step, const DataCursor& cursor) const;
  // The interval's progress report (every log interval and after the last step): the loss
  // all-reduced over every rank, rates, metrics, the log line and on_progress.
  struct Interval {
    int64_t samples = 0;
    double started = 0;
    double step_seconds = 0;
    double exposed_seconds = 0;
  };
  Status ReportProgress(comm::Communicator& communicator, const GenerationInfo& generation,
                        Interval& interval, const ProgressFn& on_progress);
  // Applies the step's reduced gradients (grads_) to state_ with the optimizer, or on an fp16
  // overflow skips the step and halves the loss scale. Returns whether the optimizer stepped.
  bool ApplyGradients(bool overflow, int64_t batches_per_step,
                      const std::vector<ParamRange>& momentum_free);
  // Sums (loss sum, correct, samples) over every rank into the evaluation's result.
  StatusOr<EvalResult> ReduceEvaluation(comm::Communicator& communicator, double totals[3]) const;
  // trainer_pipeline.cc: the pipeline's state agreement, training and evaluation.
  Status AgreeOnPipelineState(comm::Communicator& communicator, const GenerationInfo& generation);
  // The most samples a pipeline replica trains per step at `world_size` ranks: its share of the
  // global batch (batchSize while every replica is there).
  int64_t ReplicaRows(int world_size) const;
  // A state for stage `stage` from the seed (step 0).
  StatusOr<TrainingState> SeedStageState(int stage) const;
  // The agreement when no step has every stage held (a fresh start, or every replica of a stage
  // lost): every stage from the newest checkpoint that serves, else the seed. `held_step`: the
  // newest step any rank held (-1: none).
  Status RestorePipelineState(comm::Communicator& communicator, const GenerationInfo& generation,
                              int64_t held_step);
  // Steps the optimizer with the reduced gradients in grads_ and moves the cursor past the
  // global batch of `global_batch_size` (the step's commit); `account`: this rank writes the
  // sample accounting.
  void CommitPipelineStep(int64_t global_batch_size, bool overflow, bool account);
  Status TrainPipeline(comm::Communicator& communicator, const GenerationInfo& generation,
                       const std::atomic<bool>& stop, const ProgressFn& on_progress,
                       const StepFn& on_step, const std::atomic<bool>* leave_requested,
                       bool* left_generation);
  StatusOr<EvalResult> EvaluatePipeline(comm::Communicator& communicator,
                                        const GenerationInfo& generation);
  Status DumpPipelineParameters(const std::string& path, comm::Communicator& communicator,
                                const GenerationInfo& generation) const;

  spec::TrainerSpec spec_;
  spec::TrainingJobSpec job_spec_;           // for the global batch size; replicas as agreed
  int64_t spec_generation_ = 0;              // metadata.generation of this process's manifest
  std::unique_ptr<kernels::Device> device_;  // before everything allocated on it
  int cuda_ordinal_ = 0;
  DataSplits data_;
  MlpModel model_;
  WorkerMetrics* metrics_;
  GlobalSampler sampler_;
  TrainingState state_;
  bool has_state_ = false;
  int64_t resumed_from_step_ = -1;
  std::string accounting_path_;
  std::function<void()> before_state_change_;  // may be empty
  PaceFn report_pace_;                         // may be empty
  kernels::DeviceArray<float> grads_;
  std::unique_ptr<DgcExchanger> dgc_;  // sync.strategy dgc: its residuals, across generations
  kernels::DeviceArray<double> loss_sum_;  // the training loss summed since the last log step
  TrainingTotals totals_;
  TrainingProgress last_progress_;
  // Pipeline parallelism (empty plan_.stages: none). stage_: the stage whose layers state_ and
  // grads_ hold (-1 before the first agreement); runner_: its PipelineStage.
  PipelinePlan plan_;
  int stage_ = -1;
  // The step whose reduced gradients grads_ holds while its commit was in flight (-1: none), and
  // whether the last committed step overflowed.
  int64_t pending_step_ = -1;
  int64_t pending_global_batch_ = 0;  // the global batch that step was trained with
  bool last_overflow_ = false;
  std::unique_ptr<PipelineStage> runner_;
  comm::Communicator* pipe_ = nullptr;
  comm::Communicator* stage_group_ = nullptr;
  StageCheckpoints stage_checkpoints_;
};

}  // namespace lockstep::trainer
