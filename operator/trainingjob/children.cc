#include "operator/trainingjob/children.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/base64.h"
#include "operator/trainingjob/children_internal.h"
#include "operator/trainingjob/pod_agent.h"
#include "operator/trainingjob/pod_security.h"
#include "operator/trainingjob/pod_template.h"

namespace lockstep::op::trainingjob {

using internal::ChildMetadata;
using internal::EnvField;
using internal::EnvSecret;
using internal::EnvValue;
using internal::Hostname;
using internal::JobLabels;
using internal::TolerateNodeLoss;

namespace {

constexpr char kManagedByValue[] = "lockstep-operator";
constexpr char kJobApiVersion[] = "lockstep.io/v1alpha1";
constexpr char kJobKind[] = "TrainingJob";
using internal::kWorkerBinary;
constexpr char kMetricsPortName[] = "metrics";
// The job Secret's keys: the token reaches the worker as an env var (never a file), the CA as
// a file because gRPC wants PEM and env vars are visible in `kubectl describe pod` anyway.
using internal::kTokenKey;
constexpr char kCaKey[] = "ca.crt";
constexpr char kSecretVolume[] = "lockstep-rendezvous";
constexpr char kShmVolume[] = "lockstep-dshm";
constexpr char kGpuResource[] = "nvidia.com/gpu";
// Multus: the secondary networks a pod is attached to (comma-separated NetworkAttachmentDefinition
// names, optionally namespace/name).
constexpr char kMultusAnnotation[] = "k8s.v1.cni.cncf.io/networks";
// Volcano's pod -> PodGroup key (volcano.sh/apis scheduling/v1beta1 KubeGroupNameAnnotationKey).
constexpr char kVolcanoGroupAnnotation[] = "scheduling.k8s.io/group-name";
// scheduler-plugins' coscheduling pod -> PodGroup label (pkg/coscheduling/README.md).
constexpr char kSchedulerPluginsGroupLabel[] = "scheduling.x-k8s.io/pod-group";
constexpr char kPrometheusScrapeAnnotation[] = "prometheus.io/scrape";
constexpr char kPrometheusPortAnnotation[] = "prometheus.io/port";
constexpr char kVolcanoApiVersion[] = "scheduling.volcano.sh/v1beta1";
constexpr char kSchedulerPluginsApiVersion[] = "scheduling.x-k8s.io/v1alpha1";
// spec.hostname is a DNS-1123 label.
constexpr size_t kMaxHostnameLength = 63;

uint64_t Fnv1a64(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace

namespace internal {

// NoExecute tolerations of the node-lifecycle taints with the operator's tolerationSeconds,
// unless the pod already tolerates that taint (a template's choice wins).
void TolerateNodeLoss(json* pod, int64_t seconds) {
  if (seconds < 0) return;
  json& tolerations = (*pod)["spec"]["tolerations"];
  if (!tolerations.is_array()) tolerations = json::array();
  for (const char* key : {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}) {
    bool tolerated = false;
    for (const json& t : tolerations) {
      if (!t.is_object()) continue;
      // Only a NoExecute toleration (or one of every effect) decides eviction; no key and
      // operator Exists tolerates every taint.
      const std::string effect = t.value("effect", "");
      if (!effect.empty() && effect != "NoExecute") continue;
      const bool all = !t.contains("key") && t.value("operator", "") == "Exists";
      if (all || t.value("key", "") == key) tolerated = true;
    }
    if (tolerated) continue;
    tolerations.push_back({{"key", key},
                           {"operator", "Exists"},
                           {"effect", "NoExecute"},
                           {"tolerationSeconds", seconds}});
  }
}

json JobLabels(const spec::TrainingJob& job) {
  return {{kJobNameLabel, job.metadata.name}, {kManagedByLabel, kManagedByValue}};
}

json ChildMetadata(const spec::TrainingJob& job, const std::string& name, json labels) {
  return {{"name", name},
          {"namespace", job.metadata.namespace_},
          {"labels", std::move(labels)},
          {"ownerReferences", json::array({OwnerReference(job)})}};
}

json EnvValue(const std::string& name, const std::string& value) {
  return {{"name", name}, {"value", value}};
}

json EnvField(const std::string& name, const std::string& field_path) {
  return {{"name", name},
          {"valueFrom", {{"fieldRef", {{"apiVersion", "v1"}, {"fieldPath", field_path}}}}}};
}

json EnvSecret(const std::string& name, const std::string& secret, const std::string& key) {
  return {{"name", name}, {"valueFrom", {{"secretKeyRef", {{"name", secret}, {"key", key}}}}}};
}

// DNS of a worker is <hostname>.<service>.<namespace>.svc, so the hostname is the pod name when
// it fits a DNS label. Job names may be 63 characters, which makes "<job>-worker-<i>" too long;
// then the name is cut and a hash of the full name keeps workers apart. Workers never dial
// these names (peers use LOCKSTEP_HOST, the pod IP): they are for people and sidecars.
std::string Hostname(const std::string& pod_name) {
  if (pod_name.size() <= kMaxHostnameLength) return pod_name;
  char suffix[10];
  std::snprintf(suffix, sizeof(suffix), "-%08x",
                static_cast<uint32_t>(Fnv1a64(pod_name) & 0xffffffffu));
  std::string head = pod_name.substr(0, kMaxHostnameLength - 9);
  while (!head.empty() && head.back() == '-') head.pop_back();
  return head + suffix;
}

}  // namespace internal

namespace {

// The port worker `index` serves metrics on; 0: none.
int32_t MetricsPort(const spec::TrainingJob& job, int32_t index, const OperatorSettings& settings) {
  if (job.spec.metrics.port == 0) return 0;
  if (!job.spec.network.host_network) return job.spec.metrics.port;
  // A pod of N ranks takes N ports, its rank r port + r (the worker adds its local rank).
  return HostNetworkFirstPort(job, settings) +
         (index * job.spec.ranks_per_worker) % kHostNetworkPortBlockSize;
}

// NCCL settings per network mode; spec.network.ncclEnv overrides any of them and adds more.
// Only what the mode decides is set: NCCL's own detection is better than a guess for the rest.
//  - tcp: NCCL_IB_DISABLE=1, so NCCL uses sockets even where an HCA is visible (hostNetwork).
//  - roce/infiniband: NCCL_IB_DISABLE=0 (RoCE also runs on the IB verbs transport). The HCA comes
//    with the RDMA resource, so NCCL_IB_HCA is left to NCCL's detection. NCCL_IB_GID_INDEX is not
//    set: NCCL >= 2.21 picks the RoCEv2 GID itself; a cluster that needs a fixed one sets it
//    in ncclEnv.
//  - with Multus networks (and the pod network): NCCL_SOCKET_IFNAME=eth0. The pod then has eth0
//    (the pod network, where LOCKSTEP_HOST's address lives and every peer is routable) and
//    net1..netN (Multus' names); NCCL's bootstrap must not pick a secondary interface whose
//    subnet other pods may not route. Data still moves over the HCA: the IB transport chooses
//    devices by NCCL_IB_HCA, not by this variable. On hostNetwork the interface names are the
//    node's, which the operator cannot know, so nothing is set there.
std::map<std::string, std::string> NcclDefaults(const spec::NetworkSpec& network) {
  std::map<std::string, std::string> env;
  if (network.mode == spec::NetworkMode::kTcp) {
    env["NCCL_IB_DISABLE"] = "1";
    return env;
  }
  env["NCCL_IB_DISABLE"] = "0";
  if (!network.multus_networks.empty() && !network.host_network) {
    env["NCCL_SOCKET_IFNAME"] = "eth0";
  }
  return env;
}

bool IsRdma(const spec::NetworkSpec& network) {
  return network.mode == spec::NetworkMode::kRoce || network.mode == spec::NetworkMode::kInfiniband;
}

std::string Join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const std::string& part : parts) {
    if (!out.empty()) out += separator;
    out += part;
  }
  return out;
}

// ----- quantities ----------------------------------------------------------------------------

// `quantity` (a Kubernetes quantity: decimal number and suffix) times `factor`, keeping the
// suffix: "500m" x 3 = "1500m", "1.5" x 2 = "3", "64Gi" x 2 = "128Gi". nullopt when the text is
// not a plain non-negative quantity or the product overflows.
std::optional<std::string> MultiplyQuantity(const std::string& quantity, int64_t factor) {
  size_t i = 0;
  std::string digits;
  size_t fraction_digits = 0;
  bool point = false;
  for (; i < quantity.size(); ++i) {
    const char c = quantity[i];
    if (c >= '0' && c <= '9') {
      digits += c;
      if (point) ++fraction_digits;
    } else if (c == '.' && !point) {
      point = true;
    } else {
      break;
    }
  }
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  const std::string suffix = quantity.substr(i);
  static const std::set<std::string> kSuffixes = {"",  "n", "u",  "m",  "k",  "M",  "G",  "T",
                                                  "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  const bool exponent = suffix.size() >= 2 && (suffix[0] == 'e' || suffix[0] == 'E');
  if (!kSuffixes.count(suffix) && !exponent) return std::nullopt;
  const int64_t mantissa = std::stoll(digits);
  if (factor < 0 || (factor > 0 && mantissa > std::numeric_limits<int64_t>::max() / factor)) {
    return std::nullopt;
  }
  std::string product = std::to_string(mantissa * factor);
  if (fraction_digits > 0) {
    if (product.size() <= fraction_digits) {
      product.insert(0, fraction_digits + 1 - product.size(), '0');
    }
    std::string whole = product.substr(0, product.size() - fraction_digits);
    std::string fraction = product.substr(product.size() - fraction_digits);
    while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
    product = fraction.empty() ? whole : whole + "." + fraction;
  }
  return product + suffix;
}

// What one worker asks of a node, by resource name (requests, as schedulers count them).
std::map<std::string, std::string> WorkerRequests(const spec::TrainingJobSpec& spec) {
  std::map<std::string, std::string> requests;
  if (!spec.resources.cpu.empty()) requests["cpu"] = spec.resources.cpu;
  if (!spec.resources.memory.empty()) requests["memory"] = spec.resources.memory;
  if (spec.resources.gpus > 0) requests[kGpuResource] = std::to_string(spec.resources.gpus);
  if (IsRdma(spec.network) && !spec.network.rdma_resource.name.empty()) {
    requests[spec.network.rdma_resource.name] = std::to_string(spec.network.rdma_resource.count);
  }
  return requests;
}

}  // namespace

std::string PodName(const std::string& job_name, int32_t index) {
  return job_name + "-worker-" + std::to_string(index);
}
std::string ServiceName(const std::string& job_name) { return job_name; }
std::string SecretName(const std::string& job_name) { return job_name + "-rendezvous"; }
std::string PodGroupName(const std::string& job_name) { return job_name; }

std::string KueueQueue(const spec::TrainingJob& job) {
  auto it = job.metadata.labels.find(kKueueQueueLabel);
  return it == job.metadata.labels.end() ? "" : it->second;
}

std::string KueuePodGroupName(const spec::TrainingJob& job) {
  constexpr size_t kMaxLabelValue = 63;
  std::string tail = job.metadata.uid.substr(0, 8);
  tail += (tail.empty() ? "" : "-") + std::to_string(job.metadata.generation);
  std::string head = job.metadata.name.substr(0, kMaxLabelValue - 1 - tail.size());
  while (!head.empty() && head.back() == '-') head.pop_back();
  return head + "-" + tail;
}
std::string PodSelector(const std::string& job_name) {
  return std::string(kJobNameLabel) + "=" + job_name;
}

int32_t HostNetworkFirstPort(const spec::TrainingJob& job, const OperatorSettings& settings) {
  const std::string key = job.metadata.uid.empty()
                              ? job.metadata.namespace_ + "/" + job.metadata.name
                              : job.metadata.uid;
  const int64_t blocks =
      std::max<int64_t>(1, settings.host_network_port_count / kHostNetworkPortBlockSize);
  return settings.host_network_base_port +
         static_cast<int32_t>(Fnv1a64(key) % static_cast<uint64_t>(blocks)) *
             kHostNetworkPortBlockSize;
}

json OwnerReference(const spec::TrainingJob& job) {
  return {{"apiVersion", kJobApiVersion}, {"kind", kJobKind},   {"name", job.metadata.name},
          {"uid", job.metadata.uid},      {"controller", true}, {"blockOwnerDeletion", true}};
}

json DesiredSecret(const spec::TrainingJob& job, const std::string& token,
                   const std::string& ca_pem) {
  json data = {{kTokenKey, Base64Encode(token)}};
  if (!ca_pem.empty()) data[kCaKey] = Base64Encode(ca_pem);
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", ChildMetadata(job, SecretName(job.metadata.name), JobLabels(job))},
          {"type", "Opaque"},
          {"data", std::move(data)}};
}

json DesiredService(const spec::TrainingJob& job) {
  json spec = {{"clusterIP", "None"},
               {"publishNotReadyAddresses", true},
               {"selector", {{kJobNameLabel, job.metadata.name}}}};
  if (job.spec.metrics.port != 0) {
    // targetPort by name: with hostNetwork each worker's port differs, the name does not.
    spec["ports"] = json::array({{{"name", kMetricsPortName},
                                  {"port", job.spec.metrics.port},
                                  {"targetPort", kMetricsPortName},
                                  {"protocol", "TCP"}}});
  }
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", ChildMetadata(job, ServiceName(job.metadata.name), JobLabels(job))},
          {"spec", std::move(spec)}};
}

