// ExecAgent (exec_agent_impl.h): what the agents agree on in each generation, through the
// generation's store: the join (interruptible by a signal), rank 0's plan and the others' wait
// for it, and every member's previous command stopped before anyone starts the next.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "common/deadline.h"
#include "common/logging.h"
#include "worker/agent/exec_agent_impl.h"
#include "worker/agent/exec_environment.h"
#include "worker/agent/wake_pipe.h"

namespace lockstep::agent::exec_agent_internal {

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
    // A standby (the generation is full) waits here for a place; a signal ends the process.
    StatusOr<rendezvous::Assignment> result =
        rendezvous::JoinOrStandBy(*client, /*state_step=*/-1, timeout_ms, {});
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->result = std::move(result);
    }
    Wake(kWakeJoinDone);
  });
  const Deadline prepare = Deadline::AfterMs(kPrepareWhileJoiningMs);
  bool prepared = false;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->result.has_value()) break;
    }
    if (!prepared && prepare.expired()) {
      prepared = true;
      PrepareWhileJoining();
    }
    if (prepared && options_.program_ahead) StartProgramAhead();
    // A zygote started meanwhile says when its imports are done (or that it died) only when asked.
    const bool importing = zygote_ && !zygote_->Ready() && zygote_->Usable();
    int64_t wait_ms = importing ? 200
                      : prepared ? 1000
                                 : std::clamp<int64_t>(prepare.remaining_ms(), 1, 1000);
    if (stopping_ && !stopping_->sigkill_sent()) {
      wait_ms =
          std::clamp<int64_t>(options_.grace_ms - stopping_->MsSinceSigterm() + 1, 1, wait_ms);
    }
    const Events events = WaitForEvents(wait_ms);
    DriveStop();
    if (events.signal != 0 || pending_signal_ != 0) {
      const int signal_number = pending_signal_ != 0 ? pending_signal_ : events.signal;
      LOCKSTEP_LOG(WARNING) << "received signal " << signal_number
                            << " while joining; leaving and exiting";
      StopEveryProgram();
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
  plan.master_addr = a.first_host.empty() ? options_.client.host : a.first_host;
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
    StatusOr<std::vector<std::string>> values =
        store->Get(keys, std::min(kPlanPollSliceMs, std::max<int64_t>(1, deadline.remaining_ms())));
    if (values.ok()) return values;
    if (values.status().code() != StatusCode::kDeadlineExceeded) return values.status();
    const Events events = WaitForEvents(0);
    if (events.signal != 0 && pending_signal_ == 0) pending_signal_ = events.signal;
    if (pending_signal_ != 0) return CancelledError("signal while waiting for " + what);
    if (GenerationEnded(a.generation))
      return AbortedError("generation ended while waiting for " + what);
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
  LOCKSTEP_ASSIGN_OR_RETURN(const int64_t stopped,
                            store->Add(kStoppedCountKey, 1, options_.store_timeout_ms));
  if (stopped == a.world_size) {
    LOCKSTEP_RETURN_IF_ERROR(store->Set(kAllStoppedKey, "1", options_.store_timeout_ms));
  }
  // Each member stops its command within its grace and kill wait of the generation's end.
  return AwaitKeys(a, {kAllStoppedKey},
                   options_.grace_ms + options_.kill_wait_ms + options_.plan_timeout_ms,
                   "every member's previous command to stop")
      .status();
}

}  // namespace lockstep::agent::exec_agent_internal
