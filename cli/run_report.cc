#include "cli/run_report.h"

#include <algorithm>
#include <csignal>
#include <fstream>
#include <optional>

#include "cli/exit_codes.h"
#include "cli/summary.h"

namespace lockstep::cli {
namespace {

constexpr int kFailureLogLines = 20;

void FillSummaryFromSnapshot(const rendezvous::JobSnapshot& snapshot, bool exec,
                             RunSummary* summary) {
  const rendezvous::ProgressReport& last = snapshot.progress;
  const rendezvous::ProgressReport& final_progress = snapshot.final_progress;
  const bool have_final = snapshot.completed_members > 0 && final_progress.step > 0;
  const rendezvous::ProgressReport& best = have_final ? final_progress : last;
  summary->mode = exec ? "exec" : "trainer";
  summary->steps = std::max(last.step, final_progress.step);
  summary->total_steps = std::max(last.total_steps, final_progress.total_steps);
  summary->final_loss = best.loss;
  summary->samples_per_second =
      best.samples_per_second > 0 ? best.samples_per_second : last.samples_per_second;
  summary->eval_accuracy =
      final_progress.eval_accuracy >= 0 ? final_progress.eval_accuracy : last.eval_accuracy;
  summary->eval_auc = final_progress.eval_auc >= 0 ? final_progress.eval_auc : last.eval_auc;
  summary->generations = snapshot.generations_formed;
  summary->resumed_from_step = std::max(last.resumed_from_step, final_progress.resumed_from_step);
  summary->recovery_seconds = snapshot.longest_recovery_seconds;
  summary->world_size = snapshot.world_size;
  if (summary->world_size == 0 && !snapshot.history.empty()) {
    summary->world_size = snapshot.history.back().world_size;
  }
  if (exec) {
    // What the program did not report stays unknown, never a 0 that reads like a measurement;
    // the agents count the restarts (the launcher replaces none of them).
    summary->restarts = std::max(last.restarts, final_progress.restarts);
    if (*summary->steps == 0) summary->steps.reset();
    if (!summary->steps.has_value() || (!best.has_loss && !last.has_loss)) {
      summary->final_loss.reset();
    } else if (!best.has_loss) {
      summary->final_loss = last.loss;
    }
    if (*summary->samples_per_second <= 0) summary->samples_per_second.reset();
    summary->eval_accuracy.reset();
    summary->resumed_from_step.reset();
  }
}

void PrintWorkerFailure(const WorkerExit& exit, const std::string& policy,
                        const std::string& log_path, std::ostream& err) {
  err << "lockstep: worker " << exit.member_id << " (pid " << exit.pid
      << ") failed: " << exit.Describe() << "; not restarted: " << policy << "\n";
  std::vector<std::string> tail = TailOfFile(log_path, kFailureLogLines);
  if (tail.empty()) {
    err << "lockstep: its log " << log_path << " is empty\n";
    return;
  }
  err << "--- last " << tail.size() << " lines of " << log_path << " ---\n";
  for (const std::string& line : tail) err << line << "\n";
  err << "---\n";
}

}  // namespace

int ReportRun(const LocalRun& run, const RunEnd& end, const Supervisor& supervisor,
              const std::string& summary_path, std::ostream& out, std::ostream& err) {
  const WatchOutcome& outcome = end.outcome;
  RunSummary summary;
  summary.job = run.key;
  summary.log_dir = run.log_dir;
  summary.wall_seconds = end.wall_seconds;
  summary.restarts = supervisor.restarts();
  FillSummaryFromSnapshot(end.snapshot, run.exec, &summary);
  summary.stragglers = outcome.stragglers;
  int exit_code = kExitOk;
  const std::optional<WorkerExit>& failure = outcome.failure;
  if (outcome.interrupt_signal != 0) {
    summary.status = "interrupted";
    exit_code = outcome.interrupt_signal == SIGINT ? kExitInterrupted : kExitTerminated;
  } else if (failure) {
    summary.status = "failed";
    summary.failed_worker = failure->member_id;
    summary.failed_worker_exit = failure->Describe();
    PrintWorkerFailure(*failure, outcome.failure_policy, supervisor.command(failure->slot).log_path,
                       err);
    // Exit 2 from a worker means it found its input bad; pass that on so scripts can tell a
    // broken manifest from a crash.
    exit_code =
        !failure->signaled && failure->exit_code == kExitBadInput ? kExitBadInput : kExitFailure;
  } else if (!outcome.failure_reason.empty()) {
    summary.status = "failed";
    err << "lockstep: " << outcome.failure_reason << "\n";
    exit_code = kExitFailure;
  } else {
    summary.status = "succeeded";
  }
  PrintResultBlock(summary, out);
  if (!summary_path.empty()) {
    if (Status status = WriteSummaryFile(summary, summary_path); !status.ok()) {
      err << "lockstep run: summary: " << status.message() << "\n";
      if (exit_code == kExitOk) exit_code = kExitFailure;
    }
  }
  return exit_code;
}

std::vector<std::string> TailOfFile(const std::string& path, int max_lines) {
  std::vector<std::string> lines;
  std::ifstream file(path, std::ios::binary);
  if (!file) return lines;
  constexpr std::streamoff kMaxBytes = 64 * 1024;
  file.seekg(0, std::ios::end);
  const std::streamoff size = file.tellg();
  const std::streamoff start = std::max<std::streamoff>(0, size - kMaxBytes);
  file.seekg(start);
  std::string line;
  if (start > 0) std::getline(file, line);  // drop the partial first line
  while (std::getline(file, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > max_lines) lines.erase(lines.begin());
  }
  return lines;
}

}  // namespace lockstep::cli
