#include "operator/trainingjob/pod_cache.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/termination_message.h"
#include "common/utf8.h"
#include "operator/trainingjob/children.h"
#include "operator/trainingjob/job_status.h"

namespace lockstep::op::trainingjob {

using json = nlohmann::json;

std::string JobKeyOfPod(const json& pod) {
  const json& meta = pod.value("metadata", json::object());
  const json labels = meta.value("labels", json::object());
  if (!labels.is_object() || !labels.contains(kJobNameLabel)) return "";
  return meta.value("namespace", "") + "/" + labels[kJobNameLabel].get<std::string>();
}

std::string PodPhase(const json& pod) {
  if (!pod.contains("status")) return "Pending";
  return pod["status"].value("phase", "Pending");
}

std::string NodeNameOf(const json& pod) {
  if (!pod.contains("spec")) return "";
  return pod["spec"].value("nodeName", "");
}

bool IsTerminating(const json& pod) {
  return pod["metadata"].contains("deletionTimestamp") &&
         !pod["metadata"]["deletionTimestamp"].is_null();
}

namespace {

// status.conditions[type], or null.
json ConditionOf(const json& pod, const char* type) {
  if (!pod.contains("status") || !pod["status"].is_object()) return json();
  for (const json& c : pod["status"].value("conditions", json::array())) {
    if (c.value("type", "") == type) return c;
  }
  return json();
}

}  // namespace

bool IsReady(const json& pod) {
  const json ready = ConditionOf(pod, "Ready");
  return ready.is_object() && ready.value("status", "") == "True";
}

int32_t PodIndex(const json& pod) {
  const json labels = pod["metadata"].value("labels", json::object());
  if (!labels.contains(kReplicaIndexLabel) || !labels[kReplicaIndexLabel].is_string()) return -1;
  const std::string text = labels[kReplicaIndexLabel].get<std::string>();
  if (text.empty() || text.size() > 6 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoi(text);
}

bool OwnedBy(const json& pod, const std::string& uid) {
  for (const json& ref : pod["metadata"].value("ownerReferences", json::array())) {
    if (ref.value("uid", "") == uid && ref.value("controller", false)) return true;
  }
  return false;
}

namespace {

// metadata.<field>[key] (labels, annotations); "" when absent or not a string.
std::string MetadataMapValue(const json& pod, const char* field, const std::string& key) {
  const json map = pod["metadata"].value(field, json::object());
  if (!map.is_object() || !map.contains(key) || !map[key].is_string()) return "";
  return map[key].get<std::string>();
}

}  // namespace

std::string LabelOf(const json& pod, const std::string& key) {
  return MetadataMapValue(pod, "labels", key);
}

std::string CreationTimestampOf(const json& pod) {
  return pod["metadata"].value("creationTimestamp", "");
}

std::string AnnotationOf(const json& pod, const std::string& key) {
  return MetadataMapValue(pod, "annotations", key);
}

std::string SchedulingGatedBy(const json& pod) {
  std::string gates;
  if (pod.contains("spec") && pod["spec"].is_object()) {
    for (const json& gate : pod["spec"].value("schedulingGates", json::array())) {
      if (!gate.is_object()) continue;
      gates += (gates.empty() ? "" : ", ") + gate.value("name", std::string("?"));
    }
  }
  if (!gates.empty()) return gates;
  const json scheduled = ConditionOf(pod, "PodScheduled");
  if (scheduled.is_object() && scheduled.value("status", "") == "False" &&
      scheduled.value("reason", "") == "SchedulingGated") {
    return "a scheduling gate";
  }
  return "";
}

bool PastItsSchedulingGate(const json& pod) {
  return SchedulingGatedBy(pod).empty() &&
         (!NodeNameOf(pod).empty() || PodPhase(pod) == "Running");
}

std::string DisruptedBy(const json& pod) {
  for (const char* type : {"DisruptionTarget", "TerminationTarget"}) {
    const json c = ConditionOf(pod, type);
    if (!c.is_object() || c.value("status", "") != "True") continue;
    const std::string reason = c.value("reason", std::string(type));
    const std::string message = c.value("message", "");
    return message.empty() ? reason : reason + ": " + message;
  }
  return "";
}

bool StoppedByKueue(const json& pod) {
  const json c = ConditionOf(pod, "TerminationTarget");
  return c.is_object() && c.value("status", "") == "True";
}

bool KueueCountsPod(const json& pod) {
  if (PodPhase(pod) == "Failed") return false;
  return !(IsTerminating(pod) && NodeNameOf(pod).empty());
}

std::vector<std::string> JobIndexOfPod(const json& pod) {
  std::string key = JobKeyOfPod(pod);
  if (key.empty()) return {};
  return {key};
}

json TrimPod(json pod) {
  // Only what the reconciler and the handlers read: at 4,000 pods every field kept costs
  // hundreds of KB (an nlohmann node is ~100 bytes with its key).
  json out = json::object();
  json meta = json::object();
  json& m = pod["metadata"];
  for (const char* field :
       {"name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp"}) {
    if (m.contains(field)) meta[field] = std::move(m[field]);
  }
  // Kueue's: the group's size (a queued job keeps it) and whether the group may still retry.
  if (m.contains("annotations") && m["annotations"].is_object()) {
    json annotations = json::object();
    for (const char* key : {kKueuePodGroupCountAnnotation, kKueueRetriableAnnotation}) {
      if (m["annotations"].contains(key)) annotations[key] = std::move(m["annotations"][key]);
    }
    if (!annotations.empty()) meta["annotations"] = std::move(annotations);
  }
  if (m.contains("labels") && m["labels"].is_object()) {
    json labels = json::object();
    for (const char* label : {kJobNameLabel, kReplicaIndexLabel, kKueuePodGroupLabel,
                              kReplicaTypeLabel, kParameterServerIndexLabel}) {
      if (m["labels"].contains(label)) labels[label] = std::move(m["labels"][label]);
    }
    meta["labels"] = std::move(labels);
  }
  for (const json& ref : m.value("ownerReferences", json::array())) {
    if (ref.value("controller", false)) {
      meta["ownerReferences"] =
          json::array({{{"uid", ref.value("uid", "")}, {"controller", true}}});
    }
  }
  out["metadata"] = std::move(meta);
  if (pod.contains("spec") && pod["spec"].is_object()) {
    json& spec = pod["spec"];
    json kept = json::object();
    if (spec.contains("nodeName")) kept["nodeName"] = std::move(spec["nodeName"]);
    json gates = json::array();
    for (const json& gate : spec.value("schedulingGates", json::array())) {
      if (gate.is_object()) gates.push_back({{"name", gate.value("name", "")}});
    }
    if (!gates.empty()) kept["schedulingGates"] = std::move(gates);
    if (!kept.empty()) out["spec"] = std::move(kept);
  }
  if (pod.contains("status")) {
    json& s = pod["status"];
    json status = json::object();
    if (s.contains("phase")) status["phase"] = std::move(s["phase"]);
    if (s.contains("reason")) status["reason"] = std::move(s["reason"]);
    // Ready; PodScheduled when the scheduler says a gate holds the pod; the disruptions that
    // are not the program's failure (DisruptedBy).
    json conditions = json::array();
    for (const json& c : s.value("conditions", json::array())) {
      const std::string type = c.value("type", "");
      const std::string reason = c.value("reason", "");
      if (type == "Ready") {
        conditions.push_back({{"type", "Ready"}, {"status", c.value("status", "")}});
      } else if (type == "PodScheduled" && reason == "SchedulingGated") {
        conditions.push_back(
            {{"type", type}, {"status", c.value("status", "")}, {"reason", reason}});
      } else if (type == "DisruptionTarget" || type == "TerminationTarget") {
        conditions.push_back({{"type", type},
                              {"status", c.value("status", "")},
                              {"reason", reason},
                              {"message", Utf8Prefix(c.value("message", ""), 256)}});
      }
    }
    if (!conditions.empty()) status["conditions"] = std::move(conditions);
    // The worker's state, and that of the agent's init container (pod_agent.h), which stands
    // for the worker until it starts (WorkerState).
    for (const char* list : {"containerStatuses", "initContainerStatuses"}) {
      json containers = json::array();
      for (const json& c : s.value(list, json::array())) {
        if (!c.contains("state") || !c["state"].is_object()) continue;
        const json& state = c["state"];
        if (state.contains("terminated") && state["terminated"].is_object()) {
          json terminated = {{"exitCode", state["terminated"].value("exitCode", -1)}};
          // The kubelet's word for the end (OOMKilled, Error, Completed): an OOM kill leaves no
          // message of the worker's own, so this is all that says why.
          const json reason = state["terminated"].value("reason", json());
          if (reason.is_string() && !reason.get<std::string>().empty()) {
            terminated["reason"] = Utf8Prefix(reason.get<std::string>(), 64);
          }
          // The worker's error, or that its agents gave up (WorkerGaveUpMessage, which fails
          // the job): quoted in the job's condition. Only terminated containers carry one.
          const json message = state["terminated"].value("message", json());
          if (message.is_string() && !message.get<std::string>().empty()) {
            terminated["message"] = Utf8Prefix(message.get<std::string>(), 1024);
          }
          containers.push_back(
              {{"name", c.value("name", "")}, {"state", {{"terminated", std::move(terminated)}}}});
        } else if (state.contains("waiting") && state["waiting"].is_object() &&
                   IsStuckWaitingReason(state["waiting"].value("reason", ""))) {
          // A container that cannot start without a change (WorkerStuckReason).
          containers.push_back(
              {{"name", c.value("name", "")},
               {"state",
                {{"waiting",
                  {{"reason", state["waiting"].value("reason", "")},
                   {"message", Utf8Prefix(state["waiting"].value("message", ""), 1024)}}}}}});
        }
      }
      if (!containers.empty()) status[list] = std::move(containers);
    }
    out["status"] = std::move(status);
  }
  return out;
}

json TrimJob(json job) {
  if (job.contains("metadata")) {
    json& m = job["metadata"];
    m.erase("managedFields");
    if (m.contains("annotations") && m["annotations"].is_object()) {
      m["annotations"].erase("kubectl.kubernetes.io/last-applied-configuration");
      if (m["annotations"].empty()) m.erase("annotations");
    }
  }
  return job;
}

}  // namespace lockstep::op::trainingjob
