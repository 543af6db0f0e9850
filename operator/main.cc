// lockstep-operator: reconciles TrainingJobs into worker pods and hosts their rendezvous service.
//
//   lockstep-operator [--kubeconfig FILE] [--watch-namespace NS] [--leader-elect=false] ...
//
// In a pod (no --kubeconfig) it uses the service account. Flags are listed by --help and in
// docs/operator.md. Exits 0 after SIGTERM/SIGINT (the lease released for a standby); 1 when it
// loses leadership (the kubelet restarts it as a standby: the safe way never to act beside a new
// leader); 2 on bad flags or configuration.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/http/http_endpoint.h"
#include "common/logging.h"
#include "common/rendezvous/server.h"
#include "operator/controller/controller.h"
#include "operator/controller/event_recorder.h"
#include "operator/controller/expectations.h"
#include "operator/controller/informer.h"
#include "operator/controller/leader_election.h"
#include "operator/controller/work_queue.h"
#include "operator/kube/kube_client.h"
#include "operator/kube/kube_config.h"
#include "operator/check/check_command.h"
#include "operator/operator_flags.h"
#include "operator/operator_identity.h"
#include "operator/operator_metrics.h"
#include "operator/rendezvous_address.h"
#include "operator/trainingjob/admission.h"
#include "operator/trainingjob/reconciler.h"
#include "operator/webhook/ca_bundle.h"
#include "operator/webhook/webhook_server.h"

namespace lockstep::op {
namespace {

using json = nlohmann::json;

constexpr char kPhaseIndex[] = "phase";  // jobs informer: status.phase ("Pending" when unset)
// Where the API server sends TrainingJob admission reviews (the chart's webhook clientConfig).
constexpr char kValidateTrainingJobPath[] = "/validate-trainingjob";

// Signals go to one waiting thread (main), never to a library's thread.
sigset_t BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

class Operator {
 public:
  Operator(Flags flags) : flags_(std::move(flags)) {}
  // Start may fail after the caBundle keeper started; it must not outlive the operator.
  ~Operator() { StopCaBundleKeeper(); }

