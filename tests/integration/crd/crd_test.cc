// The TrainingJob CRD against a real kube-apiserver 1.20.2 (tests/support/kube): the CRD is
// accepted and Established; every TrainingJob in examples/ is accepted and read back with the
// defaults of the C++ model (common/spec); the scale and status subresources work; and the
// spec-layer manifests of tests/data/bad_manifests are refused with the field named where a
// structural schema can express the rule; and `kubectl explain` prints the schema's field
// documentation. What a schema cannot express is listed in docs/operator.md and pinned by
// kBadManifestOutcomes below.
#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/spec/problems.h"
#include "common/spec/training_job.h"
#include "common/spec/yaml_to_json.h"
#include "tests/support/kube/kube_test_environment.h"
#include "tests/support/kube/kube_testenv.h"
#include "tests/support/process/child_process.h"

namespace lockstep::testing {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kSource = LOCKSTEP_SOURCE_DIR;
const std::string kJobs = "/apis/lockstep.io/v1alpha1/namespaces/";

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// YAML -> JSON as the API server's decoder types it (the spec library's converter). Returns
// false with `why` for what never reaches a server: malformed YAML, duplicate keys, not exactly
// one document.
bool YamlFileToJson(const std::string& text, json* out, std::string* why) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::Exception& error) {
    *why = "malformed YAML: " + error.msg;
    return false;
  }
  if (documents.size() != 1) {
    *why = documents.empty() ? "empty document" : "more than one document";
    return false;
  }
  spec::internal::Problems problems;
  *out = spec::internal::YamlToJson(documents.front(), &problems);
  if (!problems.empty()) {
    *why = problems.Join("yaml");
    return false;
  }
  if (out->is_null()) {
    *why = "empty document";
    return false;
  }
  return true;
}

using KubeEnvironment = ::lockstep::testing::KubeTestEnvironment;

class CrdTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!KubeEnvironment::kube) return;
    KubeTestEnv& kube = *KubeEnvironment::kube;
    json crd;
    std::string why;
    if (!YamlFileToJson(ReadText(kSource + "/crds/trainingjob.yaml"), &crd, &why)) {
      crd_error_ = "crds/trainingjob.yaml: " + why;
      return;
    }
    auto created =
        kube.Request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd);
    if (created.status != 201) {
      crd_error_ =
          "CRD refused (" + std::to_string(created.status) + "): " + created.raw + created.error;
      return;
    }
    json conditions;
    bool established = KubeTestEnv::WaitFor(
        [&] {
          auto got = kube.Request("GET",
                                  "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                  "trainingjobs.lockstep.io");
          conditions = got.body.is_object() ? got.body["status"].value("conditions", json::array())
                                            : json::array();
          for (const json& c : conditions) {
            if (c.value("type", "") == "Established" && c.value("status", "") == "True")
              return true;
          }
          return false;
        },
        30000);
    // Discovery of the new group lags a little behind Established.
    bool served =
        established &&
        KubeTestEnv::WaitFor(
            [&] { return kube.Request("GET", "/apis/lockstep.io/v1alpha1").status == 200; }, 30000);
    if (!established || !served) {
      crd_error_ = "CRD not Established/served within 30 s; conditions: " + conditions.dump();
    }
    for (const char* ns : {"examples", "bad", "subresources", "research"}) {
      kube.Request("POST", "/api/v1/namespaces",
                   json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
    }
  }

  void SetUp() override {
    ASSERT_TRUE(KubeEnvironment::kube) << KubeEnvironment::error;
    ASSERT_TRUE(crd_error_.empty()) << crd_error_ << "\n" << KubeEnvironment::kube->LogTails();
  }

  KubeTestEnv& kube() { return *KubeEnvironment::kube; }

  static std::string crd_error_;
};
std::string CrdTest::crd_error_;

TEST_F(CrdTest, EstablishedWithNamesSubresourcesAndColumns) {
  auto discovery = kube().Request("GET", "/apis/lockstep.io/v1alpha1");
  ASSERT_EQ(discovery.status, 200) << discovery.raw;
  std::map<std::string, json> resources;
  for (const json& r : discovery.body["resources"]) resources[r["name"]] = r;
  ASSERT_TRUE(resources.count("trainingjobs")) << discovery.raw;
  EXPECT_EQ(resources["trainingjobs"]["kind"], "TrainingJob");
  EXPECT_EQ(resources["trainingjobs"]["shortNames"], json::array({"tj"}));
  EXPECT_EQ(resources["trainingjobs"]["categories"], json::array({"all", "lockstep"}));
  EXPECT_TRUE(resources.count("trainingjobs/status")) << discovery.raw;
  EXPECT_TRUE(resources.count("trainingjobs/scale")) << discovery.raw;
}

