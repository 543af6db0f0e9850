// What the rendezvous benches share about the service they measure in a process of its own:
// its /proc figures, and a certificate for serving TLS on loopback as the operator does.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/status.h"
#include "common/tls/certificates.h"

namespace lockstep::rendezvous::load {

// From /proc/<pid>/status: VmRSS and VmHWM in MiB (-1 if unread), and the thread count.
struct ProcessMemory {
  double resident_mib = -1;
  double peak_mib = -1;
  int threads = 0;
};
ProcessMemory ReadProcessMemory(pid_t pid);

// A serving certificate for 127.0.0.1 from a CA made here, and that CA's PEM for the clients.
struct LoopbackTls {
  tls::KeyPair serving;
  std::string ca_pem;
};
StatusOr<LoopbackTls> MakeLoopbackTls();

}  // namespace lockstep::rendezvous::load
