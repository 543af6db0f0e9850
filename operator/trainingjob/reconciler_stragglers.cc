// TrainingJobReconciler, stragglers (part of step 9 of reconciler.h): the workers the rendezvous
// service names slow (common/rendezvous/straggler_detector.h) shown in status.stragglers, the
// Straggler condition and a Warning Event naming the pod and its node; with
// spec.elastic.replaceStragglers, the straggler's pod is deleted (created again by the next
// reconcile, preferring other nodes: status.stragglerNodes, DesiredPod) without counting as a
// restart.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
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

}  // namespace

void TrainingJobReconciler::ReportStragglers(Work& w,
                                             const std::vector<rendezvous::StragglerInfo>& named) {
  std::set<std::string> named_before;
  for (const json& s : w.old_status.value("stragglers", json::array())) {
    if (s.is_object()) named_before.insert(s.value("pod", ""));
  }
  std::map<std::string, controller::ObjectPtr> pods;
  for (auto& [index, pod] : w.by_index) pods[(*pod)["metadata"].value("name", "")] = pod;

  json list = json::array();
  std::string first;  // the condition's message names the first; the list has them all
  for (const rendezvous::StragglerInfo& s : named) {
    const std::string pod_name = s.pod.empty() ? s.member_id : s.pod;
    const auto pod = pods.find(pod_name);
    const std::string node = pod == pods.end() || !(*pod->second).contains("spec")
                                 ? ""
                                 : (*pod->second)["spec"].value("nodeName", "");
    json entry = {{"pod", pod_name}, {"rank", s.rank}, {"ratio", std::round(s.ratio * 100) / 100}};
    if (!node.empty()) entry["node"] = node;
    list.push_back(entry);
    const std::string where = "pod " + pod_name + (node.empty() ? "" : " on node " + node);
    const std::string what = where + " computes " + RatioText(s.ratio) +
                             " the median time per step of its peers";
    if (first.empty()) first = what;
    if (named_before.count(pod_name) == 0) {
      deps_.events->Record(*w.object, controller::EventType::kWarning, "Straggler", what);
      LOCKSTEP_LOG(WARNING) << w.key << ": straggler: " << what;
    }
    if (w.job.spec.elastic.replace_stragglers && pod != pods.end() &&
        !IsTerminating(*pod->second) && PodPhase(*pod->second) == "Running") {
      ReplaceStraggler(w, *pod->second, node, what);
    }
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
  w.status["stragglersReplaced"] = w.status.value("stragglersReplaced", int64_t{0}) + 1;
  if (!node.empty()) {
    json nodes = w.status.value("stragglerNodes", json::array());
    json kept = json::array();
    for (const json& n : nodes) {
      if (n.is_string() && n.get<std::string>() != node) kept.push_back(n);
    }
    kept.push_back(node);
    while (kept.size() > kMaxStragglerNodes) kept.erase(kept.begin());
    w.status["stragglerNodes"] = std::move(kept);
  }
  deps_.events->Record(*w.object, controller::EventType::kNormal, "ReplacingStraggler",
                       "deleted straggler pod " + name +
                           (node.empty() ? "" : "; its replacement prefers nodes other than " + node));
  if (deps_.metrics) deps_.metrics->StragglerReplaced();
}

}  // namespace lockstep::op::trainingjob
