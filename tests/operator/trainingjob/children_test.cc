// The children a TrainingJob owns (operator/trainingjob/children.h), rule by rule: what a pod
// gets from each part of the spec, and what the Service, Secret and PodGroup look like.
// children_apiserver_test.cc checks that a real kube-apiserver accepts all of them.
#include "operator/trainingjob/children.h"

#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/base64.h"
#include "common/tls/certificates.h"
#include "tests/support/kube/pod_security.h"

namespace lockstep::op::trainingjob {
namespace {

using ::lockstep::testing::RestrictedProfileViolations;

constexpr char kBaseManifest[] = R"(
apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: mnist, namespace: team-a}
spec:
  replicas: 2
  trainer:
    data: {format: csv, train: [file:///data/train.csv]}
    steps: 10
)";

spec::TrainingJob ParseJob(const std::string& yaml, const std::string& uid = "uid-1") {
  auto job = spec::ParseTrainingJobYaml(yaml, "test");
  EXPECT_TRUE(job.ok()) << job.status().message();
  if (!job.ok()) return {};
  job->metadata.uid = uid;
  job->metadata.generation = 3;
  return *job;
}

// The base manifest with `extra` appended under spec (two-space indented YAML lines).
spec::TrainingJob JobWith(const std::string& extra, const std::string& uid = "uid-1") {
  return ParseJob(std::string(kBaseManifest) + extra, uid);
}

OperatorSettings Settings() {
  OperatorSettings settings;
  settings.rendezvous_address = "lockstep-rendezvous.lockstep-system.svc:7070";
  return settings;
}

const json& Worker(const json& pod) { return pod["spec"]["containers"][0]; }

// The env entry named `name` in the worker container; null when absent.
json Env(const json& pod, const std::string& name) {
  for (const json& entry : Worker(pod).value("env", json::array())) {
    if (entry["name"] == name) return entry;
  }
  return nullptr;
}

std::string EnvText(const json& pod, const std::string& name) {
  json entry = Env(pod, name);
  return entry.is_object() ? entry.value("value", "<valueFrom>") : "<unset>";
}

int CountEnv(const json& pod, const std::string& name) {
  int count = 0;
  for (const json& entry : Worker(pod).value("env", json::array())) count += entry["name"] == name;
  return count;
}

TEST(ChildNamesTest, NamesFollowTheJob) {
  EXPECT_EQ(PodName("mnist", 3), "mnist-worker-3");
  EXPECT_EQ(ServiceName("mnist"), "mnist");
  EXPECT_EQ(SecretName("mnist"), "mnist-rendezvous");
  EXPECT_EQ(PodGroupName("mnist"), "mnist");
  EXPECT_EQ(PodSelector("mnist"), "lockstep.io/job-name=mnist");
}

TEST(DesiredPodTest, WorkerEnvironmentReachesRendezvousAsThisJobAndPod) {
  spec::TrainingJob job = JobWith("");
  json pod = DesiredPod(job, 1, Settings());
  EXPECT_EQ(EnvText(pod, "LOCKSTEP_RENDEZVOUS"), "lockstep-rendezvous.lockstep-system.svc:7070");
  EXPECT_EQ(EnvText(pod, "LOCKSTEP_JOB"), "team-a/mnist");
  EXPECT_EQ(Env(pod, "LOCKSTEP_JOB_TOKEN")["valueFrom"],
            json({{"secretKeyRef", {{"name", "mnist-rendezvous"}, {"key", "token"}}}}));
  EXPECT_EQ(Env(pod, "LOCKSTEP_POD")["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
  EXPECT_EQ(Env(pod, "LOCKSTEP_HOST")["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
  // The worker reads the whole manifest back from LOCKSTEP_SPEC.
  auto spec_back = spec::ParseTrainingJobJson(json::parse(EnvText(pod, "LOCKSTEP_SPEC")), "env");
  ASSERT_TRUE(spec_back.ok()) << spec_back.status().message();
  EXPECT_TRUE(spec_back->spec == job.spec);
  EXPECT_EQ(spec_back->metadata.name, "mnist");
  // Plaintext rendezvous: no CA file, no Secret volume.
  EXPECT_TRUE(Env(pod, "LOCKSTEP_RENDEZVOUS_CA_FILE").is_null());
  EXPECT_FALSE(pod["spec"].contains("volumes"));
  // The token is never written into the pod in clear.
  EXPECT_EQ(pod.dump().find("s3cret"), std::string::npos);
}

TEST(DesiredPodTest, TlsMountsTheCaFromTheJobSecretReadOnly) {
  OperatorSettings settings = Settings();
  settings.rendezvous_ca_pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  json pod = DesiredPod(JobWith(""), 0, settings);
  EXPECT_EQ(EnvText(pod, "LOCKSTEP_RENDEZVOUS_CA_FILE"), "/var/run/lockstep/ca.crt");
  json volume = pod["spec"]["volumes"][0];
  EXPECT_EQ(volume["secret"]["secretName"], "mnist-rendezvous");
  EXPECT_EQ(volume["secret"]["items"], json::parse(R"([{"key":"ca.crt","path":"ca.crt"}])"));
  json mount = Worker(pod)["volumeMounts"][0];
  EXPECT_EQ(mount["name"], volume["name"]);
  EXPECT_EQ(mount["mountPath"], "/var/run/lockstep");
  EXPECT_EQ(mount["readOnly"], true);
}

TEST(DesiredPodTest, CommandIsTrainForTheTrainerAndExecForACommand) {
  EXPECT_EQ(Worker(DesiredPod(JobWith(""), 0, Settings()))["command"],
            json::array({"lockstep-worker", "train"}));
  spec::TrainingJob exec = ParseJob(R"(
apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: ddp}
spec:
  replicas: 2
  command: ["python3", "train.py", "--epochs", "3"]
)");
  EXPECT_EQ(Worker(DesiredPod(exec, 0, Settings()))["command"],
            json::array({"lockstep-worker", "exec", "--", "python3", "train.py", "--epochs", "3"}));
}

// Workers write their error (and exec agents that they gave up) to the file the kubelet reads:
// the default terminationMessagePath, or the one the template sets.
TEST(DesiredPodTest, EveryWorkerWritesItsErrorWhereTheKubeletReads) {
  const std::string manifest = R"(
apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: ddp}
spec:
  replicas: 1
  command: ["python3", "train.py"]
)";
  EXPECT_EQ(EnvText(DesiredPod(ParseJob(manifest), 0, Settings()), "LOCKSTEP_TERMINATION_LOG"),
            "/dev/termination-log");
  const json moved =
      DesiredPod(ParseJob(manifest + "  template: {spec: {containers: [{name: worker, "
                                     "terminationMessagePath: /var/run/why}]}}\n"),
                 0, Settings());
  EXPECT_EQ(EnvText(moved, "LOCKSTEP_TERMINATION_LOG"), "/var/run/why");
  EXPECT_EQ(CountEnv(moved, "LOCKSTEP_TERMINATION_LOG"), 1);
  EXPECT_EQ(EnvText(DesiredPod(JobWith(""), 0, Settings()), "LOCKSTEP_TERMINATION_LOG"),
            "/dev/termination-log")
      << "the built-in trainer's workers too";
}

// A worker on a node that stops answering is evicted after the operator's tolerationSeconds,
// not Kubernetes' 300 s; a template that tolerates the taint itself keeps its choice.
TEST(DesiredPodTest, WorkersLeaveALostNodeAfterTheOperatorsTolerationSeconds) {
  OperatorSettings settings = Settings();
  settings.node_loss_toleration_seconds = 30;
  const json pod = DesiredPod(JobWith(""), 0, settings);
  std::map<std::string, int64_t> seconds;
  for (const json& t : pod["spec"]["tolerations"]) {
    EXPECT_EQ(t["effect"], "NoExecute");
    EXPECT_EQ(t["operator"], "Exists");
    seconds[t["key"]] = t["tolerationSeconds"];
  }
  EXPECT_EQ(seconds, (std::map<std::string, int64_t>{{"node.kubernetes.io/not-ready", 30},
                                                     {"node.kubernetes.io/unreachable", 30}}));

  const json own =
      DesiredPod(JobWith("  template: {spec: {tolerations: [{key: node.kubernetes.io/unreachable, "
                         "operator: Exists, effect: NoExecute, tolerationSeconds: 600}]}}\n"),
                 0, settings);
  seconds.clear();
  for (const json& t : own["spec"]["tolerations"]) seconds[t["key"]] = t["tolerationSeconds"];
  EXPECT_EQ(seconds, (std::map<std::string, int64_t>{{"node.kubernetes.io/not-ready", 30},
                                                     {"node.kubernetes.io/unreachable", 600}}));

  const json no_schedule =
      DesiredPod(JobWith("  template: {spec: {tolerations: [{key: node.kubernetes.io/unreachable, "
                         "operator: Exists, effect: NoSchedule}]}}\n"),
                 0, settings);
  int no_execute = 0;
  for (const json& t : no_schedule["spec"]["tolerations"]) {
    no_execute += t.value("effect", "") == "NoExecute";
  }
  EXPECT_EQ(no_execute, 2) << "a NoSchedule toleration does not decide eviction";

  settings.node_loss_toleration_seconds = -1;
  EXPECT_FALSE(DesiredPod(JobWith(""), 0, settings)["spec"].contains("tolerations"))
      << "-1: the cluster's default tolerations";
}

TEST(DesiredPodTest, PodIsOwnedLabelledAndNeverRestartedByTheKubelet) {
  json pod = DesiredPod(JobWith(""), 1, Settings());
  EXPECT_EQ(pod["apiVersion"], "v1");
  EXPECT_EQ(pod["kind"], "Pod");
  EXPECT_EQ(pod["metadata"]["name"], "mnist-worker-1");
  EXPECT_EQ(pod["metadata"]["namespace"], "team-a");
  EXPECT_EQ(pod["metadata"]["labels"],
            json({{"lockstep.io/job-name", "mnist"},
                  {"lockstep.io/replica-index", "1"},
                  {"app.kubernetes.io/managed-by", "lockstep-operator"}}));
  EXPECT_EQ(pod["metadata"]["annotations"]["lockstep.io/spec-generation"], "3");
  EXPECT_EQ(pod["metadata"]["ownerReferences"],
            json::array({{{"apiVersion", "lockstep.io/v1alpha1"},
                          {"kind", "TrainingJob"},
                          {"name", "mnist"},
                          {"uid", "uid-1"},
                          {"controller", true},
                          {"blockOwnerDeletion", true}}}));
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  EXPECT_EQ(pod["spec"]["hostname"], "mnist-worker-1");
  EXPECT_EQ(pod["spec"]["subdomain"], "mnist");
  EXPECT_EQ(Worker(pod)["name"], "worker");
  EXPECT_EQ(Worker(pod)["image"], "lockstep-worker:0.1");
  EXPECT_EQ(Worker(DesiredPod(JobWith("  image: registry.example/w:2\n"), 0, Settings()))["image"],
            "registry.example/w:2");
  EXPECT_FALSE(pod["spec"].contains("hostNetwork"));
  EXPECT_FALSE(pod["spec"].contains("schedulerName"));
}

TEST(DesiredPodTest, LongJobNamesStillGetADnsLabelHostname) {
  const std::string name(63, 'a');
  spec::TrainingJob job = JobWith("");
  job.metadata.name = name;
  std::set<std::string> hostnames;
  for (int32_t index : {0, 1, 10, 11}) {
    json pod = DesiredPod(job, index, Settings());
    const std::string hostname = pod["spec"]["hostname"];
    EXPECT_LE(hostname.size(), 63u);
    EXPECT_NE(hostname.back(), '-');
    EXPECT_EQ(pod["metadata"]["name"], name + "-worker-" + std::to_string(index));
    hostnames.insert(hostname);
  }
  EXPECT_EQ(hostnames.size(), 4u);
}

TEST(DesiredPodTest, MetricsPortIsNamedAndAnnotatedForPrometheus) {
  json pod = DesiredPod(JobWith("  metrics: {port: 9400}\n"), 0, Settings());
  EXPECT_EQ(Worker(pod)["ports"],
            json::parse(R"([{"name":"metrics","containerPort":9400,"protocol":"TCP"}])"));
  EXPECT_EQ(pod["metadata"]["annotations"]["prometheus.io/scrape"], "true");
  EXPECT_EQ(pod["metadata"]["annotations"]["prometheus.io/port"], "9400");

  json none = DesiredPod(JobWith("  metrics: {port: 0}\n"), 0, Settings());
  EXPECT_FALSE(Worker(none).contains("ports"));
  EXPECT_FALSE(none["metadata"]["annotations"].contains("prometheus.io/scrape"));
}

TEST(DesiredPodTest, PodOfSeveralRanksRequestsTheirGpusAndAMetricsPortPerRank) {
  // ranksPerWorker auto with 4 GPUs: 4 ranks, each with a GPU and a metrics port.
  json pod = DesiredPod(
      JobWith("  resources: {gpus: 4}\n  ranksPerWorker: auto\n  metrics: {port: 9400}\n"), 1,
      Settings());
  EXPECT_EQ(Worker(pod)["resources"]["limits"]["nvidia.com/gpu"], "4");
  EXPECT_EQ(Worker(pod)["ports"], json::parse(R"([
      {"name":"metrics","containerPort":9400,"protocol":"TCP"},
      {"name":"metrics-1","containerPort":9401,"protocol":"TCP"},
      {"name":"metrics-2","containerPort":9402,"protocol":"TCP"},
      {"name":"metrics-3","containerPort":9403,"protocol":"TCP"}])"));
  // The pod's supervisor reads ranksPerWorker from the spec it is given, and numbers its ranks.
  const json spec = json::parse(EnvText(pod, "LOCKSTEP_SPEC"));
  EXPECT_EQ(spec["spec"]["ranksPerWorker"], 4) << spec.dump();
  EXPECT_EQ(EnvText(pod, "LOCKSTEP_POD"), "<valueFrom>");  // the pod's name: the member

  // hostNetwork: pod i's ranks take ports (i * 4 mod 8) + r of the job's block.
  json host = DesiredPod(JobWith("  resources: {gpus: 4}\n  ranksPerWorker: auto\n"
                                 "  network: {hostNetwork: true}\n  metrics: {port: 9400}\n"),
                         1, Settings());
  const int32_t first = Worker(host)["ports"][0]["hostPort"].get<int32_t>();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(Worker(host)["ports"][r]["hostPort"], first + r);
    EXPECT_EQ(Worker(host)["ports"][r]["containerPort"], first + r);
  }
  EXPECT_EQ(EnvText(host, "LOCKSTEP_METRICS_PORT"), std::to_string(first));
}

TEST(DesiredPodTest, ResourcesRequestEqualsLimitAndGpusAreLimits) {
  struct Case {
    std::string resources;
    json expected;  // null: no resources field
  };
  const Case cases[] = {
      {"", nullptr},
      {"  resources: {cpu: \"2\", memory: 8Gi}\n",
       json::parse(
           R"({"limits":{"cpu":"2","memory":"8Gi"},"requests":{"cpu":"2","memory":"8Gi"}})")},
      {"  resources: {gpus: 4}\n", json::parse(R"({"limits":{"nvidia.com/gpu":"4"}})")},
      {"  resources: {gpus: 1, cpu: 500m}\n",
       json::parse(R"({"limits":{"cpu":"500m","nvidia.com/gpu":"1"},"requests":{"cpu":"500m"}})")},
  };
  for (const Case& c : cases) {
    json worker = Worker(DesiredPod(JobWith(c.resources), 0, Settings()));
    if (c.expected.is_null()) {
      EXPECT_FALSE(worker.contains("resources")) << c.resources;
    } else {
      EXPECT_EQ(worker["resources"], c.expected) << c.resources;
    }
  }
}

TEST(DesiredPodTest, RdmaModesGetDeviceMultusIpcLockShmAndNcclSettings) {
  struct Case {
    std::string network;
    bool rdma;
    std::string multus;  // annotation; "" = none
    std::string ib_disable;
    std::string socket_ifname;  // "<unset>" when not set
  };
  const Case cases[] = {
      {"  network: {mode: tcp}\n", false, "", "1", "<unset>"},
      {"  network: {mode: roce, rdmaResource: {name: rdma/roce_shared, count: 1}, "
       "multusNetworks: [roce-net, kube-system/roce-net-b]}\n",
       true, "roce-net,kube-system/roce-net-b", "0", "eth0"},
      {"  network: {mode: infiniband, rdmaResource: {name: rdma/ib, count: 2}}\n", true, "", "0",
       "<unset>"},
      {"  network: {mode: infiniband, rdmaResource: {name: rdma/ib, count: 2}, "
       "multusNetworks: [ib-net]}\n",
       true, "ib-net", "0", "eth0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.network);
    spec::TrainingJob job = JobWith(c.network);
    json pod = DesiredPod(job, 0, Settings());
    json worker = Worker(pod);
    const json& annotations = pod["metadata"]["annotations"];
    EXPECT_EQ(EnvText(pod, "NCCL_IB_DISABLE"), c.ib_disable);
    EXPECT_EQ(EnvText(pod, "NCCL_SOCKET_IFNAME"), c.socket_ifname);
    // The worker (NCCL >= 2.21) picks the RoCE GID itself unless ncclEnv says otherwise.
    EXPECT_EQ(EnvText(pod, "NCCL_IB_GID_INDEX"), "<unset>");
    if (c.multus.empty()) {
      EXPECT_FALSE(annotations.contains("k8s.v1.cni.cncf.io/networks"));
    } else {
      EXPECT_EQ(annotations["k8s.v1.cni.cncf.io/networks"], c.multus);
    }
    if (!c.rdma) {
      EXPECT_FALSE(worker["securityContext"]["capabilities"].contains("add"));
      EXPECT_FALSE(worker.contains("resources"));
      EXPECT_FALSE(pod["spec"].contains("volumes"));
      continue;
    }
    const auto& device = job.spec.network.rdma_resource;
    EXPECT_EQ(worker["resources"]["limits"][device.name], std::to_string(device.count));
    EXPECT_EQ(worker["securityContext"]["capabilities"]["add"], json::array({"IPC_LOCK"}));
    EXPECT_EQ(worker["securityContext"]["capabilities"]["drop"], json::array({"ALL"}));
    ASSERT_EQ(pod["spec"]["volumes"].size(), 1u);
    EXPECT_EQ(pod["spec"]["volumes"][0]["emptyDir"], json({{"medium", "Memory"}}));
    EXPECT_EQ(worker["volumeMounts"][0]["mountPath"], "/dev/shm");
    EXPECT_EQ(worker["volumeMounts"][0]["name"], pod["spec"]["volumes"][0]["name"]);
  }
}

TEST(DesiredPodTest, NcclEnvWinsOverDefaultsAndAppliesToTcpToo) {
  json roce = DesiredPod(JobWith("  network: {mode: roce, rdmaResource: {name: rdma/r}, "
                                 "multusNetworks: [n], ncclEnv: {NCCL_SOCKET_IFNAME: net1, "
                                 "NCCL_IB_GID_INDEX: \"3\", NCCL_DEBUG: INFO}}\n"),
                         0, Settings());
  EXPECT_EQ(EnvText(roce, "NCCL_SOCKET_IFNAME"), "net1");
  EXPECT_EQ(CountEnv(roce, "NCCL_SOCKET_IFNAME"), 1);
  EXPECT_EQ(EnvText(roce, "NCCL_IB_GID_INDEX"), "3");
  EXPECT_EQ(EnvText(roce, "NCCL_DEBUG"), "INFO");
  EXPECT_EQ(EnvText(roce, "NCCL_IB_DISABLE"), "0");

  json tcp = DesiredPod(
      JobWith("  network: {mode: tcp, ncclEnv: {NCCL_IB_DISABLE: \"0\", NCCL_DEBUG: WARN}}\n"), 0,
      Settings());
  EXPECT_EQ(EnvText(tcp, "NCCL_IB_DISABLE"), "0");
  EXPECT_EQ(CountEnv(tcp, "NCCL_IB_DISABLE"), 1);
  EXPECT_EQ(EnvText(tcp, "NCCL_DEBUG"), "WARN");
}

TEST(DesiredPodTest, HostNetworkUsesClusterDnsAndAPortBlockOfItsOwn) {
  OperatorSettings settings = Settings();
  const std::string network =
      "  network: {mode: roce, rdmaResource: {name: rdma/r}, multusNetworks: [n], "
      "hostNetwork: true}\n  metrics: {port: 9400}\n";
  spec::TrainingJob job = JobWith(network, "7d4e1a52-0f0e-4c1b-9a53-2f1f0c7c0001");
  const int32_t first = HostNetworkFirstPort(job, settings);
  EXPECT_GE(first, settings.host_network_base_port);
  EXPECT_LE(first + kHostNetworkPortBlockSize,
            settings.host_network_base_port + settings.host_network_port_count);
  EXPECT_EQ((first - settings.host_network_base_port) % kHostNetworkPortBlockSize, 0);

  std::set<int32_t> ports;
  for (int32_t index = 0; index < kHostNetworkPortBlockSize; ++index) {
    json pod = DesiredPod(job, index, settings);
    EXPECT_EQ(pod["spec"]["hostNetwork"], true);
    EXPECT_EQ(pod["spec"]["dnsPolicy"], "ClusterFirstWithHostNet");
    json port = Worker(pod)["ports"][0];
    const int32_t metrics = port["containerPort"];
    EXPECT_EQ(port["hostPort"], metrics);
    EXPECT_EQ(port["name"], "metrics");
    EXPECT_GE(metrics, first);
    EXPECT_LT(metrics, first + kHostNetworkPortBlockSize);
    EXPECT_EQ(EnvText(pod, "LOCKSTEP_METRICS_PORT"), std::to_string(metrics));
    EXPECT_EQ(pod["metadata"]["annotations"]["prometheus.io/port"], std::to_string(metrics));
    // The node's interface names are unknown: NCCL's socket interface is left to NCCL.
    EXPECT_EQ(EnvText(pod, "NCCL_SOCKET_IFNAME"), "<unset>");
    ports.insert(metrics);
  }
  EXPECT_EQ(ports.size(), static_cast<size_t>(kHostNetworkPortBlockSize));
  // Worker 8 wraps around to worker 0's port: the hostPort keeps them on different nodes.
  EXPECT_EQ(Worker(DesiredPod(job, kHostNetworkPortBlockSize, settings))["ports"][0]["hostPort"],
            Worker(DesiredPod(job, 0, settings))["ports"][0]["hostPort"]);

  // Another job gets another block; every job's block stays inside the range.
  spec::TrainingJob other = JobWith(network, "c93a0b7e-5d21-4a8e-8f0a-3b9d7e6f0002");
  EXPECT_NE(HostNetworkFirstPort(other, settings), first);
  std::set<int32_t> blocks;
  for (int i = 0; i < 200; ++i) {
    job.metadata.uid = "uid-" + std::to_string(i);
    const int32_t block = HostNetworkFirstPort(job, settings);
    EXPECT_GE(block, settings.host_network_base_port);
    EXPECT_LE(block + kHostNetworkPortBlockSize,
              settings.host_network_base_port + settings.host_network_port_count);
    blocks.insert(block);
  }
  EXPECT_GT(blocks.size(), 150u);  // 200 jobs over 512 blocks: the hash spreads them

  // A custom range is honoured.
  settings.host_network_base_port = 41000;
  settings.host_network_port_count = 64;
  for (int i = 0; i < 50; ++i) {
    job.metadata.uid = "uid-" + std::to_string(i);
    const int32_t block = HostNetworkFirstPort(job, settings);
    EXPECT_GE(block, 41000);
    EXPECT_LE(block + kHostNetworkPortBlockSize, 41064);
  }
}

TEST(DesiredPodTest, GangSchedulingNamesTheSchedulerAndThePodGroup) {
  OperatorSettings settings = Settings();
  json volcano =
      DesiredPod(JobWith("  runPolicy: {scheduling: {gang: volcano, priorityClassName: high}}\n"),
                 0, settings);
  EXPECT_EQ(volcano["spec"]["schedulerName"], "volcano");
  EXPECT_EQ(volcano["metadata"]["annotations"]["scheduling.k8s.io/group-name"], "mnist");
  EXPECT_FALSE(volcano["metadata"]["labels"].contains("scheduling.x-k8s.io/pod-group"));
  EXPECT_EQ(volcano["spec"]["priorityClassName"], "high");

  json plugins =
      DesiredPod(JobWith("  runPolicy: {scheduling: {gang: scheduler-plugins}}\n"), 0, settings);
  EXPECT_EQ(plugins["spec"]["schedulerName"], "scheduler-plugins-scheduler");
  EXPECT_EQ(plugins["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"], "mnist");
  EXPECT_FALSE(plugins["metadata"]["annotations"].contains("scheduling.k8s.io/group-name"));
  EXPECT_FALSE(plugins["spec"].contains("priorityClassName"));

  json none =
      DesiredPod(JobWith("  runPolicy: {scheduling: {priorityClassName: low}}\n"), 0, settings);
  EXPECT_FALSE(none["spec"].contains("schedulerName"));
  EXPECT_EQ(none["spec"]["priorityClassName"], "low");
}

TEST(DesiredPodTest, TemplateIsMergedKeepingUserFieldsAndTheOperatorsOwn) {
  const std::string extra = R"(
  network: {mode: roce, rdmaResource: {name: rdma/r}, ncclEnv: {NCCL_DEBUG: INFO}}
  resources: {cpu: "4"}
  metrics: {port: 9400}
  template:
    metadata:
      labels: {team: vision, lockstep.io/job-name: hijack}
      annotations: {note: hello}
    spec:
      nodeSelector: {gpu: a100}
      tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]
      restartPolicy: Always
      hostNetwork: true
      serviceAccountName: trainer
      initContainers: [{name: fetch, image: busybox, command: [sh, -c, "true"]}]
      volumes:
      - {name: data, persistentVolumeClaim: {claimName: datasets}}
      - {name: lockstep-dshm, emptyDir: {}}
      containers:
      - name: worker
        imagePullPolicy: Always
        workingDir: /work
        env:
        - {name: HTTP_PROXY, value: "http://proxy:3128"}
        - {name: LOCKSTEP_JOB, value: other/job}
        - {name: NCCL_IB_DISABLE, value: "1"}
        - {name: NCCL_DEBUG, value: TRACE}
        volumeMounts:
        - {name: data, mountPath: /data}
        - {name: data, mountPath: /dev/shm}
        ports:
        - {name: debug, containerPort: 5678}
        - {name: metrics, containerPort: 9999}
        resources:
          limits: {cpu: "64", ephemeral-storage: 10Gi}
          requests: {ephemeral-storage: 10Gi}
        securityContext:
          runAsUser: 1000
          capabilities: {add: [SYS_PTRACE], drop: [NET_RAW]}
      - name: log-shipper
        image: fluent-bit:2
)";
  json pod = DesiredPod(JobWith(extra), 0, Settings());
  const json& metadata = pod["metadata"];
  EXPECT_EQ(metadata["labels"]["team"], "vision");
  EXPECT_EQ(metadata["labels"]["lockstep.io/job-name"], "mnist");  // the operator's key wins
  EXPECT_EQ(metadata["annotations"]["note"], "hello");

  const json& spec = pod["spec"];
  EXPECT_EQ(spec["nodeSelector"], json({{"gpu", "a100"}}));
  ASSERT_EQ(spec["tolerations"].size(), 3u) << "the template's, then the node-loss ones";
  EXPECT_NE(spec["tolerations"][0].value("key", ""), "node.kubernetes.io/not-ready");
  EXPECT_EQ(spec["serviceAccountName"], "trainer");
  EXPECT_EQ(spec["initContainers"][0]["name"], "fetch");
  EXPECT_EQ(spec["restartPolicy"], "Never");   // the operator replaces pods itself
  EXPECT_FALSE(spec.contains("hostNetwork"));  // only spec.network.hostNetwork decides

  // Volumes by name: the user's added, the operator's /dev/shm kept as it is.
  ASSERT_EQ(spec["volumes"].size(), 2u);
  EXPECT_EQ(spec["volumes"][0]["name"], "lockstep-dshm");
  EXPECT_EQ(spec["volumes"][0]["emptyDir"]["medium"], "Memory");
  EXPECT_EQ(spec["volumes"][1]["name"], "data");

  // Containers by name: worker first and merged, the sidecar after it as written.
  ASSERT_EQ(spec["containers"].size(), 2u);
  EXPECT_EQ(spec["containers"][1], json({{"name", "log-shipper"}, {"image", "fluent-bit:2"}}));
  json worker = Worker(pod);
  EXPECT_EQ(worker["image"], "lockstep-worker:0.1");
  EXPECT_EQ(worker["command"], json::array({"lockstep-worker", "train"}));
  EXPECT_EQ(worker["imagePullPolicy"], "Always");
  EXPECT_EQ(worker["workingDir"], "/work");

  EXPECT_EQ(EnvText(pod, "HTTP_PROXY"), "http://proxy:3128");
  EXPECT_EQ(EnvText(pod, "LOCKSTEP_JOB"), "team-a/mnist");
  EXPECT_EQ(CountEnv(pod, "LOCKSTEP_JOB"), 1);
  EXPECT_EQ(EnvText(pod, "NCCL_IB_DISABLE"), "1");  // a default gives way to the template
  EXPECT_EQ(CountEnv(pod, "NCCL_IB_DISABLE"), 1);
  EXPECT_EQ(EnvText(pod, "NCCL_DEBUG"), "INFO");  // ncclEnv wins over the template
  EXPECT_EQ(CountEnv(pod, "NCCL_DEBUG"), 1);

  std::vector<std::string> mount_paths;
  for (const json& mount : worker["volumeMounts"]) mount_paths.push_back(mount["mountPath"]);
  EXPECT_EQ(mount_paths, (std::vector<std::string>{"/dev/shm", "/data"}));
  EXPECT_EQ(worker["volumeMounts"][0]["name"], "lockstep-dshm");

  EXPECT_EQ(worker["ports"],
            json::parse(R"([{"name":"metrics","containerPort":9400,"protocol":"TCP"},
                                              {"name":"debug","containerPort":5678}])"));
  EXPECT_EQ(worker["resources"],
            json::parse(R"({"limits":{"cpu":"4","rdma/r":"1","ephemeral-storage":"10Gi"},
                            "requests":{"cpu":"4","ephemeral-storage":"10Gi"}})"));
  EXPECT_EQ(worker["securityContext"]["runAsUser"], 1000);
  EXPECT_EQ(worker["securityContext"]["capabilities"]["add"],
            json::array({"SYS_PTRACE", "IPC_LOCK"}));
  EXPECT_EQ(worker["securityContext"]["capabilities"]["drop"], json::array({"NET_RAW"}));
  // The sidecar runs as written: the worker's defaults are the worker's.
  EXPECT_FALSE(spec["containers"][1].contains("securityContext"));
}

// ----- A user's own image (pod_agent.h) -------------------------------------------------------

constexpr char kUserImageJob[] = R"(
apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: ddp, namespace: team-a}
spec:
  replicas: 2
  command: [python3, train.py, --steps, "30"]
  resources: {cpu: "2", memory: 4Gi}
)";

