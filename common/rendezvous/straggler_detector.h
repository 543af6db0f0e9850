// StragglerDetector: which members of a generation compute each step much more slowly than their
// peers, from the pace they report in their heartbeats (proto/rendezvous.proto, Pace).
//
//   StragglerDetector detector(StragglerOptions{});
//   detector.Report("w-2", {.steps = 120, .compute_seconds = 3.1}, now);   // on every beat
//   for (const Straggler& s : detector.stragglers()) ... // named ones, with their ratio
//
// In a synchronous job every rank waits for the slowest at every all-reduce, so a slow rank
// shows in its own compute time per step (the step's wall time less what it waited on the
// collectives), not in its step rate, which all ranks share. A member's reports are cut into
// windows of at least min_window_steps steps and min_window_ms; each window's compute time
// per step is compared with the median of the members' latest windows. A member whose windows
// stay above `ratio` times the median for `windows` windows in a row is named; one window back
// under it clears the name. Averaging over windows of seconds makes the test robust to one slow
// step (a page fault, a preempted thread); requiring several in a row, to a burst (a checkpoint's
// persist, another process's start-up). The median needs three members to mean anything: with
// fewer, nothing changes (with two, either could be the slow one). A member that completed keeps
// its name and its last window: its leaving says nothing about its pace.
//
// Not thread-safe: the caller (JobState) holds its lock. Time is passed in, never read.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lockstep::rendezvous {

struct StragglerOptions {
  // How much slower than the median a member's compute per step must be. Lower: finds milder
  // slowdowns, and names ranks that are merely unlucky on a shared machine; 1.5 is above the
  // spread of 4 ranks sharing 2 cores (within about 15% of their median over 5 s windows here).
  double ratio = 1.5;
  // How many windows in a row: the time to name a straggler is about windows x window.
  int32_t windows = 3;
  // A window is at least this many steps and this long (whichever ends later).
  int64_t min_window_steps = 10;
  int64_t min_window_ms = 5000;
};

// Cumulative counters of one member for this generation: steps trained, and the seconds of them
// spent computing (not waiting on a collective).
struct Pace {
  int64_t steps = 0;
  double compute_seconds = 0;
};

struct Straggler {
  std::string member_id;
  // Its latest window's compute time per step over the median of the members' latest windows.
  double ratio = 0;
  // When it was named (the caller's clock).
  std::chrono::steady_clock::time_point named_at;
};

class StragglerDetector {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  explicit StragglerDetector(StragglerOptions options) : options_(options) {}

  // A member's counters as of `now`. Counters that go back (a restarted process in the same
  // generation) start its window anew. Returns true when the set of named stragglers changed.
  bool Report(const std::string& member_id, const Pace& pace, TimePoint now);

  // The members named now, in the order they were named.
  const std::vector<Straggler>& stragglers() const { return named_; }

 private:
  struct Member {
    bool started = false;
    Pace window_start;
    TimePoint window_started_at;
    double latest = -1;  // compute seconds per step of the latest complete window; -1: none yet
    int32_t slow_windows = 0;
  };

  // After `member`'s window closed: compare it with the median, name or clear it.
  bool Judge(const std::string& member_id, Member& member, TimePoint now);
  double Median() const;

  StragglerOptions options_;
  std::map<std::string, Member> members_;
  std::vector<Straggler> named_;
};

}  // namespace lockstep::rendezvous
