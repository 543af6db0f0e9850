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
#include "common/rendezvous/client_environment.h"
#include "common/errno_check.h"
#include "common/logging.h"
#include "common/spec/training_job.h"
#include "common/termination_message.h"
#include "worker/agent/child_process.h"
#include "worker/agent/exec_environment.h"
#include "worker/agent/exec_metrics.h"
#include "worker/agent/progress_file.h"
#include "worker/agent/supervised_command.h"
#include "worker/agent/wake_pipe.h"
#include "worker/comm/rdma/nccl_rdma_setup.h"

namespace lockstep::agent {

// Tunables (docs/exec.md).
LOCKSTEP_PARAM_INT(ExecGraceMs, "LOCKSTEP_EXEC_GRACE_MS", 10000);
LOCKSTEP_PARAM_INT(ExecBackoffMs, "LOCKSTEP_EXEC_BACKOFF_MS", 1000);
LOCKSTEP_PARAM_INT(ExecMaxBackoffMs, "LOCKSTEP_EXEC_MAX_BACKOFF_MS", 30000);
LOCKSTEP_PARAM_INT(ExecJoinTimeoutMs, "LOCKSTEP_JOIN_TIMEOUT_MS", 600000);
LOCKSTEP_PARAM_INT(ExecPlanTimeoutMs, "LOCKSTEP_EXEC_PLAN_TIMEOUT_MS", 60000);
LOCKSTEP_PARAM_INT(ExecWarmSpare, "LOCKSTEP_EXEC_WARM_SPARE", 1);

const char kExecUsage[] =
    "usage: lockstep-worker exec [--manifest FILE] [--] COMMAND [ARG...]\n"
    "  Runs COMMAND as this member of the job under the rendezvous, with the environment\n"
    "  PyTorch expects (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, ...), and\n"
    "  restarts it in a new generation when it fails anywhere or membership changes.\n"
    "  The manifest (runPolicy, command) comes from --manifest or LOCKSTEP_SPEC.\n";

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

// Read from the wake pipe: signal numbers, and these for the agent's own events.
constexpr unsigned char kWakeGenerationEnded = 0xF0;
constexpr unsigned char kWakeJoinDone = 0xF1;
// Non-rank-0 agents poll for the plan in slices this long, checking for the generation's end.
constexpr int64_t kPlanPollSliceMs = 500;
// How long rank 0 waits for the first failure's details (written right after its counter).
constexpr int64_t kFailureDetailsWaitMs = 2000;
// Bound on ending what a finished command left behind (EndDescendants).
constexpr int64_t kEndDescendantsMs = 2000;
// The generation-store key each agent writes once its previous command has stopped; every agent
// waits for all of them before it starts its command.
constexpr char kStoppedKeyPrefix[] = "stopped/";

// What woke the agent up since the last wait.
struct Events {
  int signal = 0;  // SIGTERM or SIGINT to the agent (the first one)
  bool child = false;
  bool generation_ended = false;
  bool join_done = false;
  bool helper = false;  // a helper channel has news
};
// A warm spare that dies before it is used is started again after this, doubling per death up
// to kSpareMaxBackoffMs.
constexpr int64_t kSpareBackoffMs = 1000;
constexpr int64_t kSpareMaxBackoffMs = 60000;

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

class ExecAgent {
 public:
  ExecAgent(ExecAgentOptions options, std::unique_ptr<rendezvous::RendezvousClient> client,
            std::unique_ptr<ExecMetrics> metrics, std::string progress_path,
            std::string state_snapshot)
      : options_(std::move(options)),
        client_(std::move(client)),
        metrics_(std::move(metrics)),
        progress_(std::move(progress_path)),
        state_snapshot_(std::move(state_snapshot)) {}

  int Run();

 private:
  enum class Outcome { kSucceeded, kFailed, kGenerationEnded, kSignalled };
  // How a program recovered in place came out of the previous generation (AwaitLeft).
  enum class Handover { kLeft, kStopping, kExited, kGenerationEnded, kSignalled };

