// What one client's oversized requests cost the rendezvous service in resident memory.
//
// The service runs in a child process (as the operator hosts it: one process, many jobs), with
// one job; this process is its client. The child's VmRSS and VmHWM (/proc/<pid>/status) are read
// after each phase:
//   1. joined and a few small store writes (baseline);
//   2. one 64 MiB store write (refused: RESOURCE_EXHAUSTED, larger than the protocol needs);
//   3. ten more;
//   4. a write of what the protocol does need at its bound (Gloo's full-mesh address list at the
//      replicas bound: 50,000 x 136 bytes = 6.5 MiB), accepted, and read back.
//
//   rendezvous_message_memory_bench            # prints a Markdown table
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "common/rendezvous/client.h"
#include "common/rendezvous/server.h"

namespace {

using lockstep::rendezvous::ClientOptions;
using lockstep::rendezvous::JobConfig;
using lockstep::rendezvous::RendezvousClient;
using lockstep::rendezvous::RendezvousServer;
using lockstep::rendezvous::ServerOptions;

constexpr char kJob[] = "default/memory";
constexpr char kToken[] = "bench-token";

// VmRSS and VmHWM of `pid`, in MiB.
std::pair<double, double> ResidentMiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  double rss = -1, hwm = -1;
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stod(line.substr(6)) / 1024.0;
    if (line.rfind("VmHWM:", 0) == 0) hwm = std::stod(line.substr(6)) / 1024.0;
  }
  return {rss, hwm};
}

// The child: hosts the service, writes its port to `fd`, waits to be killed.
[[noreturn]] void Serve(int fd) {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
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
  // The oversized write, in MiB (default 64: the size the issue measured).
  const size_t big_mib = argc > 1 ? static_cast<size_t>(std::stoul(argv[1])) : 64;
  int fds[2];
  if (pipe(fds) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    Serve(fds[1]);
  }
  close(fds[1]);
  int port = 0;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port) || port == 0) {
    std::cerr << "the service did not start\n";
    return 1;
  }
  int status = 1;
  {
    ClientOptions options;
    options.address = "127.0.0.1:" + std::to_string(port);
    options.job = kJob;
    options.token = kToken;
    options.member_id = "w-0";
    auto client = RendezvousClient::Connect(options);
    if (!client.ok()) {
      std::cerr << client.status() << "\n";
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
    for (int i = 0; i < 10; ++i) (void)store->Set("small/" + std::to_string(i), "x", 5000);
    std::cout << "| phase | service VmRSS (MiB) | service VmHWM (MiB) | result |\n"
                 "|---|---|---|---|\n";
    auto row = [&](const std::string& phase, const std::string& result) {
      const auto [rss, hwm] = ResidentMiB(child);
      std::printf("| %s | %.1f | %.1f | %s |\n", phase.c_str(), rss, hwm, result.c_str());
    };
    row("joined, 10 small writes", "ok");
    const std::string big(big_mib << 20, 'x');
    const std::string size = std::to_string(big_mib) + " MiB";
    lockstep::Status refused = store->Set("big", big, 30000);
    row("one " + size + " write", refused.ok() ? "ACCEPTED" : lockstep::StatusCodeName(refused.code()));
    for (int i = 0; i < 10; ++i) refused = store->Set("big", big, 30000);
    row("ten more " + size + " writes",
        refused.ok() ? "ACCEPTED" : lockstep::StatusCodeName(refused.code()));
    const std::string mesh(50000 * 136, 'a');
    lockstep::Status accepted = store->Set("mesh", mesh, 10000);
    auto read_back = store->Get({"mesh"}, 10000);
    row("6.5 MiB write (Gloo mesh at the replicas bound), read back",
        accepted.ok() && read_back.ok() && (*read_back)[0].size() == mesh.size() ? "ok"
                                                                                 : "FAILED");
    status = refused.ok() || !accepted.ok() ? 1 : 0;
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return status;
}
