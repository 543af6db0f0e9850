#pragma once
// A checker of the Pod Security Standards' "restricted" profile (which includes "baseline"), for
// tests of the pods the operator makes. The API server these tests run (1.20) predates the
// PodSecurity admission plugin (1.22 alpha, 1.25 GA), so the rules are those of
// kubernetes.io/docs/concepts/security/pod-security-standards for Linux pods, applied to a pod as
// the real API server stored it (defaults filled in).

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep::testing {

// Every control of the profile the pod breaks, one line each, naming the field:
// "spec.containers[worker].securityContext.allowPrivilegeEscalation must be false". Empty when
// the pod meets the profile.
std::vector<std::string> RestrictedProfileViolations(const nlohmann::json& pod);

}  // namespace lockstep::testing
