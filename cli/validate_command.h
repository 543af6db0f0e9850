// `lockstep validate FILE`: every problem of a manifest and its data, one per line.
//
// Checks, in order: the manifest parses and validates (spec::LoadTrainingJobFile, which reports
// all schema problems at once); its data files exist and are readable (spec::CheckDataFiles);
// and, when they are, their contents load (trainer::CheckDatasets: truncated IDX files, bad CSV
// cells, ...); and a pod's estimated memory fits (CheckPodMemory). `lockstep run` runs the same
// checks before it starts anything.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common/spec/training_job.h"
#include "worker/trainer/memory_estimate.h"

namespace lockstep::cli {

struct ManifestCheck {
  std::optional<spec::TrainingJob> job;  // set when the manifest parsed
  // One per line, each starting with "<path>: " and naming the field or file.
  std::vector<std::string> problems;
  // What one rank of the built-in trainer is estimated to hold; set when the data loaded.
  std::optional<trainer::MemoryEstimate> rank_memory;  // with a pipeline: its largest stage's
  std::optional<trainer::MemoryEstimate> memory_without_pipeline;
  bool ok() const { return job.has_value() && problems.empty(); }
};

// Blocks on file I/O: loading the data sets costs what a worker's start-up does (a few hundred
// milliseconds for Fashion-MNIST).
ManifestCheck CheckManifest(const std::string& path);

// "" when a pod of spec.ranksPerWorker ranks, each holding `rank`, fits in spec.resources.memory
// (when set) or else in this machine's memory; otherwise the problem, naming the field, the limit
// and the estimate.
std::string CheckPodMemory(const spec::TrainingJobSpec& spec, const trainer::MemoryEstimate& rank);

// Runs the command: prints "<FILE>: valid" on `out` and returns 0, or prints every problem on
// `err` and returns 2. Usage errors print the usage on `err` and return 2.
int RunValidateCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace lockstep::cli