  Status Start() {
    StatusOr<kube::KubeConfig> config = flags_.kubeconfig.empty()
                                            ? kube::InClusterConfig()
                                            : kube::LoadKubeconfig(flags_.kubeconfig);
    if (!config.ok()) return config.status();
    kube::ClientOptions client_options;
    client_options.qps = flags_.qps;
    client_options.burst = flags_.burst;
    LOCKSTEP_ASSIGN_OR_RETURN(client_, kube::KubeClient::Create(*config, client_options));

    LOCKSTEP_ASSIGN_OR_RETURN(
        identity_, LoadOrCreateOperatorIdentity(client_.get(), flags_.leader_election_namespace,
                                                flags_.operator_secret, 30000));
    // With --rendezvous-service the certificate also names the Service (and the default
    // address), which workers started by an operator before it dial: they keep training across
    // an upgrade.
    std::vector<std::string> service_names;
    if (flags_.rendezvous_address.empty() && !flags_.rendezvous_service.empty()) {
      LOCKSTEP_ASSIGN_OR_RETURN(
          flags_.rendezvous_address,
          RendezvousServiceAddress(client_.get(), flags_.leader_election_namespace,
                                   flags_.rendezvous_service, 60000));
      const std::string& ns = flags_.leader_election_namespace;
      for (const std::string& service :
           {flags_.rendezvous_service, std::string("lockstep-rendezvous")}) {
        for (const std::string& name : {service + "." + ns, service + "." + ns + ".svc",
                                        service + "." + ns + ".svc.cluster.local"}) {
          service_names.push_back(name);
        }
        service_names.push_back(service);
      }
      if (flags_.rendezvous_port == 0) {
        return InvalidArgumentError(
            "--rendezvous-service needs a fixed --rendezvous-port (the Service's target)");
      }
    }
    if (flags_.rendezvous_address.empty()) {
      flags_.rendezvous_address = "lockstep-rendezvous." + flags_.leader_election_namespace +
                                  ".svc:" + std::to_string(flags_.rendezvous_port);
    }
    rendezvous::ServerOptions server_options;
    server_options.listen_address =
        flags_.rendezvous_host + ":" + std::to_string(flags_.rendezvous_port);
    if (!flags_.rendezvous_insecure) {
      LOCKSTEP_ASSIGN_OR_RETURN(
          tls::KeyPair serving,
          IssueRendezvousCertificate(identity_, flags_.rendezvous_address, service_names));
      server_options.tls_cert_pem = serving.cert_pem + identity_.ca.cert_pem;
      server_options.tls_key_pem = serving.key_pem;
    }
    LOCKSTEP_ASSIGN_OR_RETURN(rendezvous_, rendezvous::RendezvousServer::Start(server_options));
    if (flags_.rendezvous_port == 0) {
      // A free port was asked for: workers dial the one we got.
      const std::string& a = flags_.rendezvous_address;
      flags_.rendezvous_address =
          a.substr(0, a.rfind(':') + 1) + std::to_string(rendezvous_->port());
    }
    LOCKSTEP_LOG(INFO) << "rendezvous service on port " << rendezvous_->port() << " ("
                       << (flags_.rendezvous_insecure ? "plaintext" : "TLS") << "), workers dial "
                       << flags_.rendezvous_address;

    // Listening before /readyz answers: the webhook Service routes to ready pods only.
    LOCKSTEP_RETURN_IF_ERROR(StartWebhook(*config, client_options));
    LOCKSTEP_ASSIGN_OR_RETURN(
        endpoint_, http::HttpEndpoint::Start(
                       flags_.metrics_host, flags_.metrics_port,
                       {{"/metrics", http::PrometheusHandler(metrics_.registry())},
                        {"/healthz",
                         [] {
                           return http::HttpResponse{200, "text/plain", "ok\n"};
                         }},
                        {"/readyz", [this] {
                           // A standby is ready (it serves metrics and waits for the lease); a
                           // leader is ready once its caches are synced.
                           if (leading_.load() && !synced_.load()) {
                             return http::HttpResponse{503, "text/plain", "caches syncing\n"};
                           }
                           return http::HttpResponse{200, "text/plain", "ok\n"};
                         }}}));
    LOCKSTEP_LOG(INFO) << "metrics, healthz and readyz on port " << endpoint_->port();

    if (flags_.leader_elect) {
      // A replica restarted in the pod of a leader that died (a crash, a failed liveness probe)
      // still carries its label: the rendezvous Service would send new workers to a replica that
      // hosts no job. Only the leader wears it, so a replica starts without it.
      SetLeaderLabel(false);
      controller::LeaderElectionOptions election;
      election.lease_namespace = flags_.leader_election_namespace;
      election.lease_name = flags_.leader_election_id;
      election.identity = flags_.identity;
      // Its own client: a renew must give up before renew_deadline_ms, so that this replica
      // stops leading before another may take over (the default request timeout is longer).
      kube::ClientOptions election_client = client_options;
      election_client.request_timeout_ms = std::min<int64_t>(5000, election.renew_deadline_ms / 2);
      LOCKSTEP_ASSIGN_OR_RETURN(election_client_,
                                kube::KubeClient::Create(*config, election_client));
      elector_ = std::make_unique<controller::LeaderElector>(election_client_.get(), election);
      elector_->Run([this] { StartLeading(); }, [this] { LostLeadership(); });
    } else {
      StartLeading();
    }
    return OkStatus();
  }

