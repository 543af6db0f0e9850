// A PEM file named by an environment variable (a CA, a certificate chain, a key mounted from a
// Secret): read whole, at most 1 MiB, and checked to hold the PEM block asked for.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(std::string ca, PemFileNamedBy("LOCKSTEP_RENDEZVOUS_CA_FILE",
//                                                            kPemCertificate, "PEM certificate"));
#pragma once

#include <string>

#include "common/status.h"

namespace lockstep {

inline constexpr char kPemCertificate[] = "-----BEGIN CERTIFICATE-----";
// The end of every PEM key's label: EC, RSA and PKCS#8 ("-----BEGIN PRIVATE KEY-----").
inline constexpr char kPemPrivateKey[] = "PRIVATE KEY-----";

// "" when `variable` is unset or empty. INVALID_ARGUMENT naming the variable and the file when
// it cannot be read, is over 1 MiB, or does not contain `needle` ("<file> holds no <what>").
StatusOr<std::string> PemFileNamedBy(const char* variable, const std::string& needle,
                                     const std::string& what);

// The same for a file named by a flag: errors begin with `named_by` ("--ca-file").
StatusOr<std::string> PemFile(const std::string& path, const std::string& needle,
                              const std::string& what, const std::string& named_by);

}  // namespace lockstep
