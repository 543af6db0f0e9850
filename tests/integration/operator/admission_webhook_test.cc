// The operator's validating admission webhook on a real kube-apiserver 1.20.2: the API server
// calls lockstep-operator over TLS (the operator's own CA, which the operator writes into the
// ValidatingWebhookConfiguration's caBundle itself), and what a user sees at create, update and
// `kubectl scale` is the refusal `lockstep validate` gives, naming the same fields. Status writes
// never go through it; with failurePolicy Ignore an unreachable webhook costs no job (the
// operator still fails an invalid one); an operator restart loses nothing.
//
// Each test has its own namespace and webhook configuration, scoped to that namespace by a
// label, so configurations of different failure policies never meet.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/base64.h"
#include "common/spec/training_job.h"
#include "tests/integration/operator/operator_harness.h"
#include "tests/support/kube/training_job_webhook.h"
#include "tests/support/process/process.h"

namespace lockstep::testing {
namespace {

constexpr int64_t kWaitMs = 30000;
constexpr char kScopeLabel[] = "lockstep.io/webhook-test";
const std::string kConfigurations = kValidatingWebhookConfigurations;

std::string JobsPath(const std::string& ns) {
  return "/apis/lockstep.io/v1alpha1/namespaces/" + ns + "/trainingjobs";
}

// A job with an elastic range 2..8 whose validity turns on the cross-field rules only.
json ElasticJob(const std::string& name) {
  json job = JobManifest(name, 4);
  job["spec"]["elastic"] = {{"minReplicas", 2}, {"maxReplicas", 8}};
  return job;
}

// What `lockstep validate` says of the manifest, without its file name: the spec model's lines.
std::string ValidateMessage(const json& manifest) {
  StatusOr<spec::TrainingJob> parsed = spec::ParseTrainingJobJson(manifest, "");
  return parsed.ok() ? "" : parsed.status().message();
}

std::string Message(const KubeTestEnv::Response& response) {
  return response.body.is_object() ? response.body.value("message", "") : response.raw;
}

class AdmissionWebhookTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_ = OperatorHarness::Get();
    ASSERT_NE(h_, nullptr);
    ns_ = "admit-" + std::to_string(++count_);
    configuration_ = "lockstep-webhook-" + ns_;
    ASSERT_EQ(Kube()
                  .Request("POST", "/api/v1/namespaces",
                           json{{"apiVersion", "v1"},
                                {"kind", "Namespace"},
                                {"metadata", {{"name", ns_}, {"labels", {{kScopeLabel, ns_}}}}}})
                  .status,
              201);
    std::vector<int> ports = FreePorts(1);
    ASSERT_EQ(ports.size(), 1u);
    webhook_port_ = ports[0];
  }
  void TearDown() override {
    if (HasFailure() && op_) std::cerr << "operator log:\n" << op_->LogTail() << "\n";
    op_.reset();
    Kube().Request("DELETE", kConfigurations + "/" + configuration_);
  }

  KubeTestEnv& Kube() { return h_->kube(); }

  // lockstep-operator serving the webhook on webhook_port_ and keeping configuration_'s
  // caBundle; watching only this test's namespace.
  void StartOperator() {
    OperatorOptions options;
    options.watch_namespace = ns_;
    options.identity = "webhook-" + ns_;
    options.extra_flags = {
        "--webhook-host=127.0.0.1", "--webhook-port=" + std::to_string(webhook_port_),
        "--webhook-configuration=" + configuration_, "--webhook-ca-check-ms=200"};
    std::string error;
    op_ = h_->StartOperator(options, &error);
    ASSERT_NE(op_, nullptr) << error;
  }

  void RegisterWebhook(const std::string& failure_policy, int port) {
    KubeTestEnv::Response created =
        Kube().Request("POST", kValidatingWebhookConfigurations,
                       TrainingJobWebhookConfiguration(configuration_, port, failure_policy,
                                                       {{"matchLabels", {{kScopeLabel, ns_}}}}));
    ASSERT_EQ(created.status, 201) << created.raw;
  }

