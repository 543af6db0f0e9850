// The parameter servers' children of a TrainingJob (children.h, "Parameter servers"): their
// headless Service and one pod per server.
#include <string>

#include "operator/trainingjob/children.h"
#include "operator/trainingjob/children_internal.h"
#include "operator/trainingjob/pod_security.h"

namespace lockstep::op::trainingjob {

using internal::ChildMetadata;
using internal::EnvField;
using internal::EnvValue;
using internal::JobLabels;

namespace {

constexpr char kPortName[] = "ps";

json ServerLabels(const spec::TrainingJob& job) {
  json labels = JobLabels(job);
  labels[kReplicaTypeLabel] = "ps";
  return labels;
}

}  // namespace

std::string ParameterServerPodName(const std::string& job_name, int32_t shard) {
  return job_name + "-ps-" + std::to_string(shard);
}

std::string ParameterServerServiceName(const std::string& job_name) { return job_name + "-ps"; }

std::string ParameterServerAddresses(const spec::TrainingJob& job) {
  std::string addresses;
  const std::string service = ParameterServerServiceName(job.metadata.name);
  for (int32_t s = 0; s < job.spec.parameter_servers.replicas; ++s) {
    addresses += (s == 0 ? "" : ",") +
                 internal::Hostname(ParameterServerPodName(job.metadata.name, s)) + "." + service +
                 "." + job.metadata.namespace_ + ".svc:" + std::to_string(kParameterServerPort);
  }
  return addresses;
}

json DesiredParameterServerService(const spec::TrainingJob& job) {
  json selector = {{kJobNameLabel, job.metadata.name}, {kReplicaTypeLabel, "ps"}};
  json spec = {{"clusterIP", "None"},
               {"publishNotReadyAddresses", true},
               {"selector", std::move(selector)},
               {"ports", json::array({{{"name", kPortName},
                                       {"port", kParameterServerPort},
                                       {"targetPort", kPortName},
                                       {"protocol", "TCP"}}})}};
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata",
           ChildMetadata(job, ParameterServerServiceName(job.metadata.name), ServerLabels(job))},
          {"spec", std::move(spec)}};
}

json DesiredParameterServerPod(const spec::TrainingJob& job, int32_t shard,
                               const OperatorSettings& settings) {
  const std::string name = ParameterServerPodName(job.metadata.name, shard);
  json labels = ServerLabels(job);
  labels[kParameterServerIndexLabel] = std::to_string(shard);
  json env = json::array({
      EnvValue("LOCKSTEP_JOB", job.metadata.namespace_ + "/" + job.metadata.name),
      {{"name", "LOCKSTEP_JOB_TOKEN"},
       {"valueFrom",
        {{"secretKeyRef",
          {{"name", SecretName(job.metadata.name)}, {"key", internal::kTokenKey}}}}}},
      EnvField("LOCKSTEP_POD", "metadata.name"),
      EnvValue("LOCKSTEP_SPEC", spec::ToJson(job).dump()),
  });
  json container = {
      {"name", kParameterServerContainer},
      {"image", job.spec.image.empty() ? settings.default_worker_image : job.spec.image},
      {"command", json::array({internal::kWorkerBinary, "ps", "--shard", std::to_string(shard),
                               "--listen", "0.0.0.0:" + std::to_string(kParameterServerPort)})},
      {"env", std::move(env)},
      {"ports",
       json::array(
           {{{"name", kPortName}, {"containerPort", kParameterServerPort}, {"protocol", "TCP"}}})}};
  if (job.spec.metrics.port != 0) {
    // The workers' metrics port and its name, so the chart's PodMonitor scrapes the servers too.
    container["ports"].push_back(
        {{"name", "metrics"}, {"containerPort", job.spec.metrics.port}, {"protocol", "TCP"}});
  }
  const spec::ResourcesSpec& resources = job.spec.parameter_servers.resources;
  json limits = json::object();
  if (!resources.cpu.empty()) limits["cpu"] = resources.cpu;
  if (!resources.memory.empty()) limits["memory"] = resources.memory;
  if (!limits.empty()) {
    container["resources"]["limits"] = limits;
    container["resources"]["requests"] = limits;  // Guaranteed QoS, as the workers'
  }
  json pod_spec = {{"restartPolicy", "Never"},
                   {"hostname", internal::Hostname(name)},
                   {"subdomain", ParameterServerServiceName(job.metadata.name)},
                   {"containers", json::array({std::move(container)})}};
  if (!job.spec.run_policy.scheduling.priority_class_name.empty()) {
    pod_spec["priorityClassName"] = job.spec.run_policy.scheduling.priority_class_name;
  }
  json metadata = ChildMetadata(job, name, std::move(labels));
  metadata["annotations"] = {{kSpecGenerationAnnotation, std::to_string(job.metadata.generation)}};
  if (job.spec.metrics.port != 0) {
    metadata["annotations"]["prometheus.io/scrape"] = "true";
    metadata["annotations"]["prometheus.io/port"] = std::to_string(job.spec.metrics.port);
  }
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", std::move(metadata)},
              {"spec", std::move(pod_spec)}};
  internal::TolerateNodeLoss(&pod, settings.node_loss_toleration_seconds);
  HardenPod(&pod, /*rdma=*/false);
  PointTerminationLog(&pod);
  return pod;
}

}  // namespace lockstep::op::trainingjob
