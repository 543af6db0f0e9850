#include "operator/controller/work_queue.h"

#include <algorithm>
#include <cmath>

namespace lockstep::op::controller {

using Clock = std::chrono::steady_clock;

struct WorkQueue::State {
  mutable std::mutex mutex;
  std::condition_variable wake;  // a key became ready, a delay changed, or shutdown
  std::deque<std::string> ready;
  std::unordered_set<std::string> dirty;       // queued or to be requeued after Done
  std::unordered_set<std::string> processing;  // handed out by Get, not yet Done
  // Delayed keys: when each becomes ready. A key appears once; the earlier time wins.
  std::multimap<Clock::time_point, std::string> delayed_by_time;
  std::unordered_map<std::string, Clock::time_point> delayed_at;
  std::unordered_map<std::string, int> failures;
  bool shutting_down = false;
  WorkQueueOptions options;

  // Caller holds mutex. Returns true when the key was queued and a Get should wake.
  bool AddLocked(const std::string& key) {
    if (shutting_down || dirty.count(key) > 0) return false;
    dirty.insert(key);
    // Being processed: Done puts it back, so one key never runs on two workers.
    if (processing.count(key) > 0) return false;
    ready.push_back(key);
    return true;
  }

  // Caller holds mutex. Moves due delayed keys to ready; returns when the next one is due.
  std::optional<Clock::time_point> PromoteDueLocked() {
    const auto now = Clock::now();
    while (!delayed_by_time.empty() && delayed_by_time.begin()->first <= now) {
      const std::string key = delayed_by_time.begin()->second;
      delayed_by_time.erase(delayed_by_time.begin());
      delayed_at.erase(key);
      AddLocked(key);
    }
    if (delayed_by_time.empty()) return std::nullopt;
    return delayed_by_time.begin()->first;
  }
};

WorkQueue::WorkQueue(WorkQueueOptions options) : state_(std::make_unique<State>()) {
  state_->options = options;
}

WorkQueue::~WorkQueue() { ShutDown(); }

void WorkQueue::Add(const std::string& key) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->AddLocked(key)) state_->wake.notify_one();
}

void WorkQueue::AddAfter(const std::string& key, int64_t delay_ms) {
  if (delay_ms <= 0) {
    Add(key);
    return;
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->shutting_down) return;
  const auto at = Clock::now() + std::chrono::milliseconds(delay_ms);
  auto existing = state_->delayed_at.find(key);
  if (existing != state_->delayed_at.end()) {
    if (existing->second <= at) return;  // an earlier pending time wins
    auto range = state_->delayed_by_time.equal_range(existing->second);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == key) {
        state_->delayed_by_time.erase(it);
        break;
      }
    }
  }
  state_->delayed_at[key] = at;
  state_->delayed_by_time.emplace(at, key);
  // A waiting Get may now have to wake earlier than it planned.
  state_->wake.notify_all();
}

void WorkQueue::AddRateLimited(const std::string& key) {
  int64_t delay_ms;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const int failures = state_->failures[key]++;
    const double delay =
        static_cast<double>(state_->options.base_delay_ms) * std::pow(2.0, std::min(failures, 62));
    delay_ms =
        static_cast<int64_t>(std::min(delay, static_cast<double>(state_->options.max_delay_ms)));
  }
  AddAfter(key, delay_ms);
}

void WorkQueue::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->failures.erase(key);
}

int WorkQueue::NumRequeues(const std::string& key) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto it = state_->failures.find(key);
  return it == state_->failures.end() ? 0 : it->second;
}

std::optional<std::string> WorkQueue::Get(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  const auto deadline =
      timeout_ms >= 0
          ? std::optional<Clock::time_point>(Clock::now() + std::chrono::milliseconds(timeout_ms))
          : std::nullopt;
  while (true) {
    if (state_->shutting_down) return std::nullopt;
    const std::optional<Clock::time_point> next_due = state_->PromoteDueLocked();
    if (!state_->ready.empty()) {
      std::string key = std::move(state_->ready.front());
      state_->ready.pop_front();
      state_->processing.insert(key);
      state_->dirty.erase(key);
      return key;
    }
    std::optional<Clock::time_point> wake_at = next_due;
    if (deadline) {
      if (Clock::now() >= *deadline) return std::nullopt;
      wake_at = wake_at ? std::min(*wake_at, *deadline) : *deadline;
    }
    if (wake_at) {
      state_->wake.wait_until(lock, *wake_at);
    } else {
      state_->wake.wait(lock);
    }
  }
}

void WorkQueue::Done(const std::string& key) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->processing.erase(key);
  // Added while it was processed: now it may go to a worker.
  if (state_->dirty.count(key) > 0 && !state_->shutting_down) {
    state_->ready.push_back(key);
    state_->wake.notify_one();
  }
}

void WorkQueue::ShutDown() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->shutting_down = true;
  state_->wake.notify_all();
}

bool WorkQueue::shutting_down() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->shutting_down;
}

size_t WorkQueue::Len() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->PromoteDueLocked();
  return state_->ready.size();
}

}  // namespace lockstep::op::controller