const json* FindByName(const json& list, const std::string& name) {
  if (!list.is_array()) return nullptr;
  for (const json& item : list) {
    if (item.is_object() && item.value("name", "") == name) return &item;
  }
  return nullptr;
}

TEST(DesiredPodAgentTest, ACommandInTheTemplatesImageRunsUnderTheAgentItsInitContainerBrings) {
  OperatorSettings settings = Settings();
  settings.agent_image = "registry.example/lockstep-agent:1.0";
  const json pod = DesiredPod(ParseJob(std::string(kUserImageJob) + R"(
  template:
    spec:
      containers: [{name: worker, image: "pytorch/pytorch:2.6.0"}]
)"),
                              0, settings);
  const json& worker = Worker(pod);
  EXPECT_EQ(worker["image"], "pytorch/pytorch:2.6.0") << "the image the user named, not ours";
  EXPECT_EQ(worker["command"], json::array({"/lockstep/bin/lockstep-agent", "exec", "--", "python3",
                                            "train.py", "--steps", "30"}));
  const json* mount = FindByName(worker["volumeMounts"], "lockstep-agent");
  ASSERT_NE(mount, nullptr) << worker.dump(2);
  EXPECT_EQ((*mount)["mountPath"], "/lockstep");
  EXPECT_EQ((*mount)["readOnly"], true) << "the program cannot change its agent";
  const json* volume = FindByName(pod["spec"]["volumes"], "lockstep-agent");
  ASSERT_NE(volume, nullptr);
  EXPECT_EQ((*volume)["emptyDir"], json::object());

  ASSERT_TRUE(pod["spec"]["initContainers"].is_array());
  const json& install = pod["spec"]["initContainers"][0];
  EXPECT_EQ(install["name"], "lockstep-agent");
  EXPECT_EQ(install["image"], "registry.example/lockstep-agent:1.0");
  EXPECT_EQ(install["command"],
            json::array({"/lockstep/bin/lockstep-agent", "install", "/lockstep-volume"}));
  EXPECT_EQ(install["volumeMounts"][0]["mountPath"], "/lockstep-volume");
  // Its failure reaches the job's condition through its termination message.
  EXPECT_EQ(install["env"][0],
            json({{"name", "LOCKSTEP_TERMINATION_LOG"}, {"value", "/dev/termination-log"}}));
  // The worker's cpu and memory, so the pod stays Guaranteed and reserves no more.
  EXPECT_EQ(install["resources"], worker["resources"]);
  EXPECT_EQ(install["securityContext"]["runAsUser"], 65532);
  EXPECT_EQ(install["securityContext"]["readOnlyRootFilesystem"], true);
  // The whole pod still meets the restricted profile, init container included, also when the
  // template gives the worker alone a seccomp profile (the pod then gets none).
  EXPECT_EQ(RestrictedProfileViolations(pod), std::vector<std::string>{}) << pod.dump(2);
  const json worker_seccomp = DesiredPod(ParseJob(std::string(kUserImageJob) + R"(
  template:
    spec:
      containers: [{name: worker, image: "my/train:3",
                    securityContext: {seccompProfile: {type: RuntimeDefault}}}]
)"),
                                         0, settings);
  EXPECT_EQ(RestrictedProfileViolations(worker_seccomp), std::vector<std::string>{})
      << worker_seccomp.dump(2);
}

