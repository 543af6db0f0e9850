// KubeletSimulator (kubelet_simulator.h) against a real kube-apiserver 1.20.2 (KubeTestEnv): a
// pod made by hand runs as a local process with its env and secret volume resolved as a kubelet
// resolves them, its status goes Pending -> Running -> Failed/Succeeded as a kubelet writes it,
// deletion stops the process (gracefully, then by force), a crash reads as exit code 137, and a
// test can drive the phases itself.
#include "tests/support/kube/kubelet_simulator.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <set>

#include "tests/support/process/process.h"
#include "tests/support/kube/kube_test_environment.h"
#include "tests/support/kube/kube_testenv.h"

namespace lockstep::testing {
namespace {

using json = nlohmann::json;
constexpr char kNamespace[] = "default";
constexpr char kJobLabel[] = "lockstep.io/job-name";
constexpr int64_t kTimeoutMs = 30000;

using KubeEnvironment = ::lockstep::testing::KubeTestEnvironment;

bool Alive(pid_t pid) { return pid > 0 && kill(pid, 0) == 0; }

class KubeletSimulatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(KubeEnvironment::kube) << KubeEnvironment::error;
    kube_ = KubeEnvironment::kube.get();
    out_ = MakeTempDir("kubelet-sim-test");
  }
  void TearDown() override {
    simulator_.reset();
    for (const std::string& name : secrets_) DeleteSecret(name);
    std::error_code ignored;
    std::filesystem::remove_all(out_, ignored);
  }

  // A simulator for the pods of `job`.
  void StartSimulator(const std::string& job, KubeletSimulatorOptions options = {}) {
    options.namespace_ = kNamespace;
    options.label_selector = std::string(kJobLabel) + "=" + job;
    StatusOr<std::unique_ptr<KubeletSimulator>> started =
        KubeletSimulator::Start(kube_, std::move(options));
    ASSERT_TRUE(started.ok()) << started.status();
    simulator_ = std::move(*started);
  }

  // A pod of `job` as the operator shapes one: container "worker", the job label.
  static json WorkerPod(const std::string& job, const std::string& name, json command,
                        json env = json::array()) {
    return {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata", {{"name", name}, {"labels", {{kJobLabel, job}}}}},
            {"spec",
             {{"restartPolicy", "Never"},
              {"containers", json::array({{{"name", "worker"},
                                           {"image", "registry.example/lockstep-worker:0.1"},
                                           {"command", std::move(command)},
                                           {"env", std::move(env)}}})}}}};
  }

  void Create(const std::string& kind, const json& object) {
    KubeTestEnv::Response r = kube_->Request(
        "POST", std::string("/api/v1/namespaces/") + kNamespace + "/" + kind, object);
    ASSERT_EQ(r.status, 201) << r.raw;
  }

  // A Secret of this test's own: one left by an earlier run (--gtest_repeat) is replaced, and
  // TearDown deletes it.
  void CreateSecret(const std::string& name, const json& data) {
    DeleteSecret(name);
    secrets_.push_back(name);
    Create("secrets", {{"apiVersion", "v1"},
                       {"kind", "Secret"},
                       {"metadata", {{"name", name}}},
                       {"stringData", data}});
  }
  void DeleteSecret(const std::string& name) {
    kube_->Request("DELETE", std::string("/api/v1/namespaces/") + kNamespace + "/secrets/" + name);
  }

  KubeTestEnv::Response GetPod(const std::string& name) {
    return kube_->Request("GET", std::string("/api/v1/namespaces/") + kNamespace + "/pods/" + name);
  }

  // The pod once `condition` holds for it; null (and a test failure) past the timeout.
  json WaitForPod(const std::string& name, const std::function<bool(const json&)>& condition,
                  const std::string& what) {
    json last;
    bool ok = KubeTestEnv::WaitFor(
        [&] {
          KubeTestEnv::Response r = GetPod(name);
          if (r.status != 200) return false;
          last = r.body;
          return condition(last);
        },
        kTimeoutMs);
    if (!ok) {
      ADD_FAILURE() << name << ": " << what << " did not happen; last pod: " << last.dump(2) << "\n"
                    << simulator_->Describe();
      return nullptr;
    }
    return last;
  }
  json WaitForPhase(const std::string& name, const std::string& phase) {
    return WaitForPod(
        name, [&](const json& pod) { return pod["status"].value("phase", "") == phase; },
        "phase " + phase);
  }
  bool WaitForPodGone(const std::string& name) {
    bool gone = KubeTestEnv::WaitFor([&] { return GetPod(name).status == 404; }, kTimeoutMs);
    EXPECT_TRUE(gone) << name << " still exists: " << GetPod(name).raw << "\n"
                      << simulator_->Describe();
    return gone;
  }
  void Delete(const std::string& name) {
    KubeTestEnv::Response r =
        kube_->Request("DELETE", std::string("/api/v1/namespaces/") + kNamespace + "/pods/" + name);
    EXPECT_EQ(r.status, 200) << r.raw;
  }