  StatusOr<rendezvous::Assignment> JoinInterruptibly();
  StatusOr<GenerationPlan> MakePlan(const rendezvous::Assignment& a);
  StatusOr<GenerationPlan> AwaitPlan(const rendezvous::Assignment& a);
  // Waits for `keys` in generation a's store, in slices that watch for a signal and the
  // generation's end (CANCELLED, ABORTED); DEADLINE_EXCEEDED naming `what` after timeout_ms.
  StatusOr<std::vector<std::string>> AwaitKeys(const rendezvous::Assignment& a,
                                               const std::vector<std::string>& keys,
                                               int64_t timeout_ms, const std::string& what);
  // Says this member's previous command has stopped, then waits until every member says so.
  Status AwaitStoppedCommands(const rendezvous::Assignment& a);
  // The previous generation's command, stopped while the agent joins the next one: reaps it, and
  // SIGKILLs it once the grace is over (never blocks). FinishStop waits for it (bounded).
  void DriveStop();
  void FinishStop();
  void PreviousCommandStopped(const ChildExit& exit);
  // The command ended: what it left behind goes too.
  void EndLeftovers();
  // Supervises the running command until one of the outcomes; fills last_exit_ (kSucceeded,
  // kFailed, kSignalled) or sends the command SIGTERM (kGenerationEnded).
  Outcome Supervise(const rendezvous::Assignment& a);
  // The running helper program (active_) leaves its generation's group before generation a
  // starts: waits (bounded by the grace) for its "left". kStopping: it did not, and it is being
  // stopped like any command (stopping_); kExited: it exited meanwhile (last_exit_).
  Handover AwaitLeft(const rendezvous::Assignment& a);
  // The program for generation a: active_ recovered in place, else the warm spare promoted, else
  // a new process; then a's assignment for its helper.
  Status StartOrAssign(const rendezvous::Assignment& a, const GenerationPlan& plan,
                       ChildProcess::Options options,
                       const std::vector<std::pair<std::string, std::string>>& variables);
  // Keeps a warm spare of a helper program that trains in generation g: reaps one that died,
  // starts one when there is none (with back-off after deaths).
  void TendSpare(int64_t g);
  // Reaps a spare that died unused (it costs no restart; another follows with back-off).
  void ReapDeadSpare();
  void StartSpare();
  // The programs that go on (active_, spare_): what EndLeftovers and ReapOrphans must spare.
  std::vector<pid_t> LivePrograms() const;
  // The helper program (active_) ended between generations: reaped, or its channel closed (it is
  // ended at once). True when it exited 0; otherwise its failure is recorded in a's store.
  bool SettleEndedHelper(const rendezvous::Assignment& a);
  // A helper program that finished after its generation ended: the member is done.
  int FinishedBetweenGenerations();
  // Records this member's failed command in generation g's store (restart_protocol.h, step 2).
  void RecordOwnFailure(const rendezvous::Assignment& a);
  void PumpProgress();
  // Reaps what the command's descendants left to the agent (a subreaper) and has exited.
  void ReapOrphans();
  bool GenerationEnded(int64_t generation) const { return ended_generation_.load() >= generation; }
  // Leaves (completed=false) so the others re-form at once, and stops heartbeating.
  void LeaveAsFailed();
  void SetContext(const rendezvous::Assignment* a);
  int GiveUp(int status, const std::string& message);
  // The job's budget is spent or its policy refuses a retry: also tells the operator so
  // (common/termination_message.h), which then fails the job instead of replacing the pod.
  int GiveUpForGood(int status, const std::string& message);