TEST(DesiredPodAgentTest, SpecImageNamesTheUsersImageToo) {
  const json pod =
      DesiredPod(ParseJob(std::string(kUserImageJob) + "  image: my/train:3\n"), 0, Settings());
  EXPECT_EQ(Worker(pod)["image"], "my/train:3");
  EXPECT_EQ(Worker(pod)["command"][0], "/lockstep/bin/lockstep-agent");
  EXPECT_EQ(pod["spec"]["initContainers"][0]["name"], "lockstep-agent");
}

TEST(DesiredPodAgentTest, TheOperatorsWorkerImageRunsItsOwnLockstepWorker) {
  const json pod = DesiredPod(ParseJob(kUserImageJob), 0, Settings());
  EXPECT_EQ(Worker(pod)["image"], "lockstep-worker:0.1");
  EXPECT_EQ(Worker(pod)["command"][0], "lockstep-worker");
  EXPECT_FALSE(pod["spec"].contains("initContainers"));
  EXPECT_EQ(FindByName(pod["spec"].value("volumes", json::array()), "lockstep-agent"), nullptr);
}

TEST(DesiredPodAgentTest, ATrainerJobRunsTheImageItsTemplateNamesWithoutAnAgent) {
  const json pod = DesiredPod(
      JobWith("  template: {spec: {containers: [{name: worker, image: mirror/lockstep:2}]}}\n"), 0,
      Settings());
  EXPECT_EQ(Worker(pod)["image"], "mirror/lockstep:2") << "never silently replaced";
  EXPECT_EQ(Worker(pod)["command"], json::array({"lockstep-worker", "train"}));
  EXPECT_FALSE(pod["spec"].contains("initContainers"));
}

