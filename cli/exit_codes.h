// Exit codes of the `lockstep` command (docs/cli.md lists them for users).
#pragma once

namespace lockstep::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;   // a worker failed, or the launcher could not run the job
constexpr int kExitBadInput = 2;  // usage error, invalid manifest or data, or a worker's bad input
constexpr int kExitInterrupted = 130;  // SIGINT (Ctrl-C): 128 + 2, as a shell reports it
constexpr int kExitTerminated = 143;   // SIGTERM: 128 + 15

}  // namespace lockstep::cli
