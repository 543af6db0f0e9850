// TrainingJobReconciler, ranks that follow the network (the end of step 7 of reconciler.h): each
// bound worker pod's place, its node's values of the --topology-keys labels (coarse to fine) and
// then the node's name, is told to the rendezvous service, which numbers the next generation's
// pods by it (common/rendezvous/topology_order.h) so that a ring crosses each switch level as
// few times as it can and pods of one node are neighbours.
//
// A pod is placed once it is bound: the reconcile its binding queues reads its node (once per
// node_place_ttl_ms, so a label added later, as topograph does, is seen within it), long before
// the worker in it has started and joined. A place the service has not got when everyone has
// joined is waited for until the last call, then the pod is numbered as having none.
#include <iterator>
#include <mutex>
#include <optional>
#include <string>

#include "common/deadline.h"
#include "common/logging.h"
#include "operator/trainingjob/pod_cache.h"
#include "operator/trainingjob/reconciler.h"
#include "operator/trainingjob/reconciler_work.h"

namespace lockstep::op::trainingjob {

namespace res = kube::resources;
using json = nlohmann::json;

namespace {
// How long a node that could not be read waits before it is asked again.
constexpr double kUnreadableNodeRetrySeconds = 30;
}  // namespace

const std::vector<std::string>& DefaultTopologyKeys() {
  static const std::vector<std::string> keys = {
      "topology.kubernetes.io/region",
      "topology.kubernetes.io/zone",
      "topology.k8s.aws/network-node-layer-1",
      "topology.k8s.aws/network-node-layer-2",
      "topology.k8s.aws/network-node-layer-3",
      "cloud.google.com/gce-topology-block",
      "cloud.google.com/gce-topology-subblock",
      "network.topology.nvidia.com/datacenter",
      "network.topology.nvidia.com/spine",
      "network.topology.nvidia.com/block",
  };
  return keys;
}

std::optional<rendezvous::TopologyPath> TrainingJobReconciler::NodePlace(const std::string& name) {
  const double now = MonotonicSeconds();
  const double ttl = options_.node_place_ttl_ms / 1000.0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = node_places_.find(name);
    if (it != node_places_.end()) {
      // A node that could not be read is not asked again for a while: an API server in
      // trouble gets one GET per node, not one per pod and reconcile.
      const double keep = it->second.place.has_value() ? ttl : kUnreadableNodeRetrySeconds;
      if (now - it->second.read_at < keep) return it->second.place;
    }
  }
  StatusOr<json> node = deps_.client->Get(res::kNodes, "", name);
  std::optional<rendezvous::TopologyPath> place;
  if (node.ok() || kube::IsNotFound(node.status())) {
    // A node that does not exist (any more) has no labels: its pods are placed by its name alone.
    const json labels =
        node.ok() ? (*node)["metadata"].value("labels", json::object()) : json::object();
    place.emplace();
    place->reserve(options_.topology_keys.size() + 1);
    for (const std::string& key : options_.topology_keys) {
      const json& value = labels.contains(key) ? labels[key] : json();
      place->push_back(value.is_string() ? value.get<std::string>() : "");
    }
    place->push_back(name);
  } else {
    LOCKSTEP_LOG(WARNING) << "node " << name << ": cannot read its topology labels ("
                          << node.status() << "); its pods are numbered without a place for now";
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // Nodes come and go: once a TTL, the places read longer ago than that are dropped.
  if (now - node_places_pruned_at_ >= ttl) {
    for (auto it = node_places_.begin(); it != node_places_.end();) {
      it = now - it->second.read_at >= ttl ? node_places_.erase(it) : std::next(it);
    }
    node_places_pruned_at_ = now;
  }
  node_places_[name] = NodePlaceEntry{place, now};
  return place;
}

std::optional<bool> TrainingJobReconciler::AnyNodeHasLabel(const std::string& key) {
  constexpr double kAbsentRetrySeconds = 60;
  const double now = MonotonicSeconds();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = labels_seen_.find(key);
    if (it != labels_seen_.end()) {
      const bool seen = it->second.seen.value_or(false);
      const double keep = seen ? options_.node_place_ttl_ms / 1000.0 : kAbsentRetrySeconds;
      if (now - it->second.read_at < keep) return it->second.seen;
    }
  }
  kube::ListOptions options;
  options.label_selector = key;  // "key": the label exists, whatever its value
  options.limit = 1;
  options.first_page_only = true;
  StatusOr<kube::ListResult> nodes = deps_.client->List(res::kNodes, "", options);
  std::optional<bool> seen;
  if (nodes.ok()) {
    seen = !nodes->items.empty();
  } else {
    LOCKSTEP_LOG(WARNING) << "cannot list nodes labelled " << key << ": " << nodes.status();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  labels_seen_[key] = LabelSeenEntry{seen, now};
  return seen;
}

// A level no node has leaves every pod of a required placement Pending with the scheduler's
// "didn't match pod affinity rules" on each node (or Kueue's TAS unable to admit), which does not
// name the cause; a preferred one is silently meaningless. Say which label is missing.
void TrainingJobReconciler::CheckPlacementLevel(Work& w) {
  const spec::PlacementSpec& placement = w.job.spec.placement;
  if (placement.topology.empty()) return;
  const std::optional<bool> seen = AnyNodeHasLabel(placement.topology);
  if (!seen.has_value()) return;
  if (*seen) {
    std::lock_guard<std::mutex> lock(mutex_);
    placement_warned_.erase(w.key);  // warned again should the label go
    return;
  }
  const bool required = placement.mode == spec::PlacementMode::kRequired;
  w.placement_problem = "spec.placement.topology: no node carries the label " +
                        placement.topology +
                        (required ? ", so no worker pod can be placed; label the nodes of each "
                                    "domain, or name a level they carry"
                                  : ", so the job's pods are placed as if no level were asked");
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    first = placement_warned_.insert(w.key).second;
  }
  if (first) {
    deps_.events->Record(*w.object, controller::EventType::kWarning, "NoNodeHasTopologyLevel",
                         w.placement_problem);
  }
}

void TrainingJobReconciler::ReportPlaces(Work& w) {
  if (deps_.rendezvous == nullptr || options_.topology_keys.empty()) return;
  // From the cache, before this reconcile deletes or creates pods: a pod it deletes then takes
  // its place with it (RemoveMember), and one it creates is placed once it is bound.
  for (const controller::ObjectPtr& pod : deps_.pods->ByIndex(kJobIndex, w.key)) {
    if (PodIndex(*pod) < 0 || !OwnedBy(*pod, w.job.metadata.uid) || IsTerminating(*pod)) continue;
    const std::string phase = PodPhase(*pod);
    if (phase == "Succeeded" || phase == "Failed") continue;
    const std::string node = NodeNameOf(*pod);
    if (node.empty()) continue;  // not scheduled yet: its binding queues another reconcile
    std::optional<rendezvous::TopologyPath> place = NodePlace(node);
    if (!place.has_value()) continue;  // asked again after a while
    deps_.rendezvous->SetPodTopology(w.key, (*pod)["metadata"].value("name", ""),
                                     std::move(*place));
  }
}

}  // namespace lockstep::op::trainingjob
