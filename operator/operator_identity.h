// OperatorIdentity: what every replica of the operator shares and keeps across restarts, in one
// Secret of its own namespace (default "lockstep-operator"): the rendezvous CA (certificate and
// key) and the master key from which each job's rendezvous token is derived.
//
// The first replica to start creates the Secret; the others (and every restart) read it, so
// tokens and the CA workers trust stay the same: a restarted operator adopts running jobs
// without touching their Secrets. This is the only Secret the operator reads (RBAC: get/update
// on that one name).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "operator/kube/kube_client.h"
#include "common/tls/certificates.h"

namespace lockstep::op {

struct OperatorIdentity {
  tls::KeyPair ca;
  std::string master_key;
};

// Reads namespace/name, or creates it when absent (a concurrent creator wins and is read back).
// Bounded by timeout_ms. A Secret that exists but lacks a key is an error naming it (never
// silently replaced: running jobs depend on it).
StatusOr<OperatorIdentity> LoadOrCreateOperatorIdentity(kube::KubeClient* client,
                                                        const std::string& ns,
                                                        const std::string& name,
                                                        int64_t timeout_ms);

// The rendezvous serving certificate for `address` (host:port): the host as a DNS or IP
// subjectAltName, plus localhost and 127.0.0.1 (probes, port-forwarding), plus `more_dns`
// (the Service's names when workers are handed its cluster IP: workers started by an older
// operator still dial them).
StatusOr<tls::KeyPair> IssueRendezvousCertificate(const OperatorIdentity& identity,
                                                  const std::string& address,
                                                  const std::vector<std::string>& more_dns = {});

// The admission webhook's serving certificate: the names the API server may call it by through
// Service `service` in namespace `ns` (service, service.ns, service.ns.svc,
// service.ns.svc.cluster.local), plus localhost and 127.0.0.1.
StatusOr<tls::KeyPair> IssueWebhookCertificate(const OperatorIdentity& identity,
                                               const std::string& service, const std::string& ns);

}  // namespace lockstep::op
