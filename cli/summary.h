// The result of one `lockstep run`: what the result block prints and what --summary writes.
//
//   RunSummary summary = ...;
//   LOCKSTEP_RETURN_IF_ERROR(WriteSummaryFile(summary, "/tmp/run.json"));
//
// The JSON object's keys are a contract (docs/cli.md, "Summary file"): steps, world_size,
// final_loss, eval_accuracy, samples_per_second, restarts, generations, resumed_from_step,
// recovery_seconds, wall_seconds, job; plus status, mode, total_steps, log_dir and, after a
// failure, failed_worker and failed_worker_exit.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep::cli {

// A worker the rendezvous service named a straggler during the run (its compute time per step
// well above its peers': common/rendezvous/straggler_detector.h).
struct RunStraggler {
  int32_t worker = -1;     // its index (the N of NAME-worker-N)
  std::string member_id;
  int64_t generation = 0;  // where it was first named
  double ratio = 0;        // the highest seen: its compute time per step over the median
  bool replaced = false;   // spec.elastic.replaceStragglers replaced it
};

// A field the run cannot know is empty (nullopt), written as null and left out of the result
// block: an exec job's program reports steps, loss and samples only if it chooses to
// (docs/exec.md, "Progress"), and never evaluates through Lockstep. The built-in trainer fills
// every field.
struct RunSummary {
  std::string job;                // namespace/name
  std::string status = "failed";  // "succeeded" | "failed" | "interrupted"
  std::string mode = "trainer";   // "trainer" | "exec" (spec.command)
  std::optional<int64_t> steps = 0;  // last step trained
  int64_t total_steps = 0;           // 0: not known
  int32_t world_size = 0;            // of the last generation
  std::optional<double> final_loss = 0;
  std::optional<double> eval_accuracy = -1;     // test accuracy in [0, 1]; -1: not evaluated
  double eval_auc = -1;  // a parameter-server job's test AUC; -1: none (not printed)
  std::optional<double> samples_per_second = 0;  // global, as the workers measured it
  // Trainer: replacement worker processes started. Exec: restarts of the command after
  // failures, as the agents count them against backoffLimit.
  int32_t restarts = 0;
  int64_t generations = 0;                    // rendezvous generations formed
  std::optional<int64_t> resumed_from_step = -1;  // the checkpoint the run resumed from; -1: none
  double recovery_seconds = 0;     // longest time from losing a member to training again
  double wall_seconds = 0;         // from starting the workers to the last one exiting
  std::string log_dir;
  std::string failed_worker;       // member id; empty unless a worker failed
  std::string failed_worker_exit;  // "exit code 1" | "signal 9 (SIGKILL)"
  std::vector<RunStraggler> stragglers;  // in the order they were first named
};

nlohmann::json ToJson(const RunSummary& summary);

// Writes ToJson(summary) to `path` atomically: a temporary file in the same directory, fsync,
// then rename, so a reader sees the old file or the whole new one. Errors name the path.
Status WriteSummaryFile(const RunSummary& summary, const std::string& path);

// "1h 02m 03s" | "4m 05s" | "12.3s"
std::string FormatDuration(double seconds);

// The block printed when a run ends:
//   fashion-mlp succeeded
//     steps            3000 / 3000
//     test accuracy    86.20%
//     ...
void PrintResultBlock(const RunSummary& summary, std::ostream& out);

}  // namespace lockstep::cli
