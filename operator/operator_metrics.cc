#include "operator/operator_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace lockstep::op {

namespace {
// Phases the CRD's status schema allows: each is always exported (0 when no job is in it), so
// dashboards and alerts see a series per phase from the start.
const char* const kPhases[] = {"Pending", "Queued",    "Created",   "Running", "Restarting",
                               "Scaling", "Suspended", "Succeeded", "Failed"};
}  // namespace

OperatorMetrics::OperatorMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  // Reconciles take from under a millisecond (nothing to do) to a few hundred (creating pods
  // through a slow API server).
  reconcile_duration_ = &prometheus::BuildHistogram()
                             .Name("lockstep_operator_reconcile_duration_seconds")
                             .Help("Duration of one TrainingJob reconcile")
                             .Register(*registry_)
                             .Add({}, prometheus::Histogram::BucketBoundaries{
                                          0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                          0.25, 0.5, 1, 2.5, 5, 10});
  reconcile_errors_ = &prometheus::BuildCounter()
                           .Name("lockstep_operator_reconcile_errors_total")
                           .Help("Reconciles that returned an error")
                           .Register(*registry_)
                           .Add({});
  workqueue_depth_ = &prometheus::BuildGauge()
                          .Name("lockstep_operator_workqueue_depth")
                          .Help("TrainingJob keys waiting to be reconciled")
                          .Register(*registry_)
                          .Add({});
  jobs_family_ = &prometheus::BuildGauge()
                      .Name("lockstep_operator_jobs")
                      .Help("TrainingJobs by status.phase")
                      .Register(*registry_);
  for (const char* phase : kPhases) jobs_by_phase_[phase] = &jobs_family_->Add({{"phase", phase}});
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add({});
  };
  jobs_created_ = counter("lockstep_operator_jobs_created_total",
                          "TrainingJobs whose children the operator created");
  jobs_succeeded_ =
      counter("lockstep_operator_jobs_succeeded_total", "TrainingJobs that succeeded");
  jobs_failed_ = counter("lockstep_operator_jobs_failed_total", "TrainingJobs that failed");
  jobs_restarted_ = counter("lockstep_operator_jobs_restarted_total",
                            "Worker pods replaced after a failure (counted against backoffLimit)");
  stragglers_replaced_ =
      counter("lockstep_operator_stragglers_replaced_total",
              "Straggler pods replaced (spec.elastic.replaceStragglers; not counted as restarts)");
  is_leader_ = &prometheus::BuildGauge()
                    .Name("lockstep_operator_is_leader")
                    .Help("1 while this replica holds the leader lease and reconciles")
                    .Register(*registry_)
                    .Add({});
  rendezvous_members_ = &prometheus::BuildGauge()
                             .Name("lockstep_operator_rendezvous_members")
                             .Help("Workers in the current generation of every hosted job")
                             .Register(*registry_)
                             .Add({});
  standby_workers_ = &prometheus::BuildGauge()
                          .Name("lockstep_operator_standby_workers")
                          .Help("Hot-standby workers of every hosted job waiting in its rendezvous "
                                "for a place in a full generation")
                          .Register(*registry_)
                          .Add({});
  stragglers_ = &prometheus::BuildGauge()
                     .Name("lockstep_operator_stragglers")
                     .Help("Workers every hosted job's rendezvous service names stragglers now")
                     .Register(*registry_)
                     .Add({});
  // A review answers in well under a millisecond unless it reads the job (a scale), which costs
  // one API call.
  admission_duration_ = &prometheus::BuildHistogram()
                             .Name("lockstep_operator_admission_duration_seconds")
                             .Help("Time to answer one admission review of a TrainingJob")
                             .Register(*registry_)
                             .Add({}, prometheus::Histogram::BucketBoundaries{
                                          0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                          0.025, 0.05, 0.1, 0.25, 1});
  auto& reviews = prometheus::BuildCounter()
                      .Name("lockstep_operator_admission_reviews_total")
                      .Help("Admission reviews of TrainingJobs by result (allowed, denied, error)")
                      .Register(*registry_);
  for (const char* result : {"allowed", "denied", "error"}) {
    admission_reviews_[result] = &reviews.Add({{"result", result}});
  }
}

OperatorMetrics::~OperatorMetrics() = default;

void OperatorMetrics::ObserveReconcile(double seconds, bool ok) {
  reconcile_duration_->Observe(seconds);
  if (!ok) reconcile_errors_->Increment();
}
void OperatorMetrics::SetWorkqueueDepth(double depth) { workqueue_depth_->Set(depth); }
void OperatorMetrics::SetJobsByPhase(const std::map<std::string, int>& jobs_by_phase) {
  for (auto& [phase, gauge] : jobs_by_phase_) {
    auto it = jobs_by_phase.find(phase);
    gauge->Set(it == jobs_by_phase.end() ? 0 : it->second);
  }
}
void OperatorMetrics::JobCreated() { jobs_created_->Increment(); }
void OperatorMetrics::JobSucceeded() { jobs_succeeded_->Increment(); }
void OperatorMetrics::JobFailed() { jobs_failed_->Increment(); }
void OperatorMetrics::JobRestarted() { jobs_restarted_->Increment(); }
void OperatorMetrics::StragglerReplaced() { stragglers_replaced_->Increment(); }
void OperatorMetrics::SetStragglers(double stragglers) { stragglers_->Set(stragglers); }
void OperatorMetrics::SetLeader(bool leader) { is_leader_->Set(leader ? 1 : 0); }
void OperatorMetrics::SetRendezvousMembers(double members) { rendezvous_members_->Set(members); }
void OperatorMetrics::SetStandbyWorkers(double workers) { standby_workers_->Set(workers); }
void OperatorMetrics::ObserveAdmission(double seconds, const std::string& result) {
  admission_duration_->Observe(seconds);
  auto counter = admission_reviews_.find(result);
  if (counter != admission_reviews_.end()) counter->second->Increment();
}

}  // namespace lockstep::op
