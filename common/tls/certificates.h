// The rendezvous service's TLS: a CA the operator creates once (kept in its own Secret) and
// serving certificates it issues from that CA. Workers trust the CA through their job's Secret.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(KeyPair ca, CreateCertificateAuthority("lockstep-rendezvous-ca"));
//   LOCKSTEP_ASSIGN_OR_RETURN(KeyPair serving, IssueServingCertificate(
//       ca, {"lockstep-rendezvous.lockstep-system.svc"}, {"127.0.0.1"}, 365));
//   server options: tls_cert_pem = serving.cert_pem + ca.cert_pem, tls_key_pem = serving.key_pem
//
// Keys are ECDSA P-256; certificates X.509 v3 with SHA-256 signatures. OpenSSL errors come back
// as INTERNAL with OpenSSL's own error string.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep::tls {

struct KeyPair {
  std::string cert_pem;
  std::string key_pem;
};

// A self-signed CA (basicConstraints CA:TRUE, keyCertSign), valid `valid_days`.
StatusOr<KeyPair> CreateCertificateAuthority(const std::string& common_name, int valid_days = 3650);

// A leaf certificate for serving (serverAuth), with subjectAltName DNS and IP entries, signed
// by `ca`. INVALID_ARGUMENT when ca does not parse or an IP is not an address.
StatusOr<KeyPair> IssueServingCertificate(const KeyPair& ca, const std::vector<std::string>& dns_names,
                                          const std::vector<std::string>& ip_addresses,
                                          int valid_days = 365);

// HMAC-SHA256(key, message) as lowercase hex: the operator derives each job's rendezvous token
// from its master key and the job's uid, so a restarted operator re-derives it and never needs
// to read a job's Secret back.
std::string HmacSha256Hex(const std::string& key, const std::string& message);

// `bytes` random bytes from OpenSSL's CSPRNG.
StatusOr<std::string> RandomBytes(size_t bytes);

}  // namespace lockstep::tls