  // Returns the process exit code.
  int Wait(const sigset_t& signals) {
    // The gauges walk every job and its rendezvous snapshot: once a second is plenty for a
    // scrape, where every 200 ms tick cost 5,000 snapshots a second at 1,000 jobs.
    double gauges_updated_at = 0;
    while (true) {
      timespec tick{0, 200 * 1000 * 1000};
      int signal_number = sigtimedwait(&signals, nullptr, &tick);
      if (signal_number == SIGTERM || signal_number == SIGINT) {
        LOCKSTEP_LOG(INFO) << "received signal " << signal_number << "; stopping";
        Stop();
        return 0;
      }
      if (lost_.load()) {
        LOCKSTEP_LOG(ERROR) << "lost the leader lease; exiting so that only the new leader acts";
        Stop();
        return 1;
      }
      if (MonotonicSeconds() - gauges_updated_at >= 1.0) {
        UpdateGauges();
        gauges_updated_at = MonotonicSeconds();
      }
    }
  }

 private:
  void StartLeading() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (leading_.exchange(true)) return;
    LOCKSTEP_LOG(INFO) << "leading as " << flags_.identity;
    metrics_.SetLeader(true);
    SetLeaderLabel(true);

    events_ = std::make_unique<controller::EventRecorder>(client_.get(), "lockstep-operator");
    controller::InformerOptions job_options;
    job_options.resource = kube::resources::kTrainingJobs;
    job_options.ns = flags_.watch_namespace;
    job_options.transform = trainingjob::TrimJob;
    jobs_ = std::make_unique<controller::Informer>(client_.get(), job_options);
    controller::InformerOptions pod_options;
    pod_options.resource = kube::resources::kPods;
    pod_options.ns = flags_.watch_namespace;
    pod_options.label_selector = trainingjob::kJobNameLabel;
    pod_options.transform = trainingjob::TrimPod;
    pods_ = std::make_unique<controller::Informer>(client_.get(), pod_options);
    pods_->AddIndex(trainingjob::kJobIndex, trainingjob::JobIndexOfPod);
    // For the jobs-by-phase gauge, counted without unpacking every job once a second.
    jobs_->AddIndex(kPhaseIndex, [](const json& job) {
      std::string phase = "Pending";
      auto status = job.find("status");
      if (status != job.end() && status->is_object()) phase = status->value("phase", "Pending");
      return std::vector<std::string>{phase};
    });

    trainingjob::ReconcilerDeps deps;
    deps.client = client_.get();
    deps.jobs = jobs_.get();
    deps.pods = pods_.get();
    deps.expectations = &expectations_;
    deps.events = events_.get();
    deps.rendezvous = rendezvous_.get();
    deps.metrics = &metrics_;
    deps.has_podgroup_crds_volcano = ResourceServed(kube::resources::kVolcanoPodGroups);
    deps.has_podgroup_crds_scheduler_plugins =
        ResourceServed(kube::resources::kSchedulerPluginsPodGroups);
    trainingjob::ReconcilerOptions options;
    options.settings.rendezvous_address = flags_.rendezvous_address;
    if (!flags_.rendezvous_insecure) options.settings.rendezvous_ca_pem = identity_.ca.cert_pem;
    options.settings.default_worker_image = flags_.worker_image;
    options.settings.agent_image = flags_.agent_image;
    options.settings.volcano_scheduler_name = flags_.volcano_scheduler;
    options.settings.scheduler_plugins_scheduler_name = flags_.scheduler_plugins_scheduler;
    options.settings.node_loss_toleration_seconds = flags_.node_loss_toleration_seconds;
    options.master_key = identity_.master_key;
    if (!flags_.rendezvous_insecure) options.ca_key_pem = identity_.ca.key_pem;
    options.progress_interval_ms = flags_.progress_interval_ms;
    options.rendezvous_heartbeat_timeout_ms = flags_.heartbeat_timeout_ms;
    options.topology_keys = flags_.topology_keys;
    reconciler_ = std::make_unique<trainingjob::TrainingJobReconciler>(deps, options);

