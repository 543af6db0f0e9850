// lockstep-operator's command line: its flags with their defaults, parsed by CLI11, and the
// defaults the pod's environment gives the lease's namespace and the replica's identity.
//
//   StatusOr<OperatorCommandLine> line = ParseOperatorFlags(argc, argv);
//   if (!line.ok()) { std::cerr << "lockstep-operator: " << line.status().message(); return 2; }
//   if (line->help) { std::cout << line->usage; return 0; }
//
// A bad value, a missing value or an unknown flag is INVALID_ARGUMENT naming the flag and the
// value ("--metrics-port: Value 70000 not in range 0 to 65535"). A flag given twice keeps its
// last value. Boolean flags take `--flag` or `--flag=true|false`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep::op {

struct Flags {
  std::string kubeconfig;
  std::string watch_namespace;
  bool leader_elect = true;
  std::string leader_election_namespace;  // default: $POD_NAMESPACE, else "default"
  std::string leader_election_id = "lockstep-operator";
  std::string identity;  // default: $POD_NAME, else the host name and pid
  int metrics_port = 8080;
  std::string metrics_host = "0.0.0.0";
  int rendezvous_port = 7443;
  std::string rendezvous_host = "0.0.0.0";
  std::string rendezvous_address;
  std::string rendezvous_service;
  bool rendezvous_insecure = false;
  int webhook_port = 0;
  std::string webhook_host = "0.0.0.0";
  std::string webhook_service = "lockstep-webhook";
  std::string webhook_configuration;
  int64_t webhook_ca_check_ms = 10000;
  std::string operator_secret = "lockstep-operator";
  std::string worker_image = "lockstep-worker:0.1";
  std::string agent_image = "lockstep-agent:0.1";
  int workers = 4;
  int io_threads = 4;
  double qps = 50;
  int burst = 100;
  std::string volcano_scheduler = "volcano";
  std::string scheduler_plugins_scheduler = "scheduler-plugins-scheduler";
  int64_t progress_interval_ms = 10000;
  int64_t node_loss_toleration_seconds = 30;
  int64_t heartbeat_timeout_ms = 10000;
  std::vector<std::string> topology_keys;  // default: trainingjob::DefaultTopologyKeys()
};

struct OperatorCommandLine {
  Flags flags;
  bool help = false;  // --help or -h: print `usage` and exit 0
  std::string usage;  // generated from the flags' definitions
};

StatusOr<OperatorCommandLine> ParseOperatorFlags(int argc, const char* const* argv);

}  // namespace lockstep::op
