// The pieces of children.cc that the parameter servers' children (children_ps.cc) build with too:
// every child's labels and metadata, a pod's env entries, hostname and node-loss tolerations.
// Internal to operator/trainingjob.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/spec/training_job.h"

namespace lockstep::op::trainingjob::internal {

inline constexpr char kWorkerBinary[] = "lockstep-worker";
inline constexpr char kTokenKey[] = "token";  // the job's Secret's key of the rendezvous token

// The job-name and managed-by labels every child carries.
nlohmann::json JobLabels(const spec::TrainingJob& job);
// name, namespace, labels and the controller ownerReference to the job.
nlohmann::json ChildMetadata(const spec::TrainingJob& job, const std::string& name,
                             nlohmann::json labels);
nlohmann::json EnvValue(const std::string& name, const std::string& value);
nlohmann::json EnvField(const std::string& name, const std::string& field_path);
// An env var from key `key` of Secret `secret` (a token: never written into the pod in clear).
nlohmann::json EnvSecret(const std::string& name, const std::string& secret,
                         const std::string& key);
// The pod name as a DNS label: cut, with a hash of the whole name, past 63 characters.
std::string Hostname(const std::string& pod_name);
// NoExecute tolerations of the node-lifecycle taints for `seconds` (< 0: none), unless the pod
// already tolerates them.
void TolerateNodeLoss(nlohmann::json* pod, int64_t seconds);

}  // namespace lockstep::op::trainingjob::internal
