// spec.template merged into the worker pod the operator builds (DesiredPod): how a user adds
// volumes, sidecars, tolerations, node selectors or env without the operator losing what it
// owns. A pure function of JSON, table-tested through DesiredPod
// (tests/operator/trainingjob/children_test.cc).
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace lockstep::op::trainingjob {

// Merges `pod_template` (spec.template: metadata and a pod spec) into `pod`, whose first
// container is the worker. `overridable`: the worker's env names a template may override (the
// NCCL defaults that spec.network.ncclEnv did not set).
//
// The rules (a strategic merge keyed like Kubernetes' own):
//  - metadata.labels/annotations: added; the operator's keys win.
//  - spec.containers: by name. The "worker" container is merged field by field: image, command
//    and args stay the operator's (its image is already the template's when it names one:
//    spec::NamedWorkerImage; command and args are refused by validation); env, volumeMounts,
//    ports and resources are merged; any other field of the template, securityContext included,
//    is kept. Every other container (a
//    sidecar) is added after the worker as written.
//  - spec.volumes: by name, the operator's win.
//  - spec.hostNetwork: the operator's (spec.network.hostNetwork decides ports and DNS policy).
//  - every other spec field: the template's unless the operator sets it (restartPolicy,
//    hostname, subdomain, dnsPolicy with hostNetwork, schedulerName with gang scheduling,
//    priorityClassName when set).
// The security defaults come after the merge (HardenPod), only where the template is silent.
void MergeTemplate(nlohmann::json* pod, const nlohmann::json& pod_template,
                   const std::set<std::string>& overridable);

}  // namespace lockstep::op::trainingjob
