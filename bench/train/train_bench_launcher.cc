// train_bench_launcher WORKER_BINARY MANIFEST REPLICAS [--ranks-per-pod N] [--listen ADDRESS]
//                     [--pod-netns NS0,NS1,... --pod-hosts ADDRESS0,ADDRESS1,...]
//                     [--pod-places PLACE0,PLACE1,...]
//
// Hosts a rendezvous service on 127.0.0.1 (or ADDRESS), runs REPLICAS `lockstep-worker train`
// processes (pods) on MANIFEST, waits for them (10 minutes at most) and prints one JSON line with
// the job's final figures as rank 0 reported them at Leave: global samples/s over the timed
// steps, scaling efficiency (compute / step time) and the exposed-communication share of the
// step time. --ranks-per-pod must match the manifest's spec.ranksPerWorker. With --pod-netns,
// pod i runs in network namespace NSi (`ip netns exec`) and announces address i of --pod-hosts
// (LOCKSTEP_HOST), as pods on separate nodes would (bench/pods/run.sh). With --pod-places, pod i
// is told to the rendezvous service at PLACEi (levels joined by '/', coarse to fine, as the
// operator gives a node's topology labels), so ranks follow the places (bench/topology/run.sh).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/rendezvous/server.h"

extern char** environ;

namespace {

// "a,b" -> {"a", "b"} (delimiter ','); "zone-a/rack-1" -> {"zone-a", "rack-1"} (delimiter '/').
std::vector<std::string> Split(const std::string& text, char delimiter) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, delimiter);) parts.push_back(part);
  return parts;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: train_bench_launcher WORKER_BINARY MANIFEST REPLICAS [--ranks-per-pod N] "
      "[--listen ADDRESS] [--pod-netns NS,... --pod-hosts ADDRESS,...] "
      "[--pod-places PLACE,...]\n";
  if (argc < 4 || (argc - 4) % 2 != 0) {
    std::cerr << usage;
    return 2;
  }
  const std::string worker = argv[1], manifest = argv[2];
  const int replicas = std::stoi(argv[3]);
  int ranks_per_pod = 1;
  std::string listen = "127.0.0.1";
  std::vector<std::string> pod_netns, pod_hosts, pod_places;
  for (int i = 4; i < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--ranks-per-pod") {
      ranks_per_pod = std::stoi(value);
    } else if (flag == "--listen") {
      listen = value;
    } else if (flag == "--pod-netns") {
      pod_netns = Split(value, ',');
    } else if (flag == "--pod-hosts") {
      pod_hosts = Split(value, ',');
    } else if (flag == "--pod-places") {
      pod_places = Split(value, ',');
    } else {
      std::cerr << "unknown flag " << flag << "\n" << usage;
      return 2;
    }
  }
  if (pod_netns.size() != pod_hosts.size() ||
      (!pod_netns.empty() && static_cast<int>(pod_netns.size()) != replicas)) {
    std::cerr << "--pod-netns and --pod-hosts need one entry per replica\n";
    return 2;
  }
  if (!pod_places.empty() && static_cast<int>(pod_places.size()) != replicas) {
    std::cerr << "--pod-places needs one entry per replica\n";
    return 2;
  }
  const std::string job = "bench/train", token = "bench-token";
  auto server = lockstep::rendezvous::RendezvousServer::Start({listen + ":0", "", ""});
  if (!server.ok()) {
    std::cerr << server.status() << "\n";
    return 1;
  }
  lockstep::rendezvous::JobConfig config;
  config.job = job;
  config.token = token;
  config.min_members = replicas;
  config.max_members = replicas;
  config.ranks_per_pod = ranks_per_pod;
  config.order_by_topology = !pod_places.empty();
  if (auto status = (*server)->AddJob(config); !status.ok()) {
    std::cerr << status << "\n";
    return 1;
  }
  for (size_t i = 0; i < pod_places.size(); ++i) {
    (*server)->SetPodTopology(job, "bench-" + std::to_string(i), Split(pod_places[i], '/'));
  }

  std::vector<pid_t> pids;
  for (int i = 0; i < replicas; ++i) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    env.push_back("LOCKSTEP_RENDEZVOUS=" + listen + ":" + std::to_string((*server)->port()));
    if (!pod_hosts.empty()) env.push_back("LOCKSTEP_HOST=" + pod_hosts[i]);
    env.push_back("LOCKSTEP_JOB=" + job);
    env.push_back("LOCKSTEP_JOB_TOKEN=" + token);
    env.push_back("LOCKSTEP_POD=bench-" + std::to_string(i));
    env.push_back("LOCKSTEP_METRICS_PORT=0");
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> args{worker, "train", "--manifest", manifest};
    if (!pod_netns.empty()) {
      args.insert(args.begin(), {"/usr/sbin/ip", "netns", "exec", pod_netns[i]});
    }
    std::vector<char*> argp;
    for (std::string& a : args) argp.push_back(a.data());
    argp.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, argp[0], nullptr, nullptr, argp.data(), envp.data()) != 0) {
      std::cerr << "cannot start " << worker << "\n";
      return 1;
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  auto snapshot = (*server)->Snapshot(job);
  (*server)->Shutdown(5000);
  if (failed > 0 || !snapshot.ok()) {
    std::cerr << failed << " worker(s) failed\n";
    return 1;
  }
  const auto& progress = snapshot->final_progress;
  nlohmann::json out{{"world", replicas * ranks_per_pod},
                     {"steps", progress.step},
                     {"samples_per_second", progress.samples_per_second},
                     {"scaling_efficiency", progress.scaling_efficiency},
                     {"comm_exposed_fraction", progress.comm_exposed_fraction},
                     {"wire_bytes_per_step", progress.wire_bytes_per_step},
                     {"eval_accuracy", progress.eval_accuracy},
                     {"final_loss", progress.loss}};
  std::cout << out.dump() << std::endl;
  return 0;
}
