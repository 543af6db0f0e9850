#include "worker/trainer/training_worker.h"

#include <cstdio>
#include <optional>
#include <random>
#include <sstream>
#include <utility>

#include "common/deadline.h"
#include "common/logging.h"
#include "worker/comm/communicator_factory.h"
#include "worker/trainer/pipeline_communicators.h"

namespace lockstep::trainer {
namespace {

std::string LogContext(const std::string& job, int rank, int64_t generation) {
  std::ostringstream context;
  context << "job=" << job << " rank=" << rank << " gen=" << generation;
  return context.str();
}

}  // namespace

TrainingWorker::TrainingWorker(TrainingWorkerOptions options, std::unique_ptr<Trainer> trainer,
                               WorkerMetrics* metrics)
    : options_(std::move(options)), trainer_(std::move(trainer)), metrics_(metrics) {}

void TrainingWorker::RequestStop() {
  stop_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  AbortCommunicators("worker stopping");
}

void TrainingWorker::AbortCommunicators(const std::string& reason) {
  if (communicator_ != nullptr) communicator_->Abort(reason);
  for (comm::Communicator* communicator : pipeline_communicators_) communicator->Abort(reason);
}

void TrainingWorker::LeaveNow() {
  rendezvous::ProgressReport report = MakeReport(trainer_->last_progress());
  Status status = LeaveOnce(/*completed=*/false, report);
  if (!status.ok()) {
    LOCKSTEP_LOG(WARNING) << "leave: " << status;
  }
}

Status TrainingWorker::LeaveOnce(bool completed, const rendezvous::ProgressReport& report) {
  std::lock_guard<std::mutex> lock(leave_mu_);
  if (left_ || client_ == nullptr) return OkStatus();
  left_ = true;
  return client_->Leave(completed, report);
}

rendezvous::ProgressReport TrainingWorker::MakeReport(const TrainingProgress& progress) const {
  rendezvous::ProgressReport report;
  report.step = progress.step;
  report.total_steps = progress.total_steps;
  report.loss = progress.loss;
  report.samples_per_second = progress.samples_per_second;
  report.scaling_efficiency = progress.scaling_efficiency;
  report.samples = progress.samples;
  report.comm_exposed_fraction = progress.comm_exposed_fraction;
  report.resumed_from_step = trainer_->resumed_from_step();
  if (checkpointer_ != nullptr) {
    report.last_checkpoint_step = checkpointer_->last_checkpoint_step();
    report.last_checkpoint_uri = checkpointer_->last_checkpoint_uri();
  }
  return report;
}

Status TrainingWorker::Run() {
  SetLogContext("job=" + options_.job_name + " rank=- gen=-");
  {
    auto client = rendezvous::RendezvousClient::Connect(options_.client);
    if (!client.ok()) return client.status().WithContext("rendezvous");
    std::lock_guard<std::mutex> lock(leave_mu_);
    client_ = std::move(client).value();
  }
  if (!options_.checkpoint.checkpoint.uri.empty()) {
    auto checkpointer = TrainingCheckpointer::Create(options_.checkpoint, trainer_->spec(),
                                                     trainer_->model().layout(), metrics_);
    if (!checkpointer.ok()) {
      LeaveNow();
      return checkpointer.status().WithContext("spec.checkpoint.uri");
    }
    checkpointer_ = std::move(checkpointer).value();
    // An asynchronous snapshot is copied while the next step's forward and backward run; the
    // trainer waits for the copy before it changes the state.
    trainer_->SetBeforeStateChange([this] { checkpointer_->WaitForCapture(); });
    if (trainer_->pipelined()) {
      // Each stage writes its part of a checkpoint and reads its layers back.
      checkpointer_->SetPipelineStages(trainer_->pipeline_plan().stages);
      trainer_->SetStageCheckpoints(
          {[this](int64_t below, const TrainingState& state) {
             return checkpointer_->NewestFitting(below, state);
           },
           [this](int64_t step, int stage, TrainingState& state) {
             return checkpointer_->RestoreStage(step, stage, state);
           },
           [this](int64_t step) { return checkpointer_->DiscardStep(step); },
           checkpointer_->restore_timeout_ms()});
    }
  }

  // Every rank's pace rides on its heartbeats: the service names stragglers from it.
  trainer_->SetPaceReporter([this](int64_t steps, double compute_seconds) {
    client_->SetPace(steps, compute_seconds);
  });

  int failed_generations = 0;
  bool first_generation = true;
  while (true) {
    if (stop_.load()) {
      LeaveNow();
      return CancelledError("stopped before joining a generation");
    }
    joining_ = true;
    // A standby (the generation is full) waits here, started and loaded, for a place.
    auto assignment =
        rendezvous::JoinOrStandBy(*client_, trainer_->state_step(), options_.join_timeout_ms,
                                  [this] { return !stop_.load(); });
    joining_ = false;
    if (!assignment.ok() && rendezvous::JobCompletedWhileJoining(assignment.status())) {
      // A standby, or a replacement that came too late: the others finished the job.
      LOCKSTEP_LOG(INFO) << "the job completed while this worker waited to join: nothing to do";
      return OkStatus();
    }
    if (!assignment.ok()) {
      if (stop_.load()) {
        LeaveNow();
        return CancelledError("stopped while joining");
      }
      return assignment.status().WithContext("rendezvous join");
    }
    SetLogContext(LogContext(options_.job_name, assignment->rank, assignment->generation));
    LOCKSTEP_LOG(INFO) << "joined generation " << assignment->generation << " as rank "
                       << assignment->rank << " of " << assignment->world_size;
    if (metrics_ != nullptr) {
      metrics_->SetGeneration(assignment->generation, assignment->rank, assignment->world_size);
      if (!first_generation) metrics_->IncrementRestarts();
    }
    first_generation = false;

    bool completed = false;
    Status status = RunGeneration(*assignment, &completed);
    if (checkpointer_ != nullptr) checkpointer_->EndGeneration();
    client_->StopHeartbeat();
    if (completed) return OkStatus();
    if (stop_.load()) {
      LeaveNow();
      return CancelledError("stopped");
    }
    if (status.code() == StatusCode::kInvalidArgument ||
        status.code() == StatusCode::kFailedPrecondition) {
      // Not a transient condition of the generation: retrying cannot help.
      LeaveNow();
      return status;
    }
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reason = end_reason_;
    }
    if (left_by_vote_) {
      // A member joined: every rank completed the same step and left together. Not a failure.
      LOCKSTEP_LOG(INFO) << "generation " << assignment->generation << " ended at step "
                         << trainer_->state().step << ": " << reason
                         << "; left together, joining the next one";
      failed_generations = 0;
      continue;
    }
    LOCKSTEP_LOG(WARNING) << "generation " << assignment->generation << " ended at step "
                          << trainer_->state().step << ": "
                          << (reason.empty() ? status.ToString()
                                             : reason + " (" + status.ToString() + ")")
                          << "; joining the next one";
    if (++failed_generations > options_.max_consecutive_failed_generations) {
      LeaveNow();
      return UnavailableError("giving up after " + std::to_string(failed_generations) +
                              " failed generations; last: " + status.ToString());
    }
  }
}

