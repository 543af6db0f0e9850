// lockstep-operator against a real kube-apiserver 1.20.2 + etcd on loopback. No kubelet runs:
// these tests move pods through their phases by writing pod status, as a kubelet would, and
// check what a user sees through the API (kubectl get/describe): children, phases, conditions,
// counts, events.
#include <gtest/gtest.h>
#include <signal.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <utility>

#include "common/base64.h"
#include "common/rendezvous/client.h"
#include "common/spec/problems.h"
#include "common/spec/training_job.h"
#include "common/spec/yaml_to_json.h"
#include "tests/integration/operator/operator_harness.h"
#include "tests/support/kube/kubelet_simulator.h"
#include "tests/support/process/process.h"

namespace lockstep::testing {
namespace {

constexpr int64_t kWaitMs = 30000;

class OperatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_ = OperatorHarness::Get();
    ASSERT_NE(h_, nullptr);
    ns_ = h_->NewNamespace("op");
    std::string error;
    op_ = h_->StartOperator(Options(), &error);
    ASSERT_NE(op_, nullptr) << error;
  }
  void TearDown() override {
    if (HasFailure() && op_) std::cerr << "operator log:\n" << op_->LogTail() << "\n";
  }
  virtual OperatorOptions Options() {
    OperatorOptions options;
    options.watch_namespace = ns_;
    return options;
  }

  std::vector<json> WaitForPods(const std::string& job, size_t count) {
    std::vector<json> pods;
    bool ok = OperatorHarness::WaitFor(
        [&] {
          pods = h_->Pods(ns_, job);
          return pods.size() == count;
        },
        kWaitMs);
    EXPECT_TRUE(ok) << "expected " << count << " pods of " << job << ", have " << pods.size();
    return pods;
  }
  json WaitForJob(const std::string& name, const std::function<bool(const json&)>& predicate,
                  const std::string& what) {
    return h_->ExpectJob(ns_, name, predicate, what, kWaitMs);
  }
  std::map<std::string, std::string> UidsByName(const std::vector<json>& pods) {
    std::map<std::string, std::string> uids;
    for (const json& p : pods) uids[p["metadata"]["name"]] = p["metadata"]["uid"];
    return uids;
  }
  void RunAll(const std::string& job) {
    for (const json& p : h_->Pods(ns_, job)) {
      ASSERT_TRUE(h_->SetPodRunning(ns_, p["metadata"]["name"]));
    }
  }
  // Whether an event with `reason` about `object` appears within kWaitMs: the operator's event
  // recorder writes asynchronously, after the status write a test has waited for.
  bool HasEvent(const std::string& object, const std::string& reason) {
    return OperatorHarness::WaitFor(
        [&] {
          for (const json& e : h_->Events(ns_, object)) {
            if (e.value("reason", "") == reason) return true;
          }
          return false;
        },
        kWaitMs);
  }

  OperatorHarness* h_ = nullptr;
  std::string ns_;
  std::unique_ptr<OperatorProcess> op_;
};

TEST_F(OperatorTest, CreatedJobGetsSecretServiceAndOnePodPerWorkerOwnedByIt) {
  auto r = h_->Apply(ns_, JobManifest("create", 3));
  ASSERT_EQ(r.status, 201) << r.raw;
  const std::string uid = r.body["metadata"]["uid"];
  std::vector<json> pods = WaitForPods("create", 3);
  ASSERT_EQ(pods.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const json& pod = pods[i];
    EXPECT_EQ(pod["metadata"]["name"], "create-worker-" + std::to_string(i));
    EXPECT_EQ(pod["metadata"]["labels"]["lockstep.io/replica-index"], std::to_string(i));
    ASSERT_EQ(pod["metadata"]["ownerReferences"].size(), 1u);
    EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["uid"], uid);
    EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["controller"], true);
    std::map<std::string, json> env;
    for (const json& e : pod["spec"]["containers"][0]["env"]) env[e["name"]] = e;
    EXPECT_EQ(env["LOCKSTEP_JOB"]["value"], ns_ + "/create");
    EXPECT_EQ(env["LOCKSTEP_RENDEZVOUS"]["value"],
              "127.0.0.1:" + std::to_string(op_->rendezvous_port()));
    EXPECT_EQ(env["LOCKSTEP_JOB_TOKEN"]["valueFrom"]["secretKeyRef"]["name"], "create-rendezvous");
    EXPECT_TRUE(env.count("LOCKSTEP_SPEC"));
    EXPECT_TRUE(env.count("LOCKSTEP_RENDEZVOUS_CA_FILE"));
  }
  auto secret =
      h_->kube().Request("GET", "/api/v1/namespaces/" + ns_ + "/secrets/create-rendezvous");
  ASSERT_EQ(secret.status, 200) << secret.raw;
  EXPECT_EQ(secret.body["metadata"]["ownerReferences"][0]["uid"], uid);
  EXPECT_TRUE(secret.body["data"].contains("token"));
  EXPECT_TRUE(secret.body["data"].contains("ca.crt"));
  auto service = h_->kube().Request("GET", "/api/v1/namespaces/" + ns_ + "/services/create");
  ASSERT_EQ(service.status, 200) << service.raw;
  EXPECT_EQ(service.body["spec"]["clusterIP"], "None");

  json job = WaitForJob(
      "create", [](const json& j) { return Phase(j) == "Created"; }, "Created");
  EXPECT_EQ(Condition(job, "Created")["status"], "True");
  EXPECT_EQ(job["status"]["replicas"]["desired"], 3);
  EXPECT_EQ(job["status"]["selector"], "lockstep.io/job-name=create");
  EXPECT_TRUE(HasEvent("create", "SuccessfulCreatePod"));

  RunAll("create");
  job = WaitForJob(
      "create", [](const json& j) { return j["status"]["replicas"].value("ready", 0) == 3; },
      "had 3 ready workers");
  // No worker joined the rendezvous (nothing runs them here): running pods are not training.
  EXPECT_EQ(Phase(job), "Created");
}

TEST_F(OperatorTest, ScalingUpAndDownChangesOnlyTheConcernedPods) {
  ASSERT_EQ(h_->Apply(ns_, JobManifest("scale", 2)).status, 201);
  auto before = UidsByName(WaitForPods("scale", 2));
  RunAll("scale");
  auto r = h_->Scale(ns_, "scale", 4);
  ASSERT_EQ(r.status, 200) << r.raw;
  auto up = UidsByName(WaitForPods("scale", 4));
  EXPECT_EQ(up["scale-worker-0"], before["scale-worker-0"]);
  EXPECT_EQ(up["scale-worker-1"], before["scale-worker-1"]);
  json job = WaitForJob(
      "scale", [](const json& j) { return Condition(j, "Scaling").value("status", "") == "True"; },
      "Scaling");
  EXPECT_EQ(Phase(job), "Scaling");
  RunAll("scale");
  job = WaitForJob(
      "scale", [](const json& j) { return Condition(j, "Scaling").value("status", "") == "False"; },
      "finished scaling");

  ASSERT_EQ(h_->Scale(ns_, "scale", 1).status, 200);
  auto down = UidsByName(WaitForPods("scale", 1));
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down["scale-worker-0"], before["scale-worker-0"]);
  EXPECT_TRUE(HasEvent("scale", "SuccessfulDeletePod"));
}

TEST_F(OperatorTest, DeletedPodIsReplacedWithoutCountingAgainstBackoff) {
  ASSERT_EQ(h_->Apply(ns_, JobManifest("deleted", 2)).status, 201);
  auto before = UidsByName(WaitForPods("deleted", 2));
  auto r = h_->kube().Request("DELETE", "/api/v1/namespaces/" + ns_ + "/pods/deleted-worker-1");
  ASSERT_EQ(r.status, 200) << r.raw;
  bool replaced = OperatorHarness::WaitFor(
      [&] {
        json pod = h_->Pod(ns_, "deleted-worker-1");
        return !pod.is_null() && pod["metadata"]["uid"] != before["deleted-worker-1"];
      },
      kWaitMs);
  EXPECT_TRUE(replaced);
  EXPECT_EQ(UidsByName(h_->Pods(ns_, "deleted"))["deleted-worker-0"], before["deleted-worker-0"]);
  EXPECT_EQ(h_->GetJob(ns_, "deleted")["status"].value("restarts", 0), 0);
}

