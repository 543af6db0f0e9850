// A process slowed the way a throttled CPU or a noisy neighbour slows one: stopped (SIGSTOP) and
// continued (SIGCONT) every `period_ms` until the DutyCycle goes, which leaves it running. The
// straggler tests slow one worker with it.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace lockstep::testing {

class DutyCycle {
 public:
  explicit DutyCycle(pid_t pid, int64_t period_ms = 30)
      : thread_([this, pid, period_ms] {
          while (!stop_.load()) {
            kill(pid, SIGSTOP);
            std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
            kill(pid, SIGCONT);
            std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
          }
        }) {}
  ~DutyCycle() {
    stop_.store(true);
    thread_.join();
  }
  DutyCycle(const DutyCycle&) = delete;
  DutyCycle& operator=(const DutyCycle&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace lockstep::testing
