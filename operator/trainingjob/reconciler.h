// TrainingJobReconciler: the level-based, idempotent Reconcile(namespace/name) for TrainingJobs
// (docs/architecture.md, "lockstep-operator"). It reads the job and its pods from the informers'
// caches, makes the cluster match the spec (Secret, headless Service, PodGroup, one pod per
// worker), hosts the job in the rendezvous service, and writes status (phase, conditions, replica
// counts, progress reported by the workers through rendezvous) only when it changed.
//
// One reconcile, in order:
//  1. The job is gone: forget it (rendezvous, expectations). Being deleted: nothing (the garbage
//     collector deletes its children through their owner references).
//  2. The spec does not validate (what the CRD schema cannot express): Failed, condition reason
//     InvalidSpec naming the field; its clean-up (step 3) is retried on later reconciles.
//  3. Finished (Succeeded/Failed): delete pods still running (a job Kueue queues first tells
//     Kueue its pod group is over), drop the rendezvous job, and delete the job
//     ttlSecondsAfterFinished after completionTime.
//  4. Suspended: delete every pod (ending a Kueue group first); resume brings them back
//     (startTime restarts, as a Job's does). A job Kueue queues finds its pod group here
//     (reconciler_kueue.cc).
//  5. activeDeadlineSeconds passed since startTime: Failed, reason DeadlineExceeded.
//  6. Expectations not yet satisfied (the pod cache is behind our own writes): wait.
//  7. Children: Secret (token derived from the operator's master key and the job's uid, so a
//     restarted operator derives the same one and never reads Secrets back), Service, PodGroup,
//     rendezvous registration; created when missing (AlreadyExists is success). Then each
//     bound pod's place in the network goes to the rendezvous service (ranks follow it), and
//     spec.placement's level is looked for on the nodes.
//  8. Pods: a failed pod is replaced or fails the job by restartPolicy and backoffLimit (one the
//     cluster disrupted is replaced without counting); pods whose index is >= spec.replicas are
//     deleted (scale-down touches no other pod); missing indices are created (scale-up, deleted
//     pods; under Kueue also pods Kueue no longer counts, under names of their own) unless a
//     worker already succeeded.
//  9. Status from the pods and the rendezvous snapshot; written with the cached resourceVersion
//     (a stale cache gets a conflict and a retry, never a lost update); Events for every action.
//
// Thread safety: Reconcile may run concurrently for different keys (the work queue never hands
// one key to two workers).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/rendezvous/server.h"
#include "operator/controller/controller.h"
#include "operator/controller/event_recorder.h"
#include "operator/controller/expectations.h"
#include "operator/controller/informer.h"
#include "operator/kube/kube_client.h"
#include "operator/operator_metrics.h"
#include "operator/trainingjob/children.h"
#include "operator/trainingjob/pod_cache.h"

