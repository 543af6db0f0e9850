#include "cli/validate_command.h"

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <vector>

#include "cli/exit_codes.h"
#include "common/command_line.h"
#include "kernels/device.h"
#include "worker/ps/click_log_file.h"
#include "worker/trainer/dataset.h"
#include "worker/trainer/memory_estimate.h"

namespace lockstep::cli {
namespace {

// Adds each line of `text` as a problem, prefixed by the manifest path unless the library
// already did so (the spec parser prefixes its messages with the source).
void AddProblemLines(const std::string& path, const std::string& text,
                     std::vector<std::string>* problems) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (line.rfind(path + ":", 0) == 0) {
      problems->push_back(line);
    } else {
      problems->push_back(path + ": " + line);
    }
  }
}

// The problems listed, plus those the parser only counted: its list ends in "... and N more
// problems" past spec::internal::Problems::kMaxLines.
size_t CountProblems(const std::vector<std::string>& lines) {
  size_t count = lines.size();
  if (lines.empty()) return count;
  const std::string marker = "... and ";
  const size_t at = lines.back().rfind(marker);
  if (at == std::string::npos) return count;
  const std::string rest = lines.back().substr(at + marker.size());
  const size_t more = std::strtoull(rest.c_str(), nullptr, 10);
  if (more == 0 || rest.find(" more problem") == std::string::npos) return count;
  return count - 1 + more;
}

// `lockstep validate`'s command line, defined once for parsing and for --help.
std::unique_ptr<CLI::App> ValidateCommandLine(std::string& path) {
  auto app = std::make_unique<CLI::App>(
      "Checks a TrainingJob manifest and its data; prints every problem, one per line.",
      "lockstep validate");
  app->add_option("FILE", path, "the TrainingJob manifest")->required();
  return app;
}

}  // namespace

ManifestCheck CheckManifest(const std::string& path) {
  ManifestCheck check;
  StatusOr<spec::TrainingJob> job = spec::LoadTrainingJobFile(path);
  if (!job.ok()) {
    AddProblemLines(path, job.status().message(), &check.problems);
    if (check.problems.empty()) check.problems.push_back(path + ": " + job.status().ToString());
    return check;
  }
  check.job = *job;
  for (const std::string& problem : spec::CheckDataFiles(*job)) {
    AddProblemLines(path, problem, &check.problems);
  }
  // Contents are checked only when every file is there: a missing file is already reported, and
  // loading would only repeat it.
  if (check.problems.empty() && job->spec.trainer.has_value() &&
      job->spec.trainer->data.format == spec::DataFormat::kClickLog) {
    // A parameter-server job's click logs: every line read as its workers will.
    const spec::TrainerSpec& trainer = *job->spec.trainer;
    for (const auto& [name, uris] :
         {std::pair<const char*, const std::vector<std::string>*>{"train", &trainer.data.train},
          {"test", &trainer.data.test}}) {
      if (uris->empty()) continue;
      StatusOr<ps::ClickLog> log = ps::ReadClickLogFile(
          std::string("spec.trainer.data.") + name + "[0]",
          spec::ResolveDataPath(*job, uris->front()), trainer.model.embedding->fields);
      if (!log.ok()) AddProblemLines(path, log.status().message(), &check.problems);
    }
    return check;
  }
  if (check.problems.empty() && job->spec.trainer.has_value()) {
    trainer::DataShape shape;
    Status data = trainer::CheckDatasets(*job, &shape);
    if (!data.ok()) {
      AddProblemLines(path, data.message(), &check.problems);
    } else {
      check.rank_memory = trainer::EstimateRankMemory(*job->spec.trainer, shape);
      check.memory_without_pipeline =
          trainer::EstimateRankMemoryWithoutPipeline(*job->spec.trainer, shape);
      std::string problem = CheckPodMemory(job->spec, *check.rank_memory);
      if (!problem.empty()) check.problems.push_back(path + ": " + problem);
    }
  }
  return check;
}

std::string CheckPodMemory(const spec::TrainingJobSpec& spec, const trainer::MemoryEstimate& rank) {
  const int ranks = spec.ranks_per_worker;
  const double pod = rank.total() * ranks;
  const std::string needs = "a pod of " + std::to_string(ranks) +
                            (ranks == 1 ? " rank" : " ranks") + " is estimated to need " +
                            (ranks == 1 ? rank.Describe()
                                        : trainer::FormatBytes(pod) + ", " + std::to_string(ranks) +
                                              " x " + rank.Describe());
  if (!spec.resources.memory.empty()) {
    const double limit = spec::QuantityValue(spec.resources.memory);
    if (pod <= limit) return "";
    return "spec.resources.memory: " + spec.resources.memory + " is too little: " + needs;
  }
  const double machine = trainer::MachineMemoryBytes();
  if (machine <= 0 || pod <= machine) return "";
  return "spec.trainer: too large for this machine's " + trainer::FormatBytes(machine) +
         " of memory: " + needs +
         " (reduce spec.trainer.model.hidden or spec.trainer.batchSize, or set "
         "spec.resources.memory to check against the pods' limit instead)";
}

int RunValidateCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string path;
  std::unique_ptr<CLI::App> app = ValidateCommandLine(path);
  const CommandLineParse parsed = ParseCommandLine(*app, args);
  if (parsed.help) {
    out << app->help();
    return kExitOk;
  }
  if (!parsed.error.empty()) {
    err << "lockstep validate: " << parsed.error << "\n" << app->help();
    return kExitBadInput;
  }
  ManifestCheck check = CheckManifest(path);
  if (!check.ok()) {
    for (const std::string& problem : check.problems) err << problem << "\n";
    const size_t count = CountProblems(check.problems);
    err << path << ": invalid (" << count << (count == 1 ? " problem)" : " problems)") << "\n";
    return kExitBadInput;
  }
  out << path << ": valid\n";
  const spec::TrainingJob& job = *check.job;
  if (check.rank_memory.has_value()) {
    out << path << ": estimated memory per rank: " << check.rank_memory->Describe();
    if (check.rank_memory->stages > 1) {
      out << " with the pipeline; " << check.memory_without_pipeline->Describe() << " without";
    }
    out << "\n";
  }
  if (job.spec.trainer.has_value() && job.spec.trainer->device == spec::Device::kCuda) {
    // Not a problem of the manifest: where it runs decides (a cluster's GPU nodes).
    out << path << ": note: spec.trainer.device is cuda: every worker needs a GPU of its own ("
        << kernels::CudaDeviceCount() << " visible here)\n";
  }
  return kExitOk;
}

}  // namespace lockstep::cli
