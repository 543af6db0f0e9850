#include "tests/support/kube/pod_security.h"

#include <set>

namespace lockstep::testing {
namespace {

using json = nlohmann::json;

bool IsTrue(const json& object, const char* field) {
  return object.is_object() && object.contains(field) && object[field] == true;
}

bool HasField(const json& object, const char* field) {
  return object.is_object() && object.contains(field) && !object[field].is_null();
}

// seccompProfile.type values the profile allows; an absent profile is judged at the other level.
bool SeccompAllowed(const json& context) {
  if (!HasField(context, "seccompProfile")) return false;
  const std::string type = context["seccompProfile"].value("type", "");
  return type == "RuntimeDefault" || type == "Localhost";
}

}  // namespace

std::vector<std::string> RestrictedProfileViolations(const json& pod) {
  std::vector<std::string> out;
  const json spec = pod.value("spec", json::object());
  const json pod_context = spec.value("securityContext", json::object());

  // Baseline: host namespaces.
  for (const char* field : {"hostNetwork", "hostPID", "hostIPC"}) {
    if (IsTrue(spec, field)) out.push_back(std::string("spec.") + field + " must be unset or false");
  }
  // Baseline: no hostPath; restricted: only these volume types.
  static const std::set<std::string> kVolumeTypes = {
      "configMap", "csi",       "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
      "projected", "secret"};
  for (const json& volume : spec.value("volumes", json::array())) {
    for (auto& [key, value] : volume.items()) {
      if (key != "name" && !kVolumeTypes.count(key)) {
        out.push_back("spec.volumes[" + volume.value("name", "") + "]." + key +
                      " is not a volume type the profile allows");
      }
    }
  }
  // Baseline: sysctls of the safe set only.
  static const std::set<std::string> kSafeSysctls = {
      "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
      "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range"};
  for (const json& sysctl : pod_context.value("sysctls", json::array())) {
    if (!kSafeSysctls.count(sysctl.value("name", ""))) {
      out.push_back("spec.securityContext.sysctls[" + sysctl.value("name", "") + "] is not safe");
    }
  }
  // Restricted: a pod-level root user, Unconfined seccomp.
  if (HasField(pod_context, "runAsUser") && pod_context["runAsUser"] == 0) {
    out.push_back("spec.securityContext.runAsUser must not be 0");
  }
  if (HasField(pod_context, "seccompProfile") && !SeccompAllowed(pod_context)) {
    out.push_back("spec.securityContext.seccompProfile.type must be RuntimeDefault or Localhost");
  }
  const bool pod_non_root = IsTrue(pod_context, "runAsNonRoot");
  const bool pod_seccomp = SeccompAllowed(pod_context);

  for (const char* list : {"containers", "initContainers", "ephemeralContainers"}) {
    for (const json& container : spec.value(list, json::array())) {
      const std::string where =
          std::string("spec.") + list + "[" + container.value("name", "") + "]";
      const json context = container.value("securityContext", json::object());
      const std::string at = where + ".securityContext.";
      if (IsTrue(context, "privileged")) out.push_back(at + "privileged must be unset or false");
      if (context.value("allowPrivilegeEscalation", true) != false) {
        out.push_back(at + "allowPrivilegeEscalation must be false");
      }
      const json capabilities = context.value("capabilities", json::object());
      bool drops_all = false;
      for (const json& name : capabilities.value("drop", json::array())) {
        if (name == "ALL") drops_all = true;
      }
      if (!drops_all) out.push_back(at + "capabilities.drop must include ALL");
      for (const json& name : capabilities.value("add", json::array())) {
        if (name != "NET_BIND_SERVICE") {
          out.push_back(at + "capabilities.add may hold only NET_BIND_SERVICE, not " +
                        name.get<std::string>());
        }
      }
      if (HasField(context, "runAsNonRoot") ? context["runAsNonRoot"] != true : !pod_non_root) {
        out.push_back(at + "runAsNonRoot must be true (here or in spec.securityContext)");
      }
      if (HasField(context, "runAsUser") && context["runAsUser"] == 0) {
        out.push_back(at + "runAsUser must not be 0");
      }
      if (HasField(context, "seccompProfile") ? !SeccompAllowed(context) : !pod_seccomp) {
        out.push_back(at +
                      "seccompProfile.type must be RuntimeDefault or Localhost (here or in "
                      "spec.securityContext)");
      }
      if (HasField(context, "procMount") && context["procMount"] != "Default") {
        out.push_back(at + "procMount must be Default");
      }
      if (HasField(context, "seLinuxOptions")) {
        const json& selinux = context["seLinuxOptions"];
        if (HasField(selinux, "user") || HasField(selinux, "role")) {
          out.push_back(at + "seLinuxOptions.user and .role must be unset");
        }
      }
      for (const json& port : container.value("ports", json::array())) {
        if (port.value("hostPort", 0) != 0) {
          out.push_back(where + ".ports[" + std::to_string(port.value("containerPort", 0)) +
                        "].hostPort must be unset or 0");
        }
      }
    }
  }
  return out;
}

}  // namespace lockstep::testing