  static json Condition(const json& pod, const std::string& type) {
    for (const json& c : pod["status"].value("conditions", json::array())) {
      if (c.value("type", "") == type) return c;
    }
    return nullptr;
  }

  KubeTestEnv* kube_ = nullptr;
  std::string out_;
  std::unique_ptr<KubeletSimulator> simulator_;
  std::vector<std::string> secrets_;
};

TEST_F(KubeletSimulatorTest, RunsTheWorkerWithItsEnvAndSecretVolumeAndReportsItsExit) {
  const std::string job = "sim-env";
  const std::string ca = "-----BEGIN CERTIFICATE-----\nnot really a certificate\n";
  // Sent as stringData: the API server stores it base64-encoded under data, which the
  // simulator decodes as a kubelet does.
  CreateSecret(job + "-rendezvous",
               {{"token", "s3cret-token"}, {"ca.crt", ca}, {"unmounted", "x"}});
  // Writes what it was given, then waits (bounded) for the test's go-ahead and exits 3.
  const std::string script =
      "{ echo \"token=$LOCKSTEP_JOB_TOKEN\"; echo \"pod=$LOCKSTEP_POD\";"
      "  echo \"namespace=$LOCKSTEP_NAMESPACE\"; echo \"host=$LOCKSTEP_HOST\";"
      "  echo \"metrics=$LOCKSTEP_METRICS_PORT\"; echo \"ca_file=$LOCKSTEP_RENDEZVOUS_CA_FILE\";"
      "} > \"$OUT/env.tmp\" && mv \"$OUT/env.tmp\" \"$OUT/env\"\n"
      "echo started\n"
      "i=0; while [ ! -e \"$OUT/go\" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done\n"
      "echo exiting; exit 3\n";
  json pod = WorkerPod(
      job, job + "-worker-0", {"lockstep-shell", "-c", script},
      {{{"name", "LOCKSTEP_JOB_TOKEN"},
        {"valueFrom", {{"secretKeyRef", {{"name", job + "-rendezvous"}, {"key", "token"}}}}}},
       {{"name", "LOCKSTEP_POD"},
        {"valueFrom", {{"fieldRef", {{"apiVersion", "v1"}, {"fieldPath", "metadata.name"}}}}}},
       {{"name", "LOCKSTEP_NAMESPACE"},
        {"valueFrom", {{"fieldRef", {{"apiVersion", "v1"}, {"fieldPath", "metadata.namespace"}}}}}},
       {{"name", "LOCKSTEP_HOST"},
        {"valueFrom", {{"fieldRef", {{"apiVersion", "v1"}, {"fieldPath", "status.podIP"}}}}}},
       {{"name", "LOCKSTEP_RENDEZVOUS_CA_FILE"}, {"value", "/var/run/lockstep/ca.crt"}},
       {{"name", "LOCKSTEP_METRICS_PORT"}, {"value", "9400"}},
       {{"name", "OUT"}, {"value", out_}}});
  pod["spec"]["volumes"] = {{{"name", "lockstep-rendezvous"},
                             {"secret",
                              {{"secretName", job + "-rendezvous"},
                               {"items", {{{"key", "ca.crt"}, {"path", "ca.crt"}}}}}}}};
  pod["spec"]["containers"][0]["volumeMounts"] = {
      {{"name", "lockstep-rendezvous"}, {"mountPath", "/var/run/lockstep"}, {"readOnly", true}}};

  KubeletSimulatorOptions options;
  options.executables = {{"lockstep-shell", "/bin/sh"}};
  options.extra_env = {{"LOCKSTEP_METRICS_PORT", "0"}};
  StartSimulator(job, options);
  Create("pods", pod);
  const std::string name = job + "-worker-0";

  json running = WaitForPhase(name, "Running");
  ASSERT_FALSE(running.is_null());
  EXPECT_EQ(running["spec"].value("nodeName", ""), simulator_->node_name());
  const json& status = running["status"];
  EXPECT_EQ(status.value("podIP", ""), "127.0.0.1");
  EXPECT_EQ(status.value("hostIP", ""), "127.0.0.1");
  EXPECT_FALSE(status.value("startTime", "").empty());
  for (const char* type : {"Initialized", "Ready", "ContainersReady", "PodScheduled"}) {
    EXPECT_EQ(Condition(running, type).value("status", ""), "True") << type << status.dump(2);
  }
  ASSERT_EQ(status["containerStatuses"].size(), 1u) << status.dump(2);
  const json& container = status["containerStatuses"][0];
  EXPECT_EQ(container.value("name", ""), "worker");
  EXPECT_TRUE(container.value("ready", false));
  EXPECT_EQ(container.value("restartCount", -1), 0);
  EXPECT_EQ(container.value("image", ""), "registry.example/lockstep-worker:0.1");
  EXPECT_FALSE(container.value("imageID", "").empty());
  EXPECT_FALSE(container["state"]["running"].value("startedAt", "").empty()) << container.dump(2);
  EXPECT_EQ(simulator_->RunningCount(), 1);
  const pid_t pid = simulator_->PidOf(kNamespace, name);
  EXPECT_TRUE(Alive(pid));
  EXPECT_EQ(simulator_->Pids(), std::vector<pid_t>{pid});

  ASSERT_TRUE(
      KubeTestEnv::WaitFor([&] { return std::filesystem::exists(out_ + "/env"); }, kTimeoutMs))
      << simulator_->Describe();
  const std::string env = ReadFile(out_ + "/env");
  EXPECT_NE(env.find("token=s3cret-token\n"), std::string::npos) << env;
  EXPECT_NE(env.find("pod=" + name + "\n"), std::string::npos) << env;
  EXPECT_NE(env.find("namespace=default\n"), std::string::npos) << env;
  EXPECT_NE(env.find("host=127.0.0.1\n"), std::string::npos) << env;
  EXPECT_NE(env.find("metrics=0\n"), std::string::npos) << "extra_env wins: " << env;
  // The mount path is rewritten to the volume's directory, which holds the Secret's item only.
  const size_t at = env.find("ca_file=");
  const std::string ca_file = env.substr(at + 8, env.find('\n', at) - at - 8);
  EXPECT_EQ(ca_file.rfind(simulator_->work_dir() + "/", 0), 0u) << ca_file;
  EXPECT_EQ(ReadFile(ca_file), ca);
  const std::filesystem::path volume = std::filesystem::path(ca_file).parent_path();
  EXPECT_FALSE(std::filesystem::exists(volume / "token"));
  EXPECT_FALSE(std::filesystem::exists(volume / "unmounted"));

  WriteFile(out_ + "/go", "");
  json failed = WaitForPhase(name, "Failed");
  ASSERT_FALSE(failed.is_null());
  const json& terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(terminated.value("exitCode", -1), 3) << failed["status"].dump(2);
  EXPECT_EQ(terminated.value("reason", ""), "Error");
  EXPECT_FALSE(terminated.value("startedAt", "").empty());
  EXPECT_FALSE(terminated.value("finishedAt", "").empty());
  EXPECT_EQ(Condition(failed, "Ready").value("status", ""), "False");
  EXPECT_FALSE(failed["status"]["containerStatuses"][0].value("ready", true));
  EXPECT_EQ(simulator_->RunningCount(), 0);
  EXPECT_FALSE(Alive(pid));
  const std::string log = simulator_->LogOf(kNamespace, name);
  EXPECT_NE(log.find("started\n"), std::string::npos) << log;
  EXPECT_NE(log.find("exiting\n"), std::string::npos) << log;
  EXPECT_EQ(log.find("s3cret"), std::string::npos) << log;

  // A terminal pod is deleted at once, bound or not.
  Delete(name);
  WaitForPodGone(name);
}

