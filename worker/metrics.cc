#include "worker/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <exception>
#include <sstream>
#include <vector>

#include "common/metrics/move_series.h"

namespace lockstep {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// Seconds, from 100 us (a small all-reduce on loopback) to 100 s (a stalled collective).
Histogram::BucketBoundaries DurationBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   25,    100};
}

}  // namespace

StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(const std::string& job, int port) {
  if (port < 0 || port > 65535) {
    return InvalidArgumentError("metrics port must be in 0..65535 (got " + std::to_string(port) +
                                ")");
  }
  std::unique_ptr<WorkerMetrics> metrics(new WorkerMetrics());
  metrics->job_ = job;
  metrics->port_ = port;
  metrics->registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Registry& registry = *metrics->registry_;
  WorkerMetrics& m = *metrics;

  m.steps_total_family_ = &BuildCounter()
                               .Name("lockstep_train_steps_total")
                               .Help("Optimizer steps completed by this worker")
                               .Register(registry);
  m.samples_total_family_ = &BuildCounter()
                                 .Name("lockstep_train_samples_total")
                                 .Help("Samples of the global batches this worker took part in")
                                 .Register(registry);
  m.samples_per_second_family_ = &BuildGauge()
                                      .Name("lockstep_train_samples_per_second")
                                      .Help("Global training throughput over the last interval")
                                      .Register(registry);
  m.loss_family_ = &BuildGauge()
                        .Name("lockstep_train_loss")
                        .Help("Mean training loss over the last log interval")
                        .Register(registry);
  m.step_duration_family_ = &BuildHistogram()
                                 .Name("lockstep_step_duration_seconds")
                                 .Help("Wall time of one optimizer step")
                                 .Register(registry);
  m.allreduce_duration_family_ = &BuildHistogram()
                                      .Name("lockstep_allreduce_duration_seconds")
                                      .Help("Duration of one gradient-bucket all-reduce")
                                      .Register(registry);
  m.allreduce_bytes_family_ = &BuildCounter()
                                   .Name("lockstep_allreduce_bytes_total")
                                   .Help("Payload bytes this rank handed to the training collectives: "
                                         "gradients (16-bit when compressed), dgc's (index, "
                                         "value) pairs or local SGD's averaged parameters")
                                   .Register(registry);
  m.bus_bandwidth_family_ =
      &BuildGauge()
           .Name("lockstep_allreduce_bus_bandwidth_bytes")
           .Help("All-reduce bus bandwidth of the last step, bytes/s (algbw * 2(n-1)/n)")
           .Register(registry);
  m.comm_exposed_family_ = &BuildHistogram()
                                .Name("lockstep_comm_exposed_seconds")
                                .Help("Part of a step spent waiting on gradient communication")
                                .Register(registry);
  m.scaling_efficiency_family_ = &BuildGauge()
                                      .Name("lockstep_scaling_efficiency")
                                      .Help("Compute time over step time, 0..1")
                                      .Register(registry);
  m.world_size_family_ = &BuildGauge()
                              .Name("lockstep_world_size")
                              .Help("Members of the current rendezvous generation")
                              .Register(registry);
  m.generation_family_ = &BuildGauge()
                              .Name("lockstep_rendezvous_generation")
                              .Help("Current rendezvous generation")
                              .Register(registry);
  m.restarts_family_ = &BuildCounter()
                            .Name("lockstep_restarts_total")
                            .Help("Generations this worker process joined after its first: every "
                                  "re-formation, for a lost member, a newcomer or a scale change")
                            .Register(registry);
  m.checkpoint_duration_family_ = &BuildHistogram()
                                       .Name("lockstep_checkpoint_duration_seconds")
                                       .Help("Checkpoint duration by phase (snapshot|persist)")
                                       .Register(registry);
  m.checkpoint_last_step_family_ = &BuildGauge()
                                        .Name("lockstep_checkpoint_last_step")
                                        .Help("Step of the newest complete checkpoint")
                                        .Register(registry);
  m.checkpoint_last_success_family_ =
      &BuildGauge()
           .Name("lockstep_checkpoint_last_success_timestamp_seconds")
           .Help("Unix time of the newest complete checkpoint")
           .Register(registry);
  m.checkpoint_failures_family_ = &BuildCounter()
                                       .Name("lockstep_checkpoint_failures_total")
                                       .Help("Checkpoint persist attempts that failed")
                                       .Register(registry);
  m.skipped_steps_family_ =
      &BuildCounter()
           .Name("lockstep_train_skipped_steps_total")
           .Help("Steps skipped because fp16-compressed gradients overflowed (loss scale halved)")
           .Register(registry);

  m.pipeline_stage_family_ = &BuildGauge()
                                  .Name("lockstep_pipeline_stage")
                                  .Help("The pipeline stage this rank runs (pipeline jobs)")
                                  .Register(registry);
  m.pipeline_compute_family_ =
      &BuildCounter()
           .Name("lockstep_pipeline_compute_seconds_total")
           .Help("Time this pipeline stage spent in forward and backward passes")
           .Register(registry);
  m.pipeline_bubble_family_ =
      &BuildCounter()
           .Name("lockstep_pipeline_bubble_seconds_total")
           .Help("Time this pipeline stage waited on its neighbours: the bubble and the transfers")
           .Register(registry);
  m.pipeline_bytes_family_ =
      &BuildCounter()
           .Name("lockstep_pipeline_activation_bytes_total")
           .Help("Activation and activation-gradient bytes this pipeline stage sent")
           .Register(registry);

  const std::map<std::string, std::string> job_labels{{"job", job}};
  m.world_size_ = &m.world_size_family_->Add(job_labels);
  m.generation_ = &m.generation_family_->Add(job_labels);
  m.restarts_ = &m.restarts_family_->Add(job_labels);
  m.checkpoint_snapshot_ =
      &m.checkpoint_duration_family_->Add({{"job", job}, {"phase", "snapshot"}}, DurationBuckets());
  m.checkpoint_persist_ =
      &m.checkpoint_duration_family_->Add({{"job", job}, {"phase", "persist"}}, DurationBuckets());
  m.checkpoint_last_step_ = &m.checkpoint_last_step_family_->Add(job_labels);
  m.checkpoint_last_success_ = &m.checkpoint_last_success_family_->Add(job_labels);
  m.checkpoint_failures_ = &m.checkpoint_failures_family_->Add(job_labels);
  m.skipped_steps_ = &m.skipped_steps_family_->Add(job_labels);
  {
    std::lock_guard<std::mutex> lock(m.mu_);
    m.BindRank(0);
  }

  if (port != 0) {
    auto endpoint = http::HttpEndpoint::Start(
        "0.0.0.0", port, {{"/metrics", http::PrometheusHandler(metrics->registry_)}});
    if (!endpoint.ok()) return endpoint.status().WithContext("metrics endpoint");
    metrics->endpoint_ = std::move(endpoint).value();
  }
  return metrics;
}

WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::BindRank(int rank) {
  if (rank == rank_) return;
  const std::map<std::string, std::string> labels{{"job", job_}, {"rank", std::to_string(rank)}};
  // Counters and gauges move to the new rank's series keeping their values (move_series.h);
  // histograms keep the old series, since their observations cannot be moved.
  metrics::MoveSeries(steps_total_family_, &steps_total_, labels);
  metrics::MoveSeries(samples_total_family_, &samples_total_, labels);
  metrics::MoveSeries(allreduce_bytes_family_, &allreduce_bytes_, labels);
  metrics::MoveSeries(samples_per_second_family_, &samples_per_second_, labels);
  metrics::MoveSeries(loss_family_, &loss_, labels);
  metrics::MoveSeries(bus_bandwidth_family_, &bus_bandwidth_, labels);
  metrics::MoveSeries(scaling_efficiency_family_, &scaling_efficiency_, labels);
  // The pipeline's series exist only in pipeline jobs (SetPipelineStage creates them).
  if (pipeline_stage_ != nullptr) {
    metrics::MoveSeries(pipeline_stage_family_, &pipeline_stage_, labels);
    metrics::MoveSeries(pipeline_compute_family_, &pipeline_compute_, labels);
    metrics::MoveSeries(pipeline_bubble_family_, &pipeline_bubble_, labels);
    metrics::MoveSeries(pipeline_bytes_family_, &pipeline_bytes_, labels);
  }
  step_duration_ = &step_duration_family_->Add(labels, DurationBuckets());
  allreduce_duration_ = &allreduce_duration_family_->Add(labels, DurationBuckets());
  comm_exposed_ = &comm_exposed_family_->Add(labels, DurationBuckets());
  rank_ = rank;
}

