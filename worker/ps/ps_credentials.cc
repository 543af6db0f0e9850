#include "worker/ps/ps_credentials.h"

#include <fstream>

#include "common/env.h"

namespace lockstep::ps {
namespace {

constexpr char kCertificate[] = "-----BEGIN CERTIFICATE-----";
// The end of every PEM key's label: EC, RSA and PKCS#8 ("-----BEGIN PRIVATE KEY-----").
constexpr char kPrivateKey[] = "PRIVATE KEY-----";

StatusOr<std::string> Token() {
  std::string token = EnvString("LOCKSTEP_PS_TOKEN", "");
  if (token.empty()) token = EnvString("LOCKSTEP_JOB_TOKEN", "");
  if (token.empty()) return InvalidArgumentError("LOCKSTEP_PS_TOKEN is not set");
  return token;
}

// The PEM file named by `variable`, which must contain `needle` (a PEM label of the kind `what`
// names); "" when the variable is unset. At most 1 MiB: a certificate chain or a key is a few KiB.
StatusOr<std::string> PemFile(const char* variable, const std::string& needle,
                              const std::string& what) {
  const std::string path = EnvString(variable, "");
  if (path.empty()) return std::string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError(std::string(variable) + ": cannot read " + path);
  constexpr std::streamsize kMaxBytes = 1 << 20;
  std::string pem(static_cast<size_t>(kMaxBytes) + 1, '\0');
  in.read(pem.data(), kMaxBytes + 1);
  pem.resize(static_cast<size_t>(in.gcount()));
  if (in.bad()) return InvalidArgumentError(std::string(variable) + ": cannot read " + path);
  if (pem.size() > static_cast<size_t>(kMaxBytes)) {
    return InvalidArgumentError(std::string(variable) + ": " + path + " is over 1 MiB");
  }
  if (pem.find(needle) == std::string::npos) {
    return InvalidArgumentError(std::string(variable) + ": " + path + " holds no " + what);
  }
  return pem;
}

}  // namespace

StatusOr<PsServerCredentials> PsServerCredentialsFromEnvironment() {
  PsServerCredentials credentials;
  LOCKSTEP_ASSIGN_OR_RETURN(credentials.token, Token());
  LOCKSTEP_ASSIGN_OR_RETURN(credentials.tls_cert_pem,
                            PemFile("LOCKSTEP_PS_TLS_CERT_FILE", kCertificate, "PEM certificate"));
  LOCKSTEP_ASSIGN_OR_RETURN(credentials.tls_key_pem,
                            PemFile("LOCKSTEP_PS_TLS_KEY_FILE", kPrivateKey, "PEM private key"));
  if (credentials.tls_cert_pem.empty() != credentials.tls_key_pem.empty()) {
    return InvalidArgumentError(
        "LOCKSTEP_PS_TLS_CERT_FILE and LOCKSTEP_PS_TLS_KEY_FILE: give both (TLS) or neither");
  }
  return credentials;
}

StatusOr<PsClientCredentials> PsClientCredentialsFromEnvironment() {
  PsClientCredentials credentials;
  LOCKSTEP_ASSIGN_OR_RETURN(credentials.token, Token());
  LOCKSTEP_ASSIGN_OR_RETURN(credentials.tls_ca_pem,
                            PemFile("LOCKSTEP_PS_CA_FILE", kCertificate, "PEM certificate"));
  return credentials;
}

}  // namespace lockstep::ps
