#include "tests/integration/operator/operator_harness.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>


namespace lockstep::testing {

namespace {

const std::string kSource = LOCKSTEP_SOURCE_DIR;
const std::string kOperatorBinary = LOCKSTEP_OPERATOR_BINARY;

std::string JobsPath(const std::string& ns) {
  return "/apis/lockstep.io/v1alpha1/namespaces/" + ns + "/trainingjobs";
}

}  // namespace

std::string Phase(const json& job) {
  if (!job.is_object() || !job.contains("status") || !job["status"].is_object()) return "";
  return job["status"].value("phase", "");
}

json Condition(const json& job, const std::string& type) {
  if (!job.is_object() || !job.contains("status")) return json::object();
  for (const json& c : job["status"].value("conditions", json::array())) {
    if (c.value("type", "") == type) return c;
  }
  return json::object();
}

// --- OperatorProcess -------------------------------------------------------------------------

OperatorProcess::~OperatorProcess() {
  if (child_ && !stopped_) {
    kill(-child_->pid(), SIGKILL);
    child_->Wait(10000);
  }
}

std::string OperatorProcess::Http(const std::string& path, int* code) const {
  ProcessResult r = RunProcess({"/usr/bin/curl", "-s", "-m", "5", "-w", "\n%{http_code}",
                                "http://127.0.0.1:" + std::to_string(metrics_port_) + path},
                               {}, 10000);
  std::string out = r.out;
  const size_t newline = out.rfind('\n');
  int status = 0;
  if (newline != std::string::npos) {
    status = std::atoi(out.c_str() + newline + 1);
    out.resize(newline);
  }
  if (code) *code = status;
  return status == 0 ? "" : out;
}

double OperatorProcess::Metric(const std::string& name_with_labels) const {
  std::istringstream lines(Http("/metrics"));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.compare(0, name_with_labels.size(), name_with_labels) != 0) continue;
    const char next = line.size() > name_with_labels.size() ? line[name_with_labels.size()] : ' ';
    if (next != ' ' && next != '{') continue;
    return std::atof(line.c_str() + line.rfind(' ') + 1);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

void OperatorProcess::Kill(int signal) {
  if (child_) kill(-child_->pid(), signal);
}

ProcessResult OperatorProcess::Stop(int64_t timeout_ms) {
  stopped_ = true;
  kill(-child_->pid(), SIGTERM);
  ProcessResult result = child_->Wait(timeout_ms);
  result.err = ReadFile(log_path_);
  return result;
}

std::string OperatorProcess::LogTail() const {
  std::string log = ReadFile(log_path_);
  return log.size() > 6000 ? log.substr(log.size() - 6000) : log;
}

// --- OperatorHarness -------------------------------------------------------------------------

namespace {
OperatorHarness* harness = nullptr;

// Stops the API server and etcd after the last test (a static would outlive gtest's output).
class HarnessTeardown : public ::testing::Environment {
 public:
  void TearDown() override {
    delete harness;
    harness = nullptr;
  }
};
::testing::Environment* const kTeardown = ::testing::AddGlobalTestEnvironment(new HarnessTeardown);
}  // namespace

OperatorHarness* OperatorHarness::Get() {
  static std::string error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    auto h = new OperatorHarness();
    std::cerr << "operator tests: starting kube-apiserver (a first run builds it: minutes)\n";
    if (h->Setup(&error)) {
      harness = h;
    } else {
      delete h;
    }
  }
  if (!harness) ADD_FAILURE() << error;
  return harness;
}

bool OperatorHarness::Setup(std::string* error) {
  kube_ = KubeTestEnv::Start({}, error);
  if (!kube_) return false;
  if (!kube_->InstallCrds(kSource + "/crds/trainingjob.yaml", error)) return false;
  for (const char* crd : {"/tests/data/crds/volcano-podgroups.yaml",
                          "/tests/data/crds/scheduler-plugins-podgroups.yaml"}) {
    if (std::filesystem::exists(kSource + crd) && !kube_->InstallCrds(kSource + crd, error)) {
      return false;
    }
  }
  // The real garbage collector, once it can discover TrainingJobs: what owner references do (a
  // deleted job takes its children along) is checked, not assumed.
  return kube_->StartGarbageCollector(error);
}

