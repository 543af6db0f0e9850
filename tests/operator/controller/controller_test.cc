// Controller: controller-runtime's result rules over a WorkQueue (errors retried with back-off,
// terminal errors not retried, requeue_after honoured) with a scripted Reconciler.
#include "operator/controller/controller.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

namespace lockstep::op::controller {
namespace {

using Clock = std::chrono::steady_clock;

// Records each call's time per key and answers with `script(key, attempt, result)`.
class ScriptedReconciler : public Reconciler {
 public:
  using Script = std::function<Status(const std::string& key, int attempt, Result* result)>;
  explicit ScriptedReconciler(Script script) : script_(std::move(script)) {}

  Status Reconcile(const std::string& key, Result* result) override {
    int attempt;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      calls_[key].push_back(Clock::now());
      attempt = static_cast<int>(calls_[key].size());
    }
    changed_.notify_all();
    return script_(key, attempt, result);
  }

  // Waits (bounded) until `key` was reconciled `count` times.
  bool WaitForCalls(const std::string& key, size_t count, int64_t timeout_ms) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                             [&] { return calls_[key].size() >= count; });
  }
  std::vector<Clock::time_point> Calls(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_[key];
  }

 private:
  Script script_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<Clock::time_point>> calls_;
};

int64_t MsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

TEST(ControllerTest, ErrorsAreRetriedWithGrowingBackOffUntilSuccess) {
  WorkQueue queue(WorkQueueOptions{.base_delay_ms = 40, .max_delay_ms = 10000});
  ScriptedReconciler reconciler([](const std::string&, int attempt, Result*) {
    return attempt <= 3 ? UnavailableError("api server away") : OkStatus();
  });
  int reconciled_ok = 0, reconciled_failed = 0;
  std::mutex hook_mutex;
  Controller controller("test", &queue, &reconciler, 2, {[&](double, bool ok) {
                          std::lock_guard<std::mutex> lock(hook_mutex);
                          (ok ? reconciled_ok : reconciled_failed)++;
                        }});
  controller.Start();
  queue.Add("default/job");
  ASSERT_TRUE(reconciler.WaitForCalls("default/job", 4, 5000));
  controller.Stop();
  const auto calls = reconciler.Calls("default/job");
  ASSERT_EQ(calls.size(), 4u);  // success ends the retries
  EXPECT_GE(MsBetween(calls[0], calls[1]), 40);
  EXPECT_GE(MsBetween(calls[1], calls[2]), 80);
  EXPECT_GE(MsBetween(calls[2], calls[3]), 160);
  EXPECT_EQ(queue.NumRequeues("default/job"), 0);  // forgotten after the success
  std::lock_guard<std::mutex> lock(hook_mutex);
  EXPECT_EQ(reconciled_failed, 3);
  EXPECT_EQ(reconciled_ok, 1);
}

TEST(ControllerTest, TerminalErrorsAreNotRetried) {
  WorkQueue queue(WorkQueueOptions{.base_delay_ms = 1, .max_delay_ms = 10});
  ScriptedReconciler reconciler([](const std::string& key, int, Result* result) {
    if (key == "default/bad") {
      result->terminal = true;
      return InvalidArgumentError("spec.replicas: must be >= 1");
    }
    return OkStatus();
  });
  Controller controller("test", &queue, &reconciler, 1);
  controller.Start();
  queue.Add("default/bad");
  ASSERT_TRUE(reconciler.WaitForCalls("default/bad", 1, 5000));
  // A later key going through proves the worker moved on; a retry of "bad" would have come
  // within its 1 ms back-off, long before this one is done.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  queue.Add("default/good");
  ASSERT_TRUE(reconciler.WaitForCalls("default/good", 1, 5000));
  controller.Stop();
  EXPECT_EQ(reconciler.Calls("default/bad").size(), 1u);
  EXPECT_EQ(queue.NumRequeues("default/bad"), 0);
}

TEST(ControllerTest, RequeueAfterIsHonoured) {
  WorkQueue queue;
  ScriptedReconciler reconciler([](const std::string&, int attempt, Result* result) {
    if (attempt == 1) result->requeue_after_ms = 150;
    return OkStatus();
  });
  Controller controller("test", &queue, &reconciler, 1);
  controller.Start();
  queue.Add("default/job");
  ASSERT_TRUE(reconciler.WaitForCalls("default/job", 2, 5000));
  controller.Stop();
  const auto calls = reconciler.Calls("default/job");
  EXPECT_GE(MsBetween(calls[0], calls[1]), 150);
  EXPECT_EQ(calls.size(), 2u);
}

TEST(ControllerTest, StopFinishesTheReconcileInFlightAndJoins) {
  WorkQueue queue;
  std::mutex mutex;
  std::condition_variable cv;
  bool entered = false;
  bool finished = false;
  ScriptedReconciler reconciler([&](const std::string&, int, Result*) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      entered = true;
    }
    cv.notify_all();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard<std::mutex> lock(mutex);
    finished = true;
    return OkStatus();
  });
  Controller controller("test", &queue, &reconciler, 3);
  controller.Start();
  queue.Add("default/job");
  {
    std::unique_lock<std::mutex> lock(mutex);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return entered; }));
  }
  controller.Stop();
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_TRUE(finished);
  EXPECT_TRUE(queue.shutting_down());
}

}  // namespace
}  // namespace lockstep::op::controller
