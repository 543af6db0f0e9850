#include "worker/trainer/trainer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <optional>
#include <tuple>
#include <vector>

#include "common/deadline.h"
#include "common/logging.h"
#include "worker/trainer/batch_stager.h"
#include "worker/trainer/buckets.h"
#include "worker/trainer/gradient_synchronizer.h"
#include "worker/trainer/local_sgd.h"
#include "worker/trainer/sample_accounting.h"

namespace lockstep::trainer {

kernels::ActivationType ToKernelActivation(spec::Activation activation) {
  switch (activation) {
    case spec::Activation::kRelu:
      return kernels::ActivationType::kRelu;
    case spec::Activation::kGelu:
      return kernels::ActivationType::kGelu;
    case spec::Activation::kTanh:
      return kernels::ActivationType::kTanh;
  }
  return kernels::ActivationType::kRelu;
}

namespace {

// fp16 dynamic loss scaling, PyTorch GradScaler's defaults: halve on overflow (and skip the
// step), double after this many steps without one.
constexpr int64_t kLossScaleGrowthInterval = 2000;
constexpr float kMinLossScale = 1.0f;
constexpr float kMaxLossScale = 16777216.0f;  // 2^24

// Rows per forward call during evaluation.
constexpr int64_t kEvalChunkRows = 1024;

}  // namespace

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const spec::TrainingJob& job, DataSplits data,
                                                   WorkerMetrics* metrics, int cuda_ordinal) {
  if (!job.spec.trainer.has_value()) {
    return InvalidArgumentError("spec.trainer: the built-in trainer needs a trainer section");
  }
  const spec::TrainerSpec& trainer = *job.spec.trainer;
  if (trainer.batch_size < 1) {
    return InvalidArgumentError("spec.trainer.batchSize: must be >= 1 (got " +
                                std::to_string(trainer.batch_size) + ")");
  }
  // A fixed global batch is batchSize x replicas: a job built in code without replicas would
  // silently train on one sample per step.
  if (job.spec.replicas < 1) {
    return InvalidArgumentError("spec.replicas: must be >= 1 (got " +
                                std::to_string(job.spec.replicas) +
                                "); the global batch is batchSize x replicas");
  }
  if (data.test.has_value() && data.test->num_features != data.train.num_features) {
    return InvalidArgumentError(
        "spec.trainer.data.test: " + std::to_string(data.test->num_features) +
        " features per sample, the train split has " + std::to_string(data.train.num_features));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(
      MlpModel model,
      MlpModel::Create(data.train.num_features, trainer.model.hidden, data.train.num_classes,
                       ToKernelActivation(trainer.model.activation),
                       trainer.precision == spec::Precision::kBf16 ? Precision::kBf16
                                                                   : Precision::kFp32));
  // One GPU per rank: `cuda_ordinal` among those visible (the first, for a pod of one rank, to
  // which the launcher or the device plugin gives exactly its GPU; local rank r of a pod of
  // several sees all the pod's GPUs, so that NCCL can use peer-to-peer between them).
  const bool cuda = trainer.device == spec::Device::kCuda;
  StatusOr<std::unique_ptr<kernels::Device>> device = kernels::CreateDevice(
      cuda ? kernels::DeviceType::kCuda : kernels::DeviceType::kCpu, cuda ? cuda_ordinal : 0);
  if (!device.ok()) {
    return FailedPreconditionError("spec.trainer.device: " + std::string(spec::ToString(trainer.device)) +
                                   " cannot be used here: " + device.status().message());
  }
  LOCKSTEP_LOG(INFO) << "training on " << (*device)->name();
  std::unique_ptr<Trainer> created(
      new Trainer(job, std::move(data), std::move(model), std::move(device).value(), metrics));
  created->cuda_ordinal_ = cuda ? cuda_ordinal : 0;
  if (trainer.pipeline.stages > 1) {
    LOCKSTEP_ASSIGN_OR_RETURN(created->plan_,
                              MakePipelinePlan(trainer.pipeline, created->model_.layout()));
  }
  LOCKSTEP_RETURN_IF_ERROR(created->AllocateState().WithContext("spec.trainer.device: " +
                                                                created->device_->name()));
  return created;
}

Status Trainer::AllocateState() {
  LOCKSTEP_RETURN_IF_ERROR(loss_sum_.Allocate(*device_, 1));
  // A stage's state is allocated once its stage is known (AgreeOnPipelineState).
  if (pipelined()) return OkStatus();
  const int64_t num_params = model_.layout().num_params;
  LOCKSTEP_RETURN_IF_ERROR(state_.params.Allocate(*device_, num_params));
  LOCKSTEP_RETURN_IF_ERROR(state_.optimizer.Allocate(*device_));
  LOCKSTEP_RETURN_IF_ERROR(grads_.Allocate(*device_, num_params));
  // The initialisation is a host-side pure function of the seed: identical on every device.
  std::vector<float> initial(static_cast<size_t>(num_params));
  model_.InitializeParameters(spec_.seed, initial.data());
  return state_.params.CopyFromHost(initial.data(), num_params);
}

Trainer::Trainer(const spec::TrainingJob& job, DataSplits data, MlpModel model,
                 std::unique_ptr<kernels::Device> device, WorkerMetrics* metrics)
    : spec_(*job.spec.trainer),
      job_spec_(job.spec),
      spec_generation_(job.metadata.generation),
      device_(std::move(device)),
      data_(std::move(data)),
      model_(std::move(model)),
      metrics_(metrics),
      sampler_(data_.train.num_samples, spec_.seed),
      state_{0,
             DataCursor{},
             0,
             65536.0f,
             0,
             {},
             Optimizer(spec_.optimizer, model_.layout().num_params),
             {}} {}

bool Trainer::FinishedAt(int64_t step, const DataCursor& cursor) const {
  return spec_.steps > 0 ? step >= spec_.steps : cursor.epoch >= spec_.epochs;
}

bool Trainer::StatePointAfter(int64_t step, const DataCursor& cursor) const {
  const spec::CheckpointSpec& checkpoint = job_spec_.checkpoint;
  return FinishedAt(step, cursor) || (!checkpoint.uri.empty() && checkpoint.interval_steps > 0 &&
                                      step % checkpoint.interval_steps == 0);
}

bool Trainer::Finished() const { return FinishedAt(state_.step, state_.cursor); }

int64_t Trainer::GlobalBatchSize(int world_size) const {
  return spec::GlobalBatchSize(job_spec_, world_size);
}

int64_t Trainer::TotalSteps(int world_size) const {
  if (spec_.steps > 0) return spec_.steps;
  const int64_t global_batch = GlobalBatchSize(world_size);
  const int64_t n = data_.train.num_samples;
  if (state_.cursor.epoch >= spec_.epochs) return state_.step;
  const int64_t rest_of_epoch = n - state_.cursor.offset;
  const int64_t per_epoch = (n + global_batch - 1) / global_batch;
  return state_.step + (rest_of_epoch + global_batch - 1) / global_batch +
         (spec_.epochs - state_.cursor.epoch - 1) * per_epoch;
}

void Trainer::EnableSampleAccounting(const std::string& path) {
  accounting_path_ = path;
  state_.sample_counts.assign(static_cast<size_t>(data_.train.num_samples), 0);
}

Status Trainer::AgreeOnReplicas(comm::Communicator& communicator, int64_t timeout_ms) {
  struct Proposal {
    int64_t spec_generation;
    int64_t replicas;
  };
  const Proposal mine{spec_generation_, job_spec_.replicas};
  std::vector<Proposal> proposals(static_cast<size_t>(communicator.size()));
  LOCKSTEP_RETURN_IF_ERROR(
      communicator.AllGather(&mine, sizeof(mine), proposals.data(), timeout_ms)
          .WithContext("state agreement: all-gather of the manifests' replicas"));
  // The newest manifest's; within one manifest version every member proposes the same value.
  Proposal agreed = mine;
  for (const Proposal& proposal : proposals) {
    if (std::tie(proposal.spec_generation, proposal.replicas) >
        std::tie(agreed.spec_generation, agreed.replicas)) {
      agreed = proposal;
    }
  }
  if (agreed.replicas != job_spec_.replicas) {
    LOCKSTEP_LOG(INFO) << "replicas " << agreed.replicas << " of the newest manifest (generation "
                       << agreed.spec_generation << ") sizes the global batch; this process's "
                       << "manifest says " << job_spec_.replicas;
    job_spec_.replicas = static_cast<int32_t>(agreed.replicas);
    spec_generation_ = agreed.spec_generation;
  }
  return OkStatus();
}

Status Trainer::AgreeOnState(comm::Communicator& communicator, const GenerationInfo& generation,
                             const RestoreFn& restore) {
  if (before_state_change_) before_state_change_();
  if (pipelined()) return AgreeOnPipelineState(communicator, generation);
  const double started = MonotonicSeconds();
  const int64_t timeout_ms = collective_timeout_ms();
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                            GatherStateSteps(communicator, state_step(), timeout_ms));
  int source = SelectStateSource(steps);
  // Steps 3 and 4 below are entered by every member alike: the gathered vector is the same.
  int64_t resumed_from = resumed_from_step_;
  if (source < 0) {
    // Nobody holds state: rank 0 restores it and tells the others the outcome (a step, -1 for
    // the seed, -2 for a failure) before broadcasting, so that a failure ends the agreement on
    // every member alike instead of leaving some in a broadcast.
    int64_t outcome = -1;
    if (generation.rank == 0) {
      if (restore) {
        StatusOr<int64_t> restored = restore(state_);
        if (!restored.ok()) {
          LOCKSTEP_LOG(ERROR) << "no member holds state and the checkpoint cannot be read: "
                              << restored.status();
          outcome = -2;
        } else {
          outcome = *restored;
        }
      }
      if (outcome == -1) {
        LOCKSTEP_LOG(INFO) << "no member holds state and there is no checkpoint: starting from "
                              "the seed at step 0";
      }
    }
    LOCKSTEP_RETURN_IF_ERROR(communicator.Broadcast(&outcome, sizeof(outcome), 0, timeout_ms)
                                 .WithContext("state agreement: broadcast of the restore outcome"));
    if (outcome == -2) {
      return UnavailableError("state agreement: rank 0 could not read the checkpoints");
    }
    resumed_from = outcome;
    source = 0;
  }
  LOCKSTEP_RETURN_IF_ERROR(BroadcastTrainingState(communicator, source, state_, timeout_ms));
  // The source's resume point travels with it (a newcomer must report it too).
  LOCKSTEP_RETURN_IF_ERROR(
      communicator.Broadcast(&resumed_from, sizeof(resumed_from), source, timeout_ms)
          .WithContext("state agreement: broadcast of the resume step"));
  resumed_from_step_ = resumed_from;
  LOCKSTEP_RETURN_IF_ERROR(AgreeOnReplicas(communicator, timeout_ms));
  has_state_ = true;
  if (!accounting_path_.empty() && state_.sample_counts.empty()) {
    // The source kept no counts (its accounting was off): count from here on.
    state_.sample_counts.assign(static_cast<size_t>(data_.train.num_samples), 0);
  }
  LOCKSTEP_LOG(INFO) << "agreed on training state at step " << state_.step << " (epoch "
                     << state_.cursor.epoch << ", offset " << state_.cursor.offset << ") from rank "
                     << source
                     << (resumed_from >= 0
                             ? ", resumed from checkpoint step " + std::to_string(resumed_from)
                             : std::string())
                     << " in " << static_cast<int64_t>((MonotonicSeconds() - started) * 1000)
                     << " ms";
  return OkStatus();
}

