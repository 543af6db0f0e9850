// ChildProcess: the exec agent's one supervised program (the user's command) for one generation.
//
//   ChildProcess::Options options{.argv = {"/usr/bin/python3", "train.py"}, .env = env,
//                                 .output_prefix = "[rank 1] "};
//   LOCKSTEP_ASSIGN_OR_RETURN(auto child, ChildProcess::Start(options));
//   ... poll(wake pipe) ...; if (auto exit = child->TryReap()) { ... }
//   ChildExit exit = child->Stop(/*grace_ms=*/10000, /*kill_wait_ms=*/5000);
//
// The program runs in its own process group (so stopping it stops whatever it started, and a
// terminal's Ctrl-C reaches only the agent), with PR_SET_PDEATHSIG(SIGKILL) (a SIGKILLed agent
// does not leave it running) and stdin from /dev/null. Its stdout and stderr are relayed line by
// line to the agent's own stdout and stderr, each line prefixed (`[rank N] `), each written with
// one write(2) so lines of several ranks never interleave mid-line.
//
// A command that cannot be executed (not found on PATH, not executable) is reported as an exit
// in the shell's convention: 127 for "not found", 126 for "found but cannot execute", with the
// path and errno in ChildExit::start_error; it is a failure like any other.
//
// Waits are bounded: TryReap never blocks; Stop returns within grace_ms + kill_wait_ms (plus a
// relay drain bound). Thread safety: one thread uses a ChildProcess.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"

namespace lockstep::agent {

// How much of a program's stderr its exit keeps (ChildExit::last_error_lines).
inline constexpr size_t kErrorTailLines = 8;
inline constexpr size_t kErrorTailLineBytes = 240;

// How the program ended.
struct ChildExit {
  bool signaled = false;  // true: killed by `signal`; false: exited with `exit_code`
  int exit_code = 0;
  int signal = 0;
  // Set when the program never ran: "cannot execute /x/train: No such file or directory (errno
  // 2)". exit_code is then 127 (not found) or 126 (not executable).
  std::string start_error;
  // The agent stopped it (generation ended, agent signalled): not the program's own failure.
  bool stopped_by_agent = false;
  // The last lines it wrote to stderr (at most kErrorTailLines, each cut to kErrorTailLineBytes),
  // oldest first: a Python traceback's end, which says why it failed where the exit code cannot.
  std::vector<std::string> last_error_lines;

  bool success() const { return !signaled && exit_code == 0; }
  // The shell's convention: the exit code, or 128 + the signal.
  int ShellStatus() const { return signaled ? 128 + signal : exit_code; }
  // "exit code 3" | "signal 9 (Killed)" | "exit code 127 (cannot execute ...)"
  std::string Describe() const;
};

class ChildProcess {
 public:
  struct Options {
    std::vector<std::string> argv;  // argv[0]: a path, or a name looked up on the env's PATH
    // The complete environment of the program, NAME=value.
    std::vector<std::string> env;
    std::string output_prefix;  // prepended to every relayed line
    // How long Start waits for the exec to succeed or fail (the exec pipe closes on success).
    int64_t exec_timeout_ms = 5000;
    // Signal also reaches the program's descendants that left its group (setsid). Off for a
    // program that stops its own descendants on SIGTERM (a rank's exec agent under the pod
    // supervisor): they would get the signal twice.
    bool signal_descendants = true;
    // A descriptor the program inherits at the same number (the agent's helper channel,
    // helper_channel.h); -1: none. Every other descriptor of the agent is closed on exec.
    int inherit_fd = -1;
    // Moves the program under SCHED_IDLE (cpu_priority.h) once it has been executed: it runs
    // only on CPU time nothing else wants, until LeaveIdlePriority(pid()). For a warm spare,
    // and only where IdlePriorityIsReversible().
    bool idle_priority = false;
  };

  // Forks and execs. Returns an error only when the agent itself cannot (fork, pipes); a program
  // that cannot be executed is a started child whose exit() already holds the 127/126 exit.
  static StatusOr<std::unique_ptr<ChildProcess>> Start(const Options& options);
  // Supervises `pid`, a child of this process that it did not fork itself (a warm spare a zygote
  // forked, zygote.h, reparented to this child subreaper), already the leader of its own process
  // group, as Start supervises what it starts: relays stdout_fd and stderr_fd (read ends; taken
  // over) with options.output_prefix, honours signal_descendants and idle_priority.
  // FailedPrecondition (the descriptors closed) when `pid` is not a child of this process.
  static StatusOr<std::unique_ptr<ChildProcess>> Adopt(pid_t pid, int stdout_fd, int stderr_fd,
                                                       const Options& options);
  // Kills the group (SIGKILL) if still running and joins the relay threads.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return !exit_.has_value(); }
  // The exit, once reaped.
  const std::optional<ChildExit>& exit() const { return exit_; }