  ExecAgentOptions options_;
  std::unique_ptr<rendezvous::RendezvousClient> client_;
  std::unique_ptr<ExecMetrics> metrics_;
  ProgressFileReader progress_;
  ProgressTracker tracker_;
  std::string state_snapshot_;  // LOCKSTEP_STATE_SNAPSHOT: the helper's copy of its state
  std::atomic<int64_t> ended_generation_{0};
  int pending_signal_ = 0;
  int32_t known_restarts_ = 0;
  int32_t own_failures_ = 0;
  ChildExit last_exit_;
  std::unique_ptr<ChildProcess> stopping_;
  std::unique_ptr<SupervisedCommand> active_;  // the command of the current generation
  std::unique_ptr<SupervisedCommand> spare_;   // a warm spare of a helper program
  ChildProcess::Options spare_options_;        // how the last program was started
  int spare_deaths_ = 0;                       // spares that died unused, in a row
  double spare_not_before_ = 0;                // MonotonicSeconds
};

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

int ExecAgent::GiveUp(int status, const std::string& message) {
  FinishStop();
  if (active_ && active_->process().running()) {
    active_->process().Stop(options_.grace_ms, options_.kill_wait_ms);
  }
  active_.reset();
  spare_.reset();
  EndLeftovers();
  LOCKSTEP_LOG(ERROR) << message;
  std::cerr << "lockstep-worker exec: error: " << message << std::endl;
  LeaveAsFailed();
  return status;
}

void ExecAgent::LeaveAsFailed() {
  if (Status status = client_->Leave(/*completed=*/false, tracker_.report()); !status.ok()) {
    LOCKSTEP_LOG(WARNING) << "leave: " << status;
  }
  client_->StopHeartbeat();
}

StatusOr<rendezvous::Assignment> ExecAgent::JoinInterruptibly() {
  // Join cannot be cancelled, and it may wait long for the others: it runs on a helper thread
  // while this thread stays responsive to SIGTERM.
  struct JoinState {
    std::mutex mu;
    std::optional<StatusOr<rendezvous::Assignment>> result;
  };
  auto state = std::make_shared<JoinState>();
  rendezvous::RendezvousClient* client = client_.get();
  const int64_t timeout_ms = options_.join_timeout_ms;
  std::thread joiner([state, client, timeout_ms] {
    StatusOr<rendezvous::Assignment> result = client->Join(/*state_step=*/-1, timeout_ms);
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->result = std::move(result);
    }
    Wake(kWakeJoinDone);
  });
  while (true) {
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->result.has_value()) break;
    }
    int64_t wait_ms = 1000;
    if (stopping_ && !stopping_->sigkill_sent()) {
      wait_ms = std::clamp<int64_t>(options_.grace_ms - stopping_->MsSinceSigterm() + 1, 1, wait_ms);
    }
    const Events events = WaitForEvents(wait_ms);
    DriveStop();
    if (events.signal != 0 || pending_signal_ != 0) {
      const int signal_number = pending_signal_ != 0 ? pending_signal_ : events.signal;
      LOCKSTEP_LOG(WARNING) << "received signal " << signal_number
                            << " while joining; leaving and exiting";
      FinishStop();
      // A program waiting between generations (in place) gets its grace too.
      if (active_ && active_->process().running()) {
        active_->process().Stop(options_.grace_ms, options_.kill_wait_ms);
      }
      active_.reset();
      spare_.reset();
      LeaveAsFailed();
      std::cout.flush();
      std::cerr.flush();
      std::_Exit(128 + signal_number);  // the Join thread cannot be stopped; the process ends
    }
  }
  joiner.join();
  return std::move(*state->result);
}

StatusOr<GenerationPlan> ExecAgent::MakePlan(const rendezvous::Assignment& a) {
  GenerationPlan plan;
  plan.restart_count = known_restarts_;
  if (a.generation > 1) {
    std::unique_ptr<rendezvous::KeyValueStore> previous =
        client_->GenerationStore(a.generation - 1);
    const PreviousGeneration before = ReadPreviousGeneration(*previous, kFailureDetailsWaitMs);
    const int32_t restarts_before = std::max(known_restarts_, before.restart_count.value_or(0));
    plan = before.gave_up ? *before.gave_up
                          : DecideNextGeneration(options_.budget, restarts_before, before.failure);
    if (before.failure && !plan.give_up) {
      LOCKSTEP_LOG(WARNING) << "restart " << plan.restart_count << " of "
                            << options_.budget.backoff_limit << " after " << plan.message;
    }
  }
  plan.generation = a.generation;
  plan.master_addr = a.members.empty() ? options_.client.host : a.members[0].host;
  LOCKSTEP_ASSIGN_OR_RETURN(plan.master_port, PickFreePort());
  std::unique_ptr<rendezvous::KeyValueStore> store = client_->GenerationStore(a.generation);
  LOCKSTEP_RETURN_IF_ERROR(store->Set(kPlanKey, EncodePlan(plan), options_.store_timeout_ms));
  return plan;
}