Status Trainer::Train(comm::Communicator& communicator, const GenerationInfo& generation,
                      const std::atomic<bool>& stop, const ProgressFn& on_progress,
                      const StepFn& on_step, const std::atomic<bool>* leave_requested,
                      bool* left_generation) {
  if (left_generation != nullptr) *left_generation = false;
  if (pipelined()) {
    return TrainPipeline(communicator, generation, stop, on_progress, on_step, leave_requested,
                         left_generation);
  }
  const int world = generation.world_size;
  const int rank = generation.rank;
  const int64_t timeout_ms = collective_timeout_ms();
  const int64_t global_batch_size = GlobalBatchSize(world);
  // The linear scaling rule's factor: constant while the global batch is (optimizer.h).
  const int64_t batches_per_step = global_batch_size / spec_.batch_size;
  const int64_t largest_slice = (global_batch_size + world - 1) / world;
  const int64_t log_interval = std::max<int64_t>(1, spec_.log_interval_steps);
  const kernels::ExecutionContext& ctx = device_->compute();

  LOCKSTEP_ASSIGN_OR_RETURN(MlpWorkspace workspace,
                            MlpWorkspace::Create(model_, spec_.batch_size, *device_));
  LOCKSTEP_ASSIGN_OR_RETURN(
      BatchStager stager,
      BatchStager::Create(*device_, spec_.batch_size, data_.train.num_features));
  SynchronizerOptions sync_options;
  sync_options.compression = spec_.allreduce.compression;
  sync_options.timeout_ms = timeout_ms;
  // dgc at sparsity 0 sends everything: that is the all-reduce, so it runs as one, bit for bit.
  if (spec_.sync.strategy == spec::SyncStrategy::kDgc && spec_.sync.dgc.sparsity > 0) {
    if (dgc_ == nullptr) {
      dgc_ = std::make_unique<DgcExchanger>(spec_.sync.dgc, spec_.optimizer.momentum,
                                            spec_.optimizer.weight_decay, spec_.seed);
    }
    // A world of one sends nothing, so its steps use the optimizer's momentum and leave the
    // residuals untouched: drop them rather than send them stale once the world grows.
    if (world == 1) dgc_->DropAllResiduals();
    sync_options.dgc = dgc_.get();
  }
  // dgc selects per layer, as the paper and Fleet do (one bucket per layer; the output layer's
  // larger gradients would otherwise take most of a shared bucket's k), and a layer smaller than
  // minBucketElements is then all-reduced whole.
  const int64_t bucket_cap_bytes = sync_options.dgc != nullptr
                                       ? 0
                                       : BucketCapBytes(spec_.allreduce.bucket_mib);
  GradientSynchronizer synchronizer(communicator, *device_,
                                    AssignBuckets(model_.layout(), bucket_cap_bytes), sync_options);
  // Local SGD (local_sgd.h): a generation that ends between two averages rolls this rank back
  // to the last one, the state every rank held.
  std::optional<LocalSgd> local_sgd;
  if (spec_.sync.strategy == spec::SyncStrategy::kLocalSgd) {
    LOCKSTEP_ASSIGN_OR_RETURN(LocalSgd created,
                              LocalSgd::Create(spec_.sync.local_sgd, model_.layout().num_params,
                                               spec_.optimizer, *device_));
    local_sgd.emplace(std::move(created));
    local_sgd->Save(state_);
  }
  struct RollBackOnExit {
    Trainer* trainer;
    std::optional<LocalSgd>* local_sgd;
    ~RollBackOnExit() {
      if (!local_sgd->has_value() || !(*local_sgd)->diverged()) return;
      if (trainer->before_state_change_) trainer->before_state_change_();
      LOCKSTEP_LOG(INFO) << "local SGD: rolling back from step " << trainer->state_.step
                         << " to the last average";
      (*local_sgd)->RollBack(trainer->state_);
    }
  } roll_back_on_exit{this, &local_sgd};
  const double zero = 0;
  LOCKSTEP_RETURN_IF_ERROR(loss_sum_.CopyFromHost(&zero, 1));
  LOCKSTEP_LOG(INFO) << "training from step " << state_.step << " at world size " << world
                     << ": global batch " << global_batch_size << " ("
                     << spec::ToString(job_spec_.elastic.global_batch) << "), up to "
                     << GlobalSampler::MicroBatchCount(largest_slice, spec_.batch_size)
                     << " micro-batch(es) of at most " << spec_.batch_size << " per rank, "
                     << model_.layout().num_params << " parameters in "
                     << synchronizer.buckets().size() << " bucket(s), precision "
                     << spec::ToString(spec_.precision) << ", compression "
                     << spec::ToString(spec_.allreduce.compression) << ", sync "
                     << spec::ToString(spec_.sync.strategy);

  // Interval accumulators (reset at every log step); the loss sum is on the device (loss_sum_).
  Interval interval;
  interval.started = MonotonicSeconds();
  StepCommStats comm_stats;
  const MlpModel::LayerReadyFn on_layer_ready = [&synchronizer](int backward_layer) {
    synchronizer.OnLayerReady(backward_layer);
  };
  const MlpModel::LayerReadyFn no_layer_callback;

  while (!Finished()) {
    if (stop.load()) return CancelledError("training stopped");
    const double step_started = MonotonicSeconds();

    const GlobalSampler::GlobalBatch batch = sampler_.Next(state_.cursor, global_batch_size);
    const auto [lo, hi] = GlobalSampler::RankSlice(batch, world, rank);
    const std::vector<int64_t>& order = sampler_.Permutation(batch.epoch);
    const int64_t micro_batches = GlobalSampler::MicroBatchCount(hi - lo, spec_.batch_size);

    const bool leave_vote = leave_requested != nullptr && leave_requested->load();
    // Whether a checkpoint or the end follows this step: the whole state must then be equal on
    // every rank (local SGD averages everything) and be all there is (dgc drops its residuals).
    const bool state_point =
        StatePointAfter(state_.step + 1, sampler_.Advance(state_.cursor, batch));
    // A local step (local SGD) applies this rank's own gradient: its slice's sum scaled by W / G
    // estimates the global mean, and no collective is issued.
    const bool local = local_sgd.has_value() && local_sgd->IsLocal(state_.step);
    if (local && !local_sgd->diverged() && local_sgd->saved_step() != state_.step) {
      // The first local step after synchronous ones (post-local SGD): roll back no further.
      local_sgd->Save(state_);
    }
    const float grad_scale = (local ? static_cast<float>(world) : 1.0f) /
                             static_cast<float>(batch.size());
    if (!local) {
      synchronizer.BeginStep(grads_.device_data(), state_.loss_scale, leave_vote, state_.step,
                             state_.params.device_data());
    }
    for (int64_t micro = 0; micro < micro_batches; ++micro) {
      const auto [micro_lo, micro_hi] = GlobalSampler::MicroBatch(lo, hi, micro_batches, micro);
      const int64_t rows = micro_hi - micro_lo;
      const BatchStager::DeviceBatch device_batch =
          stager.Stage(data_.train, order.data() + micro_lo, rows);
      // The buckets go on the wire during the last micro-batch's backward, once the gradients
      // they hold are complete.
      const bool last = micro + 1 == micro_batches && !local;
      model_.ForwardBackward(ctx, state_.params.device_data(), device_batch.features,
                             device_batch.labels, rows, grad_scale, grads_.device_data(),
                             workspace, last ? on_layer_ready : no_layer_callback,
                             loss_sum_.device_data(), /*accumulate=*/micro > 0);
    }
    if (local) {
      comm_stats = StepCommStats{};
    } else {
      Status synced = synchronizer.Wait(&comm_stats);
      // dgc's residuals took this step's gradient in, but the step is trained again next
      // generation; at a state point the state must be all there is (dgc.h).
      if (dgc_ != nullptr && (!synced.ok() || state_point)) dgc_->DropAllResiduals();
      if (!synced.ok()) return synced;
    }

    // Up to here the step has only read state_; from here on it changes it.
    if (before_state_change_) before_state_change_();
    if (ApplyGradients(comm_stats.overflow, batches_per_step, synchronizer.MomentumFreeRanges()) &&
        local) {
      local_sgd->MarkLocalStep();
    }
    state_.cursor = sampler_.Advance(state_.cursor, batch);
    ++state_.step;
    state_.samples += batch.size();
    if (!state_.sample_counts.empty()) {
      // Every rank knows the whole global batch, so every rank keeps the same counts.
      CountGlobalBatch(order, batch.begin, batch.end, state_.sample_counts);
      if (state_.cursor.epoch != batch.epoch) {
        if (rank == 0 && !accounting_path_.empty()) {
          AppendEpochAccounting(accounting_path_, batch.epoch, state_.step, /*partial=*/false,
                                order, order.size(), state_.sample_counts);
        }
        std::fill(state_.sample_counts.begin(), state_.sample_counts.end(), 0);
      }
    }

    // Local SGD: average after the period's steps, and everything at a state point. The state
    // between averages is this rank's alone: no step callback sees it.
    bool consistent = true;
    if (local) {
      consistent = false;
      if (state_point || local_sgd->AverageDue(state_.step)) {
        const double started = MonotonicSeconds();
        LOCKSTEP_ASSIGN_OR_RETURN(
            LocalSgd::Outcome outcome,
            local_sgd->Synchronize(communicator, state_, state_point, leave_vote, timeout_ms));
        comm_stats.exposed_seconds = MonotonicSeconds() - started;
        comm_stats.allreduce_seconds = comm_stats.exposed_seconds;
        comm_stats.wire_bytes = outcome.wire_bytes;
        comm_stats.leave_agreed = outcome.leave_agreed;
        consistent = state_point || outcome.leave_agreed;
      }
    }

    const double step_seconds = MonotonicSeconds() - step_started;
    ++totals_.steps;
    totals_.samples += batch.size();
    totals_.step_seconds += step_seconds;
    totals_.exposed_seconds += comm_stats.exposed_seconds;
    totals_.wire_bytes += comm_stats.wire_bytes;
    interval.samples += batch.size();
    interval.step_seconds += step_seconds;
    interval.exposed_seconds += comm_stats.exposed_seconds;
    if (report_pace_) report_pace_(totals_.steps, totals_.step_seconds - totals_.exposed_seconds);
    if (metrics_ != nullptr) {
      metrics_->ObserveStep({step_seconds, comm_stats.exposed_seconds, batch.size(),
                             comm_stats.wire_bytes, comm_stats.allreduce_seconds});
      for (size_t i = 0; i < comm_stats.bucket_seconds.size(); ++i) {
        metrics_->ObserveAllreduce(comm_stats.bucket_seconds[i], comm_stats.bucket_wire_bytes[i],
                                   world);
      }
    }

    if (state_.step % log_interval == 0 || Finished()) {
      LOCKSTEP_RETURN_IF_ERROR(ReportProgress(communicator, generation, interval, on_progress));
    }
    if (on_step && consistent) LOCKSTEP_RETURN_IF_ERROR(on_step(state_));
    if (comm_stats.leave_agreed && !Finished()) {
      if (left_generation != nullptr) *left_generation = true;
      return AbortedError("leaving generation " + std::to_string(generation.generation) +
                          " together after step " + std::to_string(state_.step));
    }
  }
  if (rank == 0 && !accounting_path_.empty() && state_.cursor.offset > 0) {
    // Training ends mid-epoch: account for the part of the epoch that was trained.
    const std::vector<int64_t>& order = sampler_.Permutation(state_.cursor.epoch);
    AppendEpochAccounting(accounting_path_, state_.cursor.epoch, state_.step, /*partial=*/true,
                          order, static_cast<size_t>(state_.cursor.offset), state_.sample_counts);
  }
  return OkStatus();
}

