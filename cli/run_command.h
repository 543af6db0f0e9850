// `lockstep run FILE [--replicas N] [--summary FILE] [--log-dir DIR] [--console WHO]`: runs a
// TrainingJob on this machine, with no cluster.
//
// What it does, in order (docs/cli.md is the user's version):
//  1. Checks the manifest and its data exactly as `lockstep validate` does; any problem: exit 2
//     before anything starts.
//  2. Hosts the rendezvous service in-process on 127.0.0.1 (a free port) with a fresh random
//     256-bit job token, and registers the job (min/max members from spec.elastic).
//  3. Writes the effective manifest (replicas override applied, data paths made absolute) to
//     DIR/manifest.json and starts N `lockstep-worker train --manifest DIR/manifest.json`
//     processes, the binary next to this one, each logging to DIR/worker-<i>.log.
//  4. Shows live progress from rank 0's heartbeats (and an exec job's program lines, rank by
//     rank as --console says) until every worker has exited, a worker fails
//     (exit 1, or 2 when the worker reported bad input), or SIGINT/SIGTERM arrives (130/143); in
//     the last two cases every other worker is stopped (SIGTERM, then SIGKILL after a grace
//     period) before `lockstep` exits.
//  5. Prints a result block and, with --summary, writes the summary JSON (cli/summary.h).
//
// Steps 1 to 3 are in run_setup.h, step 4 in run_watch.h, step 5 in run_report.h.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cli/console_relay.h"
#include "common/spec/training_job.h"
#include "common/status.h"

namespace lockstep::cli {

struct RunOptions {
  std::string manifest_path;
  std::optional<int32_t> replicas;            // overrides spec.replicas
  std::string summary_path;                   // empty: no summary file
  std::string log_dir;                        // empty: DefaultLogDir
  ConsoleRanks console = ConsoleRanks::kAll;  // whose program lines an exec job shows
  bool help = false;                          // --help or -h: print RunUsage(), run nothing
};

// `lockstep run --help`: generated from the flags' definitions (CLI11).
std::string RunUsage();

// Parses the arguments after "run"; InvalidArgument says what is wrong (the caller adds usage).
StatusOr<RunOptions> ParseRunArgs(const std::vector<std::string>& args);

// Runs the command; returns the process exit code (exit_codes.h).
int RunRunCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace lockstep::cli