StatusOr<std::vector<std::string>> ExecAgent::AwaitKeys(const rendezvous::Assignment& a,
                                                        const std::vector<std::string>& keys,
                                                        int64_t timeout_ms,
                                                        const std::string& what) {
  std::unique_ptr<rendezvous::KeyValueStore> store = client_->GenerationStore(a.generation);
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  while (true) {
    StatusOr<std::vector<std::string>> values = store->Get(
        keys, std::min(kPlanPollSliceMs, std::max<int64_t>(1, deadline.remaining_ms())));
    if (values.ok()) return values;
    if (values.status().code() != StatusCode::kDeadlineExceeded) return values.status();
    const Events events = WaitForEvents(0);
    if (events.signal != 0 && pending_signal_ == 0) pending_signal_ = events.signal;
    if (pending_signal_ != 0) return CancelledError("signal while waiting for " + what);
    if (GenerationEnded(a.generation)) return AbortedError("generation ended while waiting for " + what);
    if (deadline.expired()) {
      return DeadlineExceededError(what + " in generation " + std::to_string(a.generation) +
                                   " not there within " + std::to_string(timeout_ms) + " ms");
    }
  }
}

StatusOr<GenerationPlan> ExecAgent::AwaitPlan(const rendezvous::Assignment& a) {
  StatusOr<std::vector<std::string>> value =
      AwaitKeys(a, {kPlanKey}, options_.plan_timeout_ms, "rank 0's plan");
  if (!value.ok()) return value.status();
  return DecodePlan((*value)[0]);
}

Status ExecAgent::AwaitStoppedCommands(const rendezvous::Assignment& a) {
  FinishStop();
  std::unique_ptr<rendezvous::KeyValueStore> store = client_->GenerationStore(a.generation);
  LOCKSTEP_RETURN_IF_ERROR(store->Set(kStoppedKeyPrefix + options_.client.member_id, "1",
                                      options_.store_timeout_ms));
  std::vector<std::string> keys;
  for (const rendezvous::MemberInfo& member : a.members) {
    keys.push_back(kStoppedKeyPrefix + member.member_id);
  }
  // Each member stops its command within its grace and kill wait of the generation's end.
  return AwaitKeys(a, keys,
                   options_.grace_ms + options_.kill_wait_ms + options_.plan_timeout_ms,
                   "every member's previous command to stop")
      .status();
}

void ExecAgent::DriveStop() {
  if (!stopping_) return;
  if (std::optional<ChildExit> exit = stopping_->TryReap()) {
    PreviousCommandStopped(*exit);
  } else if (!stopping_->sigkill_sent() && stopping_->MsSinceSigterm() > options_.grace_ms) {
    LOCKSTEP_LOG(WARNING) << "previous command (pid " << stopping_->pid() << ") still running "
                          << options_.grace_ms << " ms after SIGTERM; sending SIGKILL";
    stopping_->Signal(SIGKILL);
  }
}

void ExecAgent::FinishStop() {
  if (stopping_) PreviousCommandStopped(stopping_->Stop(options_.grace_ms, options_.kill_wait_ms));
}

void ExecAgent::PreviousCommandStopped(const ChildExit& exit) {
  LOCKSTEP_LOG(INFO) << "previous command (pid " << stopping_->pid()
                     << ") stopped: " << exit.Describe();
  stopping_.reset();
  EndLeftovers();
}

void ExecAgent::EndLeftovers() {
  if (const int ended = EndDescendants(kEndDescendantsMs, LivePrograms()); ended > 0) {
    LOCKSTEP_LOG(WARNING) << "ended " << ended
                          << " process(es) the command left behind (setsid or daemon)";
  }
}