bool Trainer::ApplyGradients(bool overflow, int64_t batches_per_step,
                             const std::vector<ParamRange>& momentum_free) {
  if (overflow) {
    // Every rank holds the same reduced gradients, so every rank skips this same step.
    state_.loss_scale = std::max(kMinLossScale, state_.loss_scale * 0.5f);
    state_.loss_scale_good_steps = 0;
    LOCKSTEP_LOG(WARNING) << "fp16 gradient overflow at step " << state_.step
                          << ": step skipped, loss scale now " << state_.loss_scale;
    if (metrics_ != nullptr) metrics_->IncrementSkippedSteps();
    return false;
  }
  const float lr = static_cast<float>(LearningRate(spec_.optimizer, state_.step, batches_per_step));
  state_.optimizer.Step(device_->compute(), lr, state_.params.device_data(), grads_.device_data(),
                        momentum_free);
  if (spec_.allreduce.compression == spec::Compression::kFp16 &&
      ++state_.loss_scale_good_steps >= kLossScaleGrowthInterval) {
    state_.loss_scale = std::min(kMaxLossScale, state_.loss_scale * 2.0f);
    state_.loss_scale_good_steps = 0;
  }
  return true;
}

Status Trainer::ReportProgress(comm::Communicator& communicator, const GenerationInfo& generation,
                               Interval& interval, const ProgressFn& on_progress) {
  // Every rank reports at the same steps (the state is identical everywhere), so the small
  // all-reduce of the interval's loss sum is issued in the same order by all. The read waits for
  // the device: the one host synchronisation of the interval.
  double reduced_loss = 0;
  const double zero = 0;
  LOCKSTEP_RETURN_IF_ERROR(loss_sum_.CopyToHost(&reduced_loss, 1));
  LOCKSTEP_RETURN_IF_ERROR(loss_sum_.CopyFromHost(&zero, 1));
  LOCKSTEP_RETURN_IF_ERROR(communicator
                               .AllReduce(&reduced_loss, 1, comm::DataType::kFloat64,
                                          comm::ReduceOp::kSum, collective_timeout_ms())
                               .WithContext("all-reduce of the training loss"));
  const double now = MonotonicSeconds();
  TrainingProgress progress;
  progress.step = state_.step;
  progress.total_steps = TotalSteps(generation.world_size);
  progress.samples = state_.samples;
  progress.loss = interval.samples > 0 ? reduced_loss / interval.samples : 0;
  progress.samples_per_second =
      now > interval.started ? interval.samples / (now - interval.started) : 0;
  progress.scaling_efficiency =
      interval.step_seconds > 0 ? 1.0 - interval.exposed_seconds / interval.step_seconds : 0;
  progress.comm_exposed_fraction =
      interval.step_seconds > 0 ? interval.exposed_seconds / interval.step_seconds : 0;
  last_progress_ = progress;
  if (metrics_ != nullptr) {
    metrics_->SetLoss(progress.loss);
    metrics_->SetSamplesPerSecond(progress.samples_per_second);
    metrics_->SetScalingEfficiency(progress.scaling_efficiency);
  }
  if (generation.rank == 0) {
    LOCKSTEP_LOG(INFO) << "step " << progress.step << "/" << progress.total_steps << " loss "
                       << std::fixed << std::setprecision(4) << progress.loss << " samples/s "
                       << std::setprecision(0) << progress.samples_per_second << " efficiency "
                       << std::setprecision(3) << progress.scaling_efficiency;
  }
  if (on_progress) on_progress(progress);
  interval = Interval{};
  interval.started = MonotonicSeconds();
  return OkStatus();
}