    jobs_->AddHandler([this](const json* old_job, const json* new_job) {
      queue_.Add(controller::ObjectKey(new_job ? *new_job : *old_job));
    });
    pods_->AddHandler([this](const json* old_pod, const json* new_pod) {
      std::string key = reconciler_->OnPodEvent(old_pod, new_pod);
      if (!key.empty()) queue_.Add(key);
    });
    controller::ControllerHooks hooks;
    hooks.on_reconciled = [this](double seconds, bool ok) {
      metrics_.ObserveReconcile(seconds, ok);
    };
    controller_ = std::make_unique<controller::Controller>(
        "trainingjob", &queue_, reconciler_.get(), flags_.workers, hooks);
    // Start the caches, and the workers only once both are synced: a reconcile against an empty
    // pod cache would create every pod again.
    pods_->Start();
    jobs_->Start();
    sync_thread_ = std::thread([this] {
      while (!stopping_.load()) {
        if (pods_->WaitForSync(500) && jobs_->WaitForSync(500)) break;
      }
      if (stopping_.load()) return;
      synced_.store(true);
      LOCKSTEP_LOG(INFO) << "caches synced: " << jobs_->Size() << " TrainingJobs, " << pods_->Size()
                         << " worker pods";
      controller_->Start();
    });
  }

  void LostLeadership() { lost_.store(true); }

  // Every replica serves the webhook (the chart's Service spreads calls over the ready ones):
  // a review needs no cache, only the spec model and, for a scale, one read of the job.
  Status StartWebhook(const kube::KubeConfig& config, const kube::ClientOptions& client_options) {
    if (flags_.webhook_port == 0) return OkStatus();
    // Its own client: a scale review's GET and the caBundle check must answer well within the
    // API server's webhook timeout, and not queue behind the reconciler's rate limit.
    kube::ClientOptions webhook_client = client_options;
    webhook_client.request_timeout_ms = 3000;
    LOCKSTEP_ASSIGN_OR_RETURN(webhook_client_, kube::KubeClient::Create(config, webhook_client));
    LOCKSTEP_ASSIGN_OR_RETURN(tls::KeyPair serving,
                              IssueWebhookCertificate(identity_, flags_.webhook_service,
                                                      flags_.leader_election_namespace));
    webhook::WebhookServerOptions options;
    options.host = flags_.webhook_host;
    options.port = flags_.webhook_port;
    options.cert_pem = serving.cert_pem + identity_.ca.cert_pem;
    options.key_pem = serving.key_pem;
    LOCKSTEP_ASSIGN_OR_RETURN(
        webhook_, webhook::WebhookServer::Start(
                      options, {{kValidateTrainingJobPath,
                                 [this](const std::string& body) { return Admit(body); }}}));
    LOCKSTEP_LOG(INFO) << "admission webhook on port " << webhook_->port() << " ("
                       << kValidateTrainingJobPath << ")";
    if (!flags_.webhook_configuration.empty()) {
      ca_bundle_thread_ = std::thread([this] { KeepWebhookCaBundle(); });
    }
    return OkStatus();
  }

  http::HttpResponse Admit(const std::string& body) {
    const double start = MonotonicSeconds();
    trainingjob::AdmissionReply reply = trainingjob::ReviewTrainingJobAdmission(
        body, [this](const std::string& ns, const std::string& name) {
          return webhook_client_->Get(kube::resources::kTrainingJobs, ns, name);
        });
    const bool answered = reply.http_status == 200;
    metrics_.ObserveAdmission(MonotonicSeconds() - start, !answered       ? "error"
                                                          : reply.allowed ? "allowed"
                                                                          : "denied");
    if (!answered) {
      const std::string why = reply.body.get<std::string>();
      LOCKSTEP_LOG(WARNING) << "admission review answered " << reply.http_status << ": " << why;
      return http::HttpResponse{reply.http_status, "text/plain; charset=utf-8", why + "\n"};
    }
    return http::HttpResponse{200, "application/json", reply.body.dump()};
  }

