// What `lockstep run` shows of an exec job's program: the lines each agent writes to its worker's
// log with a "[rank N] " prefix (the command's stdout and stderr), followed as the logs grow and
// printed on the console, as torchrun's --tee does; the logs keep everything.
//
//   ConsoleRelay relay({"/logs/worker-0.log", "/logs/worker-1.log"}, ConsoleRanks::kAll);
//   for (const std::string& line : relay.Poll()) PrintLine(line);   // every poll interval
//
// Lines of other origin (the agent's own log) are not relayed, nor what the logs held before the
// relay was made (an earlier run's, in a reused --log-dir): make it before the workers start.
// Bounded: at most 1 MiB is read from each log and 8 MiB in all per Poll (call again until it
// returns nothing to drain), and a line is cut into pieces of about 64 KiB rather than held whole.
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep::cli {

enum class ConsoleRanks { kAll, kRankZero, kNone };

// "all" | "rank0" | "none" (--console); InvalidArgument naming the flag otherwise.
StatusOr<ConsoleRanks> ParseConsoleRanks(const std::string& text);

class ConsoleRelay {
 public:
  ConsoleRelay(const std::vector<std::string>& log_paths, ConsoleRanks ranks);

  // The program's lines appended since the last call, log by log, each without its newline.
  std::vector<std::string> Poll();
  // Whether the last Poll read anything (relayed or not): a drain polls until it did not.
  bool read_last_poll() const { return read_last_poll_; }

 private:
  struct Log {
    std::string path;
    int64_t offset = 0;
    std::string partial;       // the start of a line whose newline has not come yet
    bool continuation = false;  // `partial` continues a cut line; relay it if its head was
    bool relaying = false;      // the head of the cut line was relayed
  };
  bool Wanted(const std::string& line) const;
  void Take(Log& log, std::string piece, bool complete, std::vector<std::string>& out) const;

  std::vector<Log> logs_;
  ConsoleRanks ranks_;
  bool read_last_poll_ = false;
};

}  // namespace lockstep::cli