  // Reaps the program if it has exited (never blocks). After the leader exits, what is left of
  // its process group is SIGKILLed before the leader is reaped (the group id cannot be reused
  // while the leader is a zombie), so nothing the command started outlives it.
  std::optional<ChildExit> TryReap();
  // Sends `signal` to the program's process group and to every descendant of the program that
  // left the group (setsid).
  void Signal(int signal);
  // The prefix of the lines relayed from now on (a promoted warm spare takes its rank's).
  void SetOutputPrefix(const std::string& prefix);
  // Moves the program and every process it started back from SCHED_IDLE to the normal policy,
  // when Options::idle_priority put it there (otherwise does nothing: a program's own idle
  // threads are its business). Errors: PermissionDenied, Unavailable (cpu_priority.h).
  Status LeaveIdlePriority();
  // Milliseconds since the first SIGTERM (Signal or Stop); -1 before it.
  int64_t MsSinceSigterm() const;
  // Signal(SIGKILL) was called (Stop's escalation included).
  bool sigkill_sent() const { return sigkill_sent_; }
  // SIGTERM to the group (unless one was sent already: the grace runs from the first), up to
  // grace_ms after it for the program to exit, then SIGKILL and up to kill_wait_ms.
  // Returns the exit (stopped_by_agent set unless it had exited before Stop). If the program
  // survives even SIGKILL for kill_wait_ms (uninterruptible sleep), the exit says signal 9 and
  // the zombie is left for the destructor.
  ChildExit Stop(int64_t grace_ms, int64_t kill_wait_ms);

 private:
  ChildProcess() = default;
  void StartRelay(int fd, int target_fd);
  // Moves the program under SCHED_IDLE (Options::idle_priority); a failure is logged, naming it
  // as `shown`, and the program runs at normal priority.
  void EnterIdle(const std::string& shown);
  // Waits (bounded) for the relays to see end-of-file, then stops them.
  void JoinRelays(int64_t timeout_ms);

  pid_t pid_ = -1;
  double sigterm_at_ = -1;  // MonotonicSeconds() of the first SIGTERM
  bool sigkill_sent_ = false;
  bool signal_descendants_ = true;
  bool idle_priority_ = false;  // under SCHED_IDLE since Start (Options::idle_priority)
  std::optional<ChildExit> exit_;
  std::mutex prefix_mu_;
  std::string output_prefix_;  // guarded by prefix_mu_
  std::mutex tail_mu_;
  std::deque<std::string> error_tail_;  // guarded by tail_mu_: stderr's last lines
  std::atomic<bool> stop_relays_{false};
  std::vector<std::thread> relays_;
  std::vector<std::shared_ptr<std::atomic<bool>>> relay_done_;
};

// This process's own environment as NAME=value entries: what a child's Options::env starts from.
std::vector<std::string> CurrentEnvironment();

// Every process below `root` (children, their children, ...), read from /proc. A snapshot: a
// process may start or end while it is read.
std::vector<pid_t> DescendantsOf(pid_t root);

// SIGKILLs and reaps every process below this one, in rounds until none is left or timeout_ms
// passed; returns how many it signalled. For a child subreaper (PR_SET_CHILD_SUBREAPER) whose
// program has ended: what the program left behind (a daemon started with setsid, a process in
// another group) was reparented to it, and ends here. Call it only when no other child of this
// process should live, except the processes in `keep` and their descendants (a command that
// goes on: the warm spare, a program recovered in place).
int EndDescendants(int64_t timeout_ms, const std::vector<pid_t>& keep = {});

// Reaps this process's children that have exited (zombies), except those in `keep` (the
// commands it waits for itself): for a child subreaper, the orphans of the command's descendants
// (a daemon that ends, a grandchild whose parent went first), which would otherwise stay zombies
// until the command ends. Returns how many it reaped. Call it on SIGCHLD.
int ReapExitedOrphans(const std::vector<pid_t>& keep);

}  // namespace lockstep::agent
