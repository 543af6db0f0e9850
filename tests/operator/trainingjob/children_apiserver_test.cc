// Every child the operator builds is accepted by a real kube-apiserver 1.20.2
// (tests/support/kube), field for field: for each TrainingJob in examples/ and for maximal jobs
// (RDMA + Multus + hostNetwork + gang scheduling + a template with sidecars, volumes and
// tolerations), the TrainingJob is created first (so owner references carry a real uid), then
// its Secret, headless Service, every worker Pod and its PodGroup; the server must answer 201 and
// read back every field that was sent (Kubernetes silently drops unknown fields, so a misspelt
// field would otherwise go unnoticed). PodGroups are checked against the Volcano and
// scheduler-plugins CRDs of tests/data/crds/. No kubelet, scheduler or garbage collector runs:
// what is checked is the API's validation, defaulting and pruning.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <iostream>
#include <optional>

#include "common/spec/problems.h"
#include "common/spec/training_job.h"
#include "common/spec/yaml_to_json.h"
#include "operator/trainingjob/children.h"
#include "tests/support/kube/kube_test_environment.h"
#include "tests/support/kube/kube_testenv.h"
#include "tests/support/kube/pod_security.h"

namespace lockstep::op::trainingjob {
namespace {

using lockstep::testing::KubeTestEnv;
using lockstep::testing::RestrictedProfileViolations;
namespace fs = std::filesystem;

const std::string kSource = LOCKSTEP_SOURCE_DIR;
constexpr char kPriorityClass[] = "lockstep-high";

json YamlFileToJson(const std::string& path) {
  YAML::Node document = YAML::LoadFile(path);
  spec::internal::Problems problems;
  json out = spec::internal::YamlToJson(document, &problems);
  EXPECT_TRUE(problems.empty()) << path << ": " << problems.Join("yaml");
  return out;
}

using KubeEnvironment = ::lockstep::testing::KubeTestEnvironment;

// Installs a CRD and waits until it is Established and its group is served.
std::string InstallCrd(KubeTestEnv& kube, const std::string& path) {
  json crd = YamlFileToJson(path);
  auto created =
      kube.Request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd);
  if (created.status != 201) {
    return path + ": refused (" + std::to_string(created.status) + "): " + created.raw +
           created.error;
  }
  const std::string name = crd["metadata"]["name"];
  const bool established = KubeTestEnv::WaitFor(
      [&] {
        auto got =
            kube.Request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + name);
        if (!got.body.is_object()) return false;
        for (const json& c : got.body["status"].value("conditions", json::array())) {
          if (c.value("type", "") == "Established" && c.value("status", "") == "True") return true;
        }
        return false;
      },
      30000);
  const std::string group_version = "/apis/" + crd["spec"]["group"].get<std::string>() + "/" +
                                    crd["spec"]["versions"][0]["name"].get<std::string>();
  const bool served =
      established &&
      KubeTestEnv::WaitFor([&] { return kube.Request("GET", group_version).status == 200; }, 30000);
  return served ? "" : path + ": not Established/served within 30 s";
}

class ChildrenApiServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!KubeEnvironment::kube) return;
    KubeTestEnv& kube = *KubeEnvironment::kube;
    for (const char* crd : {"/crds/trainingjob.yaml", "/tests/data/crds/volcano-podgroups.yaml",
                            "/tests/data/crds/scheduler-plugins-podgroups.yaml"}) {
      setup_error_ = InstallCrd(kube, kSource + crd);
      if (!setup_error_.empty()) return;
    }
    for (const char* ns : {"examples", "maximal"}) {
      kube.Request("POST", "/api/v1/namespaces",
                   {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
    }
    // The Priority admission plugin refuses a pod naming a PriorityClass that does not exist.
    auto priority = kube.Request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                                 {{"apiVersion", "scheduling.k8s.io/v1"},
                                  {"kind", "PriorityClass"},
                                  {"metadata", {{"name", kPriorityClass}}},
                                  {"value", 100000}});
    if (priority.status != 201) setup_error_ = "PriorityClass refused: " + priority.raw;
  }

  void SetUp() override {
    ASSERT_TRUE(KubeEnvironment::kube) << KubeEnvironment::error;
    ASSERT_TRUE(setup_error_.empty()) << setup_error_ << "\n" << KubeEnvironment::kube->LogTails();
  }

  KubeTestEnv& kube() { return *KubeEnvironment::kube; }

  // Every field of `sent` is in `got` with the same value (the server may add defaults and
  // admission may append list items).
  static void ExpectSentFieldsKept(const json& sent, const json& got, const std::string& path) {
    if (sent.is_object()) {
      ASSERT_TRUE(got.is_object()) << path << ": sent " << sent << ", read back " << got;
      for (auto& [key, value] : sent.items()) {
        ASSERT_TRUE(got.contains(key)) << path << "." << key << " was dropped by the server";
        ExpectSentFieldsKept(value, got[key], path + "." + key);
      }
    } else if (sent.is_array()) {
      // Admission may append (DefaultTolerationSeconds adds two tolerations), never remove.
      ASSERT_TRUE(got.is_array() && got.size() >= sent.size())
          << path << ": sent " << sent << ", read back " << got;
      for (size_t i = 0; i < sent.size(); ++i) {
        ExpectSentFieldsKept(sent[i], got[i], path + "[" + std::to_string(i) + "]");
      }
    } else {
      EXPECT_EQ(sent, got) << path;
    }
  }

  // POSTs `object` to `collection`, expects 201, reads it back and compares. The object as the
  // server holds it goes to `stored` when given.
  void CreateAndReadBack(const std::string& collection, const json& object,
                         json* stored = nullptr) {
    const std::string what =
        object["kind"].get<std::string>() + " " + object["metadata"]["name"].get<std::string>();
    auto created = kube().Request("POST", collection, object);
    ASSERT_EQ(created.status, 201)
        << what << " refused: " << created.raw << created.error << "\nsent: " << object.dump(2);
    auto got =
        kube().Request("GET", collection + "/" + object["metadata"]["name"].get<std::string>());
    ASSERT_EQ(got.status, 200) << got.raw;
    if (stored) *stored = got.body;
    SCOPED_TRACE(what);
    ExpectSentFieldsKept(object["metadata"], got.body["metadata"], "metadata");
    for (const char* field : {"spec", "data", "type"}) {
      if (object.contains(field)) ExpectSentFieldsKept(object[field], got.body[field], field);
    }
  }

  // Creates the TrainingJob (the server assigns its uid), then every child of it. The pods as the
  // server stored them go to `pods` when given.
  void CreateJobAndChildren(json manifest, const std::string& ns, const OperatorSettings& settings,
                            std::vector<json>* pods = nullptr) {
    manifest["metadata"]["namespace"] = ns;
    auto created = kube().Request(
        "POST", "/apis/lockstep.io/v1alpha1/namespaces/" + ns + "/trainingjobs", manifest);
    ASSERT_EQ(created.status, 201) << created.raw;
    auto job = spec::ParseTrainingJobJson(created.body, "server");
    ASSERT_TRUE(job.ok()) << job.status().message();
    ASSERT_FALSE(job->metadata.uid.empty());
    SCOPED_TRACE(ns + "/" + job->metadata.name);

    const std::string core = "/api/v1/namespaces/" + ns;
    CreateAndReadBack(core + "/secrets", DesiredSecret(*job, "token-of-" + job->metadata.name,
                                                       settings.rendezvous_ca_pem));
    CreateAndReadBack(core + "/services", DesiredService(*job));
    for (int32_t index = 0; index < job->spec.replicas; ++index) {
      json stored;
      CreateAndReadBack(core + "/pods", DesiredPod(*job, index, settings), &stored);
      if (pods) pods->push_back(std::move(stored));
    }
    if (job->spec.parameter_servers.replicas > 0) {
      CreateAndReadBack(core + "/services", DesiredParameterServerService(*job));
      for (int32_t shard = 0; shard < job->spec.parameter_servers.replicas; ++shard) {
        json stored;
        CreateAndReadBack(core + "/pods", DesiredParameterServerPod(*job, shard, settings),
                          &stored);
        if (pods) pods->push_back(std::move(stored));
      }
    }
    if (std::optional<json> group = DesiredPodGroup(*job)) {
      const std::string api_version = (*group)["apiVersion"];
      CreateAndReadBack("/apis/" + api_version + "/namespaces/" + ns + "/podgroups", *group);
    }
  }

  static std::string setup_error_;
};
std::string ChildrenApiServerTest::setup_error_;

