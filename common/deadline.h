// Deadline: the point in time by which a blocking call must return. Every blocking call in
// Lockstep takes one (or a timeout in milliseconds, which it turns into one).
#pragma once

#include <chrono>
#include <cstdint>

namespace lockstep {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  static Deadline AfterMs(int64_t timeout_ms) {
    return Deadline(Clock::now() + std::chrono::milliseconds(timeout_ms));
  }
  static Deadline At(Clock::time_point at) { return Deadline(at); }

  Clock::time_point at() const { return at_; }
  bool expired() const { return Clock::now() >= at_; }
  // Milliseconds left, never negative.
  int64_t remaining_ms() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    return left > 0 ? left : 0;
  }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

// Seconds since an arbitrary fixed point, for durations.
inline double MonotonicSeconds() {
  return std::chrono::duration<double>(Deadline::Clock::now().time_since_epoch()).count();
}

}  // namespace lockstep