TEST(DesiredPodAgentTest, TheTemplatesInitContainersRunAfterTheAgentsAndItsAgentVolumeIsKept) {
  const json pod = DesiredPod(ParseJob(std::string(kUserImageJob) + R"(
  template:
    spec:
      initContainers: [{name: fetch-data, image: busybox, command: [sh, -c, "true"]}]
      volumes: [{name: lockstep-agent, emptyDir: {medium: Memory}}]
      containers: [{name: worker, image: "my/train:3"}]
)"),
                              0, Settings());
  const json& init = pod["spec"]["initContainers"];
  ASSERT_EQ(init.size(), 2u);
  EXPECT_EQ(init[0]["name"], "lockstep-agent");
  EXPECT_EQ(init[1]["name"], "fetch-data");
  int agent_volumes = 0;
  for (const json& volume : pod["spec"]["volumes"]) {
    if (volume["name"] == "lockstep-agent") {
      ++agent_volumes;
      EXPECT_EQ(volume["emptyDir"]["medium"], "Memory") << "the template's own";
    }
  }
  EXPECT_EQ(agent_volumes, 1);
}

TEST(DesiredPodAgentTest, TensorflowServersRunTheImageTheJobNames) {
  const json server = DesiredParameterServerPod(ParseJob(std::string(kUserImageJob) + R"(
  parameterServers: {replicas: 1}
  template: {spec: {containers: [{name: worker, image: "my/tf:2"}]}}
)"),
                                                0, Settings());
  EXPECT_EQ(server["spec"]["containers"][0]["image"], "my/tf:2");
}

