// How the exec agents of one job agree on restarts: which failures count against
// spec.runPolicy.backoffLimit, what TORCHELASTIC_RESTART_COUNT is, when to give up, and the
// master port of each generation.
//
// Protocol (one agent per member; the rendezvous generation g is the unit of agreement)
// -----------------------------------------------------------------------------------------
// 1. Forming g. Every agent Joins. When Join returns g, rank 0's agent writes g's plan under the
//    key "exec/plan" of g's store; every other agent reads it (waiting, bounded, and giving up the
//    wait when g ends). A plan holds the master address and port, restart_count (failure
//    restarts before g: TORCHELASTIC_RESTART_COUNT), the back-off to wait before starting, and
//    give_up with the last failure when no restart is left. All agents act on the same plan, so
//    they cannot disagree on the count or on giving up.
// 2. A failure in g. An agent whose command exits non-zero or is killed by a signal, without the
//    agent having stopped it, records the failure in g's own store BEFORE it does anything else:
//      Add("exec/failures", 1); the agent whose Add returned 1 also sets "exec/first_failure"
//      (who failed and how). Then it Joins again while its heartbeat stream for g is still open:
//    a member of the active generation joining again ends g for everyone at once (the proto's
//    rule), and because the stream is still open the agent stays one of g's survivors, so g+1
//    waits for it instead of forming without it and being ended again by its late Join.
// 3. Everyone else learns on its heartbeat stream (GENERATION_ENDED), sends its command SIGTERM
//    and Joins at once, while the command stops (SIGKILL after the grace period): a command that
//    takes seconds to stop does not keep its agent from g+1, which would otherwise form without
//    it and be ended by its late Join, for ever. A command that died on its own before its agent
//    heard of the end (a peer's crash breaks the collective) records a failure too; the count is
//    per generation, so this does not count twice.
// 3b. Before starting its command in g+1, each agent waits until its previous command has
//    stopped, adds one to "stopped/count" in g+1's store (the agent that completes the world
//    sets "stopped/all"), and waits for "stopped/all" (bounded: grace + kill wait + plan
//    timeout, given up when g+1 ends): no command of g+1 starts while one of g still runs
//    (ports, GPU memory, files).
// 4. Forming g+1, rank 0 reads g's keys: the service keeps g's store readable while g+1 is
//    current, for exactly this hand-over. Every agent that recorded a failure did so before its
//    Join, and g+1 forms only once all of g's survivors have joined, so by then every failure of
//    g is in the store. restart_count(g+1) = restart_count(g) + (failures(g) > 0 ? 1 : 0), where
//    restart_count(g) is the larger of g's plan and what rank 0 itself last saw (g's plan is
//    missing only when g's rank 0 died before writing it). restartPolicy decides whether the
//    failure may be retried at all (Never: no; ExitCode: only the retryable codes), then
//    backoffLimit bounds the count; past it the plan says give_up and every agent exits with
//    the failure's status.
// 5. Membership changes (a member joined, left, or its agent died: the heartbeat stream broke,
//    heartbeats were missed, the launcher or operator removed it) end g without a failure record,
//    so they restart the command without using up a restart (torchrun's rule).
// 6. A command that exits 0 makes its agent Leave(completed): that does not end g, and the
//    others keep running until their commands exit (the job succeeds when every rank exits 0).
//
// Back-off: a member's first failure is restarted at once (recovery speed), its later ones wait
// initial_backoff_ms doubling up to max_backoff_ms, so a command that fails at once cannot spin;
// a failure of another member is not slowed by the first one's history.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/rendezvous/kv_store.h"
#include "common/spec/training_job.h"
#include "common/status.h"

