// ExecAgent (exec_agent_impl.h): the programs' lives across generations: the previous
// generation's command stopped while the agent joins the next (SIGTERM, SIGKILL after the
// grace), what it left behind ended, a helper program's in-place handover (it leaves its
// generation and goes on), and the warm spare that replaces a failed one.
#include <signal.h>

#include <algorithm>
#include <optional>

#include "common/cpu_priority.h"
#include "common/deadline.h"
#include "common/logging.h"
#include "worker/agent/exec_agent_impl.h"
#include "worker/agent/exec_environment.h"
#include "worker/agent/wake_pipe.h"

namespace lockstep::agent::exec_agent_internal {

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
    if (command != nullptr && command->process().running())
      live.push_back(command->process().pid());
  }
  if (zygote_) live.push_back(zygote_->pid());
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
    if (exit && spare_->ahead_of_place()) {
      // It ended before it had a place: whatever it is, it does not wait in the helper.
      LOCKSTEP_LOG(WARNING) << "the command forked ahead (pid " << spare_->process().pid()
                            << ") ended before it had a place: " << exit->Describe()
                            << (spare_->awaited_variable().empty()
                                    ? std::string()
                                    : " (it had read " + spare_->awaited_variable() + ")")
                            << "; this member's command starts when it has one";
      spare_.reset();
      ahead_refused_ = true;
      return;
    }
    if (exit) {
      ++spare_deaths_;
      const int64_t backoff_ms =
          std::min<int64_t>(kSpareMaxBackoffMs, kSpareBackoffMs << std::min(spare_deaths_ - 1, 16));
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
  // Its start-up (imports: seconds of a core) takes only CPU time the training ranks leave;
  // promotion undoes it. Where it could not be undone the spare starts at normal priority.
  options.idle_priority = options_.spare_at_idle_priority && IdlePriorityIsReversible();
  if (ForkSpare(options)) return;
  StatusOr<std::unique_ptr<SupervisedCommand>> spare = SupervisedCommand::Start(options);
  if (!spare.ok()) {
    LOCKSTEP_LOG(WARNING) << "warm spare: " << spare.status();
    spare_not_before_ = MonotonicSeconds() + static_cast<double>(kSpareMaxBackoffMs) / 1000;
    return;
  }
  spare_ = std::move(*spare);
  LOCKSTEP_LOG(INFO) << "started a warm spare (pid " << spare_->process().pid() << ")";
}

bool ExecAgent::ForkSpare(const ChildProcess::Options& options) {
  if (!EnsureZygote(options)) return false;
  if (!zygote_->Ready()) return zygote_->Usable();  // still importing: the spare comes later
  spare_ = ForkFromZygote(options);
  if (!spare_) return false;
  LOCKSTEP_LOG(INFO) << "forked a warm spare (pid " << spare_->process().pid()
                     << ") from the zygote";
  return true;
}

bool ExecAgent::EnsureZygote(const ChildProcess::Options& options) {
  // A spare at idle priority is the other answer to its imports' cost: each does them idle.
  if (!options_.zygote || options_.spare_at_idle_priority) return false;
  if (!zygote_ && !zygote_tried_) {
    zygote_tried_ = true;
    std::optional<std::vector<std::string>> argv = ZygoteArgv(options.argv);
    if (!argv) return false;  // not a Python script or module: spares start from nothing
    // What its imports may read of the environment is the job's, never a generation's (a
    // module that kept a RANK read at import would keep it in every process forked from it).
    ChildProcess::Options zygote_options = options;
    zygote_options.env = BuildAwaitingEnvironment(inherited_env_, Extras());
    StatusOr<std::unique_ptr<Zygote>> zygote = Zygote::Start(zygote_options, *argv);
    if (!zygote.ok()) {
      LOCKSTEP_LOG(WARNING) << "zygote: " << zygote.status() << "; processes start without it";
      return false;
    }
    zygote_ = std::move(*zygote);
    LOCKSTEP_LOG(INFO) << "started a zygote (pid " << zygote_->pid()
                       << "): the command's imports, done once for the processes it forks";
  }
  if (zygote_ && !zygote_->Usable()) zygote_.reset();
  return zygote_ != nullptr;
}

std::unique_ptr<SupervisedCommand> ExecAgent::ForkFromZygote(
    const ChildProcess::Options& options) {
  if (!zygote_ || !zygote_->Ready()) return nullptr;
  StatusOr<std::unique_ptr<SupervisedCommand>> forked = SupervisedCommand::Fork(*zygote_, options);
  if (!forked.ok()) {
    zygote_.reset();  // it said why (Broken); what follows starts the ordinary way
    return nullptr;
  }
  return std::move(*forked);
}

void ExecAgent::PrepareWhileJoining() {
  if (zygote_ || zygote_tried_) return;
  // The environment of no generation yet: what the imports may read of it is the command's own.
  if (EnsureZygote(CommandOptions(rendezvous::Assignment{}, GenerationPlan{}))) {
    LOCKSTEP_LOG(INFO) << "the join waits; the command's imports are done meanwhile (zygote pid "
                       << zygote_->pid() << ")";
  }
}