TEST_F(OperatorTest, RetryableExitCodeReplacesThePodAndPermanentOneFailsTheJob) {
  json manifest = JobManifest("exitcode", 2);
  manifest["spec"]["runPolicy"] = {{"restartPolicy", "ExitCode"}, {"backoffLimit", 3}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  auto before = UidsByName(WaitForPods("exitcode", 2));
  RunAll("exitcode");
  ASSERT_TRUE(h_->SetPodTerminated(ns_, "exitcode-worker-1", 137));  // SIGKILL: retryable
  json job = WaitForJob(
      "exitcode", [](const json& j) { return j["status"].value("restarts", 0) == 1; },
      "counted a restart");
  bool replaced = OperatorHarness::WaitFor(
      [&] {
        json pod = h_->Pod(ns_, "exitcode-worker-1");
        return !pod.is_null() && pod["metadata"]["uid"] != before["exitcode-worker-1"];
      },
      kWaitMs);
  EXPECT_TRUE(replaced);
  EXPECT_EQ(Condition(job, "Restarting")["status"], "True");

  ASSERT_TRUE(h_->SetPodTerminated(ns_, "exitcode-worker-0", 1));  // a bug: not retryable
  job = WaitForJob(
      "exitcode", [](const json& j) { return Phase(j) == "Failed"; }, "Failed");
  json failed = Condition(job, "Failed");
  EXPECT_EQ(failed["reason"], "PodFailed");
  EXPECT_NE(failed["message"].get<std::string>().find("exit code 1"), std::string::npos)
      << failed.dump();
  EXPECT_TRUE(job["status"].contains("completionTime"));
  // The other worker is stopped: nothing would use it.
  bool gone = OperatorHarness::WaitFor([&] { return h_->Pod(ns_, "exitcode-worker-1").is_null(); },
                                       kWaitMs);
  EXPECT_TRUE(gone);
}

TEST_F(OperatorTest, BackoffLimitReachedFailsTheJobWithTheReason) {
  json manifest = JobManifest("backoff", 1);
  manifest["spec"]["runPolicy"] = {{"restartPolicy", "OnFailure"}, {"backoffLimit", 2}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  std::string last_uid;
  for (int failure = 0; failure < 3; ++failure) {
    json pod;
    bool fresh = OperatorHarness::WaitFor(
        [&] {
          pod = h_->Pod(ns_, "backoff-worker-0");
          return !pod.is_null() && pod["metadata"]["uid"] != last_uid;
        },
        kWaitMs);
    ASSERT_TRUE(fresh) << "failure " << failure << ": no new pod";
    last_uid = pod["metadata"]["uid"];
    ASSERT_TRUE(h_->SetPodTerminated(ns_, "backoff-worker-0", 2));
  }
  json job = WaitForJob(
      "backoff", [](const json& j) { return Phase(j) == "Failed"; }, "Failed");
  EXPECT_EQ(Condition(job, "Failed")["reason"], "BackoffLimitExceeded");
  EXPECT_EQ(job["status"]["restarts"], 2);
  EXPECT_TRUE(HasEvent("backoff", "BackoffLimitExceeded"));
}

TEST_F(OperatorTest, AllWorkersSucceededMakesTheJobSucceeded) {
  ASSERT_EQ(h_->Apply(ns_, JobManifest("done", 2)).status, 201);
  WaitForPods("done", 2);
  RunAll("done");
  ASSERT_TRUE(h_->SetPodTerminated(ns_, "done-worker-0", 0));
  ASSERT_TRUE(h_->SetPodTerminated(ns_, "done-worker-1", 0));
  json job = WaitForJob(
      "done", [](const json& j) { return Phase(j) == "Succeeded"; }, "Succeeded");
  EXPECT_EQ(Condition(job, "Succeeded")["status"], "True");
  EXPECT_EQ(job["status"]["replicas"]["succeeded"], 2);
  EXPECT_TRUE(job["status"].contains("completionTime"));
  // Finished pods stay (their logs), and none is recreated.
  EXPECT_EQ(h_->Pods(ns_, "done").size(), 2u);
}

TEST_F(OperatorTest, SuspendDeletesThePodsAndResumeBringsThemBack) {
  ASSERT_EQ(h_->Apply(ns_, JobManifest("suspend", 2)).status, 201);
  WaitForPods("suspend", 2);
  ASSERT_EQ(h_->PatchJobSpec(ns_, "suspend", {{"runPolicy", {{"suspend", true}}}}).status, 200);
  WaitForPods("suspend", 0);
  json job = WaitForJob(
      "suspend", [](const json& j) { return Phase(j) == "Suspended"; }, "Suspended");
  EXPECT_EQ(Condition(job, "Suspended")["status"], "True");
  ASSERT_EQ(h_->PatchJobSpec(ns_, "suspend", {{"runPolicy", {{"suspend", false}}}}).status, 200);
  WaitForPods("suspend", 2);
  job = WaitForJob(
      "suspend",
      [](const json& j) { return Condition(j, "Suspended").value("status", "") == "False"; },
      "resumed");
  EXPECT_EQ(Condition(job, "Suspended")["reason"], "Resumed");
}

TEST_F(OperatorTest, ActiveDeadlineFailsTheJobAndStopsItsPods) {
  json manifest = JobManifest("deadline", 2);
  manifest["spec"]["runPolicy"] = {{"activeDeadlineSeconds", 2}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  WaitForPods("deadline", 2);
  json job = WaitForJob(
      "deadline", [](const json& j) { return Phase(j) == "Failed"; }, "Failed");
  EXPECT_EQ(Condition(job, "Failed")["reason"], "DeadlineExceeded");
  WaitForPods("deadline", 0);
}

TEST_F(OperatorTest, FinishedJobIsDeletedAfterItsTtl) {
  json manifest = JobManifest("ttl", 1);
  manifest["spec"]["runPolicy"] = {{"ttlSecondsAfterFinished", 1}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  WaitForPods("ttl", 1);
  ASSERT_TRUE(h_->SetPodTerminated(ns_, "ttl-worker-0", 0));
  bool deleted =
      OperatorHarness::WaitFor([&] { return h_->GetJob(ns_, "ttl").is_null(); }, kWaitMs);
  EXPECT_TRUE(deleted);
  // Its children go with it (owner references, the garbage collector).
  WaitForPods("ttl", 0);
}

TEST_F(OperatorTest, DeletingAJobDeletesItsPodsServiceAndSecret) {
  ASSERT_EQ(h_->Apply(ns_, JobManifest("gone", 2)).status, 201);
  WaitForPods("gone", 2);
  auto exists = [&](const std::string& path) {
    return h_->kube().Request("GET", "/api/v1/namespaces/" + ns_ + path).status == 200;
  };
  ASSERT_TRUE(OperatorHarness::WaitFor(
      [&] { return exists("/services/gone") && exists("/secrets/gone-rendezvous"); }, kWaitMs));
  ASSERT_EQ(h_->kube()
                .Request("DELETE", "/apis/lockstep.io/v1alpha1/namespaces/" + ns_ +
                                       "/trainingjobs/gone")
                .status,
            200);
  WaitForPods("gone", 0);
  EXPECT_TRUE(OperatorHarness::WaitFor(
      [&] { return !exists("/services/gone") && !exists("/secrets/gone-rendezvous"); }, kWaitMs))
      << "the Service or the Secret outlived its TrainingJob";
}

TEST_F(OperatorTest, GangSchedulingCreatesAPodGroupWithMinMember) {
  json manifest = JobManifest("gang", 4);
  manifest["spec"]["elastic"] = {{"minReplicas", 2}, {"maxReplicas", 6}};
  manifest["spec"]["runPolicy"] = {{"scheduling", {{"gang", "volcano"}, {"queue", "research"}}}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  std::vector<json> pods = WaitForPods("gang", 4);
  auto group = h_->kube().Request(
      "GET", "/apis/scheduling.volcano.sh/v1beta1/namespaces/" + ns_ + "/podgroups/gang");
  ASSERT_EQ(group.status, 200) << group.raw;
  EXPECT_EQ(group.body["spec"]["minMember"], 2);
  EXPECT_EQ(group.body["spec"]["queue"], "research");
  ASSERT_FALSE(pods.empty());
  EXPECT_EQ(pods[0]["spec"]["schedulerName"], "volcano");
}

TEST_F(OperatorTest, RoceJobPodsGetTheRdmaDeviceMultusIpcLockAndShm) {
  json manifest = JobManifest("roce", 1);
  manifest["spec"]["network"] = {{"mode", "roce"},
                                 {"rdmaResource", {{"name", "rdma/roce_shared"}, {"count", 1}}},
                                 {"multusNetworks", {"roce-net"}},
                                 {"ncclEnv", {{"NCCL_IB_GID_INDEX", "3"}}}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  std::vector<json> pods = WaitForPods("roce", 1);
  ASSERT_EQ(pods.size(), 1u);
  const json& pod = pods[0];
  const json& c = pod["spec"]["containers"][0];
  EXPECT_EQ(c["resources"]["limits"]["rdma/roce_shared"], "1");
  EXPECT_EQ(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"], "roce-net");
  // IPC_LOCK is the only capability, and it reaches only a root process.
  EXPECT_EQ(c["securityContext"]["capabilities"],
            json::parse(R"({"add": ["IPC_LOCK"], "drop": ["ALL"]})"));
  EXPECT_EQ(c["securityContext"]["runAsUser"], 0);
  EXPECT_EQ(pod["spec"]["automountServiceAccountToken"], false);
  bool shm = false;
  for (const json& m : c["volumeMounts"]) shm |= m["mountPath"] == "/dev/shm";
  EXPECT_TRUE(shm);
  std::map<std::string, json> env;
  for (const json& e : c["env"]) env[e["name"]] = e;
  EXPECT_EQ(env["NCCL_IB_GID_INDEX"]["value"], "3");
}

TEST_F(OperatorTest, CrossFieldErrorsTheSchemaCannotExpressFailTheJobNamingTheField) {
  json manifest = JobManifest("minmax", 4);
  manifest["spec"]["elastic"] = {{"minReplicas", 5}, {"maxReplicas", 8}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  json job = WaitForJob(
      "minmax", [](const json& j) { return Phase(j) == "Failed"; }, "Failed");
  json failed = Condition(job, "Failed");
  EXPECT_EQ(failed["reason"], "InvalidSpec");
  EXPECT_NE(failed["message"].get<std::string>().find("spec.elastic.minReplicas"),
            std::string::npos)
      << failed.dump();
  EXPECT_TRUE(h_->Pods(ns_, "minmax").empty());
  EXPECT_TRUE(HasEvent("minmax", "InvalidSpec"));
}

// Every broken manifest of tests/data/bad_manifests that a client can decode is sent to the API
// server while the operator runs: the schema refuses it naming the field, or the server stores
// it and the operator's verdict is the model's (`lockstep validate`) on what was stored: Failed
// with reason InvalidSpec naming the field when the model refuses it, never that otherwise. The
// operator stays up throughout.
TEST_F(OperatorTest, BrokenManifestsAreRefusedOrFailedNamingTheFieldAndTheOperatorStaysUp) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& entry :
       fs::directory_iterator(LOCKSTEP_SOURCE_DIR "/tests/data/bad_manifests")) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  int refused = 0, failed_by_operator = 0;
  std::vector<std::pair<std::string, std::string>> accepted;  // file, job name
  for (const fs::path& file : files) {
    json manifest;
    try {
      std::vector<YAML::Node> documents = YAML::LoadAllFromFile(file.string());
      if (documents.size() != 1) continue;  // never reaches a server
      spec::internal::Problems problems;
      manifest = spec::internal::YamlToJson(documents[0], &problems);
      if (!problems.empty() || manifest.is_null()) continue;
    } catch (const YAML::Exception&) {
      continue;
    }
    // Each its own job (many share a name); names that are themselves the error stay.
    if (manifest.is_object() && manifest.contains("metadata") && manifest["metadata"].is_object() &&
        manifest["metadata"].contains("name") && manifest["metadata"]["name"].is_string() &&
        file.filename().string().find("name") == std::string::npos) {
      manifest["metadata"]["name"] = "bad-" + file.filename().string().substr(0, 2);
    }
    auto r = h_->Apply(ns_, manifest);
    ASSERT_NE(r.status, 409) << file << ": " << r.raw;
    if (r.status >= 400 && r.status < 500) {
      ++refused;
      continue;
    }
    ASSERT_EQ(r.status, 201) << file << ": " << r.raw;
    accepted.emplace_back(file.filename().string(), r.body["metadata"]["name"]);
  }
  for (const auto& [file, name] : accepted) {
    json stored = h_->GetJob(ns_, name);
    json manifest = {{"apiVersion", stored["apiVersion"]},
                     {"kind", stored["kind"]},
                     {"metadata", {{"name", name}, {"namespace", ns_}}},
                     {"spec", stored["spec"]}};
    StatusOr<spec::TrainingJob> verdict = spec::ParseTrainingJobJson(manifest, "stored");
    if (verdict.ok()) {
      // Valid once stored (unknown fields pruned, or what only the worker checks: data files).
      json job = h_->GetJob(ns_, name);
      EXPECT_NE(Condition(job, "Failed").value("reason", ""), "InvalidSpec") << file;
      continue;
    }
    const std::string message = verdict.status().message();
    const size_t field_at = message.find("spec.");
    ASSERT_NE(field_at, std::string::npos) << message;
    const std::string field = message.substr(field_at, message.find(':', field_at) - field_at);
    json job = WaitForJob(
        name, [](const json& j) { return Phase(j) == "Failed"; }, "Failed");
    json failed = Condition(job, "Failed");
    EXPECT_EQ(failed["reason"], "InvalidSpec") << file;
    EXPECT_NE(failed.value("message", "").find(field), std::string::npos)
        << file << ": " << failed.dump() << " does not name " << field;
    ++failed_by_operator;
  }
  EXPECT_GE(refused + failed_by_operator, 30)
      << refused << " refused, " << failed_by_operator << " failed by the operator";
  EXPECT_GE(failed_by_operator, 2);
  int code = 0;
  op_->Http("/healthz", &code);
  EXPECT_EQ(code, 200) << "the operator is down:\n" << op_->LogTail();
}

TEST_F(OperatorTest, PodTemplateTheApiServerRefusesFailsTheJobWithItsMessage) {
  json manifest = JobManifest("badtemplate", 1);
  manifest["spec"]["template"] = {
      {"spec", {{"volumes", json::array({{{"name", "Bad_Name"}, {"emptyDir", json::object()}}})}}}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  json job = WaitForJob(
      "badtemplate", [](const json& j) { return Phase(j) == "Failed"; }, "Failed");
  json failed = Condition(job, "Failed");
  EXPECT_EQ(failed["reason"], "InvalidPodTemplate");
  EXPECT_NE(failed["message"].get<std::string>().find("volumes"), std::string::npos)
      << failed.dump();
  EXPECT_TRUE(HasEvent("badtemplate", "FailedCreatePod"));
}

TEST_F(OperatorTest, AParameterServerJobGetsItsServersTheirServiceAndWorkersThatFindThem) {
  ASSERT_EQ(h_->Apply(ns_, ParameterServerManifest("ctr")).status, 201);
  std::vector<json> pods = WaitForPods("ctr", 4);
  std::map<std::string, json> by_name;
  for (const json& pod : pods) by_name[pod["metadata"]["name"]] = pod;
  const std::string servers =
      "ctr-ps-0.ctr-ps." + ns_ + ".svc:7470,ctr-ps-1.ctr-ps." + ns_ + ".svc:7470";
  for (int i = 0; i < 2; ++i) {
    const json& worker = by_name["ctr-worker-" + std::to_string(i)];
    ASSERT_TRUE(worker.is_object()) << "no ctr-worker-" << i;
    std::map<std::string, json> env;
    for (const json& e : worker["spec"]["containers"][0]["env"]) env[e["name"]] = e;
    EXPECT_EQ(env["LOCKSTEP_PS_SERVERS"]["value"], servers);
    EXPECT_EQ(env["LOCKSTEP_WORKER_INDEX"]["value"], std::to_string(i));

    const json& server = by_name["ctr-ps-" + std::to_string(i)];
    ASSERT_TRUE(server.is_object()) << "no ctr-ps-" << i;
    EXPECT_EQ(server["metadata"]["labels"]["lockstep.io/replica-type"], "ps");
    EXPECT_EQ(server["metadata"]["labels"]["lockstep.io/ps-index"], std::to_string(i));
    EXPECT_FALSE(server["metadata"]["labels"].contains("lockstep.io/replica-index"));
    EXPECT_EQ(server["spec"]["subdomain"], "ctr-ps");
    const json& container = server["spec"]["containers"][0];
    EXPECT_EQ(container["command"], json({"lockstep-worker", "ps", "--shard", std::to_string(i),
                                          "--listen", "0.0.0.0:7470"}));
    EXPECT_EQ(container["resources"]["limits"]["cpu"], "2");
    EXPECT_EQ(container["resources"]["requests"]["memory"], "1Gi");
    // The servers' own token, never the rendezvous token; the workers get it too.
    std::map<std::string, json> server_env;
    for (const json& e : container["env"]) server_env[e["name"]] = e;
    EXPECT_FALSE(server_env.count("LOCKSTEP_JOB_TOKEN")) << container["env"].dump();
    EXPECT_EQ(server_env["LOCKSTEP_PS_TOKEN"]["valueFrom"]["secretKeyRef"]["name"], "ctr-ps");
    EXPECT_EQ(env["LOCKSTEP_PS_TOKEN"]["valueFrom"]["secretKeyRef"]["name"], "ctr-ps");
  }
  // The servers' Secret: a token that is not the rendezvous token.
  const std::string secrets = "/api/v1/namespaces/" + ns_ + "/secrets/";
  auto ps_secret = h_->kube().Request("GET", secrets + "ctr-ps");
  ASSERT_EQ(ps_secret.status, 200) << ps_secret.raw;
  auto job_secret = h_->kube().Request("GET", secrets + "ctr-rendezvous");
  ASSERT_EQ(job_secret.status, 200) << job_secret.raw;
  EXPECT_FALSE(ps_secret.body["data"].value("token", "").empty());
  EXPECT_NE(ps_secret.body["data"]["token"], job_secret.body["data"]["token"]);
  auto service = h_->kube().Request("GET", "/api/v1/namespaces/" + ns_ + "/services/ctr-ps");
  ASSERT_EQ(service.status, 200) << service.raw;
  EXPECT_EQ(service.body["spec"]["clusterIP"], "None");
  EXPECT_EQ(service.body["spec"]["selector"]["lockstep.io/replica-type"], "ps");
  EXPECT_EQ(service.body["spec"]["ports"][0]["port"], 7470);

  RunAll("ctr");
  json job = WaitForJob(
      "ctr",
      [](const json& j) {
        return j["status"].value("parameterServers", json::object()).value("ready", 0) == 2 &&
               j["status"]["replicas"].value("ready", 0) == 2;
      },
      "had 2 ready servers and 2 ready workers");
  EXPECT_EQ(job["status"]["parameterServers"]["replicas"], 2);
  EXPECT_EQ(job["status"]["replicas"]["desired"], 2) << "servers are not workers";

  // No checkpoints: a lost server's shard cannot come back, and the job says so.
  ASSERT_TRUE(h_->SetPodTerminated(ns_, "ctr-ps-1", 137));
  job = WaitForJob(
      "ctr", [](const json& j) { return Phase(j) == "Failed"; }, "Failed");
  EXPECT_EQ(Condition(job, "Failed")["reason"], "ParameterServerLost") << job["status"].dump(2);
  EXPECT_NE(Condition(job, "Failed").value("message", "").find("set spec.checkpoint.uri"),
            std::string::npos)
      << job["status"].dump(2);
}

TEST_F(OperatorTest, ALostParameterServerWithCheckpointsIsReplacedAndCountedAsARestart) {
  json manifest = ParameterServerManifest("ctr-ckpt");
  manifest["spec"]["checkpoint"] = {{"uri", "file:///ckpt/ctr"}, {"intervalSteps", 100}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  auto before = UidsByName(WaitForPods("ctr-ckpt", 4));
  RunAll("ctr-ckpt");
  ASSERT_TRUE(h_->SetPodTerminated(ns_, "ctr-ckpt-ps-0", 137));
  json job = WaitForJob(
      "ctr-ckpt", [](const json& j) { return j["status"].value("restarts", 0) == 1; },
      "counted a restart");
  EXPECT_NE(Phase(job), "Failed") << job["status"].dump(2);
  bool replaced = OperatorHarness::WaitFor(
      [&] {
        json pod = h_->Pod(ns_, "ctr-ckpt-ps-0");
        return !pod.is_null() && pod["metadata"]["uid"] != before["ctr-ckpt-ps-0"];
      },
      kWaitMs);
  EXPECT_TRUE(replaced);
  EXPECT_TRUE(HasEvent("ctr-ckpt", "RestartingWorker"));  // "parameter server ctr-ckpt-ps-0 ..."

  // A server that exits 0 was told to stop (evicted, drained): replaced, not counted.
  ASSERT_TRUE(h_->SetPodTerminated(ns_, "ctr-ckpt-ps-1", 0));
  replaced = OperatorHarness::WaitFor(
      [&] {
        json pod = h_->Pod(ns_, "ctr-ckpt-ps-1");
        return !pod.is_null() && pod["metadata"]["uid"] != before["ctr-ckpt-ps-1"];
      },
      kWaitMs);
  EXPECT_TRUE(replaced);
  EXPECT_EQ(h_->GetJob(ns_, "ctr-ckpt")["status"].value("restarts", 0), 1);
}

// Another writer edits the status while the operator works (a second controller, a kubectl
// edit): the operator's writes conflict, it re-reads and converges on the truth.
TEST_F(OperatorTest, StatusOverwrittenByAnotherWriterConvergesBack) {
  ASSERT_EQ(h_->Apply(ns_, JobManifest("conflict", 3)).status, 201);
  WaitForPods("conflict", 3);
  WaitForJob(
      "conflict", [](const json& j) { return Phase(j) == "Created"; }, "Created");
  const std::string path =
      "/apis/lockstep.io/v1alpha1/namespaces/" + ns_ + "/trainingjobs/conflict/status";
  for (int i = 0; i < 20; ++i) {
    auto r = h_->kube().Request(
        "PATCH", path,
        json{{"status", {{"phase", "Pending"}, {"replicas", {{"desired", 99}, {"ready", 7}}}}}},
        "application/merge-patch+json");
    ASSERT_EQ(r.status, 200) << r.raw;
    if (i == 10) RunAll("conflict");
  }
  json job = WaitForJob(
      "conflict",
      [](const json& j) {
        return Phase(j) == "Created" && j["status"]["replicas"].value("desired", 0) == 3 &&
               j["status"]["replicas"].value("ready", 0) == 3;
      },
      "converged");
  EXPECT_EQ(h_->Pods(ns_, "conflict").size(), 3u);
}

TEST_F(OperatorTest, ExposesItsMetricsAndHealth) {
  int code = 0;
  op_->Http("/healthz", &code);
  EXPECT_EQ(code, 200);
  ASSERT_EQ(h_->Apply(ns_, JobManifest("metrics", 1)).status, 201);
  WaitForPods("metrics", 1);
  bool counted = OperatorHarness::WaitFor(
      [&] { return op_->Metric("lockstep_operator_jobs_created_total") >= 1; }, kWaitMs);
  EXPECT_TRUE(counted);
  EXPECT_EQ(op_->Metric("lockstep_operator_is_leader"), 1);
  ASSERT_TRUE(h_->SetPodTerminated(ns_, "metrics-worker-0", 0));
  bool succeeded = OperatorHarness::WaitFor(
      [&] { return op_->Metric("lockstep_operator_jobs_succeeded_total") == 1; }, kWaitMs);
  EXPECT_TRUE(succeeded) << op_->Http("/metrics");
  EXPECT_FALSE(std::isnan(op_->Metric("lockstep_operator_reconcile_duration_seconds_count")));
  EXPECT_FALSE(std::isnan(op_->Metric("lockstep_operator_workqueue_depth")));
}

// Real workers: the KubeletSimulator runs each pod's lockstep-worker as a local process with the
// env the operator wrote (token from the Secret, CA from its volume), so workers reach the
// operator's rendezvous service over TLS and train for real.
// Why a simulator and not tests/e2e's real kubelets: these restart the operator process itself
// mid-run and pick the uid an image runs as, and run without root in seconds on every machine.
class OperatorEndToEndTest : public OperatorTest {
 protected:
  // A simulated node that runs this namespace's worker pods as local lockstep-worker processes.
  KubeletSimulatorOptions WorkerKubeletOptions() const {
    KubeletSimulatorOptions options;
    options.namespace_ = ns_;
    options.executables = {{"lockstep-worker", LOCKSTEP_WORKER_BINARY}};
    options.extra_env = {{"LOCKSTEP_METRICS_PORT", "0"}};
    return options;
  }
  // image_user: the uid the simulated images run as (0: a root image).
  void StartKubelet(int64_t image_user = KubeletSimulatorOptions().image_user) {
    KubeletSimulatorOptions options = WorkerKubeletOptions();
    options.image_user = image_user;
    auto kubelet = KubeletSimulator::Start(&h_->kube(), options);
    ASSERT_TRUE(kubelet.ok()) << kubelet.status();
    kubelet_ = std::move(*kubelet);
  }
  void TearDown() override {
    if (HasFailure() && kubelet_) std::cerr << kubelet_->Describe() << "\n";
    OperatorTest::TearDown();
  }
  // Once job `name` has trained 50 steps, slows its worker 2 by a duty cycle (stopped and
  // continued every 30 ms, as a throttled CPU would leave it) until the job satisfies `until`;
  // the job as last seen, `*ok` whether `until` held within the bound.
  json SlowWorkerTwoUntil(const std::string& name, const std::function<bool(const json&)>& until,
                          bool* ok) {
    json job = h_->WaitForJob(
        ns_, name,
        [](const json& j) {
          return j.contains("status") && j["status"].contains("progress") &&
                 j["status"]["progress"].value("step", 0) >= 50;
        },
        120000, ok);
    if (!*ok) return job;
    const pid_t slowed = kubelet_->PidOf(ns_, name + "-worker-2");
    if (slowed <= 0) {
      *ok = false;
      ADD_FAILURE() << name << "-worker-2 has no process";
      return job;
    }
    lockstep::testing::DutyCycle duty(slowed);
    return h_->WaitForJob(ns_, name, until, 180000, ok);
  }
  std::unique_ptr<KubeletSimulator> kubelet_;
};

TEST_F(OperatorEndToEndTest, WorkersTrainOverTlsRendezvousAndTheJobSucceedsWithProgress) {
  StartKubelet();
  json manifest = JobManifest("e2e", 2);
  manifest["spec"]["trainer"]["steps"] = 300;
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  bool ok = false;
  json job = h_->WaitForJob(
      ns_, "e2e", [](const json& j) { return Phase(j) == "Succeeded"; }, 120000, &ok);
  ASSERT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelet_->Describe();
  EXPECT_EQ(job["status"]["progress"]["step"], 300);
  EXPECT_EQ(job["status"]["progress"]["totalSteps"], 300);
  // What `kubectl get tj` prints: the rate as a whole number, the efficiency as a percentage.
  const json& progress = job["status"]["progress"];
  const json display = progress.value("display", json::object());
  const std::string rate = display.value("samplesPerSecond", "");
  EXPECT_TRUE(!rate.empty() && rate.find_first_not_of("0123456789") == std::string::npos &&
              std::to_string(std::llround(progress["samplesPerSecond"].get<double>())) == rate)
      << progress.dump(2);
  if (progress.contains("scalingEfficiency")) {
    EXPECT_EQ(display.value("scalingEfficiency", ""),
              std::to_string(std::llround(progress["scalingEfficiency"].get<double>() * 100)) + "%")
        << progress.dump(2);
  }
  EXPECT_GE(job["status"]["rendezvous"]["generation"].get<int>(), 1);
  EXPECT_EQ(job["status"]["rendezvous"]["worldSize"], 2);
  EXPECT_EQ(job["status"]["replicas"]["succeeded"], 2);
  EXPECT_EQ(job["status"].value("restarts", 0), 0);
  // Running, if the status showed it (300 steps may end before a reconcile sees the job
  // Running), ends with the job; e2e_fashion_mnist checks it on a job that surely ran.
  if (const json running = Condition(job, "Running"); running.is_object() && !running.empty()) {
    EXPECT_EQ(running.value("status", ""), "False") << running.dump();
    EXPECT_EQ(running.value("reason", ""), "WorkersSucceeded") << running.dump();
    EXPECT_EQ(running.value("message", ""), "the job succeeded") << running.dump();
  }
}

// An exec job's program reports progress with the Python helper (on the PYTHONPATH its agent
// gives it); the job's status shows it while the program runs, as for the built-in trainer.
TEST_F(OperatorEndToEndTest, AnExecJobsReportedProgressShowsInTheStatusWhileItRuns) {
  StartKubelet();
  const std::string release = lockstep::testing::MakeTempDir("exec-status") + "/release";
  const std::string program =
      "import os, time\n"
      "from lockstep import progress\n"
      "progress.report(step=7, samples=448, loss=0.5, total_steps=10)\n"
      "deadline = time.time() + 120\n"
      "while not os.path.exists('" + release + "') and time.time() < deadline:\n"
      "    time.sleep(0.05)\n"
      "progress.report(step=10, samples=640, loss=0.25, total_steps=10)\n";
  json manifest = JobManifest("exec-progress", 1);
  manifest["spec"].erase("trainer");
  manifest["spec"]["command"] = {"/usr/bin/python3", "-c", program};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  json job = WaitForJob(
      "exec-progress",
      [](const json& j) {
        const json status = j.value("status", json::object());
        return status.is_object() &&
               status.value("progress", json::object()).value("step", int64_t{0}) == 7;
      },
      "showed the reported step 7");
  EXPECT_EQ(Phase(job), "Running") << job["status"].dump(2);
  EXPECT_EQ(job["status"]["progress"]["totalSteps"], 10);
  EXPECT_DOUBLE_EQ(job["status"]["progress"]["loss"].get<double>(), 0.5);
  EXPECT_FALSE(job["status"]["progress"].contains("samplesPerSecond"))
      << "one report gives no rate, so none is shown: " << job["status"].dump(2);
  lockstep::testing::WriteFile(release, "");
  job = WaitForJob("exec-progress", [](const json& j) { return Phase(j) == "Succeeded"; },
                   "succeeded");
  EXPECT_EQ(job["status"]["progress"]["step"], 10) << job["status"].dump(2);
}

// The exec agents hold the job's restart budget: when they give up, their termination message
// says so and the operator fails the job at once, with their reason, instead of spending its own
// replacements on pods whose agents would only give up again.
TEST_F(OperatorEndToEndTest, AnExecJobWhoseAgentsGaveUpFailsAtOnceWithTheirReason) {
  StartKubelet();
  json manifest = JobManifest("exec-gives-up", 2);
  manifest["spec"].erase("trainer");
  manifest["spec"]["command"] = {"/bin/sh", "-c", "exit 3"};
  manifest["spec"]["runPolicy"] = {{"restartPolicy", "OnFailure"}, {"backoffLimit", 1}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  json job = WaitForJob("exec-gives-up", [](const json& j) { return Phase(j) == "Failed"; },
                        "Failed");
  EXPECT_EQ(Condition(job, "Failed")["reason"], "WorkersGaveUp") << job["status"].dump(2);
  const std::string message = Condition(job, "Failed").value("message", "");
  EXPECT_NE(message.find("with exit code 3: restarts exhausted: 1 of 1"), std::string::npos)
      << message;
  EXPECT_EQ(job["status"].value("restarts", 0), 0) << "no pod was replaced";
}

// Worker pods ask for a non-root user (Pod Security "restricted"). A job that brings a root image
// is told why its worker cannot start, in the job's own status; its template may allow root.
TEST_F(OperatorEndToEndTest, ARootImageIsRefusedByRunAsNonRootAndTheJobSaysWhy) {
  StartKubelet(/*image_user=*/0);
  json manifest = JobManifest("root-image", 1);
  manifest["spec"]["trainer"]["steps"] = 50;
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  json job = WaitForJob(
      "root-image",
      [](const json& j) { return Condition(j, "Running").value("reason", "") == "WorkerCannotStart"; },
      "said why its worker cannot start");
  EXPECT_EQ(Condition(job, "Running")["status"], "False");
  const std::string message = Condition(job, "Running").value("message", "");
  EXPECT_NE(message.find("pod root-image-worker-0: CreateContainerConfigError: container has "
                         "runAsNonRoot and image will run as root"),
            std::string::npos)
      << message;

  json allowed = JobManifest("root-allowed", 1);
  allowed["spec"]["trainer"]["steps"] = 50;
  allowed["spec"]["template"] = {{"spec", {{"securityContext", {{"runAsUser", 0}}}}}};
  ASSERT_EQ(h_->Apply(ns_, allowed).status, 201);
  bool ok = false;
  job = h_->WaitForJob(
      ns_, "root-allowed", [](const json& j) { return Phase(j) == "Succeeded"; }, 120000, &ok);
  EXPECT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelet_->Describe();
}

TEST_F(OperatorEndToEndTest, KilledWorkerPodIsReplacedAndTheJobFinishesAtTheSameStepCount) {
  StartKubelet();
  // Long enough (several seconds) that the replacement joins before the survivor finishes alone.
  json manifest = JobManifest("heal", 2);
  manifest["spec"]["trainer"]["steps"] = 8000;
  manifest["spec"]["trainer"]["model"]["hidden"] = {512, 512};
  manifest["spec"]["elastic"] = {{"minReplicas", 1}, {"maxReplicas", 2}};
  manifest["spec"]["runPolicy"] = {{"restartPolicy", "OnFailure"}, {"backoffLimit", 3}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  bool ok = false;
  json job = h_->WaitForJob(
      ns_, "heal",
      [](const json& j) {
        return j.contains("status") && j["status"].contains("progress") &&
               j["status"]["progress"].value("step", 0) >= 200;
      },
      120000, &ok);
  ASSERT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelet_->Describe();
  ASSERT_TRUE(kubelet_->KillContainer(ns_, "heal-worker-1", SIGKILL).ok());
  job = h_->WaitForJob(
      ns_, "heal", [](const json& j) { return Phase(j) == "Succeeded"; }, 180000, &ok);
  ASSERT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelet_->Describe();
  EXPECT_EQ(job["status"]["progress"]["step"], 8000);
  EXPECT_EQ(job["status"]["restarts"], 1);
  // 1: both; then the survivor alone and the replacement joining (3), or, when the replacement
  // arrives within the last-call window, both at once (2).
  EXPECT_GE(job["status"]["rendezvous"]["generation"].get<int>(), 2);
  EXPECT_EQ(job["status"]["replicas"]["succeeded"], 2);
}

// Hot standby in a cluster: spec.elastic.standby 1 makes a third pod beside the two workers; it
// starts and waits in the rendezvous (status.rendezvous.standby 1). When a training pod is
// killed, the standby takes its place in the generation that re-forms at once, the world stays at
// 2, and the killed pod's replacement waits as the new standby: two generations in all. At the
// end the standby is told the job completed and succeeds with the others.
TEST_F(OperatorEndToEndTest, AStandbyPodTakesAKilledWorkersPlaceAndItsReplacementStandsBy) {
  StartKubelet();
  json manifest = JobManifest("standby", 2);
  manifest["spec"]["trainer"]["steps"] = 8000;
  manifest["spec"]["trainer"]["model"]["hidden"] = {512, 512};
  manifest["spec"]["elastic"] = {{"standby", 1}};
  manifest["spec"]["runPolicy"] = {{"restartPolicy", "OnFailure"}, {"backoffLimit", 3}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  const auto standing_by = [](const json& j) {
    return j.contains("status") && j["status"].contains("rendezvous") &&
           j["status"]["rendezvous"].value("standby", 0) == 1;
  };
  bool ok = false;
  json job = h_->WaitForJob(
      ns_, "standby",
      [&](const json& j) {
        return standing_by(j) && j["status"].contains("progress") &&
               j["status"]["progress"].value("step", 0) >= 200;
      },
      120000, &ok);
  ASSERT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelet_->Describe();
  EXPECT_EQ(job["status"]["rendezvous"]["worldSize"], 2);
  EXPECT_EQ(job["status"]["replicas"]["desired"], 3);
  // The standby is the pod that has not joined the first generation.
  std::vector<std::string> trainers, standbys;
  for (int i = 0; i < 3; ++i) {
    const std::string pod = "standby-worker-" + std::to_string(i);
    (kubelet_->LogOf(ns_, pod).find("joined generation 1 ") != std::string::npos ? trainers
                                                                                  : standbys)
        .push_back(pod);
  }
  ASSERT_EQ(standbys.size(), 1u) << kubelet_->Describe();
  ASSERT_TRUE(kubelet_->KillContainer(ns_, trainers[0], SIGKILL).ok());
  job = h_->WaitForJob(
      ns_, "standby",
      [&](const json& j) {
        return standing_by(j) && j["status"]["rendezvous"].value("generation", 0) >= 2;
      },
      120000, &ok);
  ASSERT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelet_->Describe();
  EXPECT_EQ(job["status"]["rendezvous"]["worldSize"], 2);
  EXPECT_NE(kubelet_->LogOf(ns_, standbys[0]).find("joined generation 2 "), std::string::npos)
      << kubelet_->LogOf(ns_, standbys[0]);
  job = h_->WaitForJob(
      ns_, "standby", [](const json& j) { return Phase(j) == "Succeeded"; }, 180000, &ok);
  ASSERT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelet_->Describe();
  EXPECT_EQ(job["status"]["progress"]["step"], 8000);
  EXPECT_EQ(job["status"]["restarts"], 1);
  EXPECT_EQ(job["status"]["rendezvous"]["generation"], 2) << "the replacement ended nothing";
  // The standby is told the job completed at the moment the others complete, and exits 0: the
  // final status counts it when its exit lands first (3), else the clean-up finds it stopping (2).
  // Seen both ways within milliseconds (2026-12-07).
  EXPECT_GE(job["status"]["replicas"]["succeeded"].get<int>(), 2) << job["status"].dump(2);
  EXPECT_LE(job["status"]["replicas"]["succeeded"].get<int>(), 3) << job["status"].dump(2);
  EXPECT_EQ(Condition(job, "Succeeded").value("message", ""), "2 of 2 workers completed training")
      << job["status"].dump(2);
}

// The straggler tests' job: mostly compute (a 2048-wide layer on 784 Fashion-MNIST inputs), so a
// slowdown shows in the slowed rank's compute time, 4 workers (the detector compares a worker with
// its peers' median), `steps` long. Empty when the data set is not installed.
json StragglerJobManifest(const std::string& name, int64_t steps) {
  const std::string fashion = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(fashion + "/train-images-idx3-ubyte.gz")) return json();
  json manifest = JobManifest(name, 4);
  manifest["spec"]["trainer"]["model"]["hidden"] = {2048};
  manifest["spec"]["trainer"]["data"] = {
      {"format", "idx"},
      {"train",
       {"file://" + fashion + "/train-images-idx3-ubyte.gz",
        "file://" + fashion + "/train-labels-idx1-ubyte.gz"}}};
  manifest["spec"]["trainer"]["batchSize"] = 64;
  manifest["spec"]["trainer"]["steps"] = steps;
  return manifest;
}

// A worker slowed by half (stopped and continued every 30 ms, as a throttled CPU would leave it)
// is named a straggler in the job's status, its Straggler condition and a Warning Event, with its
// pod and node; once it runs at full speed again the condition clears. Detection takes three
// windows of at least 5 s (docs/elastic.md, "Stragglers").
TEST_F(OperatorEndToEndTest, ASlowedWorkerIsNamedAStragglerWithItsPodAndNode) {
  json manifest = StragglerJobManifest("named", 100000000);
  if (manifest.is_null()) GTEST_SKIP() << "Fashion-MNIST is not installed (scripts/setup.sh)";
  StartKubelet();
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  bool ok = false;
  json job = SlowWorkerTwoUntil(
      "named",
      [](const json& j) { return Condition(j, "Straggler").value("status", "") == "True"; }, &ok);
  ASSERT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelet_->Describe();
  const std::string message = Condition(job, "Straggler").value("message", "");
  EXPECT_NE(message.find("pod named-worker-2 on node "), std::string::npos) << message;
  EXPECT_NE(message.find("the median time per step of its peers"), std::string::npos) << message;
  ASSERT_EQ(job["status"]["stragglers"].size(), 1u) << job["status"].dump(2);
  const json& straggler = job["status"]["stragglers"][0];
  EXPECT_EQ(straggler["pod"], "named-worker-2");
  EXPECT_FALSE(straggler.value("node", "").empty()) << straggler.dump();
  EXPECT_GE(straggler["ratio"].get<double>(), 1.5) << straggler.dump();
  EXPECT_TRUE(HasEvent("named", "Straggler"));
  EXPECT_FALSE(job["status"].contains("stragglersReplaced")) << "not asked to replace";

  // At full speed again: one window under the ratio clears the name.
  job = WaitForJob(
      "named",
      [](const json& j) { return Condition(j, "Straggler").value("status", "") == "False"; },
      "cleared its Straggler condition");
  EXPECT_EQ(Condition(job, "Straggler")["reason"], "NoStraggler");
  EXPECT_FALSE(job["status"].contains("stragglers")) << job["status"].dump(2);
}

// A member that stores more than its job allows (here the test, holding the job's token as any
// program in its pods can; the job sets its own limit, spec.rendezvous.store.maxBytes) is refused
// past it with RESOURCE_EXHAUSTED and the reason STORE_LIMIT; the job's StoreLimit condition and a
// Warning Event say so, and its worker trains on.
TEST_F(OperatorEndToEndTest, AMemberPastItsJobsStoreLimitsIsRefusedAndTheJobSaysSo) {
  StartKubelet();
  json manifest = JobManifest("flooded", 1);
  manifest["spec"]["trainer"]["steps"] = 100000000;
  // The job's own limit, in place of the ~16 MiB a one-rank job gets.
  manifest["spec"]["rendezvous"] = {{"store", {{"maxBytes", "6Mi"}}}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  json job = WaitForJob(
      "flooded",
      [](const json& j) {
        return j.contains("status") &&
               j["status"].value("rendezvous", json::object()).value("generation", 0) >= 1 &&
               j["status"].value("progress", json::object()).value("step", 0) > 0;
      },
      "training");
  const int64_t generation = job["status"]["rendezvous"]["generation"];
  KubeTestEnv::Response secret =
      h_->kube().Request("GET", "/api/v1/namespaces/" + ns_ + "/secrets/flooded-rendezvous");
  ASSERT_EQ(secret.status, 200) << secret.raw;
  StatusOr<std::string> token = Base64Decode(secret.body["data"].value("token", ""));
  StatusOr<std::string> ca = Base64Decode(secret.body["data"].value("ca.crt", ""));
  ASSERT_TRUE(token.ok() && ca.ok());
  rendezvous::ClientOptions options;
  options.address = "127.0.0.1:" + std::to_string(op_->rendezvous_port());
  options.job = ns_ + "/flooded";
  options.token = *token;
  options.member_id = "flooder";
  options.tls_ca_pem = *ca;
  auto client = rendezvous::RendezvousClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::unique_ptr<rendezvous::KeyValueStore> store = (*client)->GenerationStore(generation);
  const std::string value(1 << 20, 'x');
  Status refused;
  int stored = 0;
  // Its 6 MiB hold five values of 1 MiB and their keys, not six.
  for (; stored < 256; ++stored) {
    refused = store->Set("flood/" + std::to_string(stored), value, kWaitMs);
    if (!refused.ok()) break;
  }
  ASSERT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(refused.reason(), rendezvous::kReasonStoreLimit) << refused;
  EXPECT_NE(refused.message().find("its limit of 6291456"), std::string::npos) << refused;
  EXPECT_EQ(stored, 5);

  job = WaitForJob(
      "flooded",
      [](const json& j) { return Condition(j, "StoreLimit").value("status", "") == "True"; },
      "its StoreLimit condition");
  const std::string message = Condition(job, "StoreLimit").value("message", "");
  EXPECT_NE(message.find("refused 1 call past its limits"), std::string::npos) << message;
  // The service's words, which the member got too (after its client's context).
  const std::string words = "store set of key flood/" + std::to_string(stored) + ": ";
  EXPECT_NE(message.find(words), std::string::npos) << message;
  EXPECT_NE(refused.message().find(words), std::string::npos) << refused;
  EXPECT_TRUE(HasEvent("flooded", "StoreLimitReached"));
  const int64_t step = job["status"]["progress"]["step"];
  WaitForJob(
      "flooded",
      [step](const json& j) { return j["status"]["progress"].value("step", int64_t{0}) > step; },
      "training on");
  std::cout << "store limit: " << stored << " values of 1 MiB stored before the refusal: "
            << refused.message() << "\n";
}

// With spec.elastic.replaceStragglers the straggler's pod is replaced (not a restart), the
// replacement prefers other nodes, and the job trains to its step count.
TEST_F(OperatorEndToEndTest, AStragglerIsReplacedWhenTheJobAsksAndTheJobFinishes) {
  // About a minute undisturbed on 2 cores: outlasts detection.
  json manifest = StragglerJobManifest("slow", 3000);
  if (manifest.is_null()) GTEST_SKIP() << "Fashion-MNIST is not installed (scripts/setup.sh)";
  StartKubelet();
  manifest["spec"]["elastic"] = {{"replaceStragglers", true}};
  manifest["spec"]["runPolicy"] = {{"restartPolicy", "OnFailure"}, {"backoffLimit", 3}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  const std::vector<json> pods = WaitForPods("slow", 4);
  const auto first_uids = UidsByName(pods);
  ASSERT_FALSE(first_uids.at("slow-worker-2").empty());
  bool ok = false;
  json job = SlowWorkerTwoUntil(
      "slow",
      [](const json& j) {
        return j.contains("status") && j["status"].value("stragglersReplaced", 0) >= 1;
      },
      &ok);
  ASSERT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelet_->Describe();
  ASSERT_EQ(job["status"]["stragglerNodes"].size(), 1u) << job["status"].dump(2);
  const std::string node = job["status"]["stragglerNodes"][0];
  EXPECT_TRUE(HasEvent("slow", "Straggler"));
  EXPECT_TRUE(HasEvent("slow", "ReplacingStraggler"));

  // The replacement is a new pod that prefers other nodes. Usually it is worker 2's, the one
  // slowed; on 2 busy cores another worker may be slower still and be the one named, which is
  // as right: the straggler is whoever computes slowest.
  bool replaced = OperatorHarness::WaitFor(
      [&] {
        for (const json& pod : h_->Pods(ns_, "slow")) {
          const std::string name = pod["metadata"]["name"];
          auto first = first_uids.find(name);
          if (first != first_uids.end() && pod["metadata"]["uid"] != first->second &&
              !pod["metadata"].contains("deletionTimestamp")) {
            EXPECT_EQ(pod["spec"]["affinity"]["nodeAffinity"]
                          ["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]
                          ["matchFields"][0]["values"],
                      json::array({node}))
                << pod["spec"].dump();
            return true;
          }
        }
        return false;
      },
      kWaitMs);
  EXPECT_TRUE(replaced) << kubelet_->Describe();
  job = h_->WaitForJob(
      ns_, "slow", [](const json& j) { return Phase(j) == "Succeeded"; }, 300000, &ok);
  ASSERT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelet_->Describe();
  EXPECT_EQ(job["status"]["progress"]["step"], 3000);
  EXPECT_EQ(job["status"].value("restarts", 0), 0) << "a replaced straggler is not a restart";
  EXPECT_EQ(job["status"]["stragglersReplaced"], 1) << job["status"].dump(2);
  EXPECT_EQ(Condition(job, "Straggler").value("status", ""), "False") << job["status"].dump(2);
}

// --topology-keys with an empty key in its list is refused at start-up, naming the flag (exit 2),
// rather than read as a label no node has.
TEST(OperatorFlagsTest, AnEmptyTopologyKeyIsRefusedNamingTheFlag) {
  for (const std::string list : {"a,,b", "a,", ",a"}) {
    const ProcessResult result =
        RunProcess({LOCKSTEP_OPERATOR_BINARY, "--topology-keys=" + list}, {}, 30000);
    ASSERT_FALSE(result.timed_out) << list;
    EXPECT_EQ(result.exit_code, 2) << list << ": " << result.err;
    EXPECT_NE(result.err.find("--topology-keys: an empty key"), std::string::npos)
        << list << ": " << result.err;
  }
}

// Ranks follow the network: the operator reads each bound pod's node labels (--topology-keys)
// and the rendezvous service numbers pods rack by rack. Two nodes, one per rack; the pods are
// bound one at a time alternating racks, each worker started before the next pod is bound, so
// that in order of arrival the racks interleave (r1 r2 r1 r2). The generation's ranks are
// rack-contiguous all the same, and so are they when a killed worker's replacement joins.
class RackOrderTest : public OperatorEndToEndTest {
 protected:
  static constexpr char kRackLabel[] = "topology.lockstep.io/rack";
  OperatorOptions Options() override {
    OperatorOptions options = OperatorEndToEndTest::Options();
    options.extra_flags.push_back(std::string("--topology-keys=") + kRackLabel);
    return options;
  }
  void TearDown() override {
    for (const std::string& node : nodes_) h_->kube().Request("DELETE", "/api/v1/nodes/" + node);
    for (auto& kubelet : kubelets_) {
      if (HasFailure()) std::cerr << kubelet->Describe() << "\n";
    }
    OperatorEndToEndTest::TearDown();
  }
  // A Node object in `rack` and a simulated kubelet for it that runs the pods bound to it.
  void AddNode(const std::string& rack) {
    const std::string name = ns_ + "-" + rack;
    const json node = {{"apiVersion", "v1"},
                       {"kind", "Node"},
                       {"metadata", {{"name", name}, {"labels", {{kRackLabel, rack}}}}}};
    ASSERT_EQ(h_->kube().Request("POST", "/api/v1/nodes", node).status, 201);
    nodes_.push_back(name);
    KubeletSimulatorOptions options = WorkerKubeletOptions();
    options.node_name = name;
    options.bound_pods_only = true;
    auto kubelet = KubeletSimulator::Start(&h_->kube(), options);
    ASSERT_TRUE(kubelet.ok()) << kubelet.status();
    kubelets_.push_back(std::move(*kubelet));
  }
  // Binds the pod as a scheduler does (the pods/binding subresource).
  void Bind(const std::string& pod, const std::string& node) {
    const json binding = {{"apiVersion", "v1"},
                          {"kind", "Binding"},
                          {"metadata", {{"name", pod}}},
                          {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
    ASSERT_EQ(h_->kube()
                  .Request("POST", "/api/v1/namespaces/" + ns_ + "/pods/" + pod + "/binding",
                           binding)
                  .status,
              201);
  }
  // generation -> the rank `pod`'s worker logged joining it at world size `world`.
  std::map<int, int> RanksAt(const std::string& pod, int world) {
    const std::string log = kubelets_[0]->LogOf(ns_, pod) + kubelets_[1]->LogOf(ns_, pod);
    std::map<int, int> ranks;
    const std::regex joined("joined generation (\\d+) as rank (\\d+) of " +
                            std::to_string(world) + "\\b");
    for (auto it = std::sregex_iterator(log.begin(), log.end(), joined);
         it != std::sregex_iterator(); ++it) {
      ranks[std::stoi((*it)[1])] = std::stoi((*it)[2]);
    }
    return ranks;
  }
  // The newest generation after `after` of world size `world` that every one of `pods` joined,
  // with their ranks in it; {-1, {}} when there is none yet.
  std::pair<int, std::map<std::string, int>> Generation(const std::vector<std::string>& pods,
                                                        int world, int after) {
    std::map<std::string, std::map<int, int>> seen;
    for (const std::string& pod : pods) seen[pod] = RanksAt(pod, world);
    for (auto it = seen[pods[0]].rbegin(); it != seen[pods[0]].rend(); ++it) {
      if (it->first <= after) break;
      std::map<std::string, int> ranks;
      for (const std::string& pod : pods) {
        auto found = seen[pod].find(it->first);
        if (found != seen[pod].end()) ranks[pod] = found->second;
      }
      if (ranks.size() == pods.size()) return {it->first, ranks};
    }
    return {-1, {}};
  }
  std::vector<std::string> nodes_;
  std::vector<std::unique_ptr<KubeletSimulator>> kubelets_;
};

// A standby pod the cluster never schedules (no room for it) does not hold the job's end: the
// two workers train and complete, and the job succeeds with the standby still Pending, which
// Finish then deletes. (This fixture for its Node, a kubelet that runs only pods bound to it, and
// the binding.)
TEST_F(RackOrderTest, AStandbyPodThatIsNeverScheduledDoesNotHoldTheJobsEnd) {
  AddNode("r1");
  json manifest = JobManifest("unplaced", 2);
  manifest["spec"]["trainer"]["steps"] = 300;
  manifest["spec"]["elastic"] = {{"standby", 1}};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  WaitForPods("unplaced", 3);
  Bind("unplaced-worker-0", nodes_[0]);
  Bind("unplaced-worker-1", nodes_[0]);
  bool ok = false;
  json job = h_->WaitForJob(
      ns_, "unplaced", [](const json& j) { return Phase(j) == "Succeeded"; }, 120000, &ok);
  ASSERT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelets_[0]->Describe();
  EXPECT_EQ(job["status"]["progress"]["step"], 300);
  EXPECT_EQ(job["status"]["replicas"]["succeeded"], 2);
}

TEST_F(RackOrderTest, RanksAreRackContiguousWhateverOrderThePodsJoinedIn) {
  AddNode("r1");
  AddNode("r2");
  json manifest = JobManifest("racks", 4);
  manifest["spec"]["elastic"] = {{"minReplicas", 3}, {"maxReplicas", 4}};
  manifest["spec"]["trainer"]["steps"] = 1000000;  // deleted once the ranks are seen
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  WaitForPods("racks", 4);
  const std::vector<std::string> racks = {"r1", "r2", "r1", "r2"};
  for (int i = 0; i < 4; ++i) {
    const std::string pod = "racks-worker-" + std::to_string(i);
    Bind(pod, ns_ + "-" + racks[i]);
    // Its worker has started and loaded its data: it joins next, before the next pod's does.
    ASSERT_TRUE(OperatorHarness::WaitFor(
        [&] { return kubelets_[i % 2]->LogOf(ns_, pod).find(" loaded in ") != std::string::npos; },
        60000))
        << pod << " never started";
  }
  // A first generation may form of three (the fourth started after the last call); the one all
  // four joined is what the ranks are read from.
  const std::vector<std::string> all = {"racks-worker-0", "racks-worker-1", "racks-worker-2",
                                        "racks-worker-3"};
  std::pair<int, std::map<std::string, int>> four;
  ASSERT_TRUE(OperatorHarness::WaitFor(
      [&] { return (four = Generation(all, 4, 0)).first > 0; }, 60000))
      << "no generation of all four formed";
  // Rack r1's pods (workers 0 and 2) are ranks 0 and 1, rack r2's 2 and 3.
  std::map<std::string, int>& ranks = four.second;
  EXPECT_EQ(std::set<int>({ranks["racks-worker-0"], ranks["racks-worker-2"]}),
            std::set<int>({0, 1}));
  EXPECT_EQ(std::set<int>({ranks["racks-worker-1"], ranks["racks-worker-3"]}),
            std::set<int>({2, 3}));

  // Worker 0 killed: its replacement pod is bound to rack r1 again and joins the survivors. In
  // order of arrival it comes last (r1 r2 r2 r1 would be the survivors' order plus it); the
  // generation that takes it in has it next to worker 2 all the same.
  const std::string lost_uid = UidsByName(h_->Pods(ns_, "racks"))["racks-worker-0"];
  ASSERT_TRUE(kubelets_[0]->KillContainer(ns_, "racks-worker-0", SIGKILL).ok());
  ASSERT_TRUE(OperatorHarness::WaitFor(
      [&] {
        const json pod = h_->Pod(ns_, "racks-worker-0");
        return !pod.is_null() && pod["metadata"]["uid"] != lost_uid &&
               !pod["metadata"].contains("deletionTimestamp");
      },
      60000))
      << "worker 0 never replaced";
  Bind("racks-worker-0", ns_ + "-r1");
  std::pair<int, std::map<std::string, int>> again;
  ASSERT_TRUE(OperatorHarness::WaitFor(
      [&] { return (again = Generation(all, 4, four.first)).first > 0; }, 60000))
      << "the replacement never joined";
  std::map<std::string, int>& now = again.second;
  const std::set<int> r1 = {now["racks-worker-0"], now["racks-worker-2"]};
  const std::set<int> r2 = {now["racks-worker-1"], now["racks-worker-3"]};
  EXPECT_TRUE((r1 == std::set<int>{0, 1} && r2 == std::set<int>{2, 3}) ||
              (r1 == std::set<int>{2, 3} && r2 == std::set<int>{0, 1}))
      << "generation " << again.first << ": r1 ranks " << *r1.begin() << "," << *r1.rbegin()
      << "; r2 ranks " << *r2.begin() << "," << *r2.rbegin();
}

// The operator hosting the rendezvous is killed mid-training and a new one starts on the same
// address: the workers never stop. Their heartbeats wait for it, and it takes their generation
// up (docs/operator.md, "The control plane never stops training").
TEST_F(OperatorEndToEndTest, WorkersTrainOnThroughAnOperatorRestartWhichTakesTheirGenerationUp) {
  StartKubelet();
  json manifest = JobManifest("reconnect", 2);
  manifest["spec"]["trainer"]["steps"] = 8000;
  manifest["spec"]["trainer"]["model"]["hidden"] = {512, 512};
  ASSERT_EQ(h_->Apply(ns_, manifest).status, 201);
  bool ok = false;
  json job = h_->WaitForJob(
      ns_, "reconnect",
      [](const json& j) {
        return j.contains("status") && j["status"].contains("progress") &&
               j["status"]["progress"].value("step", 0) >= 200;
      },
      120000, &ok);
  ASSERT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelet_->Describe();
  const int64_t generation_before = job["status"]["rendezvous"].value("generation", int64_t{0});
  ASSERT_GE(generation_before, 1);
  // The operator (and the rendezvous service it hosts) dies; a new one starts on the same
  // address, as a Deployment's replacement behind the Service would.
  const int metrics_port = op_->metrics_port();
  const int rendezvous_port = op_->rendezvous_port();
  op_->Kill(SIGKILL);
  op_->Stop();
  OperatorOptions options = Options();
  options.extra_flags = {};
  std::string error;
  op_ = h_->StartOperatorOnPorts(options, metrics_port, rendezvous_port, &error);
  ASSERT_NE(op_, nullptr) << error;
  job = h_->WaitForJob(
      ns_, "reconnect", [](const json& j) { return Phase(j) == "Succeeded"; }, 180000, &ok);
  ASSERT_TRUE(ok) << job["status"].dump(2) << "\n" << kubelet_->Describe();
  EXPECT_EQ(job["status"]["progress"]["step"], 8000);
  // The new operator took the workers' generation up: they never re-formed.
  EXPECT_EQ(job["status"]["rendezvous"].value("generation", int64_t{0}), generation_before)
      << job["status"].dump(2);
  // No worker pod was replaced: they kept their state through the outage.
  EXPECT_EQ(job["status"].value("restarts", 0), 0);
  EXPECT_EQ(job["status"]["replicas"]["succeeded"], 2);
}

// Leader election and restarts need their own operators.
class OperatorLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_ = OperatorHarness::Get();
    ASSERT_NE(h_, nullptr);
    ns_ = h_->NewNamespace("life");
  }
  // A replica that elects a leader with the others of this test (one Lease) over its namespace.
  OperatorOptions Replica(const std::string& identity) const {
    OperatorOptions options;
    options.identity = identity;
    options.leader_elect = true;
    options.lease_name = "lease-" + ns_;
    options.watch_namespace = ns_;
    return options;
  }
  OperatorHarness* h_ = nullptr;
  std::string ns_;
};

TEST_F(OperatorLifecycleTest, KilledAndRestartedOperatorAdoptsJobsWithoutDuplicatesOrOrphans) {
  OperatorOptions options;
  options.watch_namespace = ns_;
  std::string error;
  auto op = h_->StartOperator(options, &error);
  ASSERT_NE(op, nullptr) << error;
  constexpr int kJobs = 12;
  constexpr int kReplicas = 4;
  for (int i = 0; i < kJobs; ++i) {
    ASSERT_EQ(h_->Apply(ns_, JobManifest("adopt-" + std::to_string(i), kReplicas)).status, 201);
  }
  // Kill it while it is creating pods.
  OperatorHarness::WaitFor(
      [&] {
        auto r = h_->kube().Request("GET", "/api/v1/namespaces/" + ns_ + "/pods");
        return r.status == 200 && r.body["items"].size() >= 8;
      },
      kWaitMs);
  op->Kill(SIGKILL);
  op->Stop();
  auto second = h_->StartOperator(options, &error);
  ASSERT_NE(second, nullptr) << error;
  std::vector<json> pods;
  bool complete = OperatorHarness::WaitFor(
      [&] {
        auto r = h_->kube().Request("GET", "/api/v1/namespaces/" + ns_ + "/pods");
        pods = r.body["items"].get<std::vector<json>>();
        return pods.size() == kJobs * kReplicas;
      },
      60000);
  ASSERT_TRUE(complete) << pods.size() << " pods\n" << second->LogTail();
  // Let the new operator settle, then check nothing extra appeared.
  for (int i = 0; i < kJobs; ++i) {
    bool ok = false;
    h_->WaitForJob(
        ns_, "adopt-" + std::to_string(i), [](const json& j) { return Phase(j) == "Created"; },
        kWaitMs, &ok);
    EXPECT_TRUE(ok);
  }
  auto r = h_->kube().Request("GET", "/api/v1/namespaces/" + ns_ + "/pods");
  EXPECT_EQ(r.body["items"].size(), static_cast<size_t>(kJobs * kReplicas));
  std::set<std::string> names;
  for (const json& pod : r.body["items"]) {
    names.insert(pod["metadata"]["name"].get<std::string>());
    const std::string owner = pod["metadata"]["ownerReferences"][0]["name"];
    EXPECT_FALSE(h_->GetJob(ns_, owner).is_null()) << "orphan " << pod["metadata"]["name"];
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kJobs * kReplicas));
  // The jobs' Secrets were not replaced: the same tokens, which running workers hold.
  auto secrets = h_->kube().Request("GET", "/api/v1/namespaces/" + ns_ + "/secrets");
  int job_secrets = 0;
  for (const json& s : secrets.body["items"]) {
    if (s["metadata"]["name"].get<std::string>().find("-rendezvous") != std::string::npos) {
      ++job_secrets;
    }
  }
  EXPECT_EQ(job_secrets, kJobs);
}

TEST_F(OperatorLifecycleTest, TwoOperatorsElectOneLeaderAndTheOtherTakesOver) {
  const OperatorOptions a = Replica("op-a"), b = Replica("op-b");
  std::string error;
  auto first = h_->StartOperator(a, &error);
  ASSERT_NE(first, nullptr) << error;
  auto second = h_->StartOperator(b, &error);
  ASSERT_NE(second, nullptr) << error;
  double leaders = 0;
  bool one = OperatorHarness::WaitFor(
      [&] {
        double la = first->Metric("lockstep_operator_is_leader");
        double lb = second->Metric("lockstep_operator_is_leader");
        leaders = (la == 1) + (lb == 1);
        return leaders == 1;
      },
      kWaitMs);
  ASSERT_TRUE(one) << leaders << " leaders";
  OperatorProcess* leader =
      first->Metric("lockstep_operator_is_leader") == 1 ? first.get() : second.get();
  OperatorProcess* standby = leader == first.get() ? second.get() : first.get();
  ASSERT_EQ(h_->Apply(ns_, JobManifest("led", 2)).status, 201);
  bool created =
      OperatorHarness::WaitFor([&] { return h_->Pods(ns_, "led").size() == 2; }, kWaitMs);
  EXPECT_TRUE(created);
  // The standby reconciles nothing.
  EXPECT_EQ(standby->Metric("lockstep_operator_jobs_created_total"), 0);

  leader->Stop();  // SIGTERM: releases the lease
  bool took_over = OperatorHarness::WaitFor(
      [&] { return standby->Metric("lockstep_operator_is_leader") == 1; }, kWaitMs);
  ASSERT_TRUE(took_over) << standby->LogTail();
  ASSERT_EQ(h_->Apply(ns_, JobManifest("after", 1)).status, 201);
  bool reconciled =
      OperatorHarness::WaitFor([&] { return h_->Pods(ns_, "after").size() == 1; }, kWaitMs);
  EXPECT_TRUE(reconciled) << standby->LogTail();
}

TEST_F(OperatorLifecycleTest, AReplicaRestartedInTheOldLeadersPodTakesItsLeaderLabelOff) {
  // The rendezvous Service selects the leader label: a replica that restarts in the pod of a
  // leader that crashed must not keep drawing workers to itself while another leads.
  const std::string pod = "operator-" + ns_;
  const std::string path = "/api/v1/namespaces/default/pods/" + pod;
  ASSERT_EQ(h_->kube()
                .Request("POST", "/api/v1/namespaces/default/pods",
                         json{{"apiVersion", "v1"},
                              {"kind", "Pod"},
                              {"metadata",
                               {{"name", pod},
                                {"labels", {{"lockstep.io/rendezvous-leader", "true"}}}}},
                              {"spec",
                               {{"containers", json::array({{{"name", "operator"},
                                                             {"image", "lockstep-operator"}}})}}}})
                .status,
            201);
  const OperatorOptions leading = Replica("op-leading");
  OperatorOptions restarted = Replica("op-restarted");
  restarted.env = {{"POD_NAME", pod}};
  std::string error;
  auto leader = h_->StartOperator(leading, &error);
  ASSERT_NE(leader, nullptr) << error;
  ASSERT_TRUE(OperatorHarness::WaitFor(
      [&] { return leader->Metric("lockstep_operator_is_leader") == 1; }, kWaitMs));
  auto standby = h_->StartOperator(restarted, &error);
  ASSERT_NE(standby, nullptr) << error;
  std::string labels;
  const bool taken_off = OperatorHarness::WaitFor(
      [&] {
        json metadata = h_->kube().Request("GET", path).body["metadata"];
        labels = metadata.value("labels", json::object()).dump();
        return !metadata.is_null() && !labels.empty() &&
               metadata.value("labels", json::object()).count("lockstep.io/rendezvous-leader") ==
                   0;
      },
      kWaitMs);
  EXPECT_TRUE(taken_off) << "labels " << labels << "\n" << standby->LogTail();
  EXPECT_EQ(standby->Metric("lockstep_operator_is_leader"), 0);

  // Once it leads, it wears the label again.
  leader->Stop();
  const bool worn = OperatorHarness::WaitFor(
      [&] {
        json metadata = h_->kube().Request("GET", path).body["metadata"];
        labels = metadata.value("labels", json::object()).dump();
        return metadata.value("labels", json::object()).value("lockstep.io/rendezvous-leader",
                                                              "") == "true";
      },
      kWaitMs);
  EXPECT_TRUE(worn) << "labels " << labels << "\n" << standby->LogTail();
  h_->kube().Request("DELETE", path);
}

}  // namespace
}  // namespace lockstep::testing
