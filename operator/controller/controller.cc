#include "operator/controller/controller.h"

#include <exception>

#include "common/deadline.h"
#include "common/logging.h"

namespace lockstep::op::controller {

Controller::Controller(std::string name, WorkQueue* queue, Reconciler* reconciler, int workers,
                       ControllerHooks hooks)
    : name_(std::move(name)),
      queue_(queue),
      reconciler_(reconciler),
      workers_(workers < 1 ? 1 : workers),
      hooks_(std::move(hooks)) {}

Controller::~Controller() { Stop(); }

void Controller::Start() {
  if (started_.exchange(true)) return;
  for (int i = 0; i < workers_; ++i) threads_.emplace_back([this] { Work(); });
}

void Controller::Stop() {
  queue_->ShutDown();
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  threads_.clear();
}

void Controller::Work() {
  while (std::optional<std::string> key = queue_->Get()) {
    Result result;
    Status status;
    const double started = MonotonicSeconds();
    try {
      status = reconciler_->Reconcile(*key, &result);
    } catch (const std::exception& e) {
      // A reconciler must not throw; if one does, treat it as a retryable error.
      status = InternalError(std::string("reconcile threw: ") + e.what());
    } catch (...) {
      status = InternalError("reconcile threw a non-exception");
    }
    if (hooks_.on_reconciled) hooks_.on_reconciled(MonotonicSeconds() - started, status.ok());
    if (!status.ok()) {
      if (result.terminal) {
        LOCKSTEP_LOG(ERROR) << name_ << " " << *key << ": " << status << " (terminal, not retried)";
        queue_->Forget(*key);
      } else {
        LOCKSTEP_LOG(WARNING) << name_ << " " << *key << ": " << status << " (retry "
                              << queue_->NumRequeues(*key) + 1 << ")";
        queue_->AddRateLimited(*key);
      }
    } else {
      queue_->Forget(*key);
      if (result.requeue_after_ms > 0) queue_->AddAfter(*key, result.requeue_after_ms);
    }
    queue_->Done(*key);
  }
}

}  // namespace lockstep::op::controller