namespace {

// A preferred (never required) node-affinity term away from `nodes`, added to whatever the
// template asks: a cluster with no other node still runs the pod.
void PreferOtherNodes(json* pod, const std::vector<std::string>& nodes) {
  if (nodes.empty()) return;
  json& terms =
      (*pod)["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
  if (!terms.is_array()) terms = json::array();
  terms.push_back(
      {{"weight", 100},
       {"preference",
        {{"matchFields",
          json::array({{{"key", "metadata.name"}, {"operator", "NotIn"}, {"values", nodes}}})}}}});
}

// spec.placement without Kueue: a pod-affinity term to the job's own pods across the level's
// label, added to whatever the template asks. The first pod matches its own term, which the
// scheduler accepts when no other pod matches (so the job starts), and every later pod follows
// it into its domain; a node without the label is in no domain.
void PlaceTogether(json* pod, const spec::TrainingJob& job) {
  const spec::PlacementSpec& placement = job.spec.placement;
  json term = {{"labelSelector", {{"matchLabels", {{kJobNameLabel, job.metadata.name}}}}},
               {"topologyKey", placement.topology}};
  const bool required = placement.mode == spec::PlacementMode::kRequired;
  json& terms = (*pod)["spec"]["affinity"]["podAffinity"]
                      [required ? "requiredDuringSchedulingIgnoredDuringExecution"
                                : "preferredDuringSchedulingIgnoredDuringExecution"];
  if (!terms.is_array()) terms = json::array();
  if (required) {
    terms.push_back(std::move(term));
  } else {
    terms.push_back({{"weight", 100}, {"podAffinityTerm", std::move(term)}});
  }
}

}  // namespace

json DesiredPod(const spec::TrainingJob& job, int32_t index, const OperatorSettings& settings,
                const std::vector<std::string>& avoid_nodes, const std::string& name,
                const std::string& kueue_group) {
  const spec::TrainingJobSpec& spec = job.spec;
  const spec::NetworkSpec& network = spec.network;
  const std::string index_name = PodName(job.metadata.name, index);
  const std::string pod_name = name.empty() ? index_name : name;
  const bool rdma = IsRdma(network);
  const bool tls = !settings.rendezvous_ca_pem.empty();
  const int32_t metrics_port = MetricsPort(job, index, settings);

  json labels = JobLabels(job);
  labels[kReplicaIndexLabel] = std::to_string(index);
  json annotations = {{kSpecGenerationAnnotation, std::to_string(job.metadata.generation)}};
  if (metrics_port != 0) {
    annotations[kPrometheusScrapeAnnotation] = "true";
    annotations[kPrometheusPortAnnotation] = std::to_string(metrics_port);
  }
  if (rdma && !network.multus_networks.empty()) {
    annotations[kMultusAnnotation] = Join(network.multus_networks, ",");
  }
  const spec::SchedulingSpec& scheduling = spec.run_policy.scheduling;
  if (scheduling.gang == spec::GangScheduler::kVolcano) {
    annotations[kVolcanoGroupAnnotation] = PodGroupName(job.metadata.name);
  } else if (scheduling.gang == spec::GangScheduler::kSchedulerPlugins) {
    labels[kSchedulerPluginsGroupLabel] = PodGroupName(job.metadata.name);
  }
  if (const std::string queue = KueueQueue(job); !queue.empty()) {
    labels[kKueueQueueLabel] = queue;
    labels[kKueuePodGroupLabel] = kueue_group.empty() ? KueuePodGroupName(job) : kueue_group;
    annotations[kKueuePodGroupCountAnnotation] = std::to_string(spec::WorkersToRun(spec));
    // Kueue's topology-aware scheduling places the admitted group and pins each pod's node.
    if (!spec.placement.topology.empty()) {
      annotations[spec.placement.mode == spec::PlacementMode::kRequired
                      ? kKueueRequiredTopologyAnnotation
                      : kKueuePreferredTopologyAnnotation] = spec.placement.topology;
    }
  }

  json env = json::array({
      EnvValue("LOCKSTEP_RENDEZVOUS", settings.rendezvous_address),
      EnvValue("LOCKSTEP_JOB", job.metadata.namespace_ + "/" + job.metadata.name),
      EnvSecret("LOCKSTEP_JOB_TOKEN", SecretName(job.metadata.name), kTokenKey),
      EnvField("LOCKSTEP_POD", "metadata.name"),
      EnvField("LOCKSTEP_HOST", "status.podIP"),
      EnvValue("LOCKSTEP_SPEC", spec::ToJson(job).dump()),
  });
  if (tls) {
    env.push_back(
        EnvValue("LOCKSTEP_RENDEZVOUS_CA_FILE", std::string(kSecretMountPath) + "/" + kCaKey));
  }
  if (network.host_network && metrics_port != 0) {
    env.push_back(EnvValue("LOCKSTEP_METRICS_PORT", std::to_string(metrics_port)));
  }
  if (spec.parameter_servers.replicas > 0) {
    env.push_back(EnvValue("LOCKSTEP_WORKER_INDEX", std::to_string(index)));
    if (spec.trainer.has_value()) {
      env.push_back(EnvValue("LOCKSTEP_PS_SERVERS", ParameterServerAddresses(job)));
      // The servers' own token (worker/ps/ps_credentials.h); their certificates come from the
      // CA the job's Secret already mounts.
      env.push_back(
          EnvSecret("LOCKSTEP_PS_TOKEN", ParameterServerSecretName(job.metadata.name), kTokenKey));
      if (tls) {
        env.push_back(
            EnvValue("LOCKSTEP_PS_CA_FILE", std::string(kSecretMountPath) + "/" + kCaKey));
      }
    } else {
      env.push_back(EnvValue("TF_CONFIG", TensorflowConfig(job, spec::TfTaskOfWorker(index))));
    }
  }
  // Defaults a template may override, then ncclEnv, which always wins.
  std::map<std::string, std::string> nccl = NcclDefaults(network);
  std::set<std::string> overridable;
  for (const auto& [name, value] : nccl) {
    if (!network.nccl_env.count(name)) overridable.insert(name);
  }
  for (const auto& [name, value] : network.nccl_env) nccl[name] = value;
  for (const auto& [name, value] : nccl) env.push_back(EnvValue(name, value));

  // A command in an image of the user's runs under the agent the init container brings
  // (pod_agent.h); the operator's worker image holds lockstep-worker.
  const bool brings_agent = BringsAgent(spec, settings.default_worker_image);
  json command = json::array({brings_agent ? kAgentProgram : kWorkerBinary});
  if (spec.trainer.has_value()) {
    command.push_back("train");
  } else {
    command.push_back("exec");
    command.push_back("--");
    for (const std::string& word : spec.command) command.push_back(word);
  }

  json container = {{"name", kWorkerContainer},
                    {"image", WorkerImage(spec, settings.default_worker_image)},
                    {"command", std::move(command)},
                    {"env", std::move(env)}};

  // cpu/memory: requests = limits (Guaranteed QoS when both are set: a worker that is throttled
  // or evicted under pressure stalls every other rank). Devices are limits only; the API server
  // copies them to requests.
  json limits = json::object();
  json requests = json::object();
  if (!spec.resources.cpu.empty()) limits["cpu"] = requests["cpu"] = spec.resources.cpu;
  if (!spec.resources.memory.empty()) limits["memory"] = requests["memory"] = spec.resources.memory;
  if (spec.resources.gpus > 0) limits[kGpuResource] = std::to_string(spec.resources.gpus);
  if (rdma && !network.rdma_resource.name.empty()) {
    limits[network.rdma_resource.name] = std::to_string(network.rdma_resource.count);
  }
  if (!limits.empty()) {
    container["resources"]["limits"] = std::move(limits);
    if (!requests.empty()) container["resources"]["requests"] = std::move(requests);
  }

  if (metrics_port != 0) {
    // One port per rank: local rank r serves on metrics_port + r ("metrics", "metrics-1", ...).
    json ports = json::array();
    for (int32_t r = 0; r < spec.ranks_per_worker; ++r) {
      const int32_t number = metrics_port + r;
      json port = {{"name", r == 0 ? std::string(kMetricsPortName)
                                   : std::string(kMetricsPortName) + "-" + std::to_string(r)},
                   {"containerPort", number},
                   {"protocol", "TCP"}};
      // Declared as hostPort too, so the scheduler never puts two pods that want the same node
      // port on one node (see HostNetworkFirstPort on collisions).
      if (network.host_network) port["hostPort"] = number;
      ports.push_back(std::move(port));
    }
    container["ports"] = std::move(ports);
  }
  if (!spec.trainer.has_value() && spec.parameter_servers.replicas > 0) {
    // The TensorFlow task's port, as TF_CONFIG names it.
    container["ports"].push_back(
        {{"name", "tf"}, {"containerPort", spec::kTfPort}, {"protocol", "TCP"}});
  }

  json volumes = json::array();
  json mounts = json::array();
  if (tls) {
    volumes.push_back({{"name", kSecretVolume},
                       {"secret",
                        {{"secretName", SecretName(job.metadata.name)},
                         {"items", json::array({{{"key", kCaKey}, {"path", kCaKey}}})}}}});
    mounts.push_back(
        {{"name", kSecretVolume}, {"mountPath", kSecretMountPath}, {"readOnly", true}});
  }
  if (rdma) {
    // NCCL's shared-memory transport between GPUs of one pod needs more /dev/shm than a
    // container's default 64 MiB. (IPC_LOCK: HardenPod.)
    volumes.push_back({{"name", kShmVolume}, {"emptyDir", {{"medium", "Memory"}}}});
    mounts.push_back({{"name", kShmVolume}, {"mountPath", "/dev/shm"}});
  }
  if (!mounts.empty()) container["volumeMounts"] = std::move(mounts);

  json pod_spec = {{"restartPolicy", "Never"},
                   {"hostname", Hostname(index_name)},
                   {"subdomain", ServiceName(job.metadata.name)},
                   {"containers", json::array({std::move(container)})}};
  if (!volumes.empty()) pod_spec["volumes"] = std::move(volumes);
  if (network.host_network) {
    pod_spec["hostNetwork"] = true;
    // Without it a hostNetwork pod resolves with the node's resolv.conf and cannot find the
    // rendezvous Service by its cluster name.
    pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet";
  }
  if (scheduling.gang == spec::GangScheduler::kVolcano) {
    pod_spec["schedulerName"] = settings.volcano_scheduler_name;
  } else if (scheduling.gang == spec::GangScheduler::kSchedulerPlugins) {
    pod_spec["schedulerName"] = settings.scheduler_plugins_scheduler_name;
  }
  if (!scheduling.priority_class_name.empty()) {
    pod_spec["priorityClassName"] = scheduling.priority_class_name;
  }

  json metadata = ChildMetadata(job, pod_name, std::move(labels));
  metadata["annotations"] = std::move(annotations);
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", std::move(metadata)},
              {"spec", std::move(pod_spec)}};
  MergeTemplate(&pod, spec.template_, overridable);
  if (brings_agent) BringAgent(&pod, settings.agent_image);
  PreferOtherNodes(&pod, avoid_nodes);
  // Kueue's and Volcano's own topology scheduling, where they place the job, stand instead.
  if (!spec.placement.topology.empty() && KueueQueue(job).empty() &&
      spec.placement.volcano_tier == 0) {
    PlaceTogether(&pod, job);
  }
  TolerateNodeLoss(&pod, settings.node_loss_toleration_seconds);
  HardenPod(&pod, rdma);
  PointTerminationLog(&pod);
  return pod;
}

