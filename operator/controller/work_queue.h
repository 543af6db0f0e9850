// WorkQueue: the rate-limited queue of keys ("namespace/name") that reconcilers drain, with
// client-go's workqueue semantics:
// - a key is queued at most once however often it is added (changes coalesce);
// - a key being processed is never handed to a second worker: added meanwhile, it is queued
//   again when Done(key) is called;
// - AddRateLimited(key) delays by base_delay_ms * 2^failures (capped at max_delay_ms); Forget(key)
//   resets the count after a success; AddAfter(key, ms) for periodic re-checks.
//
//   while (auto key = queue.Get()) {        // blocks; nullopt once ShutDown
//     Result r = Reconcile(*key);
//     if (!r.ok) queue.AddRateLimited(*key); else { queue.Forget(*key); if (r.requeue_after_ms) queue.AddAfter(*key, r.requeue_after_ms); }
//     queue.Done(*key);
//   }
//
// Thread safety: every method from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <memory>

namespace lockstep::op::controller {

struct WorkQueueOptions {
  int64_t base_delay_ms = 5;
  int64_t max_delay_ms = 5 * 60 * 1000;
};

class WorkQueue {
 public:
  explicit WorkQueue(WorkQueueOptions options = {});
  ~WorkQueue();  // ShutDown()

  void Add(const std::string& key);
  void AddAfter(const std::string& key, int64_t delay_ms);  // an earlier pending time wins
  void AddRateLimited(const std::string& key);
  void Forget(const std::string& key);
  int NumRequeues(const std::string& key) const;

  // Blocks until a key is ready (nullopt after ShutDown). With timeout_ms >= 0, also returns
  // nullopt when it passes.
  std::optional<std::string> Get(int64_t timeout_ms = -1);
  void Done(const std::string& key);

  // Wakes every Get with nullopt; Add afterwards is ignored.
  void ShutDown();
  bool shutting_down() const;

  size_t Len() const;  // keys ready to be handed out (the queue depth metric)

 private:
  // ...implementation state: ready deque + set, processing set, dirty set, delayed heap,
  // failure counts, a timer thread or timed waits for delayed keys.
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep::op::controller