Status TrainingWorker::RunGeneration(const rendezvous::Assignment& assignment, bool* completed) {
  const GenerationInfo info{assignment.generation, assignment.rank, assignment.world_size};
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_generation_ = assignment.generation;
    generation_ended_ = false;
    end_member_lost_ = false;
    end_reason_.clear();
    leave_requested_.store(false);
    left_by_vote_ = false;
  }
  const int64_t generation = assignment.generation;
  LOCKSTEP_RETURN_IF_ERROR(
      client_->StartHeartbeat(assignment, [this, generation](const rendezvous::GenerationEnd& end) {
        // Heartbeat thread; must not block.
        std::lock_guard<std::mutex> lock(mu_);
        if (generation != current_generation_) return;
        generation_ended_ = true;
        end_reason_ = end.reason;
        end_member_lost_ = end.member_lost;
        if (end.member_lost) {
          // A member is gone: collectives with it cannot complete. Abort makes them fail
          // promptly, and the training thread then joins the next generation.
          AbortCommunicators("generation ended: " + end.reason);
        } else {
          // A member joined and everyone is alive: vote to leave at the next step boundary, so
          // every rank completes the same step and nothing is lost (gradient_synchronizer.h).
          leave_requested_.store(true);
        }
      }));

  std::unique_ptr<rendezvous::KeyValueStore> store = client_->GenerationStore(generation);
  comm::CommunicatorOptions comm_options;
  comm_options.rank = assignment.rank;
  comm_options.size = assignment.world_size;
  comm_options.placement = assignment.host;
  comm_options.host = options_.client.host;
  comm_options.job_name = options_.job_name;
  comm_options.generation = generation;
  comm_options.connect_timeout_ms = options_.connect_timeout_ms;
  kernels::Device& device = trainer_->device();
  if (device.type() == kernels::DeviceType::kCuda) {
    comm_options.cuda = true;
    comm_options.cuda_device = trainer_->cuda_ordinal();
    comm_options.cuda_stream = device.side().cuda_stream;
  }
  auto communicator = comm::CreateCommunicator(comm_options, *store);
  if (!communicator.ok()) return communicator.status().WithContext("communicator bootstrap");
  std::unique_ptr<comm::Communicator> comm = std::move(communicator).value();
  {
    std::lock_guard<std::mutex> lock(mu_);
    communicator_ = comm.get();
    // The generation may have ended while the mesh was connecting.
    // (After a join nobody is lost: the first training step's vote ends it instead.)
    if (generation_ended_ && end_member_lost_) comm->Abort("generation ended: " + end_reason_);
    if (stop_.load()) comm->Abort("worker stopping");
  }
  // Declared before `unpublish`, so that they outlive their publication.
  std::optional<PipelineCommunicators> pipeline;
  // Whatever happens below, the heartbeat thread must not see a dangling communicator.
  struct Unpublish {
    TrainingWorker* worker;
    ~Unpublish() {
      worker->trainer_->SetPipelineCommunicators(nullptr, nullptr);
      std::lock_guard<std::mutex> lock(worker->mu_);
      worker->communicator_ = nullptr;
      worker->pipeline_communicators_.clear();
    }
  } unpublish{this};
  if (trainer_->pipelined()) {
    auto connected = ConnectPipeline(*comm, *store, comm_options,
                                     static_cast<int>(trainer_->pipeline_plan().stages.size()),
                                     trainer_->collective_timeout_ms());
    if (!connected.ok()) return connected.status().WithContext("communicator bootstrap");
    pipeline.emplace(std::move(connected).value());
    std::lock_guard<std::mutex> lock(mu_);
    pipeline_communicators_ = {pipeline->pipe.get(), pipeline->group.get()};
    if (generation_ended_ && end_member_lost_)
      AbortCommunicators("generation ended: " + end_reason_);
    if (stop_.load()) AbortCommunicators("worker stopping");
  }
  if (pipeline.has_value()) {
    trainer_->SetPipelineCommunicators(pipeline->pipe.get(), pipeline->group.get());
  }

  Trainer::RestoreFn restore;
  if (checkpointer_ != nullptr) {
    restore = [this](TrainingState& state) { return checkpointer_->Restore(state); };
  }
  LOCKSTEP_RETURN_IF_ERROR(trainer_->AgreeOnState(*comm, info, restore));
  if (checkpointer_ != nullptr) {
    // The attempt id names the temporary directory of this generation's writes; generation
    // numbers restart with a restarted rendezvous service, so rank 0 adds a random nonce that
    // keeps a new write from ever mixing with shards an earlier incarnation left behind.
    uint64_t nonce = 0;
    if (info.rank == 0) nonce = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    LOCKSTEP_RETURN_IF_ERROR(
        comm->Broadcast(&nonce, sizeof(nonce), 0, trainer_->collective_timeout_ms())
            .WithContext("broadcast of the checkpoint attempt id"));
    char attempt_id[40];
    std::snprintf(attempt_id, sizeof(attempt_id), "g%lld-%016llx",
                  static_cast<long long>(generation), static_cast<unsigned long long>(nonce));
    checkpointer_->BeginGeneration(attempt_id, info.rank, info.world_size, trainer_->state());
  }
  const double train_started = MonotonicSeconds();
  Trainer::StepFn on_step;
  if (checkpointer_ != nullptr) {
    on_step = [this, &comm](const TrainingState& state) {
      return checkpointer_->OnStep(state, *comm, trainer_->collective_timeout_ms());
    };
  }
  LOCKSTEP_RETURN_IF_ERROR(trainer_->Train(
      *comm, info, stop_,
      [this, &info](const TrainingProgress& progress) {
        if (info.rank == 0) client_->SetProgress(MakeReport(progress));
      },
      on_step, &leave_requested_, &left_by_vote_));
  // The final state is snapshotted at once; its write overlaps evaluation.
  if (checkpointer_ != nullptr) checkpointer_->SnapshotFinal(trainer_->state());
  LOCKSTEP_LOG(INFO) << "training done at step " << trainer_->state().step << " in "
                     << static_cast<int64_t>((MonotonicSeconds() - train_started) * 1000)
                     << " ms this generation";

  const int64_t timeout_ms = trainer_->collective_timeout_ms();
  LOCKSTEP_RETURN_IF_ERROR(comm->Barrier(timeout_ms).WithContext("barrier before evaluation"));
  rendezvous::ProgressReport report = MakeReport(trainer_->last_progress());
  const TrainingTotals& totals = trainer_->totals();
  report.step = trainer_->state().step;
  report.total_steps = trainer_->state().step;
  report.samples = trainer_->state().samples;
  report.samples_per_second = totals.samples_per_second();
  report.scaling_efficiency = totals.scaling_efficiency();
  report.comm_exposed_fraction = 1.0 - totals.scaling_efficiency();
  report.wire_bytes_per_step = totals.wire_bytes_per_step();
  if (trainer_->has_test_split()) {
    LOCKSTEP_ASSIGN_OR_RETURN(EvalResult eval, trainer_->Evaluate(*comm, info));
    report.eval_accuracy = eval.accuracy();
    LOCKSTEP_LOG(INFO) << "evaluation: accuracy " << eval.accuracy() << " (" << eval.correct << "/"
                       << eval.samples << "), loss " << eval.loss;
  }
  LOCKSTEP_LOG(INFO) << "trained " << totals.steps << " steps here at "
                     << totals.samples_per_second() << " samples/s, scaling efficiency "
                     << totals.scaling_efficiency() << ", " << totals.wire_bytes_per_step()
                     << " bytes sent per step";
  if (!options_.dump_params_path.empty()) {
    LOCKSTEP_RETURN_IF_ERROR(trainer_->DumpParameters(options_.dump_params_path, *comm, info));
  }
  if (checkpointer_ != nullptr) {
    Status persisted =
        checkpointer_->WaitForFinal(Deadline::AfterMs(options_.final_checkpoint_timeout_ms));
    if (persisted.ok()) {
      LOCKSTEP_LOG(INFO) << "final checkpoint of step " << trainer_->state().step << " persisted";
    } else {
      LOCKSTEP_LOG(WARNING) << "final checkpoint of step " << trainer_->state().step
                            << " not persisted: " << persisted
                            << "; the newest complete checkpoint is step "
                            << checkpointer_->last_checkpoint_step();
    }
    report.last_checkpoint_step = checkpointer_->last_checkpoint_step();
    report.last_checkpoint_uri = checkpointer_->last_checkpoint_uri();
  }
  *completed = true;
  Status left = LeaveOnce(/*completed=*/true, report);
  if (!left.ok()) {
    LOCKSTEP_LOG(WARNING) << "leave: " << left;
  }
  return OkStatus();
}

}  // namespace lockstep::trainer