// Every leaf the server returns under spec equals the C++ model's serialization of the same
// manifest: the server's defaults agree with common/spec's (numbers compared loosely: 1e-8).
void ExpectSubset(const json& server, const json& model, const std::string& path) {
  if (server.is_object()) {
    ASSERT_TRUE(model.is_object()) << path << ": server " << server << ", model " << model;
    for (auto& [key, value] : server.items()) {
      if (path == "spec" && key == "template") continue;  // free-form
      ASSERT_TRUE(model.contains(key)) << path << "." << key << " only on the server: " << value;
      ExpectSubset(value, model[key], path + "." + key);
    }
  } else if (server.is_number() && model.is_number()) {
    EXPECT_NEAR(server.get<double>(), model.get<double>(),
                1e-12 + 1e-9 * std::fabs(model.get<double>()))
        << path;
  } else {
    EXPECT_EQ(server, model) << path;
  }
}

TEST_F(CrdTest, ExampleTrainingJobsAreAcceptedWithTheModelsDefaults) {
  int jobs = 0;
  for (const auto& entry : fs::directory_iterator(kSource + "/examples")) {
    if (entry.path().extension() != ".yaml") continue;
    json manifest;
    std::string why;
    ASSERT_TRUE(YamlFileToJson(ReadText(entry.path()), &manifest, &why)) << entry.path() << why;
    if (!manifest.is_object() || manifest.value("kind", "") != "TrainingJob") continue;
    ++jobs;
    SCOPED_TRACE(entry.path().string());
    auto expected = spec::ParseTrainingJobJson(manifest, entry.path());
    ASSERT_TRUE(expected.ok()) << expected.status().message();
    std::string name = manifest["metadata"]["name"];
    auto created = kube().Request("POST", kJobs + "examples/trainingjobs", manifest);
    ASSERT_EQ(created.status, 201) << created.raw;
    auto got = kube().Request("GET", kJobs + "examples/trainingjobs/" + name);
    ASSERT_EQ(got.status, 200) << got.raw;
    auto read_back = spec::ParseTrainingJobJson(got.body, "server");
    ASSERT_TRUE(read_back.ok()) << read_back.status().message();
    EXPECT_TRUE(read_back->spec == expected->spec) << got.body["spec"].dump(2);
    ExpectSubset(got.body["spec"], spec::ToJson(*expected)["spec"], "spec");
  }
  EXPECT_GE(jobs, 3);
}

TEST_F(CrdTest, ServerAppliesTheSpecDefaults) {
  json minimal = {
      {"apiVersion", "lockstep.io/v1alpha1"},
      {"kind", "TrainingJob"},
      {"metadata", {{"name", "minimal"}}},
      {"spec",
       {{"replicas", 2},
        {"trainer", {{"data", {{"train", {"a.csv"}}, {"format", "csv"}}}, {"epochs", 1}}}}}};
  auto created = kube().Request("POST", kJobs + "examples/trainingjobs", minimal);
  ASSERT_EQ(created.status, 201) << created.raw;
  const json& s = created.body["spec"];
  auto expected = spec::ParseTrainingJobJson(minimal, "minimal");
  ASSERT_TRUE(expected.ok()) << expected.status().message();
  json model = spec::ToJson(*expected)["spec"];
  // Defaults written by the server, each the model's.
  for (const char* pointer : {"/trainer/model/type",
                              "/trainer/model/hidden",
                              "/trainer/model/activation",
                              "/trainer/batchSize",
                              "/trainer/optimizer/type",
                              "/trainer/optimizer/learningRate",
                              "/trainer/optimizer/momentum",
                              "/trainer/optimizer/weightDecay",
                              "/trainer/optimizer/lrScaling",
                              "/trainer/optimizer/warmupSteps",
                              "/trainer/optimizer/beta1",
                              "/trainer/optimizer/beta2",
                              "/trainer/optimizer/epsilon",
                              "/trainer/seed",
                              "/trainer/device",
                              "/trainer/allreduce/bucketMiB",
                              "/trainer/allreduce/compression",
                              "/trainer/allreduce/timeoutSeconds",
                              "/trainer/logIntervalSteps",
                              "/resources/gpus",
                              "/checkpoint/intervalSteps",
                              "/checkpoint/keep",
                              "/checkpoint/async",
                              "/network/mode",
                              "/network/hostNetwork",
                              "/runPolicy/restartPolicy",
                              "/runPolicy/backoffLimit",
                              "/runPolicy/suspend",
                              "/runPolicy/scheduling/gang",
                              "/runPolicy/scheduling/queue",
                              "/runPolicy/scheduling/scheduleTimeoutSeconds",
                              "/metrics/port"}) {
    json::json_pointer p(pointer);
    ASSERT_TRUE(s.contains(p)) << "spec" << pointer << " not defaulted by the server: " << s.dump();
    if (s[p].is_number()) {
      EXPECT_NEAR(s[p].get<double>(), model[p].get<double>(), 1e-15) << pointer;
    } else {
      EXPECT_EQ(s[p], model[p]) << pointer;
    }
  }
  ExpectSubset(s, model, "spec");
}

