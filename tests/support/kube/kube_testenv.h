// A real Kubernetes API server for tests: etcd (Debian's etcd-server) and kube-apiserver 1.20.2
// (built and cached by scripts/kubernetes.sh) on loopback, in a temporary directory, torn down
// by the destructor.
//
//   std::string error;
//   std::unique_ptr<KubeTestEnv> kube = KubeTestEnv::Start({}, &error);
//   ASSERT_TRUE(kube) << error;
//   KubeTestEnv::Response r = kube->Request("GET", "/api/v1/namespaces/default");
//   EXPECT_EQ(r.status, 200) << r.raw;
//
// What runs: etcd on free client/peer ports; kube-apiserver on a free secure port with a
// self-signed serving certificate (--cert-dir), a static admin token in system:masters, RBAC,
// --endpoint-reconciler-type=none, and the ServiceAccount admission plugin disabled (no
// kube-controller-manager's service account controllers run, so no service account or token
// would ever be created). No kubelet, no scheduler: tests act as those where they need to.
// StartGarbageCollector adds kube-controller-manager running its garbage collector alone, so
// that owner references are acted on as in a cluster (deleting an owner deletes its dependents).
// kubeconfig() is a file kubectl-like clients read (server, CA, token). Every wait is bounded;
// failures come back as an error with the tail of the server logs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lockstep::testing {

class ChildProcess;

struct KubeTestEnvOptions {
  // scripts/kubernetes.sh builds kube-apiserver on first use (minutes); bound for that.
  int64_t build_timeout_ms = 20 * 60 * 1000;
  // etcd healthy + kube-apiserver /readyz ok.
  int64_t start_timeout_ms = 120 * 1000;
};

// `count` distinct free loopback ports: all bound at once (port 0), then released. Fewer when the
// system has none left.
std::vector<int> FreePorts(int count);

class KubeTestEnv {
 public:
  // Who a request acts as: the admin impersonates them (Impersonate-User and -Group headers), so
  // the server's authorizer decides as it would for their own credentials. A ServiceAccount is
  // user "system:serviceaccount:NS:NAME" in groups system:serviceaccounts,
  // system:serviceaccounts:NS and system:authenticated (ServiceAccountIdentity below).
  struct Identity {
    std::string user;
    std::vector<std::string> groups;
  };
  static Identity ServiceAccountIdentity(const std::string& ns, const std::string& name);

  struct Response {
    int status = 0;       // HTTP status; 0 when the request failed (see error)
    nlohmann::json body;  // parsed body (null when not JSON)
    std::string raw;      // body as received
    std::string error;    // transport error (curl's message)
  };

  // Returns nullptr with *error set when the binaries cannot be built or the servers do not come
  // up in time. Set LOCKSTEP_KEEP_KUBE_TESTENV=1 to keep the directory (logs) afterwards.
  static std::unique_ptr<KubeTestEnv> Start(const KubeTestEnvOptions& options, std::string* error);
  ~KubeTestEnv();
  KubeTestEnv(const KubeTestEnv&) = delete;
  KubeTestEnv& operator=(const KubeTestEnv&) = delete;

  const std::string& server() const { return server_; }  // https://127.0.0.1:PORT
  const std::string& token() const { return token_; }    // admin bearer token
  const std::string& ca_file() const { return ca_file_; }
  const std::string& kubeconfig() const { return kubeconfig_; }
  const std::string& dir() const { return dir_; }
  const std::string& apiserver_binary() const { return apiserver_binary_; }

  // One request as the admin, through curl. `body` is sent as JSON unless null; content_type
  // matters for PATCH (application/merge-patch+json, application/json-patch+json); `accept`
  // asks for another form (e.g. "application/json;as=Table;v=v1;g=meta.k8s.io", what kubectl get
  // prints).
  Response Request(const std::string& method, const std::string& path,
                   const nlohmann::json& body = nullptr,
                   const std::string& content_type = "application/json", int64_t timeout_ms = 30000,
                   const std::string& accept = "application/json") const;
  // The same request made as `who`.
  Response RequestAs(const Identity& who, const std::string& method, const std::string& path,
                     const nlohmann::json& body = nullptr,
                     const std::string& content_type = "application/json") const;

  // Creates every CustomResourceDefinition of the YAML file `path` (one that exists already is
  // fine) and waits, bounded, until the server lists each served version's resource in
  // discovery. False (and `error`, naming the file) otherwise.
  bool InstallCrds(const std::string& path, std::string* error) const;

  // Starts kube-controller-manager --controllers=garbagecollector (built beside the server).
  // Call it after installing CRDs whose objects own others: the collector learns resources by
  // discovery, which it repeats only every 30 s. False (and `error`) when it does not run.
  bool StartGarbageCollector(std::string* error) {
    return StartControllerManager({"garbagecollector"}, error);
  }
  // kube-controller-manager running only `controllers` (its --controllers names, e.g.
  // "clusterrole-aggregation"). One per environment: a second call is refused unless it asks
  // for the same controllers.
  bool StartControllerManager(const std::vector<std::string>& controllers, std::string* error);

  // Polls `condition` every 100 ms until true or timeout_ms; returns its last result.
  static bool WaitFor(const std::function<bool()>& condition, int64_t timeout_ms);

  // Last bytes of the etcd, kube-apiserver (and kube-controller-manager) logs, for failure
  // messages.
  std::string LogTails() const;

 private:
  KubeTestEnv() = default;
  void Stop();
  Response Send(const std::string& method, const std::string& path, const nlohmann::json& body,
                const std::string& content_type, int64_t timeout_ms, const std::string& accept,
                const std::vector<std::string>& headers) const;

  std::string dir_, server_, token_, ca_file_, kubeconfig_, apiserver_binary_;
  std::unique_ptr<ChildProcess> etcd_, apiserver_, controller_manager_;
  std::vector<std::string> controllers_;
};

}  // namespace lockstep::testing
