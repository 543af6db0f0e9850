// Process supervision for `lockstep run`: a Supervisor owns one slot per worker (a member id, the
// command that runs it, its log file) and the process currently filling it.
//
//   Supervisor supervisor(options, std::make_unique<NeverRestart>());
//   LOCKSTEP_RETURN_IF_ERROR(supervisor.Start(workers));
//   while (...) {
//     LOCKSTEP_ASSIGN_OR_RETURN(auto events, supervisor.Poll(/*timeout_ms=*/250));
//     for (const SupervisorEvent& event : events) { ... }
//   }
//   supervisor.StopAll();  // SIGTERM, grace period, SIGKILL; returns within a bounded time
//
// Each worker runs in its own process group (so a terminal's Ctrl-C reaches only `lockstep`,
// which then stops the workers in order, and a worker's own children are stopped with it) and
// with PR_SET_PDEATHSIG, so a `lockstep` that is SIGKILLed does not leave workers running.
// stdin is /dev/null; stdout and stderr go to the slot's log file (appended, so a restarted
// worker's output follows its predecessor's).
//
// Signals: the Supervisor installs handlers for SIGCHLD, SIGINT and SIGTERM that write to a
// self-pipe; Poll wakes on it, reaps exited workers with waitpid(WNOHANG) and reports SIGINT and
// SIGTERM as events. So every wait is a poll(2) with a timeout, never an unbounded waitpid.
//
// Restarts: when a worker exits non-zero and the supervisor is not stopping, the RestartPolicy
// decides whether a replacement with the same member id starts, and after what back-off. The
// replacement starts inside a later Poll once the back-off has passed (Poll never sleeps past its
// timeout for it).
//
// Thread safety: a Supervisor is used from one thread, the one that created it (the workers'
// PR_SET_PDEATHSIG is tied to the thread that forks them, so that thread must outlive them). At
// most one Supervisor exists per process (it owns the signal handlers).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/spec/training_job.h"
#include "common/status.h"

namespace lockstep::cli {

// What runs in one slot.
struct WorkerCommand {
  std::string member_id;          // e.g. "fashion-worker-0"; stays the same across restarts
  std::vector<std::string> argv;  // argv[0] is the absolute path of the program
  // Added to (and overriding) the launcher's own environment.
  std::vector<std::pair<std::string, std::string>> env;
  std::string log_path;  // stdout and stderr of the worker
  // Exec mode: the file its agents write when they give up (LOCKSTEP_TERMINATION_LOG,
  // common/termination_message.h), emptied before each start and read at its exit, as the
  // kubelet does with a container's terminationMessagePath. Empty: none.
  std::string termination_log;
  // False: a failure of this process is never restarted (a parameter server, whose shard of the
  // model would start over); its exit is reported with no_restart_reason saying so.
  bool restartable = true;
};

// How a worker process ended.
struct WorkerExit {
  int slot = 0;
  std::string member_id;
  pid_t pid = 0;
  bool signaled = false;  // true: killed by `signal`; false: exited with `exit_code`
  int exit_code = 0;
  int signal = 0;
  std::string termination_message;  // what it left in its termination_log (at most 4096 bytes)

  bool success() const { return !signaled && exit_code == 0; }
  // "exit code 2" | "signal 9 (Killed)"
  std::string Describe() const;
  // The shell's convention: the exit code, or 128 + the signal.
  int ShellStatus() const { return signaled ? 128 + signal : exit_code; }
};

// Decides whether a failed worker is replaced (`lockstep run` uses RunPolicyRestarts).
class RestartPolicy {
 public:
  struct Decision {
    bool restart = false;
    int64_t backoff_ms = 0;  // delay before the replacement starts
    // When not restarting: why, for the user ("restartPolicy Never", "backoffLimit 3 reached").
    std::string refusal;
  };
  virtual ~RestartPolicy() = default;
  // Called for every non-zero exit while the supervisor is not stopping. `restarts_so_far` counts
  // the replacements already started for the whole job (Kubernetes' backoffLimit is per job).
  virtual Decision OnWorkerFailed(const WorkerExit& exit, int32_t restarts_so_far) = 0;
};

class NeverRestart : public RestartPolicy {
 public:
  Decision OnWorkerFailed(const WorkerExit&, int32_t) override { return {}; }
};

// restartPolicy OnFailure with backoffLimit: restarts any failure until `backoff_limit`
// replacements have been started; the back-off doubles from `initial_backoff_ms` up to
// `max_backoff_ms`, like Kubernetes' pod restart back-off.
class RestartOnFailure : public RestartPolicy {
 public:
  RestartOnFailure(int32_t backoff_limit, int64_t initial_backoff_ms, int64_t max_backoff_ms)
      : backoff_limit_(backoff_limit),
        initial_backoff_ms_(initial_backoff_ms),
        max_backoff_ms_(max_backoff_ms) {}
  Decision OnWorkerFailed(const WorkerExit& exit, int32_t restarts_so_far) override;

