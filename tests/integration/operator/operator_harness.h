// Test harness for the operator's integration tests: one real kube-apiserver + etcd per test
// binary (tests/support/kube), the CRDs installed, and lockstep-operator processes started,
// killed and restarted against it, as a cluster would run them.
//
//   OperatorHarness& h = OperatorHarness::Get();          // API server + CRDs, once per binary
//   auto op = h.StartOperator({.identity = "op-a"});      // waits for /readyz
//   h.Apply(JobManifest("fashion", 3));                    // POST the TrainingJob
//   h.WaitForJob("default/fashion", [](const json& j) { return Phase(j) == "Created"; });
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/process/process.h"
#include "tests/support/kube/kube_testenv.h"
#include "tests/support/kube/training_job_manifest.h"  // JobManifest

namespace lockstep::testing {

using json = nlohmann::json;

struct OperatorOptions {
  std::string identity = "operator-a";
  bool leader_elect = false;
  std::string lease_name = "lockstep-operator";
  std::string watch_namespace;         // "" : all
  int64_t progress_interval_ms = 500;  // fast status refresh for tests
  std::vector<std::string> extra_flags;
  // Added to its environment (POD_NAME: the pod it runs in, whose leader label it keeps).
  std::vector<std::pair<std::string, std::string>> env;
};

// One lockstep-operator process.
class OperatorProcess {
 public:
  ~OperatorProcess();  // SIGKILL if still running
  pid_t pid() const { return child_ ? child_->pid() : 0; }
  int metrics_port() const { return metrics_port_; }
  int rendezvous_port() const { return rendezvous_port_; }
  // GET http://127.0.0.1:<metrics_port><path>; "" on failure (status in *code when given).
  std::string Http(const std::string& path, int* code = nullptr) const;
  // The value of an unlabelled (or first matching) sample in /metrics; NaN when absent.
  double Metric(const std::string& name_with_labels) const;
  void Kill(int signal);
  // SIGTERM and wait (bounded); the result holds the logs.
  ProcessResult Stop(int64_t timeout_ms = 20000);
  std::string LogTail() const;  // stderr so far

 private:
  friend class OperatorHarness;
  std::unique_ptr<ChildProcess> child_;
  std::string log_path_;
  int metrics_port_ = 0;
  int rendezvous_port_ = 0;
  bool stopped_ = false;
};

class OperatorHarness {
 public:
  // Starts the API server and installs the CRDs (TrainingJob, Volcano and scheduler-plugins
  // PodGroups) on first use; fails the calling test (ADD_FAILURE) and returns nullptr on error.
  static OperatorHarness* Get();
  KubeTestEnv& kube() { return *kube_; }

  // Starts lockstep-operator and waits (bounded, 30 s) for /readyz; nullptr with *error.
  std::unique_ptr<OperatorProcess> StartOperator(const OperatorOptions& options, std::string* error,
                                                 bool wait_ready = true);
  // The same on given ports (a replacement operator behind the same address).
  std::unique_ptr<OperatorProcess> StartOperatorOnPorts(const OperatorOptions& options,
                                                        int metrics_port, int rendezvous_port,
                                                        std::string* error);

  std::string NewNamespace(const std::string& prefix);  // created, unique per call

  // TrainingJob CRUD through the API (as kubectl would).
  KubeTestEnv::Response Apply(const std::string& ns, const json& job);
  json GetJob(const std::string& ns, const std::string& name);
  std::vector<json> Pods(const std::string& ns, const std::string& job_name);
  json Pod(const std::string& ns, const std::string& name);  // null when absent
  KubeTestEnv::Response Scale(const std::string& ns, const std::string& name, int replicas);
  KubeTestEnv::Response PatchJobSpec(const std::string& ns, const std::string& name,
                                     const json& merge_patch);
  std::vector<json> Events(const std::string& ns, const std::string& object_name);

  // Acting as a kubelet (no kubelet runs): write a pod's status.
  bool SetPodRunning(const std::string& ns, const std::string& name);
  bool SetPodTerminated(const std::string& ns, const std::string& name, int exit_code);

  // Polls the job until `predicate` holds or timeout_ms passes; returns the last job read.
  json WaitForJob(const std::string& ns, const std::string& name,
                  const std::function<bool(const json&)>& predicate, int64_t timeout_ms, bool* ok);
  // WaitForJob that fails the calling test when the job never gets there, saying what it never
  // did (`what`) and its last status.
  json ExpectJob(const std::string& ns, const std::string& name,
                 const std::function<bool(const json&)>& predicate, const std::string& what,
                 int64_t timeout_ms);
  static bool WaitFor(const std::function<bool()>& condition, int64_t timeout_ms) {
    return KubeTestEnv::WaitFor(condition, timeout_ms);
  }

 private:
  OperatorHarness() = default;
  bool Setup(std::string* error);
  std::unique_ptr<OperatorProcess> Launch(const OperatorOptions& options, int metrics_port,
                                          int rendezvous_port, std::string* error, bool wait_ready);
  std::unique_ptr<KubeTestEnv> kube_;
  int namespaces_ = 0;
};

std::string Phase(const json& job);
// The condition of `type` ({}: absent).
json Condition(const json& job, const std::string& type);

}  // namespace lockstep::testing