// ----- Pod Security ---------------------------------------------------------------------------

TEST(DesiredPodSecurityTest, AWorkerPodMeetsTheRestrictedProfileAndHasNoServiceAccountToken) {
  OperatorSettings tls = Settings();
  tls.rendezvous_ca_pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  const spec::TrainingJob jobs[] = {
      JobWith(""),
      JobWith("  ranksPerWorker: 4\n  resources: {gpus: 4, cpu: \"8\"}\n"),
      ParseJob("apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: ddp}\n"
               "spec:\n  replicas: 2\n  command: [python3, train.py]\n"),
  };
  for (const spec::TrainingJob& job : jobs) {
    for (const OperatorSettings& settings : {Settings(), tls}) {
      json pod = DesiredPod(job, 0, settings);
      SCOPED_TRACE(pod.dump());
      EXPECT_EQ(RestrictedProfileViolations(pod), std::vector<std::string>());
      EXPECT_EQ(pod["spec"]["automountServiceAccountToken"], false);
      EXPECT_EQ(Worker(pod)["securityContext"]["runAsNonRoot"], true);
    }
  }
}

TEST(DesiredPodSecurityTest, AnRdmaWorkerRunsAsRootWithIpcLockAsItsOnlyCapability) {
  json pod = DesiredPod(
      JobWith("  network: {mode: roce, rdmaResource: {name: rdma/r}, multusNetworks: [n]}\n"), 0,
      Settings());
  // IPC_LOCK reaches only a root process (kubernetes/kubernetes#56374): the two things the
  // profile refuses, and nothing else.
  EXPECT_EQ(RestrictedProfileViolations(pod),
            std::vector<std::string>(
                {"spec.containers[worker].securityContext.capabilities.add may hold only "
                 "NET_BIND_SERVICE, not IPC_LOCK",
                 "spec.containers[worker].securityContext.runAsNonRoot must be true (here or in "
                 "spec.securityContext)",
                 "spec.containers[worker].securityContext.runAsUser must not be 0"}));
  const json& context = Worker(pod)["securityContext"];
  EXPECT_EQ(context["runAsUser"], 0);
  EXPECT_EQ(context["capabilities"], json::parse(R"({"add":["IPC_LOCK"],"drop":["ALL"]})"));
  EXPECT_EQ(context["allowPrivilegeEscalation"], false);
}

