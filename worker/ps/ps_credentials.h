// What a parameter server and its workers authenticate with, from the environment the operator or
// `lockstep run` sets (docs/parameter-servers.md, "Security"):
//
//   LOCKSTEP_PS_TOKEN          the job's parameter-server token; every call carries it. It is not
//                              the rendezvous token (LOCKSTEP_JOB_TOKEN), which a server is never
//                              given: a server's secrets cannot act on the rendezvous. When unset,
//                              LOCKSTEP_JOB_TOKEN (pods an operator made before servers had
//                              their own token).
//   LOCKSTEP_PS_TLS_CERT_FILE  the server's PEM certificate chain; with LOCKSTEP_PS_TLS_KEY_FILE,
//   LOCKSTEP_PS_TLS_KEY_FILE   its key: the server serves TLS only. Neither: plaintext.
//   LOCKSTEP_PS_CA_FILE        the workers' PEM of the CA that signed the servers' certificates:
//                              the client speaks TLS and checks the servers' names. Unset:
//                              plaintext.
#pragma once

#include <string>

#include "common/status.h"

namespace lockstep::ps {

struct PsServerCredentials {
  std::string token;
  std::string tls_cert_pem;  // both empty: plaintext
  std::string tls_key_pem;
};

struct PsClientCredentials {
  std::string token;
  std::string tls_ca_pem;  // empty: plaintext
};

// INVALID_ARGUMENT naming the variable and the file when no token is set, one of the two TLS
// files is given without the other, or a file cannot be read or holds no PEM of its kind.
StatusOr<PsServerCredentials> PsServerCredentialsFromEnvironment();
StatusOr<PsClientCredentials> PsClientCredentialsFromEnvironment();

}  // namespace lockstep::ps
