// The Trainer with pipeline parallelism (spec.trainer.pipeline.stages > 1; see trainer.h and
// docs/pipeline.md): the plan, the state agreement of a world whose ranks hold different
// stages, the training step and evaluation through the stages, and the parameter dump.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iomanip>
#include <limits>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/logging.h"
#include "worker/trainer/batch_stager.h"
#include "worker/trainer/buckets.h"
#include "worker/trainer/gradient_synchronizer.h"
#include "worker/trainer/sample_accounting.h"
#include "worker/trainer/trainer.h"

namespace lockstep::trainer {

namespace {

// What one rank held when a generation formed: the stage its state is of (-1: none), the step
// it reflects, whether it also holds that step's reduced gradients (its commit failed), and
// whether the last step it committed overflowed (fp16: skipped).
struct HeldState {
  int64_t stage = -1;
  int64_t step = -1;
  int64_t pending = 0;
  int64_t overflow = 0;
};

}  // namespace

StatusOr<TrainingState> Trainer::SeedStageState(int stage) const {
  const LayerRange layers = plan_.stages[static_cast<size_t>(stage)];
  const int64_t count = RangeCount(model_.layout(), layers);
  LOCKSTEP_ASSIGN_OR_RETURN(TrainingState state,
                            MakeTrainingState(count, spec_.optimizer, *device_));
  // The values the whole model's initialisation gives these layers: a pipeline starts where one
  // rank would.
  std::vector<float> initial(static_cast<size_t>(count));
  model_.InitializeParameters(spec_.seed, initial.data(), layers);
  LOCKSTEP_RETURN_IF_ERROR(state.params.CopyFromHost(initial.data(), count));
  if (!accounting_path_.empty()) {
    state.sample_counts.assign(static_cast<size_t>(data_.train.num_samples), 0);
  }
  return state;
}

// Every stage's state must come from a rank that holds that stage at the newest step T. Ranks
// keep their places in the rendezvous while nobody leaves, so each stage group usually holds
// its own stage: it is broadcast within the group. After a loss the rendezvous renumbers the
// survivors and a rank may now be another stage than the one it holds: then each stage's state
// is broadcast over the whole world from one of its holders, and the ranks of that stage keep
// it. When a stage has no holder at T (every replica of it was lost, or nobody holds state yet),
// every stage comes from the newest checkpoint, or the seed (RestorePipelineState).
Status Trainer::AgreeOnPipelineState(comm::Communicator& communicator,
                                     const GenerationInfo& generation) {
  if (pipe_ == nullptr || stage_group_ == nullptr) {
    return FailedPreconditionError("pipeline: no pipeline communicators for this generation");
  }
  const double started = MonotonicSeconds();
  const int64_t timeout_ms = collective_timeout_ms();
  const int stages = static_cast<int>(plan_.stages.size());
  const int world = generation.world_size;
  if (world % stages != 0) {
    // The rendezvous forms whole worlds for a pipeline job; another generation may.
    return UnavailableError("pipeline: a world of " + std::to_string(world) +
                            " ranks is not a multiple of the pipeline's " + std::to_string(stages) +
                            " stages");
  }
  const PipelinePlace place = PlaceInPipeline(generation.rank, stages);
  const bool pending = has_state_ && pending_step_ == state_.step;
  const HeldState mine{has_state_ ? stage_ : -1, has_state_ ? state_.step : -1, pending ? 1 : 0,
                       last_overflow_ ? 1 : 0};
  std::vector<HeldState> held(static_cast<size_t>(world));
  LOCKSTEP_RETURN_IF_ERROR(
      communicator.AllGather(&mine, sizeof(mine), held.data(), timeout_ms)
          .WithContext("pipeline state agreement: all-gather of the stages held"));
  int64_t newest = -1;
  for (const HeldState& h : held) newest = std::max(newest, h.stage >= 0 ? h.step : -1);
  // A generation that ended in a step's commit may leave some ranks past it and others before
  // it. Those before it hold its reduced gradients (no rank completes the commit before every
  // rank has them): they step now, as the others did, with the others' overflow verdict.
  int64_t overflow = 0;
  for (const HeldState& h : held) {
    if (h.stage >= 0 && h.step == newest) overflow = std::max(overflow, h.overflow);
  }
  for (HeldState& h : held) {
    if (h.stage >= 0 && h.pending != 0 && h.step + 1 == newest) h.step = newest;
  }
  if (pending && state_.step + 1 == newest) {
    // The epoch's accounting, if the step ended one, was written by the old rank 0 unless it
    // was one of those that missed the commit.
    const bool account = generation.rank == 0 && !accounting_path_.empty() &&
                         !EpochAccounted(accounting_path_, state_.cursor.epoch);
    // The step's own global batch: the world that trained it may not be this one.
    CommitPipelineStep(pending_global_batch_, overflow != 0, account);
    LOCKSTEP_LOG(INFO) << "pipeline: completed step " << newest - 1
                       << " with the gradients held: other ranks had committed it";
  }
  // Held gradients serve this agreement only; a rank whose state is replaced below holds none
  // until the agreement succeeds (a failure midway must not leave it claiming a step).
  pending_step_ = -1;
  // Per stage: the lowest rank holding it at the newest step, and whether one in its group does.
  std::vector<int> source(static_cast<size_t>(stages), -1), group_source(source);
  for (int r = 0; r < world; ++r) {
    const HeldState& h = held[static_cast<size_t>(r)];
    if (h.stage < 0 || h.step != newest) continue;
    const auto s = static_cast<size_t>(h.stage);
    if (source[s] < 0) source[s] = r;
    const PipelinePlace there = PlaceInPipeline(r, stages);
    if (there.stage == h.stage && group_source[s] < 0) group_source[s] = there.replica;
  }
  const bool every_stage_held =
      newest >= 0 && std::find(source.begin(), source.end(), -1) == source.end();
  const bool in_groups = every_stage_held && std::find(group_source.begin(), group_source.end(),
                                                       -1) == group_source.end();

  if (!every_stage_held) {
    has_state_ = false;
    LOCKSTEP_RETURN_IF_ERROR(RestorePipelineState(communicator, generation, newest));
  } else if (in_groups) {
    // This rank's stage comes from a replica of it; the state travels within the group.
    if (stage_ != place.stage || state_.step != newest) {
      has_state_ = false;
      LOCKSTEP_ASSIGN_OR_RETURN(state_, SeedStageState(place.stage));
    }
    LOCKSTEP_RETURN_IF_ERROR(BroadcastTrainingState(
        *stage_group_, group_source[static_cast<size_t>(place.stage)], state_, timeout_ms));
  } else {
    // Each stage from its holder to every rank; this rank keeps its own stage's. A holder sends
    // from the state it holds, which it replaces only at the end.
    std::optional<TrainingState> mine_now;
    for (int s = 0; s < stages; ++s) {
      const int from = source[static_cast<size_t>(s)];
      if (from == generation.rank) {
        // Its own stage (s == place.stage) it simply keeps.
        LOCKSTEP_RETURN_IF_ERROR(BroadcastTrainingState(communicator, from, state_, timeout_ms));
        continue;
      }
      LOCKSTEP_ASSIGN_OR_RETURN(TrainingState incoming, SeedStageState(s));
      LOCKSTEP_RETURN_IF_ERROR(BroadcastTrainingState(communicator, from, incoming, timeout_ms));
      if (s == place.stage) mine_now.emplace(std::move(incoming));
    }
    if (mine_now.has_value()) state_ = std::move(*mine_now);
  }
  stage_ = place.stage;
  LOCKSTEP_RETURN_IF_ERROR(AgreeOnReplicas(communicator, timeout_ms));
  const LayerRange layers = plan_.stages[static_cast<size_t>(stage_)];
  const int64_t count = RangeCount(model_.layout(), layers);
  if (grads_.size() != count) {
    grads_ = kernels::DeviceArray<float>();
    LOCKSTEP_RETURN_IF_ERROR(grads_.Allocate(*device_, count));
  }
  // A replica trains its share of the global batch: more than batchSize while replicas are
  // missing from an elastic pipeline (the global batch stays fixed).
  const int64_t rows = ReplicaRows(world);
  if (runner_ == nullptr || runner_->stage() != stage_ || runner_->max_rows() != rows) {
    LOCKSTEP_ASSIGN_OR_RETURN(runner_,
                              PipelineStage::Create(model_, plan_, stage_, rows, *device_));
  }
  has_state_ = true;
  if (metrics_ != nullptr) metrics_->SetPipelineStage(stage_);
  LOCKSTEP_LOG(INFO) << "agreed on pipeline state at step " << state_.step << ": stage " << stage_
                     << " of " << stages << " (layers " << layers.first << ".." << layers.last - 1
                     << ", " << count << " parameters), replica " << place.replica << " of "
                     << world / stages << ", "
                     << (!every_stage_held
                             ? (resumed_from_step_ >= 0
                                    ? "from checkpoint step " + std::to_string(resumed_from_step_)
                                    : std::string("from the seed"))
                         : in_groups ? "within the stage groups"
                                     : "across the world")
                     << " in " << static_cast<int64_t>((MonotonicSeconds() - started) * 1000)
                     << " ms";
  return OkStatus();
}

int64_t Trainer::ReplicaRows(int world_size) const {
  const int64_t replicas = std::max<int64_t>(1, world_size / static_cast<int>(plan_.stages.size()));
  return (GlobalBatchSize(world_size) + replicas - 1) / replicas;
}

Status Trainer::RestorePipelineState(comm::Communicator& communicator,
                                     const GenerationInfo& generation, int64_t held_step) {
  const int64_t timeout_ms = collective_timeout_ms();
  // The collectives that wait for a rank reading storage.
  const int64_t read_timeout_ms = timeout_ms + stage_checkpoints_.timeout_ms;
  const PipelinePlace place =
      PlaceInPipeline(generation.rank, static_cast<int>(plan_.stages.size()));
  LOCKSTEP_ASSIGN_OR_RETURN(state_, SeedStageState(place.stage));
  resumed_from_step_ = -1;
  // Rank 0 picks the checkpoint, so that every stage reads the same step even while a writer
  // adds one; replica 0's rank of each stage reads its layers of it and the stage group passes
  // them on. A checkpoint that some stage finds damaged is given up by all, for the next older.
  int64_t below = std::numeric_limits<int64_t>::max();
  for (;;) {
    int64_t step = -1;  // -1: none; -2: rank 0 could not read the checkpoints
    if (generation.rank == 0 && stage_checkpoints_.newest) {
      StatusOr<int64_t> found = stage_checkpoints_.newest(below, state_);
      if (!found.ok()) {
        LOCKSTEP_LOG(ERROR) << "pipeline: the checkpoints cannot be read: " << found.status();
      }
      step = found.ok() ? *found : -2;
    }
    LOCKSTEP_RETURN_IF_ERROR(communicator.Broadcast(&step, sizeof(step), 0, read_timeout_ms)
                                 .WithContext("pipeline state agreement: the checkpoint's step"));
    if (step == -2) {
      return UnavailableError("pipeline state agreement: rank 0 could not read the checkpoints");
    }
    if (step < 0) {
      if (generation.rank == 0) {
        if (held_step >= 0) {
          LOCKSTEP_LOG(WARNING) << "pipeline: no rank holds the state of every stage at step "
                                << held_step << " (every replica of a stage was lost) and no "
                                << "checkpoint serves: every stage starts again from the seed";
        } else {
          LOCKSTEP_LOG(INFO) << "no member holds state and there is no checkpoint: starting from "
                                "the seed at step 0";
        }
      }
      return OkStatus();
    }
    // 0: read; 1: it does not fit some stage; 2: some stage found it damaged; 3: a stage's
    // storage failed.
    double verdict = 0;
    if (place.replica == 0) {
      Status read = stage_checkpoints_.restore(step, place.stage, state_);
      if (!read.ok()) {
        LOCKSTEP_LOG(WARNING) << "pipeline: stage " << place.stage << " cannot restore checkpoint "
                              << "step " << step << ": " << read;
        const StatusCode code = read.code();
        verdict = code == StatusCode::kDataLoss                                              ? 2
                  : code == StatusCode::kFailedPrecondition || code == StatusCode::kNotFound ? 1
                                                                                             : 3;
      }
    }
    LOCKSTEP_RETURN_IF_ERROR(
        communicator
            .AllReduce(&verdict, 1, comm::DataType::kFloat64, comm::ReduceOp::kMax, read_timeout_ms)
            .WithContext("pipeline state agreement: the stages' restore"));
    if (verdict == 0) break;
    if (verdict > 2) {
      return UnavailableError("pipeline state agreement: a stage could not read checkpoint step " +
                              std::to_string(step));
    }
    if (verdict == 2 && generation.rank == 0 && stage_checkpoints_.discard) {
      // Its sizes check out, so a later write of the step would keep it as committed, and
      // retention would count it: it goes now, from storage, where every writer sees it gone.
      Status discarded = stage_checkpoints_.discard(step);
      if (!discarded.ok()) {
        LOCKSTEP_LOG(WARNING) << "pipeline: cannot delete the damaged checkpoint of step " << step
                              << ": " << discarded;
      }
    }
    below = step;
    if (place.replica == 0) {
      LOCKSTEP_ASSIGN_OR_RETURN(state_, SeedStageState(place.stage));
    }
  }
  // The trainer's own counters are in stage 0's part only: rank 0 read them.
  struct {
    int64_t samples;
    float loss_scale;
    int64_t loss_scale_good_steps;
    int64_t sample_counts;
  } counters{state_.samples, state_.loss_scale, state_.loss_scale_good_steps,
             static_cast<int64_t>(state_.sample_counts.size())};
  LOCKSTEP_RETURN_IF_ERROR(communicator.Broadcast(&counters, sizeof(counters), 0, timeout_ms)
                               .WithContext("pipeline state agreement: the trainer's counters"));
  state_.samples = counters.samples;
  state_.loss_scale = counters.loss_scale;
  state_.loss_scale_good_steps = counters.loss_scale_good_steps;
  state_.sample_counts.resize(static_cast<size_t>(counters.sample_counts));
  if (counters.sample_counts > 0) {
    LOCKSTEP_RETURN_IF_ERROR(communicator
                                 .Broadcast(state_.sample_counts.data(),
                                            state_.sample_counts.size() * sizeof(int32_t), 0,
                                            timeout_ms)
                                 .WithContext("pipeline state agreement: the sample counts"));
  }
  // Replica 0 read the stage; its other replicas take it from there.
  LOCKSTEP_RETURN_IF_ERROR(BroadcastTrainingState(*stage_group_, 0, state_, timeout_ms));
  resumed_from_step_ = state_.step;
  return OkStatus();
}

Status Trainer::TrainPipeline(comm::Communicator& communicator, const GenerationInfo& generation,
                              const std::atomic<bool>& stop, const ProgressFn& on_progress,
                              const StepFn& on_step, const std::atomic<bool>* leave_requested,
                              bool* left_generation) {
  if (runner_ == nullptr || pipe_ == nullptr || stage_group_ == nullptr) {
    return FailedPreconditionError("pipeline: training before the state agreement");
  }
  const int world = generation.world_size;
  const int stages = static_cast<int>(plan_.stages.size());
  const PipelinePlace place = PlaceInPipeline(generation.rank, stages);
  const int replicas = world / stages;
  const int64_t timeout_ms = collective_timeout_ms();
  const int64_t global_batch_size = GlobalBatchSize(world);
  const int64_t log_interval = std::max<int64_t>(1, spec_.log_interval_steps);
  const LayerRange layers = runner_->layers();
  // Only the first stage reads features and only the last labels.
  std::optional<BatchStager> stager;
  if (runner_->first() || runner_->last()) {
    LOCKSTEP_ASSIGN_OR_RETURN(
        BatchStager created,
        BatchStager::Create(*device_, runner_->max_rows(), data_.train.num_features));
    stager.emplace(std::move(created));
  }
  SynchronizerOptions sync_options;
  sync_options.compression = spec_.allreduce.compression;
  sync_options.timeout_ms = timeout_ms;
  GradientSynchronizer synchronizer(
      *stage_group_, *device_,
      AssignBuckets(model_.layout(), BucketCapBytes(spec_.allreduce.bucket_mib), layers),
      sync_options);
  const double zero = 0;
  LOCKSTEP_RETURN_IF_ERROR(loss_sum_.CopyFromHost(&zero, 1));
  LOCKSTEP_LOG(INFO) << "training from step " << state_.step << " as stage " << place.stage
                     << " of " << stages << " (layers " << layers.first << ".." << layers.last - 1
                     << "), replica " << place.replica << " of " << replicas << ": global batch "
                     << global_batch_size << ", " << plan_.micro_batches
                     << " micro-batch(es) of the replica's " << runner_->max_rows() << ", schedule "
                     << PipelineScheduleName(plan_.schedule)
                     << (plan_.recompute ? " with recompute" : "") << ", "
                     << runner_->activation_slots() << " activation slot(s)";

  Interval interval;
  interval.started = MonotonicSeconds();
  double stage_compute_seconds = 0, stage_wait_seconds = 0;
  int64_t stage_bytes_sent = 0;
  while (!Finished()) {
    if (stop.load()) return CancelledError("training stopped");
    const double step_started = MonotonicSeconds();
    const GlobalSampler::GlobalBatch batch = sampler_.Next(state_.cursor, global_batch_size);
    const auto [lo, hi] = GlobalSampler::RankSlice(batch, replicas, place.replica);
    const std::vector<int64_t>& order = sampler_.Permutation(batch.epoch);
    const int64_t rows = hi - lo;
    BatchStager::DeviceBatch device_batch{};
    if (stager.has_value()) device_batch = stager->Stage(data_.train, order.data() + lo, rows);

    // The stage's replicas sum their gradients, bucket by bucket as the step's last backward
    // finishes the bucket's layers (as in data parallelism).
    synchronizer.BeginStep(grads_.device_data(), state_.loss_scale, false, state_.step,
                           state_.params.device_data());
    StageStepTimes times;
    LOCKSTEP_RETURN_IF_ERROR(runner_->RunStep(
        *pipe_, state_.params.device_data(), device_batch.features, device_batch.labels, rows,
        1.0f / static_cast<float>(batch.size()), grads_.device_data(), loss_sum_.device_data(),
        timeout_ms, &times, [&synchronizer](int layer) { synchronizer.OnLayerReady(layer); }));
    StepCommStats comm_stats;
    LOCKSTEP_RETURN_IF_ERROR(synchronizer.Wait(&comm_stats));
    // The commit: one small all-reduce over the whole world, which no rank can complete before
    // every rank has its stage's reduced gradients. It carries the vote to leave and the fp16
    // overflow flag (every stage skips an overflowing step together). If it fails, this rank
    // still holds the step's gradients: should another rank have completed it and stepped, the
    // next state agreement steps this one too (AgreeOnPipelineState), so that the stages never
    // stay a step apart.
    pending_step_ = state_.step;
    pending_global_batch_ = global_batch_size;
    double flags[2] = {leave_requested != nullptr && leave_requested->load() ? 1.0 : 0.0,
                       comm_stats.overflow ? 1.0 : 0.0};
    LOCKSTEP_RETURN_IF_ERROR(
        communicator.AllReduce(flags, 2, comm::DataType::kFloat64, comm::ReduceOp::kMax, timeout_ms)
            .WithContext("pipeline: the step's commit"));
    const bool leave_agreed = flags[0] > 0;
    CommitPipelineStep(global_batch_size, flags[1] > 0, generation.rank == 0);
    stage_compute_seconds += times.compute_seconds;
    stage_wait_seconds += times.wait_seconds;
    stage_bytes_sent += times.bytes_sent;
    // Exposed: the stage's waits on its neighbours (the bubble and the transfers) and on its
    // group's all-reduce.
    const double step_seconds = MonotonicSeconds() - step_started;
    const double exposed = times.wait_seconds + comm_stats.exposed_seconds;
    ++totals_.steps;
    totals_.samples += batch.size();
    totals_.step_seconds += step_seconds;
    totals_.exposed_seconds += exposed;
    totals_.wire_bytes += comm_stats.wire_bytes + times.bytes_sent;
    interval.samples += batch.size();
    interval.step_seconds += step_seconds;
    interval.exposed_seconds += exposed;
    if (report_pace_) report_pace_(totals_.steps, totals_.step_seconds - totals_.exposed_seconds);
    if (metrics_ != nullptr) {
      metrics_->ObserveStep({step_seconds, exposed, batch.size(),
                             comm_stats.wire_bytes + times.bytes_sent,
                             comm_stats.allreduce_seconds});
      metrics_->ObservePipelineStep(times.compute_seconds, times.wait_seconds, times.bytes_sent);
      // The stage group's all-reduces, among the stage's replicas.
      for (size_t i = 0; i < comm_stats.bucket_seconds.size(); ++i) {
        metrics_->ObserveAllreduce(comm_stats.bucket_seconds[i], comm_stats.bucket_wire_bytes[i],
                                   replicas);
      }
    }
    if (state_.step % log_interval == 0 || Finished()) {
      LOCKSTEP_RETURN_IF_ERROR(ReportProgress(communicator, generation, interval, on_progress));
    }
    if (on_step) LOCKSTEP_RETURN_IF_ERROR(on_step(state_));
    if (leave_agreed && !Finished()) {
      if (left_generation != nullptr) *left_generation = true;
      return AbortedError("leaving generation " + std::to_string(generation.generation) +
                          " together after step " + std::to_string(state_.step));
    }
  }
  // Where this stage's time went (bench/pipeline reads it): the bubble is the share of the
  // stage's pipeline time spent waiting on its neighbours.
  const double pipeline_seconds = stage_compute_seconds + stage_wait_seconds;
  LOCKSTEP_LOG(INFO) << "pipeline stage " << place.stage << " of " << stages << ": "
                     << std::fixed << std::setprecision(3) << stage_compute_seconds
                     << " s computing, " << stage_wait_seconds << " s waiting on neighbours (bubble "
                     << (pipeline_seconds > 0 ? stage_wait_seconds / pipeline_seconds : 0)
                     << "), " << stage_bytes_sent << " activation bytes sent, "
                     << runner_->activation_slots() << " activation slot(s) of "
                     << runner_->workspace_bytes() << " bytes";
  return OkStatus();
}

void Trainer::CommitPipelineStep(int64_t global_batch_size, bool overflow, bool account) {
  const GlobalSampler::GlobalBatch batch = sampler_.Next(state_.cursor, global_batch_size);
  if (before_state_change_) before_state_change_();
  ApplyGradients(overflow, std::max<int64_t>(1, global_batch_size / spec_.batch_size), {});
  last_overflow_ = overflow;
  pending_step_ = -1;
  state_.cursor = sampler_.Advance(state_.cursor, batch);
  ++state_.step;
  state_.samples += batch.size();
  if (!state_.sample_counts.empty()) {
    const std::vector<int64_t>& order = sampler_.Permutation(batch.epoch);
    CountGlobalBatch(order, batch.begin, batch.end, state_.sample_counts);
    if (state_.cursor.epoch != batch.epoch) {
      if (account && !accounting_path_.empty()) {
        AppendEpochAccounting(accounting_path_, batch.epoch, state_.step, /*partial=*/false, order,
                              order.size(), state_.sample_counts);
      }
      std::fill(state_.sample_counts.begin(), state_.sample_counts.end(), 0);
    }
  }
}

// The test split is sharded over the replicas; each chunk runs forward through the replica's
// stages and the last stage counts the loss and the correct answers.
StatusOr<EvalResult> Trainer::EvaluatePipeline(comm::Communicator& communicator,
                                               const GenerationInfo& generation) {
  if (!data_.test.has_value()) {
    return FailedPreconditionError("evaluation: the manifest has no test split");
  }
  if (runner_ == nullptr || pipe_ == nullptr) {
    return FailedPreconditionError("pipeline: evaluation before the state agreement");
  }
  const Dataset& test = *data_.test;
  const kernels::ExecutionContext& ctx = device_->compute();
  const int stages = static_cast<int>(plan_.stages.size());
  const PipelinePlace place = PlaceInPipeline(generation.rank, stages);
  const int replicas = generation.world_size / stages;
  const int64_t timeout_ms = collective_timeout_ms();
  const LayerRange layers = runner_->layers();
  const ParameterLayout& layout = model_.layout();
  const int64_t in = layout.layers[static_cast<size_t>(layers.first)].in;
  const int64_t out = layout.layers[static_cast<size_t>(layers.last) - 1].out;
  const int64_t lo = test.num_samples * place.replica / replicas;
  const int64_t hi = test.num_samples * (place.replica + 1) / replicas;
  const int64_t chunk_rows = std::min<int64_t>(1024, std::max<int64_t>(1, hi - lo));
  LOCKSTEP_ASSIGN_OR_RETURN(MlpWorkspace workspace,
                            MlpWorkspace::Create(model_, chunk_rows, *device_, layers));
  kernels::DeviceArray<float> input, dlogits;
  kernels::DeviceArray<int32_t> labels;
  LOCKSTEP_RETURN_IF_ERROR(input.Allocate(*device_, chunk_rows * in));
  if (runner_->last()) {
    LOCKSTEP_RETURN_IF_ERROR(labels.Allocate(*device_, chunk_rows));
    LOCKSTEP_RETURN_IF_ERROR(dlogits.Allocate(*device_, chunk_rows * out));
  }
  double totals[3] = {0, 0, 0};  // loss sum, correct, samples: counted by the last stages
  for (int64_t begin = lo; begin < hi; begin += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, hi - begin);
    const size_t in_bytes = static_cast<size_t>(rows * in) * sizeof(float);
    if (runner_->first()) {
      LOCKSTEP_RETURN_IF_ERROR(input.CopyFromHost(test.features.data() + begin * test.num_features,
                                                  rows * test.num_features));
    } else {
      LOCKSTEP_RETURN_IF_ERROR(
          pipe_->Recv(input.device_data(), in_bytes, place.stage - 1, timeout_ms)
              .WithContext("evaluation: activations from stage " +
                           std::to_string(place.stage - 1)));
    }
    const float* output =
        model_.Forward(ctx, state_.params.device_data(), input.device_data(), rows, workspace);
    if (!runner_->last()) {
      LOCKSTEP_RETURN_IF_ERROR(
          pipe_
              ->Send(output, static_cast<size_t>(rows * out) * sizeof(float), place.stage + 1,
                     timeout_ms)
              .WithContext("evaluation: activations to stage " + std::to_string(place.stage + 1)));
      continue;
    }
    LOCKSTEP_RETURN_IF_ERROR(labels.CopyFromHost(test.labels.data() + begin, rows));
    double loss_sum = 0;
    int64_t correct = 0;
    kernels::SoftmaxCrossEntropy(ctx, rows, out, output, labels.device_data(), 0.0f,
                                 dlogits.device_data(), &loss_sum, &correct);
    totals[0] += loss_sum;
    totals[1] += static_cast<double>(correct);
    totals[2] += static_cast<double>(rows);
  }
  return ReduceEvaluation(communicator, totals);
}

