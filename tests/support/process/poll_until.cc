#include "tests/support/process/poll_until.h"

#include <poll.h>

#include <chrono>

namespace lockstep::testing {

bool PollUntil(const std::function<bool()>& condition, int64_t timeout_ms, int64_t interval_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return condition();
    poll(nullptr, 0, static_cast<int>(interval_ms));
  }
}

}  // namespace lockstep::testing