std::vector<pid_t> ExecAgent::LivePrograms() const {
  std::vector<pid_t> live;
  for (const SupervisedCommand* command : {active_.get(), spare_.get()}) {
    if (command != nullptr && command->process().running()) live.push_back(command->process().pid());
  }
  return live;
}

void ExecAgent::ReapOrphans() {
  std::vector<pid_t> keep = LivePrograms();
  if (stopping_) keep.push_back(stopping_->pid());
  if (const int reaped = ReapExitedOrphans(keep); reaped > 0) {
    LOCKSTEP_LOG(INFO) << "reaped " << reaped << " exited orphan(s) of the command";
  }
}

void ExecAgent::TendSpare(int64_t g) {
  ReapDeadSpare();
  if (spare_ || !options_.warm_spare || !active_ || !active_->recoverable() ||
      !active_->training_in(g) || MonotonicSeconds() < spare_not_before_) {
    return;
  }
  StartSpare();
}

void ExecAgent::ReapDeadSpare() {
  if (spare_) {
    spare_->Absorb();
    std::optional<ChildExit> exit = spare_->process().TryReap();
    if (!exit && spare_->said_hello() && !spare_->recoverable()) {
      exit = spare_->process().Stop(/*grace_ms=*/0, options_.kill_wait_ms);  // its channel closed
    }
    if (exit) {
      ++spare_deaths_;
      const int64_t backoff_ms = std::min<int64_t>(
          kSpareMaxBackoffMs, kSpareBackoffMs << std::min(spare_deaths_ - 1, 16));
      LOCKSTEP_LOG(WARNING) << "warm spare (pid " << spare_->process().pid()
                            << ") ended unused: " << exit->Describe() << "; another in "
                            << backoff_ms << " ms";
      spare_.reset();
      spare_not_before_ = MonotonicSeconds() + static_cast<double>(backoff_ms) / 1000;
    }
  }
}

void ExecAgent::StartSpare() {
  // Started once the program trains, so its start-up does not compete with a recovery.
  ChildProcess::Options options = spare_options_;
  options.env.push_back(std::string(kWarmSpareEnv) + "=1");
  options.output_prefix = "[spare] ";
  StatusOr<std::unique_ptr<SupervisedCommand>> spare = SupervisedCommand::Start(options);
  if (!spare.ok()) {
    LOCKSTEP_LOG(WARNING) << "warm spare: " << spare.status();
    spare_not_before_ = MonotonicSeconds() + static_cast<double>(kSpareMaxBackoffMs) / 1000;
    return;
  }
  spare_ = std::move(*spare);
  LOCKSTEP_LOG(INFO) << "started a warm spare (pid " << spare_->process().pid() << ")";
}

ExecAgent::Handover ExecAgent::AwaitLeft(const rendezvous::Assignment& a) {
  const Deadline deadline = Deadline::AfterMs(options_.grace_ms);
  while (true) {
    active_->Absorb();
    if (std::optional<ChildExit> exit = active_->process().TryReap()) {
      last_exit_ = *exit;
      return Handover::kExited;
    }
    if (active_->idle()) return Handover::kLeft;
    if (pending_signal_ != 0) return Handover::kSignalled;
    if (GenerationEnded(a.generation)) return Handover::kGenerationEnded;
    if (!active_->recoverable()) {
      // Its channel closed: it died (it is reaped a moment after) or broke the protocol.
      last_exit_ = active_->process().Stop(/*grace_ms=*/0, options_.kill_wait_ms);
      return Handover::kExited;
    }
    if (deadline.expired()) {
      LOCKSTEP_LOG(WARNING) << "the command (pid " << active_->process().pid()
                            << ") did not leave its generation within " << options_.grace_ms
                            << " ms; stopping it";
      active_->process().Signal(SIGTERM);
      stopping_ = active_->TakeProcess();
      active_.reset();
      return Handover::kStopping;
    }
    const Events events = WaitForEvents(std::min<int64_t>(deadline.remaining_ms(), 200));
    if (events.signal != 0 && pending_signal_ == 0) pending_signal_ = events.signal;
    if (events.child) ReapOrphans();
    TendSpare(a.generation);
  }
}

