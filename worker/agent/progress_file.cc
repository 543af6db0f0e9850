#include "worker/agent/progress_file.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

namespace lockstep::agent {
namespace {

// At most this much is read per call, so a program that floods the file cannot stall a beat.
constexpr int64_t kMaxReadBytes = 4 << 20;
// A line longer than this is not progress: it is dropped (and counted) instead of held.
constexpr size_t kMaxLineBytes = 64 << 10;
// Shorter intervals between two lines give no rate: their counts are too close to divide.
constexpr double kMinRateIntervalSeconds = 1e-3;

}  // namespace

std::optional<ProgressLine> ParseProgressLine(const std::string& line) {
  nlohmann::json doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return std::nullopt;
  auto step = doc.find("step");
  if (step == doc.end() || !step->is_number()) return std::nullopt;
  ProgressLine progress;
  progress.step = step->get<int64_t>();
  if (auto it = doc.find("samples"); it != doc.end() && it->is_number()) {
    progress.samples = it->get<int64_t>();
  }
  if (auto it = doc.find("loss"); it != doc.end() && it->is_number()) {
    progress.loss = it->get<double>();
    progress.has_loss = true;
  }
  if (auto it = doc.find("total_steps"); it != doc.end() && it->is_number()) {
    progress.total_steps = it->get<int64_t>();
  }
  if (auto it = doc.find("compute_seconds"); it != doc.end() && it->is_number()) {
    progress.compute_seconds = std::max(0.0, it->get<double>());
  }
  if (auto it = doc.find("time"); it != doc.end() && it->is_number()) {
    progress.time = it->get<double>();
  }
  return progress;
}

std::optional<ProgressLine> ProgressFileReader::ReadNew() {
  std::ifstream file(path_, std::ios::binary);
  if (!file) return std::nullopt;
  file.seekg(0, std::ios::end);
  const int64_t size = static_cast<int64_t>(file.tellg());
  if (size < offset_) {  // truncated and rewritten
    offset_ = 0;
    partial_.clear();
    skipping_ = false;
  }
  if (size == offset_) return std::nullopt;
  const int64_t length = std::min(size - offset_, kMaxReadBytes);
  std::string chunk(static_cast<size_t>(length), '\0');
  file.seekg(offset_);
  file.read(chunk.data(), length);
  chunk.resize(static_cast<size_t>(file.gcount()));
  offset_ += static_cast<int64_t>(chunk.size());
  partial_ += chunk;

  std::optional<ProgressLine> newest;
  size_t start = 0;
  for (size_t newline; (newline = partial_.find('\n', start)) != std::string::npos;) {
    const std::string line = partial_.substr(start, newline - start);
    start = newline + 1;
    if (skipping_) {  // the end of an overlong line, already counted
      skipping_ = false;
      continue;
    }
    if (line.size() > kMaxLineBytes) {
      ++invalid_lines_;
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (auto parsed = ParseProgressLine(line)) {
      newest = parsed;
    } else {
      ++invalid_lines_;
    }
  }
  partial_.erase(0, start);
  if (partial_.size() > kMaxLineBytes) {
    if (!skipping_) ++invalid_lines_;
    partial_.clear();
    skipping_ = true;
  }
  return newest;
}

namespace {

// The rate of a cumulative count between its last reading and this one; -1 when there is none
// (no earlier reading on the same clock, too short an interval, or a count that went back).
double RateSince(const ProgressTracker::Reading& last, double value, double time, bool line_time) {
  if (last.time < 0 || last.line_time != line_time) return -1;
  const double interval = time - last.time;
  if (interval < kMinRateIntervalSeconds || value < last.value) return -1;
  return (value - last.value) / interval;
}

}  // namespace

rendezvous::ProgressReport ProgressTracker::Update(const ProgressLine& line, double now) {
  report_.step = line.step;
  if (line.total_steps >= 0) report_.total_steps = line.total_steps;
  if (line.has_loss) {
    report_.loss = line.loss;
    report_.has_loss = true;
  }
  const bool line_time = line.time >= 0;
  const double time = line_time ? line.time : now;
  // Each count keeps its own last reading, so lines that leave one out do not break its rate.
  auto observe = [&](Reading& last, double value, auto&& set_rate) {
    const double rate = RateSince(last, value, time, line_time);
    if (rate >= 0) set_rate(rate);
    // An interval too short to divide keeps the older reading; anything else starts from here.
    if (rate >= 0 || last.time < 0 || last.line_time != line_time || value < last.value ||
        time < last.time) {
      last = {value, time, line_time};
    }
  };
  if (line.samples >= 0) {
    report_.samples = line.samples;
    observe(last_samples_, static_cast<double>(line.samples),
            [&](double rate) { report_.samples_per_second = rate; });
  }
  if (line.compute_seconds >= 0) {
    observe(last_compute_, line.compute_seconds, [&](double rate) {
      report_.scaling_efficiency = std::min(rate, 1.0);
      report_.comm_exposed_fraction = 1.0 - report_.scaling_efficiency;
    });
  }
  return report_;
}

}  // namespace lockstep::agent
