// Bounded polling, for conditions only observable by polling (/proc, files, a server's state).
#pragma once

#include <cstdint>
#include <functional>

namespace lockstep::testing {

// Calls `condition` until it returns true or timeout_ms passes, waiting `interval_ms` between
// calls; returns its last result.
bool PollUntil(const std::function<bool()>& condition, int64_t timeout_ms, int64_t interval_ms);

}  // namespace lockstep::testing
