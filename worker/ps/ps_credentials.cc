#include "worker/ps/ps_credentials.h"

#include "common/env.h"
#include "common/pem_file.h"

namespace lockstep::ps {
namespace {

StatusOr<std::string> Token() {
  std::string token = EnvString("LOCKSTEP_PS_TOKEN", "");
  if (token.empty()) token = EnvString("LOCKSTEP_JOB_TOKEN", "");
  if (token.empty()) return InvalidArgumentError("LOCKSTEP_PS_TOKEN is not set");
  return token;
}

}  // namespace

StatusOr<PsServerCredentials> PsServerCredentialsFromEnvironment() {
  PsServerCredentials credentials;
  LOCKSTEP_ASSIGN_OR_RETURN(credentials.token, Token());
  LOCKSTEP_ASSIGN_OR_RETURN(
      credentials.tls_cert_pem,
      PemFileNamedBy("LOCKSTEP_PS_TLS_CERT_FILE", kPemCertificate, "PEM certificate"));
  LOCKSTEP_ASSIGN_OR_RETURN(
      credentials.tls_key_pem,
      PemFileNamedBy("LOCKSTEP_PS_TLS_KEY_FILE", kPemPrivateKey, "PEM private key"));
  if (credentials.tls_cert_pem.empty() != credentials.tls_key_pem.empty()) {
    return InvalidArgumentError(
        "LOCKSTEP_PS_TLS_CERT_FILE and LOCKSTEP_PS_TLS_KEY_FILE: give both (TLS) or neither");
  }
  return credentials;
}

StatusOr<PsClientCredentials> PsClientCredentialsFromEnvironment() {
  PsClientCredentials credentials;
  LOCKSTEP_ASSIGN_OR_RETURN(credentials.token, Token());
  LOCKSTEP_ASSIGN_OR_RETURN(
      credentials.tls_ca_pem,
      PemFileNamedBy("LOCKSTEP_PS_CA_FILE", kPemCertificate, "PEM certificate"));
  return credentials;
}

}  // namespace lockstep::ps