std::unique_ptr<OperatorProcess> OperatorHarness::StartOperator(const OperatorOptions& options,
                                                                std::string* error,
                                                                bool wait_ready) {
  const std::vector<int> ports = FreePorts(2);  // metrics, rendezvous
  if (ports.size() != 2) {
    *error = "no free loopback ports";
    return nullptr;
  }
  return Launch(options, ports[0], ports[1], error, wait_ready);
}

std::unique_ptr<OperatorProcess> OperatorHarness::StartOperatorOnPorts(
    const OperatorOptions& options, int metrics_port, int rendezvous_port, std::string* error) {
  return Launch(options, metrics_port, rendezvous_port, error, true);
}

std::unique_ptr<OperatorProcess> OperatorHarness::Launch(const OperatorOptions& options,
                                                         int metrics_port, int rendezvous_port,
                                                         std::string* error, bool wait_ready) {
  auto process = std::unique_ptr<OperatorProcess>(new OperatorProcess());
  process->metrics_port_ = metrics_port;
  process->rendezvous_port_ = rendezvous_port;
  process->log_path_ = MakeTempDir("lockstep-operator-log-") + "/operator.log";
  std::vector<std::string> argv = {
      "/bin/sh",
      "-c",
      "exec \"$0\" \"$@\" 2>>" + process->log_path_,
      kOperatorBinary,
      "--kubeconfig=" + kube_->kubeconfig(),
      "--identity=" + options.identity,
      "--leader-elect=" + std::string(options.leader_elect ? "true" : "false"),
      "--leader-election-id=" + options.lease_name,
      "--leader-election-namespace=default",
      "--metrics-host=127.0.0.1",
      "--metrics-port=" + std::to_string(process->metrics_port_),
      "--rendezvous-host=127.0.0.1",
      "--rendezvous-port=" + std::to_string(process->rendezvous_port_),
      "--rendezvous-address=127.0.0.1:" + std::to_string(process->rendezvous_port_),
      "--progress-interval-ms=" + std::to_string(options.progress_interval_ms),
      "--worker-image=lockstep-worker:test"};
  if (!options.watch_namespace.empty()) {
    argv.push_back("--watch-namespace=" + options.watch_namespace);
  }
  for (const std::string& flag : options.extra_flags) argv.push_back(flag);
  process->child_ = std::make_unique<ChildProcess>(argv, options.env);
  if (!wait_ready) return process;
  int code = 0;
  bool ready = KubeTestEnv::WaitFor(
      [&] {
        process->Http("/readyz", &code);
        return code == 200;
      },
      30000);
  if (!ready) {
    *error = "lockstep-operator not ready within 30 s (last /readyz " + std::to_string(code) +
             "):\n" + process->LogTail();
    return nullptr;
  }
  return process;
}

