#include "cli/progress_display.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli/summary.h"

namespace lockstep::cli {
namespace {
// Long enough to smooth out evaluation pauses, short enough to follow a changed world size.
constexpr double kRateWindowSeconds = 15.0;
}  // namespace

ProgressDisplay::ProgressDisplay(std::ostream& out, ProgressDisplayOptions options)
    : out_(out), options_(options) {}

double ProgressDisplay::StepsPerSecond() const {
  if (window_.size() < 2) return -1;
  const double seconds = window_.back().first - window_.front().first;
  const int64_t steps = window_.back().second - window_.front().second;
  if (seconds < 1.0 || steps <= 0) return -1;
  return steps / seconds;
}

std::string ProgressDisplay::FormatLine(const ProgressSample& sample, double steps_per_second) {
  char buffer[256];
  if (sample.generation == 0) {
    std::snprintf(buffer, sizeof(buffer), "waiting for workers to join (%d running, %s)",
                  sample.workers_running, FormatDuration(sample.elapsed_seconds).c_str());
    return buffer;
  }
  std::string line;
  if (!sample.steps_reported) {
    line = "running " + FormatDuration(sample.elapsed_seconds) + " (no progress reported)";
  } else if (sample.total_steps > 0) {
    std::snprintf(
        buffer, sizeof(buffer), "step %lld/%lld  %5.1f%%", static_cast<long long>(sample.step),
        static_cast<long long>(sample.total_steps),
        100.0 * static_cast<double>(sample.step) / static_cast<double>(sample.total_steps));
    line = buffer;
  } else {
    std::snprintf(buffer, sizeof(buffer), "step %lld", static_cast<long long>(sample.step));
    line = buffer;
  }
  if (sample.step > 0 && sample.has_loss) {
    std::snprintf(buffer, sizeof(buffer), "  loss %.4f", sample.loss);
    line += buffer;
  }
  if (sample.step > 0 && sample.samples_per_second > 0) {
    std::snprintf(buffer, sizeof(buffer), "  %.0f samples/s", sample.samples_per_second);
    line += buffer;
  }
  if (sample.total_steps > 0 && steps_per_second > 0) {
    const double left = (sample.total_steps - sample.step) / steps_per_second;
    line += "  " + FormatDuration(std::max(0.0, left)) + " left";
  }
  std::snprintf(buffer, sizeof(buffer), "  world %d  gen %lld", sample.world_size,
                static_cast<long long>(sample.generation));
  line += buffer;
  if (sample.restarts > 0) line += "  restarts " + std::to_string(sample.restarts);
  if (!sample.generation_active) line += "  re-forming";
  return line;
}

void ProgressDisplay::Update(const ProgressSample& sample, double now) {
  if (sample.generation > 0) {
    // A step that goes back (a restore from a checkpoint) restarts the estimate.
    if (!window_.empty() && sample.step < window_.back().second) window_.clear();
    window_.emplace_back(now, sample.step);
    while (window_.size() > 2 && now - window_.front().first > kRateWindowSeconds) {
      window_.pop_front();
    }
  }
  if (sample.generation > last_generation_) {
    if (last_world_size_ > 0 && sample.world_size != last_world_size_) {
      Clear();
      out_ << "world size " << last_world_size_ << " -> " << sample.world_size << " (generation "
           << sample.generation << ")\n"
           << std::flush;
    }
    last_generation_ = sample.generation;
    last_world_size_ = sample.world_size;
  }
  const int64_t interval_ms = options_.tty ? options_.tty_interval_ms : options_.plain_interval_ms;
  if ((now - last_draw_) * 1000.0 < static_cast<double>(interval_ms)) return;
  last_draw_ = now;
  std::string line = FormatLine(sample, StepsPerSecond());
  if (options_.tty) {
    if (options_.columns > 1 && static_cast<int32_t>(line.size()) >= options_.columns) {
      line.resize(options_.columns - 1);
    }
    // \r back to column 0, ESC[K erases what a longer previous line left behind.
    out_ << "\r" << line << "\033[K" << std::flush;
    line_drawn_ = true;
  } else if (line != last_plain_line_) {
    out_ << line << "\n" << std::flush;
    last_plain_line_ = line;
  }
}

void ProgressDisplay::Clear() {
  if (!options_.tty || !line_drawn_) return;
  out_ << "\r\033[K" << std::flush;
  line_drawn_ = false;
}

}  // namespace lockstep::cli