  // Writes the CA into the configuration at start, then checks it every webhook_ca_check_ms (a
  // GET; a write only when it differs): a configuration created after the operator started, or
  // reset by a reinstall (an upgrade keeps what it finds), trusts the CA within one period.
  void KeepWebhookCaBundle() {
    bool reported_missing = false;
    std::unique_lock<std::mutex> lock(ca_bundle_mutex_);
    while (!stopping_.load()) {
      lock.unlock();
      StatusOr<bool> wrote = webhook::EnsureWebhookCaBundle(
          webhook_client_.get(), flags_.webhook_configuration, identity_.ca.cert_pem);
      if (wrote.ok() && *wrote) {
        LOCKSTEP_LOG(INFO) << "set the caBundle of ValidatingWebhookConfiguration "
                           << flags_.webhook_configuration;
      } else if (kube::IsNotFound(wrote.status())) {
        if (!reported_missing) {
          LOCKSTEP_LOG(INFO) << "no ValidatingWebhookConfiguration " << flags_.webhook_configuration
                             << " (yet); checking again every " << flags_.webhook_ca_check_ms
                             << " ms";
        }
        reported_missing = true;
      } else if (!wrote.ok()) {
        LOCKSTEP_LOG(WARNING) << "keeping the webhook caBundle: " << wrote.status().message();
      }
      if (wrote.ok()) reported_missing = false;
      lock.lock();
      ca_bundle_wake_.wait_for(lock, std::chrono::milliseconds(flags_.webhook_ca_check_ms),
                               [this] { return stopping_.load(); });
    }
  }

  bool ResourceServed(const kube::Resource& resource) {
    kube::ListOptions options;
    options.limit = 1;
    StatusOr<kube::ListResult> list = client_->List(resource, "", options);
    if (list.ok()) return true;
    if (kube::IsNotFound(list.status())) {
      LOCKSTEP_LOG(INFO) << resource.plural << "." << resource.group
                         << " is not served: jobs asking for that gang scheduler will fail";
      return false;
    }
    // Forbidden or unavailable: assume it is there and let creation report what is wrong.
    return true;
  }

  void SetLeaderLabel(bool leader) {
    const char* pod_name = std::getenv("POD_NAME");
    if (!pod_name || !*pod_name) return;
    json patch = {
        {"metadata",
         {{"labels", {{"lockstep.io/rendezvous-leader", leader ? json("true") : json()}}}}}};
    StatusOr<json> patched =
        client_->Patch(kube::resources::kPods, flags_.leader_election_namespace, pod_name,
                       kube::PatchType::kMerge, patch);
    if (!patched.ok()) {
      LOCKSTEP_LOG(WARNING) << "labelling this pod as the rendezvous leader: "
                            << patched.status().message();
    }
  }

  void UpdateGauges() {
    metrics_.SetWorkqueueDepth(static_cast<double>(queue_.Len()));
    metrics_.SetLeader(leading_.load() && !lost_.load());
    if (!synced_.load()) return;
    std::map<std::string, int> by_phase;
    for (const auto& [phase, count] : jobs_->CountByIndex(kPhaseIndex)) {
      by_phase[phase] = static_cast<int>(count);
    }
    int64_t members = 0, stragglers = 0, standby = 0;
    for (const std::string& key : jobs_->Keys()) {
      StatusOr<rendezvous::JobSnapshot> snapshot = rendezvous_->Snapshot(key);
      if (!snapshot.ok()) continue;
      members += static_cast<int64_t>(snapshot->members.size());
      stragglers += static_cast<int64_t>(snapshot->stragglers.size());
      standby += rendezvous::StandbyCount(*snapshot);
    }
    metrics_.SetJobsByPhase(by_phase);
    metrics_.SetRendezvousMembers(static_cast<double>(members));
    metrics_.SetStandbyWorkers(static_cast<double>(standby));
    metrics_.SetStragglers(static_cast<double>(stragglers));
  }

