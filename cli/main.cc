// `lockstep`: the command-line entry point. Subcommands live in their own files; this one only
// dispatches and prints the usage.
#include <iostream>
#include <string>
#include <vector>

#include "cli/exit_codes.h"
#include "cli/run_command.h"
#include "cli/validate_command.h"
#include "worker/checkpoint/ckpt_command.h"

namespace {

constexpr char kUsage[] =
    "usage: lockstep COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  run FILE [--replicas N] [--summary FILE] [--log-dir DIR]\n"
    "                   run a TrainingJob on this machine\n"
    "  validate FILE    check a TrainingJob manifest and its data\n"
    "  ckpt ls URI [--checksums]\n"
    "                   list the checkpoints under URI (file:// or hdfs://) and their validity\n"
    "  ckpt verify URI [--step N]\n"
    "                   check the newest (or step N) checkpoint against its manifest\n"
    "  help             show this message\n"
    "  version          show the version\n"
    "\n"
    "Exit codes: 0 success, 1 failure, 2 bad input or usage, 130 interrupted, 143 terminated.\n"
    "See docs/cli.md.\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return lockstep::cli::kExitBadInput;
  }
  const std::string command = args.front();
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "run") return lockstep::cli::RunRunCommand(rest, std::cout, std::cerr);
  if (command == "validate") return lockstep::cli::RunValidateCommand(rest, std::cout, std::cerr);
  if (command == "ckpt") return lockstep::checkpoint::RunCkptCommand(rest, std::cout, std::cerr);
  if (command == "help" || command == "-h" || command == "--help") {
    std::cout << kUsage;
    return lockstep::cli::kExitOk;
  }
  if (command == "version" || command == "--version") {
    std::cout << "lockstep " << LOCKSTEP_VERSION << "\n";
    return lockstep::cli::kExitOk;
  }
  std::cerr << "lockstep: unknown command \"" << command << "\"\n" << kUsage;
  return lockstep::cli::kExitBadInput;
}
