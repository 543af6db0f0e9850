// While `lockstep run` trains, every local worker serves /metrics on its own port (spec port + i)
// with the contract metric names of docs/architecture.md ("Metrics") and live values.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>
#include <string>

#include "tests/support/process/process.h"

namespace lockstep {
namespace {

using testing::ChildProcess;

// Binds a TCP port on all interfaces (as the metrics endpoint does); 0 picks a free one.
// Returns the bound port, or -1. The socket stays open in *fd.
int BindAnyInterface(int port, int* fd) {
  *fd = socket(AF_INET, SOCK_STREAM, 0);
  if (*fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(*fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(*fd);
    return -1;
  }
  socklen_t len = sizeof(addr);
  getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

// A base port P such that P and P+1 are free right now.
int FreePortPair() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    int fd_a = -1, fd_b = -1;
    const int base = BindAnyInterface(0, &fd_a);
    if (base <= 0 || base >= 65535) {
      if (fd_a >= 0) close(fd_a);
      continue;
    }
    const bool next_free = BindAnyInterface(base + 1, &fd_b) == base + 1;
    close(fd_a);
    if (fd_b >= 0) close(fd_b);
    if (next_free) return base;
  }
  return -1;
}

// GET http://127.0.0.1:port/metrics with a 2 s deadline; "" when unreachable.
std::string ScrapeMetrics(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval timeout{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request =
      "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buffer[8192];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || response.find(" 200 ") == std::string::npos ||
      body == std::string::npos) {
    return "";
  }
  return response.substr(body + 4);
}

// The value of the sample `name{labels}` in a Prometheus text exposition, or -1.
double SampleValue(const std::string& text, const std::string& name, const std::string& labels) {
  const std::string key = name + "{" + labels + "} ";
  const size_t at = text.find("\n" + key);
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + 1 + key.size(), nullptr);
}

TEST(MetricsEndpointTest, EachLocalWorkerServesLiveContractMetricsOnItsOwnPort) {
  const int base_port = FreePortPair();
  ASSERT_GT(base_port, 0) << "no two adjacent free ports";
  const std::string dir = testing::MakeTempDir("lockstep-metrics");
  // Long enough to be scraped mid-run; the test stops it with SIGINT once it has seen enough.
  testing::WriteFile(dir + "/job.yaml",
                     "apiVersion: lockstep.io/v1alpha1\n"
                     "kind: TrainingJob\n"
                     "metadata: {name: metrics-digits}\n"
                     "spec:\n"
                     "  replicas: 2\n"
                     "  trainer:\n"
                     "    model: {type: mlp, hidden: [64]}\n"
                     "    data:\n"
                     "      format: csv\n"
                     "      train: [file:///usr/lib/python3/dist-packages/sklearn/datasets/data/"
                     "digits.csv.gz]\n"
                     "    batchSize: 32\n"
                     "    steps: 1000000\n"
                     "    logIntervalSteps: 10\n"
                     "  metrics: {port: " +
                         std::to_string(base_port) + "}\n");
  ChildProcess run({LOCKSTEP_BINARY, "run", dir + "/job.yaml", "--log-dir", dir + "/logs"}, {});

  const std::string job_label = "job=\"default/metrics-digits\"";
  std::string scraped[2];
  const bool both_training = testing::PollUntil(
      [&] {
        for (int rank = 0; rank < 2; ++rank) {
          // Ranks are assigned by the rendezvous, ports by launch order: accept either pairing.
          scraped[rank] = ScrapeMetrics(base_port + rank);
          if (scraped[rank].empty()) return false;
        }
        for (const std::string& text : scraped) {
          bool steps_counted = false;
          for (const char* rank : {"0", "1"}) {
            const std::string labels = job_label + ",rank=\"" + rank + "\"";
            if (SampleValue(text, "lockstep_train_steps_total", labels) > 0) steps_counted = true;
          }
          if (!steps_counted) return false;
        }
        return true;
      },
      /*timeout_ms=*/60000, /*interval_ms=*/200);
  kill(run.pid(), SIGINT);
  const testing::ProcessResult result = run.Wait(30000);

  ASSERT_TRUE(both_training) << "worker endpoints never showed training steps\nport " << base_port
                             << ":\n"
                             << scraped[0] << "\nport " << base_port + 1 << ":\n"
                             << scraped[1] << "\nlockstep run stderr:\n"
                             << result.err;
  EXPECT_EQ(result.exit_code, 130) << result.err;
  for (const std::string& text : scraped) {
    for (const char* name :
         {"lockstep_train_steps_total", "lockstep_train_samples_total",
          "lockstep_train_samples_per_second", "lockstep_train_loss",
          "lockstep_step_duration_seconds_bucket", "lockstep_allreduce_duration_seconds_bucket",
          "lockstep_allreduce_bytes_total", "lockstep_allreduce_bus_bandwidth_bytes",
          "lockstep_comm_exposed_seconds_bucket", "lockstep_scaling_efficiency",
          "lockstep_world_size", "lockstep_rendezvous_generation", "lockstep_restarts_total",
          "lockstep_checkpoint_duration_seconds", "lockstep_checkpoint_last_step",
          "lockstep_checkpoint_last_success_timestamp_seconds"}) {
      EXPECT_NE(text.find(std::string("\n") + name), std::string::npos) << name << "\n" << text;
    }
    EXPECT_NE(text.find("lockstep_world_size{" + job_label), std::string::npos) << text;
    // Two workers all-reduce gradients: bytes moved and a positive bus bandwidth.
    const std::regex bytes_moved("lockstep_allreduce_bytes_total\\{[^}]*\\} [1-9]");
    EXPECT_TRUE(std::regex_search(text, bytes_moved)) << text;
  }
}

}  // namespace
}  // namespace lockstep