namespace lockstep::op::trainingjob {

// Node label keys that say where a node sits in the network, coarse to fine: the well-known
// region and zone, then the network layers EKS (topology.k8s.aws), GKE (gce-topology) and
// NVIDIA's topograph label nodes with. A node carries its provider's; the rest are empty at its
// place. The operator's --topology-keys replaces the list.
const std::vector<std::string>& DefaultTopologyKeys();

struct ReconcilerOptions {
  OperatorSettings settings;
  std::string master_key;  // derives each job's rendezvous token (HMAC with the job's uid)
  // The operator's CA key (its certificate: settings.rendezvous_ca_pem), which signs each
  // parameter-server job's serving certificate; needed whenever that certificate is set.
  std::string ca_key_pem;
  // While a job runs it is reconciled this often to carry the workers' progress into status.
  int64_t progress_interval_ms = 10000;
  // Children other than pods (Secret, Service, PodGroup) are not watched; they are re-ensured
  // this often, so one deleted by hand comes back.
  int64_t children_recheck_ms = 10 * 60 * 1000;
  // Rendezvous timings for hosted jobs.
  int64_t rendezvous_last_call_ms = 1000;
  int64_t rendezvous_heartbeat_interval_ms = 1000;
  int64_t rendezvous_heartbeat_timeout_ms = 10000;
  // Ranks follow the network (common/rendezvous/topology_order.h): each pod's place is its
  // node's values of these label keys, then the node's name. Empty: ranks in order of arrival.
  std::vector<std::string> topology_keys = DefaultTopologyKeys();
  // How long a node's place is kept before it is read again.
  int64_t node_place_ttl_ms = 10 * 60 * 1000;
  std::function<double()> now_unix_seconds;  // the wall clock; tests may replace it
};

struct ReconcilerDeps {
  kube::KubeClient* client = nullptr;
  controller::Informer* jobs = nullptr;
  controller::Informer* pods = nullptr;  // with the "job" index (JobIndexOfPod)
  controller::Expectations* expectations = nullptr;
  controller::EventRecorder* events = nullptr;
  rendezvous::RendezvousServer* rendezvous = nullptr;
  OperatorMetrics* metrics = nullptr;  // may be null
  bool has_podgroup_crds_volcano = true;
  bool has_podgroup_crds_scheduler_plugins = true;
};

class TrainingJobReconciler : public controller::Reconciler {
 public:
  TrainingJobReconciler(ReconcilerDeps deps, ReconcilerOptions options);
  Status Reconcile(const std::string& key, controller::Result* result) override;

  // Informer handlers: keep expectations and rendezvous membership in step with pods, and say
  // which job key to queue ("" for none).
  std::string OnPodEvent(const nlohmann::json* old_pod, const nlohmann::json* new_pod);

 private:
  // One reconcile's state (reconciler_work.h). The methods are defined by concern:
  // reconciler.cc (the job, its children and rendezvous registration), reconciler_pods.cc
  // (ReconcilePods, DeletePod), reconciler_status.cc (ComputeStatus, WriteStatus, Finish,
  // CleanUpFinished), reconciler_stragglers.cc (ReportStragglers) and reconciler_topology.cc
  // (ReportPlaces).
  struct Work;
  Status ReconcileJob(Work& w);
  Status EnsureChildren(Work& w);
  Status ReconcilePods(Work& w);
  Status ReconcileParameterServers(Work& w);        // reconciler_ps.cc
  static bool KueueHoldsTheWorkers(const Work& w);  // reconciler_ps.cc
  // A failed pod's restart, counted in status.restarts against backoffLimit and its deletion
  // queued for after the status write (ReplaceRestartedPods; `replacement` is added to what the
  // deletion says), or, past the limit, the job finished: Finish's status then.
  std::optional<Status> CountRestart(Work& w, const controller::ObjectPtr& pod,
                                     const std::string& what, const std::string& replacement,
                                     const char* reason);
  void ComputeStatus(Work& w);
  Status WriteStatus(Work& w);
  Status Finish(Work& w, bool succeeded, const std::string& reason, const std::string& message);
  // grace_seconds: the deletion's grace period; unset, the pod's own.
  Status DeletePod(Work& w, const nlohmann::json& pod, const std::string& why,
                   std::optional<int64_t> grace_seconds = std::nullopt);
  // The pods of w.restarts, deleted once the status that counts them is stored.
  void ReplaceRestartedPods(Work& w);
  // A worker pod stuck terminating because its node stopped answering: deleted with grace 0.
  void DeleteIfNodeLost(Work& w, const nlohmann::json& pod);
  // reconciler_stragglers.cc: status.stragglers, the Straggler condition and Events from the
  // rendezvous service's stragglers, and their replacement when the spec asks for it.
  void ReportStragglers(Work& w, const std::vector<rendezvous::StragglerInfo>& named);
  // reconciler_status.cc: the StoreLimit condition and a Warning Event once the job's rendezvous
  // store refused a call past its limits.
  void ReportStoreRefusals(Work& w, const rendezvous::JobSnapshot& s);
  // status.stragglerNodes together with the nodes this operator replaced stragglers on.
  std::vector<std::string> StragglerNodes(Work& w);
  void ReplaceStraggler(Work& w, const nlohmann::json& pod, const std::string& node,
                        const std::string& what);
  // reconciler_topology.cc: each bound worker pod's place in the network, told to the
  // rendezvous service so that ranks follow it.
  void ReportPlaces(Work& w);
  // The place of node `name` (its --topology-keys values, then its name); none when it cannot
  // be read now (asked again 30 s later). Kept for node_place_ttl_ms.
  std::optional<rendezvous::TopologyPath> NodePlace(const std::string& name);
  // spec.placement's level that no node carries: why no worker can be placed (required) or the
  // placement means nothing (preferred), in w.placement_problem, with a Warning Event once.
  void CheckPlacementLevel(Work& w);
  // Whether any node carries label `key`: one LIST of a single node, kept for
  // node_place_ttl_ms when one does and for a minute when none does (or it cannot be read).
  std::optional<bool> AnyNodeHasLabel(const std::string& key);
  // reconciler_kueue.cc: a job Kueue queues as a plain pod group. KueueGroup finds the group
  // the job's pods join and keeps it at its size (a plain pod group cannot be resized);
  // MarkKueueGroupDone tells Kueue a finished or suspended job's group retries no more.
  void KueueGroup(Work& w, const std::vector<controller::ObjectPtr>& pods);
  Status MarkKueueGroupDone(Work& w);
  // reconciler_status.cc: the Queued condition from the workers a scheduling gate holds back.
  void ReportQueue(Work& w, int32_t gated, int32_t admitted, const std::string& gate);
  Status CleanUpFinished(Work& w);
  std::string Token(const spec::TrainingJob& job) const;
  // The job's parameter servers' token: derived the same way under another label, so it
  // authenticates nothing at the rendezvous.
  std::string ParameterServerToken(const spec::TrainingJob& job) const;
  double Now() const;

