// The API client's own rate limit (client-go's --qps and --burst): a token bucket whose callers
// reserve their token and sleep until it is due, so that they are served in turn.
//
//   TokenBucket bucket(/*qps=*/50, /*burst=*/100);
//   LOCKSTEP_RETURN_IF_ERROR(bucket.Wait(deadline, &stopping));  // then send the request
//
// Thread safety: Wait from any thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <mutex>

#include "common/deadline.h"
#include "common/status.h"

namespace lockstep::op::kube {

class TokenBucket {
 public:
  TokenBucket(double qps, int burst)
      : qps_(qps),
        burst_(std::max(1, burst)),
        tokens_(std::max(1, burst)),
        last_(Deadline::Clock::now()) {}

  // Reserves a token and sleeps until it is due. Fails without reserving when the token would
  // come after the deadline. A stop flag cuts the sleep short (CANCELLED, within about 100 ms).
  // qps <= 0: no limit.
  Status Wait(Deadline deadline, const std::atomic<bool>* stop);

 private:
  const double qps_;
  const int burst_;
  std::mutex mutex_;
  double tokens_;
  Deadline::Clock::time_point last_;
};

}  // namespace lockstep::op::kube
