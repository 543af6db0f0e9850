// What `lockstep run` does once its workers have ended (run_command.h, step 5): the summary from
// the rendezvous' last snapshot, the result block, the failed worker's last log lines, the exit
// code.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "cli/launcher.h"
#include "cli/run_setup.h"
#include "cli/run_watch.h"
#include "common/rendezvous/job_state.h"

namespace lockstep::cli {

// How the run ended, as the watch and the rendezvous saw it.
struct RunEnd {
  WatchOutcome outcome;
  rendezvous::JobSnapshot snapshot;  // the service's last, taken after the workers ended
  double wall_seconds = 0;
};

// Prints the result block (and, for a failed worker, why and its log's last lines), writes the
// summary to summary_path unless it is empty, and returns the run's exit code (exit_codes.h).
int ReportRun(const LocalRun& run, const RunEnd& end, const Supervisor& supervisor,
              const std::string& summary_path, std::ostream& out, std::ostream& err);

// The last `max_lines` lines of a file (for failure reports); empty when unreadable. Reads at
// most the last 64 KiB.
std::vector<std::string> TailOfFile(const std::string& path, int max_lines);

}  // namespace lockstep::cli
