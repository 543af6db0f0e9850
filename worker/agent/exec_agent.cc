#include "worker/agent/exec_agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "common/deadline.h"
#include "common/env.h"
#include "common/errno_check.h"
#include "common/logging.h"
#include "common/rendezvous/client_environment.h"
#include "common/spec/training_job.h"
#include "common/termination_message.h"
#include "worker/agent/child_process.h"
#include "worker/agent/exec_agent_impl.h"
#include "worker/agent/exec_environment.h"
#include "worker/agent/exec_metrics.h"
#include "worker/agent/progress_file.h"
#include "worker/agent/supervised_command.h"
#include "worker/agent/wake_pipe.h"
#include "worker/agent/worker_command_line.h"
#include "worker/comm/rdma/nccl_rdma_setup.h"

namespace lockstep::agent {

namespace {

std::string& AgentProgramName() {
  static std::string name = "lockstep-worker";
  return name;
}

// "lockstep-worker exec: error: " or "lockstep-agent exec: error: ": the program a user sees in
// the pod's command.
std::string ErrorPrefix() { return AgentProgramName() + " exec: error: "; }

}  // namespace

namespace exec_agent_internal {

// Waits up to timeout_ms for anything on the wake pipe, then drains it.
Events WaitForEvents(int64_t timeout_ms) {
  Events events;
  for (unsigned char what : WaitForWakes(timeout_ms)) {
    switch (what) {
      case SIGCHLD:
        events.child = true;
        break;
      case SIGTERM:
      case SIGINT:
        if (events.signal == 0) events.signal = what;
        break;
      case kWakeGenerationEnded:
        events.generation_ended = true;
        break;
      case kWakeJoinDone:
        events.join_done = true;
        break;
      case kWakeHelper:
        events.helper = true;
        break;
      default:
        break;
    }
  }
  return events;
}

void ExecAgent::SetContext(const rendezvous::Assignment* a) {
  if (a == nullptr) {
    SetLogContext("job=" + options_.job + " member=" + options_.client.member_id + " rank=- gen=-");
  } else {
    SetLogContext("job=" + options_.job + " member=" + options_.client.member_id +
                  " rank=" + std::to_string(a->rank) + " gen=" + std::to_string(a->generation));
  }
}

int ExecAgent::GiveUpForGood(int status, const std::string& message) {
  if (const std::string path = EnvString(kTerminationLogEnv, ""); !path.empty()) {
    if (Status written = WriteTerminationMessage(path, kGaveUpPrefix + message); !written.ok()) {
      LOCKSTEP_LOG(WARNING) << "termination message: " << written;
    }
  }
  return GiveUp(status, message);
}

void ExecAgent::StopEveryProgram() {
  FinishStop();
  // A program waiting between generations (in place) gets its grace too.
  if (active_ && active_->process().running()) {
    active_->process().Stop(options_.grace_ms, options_.kill_wait_ms);
  }
  active_.reset();
  spare_.reset();
  zygote_.reset();
}

int ExecAgent::GiveUp(int status, const std::string& message) {
  StopEveryProgram();
  EndLeftovers();
  LOCKSTEP_LOG(ERROR) << message;
  std::cerr << ErrorPrefix() << message << std::endl;
  LeaveAsFailed();
  return status;
}

void ExecAgent::LeaveAsFailed() {
  if (Status status = client_->Leave(/*completed=*/false, tracker_.report()); !status.ok()) {
    LOCKSTEP_LOG(WARNING) << "leave: " << status;
  }
  client_->StopHeartbeat();
}

int ExecAgent::FinishedBetweenGenerations() {
  LOCKSTEP_LOG(INFO) << "command exited 0 (between generations)";
  spare_.reset();
  EndLeftovers();
  if (Status left = client_->Leave(/*completed=*/true, tracker_.report()); !left.ok()) {
    LOCKSTEP_LOG(WARNING) << "leave: " << left;
  }
  client_->StopHeartbeat();
  return kExitOk;
}

void ExecAgent::RecordOwnFailure(const rendezvous::Assignment& a) {
  ++own_failures_;
  LOCKSTEP_LOG(ERROR) << "command failed: " << last_exit_.Describe();
  if (!last_exit_.start_error.empty()) {
    std::cerr << ErrorPrefix() << last_exit_.start_error << std::endl;
  }
  FailureRecord failure;
  failure.member_id = options_.client.member_id;
  failure.rank = a.rank;
  failure.shell_status = last_exit_.ShellStatus();
  failure.description = last_exit_.Describe();
  failure.member_failures = own_failures_;
  failure.last_lines = last_exit_.last_error_lines;
  std::unique_ptr<rendezvous::KeyValueStore> store = client_->GenerationStore(a.generation);
  if (Status status = RecordFailure(*store, failure, options_.store_timeout_ms); !status.ok()) {
    LOCKSTEP_LOG(WARNING) << "could not record the failure in generation " << a.generation << ": "
                          << status;
  }
}

void ExecAgent::PumpProgress() {
  std::optional<ProgressLine> line = progress_.ReadNew();
  if (!line) return;
  const rendezvous::ProgressReport& report = tracker_.Update(*line, MonotonicSeconds());
  client_->SetProgress(report);
  metrics_->ObserveProgress(*line, report);
  // A program that says how long it computes (`progress.computing()`, compute_seconds) is paced
  // as the built-in trainer is, so the rendezvous service can name it a straggler.
  if (line->compute_seconds >= 0) {
    Pace& pace = pace_;
    const bool new_program = pace.first_step < 0 || line->step < pace.last_step ||
                             line->compute_seconds < pace.last_compute;
    if (new_program) {
      if (pace.first_step >= 0) {
        pace.base_steps += pace.last_step - pace.first_step;
        pace.base_compute += pace.last_compute;
      }
      pace.first_step = line->step;
    }
    pace.last_step = line->step;
    pace.last_compute = line->compute_seconds;
    client_->SetPace(pace.base_steps + (pace.last_step - pace.first_step),
                     pace.base_compute + pace.last_compute);
  }
}

ExecAgent::Outcome ExecAgent::Supervise(const rendezvous::Assignment& a) {
  const int64_t poll_ms = std::max<int64_t>(50, a.heartbeat_interval_ms);
  ChildProcess& child = active_->process();
  while (true) {
    const Events events = WaitForEvents(poll_ms);
    if (events.signal != 0 && pending_signal_ == 0) pending_signal_ = events.signal;
    PumpProgress();
    active_->Absorb();
    if (pending_signal_ != 0) {
      LOCKSTEP_LOG(WARNING) << "received signal " << pending_signal_
                            << "; stopping the command (pid " << child.pid() << ")";
      last_exit_ = child.Stop(options_.grace_ms, options_.kill_wait_ms);
      return Outcome::kSignalled;
    }
    // Read before reaping: an exit that came by the time the end is seen is the command's own,
    // not a stop.
    const bool ended = GenerationEnded(a.generation);
    if (events.child) ReapOrphans();
    if (std::optional<ChildExit> exit = child.TryReap()) {
      last_exit_ = *exit;
      PumpProgress();
      return exit->success() ? Outcome::kSucceeded : Outcome::kFailed;
    }
    if (ended) {
      // A helper program leaves the group and stays (in-place recovery: Run waits for its
      // "left" before the next generation starts). Any other command gets SIGTERM, and the
      // agent joins the next generation at once while it stops (Run: the stop goes on in
      // JoinInterruptibly), so that the others see this member coming back rather than forming
      // without it. Nobody starts the next command before this one has stopped or left
      // (AwaitStoppedCommands).
      if (active_->recoverable() && active_->EndGeneration(a.generation).ok()) {
        LOCKSTEP_LOG(INFO) << "generation ended; the command (pid " << child.pid()
                           << ") leaves it and stays";
        return Outcome::kGenerationEnded;
      }
      LOCKSTEP_LOG(INFO) << "generation ended; stopping the command (pid " << child.pid() << ")";
      child.Signal(SIGTERM);
      return Outcome::kGenerationEnded;
    }
    TendSpare(a.generation);
  }
}

int ExecAgent::Run() {
  SetContext(nullptr);
  LOCKSTEP_LOG(INFO) << "exec agent for " << options_.command[0] << " (backoffLimit "
                     << options_.budget.backoff_limit << ", restartPolicy "
                     << spec::ToString(options_.budget.policy) << ")";
  // In a user's image the launcher parked the image's LD_* variables away from this process's
  // loader; the programs get them back.
  inherited_env_ = RestoreParkedLoaderVariables(CurrentEnvironment());
  while (true) {
    StatusOr<rendezvous::Assignment> joined = JoinInterruptibly();
    if (!joined.ok() && rendezvous::JobCompletedWhileJoining(joined.status())) {
      // A standby, or a replacement that came too late: the others finished the job.
      FinishStop();
      client_->StopHeartbeat();
      LOCKSTEP_LOG(INFO) << "the job completed while this worker waited to join: nothing to do";
      return kExitOk;
    }
    if (!joined.ok()) {
      FinishStop();
      client_->StopHeartbeat();
      LOCKSTEP_LOG(ERROR) << joined.status();
      std::cerr << ErrorPrefix() << joined.status().message() << std::endl;
      return kExitFailure;
    }
    const rendezvous::Assignment a = *joined;
    const int64_t g = a.generation;
    SetContext(&a);
    LOCKSTEP_LOG(INFO) << "joined generation " << g << " as rank " << a.rank << " of "
                       << a.world_size;
    // Replaces the previous generation's stream (kept open through the Join: restart_protocol.h,
    // step 2).
    // A join or a loss: either way the command must restart at the new world size.
    Status heartbeat = client_->StartHeartbeat(a, [this, g](const rendezvous::GenerationEnd& end) {
      LOCKSTEP_LOG(INFO) << "generation " << g << " ended: " << end.reason;
      int64_t seen = ended_generation_.load();
      while (seen < g && !ended_generation_.compare_exchange_weak(seen, g)) {
      }
      Wake(kWakeGenerationEnded);
    });
    if (!heartbeat.ok()) return GiveUp(kExitFailure, heartbeat.ToString());
    metrics_->SetGeneration(g, a.rank, a.world_size);

    StatusOr<GenerationPlan> plan = a.rank == 0 ? MakePlan(a) : AwaitPlan(a);
    if (!plan.ok()) {
      if (pending_signal_ != 0) return GiveUp(128 + pending_signal_, "interrupted by a signal");
      if (GenerationEnded(g)) continue;  // the membership changed meanwhile: form the next one
      return GiveUp(kExitFailure,
                    "generation " + std::to_string(g) + ": " + plan.status().ToString());
    }
    if (plan->restart_count > known_restarts_) {
      metrics_->AddRestarts(plan->restart_count - known_restarts_);
      known_restarts_ = plan->restart_count;
      // Reported at once, with or without progress from the program: `lockstep run`'s display
      // and summary count the restarts the budget counts.
      tracker_.SetRestarts(known_restarts_);
      client_->SetProgress(tracker_.report());
    }
    if (plan->give_up) return GiveUpForGood(plan->exit_status, plan->message);
    // Safety net under the shared count: a command that failed here more often than the budget
    // allows stops even if failure records went missing (an unreachable store).
    if (own_failures_ > options_.budget.backoff_limit) {
      return GiveUpForGood(last_exit_.ShellStatus() != 0 ? last_exit_.ShellStatus() : kExitFailure,
                           "the command failed " + std::to_string(own_failures_) +
                               " times on this member (backoffLimit " +
                               std::to_string(options_.budget.backoff_limit) +
                               "); last: " + last_exit_.Describe());
    }
    if (active_ && active_->process().running() && active_->recoverable()) {
      switch (AwaitLeft(a)) {
        case Handover::kLeft:
        case Handover::kStopping:
          break;
        case Handover::kSignalled:
          return GiveUp(128 + pending_signal_, "interrupted by a signal");
        case Handover::kGenerationEnded:
          continue;
        case Handover::kExited:
          if (SettleEndedHelper(a)) return FinishedBetweenGenerations();
          continue;
      }
    }
    if (Status stopped = AwaitStoppedCommands(a); !stopped.ok()) {
      if (pending_signal_ != 0) return GiveUp(128 + pending_signal_, "interrupted by a signal");
      if (GenerationEnded(g)) continue;
      return GiveUp(kExitFailure, "generation " + std::to_string(g) + ": " + stopped.ToString());
    }
    if (plan->backoff_ms > 0) {
      LOCKSTEP_LOG(INFO) << "backing off " << plan->backoff_ms << " ms before restart "
                         << plan->restart_count;
      const Deadline backoff = Deadline::AfterMs(plan->backoff_ms);
      while (!backoff.expired() && !GenerationEnded(g) && pending_signal_ == 0) {
        const Events events = WaitForEvents(backoff.remaining_ms());
        if (events.signal != 0) pending_signal_ = events.signal;
      }
      if (pending_signal_ != 0) return GiveUp(128 + pending_signal_, "interrupted by a signal");
      if (GenerationEnded(g)) continue;
    }

    // A helper program that died after leaving the previous generation (its channel closed with
    // it) is a failure in g, counted like any: end g and form the next one with the spare.
    // (Its channel closes a moment before it can be reaped; a helper whose channel closed while
    // it runs is broken and is ended here.)
    if (active_ && active_->said_hello()) {
      active_->Absorb();
      if (!active_->recoverable() || !active_->process().running()) {
        if (SettleEndedHelper(a)) return FinishedBetweenGenerations();
        continue;
      }
    }

    if (Status started =
            StartOrAssign(a, *plan, CommandOptions(a, *plan), ExecVariables(a, *plan, Extras()));
        !started.ok()) {
      return GiveUp(kExitFailure, started.ToString());
    }

    const Outcome outcome = Supervise(a);
    if (outcome == Outcome::kGenerationEnded) {
      if (!active_->recoverable()) {
        stopping_ = active_->TakeProcess();
        active_.reset();
      }
    } else {
      active_.reset();
      if (outcome != Outcome::kFailed) spare_.reset();  // the member is done: so is its spare
      EndLeftovers();
    }
    switch (outcome) {
      case Outcome::kSucceeded: {
        LOCKSTEP_LOG(INFO) << "command exited 0";
        Status left = client_->Leave(/*completed=*/true, tracker_.report());
        if (!left.ok()) {
          LOCKSTEP_LOG(WARNING) << "leave: " << left;
        }
        client_->StopHeartbeat();
        return kExitOk;
      }
      case Outcome::kSignalled: {
        const int status = last_exit_.ShellStatus();
        LOCKSTEP_LOG(WARNING) << "command stopped: " << last_exit_.Describe() << "; exiting "
                              << status;
        LeaveAsFailed();
        return status;
      }
      case Outcome::kGenerationEnded:
        break;  // Join the next generation
      case Outcome::kFailed:
        RecordOwnFailure(a);
        break;  // Join again with the heartbeat still open: that ends g for everyone
    }
  }
}

}  // namespace exec_agent_internal

using exec_agent_internal::ExecAgent;
using exec_agent_internal::kExitBadInput;
using exec_agent_internal::kExitFailure;
using exec_agent_internal::kExitOk;

void SetAgentProgramName(const std::string& name) { AgentProgramName() = name; }

int RunExecAgent(const std::vector<std::string>& args) {
  if (StatusOr<WorkerCommandLine> line = ParseWorkerCommandLine(WorkerMode::kExec, args);
      line.ok() && line->help) {
    std::cout << WorkerCommandLineHelp(WorkerMode::kExec, AgentProgramName());
    return kExitOk;
  }
  auto fail = [](int code, const std::string& message) {
    std::string line = message;
    std::replace(line.begin(), line.end(), '\n', ';');
    std::cerr << ErrorPrefix() << line << std::endl;
    return code;
  };
  StatusOr<ExecAgentOptions> options = ParseExecAgentArgs(args);
  if (!options.ok()) return fail(kExitBadInput, options.status().message() + " (see --help)");
  if (Status status = InstallWakePipe({SIGTERM, SIGINT, SIGCHLD}); !status.ok()) {
    return fail(kExitFailure, status.message());
  }
  // What the command leaves behind (a setsid daemon, a process in its own group) is reparented
  // to the agent instead of init, so that it ends with the command (EndDescendants).
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    return fail(kExitFailure, ErrnoStatus("prctl(PR_SET_CHILD_SUBREAPER)", errno).message());
  }
  // The command inherits this environment (ExecAgent::Run snapshots it): NCCL in a PyTorch
  // program gets NCCL_IB_HCA/NCCL_IB_GID_INDEX for roce/infiniband. Before the metrics endpoint
  // and the rendezvous client start their threads (setenv vs. a concurrent getenv).
  SetLogContext("job=" + options->job + " member=" + options->client.member_id + " rank=- gen=-");
  rdma::SetUpNcclRdmaEnvironment(options->network);
  StatusOr<std::unique_ptr<ExecMetrics>> metrics =
      ExecMetrics::Create(options->job, options->metrics_port);
  if (!metrics.ok()) return fail(kExitFailure, metrics.status().message());
  StatusOr<PrivateDirectory> directory = PrivateDirectory::Create();
  if (!directory.ok()) return fail(kExitFailure, directory.status().message());
  StatusOr<std::unique_ptr<rendezvous::RendezvousClient>> client =
      rendezvous::RendezvousClient::Connect(options->client);
  if (!client.ok()) return fail(kExitFailure, client.status().message());
  // The helper's copy of the program's state lives in host memory (tmpfs) where there is one,
  // so that a restart of every process resumes from it without reading storage.
  StatusOr<PrivateDirectory> memory = PrivateDirectory::Create("/dev/shm");
  const std::string snapshot =
      (memory.ok() ? memory->path() : directory->path()) + "/state.snapshot";
  ExecAgent agent(*options, std::move(*client), std::move(*metrics),
                  directory->path() + "/progress.jsonl", snapshot);
  return agent.Run();
}

}  // namespace lockstep::agent
