#include "common/rendezvous/straggler_detector.h"

#include <algorithm>

namespace lockstep::rendezvous {

bool StragglerDetector::Report(const std::string& member_id, const Pace& pace, TimePoint now) {
  Member& member = members_[member_id];
  if (!member.started || pace.steps < member.window_start.steps ||
      pace.compute_seconds < member.window_start.compute_seconds) {
    member.started = true;
    member.window_start = pace;
    member.window_started_at = now;
    return false;
  }
  const int64_t steps = pace.steps - member.window_start.steps;
  if (steps < std::max<int64_t>(1, options_.min_window_steps) ||
      now - member.window_started_at < std::chrono::milliseconds(options_.min_window_ms)) {
    return false;
  }
  member.latest = (pace.compute_seconds - member.window_start.compute_seconds) /
                  static_cast<double>(steps);
  member.window_start = pace;
  member.window_started_at = now;
  return Judge(member_id, member, now);
}

double StragglerDetector::Median() const {
  std::vector<double> latest;
  for (const auto& [id, member] : members_) {
    if (member.latest >= 0) latest.push_back(member.latest);
  }
  if (latest.size() < 3) return -1;
  const size_t middle = latest.size() / 2;
  std::nth_element(latest.begin(), latest.begin() + middle, latest.end());
  if (latest.size() % 2 == 1) return latest[middle];
  const double upper = latest[middle];
  const double lower = *std::max_element(latest.begin(), latest.begin() + middle);
  return (lower + upper) / 2;
}

bool StragglerDetector::Judge(const std::string& member_id, Member& member, TimePoint now) {
  const double median = Median();
  if (median <= 0) return false;  // too few members to judge: nothing changes
  auto named = std::find_if(named_.begin(), named_.end(),
                            [&](const Straggler& s) { return s.member_id == member_id; });
  const bool slow = member.latest > options_.ratio * median;
  if (!slow) {
    member.slow_windows = 0;
    if (named == named_.end()) return false;
    named_.erase(named);
    return true;
  }
  ++member.slow_windows;
  const double ratio = member.latest / median;
  if (named != named_.end()) {
    named->ratio = ratio;
    return false;
  }
  if (member.slow_windows < options_.windows) return false;
  named_.push_back(Straggler{member_id, ratio, now});
  return true;
}

}  // namespace lockstep::rendezvous
