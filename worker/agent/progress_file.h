// ProgressFile: how a program run by the exec agent reports its training progress.
//
// The agent sets LOCKSTEP_PROGRESS_FILE to a path in a private temporary directory; the program
// appends one JSON object per line, e.g.
//   {"step": 120, "samples": 7680, "loss": 0.41, "total_steps": 600, "compute_seconds": 31.5,
//    "time": 1795000000.25}
// (every field optional but "step"; unknown fields are ignored; python/lockstep/progress.py
// writes them). The agent reads the lines added
// since its last read every heartbeat interval and reports the newest through the rendezvous
// heartbeat (so `lockstep run`'s display and the operator's status.progress show it) and to its
// metrics. A file rather than a socket: appending a line is one call in any language, needs no
// connection handling in the program, and survives the agent reading late.
//
// Thread safety: one thread uses a ProgressFileReader.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/rendezvous/client.h"

namespace lockstep::agent {

struct ProgressLine {
  int64_t step = 0;
  int64_t samples = -1;  // -1: not given
  double loss = 0;
  bool has_loss = false;
  int64_t total_steps = -1;  // -1: not given
  // This process's time computing so far (forward, backward, optimizer; not waiting on
  // communication), by its own account; -1: not given.
  double compute_seconds = -1;
  double time = -1;  // Unix time the line was written, in seconds; -1: not given
};

// Parses one line; nullopt when it is not a JSON object with an integer "step".
std::optional<ProgressLine> ParseProgressLine(const std::string& line);

class ProgressFileReader {
 public:
  explicit ProgressFileReader(std::string path) : path_(std::move(path)) {}

  const std::string& path() const { return path_; }
  // Reads the complete lines appended since the last call and returns the newest valid one
  // (nullopt when none). A partial last line waits for its newline. A file that shrank (the
  // program truncated it) is read again from its start. Invalid lines are counted and skipped;
  // so is a line longer than 64 KiB, and one still growing past that is not held.
  std::optional<ProgressLine> ReadNew();
  int64_t invalid_lines() const { return invalid_lines_; }

 private:
  std::string path_;
  int64_t offset_ = 0;
  std::string partial_;
  bool skipping_ = false;  // inside a line longer than the bound: dropped up to its newline
  int64_t invalid_lines_ = 0;
};

// Turns a command's progress lines into the report its agent sends on the rendezvous heartbeat:
// samples per second and scaling efficiency (compute seconds per second) over the interval
// between two lines, timed by the lines' "time" when both carry one, else by when they were read.
//
//   tracker.StartProcess();                             // a new process of the command
//   client->SetProgress(tracker.Update(line, MonotonicSeconds()));
class ProgressTracker {
 public:
  ProgressTracker() { report_.has_loss = false; }

  rendezvous::ProgressReport Update(const ProgressLine& line, double now);
  // A new process of the command: its first counts are not comparable with the last process's.
  void StartProcess() {
    last_samples_ = {};
    last_compute_ = {};
  }
  void SetRestarts(int32_t restarts) { report_.restarts = restarts; }
  const rendezvous::ProgressReport& report() const { return report_; }

  // The last reading of one cumulative count (samples, compute seconds).
  struct Reading {
    double value = 0;
    double time = -1;        // -1: none yet
    bool line_time = false;  // `time` is the line's own, not when it was read
  };

 private:
  rendezvous::ProgressReport report_;
  Reading last_samples_;
  Reading last_compute_;
};

}  // namespace lockstep::agent
