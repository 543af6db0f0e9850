// OperatorMetrics: the operator's Prometheus metrics, named as docs/architecture.md, "Metrics",
// lists them (the chart's dashboard and alert rules use these names).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <map>
#include <memory>
#include <string>

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace lockstep::op {

class OperatorMetrics {
 public:
  OperatorMetrics();
  ~OperatorMetrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  void ObserveReconcile(double seconds, bool ok);
  void SetWorkqueueDepth(double depth);
  // Replaces lockstep_operator_jobs{phase} with these counts (phases absent are set to 0).
  void SetJobsByPhase(const std::map<std::string, int>& jobs_by_phase);
  void JobCreated();
  void JobSucceeded();
  void JobFailed();
  void JobRestarted();
  void StragglerReplaced();
  // Workers named stragglers now, over every hosted job.
  void SetStragglers(double stragglers);
  void SetLeader(bool leader);
  void SetRendezvousMembers(double members);
  // Hot-standby workers (spec.elastic.standby) waiting for a place, over every hosted job.
  void SetStandbyWorkers(double workers);
  // One admission review answered: result "allowed", "denied" or "error" (HTTP 4xx/5xx, where the
  // webhook's failurePolicy decides).
  void ObserveAdmission(double seconds, const std::string& result);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram* reconcile_duration_;
  prometheus::Counter* reconcile_errors_;
  prometheus::Gauge* workqueue_depth_;
  prometheus::Family<prometheus::Gauge>* jobs_family_;
  std::map<std::string, prometheus::Gauge*> jobs_by_phase_;
  prometheus::Counter* jobs_created_;
  prometheus::Counter* jobs_succeeded_;
  prometheus::Counter* jobs_failed_;
  prometheus::Counter* jobs_restarted_;
  prometheus::Counter* stragglers_replaced_;
  prometheus::Gauge* stragglers_;
  prometheus::Gauge* is_leader_;
  prometheus::Gauge* rendezvous_members_;
  prometheus::Gauge* standby_workers_;
  prometheus::Histogram* admission_duration_;
  std::map<std::string, prometheus::Counter*> admission_reviews_;
};

}  // namespace lockstep::op