 private:
  int32_t backoff_limit_;
  int64_t initial_backoff_ms_;
  int64_t max_backoff_ms_;
};

// spec.runPolicy as `lockstep run` applies it (docs/cli.md, "Restarts"):
//  - exit code 2 (the worker found its input bad) is never retried: a replacement would find
//    the same input;
//  - OnFailure: any other failure, exit code or signal, is retried;
//  - ExitCode: only retryable failures are: 130, 137, 143 (SIGINT, SIGKILL, SIGTERM: the
//    process was stopped from outside, not broken) and spec.runPolicy.retryableExitCodes;
//  - Never: nothing is retried;
//  - at most backoffLimit replacements for the whole job; the back-off doubles from
//    initial_backoff_ms up to max_backoff_ms;
//  - workers_restart_their_commands (exec agents): an agent restarts its command itself, drawing
//    on the job's one backoffLimit, and exits only when that budget is spent or the policy
//    refuses; replacing it would start the command again past the bound. So an agent that exited
//    is never replaced; one killed by a signal (its process lost, as a pod is) is, by the rules
//    above.
class RunPolicyRestarts : public RestartPolicy {
 public:
  RunPolicyRestarts(spec::RunPolicy policy, int64_t initial_backoff_ms, int64_t max_backoff_ms,
                    bool workers_restart_their_commands = false)
      : policy_(std::move(policy)),
        initial_backoff_ms_(initial_backoff_ms),
        max_backoff_ms_(max_backoff_ms),
        workers_restart_their_commands_(workers_restart_their_commands) {}
  Decision OnWorkerFailed(const WorkerExit& exit, int32_t restarts_so_far) override;

 private:
  spec::RunPolicy policy_;
  int64_t initial_backoff_ms_;
  int64_t max_backoff_ms_;
  bool workers_restart_their_commands_;
};

struct SupervisorEvent {
  enum class Kind {
    kWorkerExited,     // `exit` is set; `restart_scheduled` says whether a replacement will start
    kWorkerRestarted,  // a replacement started for `exit.slot` (exit.pid is the new pid)
    kSignal,           // `signal` (SIGINT or SIGTERM) was delivered to the launcher
  };
  Kind kind = Kind::kWorkerExited;
  WorkerExit exit;
  bool restart_scheduled = false;
  // The worker was stopped by Replace: its replacement starts at once and is not a restart.
  bool replaced = false;
  int64_t restart_backoff_ms = 0;  // when restart_scheduled
  std::string no_restart_reason;   // a failed exit that is not restarted: the policy's refusal
  int signal = 0;
};

struct SupervisorOptions {
  // Between SIGTERM and SIGKILL in StopAll. Longer: workers get time to leave cleanly (and flush
  // a checkpoint); shorter: a hung worker delays Ctrl-C less.
  int64_t grace_period_ms = 5000;
  // After SIGKILL, how long StopAll still waits to reap (a process in uninterruptible sleep can
  // outlive SIGKILL for a while; it is reported, not waited for forever).
  int64_t kill_wait_ms = 5000;
  // Poll's bound on starting a process: exec failures are reported through a pipe within this.
  int64_t exec_timeout_ms = 5000;
};

class Supervisor {
 public:
  Supervisor(SupervisorOptions options, std::unique_ptr<RestartPolicy> policy);
  // Stops every worker still running (StopAll) and restores the signal handlers.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Installs the signal handlers and starts one worker per command, slot i for commands[i].
  // On failure (a log file cannot be opened, exec fails) the workers already started are
  // stopped and the error names the member and the cause.
  Status Start(const std::vector<WorkerCommand>& commands);

  // Waits up to timeout_ms for a worker to exit or a signal to arrive, then reaps every exited
  // worker, starts replacements whose back-off has passed, and returns what happened (possibly
  // nothing). Returns early as soon as there is an event.
  StatusOr<std::vector<SupervisorEvent>> Poll(int64_t timeout_ms);

  // SIGTERM to every running worker's process group, up to grace_period_ms for them to exit,
  // SIGKILL to the rest, then up to kill_wait_ms to reap them. Cancels pending restarts. Returns
  // the exits it reaped (those of stopped workers: usually 143 or signal 9). A SIGINT or SIGTERM
  // arriving during the grace period (a second Ctrl-C) sends SIGKILL at once. Idempotent.
  std::vector<WorkerExit> StopAll();

  // Drops the scheduled restarts of slots [0, end) (the job is completing: a worker's
  // replacement is not needed; a parameter server's, in a later slot, still is).
  void CancelPendingRestarts(int end);

  // Sends `signal` to one worker's process group (tests use it to simulate failures).
  Status SignalWorker(int slot, int signal);

  // Replaces a running worker on purpose (a straggler): SIGKILL to its process group; its exit
  // is reported with `replaced` set, and its replacement starts at the next Poll without asking
  // the RestartPolicy and without counting in restarts().
  Status Replace(int slot);

  int32_t running() const;           // slots with a live process
  // Slots in [0, end) waiting out a back-off before their replacement.
  int32_t pending_restarts(int end) const;
  int32_t restarts() const { return restarts_; }
  pid_t pid(int slot) const;  // 0 when the slot has no live process
  const WorkerCommand& command(int slot) const { return slots_[slot].command; }
  int32_t size() const { return static_cast<int32_t>(slots_.size()); }
  bool stopping() const { return stopping_; }

 private:
  struct Slot {
    WorkerCommand command;
    pid_t pid = 0;  // 0: not running
    bool restart_pending = false;
    double restart_at = 0;  // MonotonicSeconds()
    bool replacing = false;  // Replace stopped it; its restart is not counted
  };

  StatusOr<pid_t> Spawn(const WorkerCommand& command);
  // Reaps every slot whose process has exited; appends kWorkerExited events.
  void Reap(std::vector<SupervisorEvent>* events);
  void StartDueRestarts(std::vector<SupervisorEvent>* events);
  // Waits on the self-pipe for at most timeout_ms; keeps any SIGINT/SIGTERM it drains in
  // pending_signals_ for the next Poll (SIGCHLD only wakes the wait).
  void WaitForSignals(int64_t timeout_ms);

  SupervisorOptions options_;
  std::unique_ptr<RestartPolicy> policy_;
  std::vector<Slot> slots_;
  std::vector<int> pending_signals_;
  int32_t restarts_ = 0;
  bool stopping_ = false;
  bool handlers_installed_ = false;
};

}  // namespace lockstep::cli
