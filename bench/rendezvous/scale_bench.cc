// The rendezvous service at cluster scale, measured with simulated members.
//
// The service runs in a child process of its own, as the operator hosts it; this process is the
// load generator: SimulatedMembers (real gRPC clients, one connection each, many per process, each
// with its own heartbeat stream). Both share this machine's cores; the service's CPU time,
// resident memory and thread count come from /proc/<pid>, the generator's from getrusage.
//
// Phases, for each job size N of --sizes (one job of N members; min N/2, initial N, as the
// operator registers an elastic job):
//   join storm   N members join at once; time from the last Join sent to every member holding
//                its generation and rank (connections are made before, as pods that started);
//   nccl         (N in --nccl) NCCL's bootstrap: rank 0 writes the unique id, N-1 ranks wait
//                for it; time from the first call to the last answer;
//   gloo         (N in --gloo) Gloo's full mesh as Lockstep's Gloo communicator does it: one
//                thread and RendezvousClient per rank, each making the communicator's store
//                calls (worker/comm/gloo/pair_addresses.h) with made-up addresses;
//   libgloo      (N in --libgloo) the same through libgloo's own connectFullMesh pattern (a wait
//                and a get of every peer's whole list), which the communicator used before;
//   failure      (N in --failure) one member is killed (its heartbeat stream breaks): time until
//                every survivor holds the next generation;
// and then steady state: --steady M members in M/8 jobs of 8 beating at the operator's default
// interval (1 s): the service's cores and resident memory over --seconds.
//
//   rendezvous_scale_bench [--sizes 256,1024,4096] [--nccl 4096] [--gloo 256,1024]
//                          [--libgloo 256] [--failure 4096] [--steady 10000] [--seconds 20]
//                          [--tls]
// Prints Markdown tables; exits 1 when a phase does not complete or a member saw an error.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/rendezvous/gloo_store_calls.h"
#include "bench/rendezvous/service_process.h"
#include "bench/rendezvous/simulated_members.h"
#include "common/rendezvous/client.h"
#include "common/rendezvous/server.h"
#include "common/tls/certificates.h"

namespace {

using lockstep::Status;
using lockstep::rendezvous::JobConfig;
using lockstep::rendezvous::RendezvousServer;
using lockstep::rendezvous::ServerOptions;
using lockstep::rendezvous::load::Clock;
using lockstep::rendezvous::load::LoadOptions;
using lockstep::rendezvous::load::SimulatedMembers;

constexpr int64_t kPhaseTimeoutMs = 180000;
constexpr int64_t kOperatorHeartbeatIntervalMs = 1000;  // reconciler.h's defaults
constexpr int64_t kOperatorHeartbeatTimeoutMs = 10000;
constexpr int64_t kOperatorLastCallMs = 1000;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::vector<int> ParseList(const std::string& text) {
  std::vector<int> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) values.push_back(std::stoi(item));
  }
  return values;
}

