// What one client's oversized requests cost the rendezvous service in resident memory.
//
// The service runs in a child process (as the operator hosts it: one process, many jobs), with
// one job; this process is its client. The child's VmRSS and VmHWM (/proc/<pid>/status) are read
// after each phase:
//   1. joined and a few small store writes (baseline);
//   2. a stranger's (wrong token) 64 MiB store write, then ten more: refused;
//   3. a member's 64 MiB write, then ten more: refused (RESOURCE_EXHAUSTED, larger than the
//      protocol needs);
//   4. a write of what the protocol does need at its bound (Gloo's full-mesh address list at the
//      replicas bound: 50,000 x 136 bytes = 6.5 MiB), accepted, and read back.
// Exit status 1 when a write that should be refused is accepted, the last one is not, or (TLS)
// the stranger's first write raised the service's peak by more than half its size: held, not
// refused from its metadata.
//
//   rendezvous_message_memory_bench [MiB] [--tls]     # prints a Markdown table
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "bench/rendezvous/service_process.h"
#include "common/rendezvous/client.h"
#include "common/rendezvous/server.h"
#include "common/tls/certificates.h"

namespace {

using lockstep::rendezvous::ClientOptions;
using lockstep::rendezvous::JobConfig;
using lockstep::rendezvous::RendezvousClient;
using lockstep::rendezvous::RendezvousServer;
using lockstep::rendezvous::ServerOptions;
using lockstep::rendezvous::load::ReadProcessMemory;

constexpr char kJob[] = "default/memory";
constexpr char kToken[] = "bench-token";

// The child: hosts the service (TLS when `serving` has a certificate), writes its port to `fd`,
// waits to be killed.
[[noreturn]] void Serve(int fd, const lockstep::tls::KeyPair& serving) {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.tls_cert_pem = serving.cert_pem;
  options.tls_key_pem = serving.key_pem;
  auto server = RendezvousServer::Start(options);
  int port = 0;
  if (server.ok()) {
    JobConfig job;
    job.job = kJob;
    job.token = kToken;
    job.min_members = 1;
    job.max_members = 1;
    if ((*server)->AddJob(job).ok()) port = (*server)->port();
  }
  if (write(fd, &port, sizeof(port)) != sizeof(port)) _exit(1);
  close(fd);
  pause();
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  // The oversized write, in MiB (default 64: the size the issue measured); --tls serves as the
  // operator does, with a certificate from a CA made here.
  size_t big_mib = 64;
  bool tls = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--tls") {
      tls = true;
    } else {
      big_mib = static_cast<size_t>(std::stoul(arg));
    }
  }
  lockstep::tls::KeyPair serving;
  std::string ca_pem;
  if (tls) {
    auto made = lockstep::rendezvous::load::MakeLoopbackTls();
    if (!made.ok()) {
      std::cerr << made.status() << "\n";
      return 1;
    }
    serving = made->serving;
    ca_pem = made->ca_pem;
  }
  int fds[2];
  if (pipe(fds) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    Serve(fds[1], serving);
  }
  close(fds[1]);
  int port = 0;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port) || port == 0) {
    std::cerr << "the service did not start\n";
    return 1;
  }
  int status = 1;
  {
    auto connect = [&](const std::string& member, const std::string& token) {
      ClientOptions options;
      options.address = "127.0.0.1:" + std::to_string(port);
      options.job = kJob;
      options.token = token;
      options.member_id = member;
      options.tls_ca_pem = ca_pem;
      return RendezvousClient::Connect(options);
    };
    auto client = connect("w-0", kToken);
    auto stranger = connect("w-1", "not-the-token");
    if (!client.ok() || !stranger.ok()) {
      std::cerr << "connect failed\n";
      kill(child, SIGKILL);
      return 1;
    }
    auto joined = (*client)->Join(-1, 10000);
    if (!joined.ok()) {
      std::cerr << joined.status() << "\n";
      kill(child, SIGKILL);
      return 1;
    }
    auto store = (*client)->GenerationStore(joined->generation);
    auto strangers_store = (*stranger)->GenerationStore(joined->generation);
    for (int i = 0; i < 10; ++i) (void)store->Set("small/" + std::to_string(i), "x", 5000);
    std::cout << "| phase (" << (tls ? "TLS" : "plaintext")
              << ") | service VmRSS (MiB) | service VmHWM (MiB) | result |\n"
                 "|---|---|---|---|\n";
    auto row = [&](const std::string& phase, const std::string& result) {
      const auto memory = ReadProcessMemory(child);
      std::printf("| %s | %.1f | %.1f | %s |\n", phase.c_str(), memory.resident_mib,
                  memory.peak_mib, result.c_str());
    };
    auto code = [](const lockstep::Status& s) {
      return s.ok() ? std::string("ACCEPTED") : std::string(lockstep::StatusCodeName(s.code()));
    };
    row("joined, 10 small writes", "ok");
    const double peak_before_stranger = ReadProcessMemory(child).peak_mib;
    const std::string big(big_mib << 20, 'x');
    const std::string size = std::to_string(big_mib) + " MiB";
    lockstep::Status refused = strangers_store->Set("big", big, 30000);
    // Over TLS a stranger is refused from its metadata (TokenGate), before its body is held: its
    // write does not raise the service's peak by anything like its size.
    const double stranger_growth = ReadProcessMemory(child).peak_mib - peak_before_stranger;
    const bool stranger_held = tls && stranger_growth > static_cast<double>(big_mib) / 2;
    row("a stranger's " + size + " write (wrong token)", code(refused));
    bool all_refused = !refused.ok();
    for (int i = 0; i < 10; ++i) all_refused &= !strangers_store->Set("big", big, 30000).ok();
    row("ten more of the stranger's", all_refused ? code(refused) : "ACCEPTED");
    refused = store->Set("big", big, 30000);
    all_refused &= !refused.ok();
    row("a member's " + size + " write", code(refused));
    for (int i = 0; i < 10; ++i) all_refused &= !store->Set("big", big, 30000).ok();
    row("ten more of the member's", all_refused ? code(refused) : "ACCEPTED");
    const std::string mesh(50000 * 136, 'a');
    lockstep::Status accepted = store->Set("mesh", mesh, 10000);
    auto read_back = store->Get({"mesh"}, 10000);
    const bool mesh_ok = accepted.ok() && read_back.ok() && (*read_back)[0].size() == mesh.size();
    row("6.5 MiB write (Gloo mesh at the replicas bound), read back", mesh_ok ? "ok" : "FAILED");
    if (stranger_held) {
      std::cerr << "the service's peak grew by " << stranger_growth << " MiB for a stranger's "
                << size << " write over TLS: it was held before being refused\n";
    }
    status = all_refused && mesh_ok && !stranger_held ? 0 : 1;
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return status;
}