std::string OperatorHarness::NewNamespace(const std::string& prefix) {
  const std::string name = prefix + "-" + std::to_string(++namespaces_);
  kube_->Request("POST", "/api/v1/namespaces",
                 json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", name}}}});
  return name;
}

KubeTestEnv::Response OperatorHarness::Apply(const std::string& ns, const json& job) {
  return kube_->Request("POST", JobsPath(ns), job);
}

json OperatorHarness::GetJob(const std::string& ns, const std::string& name) {
  auto r = kube_->Request("GET", JobsPath(ns) + "/" + name);
  return r.status == 200 ? r.body : json();
}

std::vector<json> OperatorHarness::Pods(const std::string& ns, const std::string& job_name) {
  auto r = kube_->Request("GET", "/api/v1/namespaces/" + ns +
                                     "/pods?labelSelector=lockstep.io%2Fjob-name%3D" + job_name);
  std::vector<json> pods;
  if (r.status == 200) {
    for (const json& p : r.body["items"]) pods.push_back(p);
  }
  std::sort(pods.begin(), pods.end(), [](const json& a, const json& b) {
    return a["metadata"].value("name", "") < b["metadata"].value("name", "");
  });
  return pods;
}

json OperatorHarness::Pod(const std::string& ns, const std::string& name) {
  auto r = kube_->Request("GET", "/api/v1/namespaces/" + ns + "/pods/" + name);
  return r.status == 200 ? r.body : json();
}

KubeTestEnv::Response OperatorHarness::Scale(const std::string& ns, const std::string& name,
                                             int replicas) {
  return kube_->Request("PATCH", JobsPath(ns) + "/" + name + "/scale",
                        json{{"spec", {{"replicas", replicas}}}}, "application/merge-patch+json");
}

KubeTestEnv::Response OperatorHarness::PatchJobSpec(const std::string& ns, const std::string& name,
                                                    const json& merge_patch) {
  return kube_->Request("PATCH", JobsPath(ns) + "/" + name, json{{"spec", merge_patch}},
                        "application/merge-patch+json");
}

std::vector<json> OperatorHarness::Events(const std::string& ns, const std::string& object_name) {
  auto r = kube_->Request("GET", "/api/v1/namespaces/" + ns +
                                     "/events?fieldSelector=involvedObject.name%3D" + object_name);
  std::vector<json> events;
  if (r.status == 200) {
    for (const json& e : r.body["items"]) events.push_back(e);
  }
  return events;
}

namespace {
std::string NowRfc3339() {
  char buffer[32];
  time_t now = time(nullptr);
  strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  return buffer;
}
}  // namespace

// What a kubelet writes (Pod API, PodStatus): phase, podIP, conditions, containerStatuses.
bool OperatorHarness::SetPodRunning(const std::string& ns, const std::string& name) {
  const std::string now = NowRfc3339();
  json status = {
      {"phase", "Running"},
      {"podIP", "127.0.0.1"},
      {"hostIP", "127.0.0.1"},
      {"startTime", now},
      {"conditions",
       json::array({{{"type", "Ready"}, {"status", "True"}, {"lastTransitionTime", now}},
                    {{"type", "ContainersReady"}, {"status", "True"}, {"lastTransitionTime", now}},
                    {{"type", "PodScheduled"}, {"status", "True"}, {"lastTransitionTime", now}}})},
      {"containerStatuses", json::array({{{"name", "worker"},
                                          {"ready", true},
                                          {"restartCount", 0},
                                          {"image", "lockstep-worker:test"},
                                          {"imageID", ""},
                                          {"state", {{"running", {{"startedAt", now}}}}}}})}};
  auto r = kube_->Request("PATCH", "/api/v1/namespaces/" + ns + "/pods/" + name + "/status",
                          json{{"status", status}}, "application/merge-patch+json");
  return r.status == 200;
}

bool OperatorHarness::SetPodTerminated(const std::string& ns, const std::string& name,
                                       int exit_code) {
  const std::string now = NowRfc3339();
  json status = {
      {"phase", exit_code == 0 ? "Succeeded" : "Failed"},
      {"conditions",
       json::array({{{"type", "Ready"}, {"status", "False"}, {"lastTransitionTime", now}}})},
      {"containerStatuses", json::array({{{"name", "worker"},
                                          {"ready", false},
                                          {"restartCount", 0},
                                          {"image", "lockstep-worker:test"},
                                          {"imageID", ""},
                                          {"state",
                                           {{"terminated",
                                             {{"exitCode", exit_code},
                                              {"reason", exit_code == 0 ? "Completed" : "Error"},
                                              {"startedAt", now},
                                              {"finishedAt", now}}}}}}})}};
  auto r = kube_->Request("PATCH", "/api/v1/namespaces/" + ns + "/pods/" + name + "/status",
                          json{{"status", status}}, "application/merge-patch+json");
  return r.status == 200;
}

json OperatorHarness::ExpectJob(const std::string& ns, const std::string& name,
                                const std::function<bool(const json&)>& predicate,
                                const std::string& what, int64_t timeout_ms) {
  bool ok = false;
  json job = WaitForJob(ns, name, predicate, timeout_ms, &ok);
  EXPECT_TRUE(ok) << "job " << name << " never " << what << "; last: " << job["status"].dump(2);
  return job;
}

json OperatorHarness::WaitForJob(const std::string& ns, const std::string& name,
                                 const std::function<bool(const json&)>& predicate,
                                 int64_t timeout_ms, bool* ok) {
  json last;
  *ok = KubeTestEnv::WaitFor(
      [&] {
        last = GetJob(ns, name);
        return predicate(last);
      },
      timeout_ms);
  return last;
}

}  // namespace lockstep::testing
