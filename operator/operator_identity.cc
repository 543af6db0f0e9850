#include "operator/operator_identity.h"

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/base64.h"
#include "common/deadline.h"
#include "common/logging.h"

namespace lockstep::op {

namespace {

using json = nlohmann::json;
using kube::IsAlreadyExists;
using kube::IsConflict;
using kube::IsInvalid;
using kube::IsNotFound;

constexpr char kCaCert[] = "ca.crt";
constexpr char kCaKey[] = "ca.key";
constexpr char kMasterKey[] = "master-key";

StatusOr<OperatorIdentity> FromSecret(const json& secret, const std::string& where) {
  const json data = secret.value("data", json::object());
  OperatorIdentity identity;
  for (const char* key : {kCaCert, kCaKey, kMasterKey}) {
    if (!data.contains(key) || !data[key].is_string()) {
      return FailedPreconditionError("Secret " + where + " has no data." + key +
                                     " (delete it to have a new CA and master key created; "
                                     "running jobs then need restarting)");
    }
  }
  std::string* fields[] = {&identity.ca.cert_pem, &identity.ca.key_pem, &identity.master_key};
  const char* keys[] = {kCaCert, kCaKey, kMasterKey};
  for (int i = 0; i < 3; ++i) {
    StatusOr<std::string> decoded = Base64Decode(data[keys[i]].get<std::string>());
    if (!decoded.ok()) return decoded.status().WithContext("Secret " + where + " data." + keys[i]);
    *fields[i] = std::move(*decoded);
  }
  return identity;
}

}  // namespace

StatusOr<OperatorIdentity> LoadOrCreateOperatorIdentity(kube::KubeClient* client,
                                                        const std::string& ns,
                                                        const std::string& name,
                                                        int64_t timeout_ms) {
  const std::string where = ns + "/" + name;
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  Status last;
  while (!deadline.expired()) {
    StatusOr<json> secret = client->Get(kube::resources::kSecrets, ns, name);
    if (secret.ok()) return FromSecret(*secret, where);
    if (!IsNotFound(secret.status())) {
      last = secret.status();
    } else {
      LOCKSTEP_ASSIGN_OR_RETURN(tls::KeyPair ca,
                                tls::CreateCertificateAuthority("lockstep-rendezvous-ca"));
      LOCKSTEP_ASSIGN_OR_RETURN(std::string master_key, tls::RandomBytes(32));
      json object = {{"apiVersion", "v1"},
                     {"kind", "Secret"},
                     {"type", "Opaque"},
                     {"metadata",
                      {{"name", name},
                       {"namespace", ns},
                       {"labels", {{"app.kubernetes.io/managed-by", "lockstep-operator"}}}}},
                     {"data",
                      {{kCaCert, Base64Encode(ca.cert_pem)},
                       {kCaKey, Base64Encode(ca.key_pem)},
                       {kMasterKey, Base64Encode(master_key)}}}};
      StatusOr<json> created = client->Create(kube::resources::kSecrets, ns, object);
      if (created.ok()) {
        LOCKSTEP_LOG(INFO) << "created Secret " << where << " with a new rendezvous CA";
        return FromSecret(*created, where);
      }
      if (!IsAlreadyExists(created.status())) last = created.status();
      // AlreadyExists: another replica won; read its Secret on the next turn.
    }
    if (!last.ok()) {
      LOCKSTEP_LOG(WARNING) << "reading Secret " << where << ": " << last.message();
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::min<int64_t>(1000, deadline.remaining_ms())));
    }
  }
  return DeadlineExceededError("no operator identity from Secret " + where + " within " +
                               std::to_string(timeout_ms) + " ms" +
                               (last.ok() ? "" : ": " + last.message()));
}

StatusOr<tls::KeyPair> IssueRendezvousCertificate(const OperatorIdentity& identity,
                                                  const std::string& address,
                                                  const std::vector<std::string>& more_dns) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  std::vector<std::string> dns = {"localhost"};
  std::vector<std::string> ips = {"127.0.0.1"};
  unsigned char buffer[16];
  if (inet_pton(AF_INET, host.c_str(), buffer) == 1 ||
      inet_pton(AF_INET6, host.c_str(), buffer) == 1) {
    if (host != "127.0.0.1") ips.push_back(host);
  } else if (!host.empty() && host != "localhost") {
    dns.push_back(host);
  }
  for (const std::string& name : more_dns) {
    if (std::find(dns.begin(), dns.end(), name) == dns.end()) dns.push_back(name);
  }
  return tls::IssueServingCertificate(identity.ca, dns, ips, 365);
}

StatusOr<tls::KeyPair> IssueWebhookCertificate(const OperatorIdentity& identity,
                                               const std::string& service, const std::string& ns) {
  const std::string qualified = service + "." + ns;
  return tls::IssueServingCertificate(
      identity.ca,
      {service, qualified, qualified + ".svc", qualified + ".svc.cluster.local", "localhost"},
      {"127.0.0.1"}, 365);
}

}  // namespace lockstep::op
