// WorkQueue: client-go's workqueue semantics (dedupe, one worker per key, delays, per-key
// exponential back-off, shutdown).
#include "operator/controller/work_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace lockstep::op::controller {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

TEST(WorkQueueTest, AddingAQueuedKeyAgainCoalesces) {
  WorkQueue queue;
  queue.Add("default/a");
  queue.Add("default/b");
  queue.Add("default/a");
  EXPECT_EQ(queue.Len(), 2u);
  EXPECT_EQ(queue.Get(0), "default/a");
  EXPECT_EQ(queue.Get(0), "default/b");
  EXPECT_EQ(queue.Get(0), std::nullopt);
}

TEST(WorkQueueTest, KeyAddedWhileProcessingIsHandedOutOnlyAfterDone) {
  WorkQueue queue;
  queue.Add("k");
  ASSERT_EQ(queue.Get(0), "k");
  queue.Add("k");  // changed while a worker holds it
  EXPECT_EQ(queue.Len(), 0u);
  EXPECT_EQ(queue.Get(50), std::nullopt);  // a second worker must not get it
  queue.Done("k");
  EXPECT_EQ(queue.Get(0), "k");
  queue.Done("k");
  EXPECT_EQ(queue.Get(0), std::nullopt);
}

TEST(WorkQueueTest, NoKeyIsProcessedByTwoWorkersAtOnce) {
  WorkQueue queue;
  std::atomic<int> in_flight{0};
  std::atomic<int> max_in_flight{0};
  std::atomic<int> processed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      while (auto key = queue.Get()) {
        const int now = ++in_flight;
        int seen = max_in_flight.load();
        while (now > seen && !max_in_flight.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        --in_flight;
        ++processed;
        queue.Done(*key);
      }
    });
  }
  for (int i = 0; i < 200; ++i) queue.Add("same");
  // Wait until the adds drained: the queue is empty and nothing is in flight.
  for (int spins = 0; spins < 2000 && (queue.Len() > 0 || in_flight.load() > 0); ++spins) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  queue.ShutDown();
  for (auto& worker : workers) worker.join();
  EXPECT_EQ(max_in_flight.load(), 1);
  EXPECT_GE(processed.load(), 1);
}

TEST(WorkQueueTest, AddAfterHandsKeysOutInDueOrder) {
  WorkQueue queue;
  const auto start = Clock::now();
  queue.AddAfter("late", 150);
  queue.AddAfter("early", 50);
  queue.AddAfter("late", 400);  // a later time does not postpone the pending one
  queue.AddAfter("marker", 300);
  EXPECT_EQ(queue.Len(), 0u);
  // Timers may be late on a loaded machine, never early; keys due together leave in due order,
  // so "late" (150 ms, not 400) comes before the marker (300 ms) however late both are.
  EXPECT_EQ(queue.Get(10000), "early");
  EXPECT_GE(MsSince(start), 50);
  EXPECT_EQ(queue.Get(10000), "late");
  EXPECT_GE(MsSince(start), 150);
  EXPECT_EQ(queue.Get(10000), "marker");
}

TEST(WorkQueueTest, AddAfterAnEarlierTimeWins) {
  WorkQueue queue;
  const auto start = Clock::now();
  queue.AddAfter("k", 60000);
  queue.AddAfter("k", 30);
  queue.AddAfter("marker", 1000);
  EXPECT_EQ(queue.Get(30000), "k");  // due at 30 ms, before the marker: not at 60 s
  EXPECT_GE(MsSince(start), 30);
}

TEST(WorkQueueTest, RateLimitedBackOffDoublesPerKeyAndForgetResetsIt) {
  WorkQueue queue(WorkQueueOptions{.base_delay_ms = 20, .max_delay_ms = 1000});
  std::vector<int64_t> waits_ms;
  for (int i = 0; i < 4; ++i) {
    const auto start = Clock::now();
    queue.AddRateLimited("k");
    ASSERT_EQ(queue.Get(5000), "k");
    waits_ms.push_back(MsSince(start));
    queue.Done("k");
  }
  EXPECT_EQ(queue.NumRequeues("k"), 4);
  // 20, 40, 80, 160 ms (lower bounds; timers may be late, never early).
  EXPECT_GE(waits_ms[0], 20);
  EXPECT_GE(waits_ms[1], 40);
  EXPECT_GE(waits_ms[2], 80);
  EXPECT_GE(waits_ms[3], 160);

  // Forgotten, the next wait is the base delay again: "k" (20 ms) leaves before a key due at
  // 160 ms, the wait a fifth failure would double again, however late the timers run.
  queue.Forget("k");
  EXPECT_EQ(queue.NumRequeues("k"), 0);
  queue.AddRateLimited("k");
  queue.AddAfter("marker", 160);
  EXPECT_EQ(queue.Get(5000), "k");
  EXPECT_EQ(queue.NumRequeues("other"), 0);  // per key
}

TEST(WorkQueueTest, BackOffIsCappedAtMaxDelay) {
  WorkQueue queue(WorkQueueOptions{.base_delay_ms = 1, .max_delay_ms = 30});
  for (int i = 0; i < 40; ++i) {
    queue.AddRateLimited("k");
    ASSERT_EQ(queue.Get(5000), "k");
    queue.Done("k");
  }
  const auto start = Clock::now();
  queue.AddRateLimited("k");  // 2^40 ms uncapped
  EXPECT_EQ(queue.Get(5000), "k");
  EXPECT_LT(MsSince(start), 1000);
}

TEST(WorkQueueTest, ShutDownWakesABlockedGet) {
  WorkQueue queue;
  std::optional<std::string> got = "unset";
  std::thread worker([&] { got = queue.Get(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it block
  const auto start = Clock::now();
  queue.ShutDown();
  worker.join();
  EXPECT_EQ(got, std::nullopt);
  EXPECT_LT(MsSince(start), 1000);
  EXPECT_TRUE(queue.shutting_down());
  queue.Add("ignored");
  EXPECT_EQ(queue.Len(), 0u);
  EXPECT_EQ(queue.Get(0), std::nullopt);
}

TEST(WorkQueueTest, GetWithTimeoutReturnsNothingWhenIdle) {
  WorkQueue queue;
  const auto start = Clock::now();
  EXPECT_EQ(queue.Get(60), std::nullopt);
  EXPECT_GE(MsSince(start), 60);
}

}  // namespace
}  // namespace lockstep::op::controller
