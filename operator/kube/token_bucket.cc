#include "operator/kube/token_bucket.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

namespace lockstep::op::kube {
namespace {

// How often a sleeping Wait looks at its stop flag.
constexpr auto kStopPollInterval = std::chrono::milliseconds(100);

}  // namespace

Status TokenBucket::Wait(Deadline deadline, const std::atomic<bool>* stop) {
  if (qps_ <= 0) return OkStatus();
  Deadline::Clock::time_point due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = Deadline::Clock::now();
    const double elapsed = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    tokens_ = std::min<double>(burst_, tokens_ + elapsed * qps_);
    if (tokens_ >= 1) {
      tokens_ -= 1;
      return OkStatus();
    }
    // Reserve ahead: the debt makes later callers wait their turn behind this one.
    const double wait_seconds = (1 - tokens_) / qps_;
    due = now + std::chrono::duration_cast<Deadline::Clock::duration>(
                    std::chrono::duration<double>(wait_seconds));
    if (due > deadline.at()) {
      return DeadlineExceededError("client rate limit (" + std::to_string(qps_) +
                                   " qps): no token before the deadline");
    }
    tokens_ -= 1;
  }
  while (Deadline::Clock::now() < due) {
    if (stop != nullptr && stop->load()) return CancelledError("stopped");
    std::this_thread::sleep_until(std::min(due, Deadline::Clock::now() + kStopPollInterval));
  }
  return OkStatus();
}

}  // namespace lockstep::op::kube