  // Bounded wait until the API server calls the webhook for this namespace.
  bool WaitUntilWebhookAnswers() {
    json invalid = ElasticJob("probe");
    invalid["spec"]["replicas"] = 9;
    std::string last;
    const bool ok = WaitUntilWebhookRefuses(Kube(), ns_, invalid, kWaitMs, &last);
    EXPECT_TRUE(ok) << "the webhook never answered; last: " << last;
    return ok;
  }

  // As the chart installs it: the configuration (without a caBundle) and the operator.
  void StartLiveWebhook() {
    RegisterWebhook("Fail", webhook_port_);
    if (HasFatalFailure()) return;
    StartOperator();
    if (HasFatalFailure()) return;
    WaitUntilWebhookAnswers();
  }

  static int count_;
  OperatorHarness* h_ = nullptr;
  std::string ns_, configuration_;
  int webhook_port_ = 0;
  std::unique_ptr<OperatorProcess> op_;
};

int AdmissionWebhookTest::count_ = 0;

TEST_F(AdmissionWebhookTest, CrossFieldRulesAreRefusedAtCreateWithTheValidateMessages) {
  ASSERT_NO_FATAL_FAILURE(StartLiveWebhook());
  struct Case {
    std::string name;
    std::function<void(json&)> breaks;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"min-above-max",
       [](json& s) {
         s["elastic"] = {{"minReplicas", 5}, {"maxReplicas", 4}};
       },
       "spec.elastic.minReplicas"},
      {"replicas-above-max", [](json& s) { s["replicas"] = 9; }, "spec.replicas"},
      {"replicas-below-min", [](json& s) { s["replicas"] = 1; }, "spec.replicas"},
      {"ranks-above-gpus",
       [](json& s) {
         s["ranksPerWorker"] = 4;
         s["resources"] = {{"gpus", 2}};
         s["trainer"]["device"] = "cuda";
       },
       "spec.ranksPerWorker"},
      {"empty-program",
       [](json& s) {
         s.erase("trainer");
         s["command"] = {"", "train.py"};
       },
       "spec.command[0]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    json manifest = ElasticJob(c.name);
    c.breaks(manifest["spec"]);
    const std::string expected = ValidateMessage(manifest);
    ASSERT_FALSE(expected.empty()) << "the model accepts case " << c.name;
    KubeTestEnv::Response r = Kube().Request("POST", JobsPath(ns_), manifest);
    EXPECT_EQ(r.status, 422) << r.raw;
    EXPECT_EQ(r.body.value("reason", ""), "Invalid");
    EXPECT_EQ(Message(r), std::string("admission webhook \"") + kTrainingJobWebhookName +
                              "\" denied the request: " + expected);
    EXPECT_NE(expected.find(c.field), std::string::npos) << expected;
    EXPECT_EQ(Kube().Request("GET", JobsPath(ns_) + "/" + c.name).status, 404);
  }
  EXPECT_GE(op_->Metric("lockstep_operator_admission_reviews_total{result=\"denied\"}"),
            static_cast<double>(cases.size()));
}

TEST_F(AdmissionWebhookTest, ValidJobIsCreatedAndTheOperatorMakesItsPods) {
  ASSERT_NO_FATAL_FAILURE(StartLiveWebhook());
  ASSERT_EQ(h_->Apply(ns_, ElasticJob("fine")).status, 201);
  EXPECT_TRUE(OperatorHarness::WaitFor([&] { return h_->Pods(ns_, "fine").size() == 4; }, kWaitMs));
}

TEST_F(AdmissionWebhookTest, UpdateThatBreaksARuleIsRefusedAndTheJobKeepsItsSpec) {
  ASSERT_NO_FATAL_FAILURE(StartLiveWebhook());
  ASSERT_EQ(h_->Apply(ns_, ElasticJob("steady")).status, 201);
  KubeTestEnv::Response r = h_->PatchJobSpec(ns_, "steady", {{"elastic", {{"maxReplicas", 3}}}});
  EXPECT_EQ(r.status, 422) << r.raw;
  EXPECT_NE(Message(r).find("spec.replicas: must be <= spec.elastic.maxReplicas"),
            std::string::npos)
      << r.raw;
  EXPECT_EQ(h_->GetJob(ns_, "steady")["spec"]["elastic"]["maxReplicas"], 8);
  // What leaves the spec alone is never refused: labels, annotations.
  KubeTestEnv::Response labelled = Kube().Request(
      "PATCH", JobsPath(ns_) + "/steady", json{{"metadata", {{"labels", {{"team", "vision"}}}}}},
      "application/merge-patch+json");
  EXPECT_EQ(labelled.status, 200) << labelled.raw;
}