StatusOr<EvalResult> Trainer::Evaluate(comm::Communicator& communicator,
                                       const GenerationInfo& generation) {
  if (pipelined()) return EvaluatePipeline(communicator, generation);
  if (!data_.test.has_value()) {
    return FailedPreconditionError("evaluation: the manifest has no test split");
  }
  const Dataset& test = *data_.test;
  const kernels::ExecutionContext& ctx = device_->compute();
  // Contiguous block of the test split for this rank; the blocks tile the split.
  const int64_t lo = test.num_samples * generation.rank / generation.world_size;
  const int64_t hi = test.num_samples * (generation.rank + 1) / generation.world_size;
  const int64_t chunk_rows = std::min<int64_t>(kEvalChunkRows, std::max<int64_t>(1, hi - lo));
  LOCKSTEP_ASSIGN_OR_RETURN(MlpWorkspace workspace,
                            MlpWorkspace::Create(model_, chunk_rows, *device_));
  kernels::DeviceArray<float> features, dlogits;
  kernels::DeviceArray<int32_t> labels;
  LOCKSTEP_RETURN_IF_ERROR(features.Allocate(*device_, chunk_rows * test.num_features));
  LOCKSTEP_RETURN_IF_ERROR(labels.Allocate(*device_, chunk_rows));
  LOCKSTEP_RETURN_IF_ERROR(dlogits.Allocate(*device_, chunk_rows * model_.num_classes()));
  double totals[3] = {0, 0, static_cast<double>(hi - lo)};  // loss sum, correct, samples
  for (int64_t begin = lo; begin < hi; begin += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, hi - begin);
    LOCKSTEP_RETURN_IF_ERROR(features.CopyFromHost(
        test.features.data() + begin * test.num_features, rows * test.num_features));
    LOCKSTEP_RETURN_IF_ERROR(labels.CopyFromHost(test.labels.data() + begin, rows));
    const float* logits =
        model_.Forward(ctx, state_.params.device_data(), features.device_data(), rows, workspace);
    double loss_sum = 0;
    int64_t correct = 0;
    kernels::SoftmaxCrossEntropy(ctx, rows, model_.num_classes(), logits, labels.device_data(),
                                 0.0f, dlogits.device_data(), &loss_sum, &correct);
    totals[0] += loss_sum;
    totals[1] += static_cast<double>(correct);
  }
  return ReduceEvaluation(communicator, totals);
}

