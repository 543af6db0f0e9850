// TimerQueue: one thread that runs callbacks at given times. The rendezvous server uses it for
// every timed event (join deadlines, last-call windows, heartbeat checks, store waits) so that a
// blocked call costs a queue entry, not a thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "common/deadline.h"

namespace lockstep::rendezvous {

class TimerQueue {
 public:
  TimerQueue();
  ~TimerQueue();  // Stop()s
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `callback` on the timer thread at or after `at`. Callbacks must not block for long:
  // they delay every later timer. Callbacks scheduled after Stop() never run. There is no
  // cancellation: a callback checks when it runs whether its event still matters.
  void Schedule(Deadline::Clock::time_point at, std::function<void()> callback);
  void ScheduleAfterMs(int64_t delay_ms, std::function<void()> callback);

  // Drops pending callbacks and joins the thread. Idempotent; not from a callback.
  void Stop();

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Deadline::Clock::time_point, std::function<void()>> timers_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace lockstep::rendezvous