TEST_F(AdmissionWebhookTest, ScaleIsCheckedAgainstTheElasticRange) {
  ASSERT_NO_FATAL_FAILURE(StartLiveWebhook());
  ASSERT_EQ(h_->Apply(ns_, ElasticJob("scaled")).status, 201);
  KubeTestEnv::Response refused = h_->Scale(ns_, "scaled", 9);
  EXPECT_EQ(refused.status, 422) << refused.raw;
  EXPECT_NE(Message(refused).find("spec.replicas: must be <= spec.elastic.maxReplicas"),
            std::string::npos)
      << refused.raw;
  EXPECT_EQ(h_->GetJob(ns_, "scaled")["spec"]["replicas"], 4);
  KubeTestEnv::Response allowed = h_->Scale(ns_, "scaled", 6);
  EXPECT_EQ(allowed.status, 200) << allowed.raw;
  EXPECT_EQ(h_->GetJob(ns_, "scaled")["spec"]["replicas"], 6);
}

TEST_F(AdmissionWebhookTest, KubectlApplyPrintsTheValidateMessages) {
  if (!std::filesystem::exists("/usr/bin/kubectl")) {
    GTEST_SKIP() << "no /usr/bin/kubectl (scripts/setup.sh installs Debian's kubernetes-client)";
  }
  ASSERT_NO_FATAL_FAILURE(StartLiveWebhook());
  json manifest = ElasticJob("applied");
  manifest["spec"]["elastic"] = {{"minReplicas", 5}, {"maxReplicas", 4}};
  ScratchDir dir("webhook-kubectl");
  WriteFile(dir / "job.json", manifest.dump(2));
  ProcessResult applied = RunProcess({"/usr/bin/kubectl", "--kubeconfig=" + Kube().kubeconfig(),
                                      "apply", "-n", ns_, "-f", (dir / "job.json").string()},
                                     {}, kWaitMs);
  const std::string said = applied.out + applied.err;
  EXPECT_NE(applied.code(), 0) << said;
  EXPECT_NE(said.find(std::string("admission webhook \"") + kTrainingJobWebhookName +
                      "\" denied the request: " + ValidateMessage(manifest)),
            std::string::npos)
      << said;
}

TEST_F(AdmissionWebhookTest, TheOperatorKeepsItsCaInTheConfiguration) {
  ASSERT_NO_FATAL_FAILURE(StartLiveWebhook());
  KubeTestEnv::Response secret =
      Kube().Request("GET", "/api/v1/namespaces/default/secrets/lockstep-operator");
  ASSERT_EQ(secret.status, 200) << secret.raw;
  const std::string ca_bundle = secret.body["data"]["ca.crt"];
  auto bundle = [&] {
    KubeTestEnv::Response r = Kube().Request("GET", kConfigurations + "/" + configuration_);
    return r.body["webhooks"][0]["clientConfig"].value("caBundle", "");
  };
  EXPECT_EQ(bundle(), ca_bundle);
  // A reinstall of the chart writes the configuration without it: mended within a period.
  KubeTestEnv::Response reset = Kube().Request(
      "PATCH", kConfigurations + "/" + configuration_,
      json::array({{{"op", "remove"}, {"path", "/webhooks/0/clientConfig/caBundle"}}}),
      "application/json-patch+json");
  ASSERT_EQ(reset.status, 200) << reset.raw;
  EXPECT_TRUE(OperatorHarness::WaitFor([&] { return bundle() == ca_bundle; }, kWaitMs));
  EXPECT_TRUE(WaitUntilWebhookAnswers());
}

