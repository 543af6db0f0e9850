#include "common/rendezvous/timer_queue.h"

#include <utility>

namespace lockstep::rendezvous {

TimerQueue::TimerQueue() : thread_([this] { Run(); }) {}

TimerQueue::~TimerQueue() { Stop(); }

void TimerQueue::Schedule(Deadline::Clock::time_point at, std::function<void()> callback) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  const bool earliest = timers_.empty() || at < timers_.begin()->first;
  timers_.emplace(at, std::move(callback));
  if (earliest) cv_.notify_one();
}

void TimerQueue::ScheduleAfterMs(int64_t delay_ms, std::function<void()> callback) {
  Schedule(Deadline::AfterMs(delay_ms).at(), std::move(callback));
}

void TimerQueue::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    timers_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void TimerQueue::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (timers_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto first = timers_.begin();
    if (Deadline::Clock::now() < first->first) {
      cv_.wait_until(lock, first->first);
      continue;
    }
    std::function<void()> callback = std::move(first->second);
    timers_.erase(first);
    lock.unlock();
    callback();
    lock.lock();
  }
}

}  // namespace lockstep::rendezvous