TEST(DesiredPodSecurityTest, ATemplateLoosensOnlyWhatItSays) {
  // A root image: runAsUser 0 at the pod level turns off the non-root default, nothing else.
  json root = DesiredPod(JobWith(R"(
  template:
    spec:
      securityContext: {runAsUser: 0, fsGroup: 100}
)"),
                         0, Settings());
  EXPECT_EQ(root["spec"]["securityContext"]["runAsUser"], 0);
  EXPECT_EQ(root["spec"]["securityContext"]["fsGroup"], 100);
  EXPECT_EQ(root["spec"]["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
  const json& root_context = Worker(root)["securityContext"];
  EXPECT_FALSE(root_context.contains("runAsNonRoot"));
  EXPECT_EQ(root_context["allowPrivilegeEscalation"], false);
  EXPECT_EQ(root_context["capabilities"]["drop"], json::array({"ALL"}));

  // A debugging template: privileged (the API server refuses allowPrivilegeEscalation: false
  // beside it), its own seccomp profile, a service account whose token it wants.
  json debug = DesiredPod(JobWith(R"(
  template:
    spec:
      serviceAccountName: trainer
      containers:
      - name: worker
        securityContext:
          privileged: true
          seccompProfile: {type: Unconfined}
          capabilities: {drop: []}
)"),
                          0, Settings());
  EXPECT_FALSE(debug["spec"].contains("automountServiceAccountToken"));
  EXPECT_FALSE(debug["spec"].contains("securityContext"));
  const json& debug_context = Worker(debug)["securityContext"];
  EXPECT_EQ(debug_context["privileged"], true);
  EXPECT_FALSE(debug_context.contains("allowPrivilegeEscalation"));
  EXPECT_EQ(debug_context["capabilities"]["drop"], json::array());
  EXPECT_EQ(debug_context["seccompProfile"]["type"], "Unconfined");
  EXPECT_EQ(debug_context["runAsNonRoot"], true);

  // An RDMA job whose nodes raise the memlock limit may name a user: no root then.
  json rdma = DesiredPod(JobWith(R"(
  network: {mode: infiniband, rdmaResource: {name: rdma/ib}}
  template:
    spec:
      securityContext: {runAsUser: 65532, runAsNonRoot: true}
)"),
                         0, Settings());
  EXPECT_FALSE(Worker(rdma)["securityContext"].contains("runAsUser"));
  EXPECT_EQ(rdma["spec"]["securityContext"]["runAsNonRoot"], true);
}

// status.stragglerNodes: a replaced straggler's pod prefers other nodes (never requires them, so a
// one-node cluster still runs it), beside the template's own affinity.
TEST(DesiredPodTest, NodesOfReplacedStragglersArePreferredAgainstBesideTheTemplatesAffinity) {
  EXPECT_FALSE(DesiredPod(JobWith(""), 0, Settings())["spec"].contains("affinity"));
  json pod = DesiredPod(JobWith(R"(
  template:
    spec:
      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 10
            preference: {matchExpressions: [{key: zone, operator: In, values: [a]}]}
)"),
                        0, Settings(), {"node-3", "node-7"});
  const json& terms =
      pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
  ASSERT_EQ(terms.size(), 2u) << pod["spec"]["affinity"].dump();
  EXPECT_EQ(terms[0]["weight"], 10);
  EXPECT_EQ(terms[1]["weight"], 100);
  const json& field = terms[1]["preference"]["matchFields"][0];
  EXPECT_EQ(field["key"], "metadata.name");
  EXPECT_EQ(field["operator"], "NotIn");
  EXPECT_EQ(field["values"], json({"node-3", "node-7"}));
  EXPECT_FALSE(pod["spec"]["affinity"]["nodeAffinity"].contains(
      "requiredDuringSchedulingIgnoredDuringExecution"));
}

TEST(DesiredPodTest, TemplateWithoutWorkerContainerOnlyAddsSidecars) {
  json pod = DesiredPod(JobWith(R"(
  template:
    spec:
      containers: [{name: proxy, image: envoy:1}]
)"),
                        0, Settings());
  ASSERT_EQ(pod["spec"]["containers"].size(), 2u);
  EXPECT_EQ(pod["spec"]["containers"][0]["name"], "worker");
  EXPECT_EQ(pod["spec"]["containers"][1]["name"], "proxy");
}

TEST(DesiredServiceTest, HeadlessSelectingTheJobsPodsBeforeTheyAreReady) {
  spec::TrainingJob job = JobWith("  metrics: {port: 9400}\n");
  json service = DesiredService(job);
  EXPECT_EQ(service["apiVersion"], "v1");
  EXPECT_EQ(service["kind"], "Service");
  EXPECT_EQ(service["metadata"]["name"], "mnist");
  EXPECT_EQ(service["spec"]["clusterIP"], "None");
  EXPECT_EQ(service["spec"]["publishNotReadyAddresses"], true);
  EXPECT_EQ(service["spec"]["selector"], json({{"lockstep.io/job-name", "mnist"}}));
  EXPECT_EQ(
      service["spec"]["ports"],
      json::parse(R"([{"name":"metrics","port":9400,"targetPort":"metrics","protocol":"TCP"}])"));
  EXPECT_FALSE(DesiredService(JobWith("  metrics: {port: 0}\n"))["spec"].contains("ports"));
}

TEST(DesiredSecretTest, OpaqueWithBase64TokenAndCa) {
  spec::TrainingJob job = JobWith("");
  json secret = DesiredSecret(job, "token", "ca");
  EXPECT_EQ(secret["kind"], "Secret");
  EXPECT_EQ(secret["type"], "Opaque");
  EXPECT_EQ(secret["metadata"]["name"], "mnist-rendezvous");
  EXPECT_EQ(secret["data"], json({{"token", "dG9rZW4="}, {"ca.crt", "Y2E="}}));
  EXPECT_EQ(DesiredSecret(job, "abc", "")["data"], json({{"token", "YWJj"}}));
  EXPECT_EQ(DesiredSecret(job, "ab", "")["data"]["token"], "YWI=");
  EXPECT_EQ(DesiredSecret(job, std::string("\xff\x00\x10", 3), "")["data"]["token"], "/wAQ");
}

TEST(DesiredPodGroupTest, NoneWithoutGangScheduling) {
  EXPECT_FALSE(DesiredPodGroup(JobWith("")).has_value());
}

TEST(DesiredPodGroupTest, VolcanoGroupNeedsMinReplicasWorthOfResources) {
  struct Case {
    std::string extra;
    json expected_spec;
  };
  const Case cases[] = {
      {R"(
  elastic: {minReplicas: 2, maxReplicas: 4}
  resources: {cpu: 500m, memory: 3Gi, gpus: 2}
  network: {mode: roce, rdmaResource: {name: rdma/roce_shared, count: 1}}
  runPolicy: {scheduling: {gang: volcano, queue: research, priorityClassName: high}}
)",
       json::parse(R"({"minMember":2,"queue":"research","priorityClassName":"high",
                       "minResources":{"cpu":"1000m","memory":"6Gi","nvidia.com/gpu":"4",
                                       "rdma/roce_shared":"2"}})")},
      {R"(
  resources: {cpu: "1.5"}
  runPolicy: {scheduling: {gang: volcano}}
)",
       json::parse(R"({"minMember":2,"queue":"default","minResources":{"cpu":"3"}})")},
      {"  runPolicy: {scheduling: {gang: volcano}}\n",
       json::parse(R"({"minMember":2,"queue":"default"})")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.extra);
    std::optional<json> group = DesiredPodGroup(JobWith(c.extra));
    ASSERT_TRUE(group.has_value());
    EXPECT_EQ((*group)["apiVersion"], "scheduling.volcano.sh/v1beta1");
    EXPECT_EQ((*group)["kind"], "PodGroup");
    EXPECT_EQ((*group)["metadata"]["name"], "mnist");
    EXPECT_EQ((*group)["spec"], c.expected_spec);
  }
}

