// The command lines of `lockstep-worker train` and of `exec` (lockstep-worker's and the agent's),
// read with CLI11 as every other program's are (common/command_line.h):
//
//   lockstep-worker train [--manifest FILE]
//   lockstep-worker exec [--manifest FILE] [--] COMMAND [ARG...]
//
// exec's COMMAND starts at "--" or at the first argument that is not one of exec's flags; from
// there on every argument is the program's, "--help" and "--" included. An unknown flag before it
// is refused: a program's own flag belongs after "--".
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep::agent {

enum class WorkerMode { kTrain, kExec };

struct WorkerCommandLine {
  std::string manifest_path;         // "": the manifest is LOCKSTEP_SPEC's, if any
  std::vector<std::string> command;  // exec: the program and its arguments, as given
  bool help = false;                 // --help or -h (before the program)
};

// `args` are those after the mode's name. InvalidArgument names the flag or the value.
StatusOr<WorkerCommandLine> ParseWorkerCommandLine(WorkerMode mode,
                                                   const std::vector<std::string>& args);

// The mode's --help, generated from the flags' definitions. `program`: "lockstep-worker" or the
// agent's name.
std::string WorkerCommandLineHelp(WorkerMode mode, const std::string& program);

}  // namespace lockstep::agent