std::optional<json> DesiredPodGroup(const spec::TrainingJob& job) {
  const spec::SchedulingSpec& scheduling = job.spec.run_policy.scheduling;
  if (scheduling.gang == spec::GangScheduler::kNone) return std::nullopt;
  const int32_t min_member =
      job.spec.elastic.min_replicas > 0 ? job.spec.elastic.min_replicas : job.spec.replicas;
  json spec = {{"minMember", min_member}};
  std::string api_version;
  if (scheduling.gang == spec::GangScheduler::kVolcano) {
    api_version = kVolcanoApiVersion;
    spec["queue"] = scheduling.queue;
    if (!scheduling.priority_class_name.empty()) {
      spec["priorityClassName"] = scheduling.priority_class_name;
    }
    // Volcano admits the group only when a queue can hold minMember workers at once.
    json min_resources = json::object();
    for (const auto& [name, quantity] : WorkerRequests(job.spec)) {
      if (auto total = MultiplyQuantity(quantity, min_member)) min_resources[name] = *total;
    }
    if (!min_resources.empty()) spec["minResources"] = std::move(min_resources);
    // Volcano places by its HyperNodes' tiers (Volcano's network topology aware scheduling).
    const spec::PlacementSpec& placement = job.spec.placement;
    if (!placement.topology.empty() && placement.volcano_tier > 0 && KueueQueue(job).empty()) {
      spec["networkTopology"] = {
          {"mode", placement.mode == spec::PlacementMode::kRequired ? "hard" : "soft"},
          {"highestTierAllowed", placement.volcano_tier}};
    }
  } else {
    api_version = kSchedulerPluginsApiVersion;
    spec["scheduleTimeoutSeconds"] = static_cast<int32_t>(std::min<int64_t>(
        scheduling.schedule_timeout_seconds, std::numeric_limits<int32_t>::max()));
  }
  return json{{"apiVersion", api_version},
              {"kind", "PodGroup"},
              {"metadata", ChildMetadata(job, PodGroupName(job.metadata.name), JobLabels(job))},
              {"spec", std::move(spec)}};
}

}  // namespace lockstep::op::trainingjob