namespace lockstep::agent {

inline constexpr char kPlanKey[] = "exec/plan";
inline constexpr char kFailuresKey[] = "exec/failures";
inline constexpr char kFirstFailureKey[] = "exec/first_failure";

// One member's failed command, as recorded in the ending generation's store.
struct FailureRecord {
  std::string member_id;
  int32_t rank = 0;
  int shell_status = 1;     // exit code, or 128 + signal
  std::string description;  // "exit code 3" | "signal 9 (Killed)" | ... with the reason
  // The failures of this member's command so far, this one included; decides the back-off
  // (0: unknown, from an older agent: the job's restart count decides).
  int32_t member_failures = 0;
  // The command's last lines on stderr (ChildExit::last_error_lines), which the plan's message
  // quotes: what reaches the job's condition when the agents give up.
  std::vector<std::string> last_lines;
};

// The most of a failure's last lines a plan's message quotes: the message ends up in a pod's
// termination message, of which the operator keeps the first 1 KiB.
inline constexpr size_t kQuotedLinesBytes = 600;

// Rank 0's decision for a generation, shared through its store.
struct GenerationPlan {
  int64_t generation = 0;
  std::string master_addr;
  int32_t master_port = 0;
  int32_t restart_count = 0;  // failure restarts before this generation
  int64_t backoff_ms = 0;     // wait this long before starting the command
  bool give_up = false;       // no restart left: every agent exits with exit_status
  int exit_status = 0;        // when give_up: the failure's shell status
  std::string message;        // when give_up: why, with the last failure
};

struct RestartBudget {
  spec::RestartPolicy policy = spec::RestartPolicy::kOnFailure;
  int32_t backoff_limit = 6;  // failure restarts allowed (spec.runPolicy.backoffLimit)
  std::vector<int32_t> retryable_exit_codes;  // ExitCode policy, beside 130, 137, 143
  int64_t initial_backoff_ms = 1000;
  int64_t max_backoff_ms = 30000;
};

// The plan's restart fields for the generation after one that ended with `failure` (nullopt: a
// membership change), when `restarts_before` failure restarts had happened. Pure: the unit of
// the accounting above. Address and port are left for the caller.
GenerationPlan DecideNextGeneration(const RestartBudget& budget, int32_t restarts_before,
                                    const std::optional<FailureRecord>& failure);

// The ExitCode policy's rule: 130, 137, 143 (interrupted, killed, terminated: the pod was
// disturbed, not the program wrong) and the listed codes are retried.
bool IsRetryableExit(int shell_status, const std::vector<int32_t>& retryable_exit_codes);

// Back-off before restart number `restart_count` (1-based): 0 for the first.
int64_t BackoffMs(const RestartBudget& budget, int32_t restart_count);

std::string EncodePlan(const GenerationPlan& plan);
StatusOr<GenerationPlan> DecodePlan(const std::string& text);
std::string EncodeFailure(const FailureRecord& failure);
StatusOr<FailureRecord> DecodeFailure(const std::string& text);

// Step 2: records `failure` in the ending generation's store. Each call returns within
// timeout_ms per store call.
Status RecordFailure(rendezvous::KeyValueStore& ending_generation, const FailureRecord& failure,
                     int64_t timeout_ms);

// What rank 0 reads of the previous generation's store for step 4.
struct PreviousGeneration {
  std::optional<int32_t> restart_count;  // from its plan, when it had one
  std::optional<FailureRecord> failure;  // its first failure, when any failed
  // Its plan, when that plan gave up: the job is over, and a later generation (replacement pods
  // the operator starts for agents that exited) gives up the same way without starting the
  // command, so the job's starts stay within backoffLimit + 1.
  std::optional<GenerationPlan> gave_up;
};
// Never waits for a key that may never come: the plan and the failure counter are read without
// waiting; the first failure's details, which the first failing agent writes right after its
// Add, are waited for up to timeout_ms. A store that no longer has the generation reads as empty.
PreviousGeneration ReadPreviousGeneration(rendezvous::KeyValueStore& previous, int64_t timeout_ms);

}  // namespace lockstep::agent