TEST_F(AdmissionWebhookTest, StatusWritesNeverGoThroughTheWebhook) {
  // The job exists before a webhook that can never answer is registered with failurePolicy
  // Fail: its spec can no longer change, but its status (what the operator writes) can.
  ASSERT_EQ(h_->Apply(ns_, ElasticJob("written")).status, 201);
  std::vector<int> dead = FreePorts(1);
  ASSERT_NO_FATAL_FAILURE(RegisterWebhook("Fail", dead.at(0)));
  bool refused = OperatorHarness::WaitFor(
      [&] {
        return h_->PatchJobSpec(ns_, "written", {{"replicas", 5}}).status >= 500;
      },
      kWaitMs);
  EXPECT_TRUE(refused) << "a spec write was not refused by the unreachable webhook";
  KubeTestEnv::Response status =
      Kube().Request("PATCH", JobsPath(ns_) + "/written/status",
                     json{{"status", {{"phase", "Pending"}}}}, "application/merge-patch+json");
  EXPECT_EQ(status.status, 200) << status.raw;
}

TEST_F(AdmissionWebhookTest, WithFailurePolicyIgnoreAnUnreachableWebhookCostsNoJob) {
  // The operator runs without its webhook; the configuration points where nothing listens.
  OperatorOptions options;
  options.watch_namespace = ns_;
  std::string error;
  op_ = h_->StartOperator(options, &error);
  ASSERT_NE(op_, nullptr) << error;
  std::vector<int> dead = FreePorts(1);
  ASSERT_NO_FATAL_FAILURE(RegisterWebhook("Ignore", dead.at(0)));
  json invalid = ElasticJob("late-check");
  invalid["spec"]["replicas"] = 9;
  ASSERT_EQ(h_->Apply(ns_, invalid).status, 201);
  ASSERT_EQ(h_->Apply(ns_, ElasticJob("kept")).status, 201);
  // The invalid one is failed by the operator, naming the field, as before the webhook existed.
  bool ok = false;
  json job = h_->WaitForJob(
      ns_, "late-check", [](const json& j) { return Phase(j) == "Failed"; }, kWaitMs, &ok);
  ASSERT_TRUE(ok) << job.dump();
  EXPECT_EQ(Condition(job, "Failed")["reason"], "InvalidSpec");
  EXPECT_NE(Condition(job, "Failed")["message"].get<std::string>().find("spec.replicas"),
            std::string::npos);
  EXPECT_TRUE(OperatorHarness::WaitFor([&] { return h_->Pods(ns_, "kept").size() == 4; }, kWaitMs));
}

TEST_F(AdmissionWebhookTest, ARestartedOperatorLosesNoJobAndAdmitsAgain) {
  ASSERT_NO_FATAL_FAILURE(StartLiveWebhook());
  ASSERT_EQ(h_->Apply(ns_, ElasticJob("before")).status, 201);
  ASSERT_TRUE(
      OperatorHarness::WaitFor([&] { return h_->Pods(ns_, "before").size() == 4; }, kWaitMs));
  op_->Kill(SIGKILL);
  op_.reset();
  // failurePolicy Fail: while no operator answers, a create is refused, and says why; nothing
  // is stored half-checked.
  KubeTestEnv::Response down = h_->Apply(ns_, ElasticJob("during"));
  EXPECT_GE(down.status, 500) << down.raw;
  EXPECT_NE(Message(down).find("failed calling webhook"), std::string::npos) << down.raw;
  EXPECT_EQ(Kube().Request("GET", JobsPath(ns_) + "/during").status, 404);

  ASSERT_NO_FATAL_FAILURE(StartOperator());
  ASSERT_TRUE(WaitUntilWebhookAnswers());
  ASSERT_EQ(h_->Apply(ns_, ElasticJob("during")).status, 201);
  EXPECT_EQ(h_->GetJob(ns_, "before")["spec"]["replicas"], 4);
  EXPECT_TRUE(
      OperatorHarness::WaitFor([&] { return h_->Pods(ns_, "during").size() == 4; }, kWaitMs));
  EXPECT_EQ(h_->Pods(ns_, "before").size(), 4u);
}