// Field for field: a manifest that sets every field of the model, serialized by the model
// (ToJson writes every field), goes through the server with nothing pruned and nothing changed.
// A field the model has and the CRD lacks would be pruned here.
TEST_F(CrdTest, EveryFieldOfTheModelSurvivesTheServer) {
  const char* const kManifests[] = {R"json({
    "apiVersion": "lockstep.io/v1alpha1", "kind": "TrainingJob",
    "metadata": {"name": "every-field", "labels": {"team": "ml"}, "annotations": {"a": "b"}},
    "spec": {
      "replicas": 4, "elastic": {"minReplicas": 2, "maxReplicas": 8},
      "trainer": {
        "model": {"type": "mlp", "hidden": [512, 128], "activation": "gelu"},
        "data": {"format": "csv", "train": ["file:///data/train.csv"], "test": ["test.csv"]},
        "batchSize": 32, "epochs": 3,
        "optimizer": {"type": "adamw", "learningRate": 0.001, "momentum": 0.5, "weightDecay": 0.01,
                      "lrScaling": "linear", "warmupSteps": 100, "beta1": 0.8, "beta2": 0.99,
                      "epsilon": 1e-6},
        "seed": 42, "device": "cuda", "precision": "bf16",
        "allreduce": {"bucketMiB": 12.5, "compression": "bf16", "timeoutSeconds": 60},
        "logIntervalSteps": 10},
      "image": "registry.example/lockstep-worker:1",
      "resources": {"gpus": 8, "cpu": "16", "memory": "64Gi"},
      "template": {"metadata": {"labels": {"x": "y"}},
                   "spec": {"nodeSelector": {"gpu": "h100"}, "tolerations": [{"key": "k", "operator": "Exists"}]}},
      "checkpoint": {"uri": "hdfs://namenode:9000/ckpt/job", "intervalSteps": 500, "keep": 5, "async": false},
      "network": {"mode": "roce", "rdmaResource": {"name": "rdma/roce_shared", "count": 2},
                  "multusNetworks": ["default/roce-net"], "hostNetwork": true,
                  "ncclEnv": {"NCCL_IB_GID_INDEX": "3"}},
      "runPolicy": {"restartPolicy": "ExitCode", "backoffLimit": 2, "activeDeadlineSeconds": 3600,
                    "ttlSecondsAfterFinished": 600, "suspend": true,
                    "scheduling": {"gang": "volcano", "queue": "research", "priorityClassName": "high",
                                   "scheduleTimeoutSeconds": 120},
                    "retryableExitCodes": [1, 255]},
      "metrics": {"port": 0}}})json",
                                    R"json({
    "apiVersion": "lockstep.io/v1alpha1", "kind": "TrainingJob",
    "metadata": {"name": "every-field-exec"},
    "spec": {"replicas": 1, "command": ["python3", "-c", "print(1)"],
             "runPolicy": {"scheduling": {"gang": "scheduler-plugins"}}}})json"};
  for (const char* text : kManifests) {
    auto job = spec::ParseTrainingJobJson(json::parse(text), "manifest");
    ASSERT_TRUE(job.ok()) << job.status().message();
    json model = spec::ToJson(*job);
    SCOPED_TRACE(model["metadata"]["name"].get<std::string>());
    model["metadata"]["namespace"] = "examples";  // the model writes "default"
    auto created = kube().Request("POST", kJobs + "examples/trainingjobs", model);
    ASSERT_EQ(created.status, 201) << created.raw;
    auto read_back = spec::ParseTrainingJobJson(created.body, "server");
    ASSERT_TRUE(read_back.ok()) << read_back.status().message();
    EXPECT_TRUE(read_back->spec == job->spec) << created.body["spec"].dump(2);
    ExpectSubset(model["spec"], created.body["spec"], "spec");  // nothing pruned
    ExpectSubset(created.body["spec"], model["spec"], "spec");  // nothing added
    EXPECT_EQ(created.body["spec"]["template"], model["spec"]["template"]);
  }
}

