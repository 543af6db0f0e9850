// Controller: worker threads that drain a WorkQueue into a Reconciler, with controller-runtime's
// result rules:
// - Result{} and OK: done (Forget the key's failures);
// - requeue_after_ms > 0: check again later (AddAfter), e.g. to refresh progress or act at a
//   deadline;
// - a non-OK status: retried with per-key exponential back-off (AddRateLimited), unless terminal;
// - a terminal error (Result::terminal): logged, not retried; the next change to the object
//   queues it again.
// Each reconcile's duration and errors go to the metrics hooks.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "operator/controller/work_queue.h"

namespace lockstep::op::controller {

struct Result {
  int64_t requeue_after_ms = 0;
  bool terminal = false;  // with a non-OK status: do not retry
};

class Reconciler {
 public:
  virtual ~Reconciler() = default;
  // key: "namespace/name". Must be idempotent and level-based: it may run any number of times
  // for any key, including keys whose object is gone.
  virtual Status Reconcile(const std::string& key, Result* result) = 0;
};

struct ControllerHooks {
  std::function<void(double seconds, bool ok)> on_reconciled;  // metrics
};

class Controller {
 public:
  Controller(std::string name, WorkQueue* queue, Reconciler* reconciler, int workers,
             ControllerHooks hooks = {});
  ~Controller();  // Stop()
  void Start();
  // Shuts the queue down and joins the workers (a reconcile in flight finishes).
  void Stop();

 private:
  void Work();
  std::string name_;
  WorkQueue* queue_;
  Reconciler* reconciler_;
  int workers_;
  ControllerHooks hooks_;
  std::vector<std::thread> threads_;
  std::atomic<bool> started_{false};
};

}  // namespace lockstep::op::controller