OperatorSettings TlsSettings() {
  OperatorSettings settings;
  settings.rendezvous_address = "lockstep-rendezvous.lockstep-system.svc:7070";
  settings.rendezvous_ca_pem = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
  return settings;
}

// The children of every example are accepted. Their worker pods, as the API server stored them
// (defaults filled in), meet the Pod Security "restricted" profile and carry no service account
// token, except what RDMA needs (IPC_LOCK, which reaches only a root process).
TEST_F(ChildrenApiServerTest,
       ChildrenOfEveryExampleAreAcceptedAndTheirWorkersMeetTheRestrictedPodSecurityProfile) {
  int jobs = 0;
  for (const auto& entry : fs::directory_iterator(kSource + "/examples")) {
    if (entry.path().extension() != ".yaml") continue;
    json manifest = YamlFileToJson(entry.path());
    if (!manifest.is_object() || manifest.value("kind", "") != "TrainingJob") continue;
    ++jobs;
    SCOPED_TRACE(entry.path().string());
    OperatorSettings plaintext = TlsSettings();
    plaintext.rendezvous_ca_pem.clear();
    std::vector<json> pods;
    CreateJobAndChildren(manifest, "examples", jobs % 2 ? TlsSettings() : plaintext, &pods);
    ASSERT_FALSE(pods.empty());
    const std::string mode =
        manifest["spec"].value("network", json::object()).value("mode", "tcp");
    for (const json& pod : pods) {
      EXPECT_EQ(pod["spec"]["automountServiceAccountToken"], false);
      std::vector<std::string> expected;
      if (mode == "roce" || mode == "infiniband") {
        const std::string at = "spec.containers[worker].securityContext.";
        expected = {at + "capabilities.add may hold only NET_BIND_SERVICE, not IPC_LOCK",
                    at + "runAsNonRoot must be true (here or in spec.securityContext)",
                    at + "runAsUser must not be 0"};
      }
      EXPECT_EQ(RestrictedProfileViolations(pod), expected) << pod.dump(2);
    }
  }
  EXPECT_GE(jobs, 3);
}

// What a template may loosen, it loosens, and the API server takes the result: a privileged
// debugging worker (allowPrivilegeEscalation is then left unset: the server refuses false beside
// privileged), a root image, its own service account.
TEST_F(ChildrenApiServerTest, ATemplateThatLoosensThePodSecurityDefaultsIsAccepted) {
  json manifest = YamlFileToJson(kSource + "/examples/fashion-mnist.yaml");
  manifest["metadata"]["name"] = "loosened";
  manifest["spec"]["template"] = json::parse(R"({"spec": {
      "serviceAccountName": "trainer",
      "securityContext": {"runAsUser": 0},
      "containers": [{"name": "worker",
                      "securityContext": {"privileged": true,
                                          "capabilities": {"add": ["SYS_ADMIN"]}}}]}})");
  std::vector<json> pods;
  CreateJobAndChildren(manifest, "examples", TlsSettings(), &pods);
  ASSERT_FALSE(pods.empty());
  const json& context = pods[0]["spec"]["containers"][0]["securityContext"];
  EXPECT_EQ(context["privileged"], true);
  EXPECT_FALSE(context.contains("allowPrivilegeEscalation"));
  EXPECT_FALSE(context.contains("runAsNonRoot"));
  EXPECT_EQ(pods[0]["spec"]["securityContext"]["runAsUser"], 0);
  EXPECT_FALSE(pods[0]["spec"].contains("automountServiceAccountToken"));
}