Status ExecAgent::StartOrAssign(const rendezvous::Assignment& a, const GenerationPlan& plan,
                                ChildProcess::Options options,
                                const std::vector<std::pair<std::string, std::string>>& variables) {
  spare_options_ = options;
  const std::string prefix = options.output_prefix;
  if (active_ && active_->process().running() && active_->recoverable()) {
    active_->process().SetOutputPrefix(prefix);
    LOCKSTEP_LOG(INFO) << "the command (pid " << active_->process().pid()
                       << ") goes on in place (restart " << plan.restart_count << ")";
  } else if (ReapDeadSpare(), spare_) {
    active_ = std::move(spare_);
    spare_deaths_ = 0;
    active_->process().SetOutputPrefix(prefix);
    tracker_.StartProcess();
    LOCKSTEP_LOG(INFO) << "promoted the warm spare (pid " << active_->process().pid()
                       << ", MASTER_ADDR " << plan.master_addr << ", MASTER_PORT "
                       << plan.master_port << ", restart " << plan.restart_count << ")";
  } else {
    active_.reset();
    tracker_.StartProcess();
    LOCKSTEP_ASSIGN_OR_RETURN(active_, SupervisedCommand::Start(options));
    LOCKSTEP_LOG(INFO) << "started " << options_.command[0] << " (pid "
                       << active_->process().pid() << ", MASTER_ADDR " << plan.master_addr
                       << ", MASTER_PORT " << plan.master_port << ", restart "
                       << plan.restart_count << ")";
  }
  if (active_->process().running() && !GenerationEnded(a.generation)) {
    // A program that does not use the helper never reads it; one that does forms the group.
    if (Status sent = active_->Assign(a, plan, variables); !sent.ok() && active_->said_hello()) {
      LOCKSTEP_LOG(WARNING) << "assignment to the helper: " << sent;
    }
  }
  return OkStatus();
}