StatusOr<EvalResult> Trainer::ReduceEvaluation(comm::Communicator& communicator,
                                               double totals[3]) const {
  LOCKSTEP_RETURN_IF_ERROR(communicator
                               .AllReduce(totals, 3, comm::DataType::kFloat64, comm::ReduceOp::kSum,
                                          collective_timeout_ms())
                               .WithContext("evaluation: all-reduce of the counts"));
  EvalResult result;
  result.samples = static_cast<int64_t>(totals[2]);
  result.correct = static_cast<int64_t>(totals[1]);
  result.loss = result.samples > 0 ? totals[0] / result.samples : 0;
  return result;
}

Status Trainer::DumpParameters(const std::string& path, comm::Communicator& communicator,
                               const GenerationInfo& generation) const {
  if (pipelined()) return DumpPipelineParameters(path, communicator, generation);
  if (generation.rank != 0) return OkStatus();
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<float> params, state_.params.ToHost());
  // Raw float32 in host order; every supported host is little-endian (x86-64, aarch64).
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return UnavailableError("cannot write parameters to " + path + ": " + std::strerror(errno));
  }
  const size_t written = std::fwrite(params.data(), sizeof(float), params.size(), file);
  const bool closed = std::fclose(file) == 0;
  if (written != params.size() || !closed) {
    return UnavailableError("cannot write parameters to " + path + ": short write");
  }
  return OkStatus();
}

}  // namespace lockstep::trainer