TEST(DesiredPodGroupTest, SchedulerPluginsGroupHasMinMemberAndTimeout) {
  std::optional<json> group = DesiredPodGroup(JobWith(R"(
  elastic: {minReplicas: 1, maxReplicas: 3}
  runPolicy: {scheduling: {gang: scheduler-plugins, scheduleTimeoutSeconds: 120}}
)"));
  ASSERT_TRUE(group.has_value());
  EXPECT_EQ((*group)["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
  EXPECT_EQ((*group)["spec"], json({{"minMember", 1}, {"scheduleTimeoutSeconds", 120}}));
}

TEST(ChildrenTest, EveryChildIsLabelledOwnedAndInTheJobsNamespace) {
  spec::TrainingJob job = JobWith("  runPolicy: {scheduling: {gang: volcano}}\n");
  const std::vector<json> children = {DesiredPod(job, 0, Settings()), DesiredService(job),
                                      DesiredSecret(job, "t", ""), *DesiredPodGroup(job)};
  for (const json& child : children) {
    SCOPED_TRACE(child["kind"].get<std::string>());
    EXPECT_EQ(child["metadata"]["namespace"], "team-a");
    EXPECT_EQ(child["metadata"]["labels"]["lockstep.io/job-name"], "mnist");
    EXPECT_EQ(child["metadata"]["labels"]["app.kubernetes.io/managed-by"], "lockstep-operator");
    EXPECT_EQ(child["metadata"]["ownerReferences"], json::array({OwnerReference(job)}));
  }
}

constexpr char kQueuedManifest[] = R"(
apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata:
  name: mnist
  namespace: team-a
  labels: {kueue.x-k8s.io/queue-name: team-a-queue}
spec:
  replicas: 3
  trainer:
    data: {format: csv, train: [file:///data/train.csv]}
    steps: 10
)";

TEST(KueuePodGroupTest, AJobLabelledWithAQueueRunsAsOnePodGroupOfItsReplicas) {
  const spec::TrainingJob job = ParseJob(kQueuedManifest, "0b7c4f2e-91aa-4c1e-8d55-0c2f9b1e7a10");
  for (int32_t index = 0; index < 3; ++index) {
    const json pod = DesiredPod(job, index, Settings());
    const json& labels = pod["metadata"]["labels"];
    EXPECT_EQ(labels["kueue.x-k8s.io/queue-name"], "team-a-queue");
    EXPECT_EQ(labels["kueue.x-k8s.io/pod-group-name"], "mnist-0b7c4f2e-3");  // generation 3
    EXPECT_EQ(pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"], "3");
    EXPECT_FALSE(pod["metadata"]["annotations"].contains("kueue.x-k8s.io/retriable-in-group"));
  }
}

// Standbys are pods of the group too: Kueue admits (and counts quota for) all of them at once.
TEST(KueuePodGroupTest, TheGroupCountsTheStandbyPods) {
  std::string manifest = kQueuedManifest;
  manifest.replace(manifest.find("  replicas: 3\n"), 14,
                   "  replicas: 3\n  elastic: {standby: 2}\n");
  const spec::TrainingJob job = ParseJob(manifest, "0b7c4f2e-91aa-4c1e-8d55-0c2f9b1e7a10");
  for (int32_t index = 0; index < 5; ++index) {
    const json pod = DesiredPod(job, index, Settings());
    EXPECT_EQ(pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"], "5");
  }
}

TEST(KueuePodGroupTest, AJobWithoutTheQueueLabelCarriesNothingOfKueues) {
  const json pod = DesiredPod(JobWith(""), 0, Settings());
  for (const auto& [key, value] : pod["metadata"]["labels"].items()) {
    EXPECT_EQ(key.find("kueue.x-k8s.io/"), std::string::npos) << key;
  }
  for (const auto& [key, value] : pod["metadata"]["annotations"].items()) {
    EXPECT_EQ(key.find("kueue.x-k8s.io/"), std::string::npos) << key;
  }
}

TEST(KueuePodGroupTest, TheGroupNameIsALabelValueAndDiffersBetweenIncarnationsOfAName) {
  spec::TrainingJob job = ParseJob(kQueuedManifest, "0b7c4f2e-91aa");
  job.metadata.name = std::string(54, 'a') + "-" + std::string(8, 'b');  // 63 characters
  const std::string first = KueuePodGroupName(job);
  EXPECT_LE(first.size(), 63u);
  EXPECT_EQ(first.substr(first.size() - 11), "-0b7c4f2e-3");
  EXPECT_EQ(first.find("--"), std::string::npos) << first;
  job.metadata.uid = "5d1e0a77-02bd";
  EXPECT_NE(KueuePodGroupName(job), first);
  job.metadata.uid = "0b7c4f2e-91aa";
  job.metadata.generation = 4;  // resumed after a suspend: a new group
  EXPECT_NE(KueuePodGroupName(job), first);
}

TEST(KueuePodGroupTest, AReplacementUnderAnotherNameKeepsItsIndexAndHostname) {
  const spec::TrainingJob job = ParseJob(kQueuedManifest, "0b7c4f2e-91aa");
  const json pod = DesiredPod(job, 1, Settings(), {}, "mnist-worker-1-3fa9c");
  EXPECT_EQ(pod["metadata"]["name"], "mnist-worker-1-3fa9c");
  EXPECT_EQ(pod["metadata"]["labels"]["lockstep.io/replica-index"], "1");
  EXPECT_EQ(pod["spec"]["hostname"], "mnist-worker-1");
  EXPECT_EQ(pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"], "mnist-0b7c4f2e-3");
  // A pod joining a group that started at an earlier generation keeps that group.
  const json joining = DesiredPod(job, 1, Settings(), {}, "", "mnist-0b7c4f2e-1");
  EXPECT_EQ(joining["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"], "mnist-0b7c4f2e-1");
}

TEST(PlacementTest, ARequiredLevelKeepsEveryPodWithTheJobsOthersAcrossItsLabel) {
  const json pod = DesiredPod(JobWith("  placement: {topology: topology.lockstep.io/rack}\n"
                                      "  template: {spec: {affinity: {podAffinity: "
                                      "{requiredDuringSchedulingIgnoredDuringExecution: "
                                      "[{topologyKey: kubernetes.io/hostname, labelSelector: "
                                      "{matchLabels: {app: cache}}}]}}}}\n"),
                              1, Settings());
  const json& terms =
      pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
  ASSERT_EQ(terms.size(), 2u) << terms.dump();  // the template's term is kept
  EXPECT_EQ(terms[1]["topologyKey"], "topology.lockstep.io/rack");
  EXPECT_EQ(terms[1]["labelSelector"]["matchLabels"]["lockstep.io/job-name"], "mnist");
  EXPECT_FALSE(pod["spec"]["affinity"]["podAffinity"].contains(
      "preferredDuringSchedulingIgnoredDuringExecution"));
}

TEST(PlacementTest, APreferredLevelIsAWeightedTermAndNoPlacementAddsNone) {
  const json pod =
      DesiredPod(JobWith("  placement: {topology: topology.kubernetes.io/zone, mode: preferred}\n"),
                 0, Settings());
  const json& terms =
      pod["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
  ASSERT_EQ(terms.size(), 1u);
  EXPECT_EQ(terms[0]["weight"], 100);
  EXPECT_EQ(terms[0]["podAffinityTerm"]["topologyKey"], "topology.kubernetes.io/zone");
  const json plain = DesiredPod(JobWith(""), 0, Settings());
  EXPECT_FALSE(plain["spec"].contains("affinity") &&
               plain["spec"]["affinity"].contains("podAffinity"));
}

TEST(PlacementTest, AQueuedJobAsksKueuesTopologyAwareSchedulingInstead) {
  std::string manifest = kQueuedManifest;
  manifest += "  placement: {topology: topology.lockstep.io/block}\n";
  const json required = DesiredPod(ParseJob(manifest), 0, Settings());
  EXPECT_EQ(required["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"],
            "topology.lockstep.io/block");
  EXPECT_FALSE(required["spec"].contains("affinity") &&
               required["spec"]["affinity"].contains("podAffinity"));
  const json preferred =
      DesiredPod(ParseJob(std::string(kQueuedManifest) +
                          "  placement: {topology: topology.lockstep.io/block, mode: preferred}\n"),
                 0, Settings());
  EXPECT_EQ(preferred["metadata"]["annotations"]["kueue.x-k8s.io/podset-preferred-topology"],
            "topology.lockstep.io/block");
  EXPECT_FALSE(
      preferred["metadata"]["annotations"].contains("kueue.x-k8s.io/podset-required-topology"));
}

TEST(PlacementTest, VolcanoGetsTheTiersNetworkTopologyInItsPodGroup) {
  const spec::TrainingJob job = JobWith(
      "  runPolicy: {scheduling: {gang: volcano}}\n"
      "  placement: {topology: topology.lockstep.io/rack, volcanoTier: 1}\n");
  std::optional<json> group = DesiredPodGroup(job);
  ASSERT_TRUE(group.has_value());
  EXPECT_EQ((*group)["spec"]["networkTopology"],
            (json{{"mode", "hard"}, {"highestTierAllowed", 1}}));
  // Volcano's own topology replaces the affinity term.
  const json pod = DesiredPod(job, 0, Settings());
  EXPECT_FALSE(pod["spec"].contains("affinity") && pod["spec"]["affinity"].contains("podAffinity"));
  std::optional<json> plain =
      DesiredPodGroup(JobWith("  runPolicy: {scheduling: {gang: volcano}}\n"));
  ASSERT_TRUE(plain.has_value());
  EXPECT_FALSE((*plain)["spec"].contains("networkTopology"));
}

}  // namespace
}  // namespace lockstep::op::trainingjob

namespace lockstep::op::trainingjob {
namespace {

// A built-in trainer's job with 2 parameter servers.
spec::TrainingJob ParameterServerTrainerJob(const std::string& name, const std::string& ns) {
  return ParseJob("apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: " + name +
                  ", namespace: " + ns + "}\n" + R"(spec:
  replicas: 2
  parameterServers: {replicas: 2}
  trainer:
    model: {hidden: [8], embedding: {fields: 4, dim: 4, rows: 1024}}
    data: {format: clickLog, train: [file:///data/train.tsv.gz]}
    steps: 10
    optimizer: {type: sgd, learningRate: 0.1, momentum: 0}
    sync: {strategy: parameterServer, parameterServer: {mode: async}}
)");
}

// The built-in trainer's parameter servers get a credential of their own: the Secret
// "<job>-ps" holds their token and a certificate for every server's name; the servers never get
// the rendezvous token, and the workers get the servers' token and trust the operator's CA.
TEST(ParameterServerCredentialsTest, ServersGetTheirOwnTokenAndACertificateForTheirNames) {
  const spec::TrainingJob job = ParameterServerTrainerJob("ctr", "team-a");
  auto ca = tls::CreateCertificateAuthority("operator ca", 1);
  ASSERT_TRUE(ca.ok()) << ca.status();
  OperatorSettings settings = Settings();
  settings.rendezvous_ca_pem = ca->cert_pem;

  auto secret = DesiredParameterServerSecret(job, "ps-token", &*ca);
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ((*secret)["metadata"]["name"], "ctr-ps");
  EXPECT_EQ((*secret)["metadata"]["ownerReferences"][0]["uid"], "uid-1");
  EXPECT_EQ(Base64Decode((*secret)["data"]["token"].get<std::string>()).value(), "ps-token");
  const std::string chain = Base64Decode((*secret)["data"]["tls.crt"].get<std::string>()).value();
  EXPECT_NE(Base64Decode((*secret)["data"]["tls.key"].get<std::string>())
                .value()
                .find("PRIVATE KEY-----"),
            std::string::npos);
  // The leaf (first in the chain) names every server as the workers dial it, and no other.
  BIO* bio = BIO_new_mem_buf(chain.data(), static_cast<int>(chain.size()));
  X509* leaf = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  ASSERT_NE(leaf, nullptr);
  for (const char* name : {"ctr-ps-0.ctr-ps.team-a.svc", "ctr-ps-1.ctr-ps.team-a.svc"}) {
    EXPECT_EQ(X509_check_host(leaf, name, 0, 0, nullptr), 1) << name;
  }
  EXPECT_NE(X509_check_host(leaf, "ctr-ps-0.ctr-ps.team-b.svc", 0, 0, nullptr), 1);
  EXPECT_NE(X509_check_host(leaf, "lockstep-rendezvous.lockstep-system.svc", 0, 0, nullptr), 1);
  X509_free(leaf);
  EXPECT_NE(chain.find(ca->cert_pem), std::string::npos) << "the chain ends with the CA";
  auto plaintext = DesiredParameterServerSecret(job, "ps-token", nullptr);
  ASSERT_TRUE(plaintext.ok());
  EXPECT_EQ((*plaintext)["data"].size(), 1u) << (*plaintext)["data"].dump();

  for (int s = 0; s < 2; ++s) {
    const json server = DesiredParameterServerPod(job, s, settings);
    EXPECT_EQ(EnvText(server, "LOCKSTEP_JOB_TOKEN"), "<unset>") << "never the rendezvous token";
    EXPECT_EQ(Env(server, "LOCKSTEP_PS_TOKEN")["valueFrom"]["secretKeyRef"],
              json({{"name", "ctr-ps"}, {"key", "token"}}));
    EXPECT_EQ(EnvText(server, "LOCKSTEP_PS_TLS_CERT_FILE"), "/var/run/lockstep-ps/tls.crt");
    EXPECT_EQ(EnvText(server, "LOCKSTEP_PS_TLS_KEY_FILE"), "/var/run/lockstep-ps/tls.key");
    const json& volume = server["spec"]["volumes"][0];
    EXPECT_EQ(volume["secret"]["secretName"], "ctr-ps");
    EXPECT_EQ(volume["secret"]["items"].size(), 2u) << "the certificate and key, not the token";
    EXPECT_EQ(Worker(server)["volumeMounts"][0]["readOnly"], true);
    const json plain = DesiredParameterServerPod(job, s, Settings());
    EXPECT_EQ(EnvText(plain, "LOCKSTEP_PS_TLS_CERT_FILE"), "<unset>");
    EXPECT_FALSE(plain["spec"].contains("volumes"));
  }
  const json worker = DesiredPod(job, 0, settings);
  EXPECT_EQ(Env(worker, "LOCKSTEP_PS_TOKEN")["valueFrom"]["secretKeyRef"],
            json({{"name", "ctr-ps"}, {"key", "token"}}));
  EXPECT_EQ(EnvText(worker, "LOCKSTEP_PS_CA_FILE"), "/var/run/lockstep/ca.crt");
  EXPECT_EQ(EnvText(DesiredPod(job, 0, Settings()), "LOCKSTEP_PS_CA_FILE"), "<unset>");
}

// A job whose servers' names are longer than a certificate's CN may be still gets its
// certificate; a TensorFlow job's servers (its own program) get none of this, under TLS too.
TEST(ParameterServerCredentialsTest, LongNamesAreCertifiedAndTensorflowServersAreLeftAlone) {
  auto ca = tls::CreateCertificateAuthority("operator ca", 1);
  ASSERT_TRUE(ca.ok()) << ca.status();
  OperatorSettings settings = Settings();
  settings.rendezvous_ca_pem = ca->cert_pem;
  const spec::TrainingJob long_named = ParameterServerTrainerJob(
      "a-click-model-with-a-long-descriptive-name", "recommendations-team-a");
  auto secret = DesiredParameterServerSecret(long_named, "t", &*ca);
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_TRUE((*secret)["data"].contains("tls.crt"));

  const spec::TrainingJob tensorflow = ParseJob(R"(
apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: tf, namespace: team-a}
spec:
  replicas: 2
  parameterServers: {replicas: 1}
  command: [python3, train.py]
)");
  const json server = DesiredParameterServerPod(tensorflow, 0, settings);
  EXPECT_EQ(EnvText(server, "LOCKSTEP_PS_TOKEN"), "<unset>");
  EXPECT_EQ(EnvText(server, "LOCKSTEP_PS_TLS_CERT_FILE"), "<unset>");
  EXPECT_FALSE(server["spec"].contains("volumes"));
  const json worker = DesiredPod(tensorflow, 0, settings);
  EXPECT_EQ(EnvText(worker, "LOCKSTEP_PS_TOKEN"), "<unset>");
  EXPECT_EQ(EnvText(worker, "LOCKSTEP_PS_CA_FILE"), "<unset>");
}

// TensorFlow's documented form (run_standard_tensorflow_server, TFConfigClusterResolver): a
// cluster of task lists by type and this task's type and index.
TEST(TensorflowConfigTest, AnExecJobsWorkersAndServersGetTheirTasksInOneCluster) {
  const spec::TrainingJob job = ParseJob(R"(
apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: tf, namespace: team-a}
spec:
  replicas: 3
  parameterServers: {replicas: 2}
  command: [python3, train.py]
)");
  const std::vector<std::string> workers = {"tf-worker-0.tf.team-a.svc:2222",
                                            "tf-worker-1.tf.team-a.svc:2222",
                                            "tf-worker-2.tf.team-a.svc:2222"};
  const std::vector<std::string> servers = {"tf-ps-0.tf-ps.team-a.svc:2222",
                                            "tf-ps-1.tf-ps.team-a.svc:2222"};
  const json cluster = {
      {"chief", {workers[0]}}, {"worker", {workers[1], workers[2]}}, {"ps", servers}};
  for (int i = 0; i < 3; ++i) {
    const json pod = DesiredPod(job, i, Settings());
    const json config = json::parse(EnvText(pod, "TF_CONFIG"));
    EXPECT_EQ(config["cluster"], cluster);
    EXPECT_EQ(config["task"], i == 0 ? json({{"type", "chief"}, {"index", 0}})
                                     : json({{"type", "worker"}, {"index", i - 1}}));
    bool tf_port = false;
    for (const json& port : Worker(pod)["ports"]) tf_port |= port["containerPort"] == 2222;
    EXPECT_TRUE(tf_port) << pod.dump(2);
    EXPECT_EQ(EnvText(pod, "LOCKSTEP_PS_SERVERS"), "<unset>");
  }
  for (int s = 0; s < 2; ++s) {
    const json pod = DesiredParameterServerPod(job, s, Settings());
    EXPECT_EQ(Worker(pod)["command"], json({"python3", "train.py"}));
    const json config = json::parse(EnvText(pod, "TF_CONFIG"));
    EXPECT_EQ(config["cluster"], cluster);
    EXPECT_EQ(config["task"], json({{"type", "ps"}, {"index", s}}));
    EXPECT_EQ(EnvText(pod, "LOCKSTEP_JOB_TOKEN"), "<unset>") << "the program needs no token";
  }
  EXPECT_EQ(DesiredParameterServerService(job)["spec"]["ports"][0]["port"], 2222);
  // One worker: the chief alone.
  EXPECT_EQ(json::parse(spec::TfConfig({"a:1"}, {"b:2"}, spec::TfTaskOfWorker(0))),
            json::parse(R"({"cluster": {"chief": ["a:1"], "ps": ["b:2"]},
                            "task": {"type": "chief", "index": 0}})"));
}

}  // namespace
}  // namespace lockstep::op::trainingjob