// Rank 0 sizes the file to the whole model; then each stage of replica 0 writes its slice at
// its place in the flat buffer.
Status Trainer::DumpPipelineParameters(const std::string& path, comm::Communicator& communicator,
                                       const GenerationInfo& generation) const {
  const int64_t timeout_ms = collective_timeout_ms();
  const PipelinePlace place =
      PlaceInPipeline(generation.rank, static_cast<int>(plan_.stages.size()));
  auto failed = [&path](const std::string& what) {
    return UnavailableError("cannot write parameters to " + path + ": " + what);
  };
  // Rank 0 sizes the file; every rank learns whether it could before anyone writes.
  double failed_to_size = 0;
  std::string why;
  if (generation.rank == 0) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const off_t bytes = model_.layout().num_params * static_cast<off_t>(sizeof(float));
    if (fd < 0 || ::ftruncate(fd, bytes) != 0) {
      failed_to_size = 1;
      why = std::strerror(errno);
    }
    if (fd >= 0) ::close(fd);
  }
  LOCKSTEP_RETURN_IF_ERROR(
      communicator
          .AllReduce(&failed_to_size, 1, comm::DataType::kFloat64, comm::ReduceOp::kMax,
                     timeout_ms)
          .WithContext("parameter dump"));
  if (failed_to_size > 0) return failed(why.empty() ? "rank 0 could not create it" : why);
  Status written = OkStatus();
  if (place.replica == 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(std::vector<float> params, state_.params.ToHost());
    const int64_t offset = RangeOffset(model_.layout(), runner_->layers());
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    const auto bytes = static_cast<ssize_t>(params.size() * sizeof(float));
    if (fd < 0 || ::pwrite(fd, params.data(), static_cast<size_t>(bytes),
                           offset * static_cast<off_t>(sizeof(float))) != bytes) {
      written = failed(fd < 0 ? std::strerror(errno) : "short write");
    }
    if (fd >= 0 && ::close(fd) != 0 && written.ok()) written = failed(std::strerror(errno));
  }
  LOCKSTEP_RETURN_IF_ERROR(communicator.Barrier(timeout_ms).WithContext("parameter dump"));
  return written;
}

}  // namespace lockstep::trainer