// RoCE + Multus + hostNetwork + Volcano + priority class + a template that touches every merge
// rule, in train mode with TLS.
constexpr char kMaximalVolcano[] = R"(
apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: maximal-volcano, labels: {team: vision}}
spec:
  replicas: 3
  elastic: {minReplicas: 2, maxReplicas: 4}
  trainer:
    model: {type: mlp, hidden: [512, 256], activation: gelu}
    data:
      format: idx
      train: [file:///data/train-images.gz, file:///data/train-labels.gz]
    steps: 100
    device: cuda
  image: registry.example/lockstep-worker:0.1
  resources: {gpus: 2, cpu: "4", memory: 16Gi}
  checkpoint: {uri: "hdfs://namenode:9870/ckpt/maximal", intervalSteps: 50}
  network:
    mode: roce
    rdmaResource: {name: rdma/roce_shared, count: 1}
    multusNetworks: [roce-net, kube-system/roce-net-b]
    hostNetwork: true
    ncclEnv: {NCCL_IB_GID_INDEX: "3", NCCL_DEBUG: INFO}
  runPolicy:
    restartPolicy: ExitCode
    scheduling: {gang: volcano, queue: research, priorityClassName: lockstep-high}
  placement: {topology: topology.lockstep.io/rack, volcanoTier: 2}
  metrics: {port: 9400}
  template:
    metadata:
      labels: {cost-center: ml}
      annotations: {example.com/owner: vision-team}
    spec:
      nodeSelector: {nvidia.com/gpu.product: A100}
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
      serviceAccountName: trainer
      terminationGracePeriodSeconds: 60
      initContainers:
      - {name: fetch, image: busybox:1.36, command: [sh, -c, "echo ready"]}
      volumes:
      - {name: datasets, persistentVolumeClaim: {claimName: datasets}}
      containers:
      - name: worker
        imagePullPolicy: IfNotPresent
        env: [{name: HTTP_PROXY, value: "http://proxy:3128"}, {name: NCCL_IB_DISABLE, value: "0"}]
        volumeMounts: [{name: datasets, mountPath: /data, readOnly: true}]
        resources:
          limits: {ephemeral-storage: 20Gi}
          requests: {ephemeral-storage: 20Gi}
        securityContext:
          capabilities: {add: [SYS_PTRACE]}
      - name: log-shipper
        image: fluent/fluent-bit:2.2
        resources: {limits: {cpu: 100m, memory: 64Mi}}
)";

// InfiniBand without hostNetwork, scheduler-plugins, exec mode, plaintext rendezvous.
constexpr char kMaximalSchedulerPlugins[] = R"(
apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: maximal-plugins}
spec:
  replicas: 2
  command: ["/usr/bin/python3", "train.py", "--epochs", "3"]
  resources: {gpus: 8, cpu: "32", memory: 256Gi}
  network:
    mode: infiniband
    rdmaResource: {name: rdma/hca_shared_devices_a, count: 1}
    multusNetworks: [ib-net]
    ncclEnv: {NCCL_IB_HCA: mlx5}
  runPolicy:
    restartPolicy: OnFailure
    scheduling: {gang: scheduler-plugins, scheduleTimeoutSeconds: 300,
                 priorityClassName: lockstep-high}
  placement: {topology: topology.kubernetes.io/zone, mode: preferred}
  metrics: {port: 9400}
  template:
    spec:
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              topologyKey: kubernetes.io/hostname
              labelSelector: {matchLabels: {lockstep.io/job-name: maximal-plugins}}
      containers:
      - name: worker
        workingDir: /workspace
        ports: [{name: debug, containerPort: 5678}]
)";

TEST_F(ChildrenApiServerTest, ChildrenOfMaximalJobsAreAccepted) {
  for (const char* yaml : {kMaximalVolcano, kMaximalSchedulerPlugins}) {
    spec::internal::Problems problems;
    json manifest = spec::internal::YamlToJson(YAML::Load(yaml), &problems);
    ASSERT_TRUE(problems.empty()) << problems.Join("yaml");
    OperatorSettings settings = TlsSettings();
    if (yaml == kMaximalSchedulerPlugins) settings.rendezvous_ca_pem.clear();
    CreateJobAndChildren(manifest, "maximal", settings);
  }
}

}  // namespace
}  // namespace lockstep::op::trainingjob

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(
      new lockstep::testing::KubeTestEnvironment("children_apiserver_test"));
  return RUN_ALL_TESTS();
}
