// KubeConfig: where the Kubernetes API server is and how to authenticate to it, read from a
// kubeconfig file (what kubectl uses) or from the pod's service account (in-cluster).
//
//   LOCKSTEP_ASSIGN_OR_RETURN(KubeConfig config, flags.kubeconfig.empty()
//                                                   ? InClusterConfig()
//                                                   : LoadKubeconfig(flags.kubeconfig));
//   LOCKSTEP_ASSIGN_OR_RETURN(auto client, KubeClient::Create(config, {}));
//
// Both loaders read files once and return everything in memory (PEM text, not paths), so a
// client never touches the file system again. Errors name the file and the field
// ("kubeconfig /x/config: context \"prod\" not found", "... users[0].user.client-key-data: not
// base64").
#pragma once

#include <string>

#include "common/status.h"

namespace lockstep::op::kube {

struct KubeConfig {
  std::string server;  // https://host:port (no trailing slash)
  // PEM of the CA that signs the server's certificate; empty: the system's roots.
  std::string ca_pem;
  bool insecure_skip_tls_verify = false;
  std::string token;            // bearer token; empty when client certificates are used
  std::string client_cert_pem;  // client certificate authentication (both or neither)
  std::string client_key_pem;
  std::string default_namespace = "default";  // the context's namespace / the pod's namespace
};

// Reads a kubeconfig (YAML): the given context, or current-context when `context` is empty.
// Supports certificate-authority(-data), insecure-skip-tls-verify, token, tokenFile,
// client-certificate(-data), client-key(-data), the context's namespace. Relative paths are
// relative to the kubeconfig's directory, as kubectl resolves them. Exec and auth-provider plugins
// are refused with UNIMPLEMENTED naming the user.
StatusOr<KubeConfig> LoadKubeconfig(const std::string& path, const std::string& context = "");

// In a pod: KUBERNETES_SERVICE_HOST/PORT and /var/run/secrets/kubernetes.io/serviceaccount/{token,
// ca.crt,namespace}. FAILED_PRECONDITION when not in a cluster. `root` replaces the service account
// directory (tests).
StatusOr<KubeConfig> InClusterConfig(
    const std::string& root = "/var/run/secrets/kubernetes.io/serviceaccount");

}  // namespace lockstep::op::kube
