// WorkerMetrics: the worker's Prometheus metrics (prometheus-cpp), named as docs/architecture.md,
// "Metrics", lists them, each labelled with the job and, where per rank, the rank.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto metrics, WorkerMetrics::Create("default/fashion", 9400));
//   metrics->SetGeneration(generation, rank, world_size);
//   metrics->ObserveStep({...});
//
// Port 0 keeps the metrics in memory without an HTTP endpoint (tests, or metrics.port: 0).
// The endpoint binds 0.0.0.0:port and serves /metrics.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/http/http_endpoint.h"
#include "common/status.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace lockstep {

// One optimizer step as the trainer measured it.
struct StepObservation {
  double step_seconds = 0;       // the whole step: data, forward, backward, wait, optimizer
  double exposed_seconds = 0;    // blocked on gradient communication after backward
  int64_t global_samples = 0;    // samples of the global batch
  int64_t wire_bytes = 0;        // bytes handed to all-reduces this step
  double allreduce_seconds = 0;  // sum of the bucket all-reduces' durations
};

class WorkerMetrics {
 public:
  // InvalidArgument for a port outside 0..65535; Unavailable naming the port when it is busy.
  static StatusOr<std::unique_ptr<WorkerMetrics>> Create(const std::string& job, int port);
  ~WorkerMetrics();

  // The port the endpoint listens on (0 when there is none).
  int port() const { return port_; }

  // A new generation formed: re-labels the per-rank series with the new rank (counters carry
  // their totals over), and sets lockstep_world_size and lockstep_rendezvous_generation.
  void SetGeneration(int64_t generation, int rank, int world_size);
  void IncrementRestarts();

  void ObserveStep(const StepObservation& step);
  void ObserveAllreduce(double seconds, int64_t bytes, int world_size);
  void SetLoss(double loss);
  void SetSamplesPerSecond(double samples_per_second);
  void SetScalingEfficiency(double efficiency);

  // For the checkpoint module: phase is "snapshot" or "persist".
  void ObserveCheckpoint(const std::string& phase, double seconds);
  void SetCheckpointSuccess(int64_t step, double unix_seconds);
  // lockstep_checkpoint_failures_total: persist attempts that failed (each is retried or given
  // up; training goes on).
  void IncrementCheckpointFailures();
  // lockstep_train_skipped_steps_total: steps whose fp16-compressed gradients overflowed and were
  // skipped (every rank skips the same steps; the loss scale was halved).
  void IncrementSkippedSteps();
  // Pipeline parallelism, per rank: the stage it runs, and per step the time its forward and
  // backward passes took, the time it waited on its neighbours (the pipeline's bubble and the
  // transfers) and the activation bytes (and their gradients) it sent.
  void SetPipelineStage(int stage);
  void ObservePipelineStep(double compute_seconds, double bubble_seconds, int64_t bytes_sent);

  // The text exposition of the registry (what /metrics serves), for tests.
  std::string Scrape() const;

 private:
  WorkerMetrics() = default;
  void BindRank(int rank);

  std::string job_;
  int port_ = 0;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<http::HttpEndpoint> endpoint_;

  mutable std::mutex mu_;
  int rank_ = -1;
  // Families.
  prometheus::Family<prometheus::Counter>* steps_total_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* samples_total_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* samples_per_second_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* loss_family_ = nullptr;
  prometheus::Family<prometheus::Histogram>* step_duration_family_ = nullptr;
  prometheus::Family<prometheus::Histogram>* allreduce_duration_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* allreduce_bytes_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* bus_bandwidth_family_ = nullptr;
  prometheus::Family<prometheus::Histogram>* comm_exposed_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* scaling_efficiency_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* world_size_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* generation_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* restarts_family_ = nullptr;
  prometheus::Family<prometheus::Histogram>* checkpoint_duration_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* checkpoint_last_step_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* checkpoint_last_success_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* checkpoint_failures_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* skipped_steps_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* pipeline_stage_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* pipeline_compute_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* pipeline_bubble_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* pipeline_bytes_family_ = nullptr;
  // Series of the current rank.
  prometheus::Counter* steps_total_ = nullptr;
  prometheus::Counter* samples_total_ = nullptr;
  prometheus::Gauge* pipeline_stage_ = nullptr;
  prometheus::Counter* pipeline_compute_ = nullptr;
  prometheus::Counter* pipeline_bubble_ = nullptr;
  prometheus::Counter* pipeline_bytes_ = nullptr;
  prometheus::Gauge* samples_per_second_ = nullptr;
  prometheus::Gauge* loss_ = nullptr;
  prometheus::Histogram* step_duration_ = nullptr;
  prometheus::Histogram* allreduce_duration_ = nullptr;
  prometheus::Counter* allreduce_bytes_ = nullptr;
  prometheus::Gauge* bus_bandwidth_ = nullptr;
  prometheus::Histogram* comm_exposed_ = nullptr;
  prometheus::Gauge* scaling_efficiency_ = nullptr;
  prometheus::Gauge* world_size_ = nullptr;
  prometheus::Gauge* generation_ = nullptr;
  prometheus::Counter* restarts_ = nullptr;
  prometheus::Histogram* checkpoint_snapshot_ = nullptr;
  prometheus::Histogram* checkpoint_persist_ = nullptr;
  prometheus::Gauge* checkpoint_last_step_ = nullptr;
  prometheus::Gauge* checkpoint_last_success_ = nullptr;
  prometheus::Counter* checkpoint_failures_ = nullptr;
  prometheus::Counter* skipped_steps_ = nullptr;
};

}  // namespace lockstep
