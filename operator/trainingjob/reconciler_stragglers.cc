// TrainingJobReconciler, stragglers (part of step 9 of reconciler.h): the workers the rendezvous
// service names slow (common/rendezvous/straggler_detector.h) shown in status.stragglers, the
// Straggler condition and a Warning Event naming the pod and its node; with
// spec.elastic.replaceStragglers, the straggler's pod is deleted (created again by the next
// reconcile, preferring other nodes: status.stragglerNodes, DesiredPod) without counting as a
// restart.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "operator/trainingjob/job_status.h"
#include "operator/trainingjob/pod_cache.h"
#include "operator/trainingjob/reconciler.h"
#include "operator/trainingjob/reconciler_work.h"

namespace lockstep::op::trainingjob {

using json = nlohmann::json;

namespace {

// Nodes kept in status.stragglerNodes: enough for the slow nodes of any one job, bounded so the
// status and each pod's affinity stay small.
constexpr size_t kMaxStragglerNodes = 16;

std::string RatioText(double ratio) {
  const double rounded = std::round(ratio * 10) / 10;
  std::string text = std::to_string(rounded);
  text.erase(text.find('.') + 2);  // one decimal
  return text + "x";
}

// The pod was created preferring nodes other than `node` (DesiredPod's term) and still runs there:
// the cluster had nowhere else to put it.
bool PreferredAgainst(const json& pod, const std::string& node) {
  const json* terms = &pod;
  for (const char* key :
       {"spec", "affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution"}) {
    if (!terms->is_object() || !terms->contains(key)) return false;
    terms = &(*terms)[key];
  }
  if (!terms->is_array()) return false;
  for (const json& term : *terms) {
    const json fields =
        term.value("preference", json::object()).value("matchFields", json::array());
    for (const json& field : fields) {
      if (field.value("key", "") != "metadata.name" || field.value("operator", "") != "NotIn")
        continue;
      for (const json& value : field.value("values", json::array())) {
        if (value.is_string() && value.get<std::string>() == node) return true;
      }
    }
  }
  return false;
}

}  // namespace

std::vector<std::string> TrainingJobReconciler::StragglerNodes(Work& w) {
  std::vector<std::string> nodes;
  for (const json& node : w.status.value("stragglerNodes", json::array())) {
    if (node.is_string()) nodes.push_back(node.get<std::string>());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const auto record = straggler_records_.find(w.key);
  if (record == straggler_records_.end() || record->second.uid != w.job.metadata.uid) return nodes;
  for (const std::string& node : record->second.nodes) {
    if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
  }
  while (nodes.size() > kMaxStragglerNodes) nodes.erase(nodes.begin());
  return nodes;
}

void TrainingJobReconciler::ReportStragglers(Work& w,
                                             const std::vector<rendezvous::StragglerInfo>& named) {
  // What this operator replaced but may not have written yet (a status write that conflicted
  // after the pod was deleted: the next snapshot no longer names the straggler).
  const std::vector<std::string> avoided = StragglerNodes(w);
  if (!avoided.empty()) w.status["stragglerNodes"] = avoided;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto record = straggler_records_.find(w.key);
    if (record != straggler_records_.end() && record->second.uid == w.job.metadata.uid &&
        record->second.replaced > w.status.value("stragglersReplaced", int64_t{0})) {
      w.status["stragglersReplaced"] = record->second.replaced;
    }
  }

  std::set<std::string> named_before;
  for (const json& s : w.old_status.value("stragglers", json::array())) {
    if (s.is_object()) named_before.insert(s.value("pod", ""));
  }
  std::map<std::string, std::pair<int32_t, controller::ObjectPtr>> pods;
  for (auto& [index, pod] : w.by_index) {
    pods[(*pod)["metadata"].value("name", "")] = {index, pod};
  }

  json list = json::array();
  std::string first;           // the condition's message names the first; the list has them all
  std::set<std::string> seen;  // a pod of several ranks is reported and replaced once
  for (const rendezvous::StragglerInfo& s : named) {
    const std::string pod_name = s.pod.empty() ? s.member_id : s.pod;
    const auto pod = pods.find(pod_name);
    const json* object = pod == pods.end() ? nullptr : pod->second.second.get();
    const std::string node = object == nullptr ? "" : NodeNameOf(*object);
    json entry = {{"pod", pod_name}, {"rank", s.rank}, {"ratio", std::round(s.ratio * 100) / 100}};
    if (!node.empty()) entry["node"] = node;
    list.push_back(entry);
    const std::string where = "pod " + pod_name + (node.empty() ? "" : " on node " + node);
    const std::string what =
        where + " computes " + RatioText(s.ratio) + " the median time per step of its peers";
    if (first.empty()) first = what;
    if (!seen.insert(pod_name).second) continue;
    if (named_before.count(pod_name) == 0) {
      deps_.events->Record(*w.object, controller::EventType::kWarning, "Straggler", what);
      LOCKSTEP_LOG(WARNING) << w.key << ": straggler: " << what;
    }
    // Replaced only while the job trains (not once a worker completed), a pod it still wants,
    // and not when it was already made to prefer other nodes and still landed on this one: the
    // cluster has nowhere else for it, and a new pod there would only be named again.
    if (!w.job.spec.elastic.replace_stragglers || w.any_succeeded || object == nullptr ||
        pod->second.first >= spec::WorkersToRun(w.job.spec) || IsTerminating(*object) ||
        PodPhase(*object) != "Running") {
      continue;
    }
    if (!node.empty() && PreferredAgainst(*object, node)) {
      if (named_before.count(pod_name) == 0) {
        const std::string why = "not replacing pod " + pod_name +
                                ": it was created preferring nodes other than " + node +
                                " and still landed there";
        deps_.events->Record(*w.object, controller::EventType::kNormal, "StragglerNotReplaced",
                             why);
      }
      continue;
    }
    ReplaceStraggler(w, *object, node, what);
  }
  if (!list.empty()) {
    w.status["stragglers"] = std::move(list);
    const size_t more = named.size() - 1;
    SetCondition(&w.status, kStraggler, true, "SlowWorker",
                 first + (more > 0 ? " (and " + std::to_string(more) + " more)" : ""), w.now);
  } else {
    w.status.erase("stragglers");
    if (HasCondition(w.status, kStraggler)) {
      SetCondition(&w.status, kStraggler, false, "NoStraggler",
                   "no worker is slower than its peers", w.now);
    }
  }
}

void TrainingJobReconciler::ReplaceStraggler(Work& w, const json& pod, const std::string& node,
                                             const std::string& what) {
  const std::string name = pod["metadata"].value("name", "");
  Status s = DeletePod(w, pod, what + "; replacing it (spec.elastic.replaceStragglers)");
  if (!s.ok()) {
    if (w.error.ok()) w.error = s;
    return;
  }
  // ReportStragglers merged what the operator remembers into w.status before calling this.
  const int64_t replaced = w.status.value("stragglersReplaced", int64_t{0}) + 1;
  std::vector<std::string> nodes = StragglerNodes(w);
  if (!node.empty()) {
    nodes.erase(std::remove(nodes.begin(), nodes.end(), node), nodes.end());
    nodes.push_back(node);
    while (nodes.size() > kMaxStragglerNodes) nodes.erase(nodes.begin());
  }
  {
    // Kept here as well as in the status written below: if that write conflicts, the reconcile
    // that follows no longer sees the straggler (its deletion ended the generation).
    std::lock_guard<std::mutex> lock(mutex_);
    StragglerRecord& record = straggler_records_[w.key];
    if (record.uid != w.job.metadata.uid) record = StragglerRecord{w.job.metadata.uid, 0, {}};
    record.replaced = replaced;
    record.nodes = nodes;
  }
  w.status["stragglersReplaced"] = replaced;
  if (!nodes.empty()) w.status["stragglerNodes"] = nodes;
  deps_.events->Record(
      *w.object, controller::EventType::kNormal, "ReplacingStraggler",
      "deleted straggler pod " + name +
          (node.empty() ? "" : "; its replacement prefers nodes other than " + node));
  if (deps_.metrics) deps_.metrics->StragglerReplaced();
}

}  // namespace lockstep::op::trainingjob
