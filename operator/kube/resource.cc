#include "operator/kube/resource.h"

namespace lockstep::op::kube {

std::string CollectionPath(const Resource& resource, const std::string& ns) {
  // The core group lives under /api, every named group under /apis.
  std::string path = resource.group.empty() ? "/api/" + resource.version
                                            : "/apis/" + resource.group + "/" + resource.version;
  if (resource.namespaced && !ns.empty()) path += "/namespaces/" + ns;
  return path + "/" + resource.plural;
}

std::string ObjectPath(const Resource& resource, const std::string& ns, const std::string& name,
                       const std::string& subresource) {
  std::string path = CollectionPath(resource, ns) + "/" + name;
  if (!subresource.empty()) path += "/" + subresource;
  return path;
}

namespace resources {
const Resource kPods{"", "v1", "pods", "Pod", true};
const Resource kServices{"", "v1", "services", "Service", true};
const Resource kNodes{"", "v1", "nodes", "Node", false};
const Resource kSecrets{"", "v1", "secrets", "Secret", true};
const Resource kEvents{"", "v1", "events", "Event", true};
const Resource kLeases{"coordination.k8s.io", "v1", "leases", "Lease", true};
const Resource kTrainingJobs{"lockstep.io", "v1alpha1", "trainingjobs", "TrainingJob", true};
const Resource kVolcanoPodGroups{"scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", true};
const Resource kSchedulerPluginsPodGroups{"scheduling.x-k8s.io", "v1alpha1", "podgroups",
                                          "PodGroup", true};
const Resource kCustomResourceDefinitions{"apiextensions.k8s.io", "v1", "customresourcedefinitions",
                                          "CustomResourceDefinition", false};
const Resource kValidatingWebhookConfigurations{"admissionregistration.k8s.io", "v1",
                                                "validatingwebhookconfigurations",
                                                "ValidatingWebhookConfiguration", false};
}  // namespace resources

}  // namespace lockstep::op::kube
