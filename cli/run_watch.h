// Watching a local run (`lockstep run`): the loop that polls the workers' supervisor and the
// rendezvous snapshot, reports failures, decides restarts and drops, draws progress, and says how
// the run ended.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cli/console_relay.h"
#include "cli/launcher.h"
#include "cli/progress_display.h"
#include "cli/summary.h"
#include "common/rendezvous/server.h"
#include "common/spec/training_job.h"

namespace lockstep::cli {

struct WatchOptions {
  int64_t poll_interval_ms = 250;
  // Fewer than minReplicas alive for this long fails the job (LOCKSTEP_RENDEZVOUS_TIMEOUT_MS).
  int64_t rendezvous_timeout_ms = 30000;
  // Once one worker finished, how long the others may take (LOCKSTEP_RUN_DRAIN_TIMEOUT_MS).
  int64_t drain_ms = 300000;
  // The supervisor's slots 0 .. worker_slots - 1 are the workers; the rest are the job's
  // parameter servers, which serve until the workers are done and whose exit fails the job.
  // -1: every slot is a worker.
  int32_t worker_slots = -1;
};

// How watching a run ended: at most one of failure, failure_reason and interrupt_signal is set;
// none means every worker finished.
struct WatchOutcome {
  std::optional<WorkerExit> failure;  // the worker whose failure ended the job
  std::string failure_policy;         // why it was not restarted ("restartPolicy Never")
  std::string failure_reason;         // a failure that is not a worker's exit
  int interrupt_signal = 0;           // SIGINT or SIGTERM to the launcher
  rendezvous::JobSnapshot snapshot;   // the latest seen
  std::vector<RunStraggler> stragglers;  // every worker named a straggler, in order
};

// Writes one event line (a restart, a world size change) without tearing the progress line.
void PrintEvent(ProgressDisplay& display, std::ostream& out, const std::string& line);

// Polls the supervisor (every options.poll_interval_ms, also the TTY redraw period) and the
// rendezvous snapshot until every worker has finished, the job fails, a signal arrives, or a
// deadline passes. Reports failed workers to the rendezvous service as it sees them, so the
// survivors re-form at once; the restart policy decides whether a replacement follows.
//
// A failure that is not restarted fails the job, except in an elastic job (minReplicas <
// maxReplicas) whose policy declines the restart (Never, ExitCode): there the worker is
// dropped and the job goes on while at least minReplicas are alive. Exit code 2 and an
// exhausted backoffLimit always fail the job. Fewer than minReplicas alive (running, finished,
// or about to be replaced) for longer than the rendezvous timeout fails it too.
//
// An exec job's program lines come from `console` (null: none shown) every poll, printed between
// progress redraws; a restart the agents count is printed as an event when the snapshot shows it.
WatchOutcome WatchUntilDone(const spec::TrainingJob& job, const WatchOptions& options,
                            Supervisor& supervisor, rendezvous::RendezvousServer& server,
                            ProgressDisplay& display, ConsoleRelay* console, std::ostream& out,
                            double started_at);

// Prints what `console` has relayed since its last poll, without tearing the progress line.
void PrintProgramLines(ConsoleRelay& console, ProgressDisplay& display, std::ostream& out);

}  // namespace lockstep::cli