void WorkerMetrics::SetGeneration(int64_t generation, int rank, int world_size) {
  std::lock_guard<std::mutex> lock(mu_);
  BindRank(rank);
  generation_->Set(static_cast<double>(generation));
  world_size_->Set(world_size);
}

void WorkerMetrics::IncrementRestarts() {
  std::lock_guard<std::mutex> lock(mu_);
  restarts_->Increment();
}

void WorkerMetrics::ObserveStep(const StepObservation& step) {
  std::lock_guard<std::mutex> lock(mu_);
  steps_total_->Increment();
  samples_total_->Increment(static_cast<double>(step.global_samples));
  step_duration_->Observe(step.step_seconds);
  comm_exposed_->Observe(step.exposed_seconds);
}

void WorkerMetrics::ObserveAllreduce(double seconds, int64_t bytes, int world_size) {
  std::lock_guard<std::mutex> lock(mu_);
  allreduce_duration_->Observe(seconds);
  allreduce_bytes_->Increment(static_cast<double>(bytes));
  if (seconds > 0 && world_size > 1) {
    // NCCL-tests' convention: bus bandwidth = algorithm bandwidth * 2(n-1)/n, comparable across
    // world sizes.
    bus_bandwidth_->Set(static_cast<double>(bytes) / seconds * 2.0 * (world_size - 1) / world_size);
  }
}

void WorkerMetrics::SetLoss(double loss) {
  std::lock_guard<std::mutex> lock(mu_);
  loss_->Set(loss);
}

void WorkerMetrics::SetSamplesPerSecond(double samples_per_second) {
  std::lock_guard<std::mutex> lock(mu_);
  samples_per_second_->Set(samples_per_second);
}

void WorkerMetrics::SetScalingEfficiency(double efficiency) {
  std::lock_guard<std::mutex> lock(mu_);
  scaling_efficiency_->Set(efficiency);
}

void WorkerMetrics::ObserveCheckpoint(const std::string& phase, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  (phase == "snapshot" ? checkpoint_snapshot_ : checkpoint_persist_)->Observe(seconds);
}

void WorkerMetrics::SetCheckpointSuccess(int64_t step, double unix_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  checkpoint_last_step_->Set(static_cast<double>(step));
  checkpoint_last_success_->Set(unix_seconds);
}

void WorkerMetrics::IncrementCheckpointFailures() {
  std::lock_guard<std::mutex> lock(mu_);
  checkpoint_failures_->Increment();
}

void WorkerMetrics::IncrementSkippedSteps() {
  std::lock_guard<std::mutex> lock(mu_);
  skipped_steps_->Increment();
}

void WorkerMetrics::SetPipelineStage(int stage) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pipeline_stage_ == nullptr) {
    const std::map<std::string, std::string> labels{{"job", job_}, {"rank", std::to_string(rank_)}};
    pipeline_stage_ = &pipeline_stage_family_->Add(labels);
    pipeline_compute_ = &pipeline_compute_family_->Add(labels);
    pipeline_bubble_ = &pipeline_bubble_family_->Add(labels);
    pipeline_bytes_ = &pipeline_bytes_family_->Add(labels);
  }
  pipeline_stage_->Set(stage);
}

void WorkerMetrics::ObservePipelineStep(double compute_seconds, double bubble_seconds,
                                        int64_t bytes_sent) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pipeline_compute_ == nullptr) return;  // SetPipelineStage first
  pipeline_compute_->Increment(compute_seconds);
  pipeline_bubble_->Increment(bubble_seconds);
  pipeline_bytes_->Increment(static_cast<double>(bytes_sent));
}

std::string WorkerMetrics::Scrape() const {
  prometheus::TextSerializer serializer;
  std::ostringstream out;
  serializer.Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace lockstep
