#include "cli/run_watch.h"

#include <algorithm>
#include <csignal>
#include <iomanip>
#include <set>
#include <sstream>
#include <string>

#include "cli/exit_codes.h"
#include "cli/summary.h"
#include "common/deadline.h"

namespace lockstep::cli {

namespace {

ProgressSample SampleFrom(const rendezvous::JobSnapshot& snapshot, bool exec, int32_t running,
                          int32_t restarts, double elapsed) {
  ProgressSample sample;
  sample.steps_reported = !exec || snapshot.progress.step > 0;
  sample.has_loss = snapshot.progress.has_loss;
  sample.step = snapshot.progress.step;
  sample.total_steps = snapshot.progress.total_steps;
  sample.loss = snapshot.progress.loss;
  sample.samples_per_second = snapshot.progress.samples_per_second;
  sample.world_size = snapshot.world_size;
  sample.generation = snapshot.generation;
  sample.generation_active = snapshot.generation_active;
  sample.workers_running = running;
  sample.restarts = restarts;
  sample.elapsed_seconds = elapsed;
  return sample;
}

}  // namespace

// Writes one event line (a restart, a world size change) without tearing the progress line.
void PrintEvent(ProgressDisplay& display, std::ostream& out, const std::string& line) {
  display.Clear();
  out << "lockstep: " << line << "\n" << std::flush;
}

void PrintProgramLines(ConsoleRelay& console, ProgressDisplay& display, std::ostream& out) {
  const std::vector<std::string> lines = console.Poll();
  if (lines.empty()) return;
  display.Clear();
  for (const std::string& line : lines) out << line << "\n";
  out << std::flush;
}

// Prints the stragglers the service names or clears in the latest snapshot and records each
// in the outcome (its highest ratio). `replace` (spec.elastic.replaceStragglers, while the job
// trains): a newly named one is replaced (Supervisor::Replace: not a restart), once per worker:
// on one machine a slowdown that outlives a new process belongs to the machine.
void ReportStragglers(WatchOutcome& outcome, bool replace, Supervisor& supervisor,
                      std::set<std::string>& named_now, ProgressDisplay& display,
                      std::ostream& out) {
  auto worker_of = [&](const rendezvous::StragglerInfo& straggler) {
    for (int slot = 0; slot < supervisor.size(); ++slot) {
      const std::string& id = supervisor.command(slot).member_id;
      if (id == straggler.member_id || id == straggler.pod) return slot;
    }
    return -1;
  };
  auto recorded_as = [&](const std::string& member_id) -> RunStraggler* {
    for (RunStraggler& recorded : outcome.stragglers) {
      if (recorded.member_id == member_id) return &recorded;
    }
    return nullptr;
  };
  std::set<std::string> named;
  for (const rendezvous::StragglerInfo& straggler : outcome.snapshot.stragglers) {
    named.insert(straggler.member_id);
    RunStraggler* recorded = recorded_as(straggler.member_id);
    if (recorded == nullptr) {
      outcome.stragglers.push_back(RunStraggler{worker_of(straggler), straggler.member_id,
                                                outcome.snapshot.generation, straggler.ratio});
      recorded = &outcome.stragglers.back();
    } else {
      recorded->ratio = std::max(recorded->ratio, straggler.ratio);
    }
    if (named_now.count(straggler.member_id) != 0) continue;
    const int worker = worker_of(straggler);
    std::ostringstream line;
    line << "straggler: worker " << worker << " (" << straggler.member_id << ", rank "
         << straggler.rank << ") computes " << std::fixed << std::setprecision(1)
         << straggler.ratio << "x the median time per step of its peers";
    if (replace && recorded->replaced) {
      line << "; not replaced again (a new process was as slow: the machine is)";
    } else if (replace && worker >= 0 && supervisor.pid(worker) != 0) {
      if (Status replaced = supervisor.Replace(worker); replaced.ok()) {
        line << "; replacing it (spec.elastic.replaceStragglers)";
        recorded->replaced = true;
      } else {
        line << "; cannot replace it: " << replaced.message();
      }
    }
    PrintEvent(display, out, line.str());
  }
  for (const std::string& member_id : named_now) {
    if (named.count(member_id) != 0 || !outcome.snapshot.generation_active) continue;
    const RunStraggler* recorded = recorded_as(member_id);
    const int32_t worker = recorded == nullptr ? -1 : recorded->worker;
    PrintEvent(display, out,
               "worker " + std::to_string(worker) + " (" + member_id +
                   ") is no longer a straggler");
  }
  named_now = std::move(named);
}

WatchOutcome WatchUntilDone(const spec::TrainingJob& job, const WatchOptions& options,
                            Supervisor& supervisor, rendezvous::RendezvousServer& server,
                            ProgressDisplay& display, ConsoleRelay* console, std::ostream& out,
                            double started_at) {
  WatchOutcome outcome;
  const bool exec = !job.spec.trainer.has_value();
  int32_t agent_restarts = 0;  // exec: the restarts the agents counted, as printed so far
  const std::string job_key = job.metadata.namespace_ + "/" + job.metadata.name;
  const bool elastic = job.spec.elastic.min_replicas < job.spec.elastic.max_replicas;
  const int32_t min_alive = job.spec.elastic.min_replicas;
  const int64_t rendezvous_timeout_ms = options.rendezvous_timeout_ms;
  const int workers = options.worker_slots >= 0 ? options.worker_slots : supervisor.size();
  std::vector<bool> finished(workers, false);
  std::vector<bool> dropped(workers, false);
  auto running_workers = [&] {
    int32_t running = 0;
    for (int slot = 0; slot < workers; ++slot) running += supervisor.pid(slot) != 0 ? 1 : 0;
    return running;
  };
  // Once a worker completed training (Leave(completed) or exit 0), replacements are no longer
  // needed: pending restarts are cancelled, a replacement outside the final generation is
  // stopped, and its exit (the rendezvous refuses it, or our SIGTERM) is not a failure.
  // Workers of the first start of a job without standbys are never stopped this way: they finish
  // on their own. With standbys any worker outside the final generation is let go.
  bool completing = false;
  std::vector<bool> replaced(workers, false);
  auto needed_by_a_completing_job = [&](int slot) {
    return !replaced[slot] && job.spec.elastic.standby == 0;
  };
  auto in_final_generation = [&](const std::string& member_id) {
    for (const auto& member : outcome.snapshot.members) {
      if (member.member_id == member_id || member.pod == member_id) return true;
    }
    return false;
  };
  std::optional<Deadline> active_deadline;
  if (job.spec.run_policy.active_deadline_seconds.has_value()) {
    active_deadline = Deadline::AfterMs(*job.spec.run_policy.active_deadline_seconds * 1000);
  }
  std::optional<Deadline> drain_deadline;
  std::set<std::string> named_now;  // stragglers of the current generation, as printed
  double below_min_since = -1;  // MonotonicSeconds() since fewer than min_alive; -1: not
  while (true) {
    StatusOr<std::vector<SupervisorEvent>> events = supervisor.Poll(options.poll_interval_ms);
    if (!events.ok()) {
      outcome.failure_reason = events.status().message();
      return outcome;
    }
    for (const SupervisorEvent& event : *events) {
      switch (event.kind) {
        case SupervisorEvent::Kind::kSignal:
          if (outcome.interrupt_signal == 0) outcome.interrupt_signal = event.signal;
          break;
        case SupervisorEvent::Kind::kWorkerExited: {
          if (event.exit.slot >= workers) {
            // A parameter server: restarted from its shard's checkpoint, or the shard is lost.
            if (event.restart_scheduled) {
              PrintEvent(display, out,
                         "parameter server " + event.exit.member_id + " failed (" +
                             event.exit.Describe() + "); it restarts" +
                             (exec ? "" : " from its shard's newest checkpoint") + " in " +
                             FormatDuration(event.restart_backoff_ms / 1000.0) +
                             (exec ? "" : ", the workers wait for its shard"));
            } else if (outcome.failure_reason.empty()) {
              outcome.failure_reason =
                  "parameter server " + event.exit.member_id + " (pid " +
                  std::to_string(event.exit.pid) + ") exited with " + event.exit.Describe() +
                  (supervisor.command(event.exit.slot).restartable
                       ? " and is not restarted (" + event.no_restart_reason + ")"
                       : ": its shard of the model is lost (set spec.checkpoint.uri to restart "
                         "a lost server from its shard's checkpoint)") +
                  "; its log is " + supervisor.command(event.exit.slot).log_path;
            }
            break;
          }
          if (event.replaced) {  // a straggler, stopped on purpose; its replacement is due
            server.RemoveMember(job_key, event.exit.member_id, "replaced as a straggler");
            break;
          }
          if (event.exit.success()) {
            finished[event.exit.slot] = true;
            completing = true;
            if (!drain_deadline) drain_deadline = Deadline::AfterMs(options.drain_ms);
            break;
          }
          if (completing && !needed_by_a_completing_job(event.exit.slot) &&
              !in_final_generation(event.exit.member_id)) {
            dropped[event.exit.slot] = true;  // a late replacement, or a standby
            break;
          }
          // The launcher is the failure detector on one machine: the generation ends now, not
          // after a heartbeat timeout.
          server.RemoveMember(job_key, event.exit.member_id,
                              "process exited with " + event.exit.Describe());
          if (event.restart_scheduled) {
            PrintEvent(display, out,
                       "worker " + event.exit.member_id + " failed (" + event.exit.Describe() +
                           "); the others train on; replacement " +
                           std::to_string(supervisor.restarts() + 1) + " of backoffLimit " +
                           std::to_string(job.spec.run_policy.backoff_limit) + " starts in " +
                           FormatDuration(event.restart_backoff_ms / 1000.0));
            break;
          }
          const bool bad_input = !event.exit.signaled && event.exit.exit_code == kExitBadInput;
          // The job's budget is spent: by the launcher's count, or by the exec agents' own (an
          // agent exits only then, or when the policy refuses).
          const bool limit_reached =
              event.no_restart_reason.find("backoffLimit") != std::string::npos ||
              event.no_restart_reason.find("its agents gave up") != std::string::npos;
          if (elastic && !bad_input && !limit_reached && event.exit.exit_code != 127) {
            dropped[event.exit.slot] = true;
            PrintEvent(display, out,
                       "worker " + event.exit.member_id + " failed (" + event.exit.Describe() +
                           ") and is not replaced (" + event.no_restart_reason +
                           "); the job goes on while at least minReplicas " +
                           std::to_string(min_alive) + " workers are alive");
            break;
          }
          if (!outcome.failure) {
            outcome.failure = event.exit;
            outcome.failure_policy = event.no_restart_reason.empty()
                                         ? "its replacement could not start"
                                         : event.no_restart_reason;
          }
          break;
        }
        case SupervisorEvent::Kind::kWorkerRestarted:
          if (event.exit.slot >= workers) {
            PrintEvent(display, out,
                       "started parameter server " + event.exit.member_id + " again (pid " +
                           std::to_string(event.exit.pid) + ", restart " +
                           std::to_string(supervisor.restarts()) + ")");
            break;
          }
          replaced[event.exit.slot] = true;
          PrintEvent(display, out,
                     "started replacement for " + event.exit.member_id + " (pid " +
                         std::to_string(event.exit.pid) +
                         (event.replaced ? ", a straggler's: not a restart)"
                                         : ", restart " + std::to_string(supervisor.restarts()) +
                                               ")"));
          break;
      }
    }
    if (StatusOr<rendezvous::JobSnapshot> latest = server.Snapshot(job_key); latest.ok()) {
      outcome.snapshot = *latest;
      // Once a worker completed, nobody is replaced: the job is draining.
      const bool replace = job.spec.elastic.replace_stragglers && !completing &&
                           outcome.snapshot.completed_members == 0;
      ReportStragglers(outcome, replace, supervisor, named_now, display, out);
    }
    if (console != nullptr) PrintProgramLines(*console, display, out);
    if (exec && outcome.snapshot.progress.restarts > agent_restarts) {
      agent_restarts = outcome.snapshot.progress.restarts;
      PrintEvent(display, out,
                 "restart " + std::to_string(agent_restarts) + " of backoffLimit " +
                     std::to_string(job.spec.run_policy.backoff_limit) +
                     ": a command failed and is restarted (in place where it uses lockstep.elastic; the worker logs say how)");
    }
    if (outcome.interrupt_signal != 0 || outcome.failure || !outcome.failure_reason.empty()) {
      return outcome;
    }
    if (outcome.snapshot.completed_members > 0) completing = true;
    if (completing) {
      supervisor.CancelPendingRestarts(workers);
      for (int slot = 0; slot < workers; ++slot) {
        if (finished[slot] || dropped[slot]) continue;
        if (supervisor.pid(slot) == 0) {
          // Failed, and its replacement (if one was pending) was just cancelled: the job is
          // completing without it. Waiting for it would only run into the minReplicas timeout.
          dropped[slot] = true;
          continue;
        }
        if (needed_by_a_completing_job(slot)) continue;
        if (in_final_generation(supervisor.command(slot).member_id)) continue;
        if (supervisor.SignalWorker(slot, SIGTERM).ok()) dropped[slot] = true;
      }
    }
    int32_t finished_count = 0, settled = 0;
    for (size_t i = 0; i < finished.size(); ++i) {
      finished_count += finished[i] ? 1 : 0;
      settled += finished[i] || dropped[i] ? 1 : 0;
    }
    const double now = MonotonicSeconds();
    const auto draw = [&] {
      display.Update(SampleFrom(outcome.snapshot, exec, running_workers(),
                                exec ? agent_restarts : supervisor.restarts(), now - started_at),
                     now);
    };
    if (settled == workers && finished_count > 0) {
      // A generation that formed since the last poll is still reported ("world size 3 -> 2"):
      // a job may finish within one poll of a change.
      draw();
      return outcome;
    }
    // Finished workers count as alive: a job that is completing is not short of members.
    const int32_t alive = running_workers() + supervisor.pending_restarts(workers) + finished_count;
    // A completing job is draining, not short of members: the drain deadline governs it.
    if (alive >= min_alive || completing) {
      below_min_since = -1;
    } else if (below_min_since < 0) {
      below_min_since = now;
    } else if ((now - below_min_since) * 1000.0 >= static_cast<double>(rendezvous_timeout_ms)) {
      outcome.failure_reason = "only " + std::to_string(alive) + " of minReplicas " +
                               std::to_string(min_alive) + " workers alive for " +
                               FormatDuration(rendezvous_timeout_ms / 1000.0) +
                               " (LOCKSTEP_RENDEZVOUS_TIMEOUT_MS)";
      return outcome;
    }
    if (active_deadline && active_deadline->expired()) {
      outcome.failure_reason = "spec.runPolicy.activeDeadlineSeconds (" +
                               std::to_string(*job.spec.run_policy.active_deadline_seconds) +
                               ") exceeded";
      return outcome;
    }
    if (drain_deadline && drain_deadline->expired()) {
      outcome.failure_reason = "a worker finished but the others did not within " +
                               std::to_string(options.drain_ms / 1000) + " s";
      return outcome;
    }
    draw();
  }
}

}  // namespace lockstep::cli