TEST_F(CrdTest, ScaleSubresourceChangesSpecReplicas) {
  json job = {{"apiVersion", "lockstep.io/v1alpha1"},
              {"kind", "TrainingJob"},
              {"metadata", {{"name", "elastic"}}},
              {"spec",
               {{"replicas", 2},
                {"elastic", {{"minReplicas", 1}, {"maxReplicas", 4}}},
                {"command", {"python3", "train.py"}}}}};
  const std::string base = kJobs + "subresources/trainingjobs/elastic";
  ASSERT_EQ(kube().Request("POST", kJobs + "subresources/trainingjobs", job).status, 201);
  auto scale = kube().Request("GET", base + "/scale");
  ASSERT_EQ(scale.status, 200) << scale.raw;
  EXPECT_EQ(scale.body["kind"], "Scale");
  EXPECT_EQ(scale.body["spec"]["replicas"], 2);
  // What `kubectl scale tj/elastic --replicas=3` sends.
  auto patched = kube().Request("PATCH", base + "/scale", json{{"spec", {{"replicas", 3}}}},
                                "application/merge-patch+json");
  ASSERT_EQ(patched.status, 200) << patched.raw;
  EXPECT_EQ(kube().Request("GET", base).body["spec"]["replicas"], 3);
  // The schema's minimum holds through the scale subresource too.
  auto zero = kube().Request("PATCH", base + "/scale", json{{"spec", {{"replicas", 0}}}},
                             "application/merge-patch+json");
  EXPECT_EQ(zero.status, 422) << zero.raw;
  EXPECT_NE(zero.raw.find("spec.replicas"), std::string::npos) << zero.raw;
  // status.replicas.active and status.selector show in the Scale object once the operator
  // writes them.
  auto status = kube().Request(
      "PATCH", base + "/status",
      json{{"status",
            {{"replicas", {{"active", 3}}}, {"selector", "lockstep.io/job-name=elastic"}}}},
      "application/merge-patch+json");
  ASSERT_EQ(status.status, 200) << status.raw;
  scale = kube().Request("GET", base + "/scale");
  EXPECT_EQ(scale.body["status"]["replicas"], 3) << scale.raw;
  EXPECT_EQ(scale.body["status"]["selector"], "lockstep.io/job-name=elastic") << scale.raw;
}

