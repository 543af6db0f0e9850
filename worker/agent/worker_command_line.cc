#include "worker/agent/worker_command_line.h"

#include <algorithm>
#include <memory>

#include "common/command_line.h"

namespace lockstep::agent {
namespace {

std::unique_ptr<CLI::App> MakeApp(WorkerMode mode, const std::string& program,
                                  WorkerCommandLine* line) {
  const bool exec = mode == WorkerMode::kExec;
  auto app = std::make_unique<CLI::App>(
      exec ? "Runs COMMAND as this member of the job under the rendezvous, with the environment "
             "PyTorch expects (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, ...), and "
             "restarts it in a new generation when it fails anywhere or membership changes "
             "(docs/exec.md). The command comes after the flags, or from the manifest's "
             "spec.command."
           : "Runs the built-in trainer as this member of the job (the manifest's spec.trainer).",
      program + (exec ? " exec" : " train"));
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->add_option("--manifest", line->manifest_path,
                  "the job's manifest (default: the JSON in $LOCKSTEP_SPEC)")
      ->type_name("FILE");
  if (exec) {
    app->prefix_command();  // the first argument that is not one of ours starts the command
    app->footer("COMMAND [ARG...]: the program, after the flags or after --");
  }
  return app;
}

}  // namespace

StatusOr<WorkerCommandLine> ParseWorkerCommandLine(WorkerMode mode,
                                                   const std::vector<std::string>& args) {
  WorkerCommandLine line;
  std::unique_ptr<CLI::App> app = MakeApp(mode, "lockstep-worker", &line);
  if (mode == WorkerMode::kTrain) {
    // CLI11 takes "--" as the end of the flags and then nothing: train has no program.
    if (std::find(args.begin(), args.end(), "--") != args.end()) {
      return InvalidArgumentError("unexpected argument \"--\" (train runs no program)");
    }
  }
  // CLI11 stops a prefix command at the first positional argument but not at "--": what follows
  // the first "--" is set aside, and put back behind the program if the program began before it.
  std::vector<std::string> flags = args;
  std::vector<std::string> after_dashes;
  bool dashes = false;
  if (mode == WorkerMode::kExec) {
    if (auto it = std::find(args.begin(), args.end(), "--"); it != args.end()) {
      flags.assign(args.begin(), it);
      after_dashes.assign(it + 1, args.end());
      dashes = true;
    }
  }
  const CommandLineParse parsed = ParseCommandLine(*app, flags);
  if (parsed.help) {
    line.help = true;
    return line;
  }
  if (!parsed.error.empty()) return InvalidArgumentError(parsed.error);
  if (mode == WorkerMode::kExec) {
    // The program is the last remaining_size() arguments CLI11 read; Cli11Arguments may have made
    // two of one ("--x=" is "--x" and ""), so they are counted back to the arguments as given,
    // which the program gets unchanged.
    size_t left = app->remaining_size();
    size_t start = flags.size();
    while (left > 0 && start > 0) {
      --start;
      const size_t made = Cli11Arguments({flags[start]}).size();
      left -= std::min(left, made);
    }
    line.command.assign(flags.begin() + static_cast<std::ptrdiff_t>(start), flags.end());
    if (!line.command.empty() && !line.command.front().empty() &&
        line.command.front()[0] == '-') {
      return InvalidArgumentError("unknown flag " + line.command.front() +
                                  " (the command follows --)");
    }
    if (!line.command.empty() && dashes) line.command.push_back("--");
    line.command.insert(line.command.end(), after_dashes.begin(), after_dashes.end());
  }
  return line;
}

std::string WorkerCommandLineHelp(WorkerMode mode, const std::string& program) {
  WorkerCommandLine unused;
  return MakeApp(mode, program, &unused)->help();
}

}  // namespace lockstep::agent
