// Zygote: warm spares (and a standby's program) forked from one Python interpreter that has done
// the command's imports, instead of each started from nothing (python/lockstep/zygote.py has the
// why and the protocol).
//
//   std::optional<std::vector<std::string>> argv = ZygoteArgv(options.argv);
//   if (argv) LOCKSTEP_ASSIGN_OR_RETURN(zygote, Zygote::Start(options, *argv));
//   ... later, without blocking: if (zygote->Ready()) ...
//   LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> spare,
//                             zygote->Fork(spare_options, channel_program_fd));
//
// Every spare is this process's child (it must be a child subreaper) and is supervised like one
// it started itself (ChildProcess::Adopt); it runs nothing before the agent adopted it (the go
// pipe). Fork waits at most kZygoteForkTimeoutMs for the answer, Ready gives the imports
// kZygoteReadyTimeoutMs;
// a zygote that broke the protocol, timed out or died is done (Usable() turns false) and the
// caller starts its processes the ordinary way.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"
#include "worker/agent/child_process.h"

namespace lockstep::agent {

inline constexpr char kZygoteFdEnv[] = "LOCKSTEP_ZYGOTE_FD";
inline constexpr int64_t kZygoteForkTimeoutMs = 5000;
// A zygote whose imports are not done by then (a hung import) is given up.
inline constexpr int64_t kZygoteReadyTimeoutMs = 120000;

// The zygote's command line for a command that is a Python interpreter running a script or a
// module: `python3 -u train.py --lr 0.1` -> `python3 -u -m lockstep.zygote -- train.py --lr 0.1`.
// std::nullopt for anything else (another program, `-c`, a script on stdin, -I or -E, which would
// ignore the PYTHONPATH that finds lockstep.zygote, or an option this does not know).
std::optional<std::vector<std::string>> ZygoteArgv(const std::vector<std::string>& argv);

class Zygote {
 public:
  // Starts `zygote_argv` (ZygoteArgv) with the command's options (environment, output prefix
  // replaced by "[zygote] "); its imports go on in the background.
  static StatusOr<std::unique_ptr<Zygote>> Start(ChildProcess::Options options,
                                                 const std::vector<std::string>& zygote_argv);
  ~Zygote();
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  pid_t pid() const { return process_->pid(); }
  // Its imports are done and it answers forks (never blocks).
  bool Ready();
  // It runs and has kept the protocol.
  bool Usable();
  // Once Ready(): the command's script imports lockstep.elastic in its own text (the zygote read
  // it), the precondition for forking it ahead of a place (python/lockstep/identity.py).
  bool script_imports_elastic() const { return script_imports_elastic_; }
  // Forks a spare with options.env (stdout and stderr relayed with options.output_prefix) and the
  // helper channel `channel_fd` (the program's end; the spare gets its own copy, at the number its
  // LOCKSTEP_AGENT_FD says). Call only when Ready().
  StatusOr<std::unique_ptr<ChildProcess>> Fork(const ChildProcess::Options& options,
                                               int channel_fd);

 private:
  Zygote() = default;
  // Receives one message within timeout_ms; an error marks the zygote broken.
  StatusOr<std::string> Receive(int64_t timeout_ms);
  // Marks the zygote done (once, with a warning): Usable() turns false. Returns `status`.
  Status Broken(Status status);
  void MarkBroken(Status status);

  std::unique_ptr<ChildProcess> process_;
  int control_fd_ = -1;
  bool ready_ = false;
  bool broken_ = false;
  bool script_imports_elastic_ = false;
  Deadline ready_by_ = Deadline::AfterMs(kZygoteReadyTimeoutMs);  // from its construction in Start
};

}  // namespace lockstep::agent