TEST_F(KubeletSimulatorTest, ExitZeroSucceedsAndAbsolutePathsRunAsIs) {
  const std::string job = "sim-ok";
  StartSimulator(job);
  Create("pods", WorkerPod(job, job + "-worker-0", {"/bin/sh", "-c", "echo done"}));
  json done = WaitForPhase(job + "-worker-0", "Succeeded");
  ASSERT_FALSE(done.is_null());
  const json& terminated = done["status"]["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(terminated.value("exitCode", -1), 0);
  EXPECT_EQ(terminated.value("reason", ""), "Completed");
  EXPECT_EQ(Condition(done, "Ready").value("reason", ""), "PodCompleted");
  EXPECT_EQ(simulator_->LogOf(kNamespace, job + "-worker-0"), "done\n");
  Delete(job + "-worker-0");
  WaitForPodGone(job + "-worker-0");
}

TEST_F(KubeletSimulatorTest, DeletingAPodStopsItsProcessWithSigtermThenRemovesThePod) {
  const std::string job = "sim-delete";
  StartSimulator(job);
  const std::string name = job + "-worker-0";
  Create("pods", WorkerPod(job, name,
                           {"/bin/sh", "-c",
                            "trap 'echo terminated > \"$OUT/term\"; exit 0' TERM\n"
                            "while :; do sleep 0.1; done\n"},
                           {{{"name", "OUT"}, {"value", out_}}}));
  ASSERT_FALSE(WaitForPhase(name, "Running").is_null());
  const pid_t pid = simulator_->PidOf(kNamespace, name);
  ASSERT_TRUE(Alive(pid));

  // A bound pod is not deleted by the API server at once: it is Terminating until its kubelet
  // says the containers are gone.
  KubeTestEnv::Response deleted =
      kube_->Request("DELETE", std::string("/api/v1/namespaces/") + kNamespace + "/pods/" + name);
  ASSERT_EQ(deleted.status, 200) << deleted.raw;
  EXPECT_TRUE(deleted.body["metadata"].contains("deletionTimestamp")) << deleted.raw;
  ASSERT_TRUE(WaitForPodGone(name));
  EXPECT_FALSE(Alive(pid));
  EXPECT_EQ(ReadFile(out_ + "/term"), "terminated\n");
  EXPECT_EQ(simulator_->RunningCount(), 0);
}

TEST_F(KubeletSimulatorTest, AProcessIgnoringSigtermIsKilledAfterTheGracePeriod) {
  const std::string job = "sim-stubborn";
  StartSimulator(job);
  const std::string name = job + "-worker-0";
  json pod = WorkerPod(job, name, {"/bin/sh", "-c", "trap '' TERM\nwhile :; do sleep 0.1; done\n"});
  pod["spec"]["terminationGracePeriodSeconds"] = 1;
  Create("pods", pod);
  ASSERT_FALSE(WaitForPhase(name, "Running").is_null());
  const pid_t pid = simulator_->PidOf(kNamespace, name);
  ASSERT_TRUE(Alive(pid));
  const auto start = std::chrono::steady_clock::now();
  Delete(name);
  ASSERT_TRUE(WaitForPodGone(name));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(seconds, 0.9) << "the grace period was not given";
  EXPECT_FALSE(Alive(pid));
}

TEST_F(KubeletSimulatorTest, KillContainerWithSigkillReportsExitCode137) {
  const std::string job = "sim-crash";
  StartSimulator(job);
  const std::string name = job + "-worker-0";
  Create("pods", WorkerPod(job, name, {"/bin/sh", "-c", "while :; do sleep 0.1; done"}));
  ASSERT_FALSE(WaitForPhase(name, "Running").is_null());
  const pid_t pid = simulator_->PidOf(kNamespace, name);
  ASSERT_TRUE(simulator_->KillContainer(kNamespace, name, SIGKILL).ok());
  json failed = WaitForPhase(name, "Failed");
  ASSERT_FALSE(failed.is_null());
  const json& terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(terminated.value("exitCode", -1), 137) << failed["status"].dump(2);
  EXPECT_EQ(terminated.value("reason", ""), "Error");
  EXPECT_FALSE(Alive(pid));
  EXPECT_FALSE(simulator_->KillContainer(kNamespace, name, SIGKILL).ok());
  Delete(name);
  WaitForPodGone(name);
}

TEST_F(KubeletSimulatorTest, UnboundPodsAreDeletedAtOnceAndTheirProcessStopped) {
  const std::string job = "sim-unbound";
  KubeletSimulatorOptions options;
  options.bind_pods = false;
  StartSimulator(job, options);
  const std::string name = job + "-worker-0";
  Create("pods", WorkerPod(job, name, {"/bin/sh", "-c", "while :; do sleep 0.1; done"}));
  json running = WaitForPhase(name, "Running");
  ASSERT_FALSE(running.is_null());
  EXPECT_EQ(running["spec"].value("nodeName", ""), "");
  const pid_t pid = simulator_->PidOf(kNamespace, name);
  ASSERT_TRUE(Alive(pid));
  Delete(name);
  EXPECT_EQ(GetPod(name).status, 404) << "an unbound pod has no graceful deletion";
  EXPECT_TRUE(KubeTestEnv::WaitFor([&] { return !Alive(pid); }, kTimeoutMs))
      << simulator_->Describe();
  EXPECT_TRUE(KubeTestEnv::WaitFor([&] { return simulator_->RunningCount() == 0; }, kTimeoutMs));
}

TEST_F(KubeletSimulatorTest, AMissingSecretKeepsThePodPendingUntilItExists) {
  const std::string job = "sim-late-secret";
  StartSimulator(job);
  const std::string name = job + "-worker-0";
  DeleteSecret(job + "-secret");
  Create("pods",
         WorkerPod(
             job, name, {"/bin/sh", "-c", "echo \"$TOKEN\""},
             {{{"name", "TOKEN"},
               {"valueFrom", {{"secretKeyRef", {{"name", job + "-secret"}, {"key", "token"}}}}}}}));
  json waiting = WaitForPod(
      name,
      [](const json& pod) {
        return pod["status"].contains("containerStatuses") &&
               pod["status"]["containerStatuses"][0]["state"].contains("waiting");
      },
      "a waiting container");
  ASSERT_FALSE(waiting.is_null());
  EXPECT_EQ(waiting["status"].value("phase", ""), "Pending");
  const json& reason = waiting["status"]["containerStatuses"][0]["state"]["waiting"];
  EXPECT_EQ(reason.value("reason", ""), "CreateContainerConfigError");
  EXPECT_NE(reason.value("message", "").find("secret \"" + job + "-secret\" not found"),
            std::string::npos)
      << reason.dump();
  EXPECT_EQ(simulator_->RunningCount(), 0);

  CreateSecret(job + "-secret", {{"token", "late"}});
  ASSERT_FALSE(WaitForPhase(name, "Succeeded").is_null());
  EXPECT_EQ(simulator_->LogOf(kNamespace, name), "late\n");
  Delete(name);
  WaitForPodGone(name);
}

TEST_F(KubeletSimulatorTest, TestsDrivePhasesWhenContainersDoNotRun) {
  const std::string job = "sim-driven";
  KubeletSimulatorOptions options;
  options.run_containers = false;
  StartSimulator(job, options);
  for (const char* suffix : {"-worker-0", "-worker-1", "-worker-2"}) {
    Create("pods", WorkerPod(job, job + suffix, {"lockstep-worker", "train"}));
  }
  ASSERT_TRUE(simulator_->WaitForSync(kTimeoutMs));
  // Not started on its own: the test says when.
  EXPECT_EQ(GetPod(job + "-worker-0").body["status"].value("phase", ""), "Pending");

  ASSERT_TRUE(simulator_->SetRunning(kNamespace, job + "-worker-0").ok());
  KubeTestEnv::Response running = GetPod(job + "-worker-0");
  EXPECT_EQ(running.body["status"].value("phase", ""), "Running");
  EXPECT_EQ(Condition(running.body, "Ready").value("status", ""), "True");
  EXPECT_EQ(running.body["spec"].value("nodeName", ""), simulator_->node_name());
  EXPECT_TRUE(simulator_->Pids().empty());

  ASSERT_TRUE(simulator_->SetTerminated(kNamespace, job + "-worker-0", 2).ok());
  KubeTestEnv::Response failed = GetPod(job + "-worker-0");
  EXPECT_EQ(failed.body["status"].value("phase", ""), "Failed");
  EXPECT_EQ(
      failed.body["status"]["containerStatuses"][0]["state"]["terminated"].value("exitCode", -1),
      2);

  ASSERT_TRUE(simulator_->SetRunning(kNamespace, job + "-worker-1").ok());
  ASSERT_TRUE(simulator_->SetTerminated(kNamespace, job + "-worker-1", 0).ok());
  EXPECT_EQ(GetPod(job + "-worker-1").body["status"].value("phase", ""), "Succeeded");

  ASSERT_TRUE(simulator_->SetRunning(kNamespace, job + "-worker-2").ok());
  ASSERT_TRUE(simulator_->SetEvicted(kNamespace, job + "-worker-2").ok());
  KubeTestEnv::Response evicted = GetPod(job + "-worker-2");
  EXPECT_EQ(evicted.body["status"].value("phase", ""), "Failed");
  EXPECT_EQ(evicted.body["status"].value("reason", ""), "Evicted");
  EXPECT_FALSE(evicted.body["status"].value("message", "").empty());
  EXPECT_FALSE(evicted.body["status"].contains("containerStatuses")) << evicted.raw;

  EXPECT_EQ(simulator_->SetRunning(kNamespace, job + "-worker-9").code(), StatusCode::kNotFound);
  for (const char* suffix : {"-worker-0", "-worker-1", "-worker-2"}) Delete(job + suffix);
  for (const char* suffix : {"-worker-0", "-worker-1", "-worker-2"}) WaitForPodGone(job + suffix);
}

TEST_F(KubeletSimulatorTest, ARunningBoundPodDeletedInDrivenModeIsFinishedByTheSimulator) {
  const std::string job = "sim-driven-delete";
  KubeletSimulatorOptions options;
  options.run_containers = false;
  StartSimulator(job, options);
  const std::string name = job + "-worker-0";
  Create("pods", WorkerPod(job, name, {"lockstep-worker", "train"}));
  ASSERT_TRUE(simulator_->SetRunning(kNamespace, name).ok());
  Delete(name);
  WaitForPodGone(name);
}

TEST_F(KubeletSimulatorTest, TwoNodesShareASelectorAndEachPodRunsOnOne) {
  const std::string job = "sim-two-nodes";
  KubeletSimulatorOptions a_options, b_options;
  a_options.namespace_ = b_options.namespace_ = kNamespace;
  a_options.label_selector = b_options.label_selector = std::string(kJobLabel) + "=" + job;
  a_options.node_name = "node-a";
  b_options.node_name = "node-b";
  StatusOr<std::unique_ptr<KubeletSimulator>> a = KubeletSimulator::Start(kube_, a_options);
  StatusOr<std::unique_ptr<KubeletSimulator>> b = KubeletSimulator::Start(kube_, b_options);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<std::string> names;
  for (int i = 0; i < 4; ++i) {
    names.push_back(job + "-worker-" + std::to_string(i));
    Create("pods", WorkerPod(job, names.back(), {"/bin/sh", "-c", "while :; do sleep 0.1; done"}));
  }
  ASSERT_TRUE(KubeTestEnv::WaitFor([&] { return (*a)->RunningCount() + (*b)->RunningCount() == 4; },
                                   kTimeoutMs))
      << (*a)->Describe() << (*b)->Describe();
  std::set<pid_t> pids;
  for (const std::string& name : names) {
    const pid_t on_a = (*a)->PidOf(kNamespace, name);
    const pid_t on_b = (*b)->PidOf(kNamespace, name);
    EXPECT_TRUE((on_a > 0) != (on_b > 0)) << name << " runs on " << on_a << "/" << on_b;
    KubeTestEnv::Response pod = GetPod(name);
    EXPECT_EQ(pod.body["spec"].value("nodeName", ""), on_a > 0 ? "node-a" : "node-b");
    pids.insert(on_a > 0 ? on_a : on_b);
  }
  EXPECT_EQ(pids.size(), 4u);
  // The node going away (the simulators' destructors) kills the processes.
  a->reset();
  b->reset();
  for (pid_t pid : pids) EXPECT_FALSE(Alive(pid));
  for (const std::string& name : names) {
    kube_->Request("DELETE", std::string("/api/v1/namespaces/") + kNamespace + "/pods/" + name +
                                 "?gracePeriodSeconds=0");
  }
}

}  // namespace
}  // namespace lockstep::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(
      new lockstep::testing::KubeTestEnvironment("kubelet_simulator_test"));
  return RUN_ALL_TESTS();
}