TEST_F(CrdTest, StatusSubresourceIsSeparateFromSpec) {
  json job = {{"apiVersion", "lockstep.io/v1alpha1"},
              {"kind", "TrainingJob"},
              {"metadata", {{"name", "status"}}},
              {"spec", {{"replicas", 2}, {"command", {"true"}}}},
              {"status", {{"phase", "Succeeded"}}}};
  const std::string base = kJobs + "subresources/trainingjobs/status";
  auto created = kube().Request("POST", kJobs + "subresources/trainingjobs", job);
  ASSERT_EQ(created.status, 201) << created.raw;
  EXPECT_FALSE(created.body.contains("status")) << "status written through the main resource";
  json status = {
      {"observedGeneration", 1},
      {"phase", "Running"},
      {"selector", "lockstep.io/job-name=status"},
      {"conditions",
       {{{"type", "Running"},
         {"status", "True"},
         {"reason", "AllWorkersReady"},
         {"message", "2/2 workers joined generation 1"},
         {"lastTransitionTime", "2025-01-01T00:00:00Z"}}}},
      {"replicas", {{"desired", 2}, {"active", 2}, {"ready", 2}, {"succeeded", 0}, {"failed", 0}}},
      {"rendezvous", {{"generation", 1}, {"worldSize", 8}, {"standby", 1}}},
      {"progress",
       {{"step", 120},
        {"totalSteps", 1000},
        {"samplesPerSecond", 5120.5},
        {"scalingEfficiency", 0.93},
        {"loss", 0.41},
        {"display", {{"samplesPerSecond", "5120"}, {"scalingEfficiency", "93%"}}}}},
      {"lastCheckpoint",
       {{"step", 100}, {"uri", "file:///ckpt/step-100"}, {"time", "2025-01-01T00:01:00Z"}}},
      {"restarts", 0},
      {"startTime", "2025-01-01T00:00:00Z"}};
  json object = created.body;
  object["status"] = status;
  object["spec"]["replicas"] = 5;  // ignored by /status
  auto put = kube().Request("PUT", base + "/status", object);
  ASSERT_EQ(put.status, 200) << put.raw;
  auto got = kube().Request("GET", base);
  EXPECT_EQ(got.body["status"], status);
  EXPECT_EQ(got.body["spec"]["replicas"], 2);
  // The status schema is enforced too.
  auto bad = kube().Request("PATCH", base + "/status", json{{"status", {{"phase", "Exploded"}}}},
                            "application/merge-patch+json");
  EXPECT_EQ(bad.status, 422) << bad.raw;
  EXPECT_NE(bad.raw.find("status.phase"), std::string::npos) << bad.raw;
  // Printer columns: the Table form of the list, as `kubectl get tj` asks for it.
  auto table =
      kube().Request("GET", kJobs + "subresources/trainingjobs/status", nullptr, "application/json",
                     30000, "application/json;as=Table;v=v1;g=meta.k8s.io");
  ASSERT_EQ(table.status, 200) << table.raw;
  std::vector<std::string> columns;
  for (const json& c : table.body["columnDefinitions"]) {
    if (c.value("priority", 0) == 0) columns.push_back(c["name"]);
  }
  EXPECT_EQ(columns,
            (std::vector<std::string>{"Name", "Phase", "Ready", "Desired", "Ranks", "Standby",
                                      "Servers", "Step", "Samples/s", "Efficiency", "Age"}));
  ASSERT_EQ(table.body["rows"].size(), 1u) << table.raw;
  const json& cells = table.body["rows"][0]["cells"];
  EXPECT_EQ(cells[1], "Running");
  EXPECT_EQ(cells[2], 2);
  EXPECT_EQ(cells[3], 2);
  EXPECT_EQ(cells[4], 8);  // status.rendezvous.worldSize: 2 pods of 4 ranks
  EXPECT_EQ(cells[5], 1);  // status.rendezvous.standby
  EXPECT_TRUE(cells[6].is_null()) << cells[6];  // status.parameterServers: a job without servers
  EXPECT_EQ(cells[7], 120);
  EXPECT_EQ(cells[8], "5120");  // status.progress.display: as the operator formats them
  EXPECT_EQ(cells[9], "93%");
}

// The description of the schema property at a dotted path ("spec.elastic.minReplicas"; a list's
// item properties continue the list's path, as kubectl explain names them); "" when none.
std::string CrdDescription(const json& crd, const std::string& dotted) {
  const json* schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
  std::stringstream path(dotted);
  std::string name;
  while (std::getline(path, name, '.')) {
    while (schema->contains("items")) schema = &(*schema)["items"];
    if (!schema->contains("properties") || !(*schema)["properties"].contains(name)) return "";
    schema = &(*schema)["properties"][name];
  }
  return schema->value("description", "");
}

