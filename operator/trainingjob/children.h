// The objects a TrainingJob owns, built from its spec: what Reconcile wants to exist. Pure
// functions of (job, settings, index): no I/O, so every rule is table-tested in
// tests/operator/trainingjob/children_test.cc.
//
//   json pod = DesiredPod(job, /*index=*/2, settings);       // "fashion-worker-2"
//   json svc = DesiredService(job);                           // headless, selects the job's pods
//   json secret = DesiredSecret(job, token, settings.rendezvous_ca_pem);
//   std::optional<json> group = DesiredPodGroup(job);         // nullopt without gang scheduling
//
// Every child carries the labels below, an ownerReference to the job (controller: true,
// blockOwnerDeletion: true) so Kubernetes' garbage collector deletes it with the job, and
// metadata.namespace of the job.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/spec/tf_config.h"
#include "common/spec/training_job.h"
#include "common/status.h"
#include "common/tls/certificates.h"

namespace lockstep::op::trainingjob {

using json = nlohmann::json;

inline constexpr char kJobNameLabel[] = "lockstep.io/job-name";
inline constexpr char kReplicaIndexLabel[] = "lockstep.io/replica-index";
inline constexpr char kManagedByLabel[] = "app.kubernetes.io/managed-by";  // "lockstep-operator"
inline constexpr char kWorkerContainer[] = "worker";
// Annotation on each pod: the job's metadata.generation the pod was built for (debugging).
inline constexpr char kSpecGenerationAnnotation[] = "lockstep.io/spec-generation";

// Kueue's plain pod groups (Kueue's "Run Plain Pods" and KEP-976): a job labelled with a
// LocalQueue runs as one group whose pods carry the queue, the group's name and its size. Kueue
// admits the group as a whole, never recreates a pod (the operator does, and the replacement
// joins the group), and ends a group that is not finished once a pod says it is not retriable.
inline constexpr char kKueueQueueLabel[] = "kueue.x-k8s.io/queue-name";
inline constexpr char kKueuePodGroupLabel[] = "kueue.x-k8s.io/pod-group-name";
inline constexpr char kKueuePodGroupCountAnnotation[] = "kueue.x-k8s.io/pod-group-total-count";
inline constexpr char kKueueRetriableAnnotation[] = "kueue.x-k8s.io/retriable-in-group";
// Kueue's topology-aware scheduling (TAS): the level (a node label key) the group must or should
// fit in.
inline constexpr char kKueueRequiredTopologyAnnotation[] =
    "kueue.x-k8s.io/podset-required-topology";
inline constexpr char kKueuePreferredTopologyAnnotation[] =
    "kueue.x-k8s.io/podset-preferred-topology";
// The LocalQueue the job is labelled with; empty when Kueue does not queue it.
std::string KueueQueue(const spec::TrainingJob& job);
// The name of a pod group the job starts, which is also the name of the Workload Kueue makes for
// it: "<job>-<the first 8 characters of its uid>-<metadata.generation>". The uid keeps a job
// created again under the same name out of its predecessor's group, the generation a job resumed
// after a suspend out of the group it ended. At most 63 characters (a label value); the job's
// name is cut to fit. A group keeps its name while it has pods (the reconciler reads it back).
std::string KueuePodGroupName(const spec::TrainingJob& job);

// Where the job's Secret is mounted in every worker (ca.crt; the token comes as an env var).
inline constexpr char kSecretMountPath[] = "/var/run/lockstep";

// What the operator knows about itself that pods need.
struct OperatorSettings {
  // host:port that workers dial for rendezvous (the operator's rendezvous Service).
  std::string rendezvous_address;
  // PEM of the CA that signed the rendezvous serving certificate; empty: plaintext (tests).
  std::string rendezvous_ca_pem;
  // Image when the job names none (spec.image, or its template's worker container's image).
  std::string default_worker_image = "lockstep-worker:0.1";
  // The agent image (the Dockerfile's agent stage) whose init container brings the exec agent
  // into a command job's own image (pod_agent.h).
  std::string agent_image = "lockstep-agent:0.1";
  // Volcano / scheduler-plugins scheduler names used with gang scheduling.
  std::string volcano_scheduler_name = "volcano";
  std::string scheduler_plugins_scheduler_name = "scheduler-plugins-scheduler";
  // The hostNetwork port range [base, base + count); each job gets a block of
  // kHostNetworkPortBlockSize ports in it (see DesiredPod). The default stays below both the
  // default NodePort range (30000-32767: kube-proxy intercepts those on every node) and Linux's
  // ephemeral range (32768-60999: any outgoing connection may hold one).
  int32_t host_network_base_port = 20000;
  int32_t host_network_port_count = 4096;
  // tolerationSeconds of the worker pods' NoExecute tolerations for node.kubernetes.io/not-ready
  // and /unreachable: how long a worker stays bound to a node that stopped answering before the
  // taint manager evicts it (Kubernetes' default, 300 s, leaves a job that long with its ranks on
  // a dead node). A template that tolerates either taint itself keeps its own. < 0: none added.
  int64_t node_loss_toleration_seconds = 30;
};

// Ports per job in the hostNetwork range: rank r of worker i (ranksPerWorker N) serves metrics
// on the block's port (i * N mod kHostNetworkPortBlockSize) + r, so up to that many ranks of one
// job can share a node (a pod of 8 ranks takes the whole block: one such pod per node).
inline constexpr int32_t kHostNetworkPortBlockSize = 8;
// The first port of the job's hostNetwork block: a hash of metadata.uid (namespace/name when the
// uid is empty) picks one of count / kHostNetworkPortBlockSize blocks (512 by default).
//
// Collisions are possible and handled by the scheduler, not prevented: each metrics port is
// also the container's hostPort, and the scheduler never places two pods wanting the same
// hostPort on one node. Two jobs whose blocks collide (1 in 512 for a given pair; among 20
// hostNetwork jobs about a 1 in 3 chance that some pair does) therefore cannot share a node for
// the colliding workers, and workers i and i+8 of one job are kept on different nodes; nothing
// fails at bind time. A process outside Kubernetes holding a port of the range is not seen by
// the scheduler: keep the range free on GPU nodes. Collective ports need no block: Gloo, NCCL's
// bootstrap and the exec agent's MASTER_PORT all bind port 0 and publish what the kernel gave
// them through the rendezvous store.
int32_t HostNetworkFirstPort(const spec::TrainingJob& job, const OperatorSettings& settings);

std::string PodName(const std::string& job_name, int32_t index);  // "<job>-worker-<index>"
std::string ServiceName(const std::string& job_name);             // "<job>" (headless)
std::string SecretName(const std::string& job_name);              // "<job>-rendezvous"
std::string PodGroupName(const std::string& job_name);            // "<job>"
// "lockstep.io/job-name=<job>": the scale subresource's status.selector and the pod informer's.
std::string PodSelector(const std::string& job_name);

json OwnerReference(const spec::TrainingJob& job);  // needs job.metadata.uid

// Secret (type Opaque): data.token (the rendezvous token, base64) and data["ca.crt"] when
// ca_pem is not empty.
json DesiredSecret(const spec::TrainingJob& job, const std::string& token,
                   const std::string& ca_pem);

// Headless Service (clusterIP None, publishNotReadyAddresses) selecting the job's pods, so
// workers reach each other at <pod>.<job>.<namespace>.svc before they are Ready.
json DesiredService(const spec::TrainingJob& job);

// One worker pod. Container "worker": the image the job names (spec.template's worker container's,
// or spec.image; else the operator's worker image), `lockstep-worker train` (or `exec --
// command...`; in an image of the user's, the agent the init container brings: pod_agent.h),
// env (docs/architecture.md: LOCKSTEP_RENDEZVOUS, LOCKSTEP_JOB, LOCKSTEP_JOB_TOKEN from the Secret,
// LOCKSTEP_POD from metadata.name, LOCKSTEP_HOST from status.podIP, LOCKSTEP_SPEC = the spec's
// JSON, LOCKSTEP_RENDEZVOUS_CA_FILE when TLS), resources (cpu, memory, nvidia.com/gpu), the
// metrics port and prometheus.io annotations, restartPolicy Never (the operator replaces pods,
// the kubelet does not restart them), hostname + subdomain for DNS. Network modes roce and
// infiniband add the RDMA resource, the Multus annotation k8s.v1.cni.cncf.io/networks, the
// IPC_LOCK capability, a memory-backed /dev/shm and NCCL_IB_* / NCCL_SOCKET_IFNAME defaults
// (spec.network.ncclEnv wins). hostNetwork only when asked, with dnsPolicy
// ClusterFirstWithHostNet and the metrics port (also LOCKSTEP_METRICS_PORT and the hostPort)
// from the job's block (HostNetworkFirstPort). Gang scheduling sets schedulerName and the
// scheduler's pod-group annotation/label. spec.template is merged last: its metadata labels and
// annotations are added, its containers are merged by name into ours (its "worker" container's
// env, volumeMounts, resources... added; ours win on conflicts of what the operator owns), and
// every other pod-spec field it sets is kept (the exact rules: MergeTemplate in pod_template.h).
// Then the Pod Security "restricted" defaults, where the template is silent (no service account
// token, seccomp RuntimeDefault, a non-root worker without privilege escalation or capabilities;
// an RDMA worker runs as root with IPC_LOCK alone): HardenPod in pod_security.h.
// avoid_nodes (a job's status.stragglerNodes): a preferred node-affinity term away from them is
// added to the template's own affinity. A job Kueue queues (KueueQueue) gets the queue label,
// the pod group's label and its size (spec.replicas + spec.elastic.standby) on every pod.
// spec.placement becomes Kueue's topology annotation for such a job, and a pod-affinity term to
// the job's pods across the level's label otherwise.
// A parameter-server job's worker also gets LOCKSTEP_WORKER_INDEX (its index) and
// LOCKSTEP_PS_SERVERS (ParameterServerAddresses).
// name: the pod's name when it is not PodName(job, index) (a replacement that cannot take the
// name of its predecessor); the hostname stays PodName's. kueue_group: the pod group it joins;
// empty: KueuePodGroupName(job).
json DesiredPod(const spec::TrainingJob& job, int32_t index, const OperatorSettings& settings,
                const std::vector<std::string>& avoid_nodes = {}, const std::string& name = "",
                const std::string& kueue_group = "");

// Parameter servers (spec.parameterServers; docs/parameter-servers.md). Pod s is
// "<job>-ps-<s>", labelled with the replica type "ps" and its index (not the workers' replica
// index: the workers' reconcile never sees it), behind its own headless Service "<job>-ps"
// (port 7470, "ps"), so workers reach server s at "<job>-ps-<s>.<job>-ps.<namespace>.svc:7470"
// (LOCKSTEP_PS_SERVERS). Container "ps": `lockstep-worker ps --shard s --listen 0.0.0.0:7470`,
// the job's spec (LOCKSTEP_SPEC), name (LOCKSTEP_JOB), the servers' token and, with TLS, their
// certificate and key (from the Secret "<job>-ps", worker/ps/ps_credentials.h; never the
// rendezvous token), the servers'
// own resources (spec.parameterServers.resources); restartPolicy Never (a lost server's pod is
// replaced by the operator and restores its shard's checkpoint), the node-loss tolerations and
// the restricted security defaults. spec.template is the workers' and is not applied; the
// servers are not part of a gang or Kueue group (they hold no GPU).
inline constexpr char kReplicaTypeLabel[] = "lockstep.io/replica-type";  // "ps" on servers
inline constexpr char kParameterServerIndexLabel[] = "lockstep.io/ps-index";
inline constexpr char kParameterServerContainer[] = "ps";
inline constexpr int32_t kParameterServerPort = 7470;
std::string ParameterServerPodName(const std::string& job_name, int32_t shard);  // "<job>-ps-<s>"
std::string ParameterServerServiceName(const std::string& job_name);             // "<job>-ps"
// "<job>-ps-0.<job>-ps.<ns>.svc:7470,...": the workers' LOCKSTEP_PS_SERVERS.
std::string ParameterServerAddresses(const spec::TrainingJob& job);
// An exec job's (spec.command) TF_CONFIG for `task` (common/spec/tf_config.h): the workers at
// "<job>-worker-<i>.<job>.<ns>.svc:2222", the servers at "<job>-ps-<s>.<job>-ps.<ns>.svc:2222".
// Its worker pods get it, with container port 2222 ("tf"), and its server pods run spec.command
// with it instead of `lockstep-worker ps`.
std::string TensorflowConfig(const spec::TrainingJob& job, const spec::TfTask& task);
json DesiredParameterServerService(const spec::TrainingJob& job);
// The built-in trainer's servers' Secret "<job>-ps": their token ("token") and, given the
// operator's CA (a null `ca`: plaintext, as the rendezvous then is), a serving certificate for
// every server's name and "*.<job>-ps.<namespace>.svc" ("tls.crt", the CA appended) and its key
// ("tls.key"). The workers get the token and trust the CA of the job's Secret.
std::string ParameterServerSecretName(const std::string& job_name);  // "<job>-ps"
StatusOr<json> DesiredParameterServerSecret(const spec::TrainingJob& job,
                                            const std::string& ps_token, const tls::KeyPair* ca);
json DesiredParameterServerPod(const spec::TrainingJob& job, int32_t shard,
                               const OperatorSettings& settings);

// Volcano: scheduling.volcano.sh/v1beta1 PodGroup {minMember, queue, priorityClassName,
// minResources}; scheduler-plugins: scheduling.x-k8s.io/v1alpha1 PodGroup {minMember,
// scheduleTimeoutSeconds}. minMember = elastic.minReplicas. nullopt when gang is none. A Volcano
// group gets networkTopology {mode hard|soft, highestTierAllowed} from spec.placement's
// volcanoTier.
std::optional<json> DesiredPodGroup(const spec::TrainingJob& job);

}  // namespace lockstep::op::trainingjob
