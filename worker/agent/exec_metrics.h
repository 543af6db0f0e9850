// ExecMetrics: the worker metrics an exec agent can know (docs/architecture.md, "Metrics"), for a
// program it does not see inside: generation, world size and restarts from the rendezvous, and
// steps, samples and loss from the program's progress file.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto metrics, ExecMetrics::Create("default/ddp", 9400));
//   metrics->SetGeneration(generation, rank, world_size);
//   metrics->ObserveProgress(line);
//
// Every series has the label `job`; the per-rank ones (steps, samples, loss) also `rank`, and
// move to the new rank's series when the rank changes (counters carry their totals). Port 0
// keeps the metrics in memory without an endpoint. Thread safety: any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <prometheus/labels.h>

#include "common/http/http_endpoint.h"
#include "common/rendezvous/client.h"
#include "common/status.h"
#include "worker/agent/progress_file.h"

namespace prometheus {
class Counter;
class Gauge;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace lockstep::agent {

class ExecMetrics {
 public:
  // InvalidArgument for a port outside 0..65535; Unavailable naming the port when it is busy.
  static StatusOr<std::unique_ptr<ExecMetrics>> Create(const std::string& job, int port);
  ~ExecMetrics();

  void SetGeneration(int64_t generation, int32_t rank, int32_t world_size);
  void AddRestarts(int32_t restarts);
  // Steps and samples count forward only: after a restart resumes from an older checkpoint the
  // counters wait until the program passes the furthest step seen (rate() never sees a reset).
  // A series appears with the first line that reports its field (samples, loss, and
  // compute_seconds for lockstep_scaling_efficiency, taken from `report`): a program that
  // reports no loss exports no loss, rather than a 0 that reads like one.
  void ObserveProgress(const ProgressLine& line, const rendezvous::ProgressReport& report);
  // The text exposition of the registry, for tests.
  std::string Scrape() const;

 private:
  ExecMetrics() = default;
  void BindRank(int32_t rank);
  prometheus::Labels RankLabels() const;
  // The series of `family` for the current rank, added on first use.
  template <typename Metric>
  Metric& Series(prometheus::Family<Metric>* family, Metric** series);

  std::string job_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<http::HttpEndpoint> endpoint_;
  mutable std::mutex mu_;
  int32_t rank_ = -1;
  int64_t furthest_step_ = 0;
  int64_t furthest_samples_ = 0;
  prometheus::Family<prometheus::Counter>* steps_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* samples_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* loss_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* efficiency_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* rate_family_ = nullptr;
  prometheus::Counter* steps_ = nullptr;
  prometheus::Counter* samples_ = nullptr;
  prometheus::Gauge* loss_ = nullptr;
  prometheus::Gauge* efficiency_ = nullptr;
  prometheus::Gauge* rate_ = nullptr;
  prometheus::Gauge* world_size_ = nullptr;
  prometheus::Gauge* generation_ = nullptr;
  prometheus::Counter* restarts_ = nullptr;
};

}  // namespace lockstep::agent
