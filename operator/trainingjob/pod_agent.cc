#include "operator/trainingjob/pod_agent.h"

#include <string>

#include "common/termination_message.h"

namespace lockstep::op::trainingjob {

using json = nlohmann::json;

std::string WorkerImage(const spec::TrainingJobSpec& spec, const std::string& default_image) {
  const std::string named = spec::NamedWorkerImage(spec);
  return named.empty() ? default_image : named;
}

bool BringsAgent(const spec::TrainingJobSpec& spec, const std::string& default_image) {
  return !spec.trainer.has_value() && WorkerImage(spec, default_image) != default_image;
}

namespace {

// The worker's cpu and memory, requests and limits alike: an init container's own count towards
// the pod's only where they exceed the containers', and a container without them would make a
// Guaranteed pod Burstable.
json CpuAndMemory(const json& worker) {
  json resources = json::object();
  const json given = worker.value("resources", json::object());
  for (const char* section : {"limits", "requests"}) {
    const json values = given.is_object() ? given.value(section, json::object()) : json();
    if (!values.is_object()) continue;
    for (const char* name : {"cpu", "memory"}) {
      if (values.contains(name)) resources[section][name] = values[name];
    }
  }
  return resources;
}

bool HasVolume(const json& spec, const std::string& name) {
  const json volumes = spec.value("volumes", json::array());
  if (!volumes.is_array()) return false;
  for (const json& volume : volumes) {
    if (volume.is_object() && volume.value("name", "") == name) return true;
  }
  return false;
}

}  // namespace

void BringAgent(json* pod, const std::string& agent_image) {
  json& spec = (*pod)["spec"];
  json& worker = spec["containers"].front();
  if (!HasVolume(spec, kAgentContainer)) {
    if (!spec["volumes"].is_array()) spec["volumes"] = json::array();
    spec["volumes"].push_back({{"name", kAgentContainer}, {"emptyDir", json::object()}});
  }
  if (!worker["volumeMounts"].is_array()) worker["volumeMounts"] = json::array();
  worker["volumeMounts"].push_back(
      {{"name", kAgentContainer}, {"mountPath", kAgentMountPath}, {"readOnly", true}});

  json install = {
      {"name", kAgentContainer},
      {"image", agent_image},
      {"command", json::array({kAgentProgram, "install", kAgentVolumePath})},
      {"env", json::array({{{"name", kTerminationLogEnv}, {"value", kTerminationLogPath}}})},
      {"volumeMounts", json::array({{{"name", kAgentContainer}, {"mountPath", kAgentVolumePath}}})},
      {"securityContext",
       {{"runAsUser", kAgentUser},
        {"runAsGroup", kAgentUser},
        {"runAsNonRoot", true},
        {"allowPrivilegeEscalation", false},
        {"readOnlyRootFilesystem", true},
        {"capabilities", {{"drop", json::array({"ALL"})}}},
        // Its own: a template may set the pod's to something else, or only the worker's.
        {"seccompProfile", {{"type", "RuntimeDefault"}}}}}};
  if (json resources = CpuAndMemory(worker); !resources.empty()) {
    install["resources"] = std::move(resources);
  }
  json init = json::array({std::move(install)});
  if (spec.contains("initContainers") && spec["initContainers"].is_array()) {
    for (json& theirs : spec["initContainers"]) init.push_back(std::move(theirs));
  }
  spec["initContainers"] = std::move(init);
}

}  // namespace lockstep::op::trainingjob
