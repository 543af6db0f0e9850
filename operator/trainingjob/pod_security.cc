#include "operator/trainingjob/pod_security.h"

#include <string>

#include "common/termination_message.h"

namespace lockstep::op::trainingjob {

using json = nlohmann::json;

namespace {

bool Contains(const json& list, const std::string& value) {
  if (!list.is_array()) return false;
  for (const json& item : list) {
    if (item.is_string() && item.get<std::string>() == value) return true;
  }
  return false;
}

}  // namespace

void PointTerminationLog(json* pod) {
  json& worker = (*pod)["spec"]["containers"].front();
  const json path = worker.value("terminationMessagePath", json(kTerminationLogPath));
  const std::string file = path.is_string() ? path.get<std::string>() : kTerminationLogPath;
  json& env = worker["env"];
  if (!env.is_array()) env = json::array();
  for (json& variable : env) {
    if (variable.is_object() && variable.value("name", "") == kTerminationLogEnv) {
      variable = {{"name", kTerminationLogEnv}, {"value", file}};
      return;
    }
  }
  env.push_back({{"name", kTerminationLogEnv}, {"value", file}});
}

void HardenPod(json* pod, bool rdma) {
  json& spec = (*pod)["spec"];
  json& worker = spec["containers"].front();
  const json pod_context = spec.value("securityContext", json::object());
  json& context = worker["securityContext"];
  if (!context.is_object()) context = json::object();

  // Whether the pod's or the worker's securityContext sets `field` (to `value`, when given).
  const auto set_anywhere = [&](const char* field, const json& value = json()) {
    const auto sets = [&](const json& c) {
      return c.is_object() && c.contains(field) && (value.is_null() || c[field] == value);
    };
    return sets(pod_context) || sets(context);
  };

  if (!spec.contains("automountServiceAccountToken") && !spec.contains("serviceAccountName") &&
      !spec.contains("serviceAccount")) {
    spec["automountServiceAccountToken"] = false;
  }
  // The legacy annotation must agree with the field when both are set; a template that uses it
  // chose its profile.
  const json& annotations = (*pod)["metadata"]["annotations"];
  const bool seccomp_annotated =
      annotations.is_object() &&
      (annotations.contains("seccomp.security.alpha.kubernetes.io/pod") ||
       annotations.contains("container.seccomp.security.alpha.kubernetes.io/" +
                            worker.value("name", std::string())));
  if (!set_anywhere("seccompProfile") && !seccomp_annotated) {
    spec["securityContext"]["seccompProfile"] = {{"type", "RuntimeDefault"}};
  }

  json& capabilities = context["capabilities"];
  if (!capabilities.is_object()) capabilities = json::object();
  if (!capabilities.contains("drop")) capabilities["drop"] = json::array({"ALL"});
  if (rdma && !Contains(capabilities["add"], "IPC_LOCK")) {
    if (!capabilities["add"].is_array()) capabilities["add"] = json::array();
    capabilities["add"].push_back("IPC_LOCK");
  }
  // The API server refuses allowPrivilegeEscalation: false beside privileged or CAP_SYS_ADMIN.
  const bool privileged = (context.contains("privileged") && context["privileged"] == true) ||
                          Contains(capabilities.value("add", json()), "SYS_ADMIN") ||
                          Contains(capabilities.value("add", json()), "CAP_SYS_ADMIN");
  if (!context.contains("allowPrivilegeEscalation") && !privileged) {
    context["allowPrivilegeEscalation"] = false;
  }

  if (rdma) {
    // Root, unless the template names a user or asks for a non-root one.
    if (!set_anywhere("runAsUser") && !set_anywhere("runAsNonRoot", true)) {
      context["runAsUser"] = 0;
    }
  } else if (!set_anywhere("runAsNonRoot") && !set_anywhere("runAsUser", 0)) {
    context["runAsNonRoot"] = true;
  }
}

}  // namespace lockstep::op::trainingjob
