// The parameter servers' children of a TrainingJob (children.h, "Parameter servers"): their
// headless Service and one pod per server.
#include <string>
#include <vector>

#include "common/base64.h"
#include "common/spec/tf_config.h"
#include "operator/trainingjob/children.h"
#include "operator/trainingjob/children_internal.h"
#include "operator/trainingjob/pod_agent.h"
#include "operator/trainingjob/pod_security.h"

namespace lockstep::op::trainingjob {

using internal::ChildMetadata;
using internal::EnvField;
using internal::EnvValue;
using internal::JobLabels;

namespace {

constexpr char kPortName[] = "ps";
// The servers' Secret's TLS keys, and where a server mounts them.
constexpr char kParameterServerCertKey[] = "tls.crt";
constexpr char kParameterServerKeyKey[] = "tls.key";
constexpr char kParameterServerSecretVolume[] = "lockstep-ps";
constexpr char kParameterServerSecretMountPath[] = "/var/run/lockstep-ps";
constexpr char kTfPortName[] = "tf";

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

std::string ParameterServerSecretName(const std::string& job_name) { return job_name + "-ps"; }

StatusOr<json> DesiredParameterServerSecret(const spec::TrainingJob& job,
                                            const std::string& ps_token, const tls::KeyPair* ca) {
  json data = {{internal::kTokenKey, Base64Encode(ps_token)}};
  if (ca != nullptr) {
    const std::string domain = "." + ParameterServerServiceName(job.metadata.name) + "." +
                               job.metadata.namespace_ + ".svc";
    std::vector<std::string> names = {"*" + domain};
    for (int32_t s = 0; s < job.spec.parameter_servers.replicas; ++s) {
      names.push_back(internal::Hostname(ParameterServerPodName(job.metadata.name, s)) + domain);
    }
    LOCKSTEP_ASSIGN_OR_RETURN(tls::KeyPair serving,
                              tls::IssueServingCertificate(*ca, names, {}, 365));
    data[kParameterServerCertKey] = Base64Encode(serving.cert_pem + ca->cert_pem);
    data[kParameterServerKeyKey] = Base64Encode(serving.key_pem);
  }
  return json{{"apiVersion", "v1"},
              {"kind", "Secret"},
              {"metadata",
               ChildMetadata(job, ParameterServerSecretName(job.metadata.name), ServerLabels(job))},
              {"type", "Opaque"},
              {"data", std::move(data)}};
}

std::string TensorflowConfig(const spec::TrainingJob& job, const spec::TfTask& task) {
  const std::string tail = "." + job.metadata.namespace_ + ".svc:" + std::to_string(spec::kTfPort);
  std::vector<std::string> workers, servers;
  for (int32_t i = 0; i < job.spec.replicas; ++i) {
    workers.push_back(internal::Hostname(PodName(job.metadata.name, i)) + "." +
                      ServiceName(job.metadata.name) + tail);
  }
  for (int32_t s = 0; s < job.spec.parameter_servers.replicas; ++s) {
    servers.push_back(internal::Hostname(ParameterServerPodName(job.metadata.name, s)) + "." +
                      ParameterServerServiceName(job.metadata.name) + tail);
  }
  return spec::TfConfig(workers, servers, task);
}

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
  const bool tensorflow = !job.spec.command.empty();
  json spec = {{"clusterIP", "None"},
               {"publishNotReadyAddresses", true},
               {"selector", std::move(selector)},
               {"ports", json::array({{{"name", tensorflow ? kTfPortName : kPortName},
                                       {"port", tensorflow ? spec::kTfPort : kParameterServerPort},
                                       {"targetPort", tensorflow ? kTfPortName : kPortName},
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
  const bool tensorflow = !job.spec.command.empty();
  json env = json::array({
      EnvValue("LOCKSTEP_JOB", job.metadata.namespace_ + "/" + job.metadata.name),
      internal::EnvSecret("LOCKSTEP_PS_TOKEN", ParameterServerSecretName(job.metadata.name),
                          internal::kTokenKey),
      EnvField("LOCKSTEP_POD", "metadata.name"),
      EnvValue("LOCKSTEP_SPEC", spec::ToJson(job).dump()),
  });
  json command = json::array({internal::kWorkerBinary, "ps", "--shard", std::to_string(shard),
                              "--listen", "0.0.0.0:" + std::to_string(kParameterServerPort)});
  if (tensorflow) {
    // TensorFlow's ps task: the job's own program, told its place by TF_CONFIG; it needs neither
    // the job's token nor its spec.
    command = job.spec.command;
    env = json::array({EnvValue("LOCKSTEP_JOB", job.metadata.namespace_ + "/" + job.metadata.name),
                       EnvField("LOCKSTEP_POD", "metadata.name"),
                       EnvValue("TF_CONFIG", TensorflowConfig(job, spec::TfTaskOfServer(shard)))});
  }
  json container = {
      {"name", kParameterServerContainer},
      {"image", WorkerImage(job.spec, settings.default_worker_image)},
      {"command", std::move(command)},
      {"env", std::move(env)},
      {"ports", json::array({{{"name", tensorflow ? kTfPortName : kPortName},
                              {"containerPort", tensorflow ? spec::kTfPort : kParameterServerPort},
                              {"protocol", "TCP"}}})}};
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
  const bool tls = !tensorflow && !settings.rendezvous_ca_pem.empty();
  json volumes = json::array();
  if (tls) {
    // The certificate and key only: the token comes as an env var, as the workers' does.
    const std::string mount = kParameterServerSecretMountPath;
    container["env"].push_back(
        EnvValue("LOCKSTEP_PS_TLS_CERT_FILE", mount + "/" + kParameterServerCertKey));
    container["env"].push_back(
        EnvValue("LOCKSTEP_PS_TLS_KEY_FILE", mount + "/" + kParameterServerKeyKey));
    container["volumeMounts"] = json::array(
        {{{"name", kParameterServerSecretVolume}, {"mountPath", mount}, {"readOnly", true}}});
    volumes.push_back(
        {{"name", kParameterServerSecretVolume},
         {"secret",
          {{"secretName", ParameterServerSecretName(job.metadata.name)},
           {"items",
            json::array({{{"key", kParameterServerCertKey}, {"path", kParameterServerCertKey}},
                         {{"key", kParameterServerKeyKey}, {"path", kParameterServerKeyKey}}})}}}});
  }
  json pod_spec = {{"restartPolicy", "Never"},
                   {"hostname", internal::Hostname(name)},
                   {"subdomain", ParameterServerServiceName(job.metadata.name)},
                   {"containers", json::array({std::move(container)})}};
  if (!volumes.empty()) pod_spec["volumes"] = std::move(volumes);
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
