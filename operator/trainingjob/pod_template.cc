#include "operator/trainingjob/pod_template.h"

#include <algorithm>
#include <set>
#include <string>

#include "operator/trainingjob/children.h"

namespace lockstep::op::trainingjob {
namespace {

// Adds theirs' keys that ours lacks: ours wins on a conflict.
void AddMissingKeys(json* ours, const json& theirs) {
  if (!theirs.is_object()) return;
  if (!ours->is_object()) *ours = json::object();
  for (auto& [key, value] : theirs.items()) {
    if (!ours->contains(key)) (*ours)[key] = value;
  }
}

// Lists merged by a key field (strategic merge's patchMergeKey): ours first and winning, then
// theirs' entries whose key ours does not have, in their order.
void MergeListByKey(json* ours, const json& theirs, const char* key) {
  if (!theirs.is_array()) return;
  if (!ours->is_array()) *ours = json::array();
  std::set<std::string> seen;
  for (const json& item : *ours) {
    if (item.is_object() && item.contains(key)) seen.insert(item[key].dump());
  }
  for (const json& item : theirs) {
    if (item.is_object() && item.contains(key) && seen.count(item[key].dump())) continue;
    ours->push_back(item);
  }
}

// The worker container's env: the operator's LOCKSTEP_* and ncclEnv entries win; the NCCL
// defaults give way to the template's value (a template is as explicit as ncclEnv is); other
// entries are added after ours.
void MergeEnv(json* ours, const json& theirs, const std::set<std::string>& overridable) {
  if (!theirs.is_array()) return;
  for (const json& item : theirs) {
    if (!item.is_object() || !item.contains("name") || !item["name"].is_string()) {
      ours->push_back(item);  // malformed: let the API server name it
      continue;
    }
    const std::string name = item["name"];
    auto existing = std::find_if(ours->begin(), ours->end(),
                                 [&](const json& e) { return e.value("name", "") == name; });
    if (existing == ours->end()) {
      ours->push_back(item);
    } else if (overridable.count(name)) {
      *existing = item;
    }
  }
}

// resources.limits/requests: the template may add resources (ephemeral-storage, hugepages-2Mi,
// another device); a resource the operator sets is the operator's in both maps, since extended
// resources must have requests == limits and cpu/memory are kept Guaranteed.
void MergeResources(json* ours, const json& theirs) {
  if (!theirs.is_object()) return;
  if (!ours->is_object()) *ours = json::object();
  std::set<std::string> owned;
  for (const char* section : {"limits", "requests"}) {
    if (ours->contains(section)) {
      for (auto& [name, value] : (*ours)[section].items()) owned.insert(name);
    }
  }
  for (auto& [section, values] : theirs.items()) {
    if ((section != "limits" && section != "requests") || !values.is_object()) {
      if (!ours->contains(section)) (*ours)[section] = values;
      continue;
    }
    for (auto& [name, value] : values.items()) {
      if (!owned.count(name)) (*ours)[section][name] = value;
    }
  }
}

void MergeWorkerContainer(json* ours, const json& theirs,
                          const std::set<std::string>& overridable) {
  if (!theirs.is_object()) return;
  for (auto& [key, value] : theirs.items()) {
    if (key == "name" || key == "image" || key == "command" || key == "args") {
      // What runs is the operator's: args would be appended to `lockstep-worker train`.
      continue;
    } else if (key == "env") {
      if (!ours->contains("env")) (*ours)["env"] = json::array();
      MergeEnv(&(*ours)["env"], value, overridable);
    } else if (key == "volumeMounts") {
      MergeListByKey(&(*ours)["volumeMounts"], value, "mountPath");
    } else if (key == "ports") {
      json ports = ours->value("ports", json::array());
      MergeListByKey(&ports, value, "containerPort");
      // A second port named "metrics" would be refused; ours is the one the Service targets.
      json kept = json::array();
      std::set<std::string> names;
      for (const json& port : ports) {
        const std::string name = port.contains("name") ? port["name"].dump() : "";
        if (!name.empty() && !names.insert(name).second) continue;
        kept.push_back(port);
      }
      (*ours)["ports"] = std::move(kept);
    } else if (key == "resources") {
      MergeResources(&(*ours)["resources"], value);
    } else if (!ours->contains(key)) {
      (*ours)[key] = value;
    }
  }
}

}  // namespace

void MergeTemplate(json* pod, const json& pod_template, const std::set<std::string>& overridable) {
  if (!pod_template.is_object()) return;
  if (pod_template.contains("metadata") && pod_template["metadata"].is_object()) {
    const json& metadata = pod_template["metadata"];
    for (const char* field : {"labels", "annotations"}) {
      if (metadata.contains(field)) AddMissingKeys(&(*pod)["metadata"][field], metadata[field]);
    }
  }
  if (!pod_template.contains("spec") || !pod_template["spec"].is_object()) return;
  json& spec = (*pod)["spec"];
  for (auto& [key, value] : pod_template["spec"].items()) {
    if (key == "containers") {
      if (!value.is_array()) continue;
      for (const json& container : value) {
        if (container.is_object() && container.value("name", "") == kWorkerContainer) {
          MergeWorkerContainer(&spec["containers"].front(), container, overridable);
        } else {
          spec["containers"].push_back(container);
        }
      }
    } else if (key == "volumes") {
      MergeListByKey(&spec["volumes"], value, "name");
    } else if (key == "hostNetwork") {
      continue;
    } else if (!spec.contains(key)) {
      spec[key] = value;
    }
  }
}

}  // namespace lockstep::op::trainingjob