  // Sets stopping_ (under the keeper's mutex, so its timed wait cannot miss it) and joins it.
  void StopCaBundleKeeper() {
    {
      std::lock_guard<std::mutex> lock(ca_bundle_mutex_);
      stopping_.store(true);
    }
    ca_bundle_wake_.notify_all();
    if (ca_bundle_thread_.joinable()) ca_bundle_thread_.join();
  }

  void Stop() {
    StopCaBundleKeeper();
    if (sync_thread_.joinable()) sync_thread_.join();
    if (controller_) controller_->Stop();
    queue_.ShutDown();
    if (pods_) pods_->Stop();
    if (jobs_) jobs_->Stop();
    if (events_) events_->Flush(2000);
    if (leading_.load()) SetLeaderLabel(false);
    if (elector_) elector_->Stop();
    if (rendezvous_) rendezvous_->Shutdown(2000);
    webhook_.reset();
  }

  Flags flags_;
  std::unique_ptr<kube::KubeClient> client_;
  std::unique_ptr<kube::KubeClient> election_client_;
  OperatorIdentity identity_;
  OperatorMetrics metrics_;
  std::unique_ptr<rendezvous::RendezvousServer> rendezvous_;
  std::unique_ptr<http::HttpEndpoint> endpoint_;
  std::unique_ptr<kube::KubeClient> webhook_client_;
  std::unique_ptr<webhook::WebhookServer> webhook_;
  std::thread ca_bundle_thread_;
  std::mutex ca_bundle_mutex_;
  std::condition_variable ca_bundle_wake_;
  std::unique_ptr<controller::LeaderElector> elector_;
  controller::WorkQueue queue_;
  controller::Expectations expectations_;
  std::unique_ptr<controller::EventRecorder> events_;
  std::unique_ptr<controller::Informer> jobs_, pods_;
  std::unique_ptr<trainingjob::TrainingJobReconciler> reconciler_;
  std::unique_ptr<controller::Controller> controller_;
  std::thread sync_thread_;
  std::mutex mutex_;
  std::atomic<bool> leading_{false}, synced_{false}, lost_{false}, stopping_{false};
};

}  // namespace
}  // namespace lockstep::op

int main(int argc, char** argv) {
  using namespace lockstep;
  // A write to a connection whose peer is gone fails with EPIPE instead of ending the operator
  // (Boost.Asio already sends with MSG_NOSIGNAL; this covers what does not).
  signal(SIGPIPE, SIG_IGN);
  const sigset_t signals = op::BlockTerminationSignals();
  if (argc > 1 && std::string(argv[1]) == "check") {
    return op::check::RunCheckCommand(argc - 1, argv + 1);
  }
  StatusOr<op::OperatorCommandLine> line = op::ParseOperatorFlags(argc, argv);
  if (!line.ok()) {
    std::cerr << "lockstep-operator: " << line.status().message() << "\n";
    return 2;
  }
  if (line->help) {
    std::cout << line->usage;
    return 0;
  }
  const op::Flags& flags = line->flags;
  SetLogContext("operator " + flags.identity);
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) {
    // glibc gives each busy thread an arena of its own (up to 8 per core); the operator's threads
    // mostly wait, and two arenas hold the same data with less spread: 2 MiB less peak resident
    // memory at 1,000 jobs (docs/benchmarks.md). The variable, when set, still decides.
    mallopt(M_ARENA_MAX, 2);
  }
  if (Status s = op::kube::InitializeIoThreads(static_cast<size_t>(flags.io_threads)); !s.ok()) {
    std::cerr << "lockstep-operator: --io-threads: " << s.message() << "\n";
    return 2;
  }
  op::Operator operator_process(flags);
  if (Status s = operator_process.Start(); !s.ok()) {
    LOCKSTEP_LOG(ERROR) << s.message();
    return 2;
  }
  return operator_process.Wait(signals);
}