  ReconcilerDeps deps_;
  ReconcilerOptions options_;
  std::mutex mutex_;
  // uid -> when the Secret/Service/PodGroup were last ensured (MonotonicSeconds).
  std::map<std::string, double> children_ensured_;
  // job key -> "uid|min/max" of its registration in the rendezvous service.
  std::map<std::string, std::string> hosted_;
  // job key -> the stragglers this operator replaced (reconciler_stragglers.cc).
  struct StragglerRecord {
    std::string uid;
    int64_t replaced = 0;
    std::vector<std::string> nodes;
  };
  std::map<std::string, StragglerRecord> straggler_records_;
  // job key -> the store refusals of its registration last told in an Event (reconciler_status.cc).
  struct StoreRefusalRecord {
    std::string uid;
    int64_t told = 0;
  };
  std::map<std::string, StoreRefusalRecord> store_refusals_told_;
  // node name -> its place and when it was read (MonotonicSeconds), reconciler_topology.cc.
  struct NodePlaceEntry {
    std::optional<rendezvous::TopologyPath> place;  // none: the node could not be read
    double read_at = 0;
  };
  std::map<std::string, NodePlaceEntry> node_places_;
  // label key -> whether a node carries it and when that was read (CheckPlacementLevel).
  struct LabelSeenEntry {
    std::optional<bool> seen;  // none: the nodes could not be listed
    double read_at = 0;
  };
  std::map<std::string, LabelSeenEntry> labels_seen_;
  std::set<std::string> placement_warned_;  // job keys warned of a level no node has
  // job key -> failed pods (uids) whose restart is stored but whose deletion failed: deleted
  // again without another count.
  std::map<std::string, std::set<std::string>> counted_failures_;
  double node_places_pruned_at_ = 0;
};

}  // namespace lockstep::op::trainingjob
