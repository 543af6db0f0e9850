// The live progress of `lockstep run`: one line redrawn in place on a terminal, or a plain line
// every few seconds when stdout is a file or a pipe (CI logs stay readable).
//
//   ProgressDisplay display(std::cout, {.tty = isatty(STDOUT_FILENO) == 1, .columns = 120});
//   while (running) display.Update(SampleFromSnapshot(...), MonotonicSeconds());
//   display.Clear();   // before printing anything else on a terminal
//
// Thread safety: use from one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <ostream>
#include <string>
#include <utility>

namespace lockstep::cli {

// What the display shows; filled from the rendezvous server's snapshot of the job.
struct ProgressSample {
  int64_t step = 0;
  int64_t total_steps = 0;  // 0: not known yet
  double loss = 0;
  double samples_per_second = 0;
  int32_t world_size = 0;
  int64_t generation = 0;         // 0: no generation formed yet
  bool generation_active = true;  // false: re-forming after a member left or joined
  int32_t workers_running = 0;
  int32_t restarts = 0;        // replacement workers started so far (exec: command restarts)
  // False for an exec job whose program has reported no step (yet): no step count is shown.
  bool steps_reported = true;
  bool has_loss = true;  // false: the program reports no loss
  double elapsed_seconds = 0;  // since the workers were started
};

struct ProgressDisplayOptions {
  bool tty = false;
  // Terminal width; the line is cut to fit so \r redraws never wrap. 0: no limit.
  int32_t columns = 0;
  int64_t tty_interval_ms = 250;  // redraw period on a terminal
  // Period of plain lines; shorter: noisier logs, longer: staler logs.
  int64_t plain_interval_ms = 5000;
};

class ProgressDisplay {
 public:
  ProgressDisplay(std::ostream& out, ProgressDisplayOptions options);

  // Records the sample (for the time-left estimate) and draws it when the period has passed.
  // A new generation with another world size is also written as a line of its own, at once
  // ("world size 3 -> 2 (generation 2)"), so a log keeps every change. `now` is
  // MonotonicSeconds().
  void Update(const ProgressSample& sample, double now);
  // Erases the in-place line on a terminal so other output starts at column 0; no-op otherwise.
  void Clear();

  // Steps per second over the recent window, or -1 while unknown.
  double StepsPerSecond() const;

  // "step 1200/3000  40.0%  loss 0.4123  9876 samples/s  1m 05s left  world 4  gen 1", then
  // "  restarts 2" once a worker was replaced and "  re-forming" between generations.
  static std::string FormatLine(const ProgressSample& sample, double steps_per_second);

 private:
  std::ostream& out_;
  ProgressDisplayOptions options_;
  std::deque<std::pair<double, int64_t>> window_;  // (time, step), the last ~15 s
  double last_draw_ = -1e18;
  bool line_drawn_ = false;  // a TTY line is on screen
  std::string last_plain_line_;
  int64_t last_generation_ = 0;
  int32_t last_world_size_ = 0;
};

}  // namespace lockstep::cli