bool Contains(const std::vector<int>& values, int value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// The child: hosts the service and runs the parent's commands, one per line:
//   add <job> <token> <min> <max> <initial>  -> "ok" or "error <message>"
//   remove <job>                             -> "ok" or "error <message>"
[[noreturn]] void Serve(int commands_fd, int replies_fd, const lockstep::tls::KeyPair& tls) {
  ServerOptions options;
  options.tls_cert_pem = tls.cert_pem;
  options.tls_key_pem = tls.key_pem;
  auto server = RendezvousServer::Start(options);
  FILE* commands = fdopen(commands_fd, "r");
  FILE* replies = fdopen(replies_fd, "w");
  std::fprintf(replies, "%d\n", server.ok() ? (*server)->port() : 0);
  std::fflush(replies);
  char* line = nullptr;
  size_t capacity = 0;
  while (server.ok() && getline(&line, &capacity, commands) > 0) {
    std::istringstream in(line);
    std::string verb, job;
    in >> verb >> job;
    Status status;
    if (verb == "add") {
      JobConfig config;
      config.job = job;
      in >> config.token >> config.min_members >> config.max_members >> config.initial_members;
      config.heartbeat_interval_ms = kOperatorHeartbeatIntervalMs;
      config.heartbeat_timeout_ms = kOperatorHeartbeatTimeoutMs;
      config.last_call_ms = kOperatorLastCallMs;
      status = (*server)->AddJob(config);
    } else {
      status = (*server)->RemoveJob(job);
    }
    std::fprintf(replies, "%s\n", status.ok() ? "ok" : ("error " + status.ToString()).c_str());
    std::fflush(replies);
  }
  _exit(0);
}

// The service's process, seen from the parent.
class Service {
 public:
  bool Start(const lockstep::tls::KeyPair& tls) {
    int commands[2], replies[2];
    if (pipe(commands) != 0 || pipe(replies) != 0) return false;
    pid_ = fork();
    if (pid_ == 0) {
      close(commands[1]);
      close(replies[0]);
      Serve(commands[0], replies[1], tls);
    }
    close(commands[0]);
    close(replies[1]);
    commands_ = fdopen(commands[1], "w");
    replies_ = fdopen(replies[0], "r");
    const std::string port = Reply();
    port_ = port.empty() ? 0 : std::stoi(port);
    return port_ != 0;
  }
  ~Service() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  int port() const { return port_; }
  bool Add(const std::string& job, const std::string& token, int min, int max, int initial) {
    std::fprintf(commands_, "add %s %s %d %d %d\n", job.c_str(), token.c_str(), min, max,
                 initial);
    std::fflush(commands_);
    return Checked(Reply());
  }
  bool Remove(const std::string& job) {
    std::fprintf(commands_, "remove %s\n", job.c_str());
    std::fflush(commands_);
    return Checked(Reply());
  }

  // User plus system CPU seconds so far.
  double CpuSeconds() const {
    std::ifstream stat("/proc/" + std::to_string(pid_) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    std::istringstream fields(text.substr(text.rfind(')') + 2));
    std::string field;
    double utime = 0, stime = 0;
    for (int i = 3; fields >> field; ++i) {
      if (i == 14) utime = std::stod(field);
      if (i == 15) {
        stime = std::stod(field);
        break;
      }
    }
    return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  // VmRSS in MiB, and the thread count.
  std::pair<double, int> Resident() const {
    const auto memory = lockstep::rendezvous::load::ReadProcessMemory(pid_);
    return {memory.resident_mib, memory.threads};
  }

 private:
  std::string Reply() {
    char* line = nullptr;
    size_t capacity = 0;
    std::string reply;
    if (getline(&line, &capacity, replies_) > 0) reply = line;
    free(line);
    if (!reply.empty() && reply.back() == '\n') reply.pop_back();
    return reply;
  }
  static bool Checked(const std::string& reply) {
    if (reply == "ok") return true;
    std::cerr << "service: " << reply << "\n";
    return false;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  FILE* commands_ = nullptr;
  FILE* replies_ = nullptr;
};

double OwnCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

// CPU seconds the service and the generator spent between construction and Row().
class CpuMeter {
 public:
  explicit CpuMeter(const Service& service)
      : service_(service), service_start_(service.CpuSeconds()), own_start_(OwnCpuSeconds()) {}
  std::string Row() const {
    char text[64];
    std::snprintf(text, sizeof(text), "%.2f | %.2f", service_.CpuSeconds() - service_start_,
                  OwnCpuSeconds() - own_start_);
    return text;
  }

 private:
  const Service& service_;
  const double service_start_;
  const double own_start_;
};

bool ReportErrors(const SimulatedMembers& members, const std::vector<int>& ids) {
  auto errors = members.Errors(ids);
  for (size_t i = 0; i < std::min<size_t>(errors.size(), 5); ++i) std::cerr << errors[i] << "\n";
  if (errors.size() > 5) std::cerr << "... and " << errors.size() - 5 << " more errors\n";
  return errors.empty();
}

// Every member holds the same generation, a world of `world` and distinct ranks 0..world-1.
bool CheckAssignments(const SimulatedMembers& members, const std::vector<int>& ids, int world) {
  std::set<int> ranks;
  int64_t generation = members.View(ids[0]).generation;
  for (int id : ids) {
    auto view = members.View(id);
    if (view.generation != generation || view.world_size != world) return false;
    ranks.insert(view.rank);
  }
  return static_cast<int>(ranks.size()) == world && *ranks.begin() == 0 &&
         *ranks.rbegin() == world - 1;
}

struct Bench {
  Service& service;
  LoadOptions load;
  std::vector<std::string>& rows;
  bool ok = true;

  void Fail(const std::string& what) {
    std::cerr << "FAILED: " << what << "\n";
    ok = false;
  }

  // NCCL's pattern: one key, written by rank 0, read by every other rank.
  void Nccl(SimulatedMembers& members, const std::vector<int>& by_rank) {
    const int n = static_cast<int>(by_rank.size());
    CpuMeter cpu(service);
    std::atomic<int> answered{0}, failed{0};
    const std::string unique_id(256, 'f');  // ncclUniqueId (128 bytes) in hex
    const auto start = Clock::now();
    std::atomic<int64_t> last{0};
    auto done = [&](const Status& status, std::vector<std::string> values) {
      if (!status.ok() || values.size() != 1 || values[0] != unique_id) failed++;
      last.store(std::max<int64_t>(last.load(), Clock::now().time_since_epoch().count()));
      answered++;
    };
    for (int rank = 1; rank < n; ++rank) {
      members.StoreGet(by_rank[rank], {"nccl/unique-id"}, 60000, done);
    }
    members.StoreSet(by_rank[0], "nccl/unique-id", unique_id, [&](const Status& status) {
      if (!status.ok()) failed++;
    });
    const auto deadline = Clock::now() + std::chrono::milliseconds(kPhaseTimeoutMs);
    while (answered.load() < n - 1 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (answered.load() < n - 1 || failed.load() > 0) return Fail("nccl bootstrap at " + std::to_string(n));
    const double seconds = Seconds(Clock::duration(last.load()) - start.time_since_epoch());
    char row[256];
    std::snprintf(row, sizeof(row), "| NCCL unique id (1 key, %d readers) | %d | %.3f | %s |", n - 1,
                  n, seconds, cpu.Row().c_str());
    rows.push_back(row);
  }

  // Gloo's full mesh: a thread and a RendezvousClient per rank, as each worker would have.
  void Gloo(const std::string& job, const std::string& token, int64_t generation, int n,
            bool libgloo) {
    CpuMeter cpu(service);
    std::vector<std::thread> threads;
    std::atomic<int> failed{0};
    std::string first_error;
    std::mutex error_mu;
    const auto start = Clock::now();
    for (int rank = 0; rank < n; ++rank) {
      threads.emplace_back([&, rank] {
        lockstep::rendezvous::ClientOptions options;
        options.address = load.address;
        options.tls_ca_pem = load.tls_ca_pem;
        options.job = job;
        options.token = token;
        options.member_id = job + "-gloo" + std::to_string(rank);
        auto client = lockstep::rendezvous::RendezvousClient::Connect(options);
        Status status = client.status();
        if (client.ok()) {
          auto store = (*client)->GenerationStore(generation);
          status = libgloo ? lockstep::rendezvous::load::LibglooConnectFullMeshStoreCalls(
                                 *store, rank, n, kPhaseTimeoutMs)
                           : lockstep::rendezvous::load::GlooBootstrapStoreCalls(
                                 *store, rank, n, kPhaseTimeoutMs);
        }
        if (!status.ok()) {
          failed++;
          std::lock_guard<std::mutex> lock(error_mu);
          if (first_error.empty()) first_error = status.ToString();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    const double seconds = Seconds(Clock::now() - start);
    if (failed.load() > 0) return Fail("gloo bootstrap at " + std::to_string(n) + ": " + first_error);
    char row[256];
    std::snprintf(row, sizeof(row), "| %s | %d | %.3f | %s |",
                  libgloo ? "Gloo full mesh, libgloo's connectFullMesh pattern (before)"
                          : "Gloo full mesh, the communicator's exchange",
                  n, seconds, cpu.Row().c_str());
    rows.push_back(row);
  }

  void Job(int n, bool nccl, bool gloo, bool libgloo, bool failure) {
    const std::string job = "bench/storm-" + std::to_string(n);
    const std::string token = "token-" + std::to_string(n);
    if (!service.Add(job, token, std::max(1, n / 2), n, n)) return Fail("add " + job);
    SimulatedMembers members(load);
    const std::vector<int> ids = members.Add(job, token, n);
    if (!members.PreConnect(kPhaseTimeoutMs)) return Fail("connect " + job);
    const auto [rss_before, threads_before] = service.Resident();
    {
      CpuMeter cpu(service);
      const auto first = Clock::now();
      members.Join(ids, /*state_step=*/-1);
      const auto last_sent = Clock::now();
      if (!members.AwaitGeneration(ids, 0, kPhaseTimeoutMs) || !ReportErrors(members, ids)) {
        return Fail("join storm of " + std::to_string(n));
      }
      if (!CheckAssignments(members, ids, n)) return Fail("assignments of " + job);
      const auto formed = members.LatestAssignment(ids);
      const auto [rss, threads] = service.Resident();
      char row[320];
      std::snprintf(row, sizeof(row),
                    "| join storm (from the last join; from the first) | %d | %.3f (%.3f) | %s | "
                    "%.0f -> %.0f MiB, %d threads; answers %.2f MB |",
                    n, Seconds(formed - last_sent), Seconds(formed - first), cpu.Row().c_str(),
                    rss_before, rss, threads, members.join_answer_bytes() / 1e6);
      rows.push_back(row);
    }
    const int64_t generation = members.View(ids[0]).generation;
    std::vector<int> by_rank(n);
    for (int id : ids) by_rank[members.View(id).rank] = id;
    if (nccl) Nccl(members, by_rank);
    if (gloo) Gloo(job, token, generation, n, /*libgloo=*/false);
    if (libgloo) Gloo(job, token, generation, n, /*libgloo=*/true);
    std::vector<int> alive = ids;
    if (failure) {
      const int victim = ids[n / 2];
      alive.erase(std::find(alive.begin(), alive.end(), victim));
      if (!members.AwaitBeats(victim, 2, kPhaseTimeoutMs)) return Fail("the victim never beat");
      CpuMeter cpu(service);
      const auto killed = Clock::now();
      members.Kill(victim);
      if (!members.AwaitGeneration(alive, generation, kPhaseTimeoutMs) ||
          !ReportErrors(members, alive)) {
        return Fail("re-formation after a loss at " + std::to_string(n));
      }
      if (!CheckAssignments(members, alive, n - 1)) return Fail("assignments after the loss");
      char row[256];
      std::snprintf(row, sizeof(row), "| one of %d killed: survivors hold the next generation | %d | %.3f | %s |",
                    n, n - 1, Seconds(members.LatestAssignment(alive) - killed), cpu.Row().c_str());
      rows.push_back(row);
    }
    if (!members.Leave(alive, /*completed=*/true, kPhaseTimeoutMs)) Fail("leave " + job);
    if (!service.Remove(job)) Fail("remove " + job);
  }

  void Steady(int total, int seconds) {
    constexpr int kPerJob = 8;
    const int jobs = total / kPerJob;
    const auto [rss_empty, threads_empty] = service.Resident();
    for (int j = 0; j < jobs; ++j) {
      if (!service.Add("bench/steady-" + std::to_string(j), "token-s" + std::to_string(j),
                       kPerJob / 2, kPerJob, kPerJob)) {
        return Fail("add steady jobs");
      }
    }
    LoadOptions options = load;
    SimulatedMembers members(options);
    std::vector<int> ids;
    for (int j = 0; j < jobs; ++j) {
      auto added = members.Add("bench/steady-" + std::to_string(j), "token-s" + std::to_string(j),
                               kPerJob);
      ids.insert(ids.end(), added.begin(), added.end());
    }
    if (!members.PreConnect(kPhaseTimeoutMs)) return Fail("connect steady members");
    members.Join(ids, -1);
    if (!members.AwaitGeneration(ids, 0, kPhaseTimeoutMs) || !ReportErrors(members, ids)) {
      return Fail("steady members join");
    }
    // Two intervals for every stream to open and settle, then measure.
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * kOperatorHeartbeatIntervalMs));
    const double service_cpu = service.CpuSeconds();
    const double own_cpu = OwnCpuSeconds();
    const int64_t beats = members.beats_sent();
    const auto start = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    const double wall = Seconds(Clock::now() - start);
    const double service_cores = (service.CpuSeconds() - service_cpu) / wall;
    const double own_cores = (OwnCpuSeconds() - own_cpu) / wall;
    const double beats_per_second = static_cast<double>(members.beats_sent() - beats) / wall;
    const auto [rss, threads] = service.Resident();
    if (!ReportErrors(members, ids)) return Fail("steady heartbeats");
    char row[400];
    std::snprintf(row, sizeof(row),
                  "| %d members in %d jobs of %d, interval %lld ms (rank 0 with progress) | "
                  "%.0f beats/s | %.3f | "
                  "%.3f | %.1f MiB (%.1f before; %.1f KiB per member) | %d |",
                  static_cast<int>(ids.size()), jobs, kPerJob,
                  static_cast<long long>(kOperatorHeartbeatIntervalMs), beats_per_second,
                  service_cores, own_cores, rss, rss_empty,
                  (rss - rss_empty) * 1024.0 / static_cast<double>(ids.size()), threads);
    rows.push_back(row);
    if (!members.Leave(ids, true, kPhaseTimeoutMs)) Fail("steady members leave");
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {256, 1024, 4096}, nccl = {4096}, gloo = {256, 1024}, libgloo = {256},
                   failure = {4096};
  int steady = 10000, seconds = 20;
  bool tls = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--sizes") sizes = ParseList(value());
    else if (arg == "--nccl") nccl = ParseList(value());
    else if (arg == "--gloo") gloo = ParseList(value());
    else if (arg == "--libgloo") libgloo = ParseList(value());
    else if (arg == "--failure") failure = ParseList(value());
    else if (arg == "--steady") steady = std::stoi(value());
    else if (arg == "--seconds") seconds = std::stoi(value());
    else if (arg == "--tls") tls = true;
    else {
      std::cerr << "unknown argument " << arg << "\n";
      return 2;
    }
  }
  // Every member has a connection; both processes need a descriptor for each.
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);

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
  Service service;  // forks before this process starts any gRPC thread
  if (!service.Start(serving)) {
    std::cerr << "the service did not start\n";
    return 1;
  }
  std::vector<std::string> rows;
  Bench bench{service, {.address = "127.0.0.1:" + std::to_string(service.port()),
                        .tls_ca_pem = ca_pem},
              rows};
  for (int n : sizes) {
    bench.Job(n, Contains(nccl, n), Contains(gloo, n), Contains(libgloo, n), Contains(failure, n));
    std::cerr << "done: " << n << " members\n";
  }
  std::cout << "| phase (" << (tls ? "TLS" : "plaintext")
            << ") | members | seconds | service CPU s | generator CPU s | service memory |\n"
               "|---|---|---|---|---|---|\n";
  for (const auto& row : rows) std::cout << row << "\n";
  rows.clear();
  if (steady > 0) {
    bench.Steady(steady, seconds);
    std::cout << "\n| steady state (" << (tls ? "TLS" : "plaintext")
              << ") | rate | service cores | generator cores | service VmRSS | service threads |\n"
                 "|---|---|---|---|---|---|\n";
    for (const auto& row : rows) std::cout << row << "\n";
  }
  return bench.ok ? 0 : 1;
}
