// ExecAgent: the state and loop behind RunExecAgent (exec_agent.h), one object per agent
// process. Its methods are defined by concern, so that a reader finds each where they would look:
//   exec_agent.cc       the generation loop (Run), supervising the running command, giving up
//   exec_generation.cc  what the agents agree on in each generation through its store: the join,
//                       rank 0's plan, every member's previous command stopped
//                       (restart_protocol.h has the protocol)
//   exec_programs.cc    the programs' lives across generations: stopping the previous command,
//                       a helper program's in-place handover, warm spares
// Internal to worker/agent.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/rendezvous/client.h"
#include "common/status.h"
#include "worker/agent/child_process.h"
#include "worker/agent/exec_agent.h"
#include "worker/agent/exec_environment.h"
#include "worker/agent/exec_metrics.h"
#include "worker/agent/progress_file.h"
#include "worker/agent/restart_protocol.h"
#include "worker/agent/supervised_command.h"

namespace lockstep::agent::exec_agent_internal {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

// Read from the wake pipe: signal numbers, and these for the agent's own events.
inline constexpr unsigned char kWakeGenerationEnded = 0xF0;
inline constexpr unsigned char kWakeJoinDone = 0xF1;
// A join that waits this long (a standby's, or one whose peers are slow to come) has the
// command's imports done meanwhile in a zygote (PrepareWhileJoining). Shorter than that, the
// imports would only compete with the program's own start.
inline constexpr int64_t kPrepareWhileJoiningMs = 5000;
// A program forked ahead of a place that has not reached lockstep.elastic's run() by then is
// ended (and not forked ahead again): a start-up does not run this long.
inline constexpr int64_t kAheadHelloMs = 120000;
// Non-rank-0 agents poll for the plan in slices this long, checking for the generation's end.
inline constexpr int64_t kPlanPollSliceMs = 500;
// How long rank 0 waits for the first failure's details (written right after its counter).
inline constexpr int64_t kFailureDetailsWaitMs = 2000;
// Bound on ending what a finished command left behind (EndDescendants).
inline constexpr int64_t kEndDescendantsMs = 2000;
// The generation-store counter each agent adds one to once its previous command has stopped; the
// agent whose add completes the world sets kAllStoppedKey, which every agent waits for before it
// starts its command. (A key per agent would make each of N agents wait for N keys.)
inline constexpr char kStoppedCountKey[] = "stopped/count";
inline constexpr char kAllStoppedKey[] = "stopped/all";

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
inline constexpr int64_t kSpareBackoffMs = 1000;
inline constexpr int64_t kSpareMaxBackoffMs = 60000;

// Waits up to timeout_ms for anything on the wake pipe, then drains it.
Events WaitForEvents(int64_t timeout_ms);

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
  // Forks the spare from the zygote (started on first use) where the command allows it; false:
  // start it the ordinary way. Sets spare_, or leaves it empty while the zygote imports.
  bool ForkSpare(const ChildProcess::Options& options);
  // Starts the zygote for the command of `options` once, where the command is Python and
  // options_.zygote. True: there is a usable zygote (ready or still importing).
  bool EnsureZygote(const ChildProcess::Options& options);
  // The command forked from a ready zygote; null when there is none or the fork failed (the
  // zygote is then dropped).
  std::unique_ptr<SupervisedCommand> ForkFromZygote(const ChildProcess::Options& options);
  // This member's join waits (it stands by, or its peers are slow to come): its command's
  // imports are done ahead in a zygote, so that the program it starts once the join returns
  // (taking a failed member's place, for a standby) does not wait for them.
  void PrepareWhileJoining();
  // For a member that has not started a program yet, once its zygote is ready and says the
  // script imports lockstep.elastic: forks the command ahead of a place (spare_), without the
  // generation's variables (BuildAwaitingEnvironment). It runs its start-up; StartOrAssign
  // promotes it if it waits in the helper's elastic entry point (python/lockstep/identity.py says
  // why only then). One that asks for its rank first, or ends, is ended and not forked again.
  void StartProgramAhead();
  // Ends the program forked ahead (spare_), saying `why`; the command is not forked ahead again.
  void RefuseProgramAhead(const std::string& why);
  // Absorbs what the program forked ahead (spare_) said, and refuses it if it read one of its
  // identity's variables before reaching the helper's elastic entry point. True: it did (spare_
  // is gone).
  bool RefusedForAskingEarly();
  // At a place: a program forked ahead that is not waiting in the helper's elastic entry point
  // (still in its start-up, or it asked for its rank before) is ended; the command starts anew.
  void DropSpareNotWaitingInHelper();
  // The command's options in generation a (its environment: exec_environment.h).
  ChildProcess::Options CommandOptions(const rendezvous::Assignment& a,
                                       const GenerationPlan& plan) const;
  ExecEnvironmentExtras Extras() const;
  // The programs that go on (active_, spare_, the zygote): what EndLeftovers and ReapOrphans must
  // spare.
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
  // Stops the previous command, the running one (with its grace) and the warm spare (bounded).
  void StopEveryProgram();
  int GiveUp(int status, const std::string& message);
  // The job's budget is spent or its policy refuses a retry: also tells the operator so
  // (common/termination_message.h), which then fails the job instead of replacing the pod.
  int GiveUpForGood(int status, const std::string& message);

  ExecAgentOptions options_;
  // The agent's own environment with the image's loader variables back (parked_loader.h), read
  // once in Run: what every program it starts inherits.
  std::vector<std::string> inherited_env_;
  std::unique_ptr<rendezvous::RendezvousClient> client_;
  std::unique_ptr<ExecMetrics> metrics_;
  ProgressFileReader progress_;
  ProgressTracker tracker_;
  // This member's pace for straggler detection (RendezvousClient::SetPace), from the program's
  // own account of its compute time: cumulative over the programs this agent ran (a program
  // started again counts from 0, so its counts are added to what its predecessors reached).
  struct Pace {
    int64_t base_steps = 0;  // what earlier programs reached
    double base_compute = 0;
    int64_t first_step = -1;  // the current program's first reported step
    int64_t last_step = 0;    // its last
    double last_compute = 0;
  };
  Pace pace_;
  std::string state_snapshot_;  // LOCKSTEP_STATE_SNAPSHOT: the helper's copy of its state
  std::atomic<int64_t> ended_generation_{0};
  int pending_signal_ = 0;
  int32_t known_restarts_ = 0;
  int32_t own_failures_ = 0;
  ChildExit last_exit_;
  std::unique_ptr<ChildProcess> stopping_;
  std::unique_ptr<SupervisedCommand> active_;  // the command of the current generation
  // A warm spare of a helper program, or a program forked ahead of a place (StartProgramAhead).
  std::unique_ptr<SupervisedCommand> spare_;
  ChildProcess::Options spare_options_;        // how the last program was started
  int spare_deaths_ = 0;                       // spares that died unused, in a row
  double spare_not_before_ = 0;                // MonotonicSeconds
  std::unique_ptr<Zygote> zygote_;             // forks the spares of a Python command
  bool zygote_tried_ = false;                  // started once; not again after it failed
  bool ahead_refused_ = false;      // the command cannot wait ahead of a place: not again
  bool started_a_program_ = false;  // this member started (or promoted) its command once
  double ahead_forked_at_ = 0;      // MonotonicSeconds of the fork ahead of a place
};

}  // namespace lockstep::agent::exec_agent_internal
