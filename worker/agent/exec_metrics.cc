#include "worker/agent/exec_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <sstream>

#include "common/metrics/move_series.h"

namespace lockstep::agent {

StatusOr<std::unique_ptr<ExecMetrics>> ExecMetrics::Create(const std::string& job, int port) {
  if (port < 0 || port > 65535) {
    return InvalidArgumentError("metrics port " + std::to_string(port) + " outside 0..65535");
  }
  std::unique_ptr<ExecMetrics> metrics(new ExecMetrics());
  ExecMetrics& m = *metrics;
  m.job_ = job;
  m.registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Registry& registry = *m.registry_;
  m.steps_family_ = &prometheus::BuildCounter()
                         .Name("lockstep_train_steps_total")
                         .Help("Optimizer steps the program reported")
                         .Register(registry);
  m.samples_family_ = &prometheus::BuildCounter()
                           .Name("lockstep_train_samples_total")
                           .Help("Training samples the program reported (global)")
                           .Register(registry);
  m.loss_family_ = &prometheus::BuildGauge()
                        .Name("lockstep_train_loss")
                        .Help("Latest training loss the program reported")
                        .Register(registry);
  m.rate_family_ = &prometheus::BuildGauge()
                        .Name("lockstep_train_samples_per_second")
                        .Help("Training samples per second (global), from the program's reports")
                        .Register(registry);
  m.efficiency_family_ =
      &prometheus::BuildGauge()
           .Name("lockstep_scaling_efficiency")
           .Help("Compute time / wall time of this rank, from the program's compute_seconds")
           .Register(registry);
  const std::map<std::string, std::string> job_labels{{"job", job}};
  m.world_size_ = &prometheus::BuildGauge()
                       .Name("lockstep_world_size")
                       .Help("Members of the current rendezvous generation")
                       .Register(registry)
                       .Add(job_labels);
  m.generation_ = &prometheus::BuildGauge()
                       .Name("lockstep_rendezvous_generation")
                       .Help("Current rendezvous generation")
                       .Register(registry)
                       .Add(job_labels);
  m.restarts_ = &prometheus::BuildCounter()
                     .Name("lockstep_restarts_total")
                     .Help("Restarts of the command after a failure")
                     .Register(registry)
                     .Add(job_labels);
  {
    std::lock_guard<std::mutex> lock(m.mu_);
    m.BindRank(0);
  }
  if (port != 0) {
    auto endpoint = http::HttpEndpoint::Start("0.0.0.0", port,
                                              {{"/metrics", http::PrometheusHandler(m.registry_)}});
    if (!endpoint.ok()) return endpoint.status().WithContext("metrics endpoint");
    m.endpoint_ = std::move(endpoint).value();
  }
  return metrics;
}

ExecMetrics::~ExecMetrics() = default;

void ExecMetrics::BindRank(int32_t rank) {
  if (rank == rank_) return;
  rank_ = rank;
  const prometheus::Labels labels = RankLabels();
  // Only series the program has reported move; the others appear with its first report.
  if (steps_ != nullptr) metrics::MoveSeries(steps_family_, &steps_, labels);
  if (samples_ != nullptr) metrics::MoveSeries(samples_family_, &samples_, labels);
  if (loss_ != nullptr) metrics::MoveSeries(loss_family_, &loss_, labels);
  if (efficiency_ != nullptr) metrics::MoveSeries(efficiency_family_, &efficiency_, labels);
  if (rate_ != nullptr) metrics::MoveSeries(rate_family_, &rate_, labels);
}

prometheus::Labels ExecMetrics::RankLabels() const {
  return {{"job", job_}, {"rank", std::to_string(rank_)}};
}

template <typename Metric>
Metric& ExecMetrics::Series(prometheus::Family<Metric>* family, Metric** series) {
  if (*series == nullptr) *series = &family->Add(RankLabels());
  return **series;
}

void ExecMetrics::SetGeneration(int64_t generation, int32_t rank, int32_t world_size) {
  std::lock_guard<std::mutex> lock(mu_);
  BindRank(rank);
  generation_->Set(static_cast<double>(generation));
  world_size_->Set(world_size);
}

void ExecMetrics::AddRestarts(int32_t restarts) {
  std::lock_guard<std::mutex> lock(mu_);
  if (restarts > 0) restarts_->Increment(restarts);
}

void ExecMetrics::ObserveProgress(const ProgressLine& line,
                                  const rendezvous::ProgressReport& report) {
  std::lock_guard<std::mutex> lock(mu_);
  prometheus::Counter& steps = Series(steps_family_, &steps_);
  if (line.step > furthest_step_) {
    steps.Increment(static_cast<double>(line.step - furthest_step_));
    furthest_step_ = line.step;
  }
  if (line.samples >= 0) {
    prometheus::Counter& samples = Series(samples_family_, &samples_);
    if (line.samples > furthest_samples_) {
      samples.Increment(static_cast<double>(line.samples - furthest_samples_));
      furthest_samples_ = line.samples;
    }
  }
  if (line.has_loss) Series(loss_family_, &loss_).Set(line.loss);
  if (line.samples >= 0 && report.samples_per_second > 0) {
    Series(rate_family_, &rate_).Set(report.samples_per_second);
  }
  if (line.compute_seconds >= 0 && report.scaling_efficiency > 0) {
    Series(efficiency_family_, &efficiency_).Set(report.scaling_efficiency);
  }
}

std::string ExecMetrics::Scrape() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace lockstep::agent