void ExecAgent::StartProgramAhead() {
  ReapDeadSpare();
  if (spare_ && spare_->ahead_of_place()) {
    if (RefusedForAskingEarly()) return;
    if (!spare_->said_hello() &&
               MonotonicSeconds() - ahead_forked_at_ > kAheadHelloMs / 1000.0) {
      // What runs this long without a place and without asking for one is no start-up.
      RefuseProgramAhead("did not reach lockstep.elastic's run() within " +
                         std::to_string(kAheadHelloMs / 1000) + " s");
    }
    return;
  }
  if (ahead_refused_ || started_a_program_ || spare_ || active_ || stopping_ || !zygote_ ||
      !zygote_->Ready() || MonotonicSeconds() < spare_not_before_) {
    return;
  }
  if (!zygote_->script_imports_elastic()) {
    ahead_refused_ = true;
    LOCKSTEP_LOG(INFO) << "the script does not import lockstep.elastic, so it cannot wait for a "
                          "place in it: the command starts when this member has one";
    return;
  }
  ChildProcess::Options options;
  options.argv = options_.command;
  options.env = BuildAwaitingEnvironment(inherited_env_, Extras());
  options.output_prefix = "[spare] ";
  spare_ = ForkFromZygote(options);
  if (!spare_) return;
  spare_->set_ahead_of_place();
  ahead_forked_at_ = MonotonicSeconds();
  LOCKSTEP_LOG(INFO) << "forked " << options_.command[0] << " (pid " << spare_->process().pid()
                     << ") ahead of a place: its start-up runs while the join waits";
}

bool ExecAgent::RefusedForAskingEarly() {
  spare_->Absorb();
  if (spare_->awaited_variable().empty()) return false;
  RefuseProgramAhead("read " + spare_->awaited_variable() +
                     " before it reached lockstep.elastic's run()");
  return true;
}

void ExecAgent::RefuseProgramAhead(const std::string& why) {
  // Not a program that waits for its place in the helper: it starts when one comes.
  LOCKSTEP_LOG(INFO) << "the command forked ahead (pid " << spare_->process().pid() << ") " << why
                     << "; it is ended, and this member's command starts when it has a place";
  spare_->process().Stop(/*grace_ms=*/0, options_.kill_wait_ms);
  spare_.reset();
  ahead_refused_ = true;
}

ChildProcess::Options ExecAgent::CommandOptions(const rendezvous::Assignment& a,
                                                const GenerationPlan& plan) const {
  ChildProcess::Options options;
  options.argv = options_.command;
  options.env = BuildExecEnvironment(inherited_env_, a, plan, Extras());
  options.output_prefix = "[rank " + std::to_string(a.rank) + "] ";
  return options;
}

ExecEnvironmentExtras ExecAgent::Extras() const {
  ExecEnvironmentExtras extras;
  extras.run_id = options_.job;
  extras.max_restarts = options_.budget.backoff_limit;
  extras.progress_file = progress_.path();
  extras.python_path = options_.python_path;
  extras.state_snapshot = state_snapshot_;
  return extras;
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
  } else if (ReapDeadSpare(), DropSpareNotWaitingInHelper(), spare_) {
    active_ = std::move(spare_);
    started_a_program_ = true;
    spare_deaths_ = 0;
    if (Status normal = active_->process().LeaveIdlePriority(); !normal.ok()) {
      LOCKSTEP_LOG(WARNING) << "the promoted warm spare trains at idle CPU priority: " << normal;
    }
    active_->process().SetOutputPrefix(prefix);
    tracker_.StartProcess();
    LOCKSTEP_LOG(INFO) << "promoted the warm spare (pid " << active_->process().pid()
                       << ", MASTER_ADDR " << plan.master_addr << ", MASTER_PORT "
                       << plan.master_port << ", restart " << plan.restart_count << ")";
  } else {
    active_.reset();
    started_a_program_ = true;
    tracker_.StartProcess();
    // A zygote that is ready (a standby's, or a spare's that died) has the imports done.
    const char* how = "forked from the zygote";
    if (!(active_ = ForkFromZygote(options))) {
      how = "started";
      LOCKSTEP_ASSIGN_OR_RETURN(active_, SupervisedCommand::Start(options));
    }
    LOCKSTEP_LOG(INFO) << how << " " << options_.command[0] << " (pid "
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

void ExecAgent::DropSpareNotWaitingInHelper() {
  if (!spare_ || !spare_->ahead_of_place() || RefusedForAskingEarly()) return;
  if (spare_->said_hello() && spare_->recoverable()) return;
  // Still in its start-up: what it did so far (a checkpoint it read, perhaps long ago) nothing
  // would reconcile.
  LOCKSTEP_LOG(INFO) << "the command forked ahead (pid " << spare_->process().pid()
                     << ") is not waiting in lockstep.elastic's run() yet; it is ended and the "
                        "command starts anew";
  spare_->process().Stop(/*grace_ms=*/0, options_.kill_wait_ms);
  spare_.reset();
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

}  // namespace lockstep::agent::exec_agent_internal
