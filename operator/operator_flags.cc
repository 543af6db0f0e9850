#include "operator/operator_flags.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <sstream>

#include "common/command_line.h"
#include "operator/trainingjob/reconciler.h"

namespace lockstep::op {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// "a,b" -> {"a", "b"}; "" -> {} (ranks in the order pods join); an empty key is refused.
StatusOr<std::vector<std::string>> TopologyKeys(const std::string& list) {
  std::vector<std::string> keys;
  if (list.empty()) return keys;
  std::istringstream items(list + ",");  // so that a trailing empty key is read too
  for (std::string key; std::getline(items, key, ',');) {
    if (key.empty()) {
      return InvalidArgumentError("--topology-keys: an empty key in \"" + list + "\"");
    }
    keys.push_back(key);
  }
  return keys;
}

}  // namespace

StatusOr<OperatorCommandLine> ParseOperatorFlags(int argc, const char* const* argv) {
  OperatorCommandLine line;
  Flags& f = line.flags;
  CLI::App app{
      "Reconciles TrainingJobs into worker pods and hosts their rendezvous service. "
      "In a pod (no --kubeconfig) it uses the service account. Exits 0 after SIGTERM "
      "or SIGINT, 1 when it loses leadership, 2 on bad flags or configuration. "
      "`lockstep-operator check --help`: check an installed operator (what `helm test` runs).",
      "lockstep-operator"};
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  const auto port = CLI::Range(0, 65535);

  app.add_option("--kubeconfig", f.kubeconfig,
                 "kubeconfig to use (default: the in-cluster service account)")
      ->type_name("FILE");
  app.add_option("--watch-namespace", f.watch_namespace,
                 "only this namespace's TrainingJobs (default: all)")
      ->type_name("NS");
  AddBooleanFlag(app, "--leader-elect", f.leader_elect,
                 "run leader election (--leader-elect=false: not)");
  app.add_option("--leader-election-namespace", f.leader_election_namespace,
                 "namespace of the Lease (default: $POD_NAMESPACE, else default)")
      ->type_name("NS");
  app.add_option("--leader-election-id", f.leader_election_id, "name of the Lease")
      ->type_name("NAME");
  app.add_option("--identity", f.identity,
                 "this replica's identity (default: $POD_NAME, else the host name and pid)")
      ->type_name("ID");
  app.add_option("--metrics-port", f.metrics_port, "/metrics, /healthz, /readyz (0: a free port)")
      ->transform(DecimalInteger())
      ->check(port)
      ->type_name("PORT");
  app.add_option("--metrics-host", f.metrics_host, "address to bind it")->type_name("HOST");
  app.add_option("--rendezvous-port", f.rendezvous_port,
                 "the rendezvous gRPC service (0: a free port)")
      ->transform(DecimalInteger())
      ->check(port)
      ->type_name("PORT");
  app.add_option("--rendezvous-host", f.rendezvous_host, "address to bind it")->type_name("HOST");
  app.add_option("--rendezvous-address", f.rendezvous_address,
                 "what workers dial (default: "
                 "lockstep-rendezvous.$POD_NAMESPACE.svc:<rendezvous-port>)")
      ->type_name("HOST:PORT");
  app.add_option("--rendezvous-service", f.rendezvous_service,
                 "workers dial this Service's cluster IP (in the leader election namespace) "
                 "instead: no cluster DNS needed")
      ->type_name("NAME");
  AddBooleanFlag(app, "--rendezvous-insecure", f.rendezvous_insecure,
                 "plaintext rendezvous (no TLS; development only)");
  app.add_option("--rendezvous-heartbeat-timeout-ms", f.heartbeat_timeout_ms,
                 "how long a worker may send no heartbeat before its generation ends")
      ->transform(DecimalInteger())
      ->check(CLI::Range(int64_t{500}, int64_t{600000}))
      ->type_name("MS");
  app.add_option("--webhook-port", f.webhook_port,
                 "HTTPS admission webhook for TrainingJobs (0: none; the chart serves it on 9443)")
      ->transform(DecimalInteger())
      ->check(port)
      ->type_name("PORT");
  app.add_option("--webhook-host", f.webhook_host, "address to bind it")->type_name("HOST");
  app.add_option("--webhook-service", f.webhook_service,
                 "the Service the API server calls it through, in the operator's namespace: the "
                 "names on its serving certificate")
      ->type_name("NAME");
  app.add_option("--webhook-configuration", f.webhook_configuration,
                 "ValidatingWebhookConfiguration whose caBundle this operator keeps set to its "
                 "CA (default: none)")
      ->type_name("NAME");
  app.add_option("--webhook-ca-check-ms", f.webhook_ca_check_ms,
                 "how often that caBundle is checked")
      ->transform(DecimalInteger())
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->type_name("MS");
  app.add_option("--operator-secret", f.operator_secret,
                 "Secret holding the CA and master key, in the leader election namespace")
      ->type_name("NAME");
  app.add_option("--worker-image", f.worker_image,
                 "image for jobs that name none (spec.image, or the template's worker "
                 "container's image)")
      ->type_name("IMAGE");
  app.add_option("--agent-image", f.agent_image,
                 "image whose init container brings the exec agent into a command job's own "
                 "image (the Dockerfile's agent stage)")
      ->type_name("IMAGE");
  app.add_option("--workers", f.workers, "concurrent reconciles")
      ->transform(DecimalInteger())
      ->check(CLI::Range(1, 256))
      ->type_name("N");
  app.add_option("--io-threads", f.io_threads, "HTTP client I/O threads")
      ->transform(DecimalInteger())
      ->check(CLI::Range(1, 256))
      ->type_name("N");
  // Whole numbers, as before: a rate of 2.5 is refused, not rounded.
  int64_t qps = static_cast<int64_t>(f.qps);
  app.add_option("--qps", qps, "API client rate limit, requests per second")
      ->transform(DecimalInteger())
      ->check(CLI::Range(int64_t{0}, int64_t{100000}))
      ->type_name("Q");
  app.add_option("--burst", f.burst, "API client burst")
      ->transform(DecimalInteger())
      ->check(CLI::Range(1, 100000))
      ->type_name("B");
  app.add_option("--gang-scheduler-name-volcano", f.volcano_scheduler,
                 "the scheduler name of spec.gangScheduling volcano")
      ->type_name("NAME");
  app.add_option("--gang-scheduler-name-scheduler-plugins", f.scheduler_plugins_scheduler,
                 "the scheduler name of spec.gangScheduling scheduler-plugins")
      ->type_name("NAME");
  app.add_option("--progress-interval-ms", f.progress_interval_ms,
                 "how often running jobs' progress is written")
      ->transform(DecimalInteger())
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->type_name("MS");
  app.add_option("--node-loss-toleration-seconds", f.node_loss_toleration_seconds,
                 "how long worker pods stay bound to a node that is not-ready or unreachable "
                 "before they are evicted (-1: the cluster's default, 300)")
      ->transform(DecimalInteger())
      ->check(CLI::Range(int64_t{-1}, int64_t{86400}))
      ->type_name("S");
  std::string topology_keys;
  CLI::Option* topology_keys_option =
      app.add_option("--topology-keys", topology_keys,
                     "node label keys, coarse to fine, whose values (then the node's name) order "
                     "a job's ranks so that ring neighbours share a switch; --topology-keys= "
                     "numbers pods as they join (default: the zone labels and EKS', GKE's and "
                     "NVIDIA topograph's network layers)")
          ->expected(0, 1)
          ->type_name("K1,K2,...");

  const CommandLineParse parsed = ParseCommandLine(app, {argv + 1, argv + argc});
  if (parsed.help) {
    line.help = true;
    line.usage = app.help();
    return line;
  }
  if (!parsed.error.empty()) return InvalidArgumentError(parsed.error + " (see --help)");
  f.qps = static_cast<double>(qps);
  if (topology_keys_option->count() > 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(f.topology_keys, TopologyKeys(topology_keys));
  } else {
    f.topology_keys = trainingjob::DefaultTopologyKeys();
  }
  if (f.leader_election_namespace.empty()) f.leader_election_namespace = Env("POD_NAMESPACE");
  if (f.leader_election_namespace.empty()) f.leader_election_namespace = "default";
  if (f.identity.empty()) f.identity = Env("POD_NAME");
  if (f.identity.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    f.identity = std::string(host) + "-" + std::to_string(getpid());
  }
  return line;
}

}  // namespace lockstep::op
