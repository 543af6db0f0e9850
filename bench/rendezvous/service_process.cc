#include "bench/rendezvous/service_process.h"

#include <fstream>

namespace lockstep::rendezvous::load {

ProcessMemory ReadProcessMemory(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  ProcessMemory memory;
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) memory.resident_mib = std::stod(line.substr(6)) / 1024.0;
    if (line.rfind("VmHWM:", 0) == 0) memory.peak_mib = std::stod(line.substr(6)) / 1024.0;
    if (line.rfind("Threads:", 0) == 0) memory.threads = std::stoi(line.substr(8));
  }
  return memory;
}

StatusOr<LoopbackTls> MakeLoopbackTls() {
  LOCKSTEP_ASSIGN_OR_RETURN(tls::KeyPair ca, tls::CreateCertificateAuthority("bench-ca"));
  LOCKSTEP_ASSIGN_OR_RETURN(tls::KeyPair serving,
                            tls::IssueServingCertificate(ca, {}, {"127.0.0.1"}));
  return LoopbackTls{std::move(serving), ca.cert_pem};
}

}  // namespace lockstep::rendezvous::load