// `lockstep-operator check`, what the chart's `helm test` pod runs, against a running operator:
// every check passes, and a part that does not answer is named while the others still pass. Here
// by loopback address (the certificates name 127.0.0.1 too); on the cluster by Service name.
TEST_F(AdmissionWebhookTest, TheInstallationCheckPassesAndNamesThePartThatDoesNotAnswer) {
  ASSERT_NO_FATAL_FAILURE(StartLiveWebhook());
  KubeTestEnv::Response secret =
      Kube().Request("GET", "/api/v1/namespaces/default/secrets/lockstep-operator");
  ASSERT_EQ(secret.status, 200) << secret.raw;
  StatusOr<std::string> ca = Base64Decode(secret.body["data"].value("ca.crt", ""));
  ASSERT_TRUE(ca.ok()) << ca.status();
  ScratchDir dir("installation-check");
  const std::string ca_file = dir / "ca.crt";
  WriteFile(ca_file, *ca);
  // By address, with the certificate checked for the name the API server uses, as in the chart.
  auto check = [&](const std::string& metrics_url, const std::string& webhook_name,
                   const std::string& timeout_ms = "10000") {
    return RunProcess(
        {LOCKSTEP_OPERATOR_BINARY, "check",
         "--webhook-url=https://127.0.0.1:" + std::to_string(webhook_port_) +
             kTrainingJobWebhookPath,
         "--webhook-server-name=" + webhook_name,
         "--rendezvous-address=127.0.0.1:" + std::to_string(op_->rendezvous_port()),
         "--metrics-url=" + metrics_url, "--ca-file=" + ca_file, "--namespace=" + ns_,
         "--timeout-ms=" + timeout_ms},
        {}, 60000);
  };
  const std::string metrics = "http://127.0.0.1:" + std::to_string(op_->metrics_port()) + "/metrics";
  ProcessResult passed = check(metrics, "lockstep-webhook.default.svc");
  std::cout << passed.out;
  EXPECT_EQ(passed.exit_code, 0) << passed.out << passed.err;
  EXPECT_NE(passed.out.find("refused a TrainingJob with spec.replicas -1"), std::string::npos);
  EXPECT_NE(passed.out.find("answered a member of no job with NOT_FOUND, over TLS"),
            std::string::npos);
  EXPECT_NE(passed.out.find("all 3 checks passed"), std::string::npos);

  std::vector<int> closed = FreePorts(1);  // nothing listens there
  ASSERT_EQ(closed.size(), 1u);
  ProcessResult failed =
      check("http://127.0.0.1:" + std::to_string(closed[0]) + "/metrics", "lockstep-webhook.default.svc");
  std::cout << failed.out;
  EXPECT_EQ(failed.exit_code, 1) << failed.out << failed.err;
  EXPECT_NE(failed.out.find("FAILED metrics"), std::string::npos) << failed.out;
  EXPECT_NE(failed.out.find("ok     webhook"), std::string::npos) << failed.out;
  EXPECT_NE(failed.out.find("1 of 3 checks failed"), std::string::npos) << failed.out;

  // A certificate that does not carry the name asked for is refused, as the API server would.
  ProcessResult misnamed = check(metrics, "elsewhere.example");
  std::cout << misnamed.out;
  EXPECT_EQ(misnamed.exit_code, 1) << misnamed.out << misnamed.err;
  EXPECT_NE(misnamed.out.find("FAILED webhook"), std::string::npos) << misnamed.out;
  EXPECT_NE(misnamed.out.find("1 of 3 checks failed"), std::string::npos) << misnamed.out;

  // A port that takes the connection and never answers: the check ends at its deadline.
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(silent, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(listen(silent, 4), 0);
  ASSERT_EQ(getsockname(silent, reinterpret_cast<sockaddr*>(&address), &length), 0);
  ProcessResult unanswered = check(
      "http://127.0.0.1:" + std::to_string(ntohs(address.sin_port)) + "/metrics",
      "lockstep-webhook.default.svc", "1000");
  close(silent);
  std::cout << unanswered.out;
  EXPECT_EQ(unanswered.exit_code, 1) << unanswered.out << unanswered.err;
  EXPECT_NE(unanswered.out.find("no answer within 1000 ms"), std::string::npos) << unanswered.out;
}

}  // namespace
}  // namespace lockstep::testing
