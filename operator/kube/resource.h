// Resource: a Kubernetes API resource (group, version, plural) and the REST paths of its
// collections and objects. The resources the operator uses are declared here once.
#pragma once

#include <string>

namespace lockstep::op::kube {

struct Resource {
  std::string group;    // "" for the core group
  std::string version;  // "v1", "v1alpha1", ...
  std::string plural;   // "pods", "trainingjobs"
  std::string kind;     // "Pod", "TrainingJob"
  bool namespaced = true;

  std::string api_version() const { return group.empty() ? version : group + "/" + version; }
};

// "/api/v1/namespaces/NS/pods", "/apis/lockstep.io/v1alpha1/trainingjobs" (ns empty: all
// namespaces, or a cluster-scoped resource).
std::string CollectionPath(const Resource& resource, const std::string& ns);
// CollectionPath + "/NAME" (+ "/SUBRESOURCE").
std::string ObjectPath(const Resource& resource, const std::string& ns, const std::string& name,
                       const std::string& subresource = "");

namespace resources {
extern const Resource kPods;
extern const Resource kServices;
extern const Resource kNodes;
extern const Resource kSecrets;
extern const Resource kEvents;                           // core/v1 Events
extern const Resource kLeases;                           // coordination.k8s.io/v1
extern const Resource kTrainingJobs;                     // lockstep.io/v1alpha1
extern const Resource kVolcanoPodGroups;                 // scheduling.volcano.sh/v1beta1
extern const Resource kSchedulerPluginsPodGroups;        // scheduling.x-k8s.io/v1alpha1
extern const Resource kCustomResourceDefinitions;        // apiextensions.k8s.io/v1, cluster-scoped
extern const Resource kValidatingWebhookConfigurations;  // admissionregistration.k8s.io/v1,
                                                         // cluster-scoped
}  // namespace resources

}  // namespace lockstep::op::kube