bool ExecAgent::SettleEndedHelper(const rendezvous::Assignment& a) {
  last_exit_ = active_->process().Stop(/*grace_ms=*/0, options_.kill_wait_ms);
  active_.reset();
  if (last_exit_.success()) return true;
  // Failed between generations: a failure in g, which ends g for everyone.
  RecordOwnFailure(a);
  EndLeftovers();
  return false;
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
    std::cerr << "lockstep-worker exec: error: " << last_exit_.start_error << std::endl;
  }
  FailureRecord failure;
  failure.member_id = options_.client.member_id;
  failure.rank = a.rank;
  failure.shell_status = last_exit_.ShellStatus();
  failure.description = last_exit_.Describe();
  failure.member_failures = own_failures_;
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
  const std::vector<std::string> inherited = CurrentEnvironment();
  while (true) {
    StatusOr<rendezvous::Assignment> joined = JoinInterruptibly();
    if (!joined.ok()) {
      FinishStop();
      client_->StopHeartbeat();
      LOCKSTEP_LOG(ERROR) << joined.status();
      std::cerr << "lockstep-worker exec: error: " << joined.status().message() << std::endl;
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
      return GiveUpForGood(
          last_exit_.ShellStatus() != 0 ? last_exit_.ShellStatus() : kExitFailure,
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

    ExecEnvironmentExtras extras;
    extras.run_id = options_.job;
    extras.max_restarts = options_.budget.backoff_limit;
    extras.progress_file = progress_.path();
    extras.python_path = options_.python_path;
    extras.state_snapshot = state_snapshot_;
    ChildProcess::Options child_options;
    child_options.argv = options_.command;
    child_options.env = BuildExecEnvironment(inherited, a, *plan, extras);
    child_options.output_prefix = "[rank " + std::to_string(a.rank) + "] ";
    if (Status started = StartOrAssign(a, *plan, child_options, ExecVariables(a, *plan, extras));
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

}  // namespace

StatusOr<ExecAgentOptions> ParseExecAgentArgs(const std::vector<std::string>& args) {
  std::string manifest_path;
  std::vector<std::string> command;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      command.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (arg == "--manifest") {
      if (i + 1 >= args.size()) return InvalidArgumentError("--manifest: missing value");
      manifest_path = args[++i];
    } else if (arg.rfind("--manifest=", 0) == 0) {
      manifest_path = arg.substr(std::string("--manifest=").size());
    } else if (!arg.empty() && arg[0] == '-') {
      return InvalidArgumentError("unknown flag " + arg + " (the command follows --)");
    } else {
      command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
  }

  std::optional<spec::TrainingJob> job;
  if (!manifest_path.empty()) {
    StatusOr<spec::TrainingJob> loaded = spec::LoadTrainingJobFile(manifest_path);
    if (!loaded.ok()) return loaded.status();
    job = *loaded;
  } else if (const std::string text = EnvString("LOCKSTEP_SPEC", ""); !text.empty()) {
    nlohmann::json document = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (document.is_discarded()) return InvalidArgumentError("LOCKSTEP_SPEC: not valid JSON");
    StatusOr<spec::TrainingJob> parsed = spec::ParseTrainingJobJson(document, "LOCKSTEP_SPEC");
    if (!parsed.ok()) return parsed.status();
    job = *parsed;
  }

  ExecAgentOptions options;
  if (command.empty() && job) command = job->spec.command;
  if (command.empty()) {
    return InvalidArgumentError("no command: give it after -- or in the manifest's spec.command");
  }
  options.command = command;
  options.job = EnvString(
      "LOCKSTEP_JOB", job ? job->metadata.namespace_ + "/" + job->metadata.name : std::string());
  if (options.job.empty()) {
    return InvalidArgumentError("environment variable LOCKSTEP_JOB is not set (and no manifest)");
  }
  StatusOr<rendezvous::ClientOptions> client =
      rendezvous::ClientOptionsFromEnvironment(options.job);
  if (!client.ok()) return client.status();
  options.client = *client;
  // Rank r of a pod of several ranks serves on the pod's port + r.
  const int64_t base_port = EnvInt("LOCKSTEP_METRICS_PORT", job ? job->spec.metrics.port : 0);
  const int64_t metrics_port = base_port == 0 ? 0 : base_port + options.client.local_rank;
  if (metrics_port < 0 || metrics_port > 65535) {
    return InvalidArgumentError("LOCKSTEP_METRICS_PORT " + std::to_string(metrics_port) +
                                " outside 0..65535");
  }
  options.metrics_port = static_cast<int>(metrics_port);
  if (job) {
    options.budget.policy = job->spec.run_policy.restart_policy;
    options.budget.backoff_limit = job->spec.run_policy.backoff_limit;
    options.budget.retryable_exit_codes = job->spec.run_policy.retryable_exit_codes;
    options.network = job->spec.network;
  }
  options.python_path = FindPythonHelpers("/proc/self/exe");
  options.budget.initial_backoff_ms = std::max<int64_t>(0, ExecBackoffMs());
  options.budget.max_backoff_ms = std::max(options.budget.initial_backoff_ms, ExecMaxBackoffMs());
  options.grace_ms = std::max<int64_t>(0, ExecGraceMs());
  options.warm_spare = ExecWarmSpare() != 0;
  options.join_timeout_ms = std::max<int64_t>(1, ExecJoinTimeoutMs());
  options.plan_timeout_ms = std::max<int64_t>(1, ExecPlanTimeoutMs());
  return options;
}

int RunExecAgent(const std::vector<std::string>& args) {
  if (args.size() == 1 && (args[0] == "-h" || args[0] == "--help")) {
    std::cout << kExecUsage;
    return kExitOk;
  }
  auto fail = [](int code, const std::string& message) {
    std::string line = message;
    std::replace(line.begin(), line.end(), '\n', ';');
    std::cerr << "lockstep-worker exec: error: " << line << std::endl;
    return code;
  };
  StatusOr<ExecAgentOptions> options = ParseExecAgentArgs(args);
  if (!options.ok()) {
    std::cerr << kExecUsage;
    return fail(kExitBadInput, options.status().message());
  }
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