// Runs of whitespace as one space: kubectl explain wraps and indents descriptions.
std::string OneLine(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (space && (out.empty() || out.back() == ' ')) continue;
    out += space ? ' ' : c;
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::string FindOnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// What a user reads: `kubectl explain` prints the CRD's description of a field and of each field
// beneath it, through the kubeconfig of this server. kubectl 1.32 asks for OpenAPI v3 first;
// kube-apiserver 1.20 does not serve /openapi/v3 (404), and kubectl then falls back to the v2
// document by itself, so the plain command works and is what is run here (--output
// plaintext-openapiv2 prints the same; Debian's kubectl 1.20 reads v2 only). The server
// publishes a new CRD's OpenAPI a little after it is Established, so each command is retried
// until its output holds the descriptions, within a deadline.
TEST_F(CrdTest, KubectlExplainPrintsEachFieldsDescription) {
  const std::string kubectl = FindOnPath("kubectl");
  if (kubectl.empty()) {
    GTEST_SKIP() << "kubectl is not on PATH (scripts/setup.sh installs Debian's "
                    "kubernetes-client when no kubectl is installed)";
  }
  json crd;
  std::string why;
  ASSERT_TRUE(YamlFileToJson(ReadText(kSource + "/crds/trainingjob.yaml"), &crd, &why)) << why;
  struct Explained {
    std::string resource;             // plural, singular or short name: kubectl resolves each
    std::string field;                // the path under it
    std::vector<std::string> fields;  // each described too: the FIELDS kubectl lists
  };
  const Explained kCases[] = {
      {"trainingjobs",
       "spec.elastic",
       {"spec.elastic.minReplicas", "spec.elastic.maxReplicas", "spec.elastic.globalBatch"}},
      {"trainingjob", "spec.trainer.optimizer.learningRate", {}},
      {"tj", "status.progress.estimatedSecondsRemaining", {}},
      {"trainingjobs", "status.conditions", {"status.conditions.type", "status.conditions.reason"}},
  };
  for (const Explained& explained : kCases) {
    const std::string argument = explained.resource + "." + explained.field;
    SCOPED_TRACE("kubectl explain " + argument);
    std::vector<std::string> expected;
    for (const std::string& field : explained.fields) expected.push_back(field);
    expected.push_back(explained.field);
    std::vector<std::string> descriptions;
    for (const std::string& field : expected) {
      descriptions.push_back(OneLine(CrdDescription(crd, field)));
      ASSERT_FALSE(descriptions.back().empty()) << field << " has no description in the CRD";
    }
    ProcessResult result;
    std::string missing;
    const bool explained_all = KubeTestEnv::WaitFor(
        [&] {
          result = RunProcess(
              {kubectl, "--kubeconfig", kube().kubeconfig(), "--cache-dir",
               kube().dir() + "/kubectl-cache", "--request-timeout", "10s", "explain", argument},
              {}, 15000);
          if (result.code() != 0) return false;
          const std::string printed = OneLine(result.out);
          missing.clear();
          for (size_t i = 0; i < expected.size(); ++i) {
            if (printed.find(descriptions[i]) == std::string::npos) missing = expected[i];
          }
          return missing.empty();
        },
        30000);
    EXPECT_TRUE(explained_all) << "within 30 s: exit " << result.code() << ", "
                               << (missing.empty() ? "" : "no description of " + missing)
                               << "\nstdout:\n"
                               << result.out << "stderr:\n"
                               << result.err;
    if (explained.field == "spec.trainer.optimizer.learningRate") {
      std::cout << "kubectl explain " << argument << ":\n" << result.out;
    }
  }
}

// How each spec-layer bad manifest fares against the schema.
enum class Outcome {
  kRefused,   // the API server refuses it, naming `field` in the message
  kAccepted,  // the schema cannot express the rule: the operator marks the job Failed
  kClient,    // never reaches a server: YAML the client cannot decode
};
struct Expectation {
  Outcome outcome;
  std::string field;  // kRefused: a substring of the server's message
};
const std::map<std::string, Expectation> kBadManifestOutcomes = {
    {"01-empty-file.yaml", {Outcome::kClient, ""}},
    {"02-malformed-indentation.yaml", {Outcome::kClient, ""}},
    {"03-unclosed-bracket.yaml", {Outcome::kClient, ""}},
    {"04-wrong-api-version.yaml", {Outcome::kRefused, "lockstep.io/v1"}},
    {"05-wrong-kind.yaml", {Outcome::kRefused, "PyTorchJob"}},
    {"06-bad-name.yaml", {Outcome::kRefused, "metadata.name"}},
    {"07-missing-name.yaml", {Outcome::kRefused, "metadata.name"}},
    {"08-missing-replicas.yaml", {Outcome::kRefused, "spec.replicas"}},
    {"09-replicas-zero.yaml", {Outcome::kRefused, "spec.replicas"}},
    {"10-replicas-string.yaml", {Outcome::kRefused, "spec.replicas"}},
    {"11-batch-size-string.yaml", {Outcome::kRefused, "spec.trainer.batchSize"}},
    {"12-replicas-float.yaml", {Outcome::kRefused, "spec.replicas"}},
    {"13-elastic-min-gt-max.yaml", {Outcome::kAccepted, ""}},
    {"14-replicas-outside-elastic.yaml", {Outcome::kAccepted, ""}},
    {"15-trainer-and-command.yaml", {Outcome::kRefused, "spec"}},
    {"16-neither-trainer-nor-command.yaml", {Outcome::kRefused, "spec"}},
    {"17-unknown-top-field.yaml", {Outcome::kAccepted, ""}},        // `specs` pruned
    {"18-unknown-spec-field.yaml", {Outcome::kAccepted, ""}},       // `replica` pruned
    {"19-unknown-trainer-field.yaml", {Outcome::kAccepted, ""}},    // pruned
    {"20-unknown-optimizer-field.yaml", {Outcome::kAccepted, ""}},  // pruned
    {"21-bad-activation.yaml", {Outcome::kRefused, "spec.trainer.model.activation"}},
    {"22-bad-optimizer-type.yaml", {Outcome::kRefused, "spec.trainer.optimizer.type"}},
    {"23-bad-data-format.yaml", {Outcome::kRefused, "spec.trainer.data.format"}},
    {"24-bad-device.yaml", {Outcome::kRefused, "spec.trainer.device"}},
    {"25-bad-compression.yaml", {Outcome::kRefused, "spec.trainer.allreduce.compression"}},
    {"26-bad-restart-policy.yaml", {Outcome::kRefused, "spec.runPolicy.restartPolicy"}},
    {"27-bad-network-mode.yaml", {Outcome::kRefused, "spec.network.mode"}},
    {"28-batch-size-zero.yaml", {Outcome::kRefused, "spec.trainer.batchSize"}},
    {"29-learning-rate-zero.yaml", {Outcome::kRefused, "spec.trainer.optimizer.learningRate"}},
    {"30-checkpoint-keep-zero.yaml", {Outcome::kRefused, "spec.checkpoint.keep"}},
    {"31-hidden-zero.yaml", {Outcome::kRefused, "spec.trainer.model.hidden"}},
    {"32-steps-and-epochs.yaml", {Outcome::kRefused, "spec.trainer"}},
    {"33-bad-checkpoint-uri.yaml", {Outcome::kRefused, "spec.checkpoint.uri"}},
    {"34-metrics-port-out-of-range.yaml", {Outcome::kRefused, "spec.metrics.port"}},
    {"35-csv-two-train-files.yaml", {Outcome::kRefused, "spec.trainer.data"}},
    {"36-missing-data-train.yaml", {Outcome::kRefused, "spec.trainer.data.train"}},
    {"37-elastic-is-list.yaml", {Outcome::kRefused, "spec.elastic"}},
    {"38-hidden-is-map.yaml", {Outcome::kRefused, "spec.trainer.model.hidden"}},
    {"39-suspend-quoted-bool.yaml", {Outcome::kRefused, "spec.runPolicy.suspend"}},
    {"40-momentum-one.yaml", {Outcome::kRefused, "spec.trainer.optimizer.momentum"}},
    {"41-duplicate-key.yaml", {Outcome::kClient, ""}},
    {"42-two-documents.yaml", {Outcome::kClient, ""}},
    {"43-neither-steps-nor-epochs.yaml", {Outcome::kRefused, "spec.trainer"}},
    {"44-data-uri-scheme.yaml", {Outcome::kRefused, "spec.trainer.data.test"}},
    // Refused by the decoder (400), whose message quotes the value but names no field.
    {"45-metadata-is-string.yaml", {Outcome::kRefused, "fashion-mlp"}},
    {"46-idx-one-train-file.yaml", {Outcome::kRefused, "spec.trainer.data"}},
    {"47-command-not-list.yaml", {Outcome::kRefused, "spec.command"}},
    {"48-top-level-list.yaml", {Outcome::kRefused, ""}},
    {"49-ncclenv-number.yaml", {Outcome::kRefused, "spec.network.ncclEnv"}},
    {"56-name-starts-with-digit.yaml", {Outcome::kRefused, "metadata.name"}},
    {"57-ranks-per-worker-not-auto.yaml", {Outcome::kRefused, "spec.ranksPerWorker"}},
    // Compares two fields: left to the operator (and `lockstep validate`).
    {"58-cuda-ranks-exceed-gpus.yaml", {Outcome::kAccepted, ""}},
    {"59-replicas-past-bound.yaml", {Outcome::kRefused, "spec.replicas"}},
    // A rule on the first item only: a structural schema's `items` applies to every item.
    {"60-command-empty-program.yaml", {Outcome::kAccepted, ""}},
    {"64-sync-unknown-strategy.yaml", {Outcome::kRefused, "spec.trainer.sync.strategy"}},
    {"65-sync-dgc-sparsity-one.yaml", {Outcome::kRefused, "spec.trainer.sync.dgc.sparsity"}},
    // Compares two fields (strategy and optimizer.type): left to the webhook.
    {"66-sync-dgc-with-adamw.yaml", {Outcome::kAccepted, ""}},
    {"67-precision-fp16.yaml", {Outcome::kRefused, "spec.trainer.precision"}},
    {"68-standby-negative.yaml", {Outcome::kRefused, "spec.elastic.standby"}},
    // Compares stages with the model's layers: left to the webhook.
    {"69-pipeline-more-stages-than-layers.yaml", {Outcome::kAccepted, ""}},
    {"70-pipeline-schedule-unknown.yaml", {Outcome::kRefused, "spec.trainer.pipeline.schedule"}},
    // Compares microBatches with batchSize: left to the webhook.
    {"71-pipeline-micro-batches-not-dividing.yaml", {Outcome::kAccepted, ""}},
    // Parameter-server rules compare fields (strategy, servers, optimizer, mode): the webhook's.
    {"72-parameter-server-strategy-without-servers.yaml", {Outcome::kAccepted, ""}},
    {"73-parameter-server-momentum.yaml", {Outcome::kAccepted, ""}},
    {"74-parameter-server-staleness-in-sync-mode.yaml", {Outcome::kAccepted, ""}},
    {"75-embedding-without-parameter-servers.yaml", {Outcome::kAccepted, ""}},
    {"76-parameter-server-gpus.yaml", {Outcome::kRefused, "spec.parameterServers.resources.gpus"}},
};

TEST_F(CrdTest, BadManifestsAreRefusedWhereTheSchemaCanSayWhy) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(kSource + "/tests/data/bad_manifests")) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::ostringstream report;
  int spec_layer = 0;
  for (const fs::path& path : files) {
    std::string text = ReadText(path);
    if (text.find("# layer: spec") == std::string::npos) continue;
    ++spec_layer;
    std::string file = path.filename();
    SCOPED_TRACE(file);
    auto expectation = kBadManifestOutcomes.find(file);
    ASSERT_NE(expectation, kBadManifestOutcomes.end()) << "new bad manifest: add it to the table";
    json manifest;
    std::string why;
    if (!YamlFileToJson(text, &manifest, &why)) {
      report << file << ": client-side (" << why.substr(0, 60) << ")\n";
      EXPECT_EQ(expectation->second.outcome, Outcome::kClient) << why;
      continue;
    }
    std::string ns = "bad";
    if (manifest.is_object() && manifest["metadata"].is_object() &&
        manifest["metadata"].contains("namespace")) {
      ns = manifest["metadata"]["namespace"];
    }
    auto response = kube().Request("POST", kJobs + ns + "/trainingjobs", manifest);
    std::string message =
        response.body.is_object() ? response.body.value("message", response.raw) : response.raw;
    if (response.status == 201) {
      report << file << ": ACCEPTED (left to the operator)\n";
      EXPECT_EQ(expectation->second.outcome, Outcome::kAccepted) << "accepted";
      kube().Request("DELETE", kJobs + ns + "/trainingjobs/" +
                                   response.body["metadata"]["name"].get<std::string>());
    } else {
      report << file << ": refused " << response.status << ": " << message << "\n";
      EXPECT_EQ(expectation->second.outcome, Outcome::kRefused) << message;
      EXPECT_TRUE(response.status == 400 || response.status == 422) << response.status << message;
      EXPECT_NE(message.find(expectation->second.field), std::string::npos)
          << "the message does not name " << expectation->second.field << ": " << message;
    }
  }
  EXPECT_EQ(spec_layer, static_cast<int>(kBadManifestOutcomes.size()));
  std::cout << "bad manifests against the API server:\n" << report.str();
}

}  // namespace
}  // namespace lockstep::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new lockstep::testing::KubeTestEnvironment("crd_test"));
  return RUN_ALL_TESTS();
}
