#include "worker/ps/ps_train_command.h"

#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/deadline.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/rendezvous/client.h"
#include "common/rendezvous/client_environment.h"
#include "common/termination_message.h"
#include "worker/agent/wake_pipe.h"
#include "worker/metrics.h"
#include "worker/ps/click_log_file.h"
#include "worker/ps/ps_credentials.h"
#include "worker/ps/ps_job.h"

namespace lockstep::ps {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

LOCKSTEP_PARAM_INT(PsWaitTimeoutMs, "LOCKSTEP_PS_WAIT_TIMEOUT_MS", 300000);
LOCKSTEP_PARAM_INT(PsJoinTimeoutMs, "LOCKSTEP_JOIN_TIMEOUT_MS", 600000);

int Fail(int code, const std::string& message) {
  return ReportFatalError("lockstep-worker", code, message);
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

// Membership of the job's rendezvous beside the training: joins, beats, and when a generation
// ends (a worker lost or back) joins the next one on its own thread.
class Membership {
 public:
  Membership(std::unique_ptr<rendezvous::RendezvousClient> client, std::string job_name)
      : client_(std::move(client)), job_name_(std::move(job_name)) {}
  ~Membership() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      cv_.notify_all();
    }
    if (rejoiner_.joinable()) rejoiner_.join();
  }

  Status Start(int64_t join_timeout_ms) {
    LOCKSTEP_RETURN_IF_ERROR(JoinAndBeat(join_timeout_ms));
    rejoiner_ = std::thread([this, join_timeout_ms] {
      std::unique_lock<std::mutex> lock(mu_);
      while (true) {
        cv_.wait(lock, [this] { return done_ || ended_; });
        if (done_) return;
        ended_ = false;
        lock.unlock();
        Status joined = JoinAndBeat(join_timeout_ms);
        if (!joined.ok()) {
          LOCKSTEP_LOG(WARNING) << "rejoining the rendezvous: " << joined;
        }
        lock.lock();
        // A join that failed is tried again (the training does not depend on it).
        if (!joined.ok() && !done_) {
          ended_ = true;
          cv_.wait_for(lock, std::chrono::seconds(1), [this] { return done_; });
        }
      }
    });
    return OkStatus();
  }

  rendezvous::RendezvousClient& client() { return *client_; }

 private:
  // Joins in slices of at most kJoinSliceMs, so that a Membership being destroyed (the worker
  // exiting) is not held up by a join that waits for a generation.
  Status JoinAndBeat(int64_t join_timeout_ms) {
    constexpr int64_t kJoinSliceMs = 2000;
    const Deadline deadline = Deadline::AfterMs(join_timeout_ms);
    StatusOr<rendezvous::Assignment> joined = DeadlineExceededError("not joined");
    while (true) {
      joined = client_->Join(/*state_step=*/-1,
                             std::max<int64_t>(1, std::min(kJoinSliceMs, deadline.remaining_ms())));
      if (joined.ok() || joined.status().code() != StatusCode::kDeadlineExceeded ||
          deadline.expired()) {
        break;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return CancelledError("leaving");
    }
    if (!joined.ok()) return joined.status();
    const rendezvous::Assignment assignment = *joined;
    SetLogContext("job=" + job_name_ + " rank=" + std::to_string(assignment.rank) +
                  " gen=" + std::to_string(assignment.generation));
    return client_->StartHeartbeat(assignment, [this](const rendezvous::GenerationEnd& end) {
      LOCKSTEP_LOG(INFO) << "generation ended (" << end.reason << "); training goes on";
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
      cv_.notify_all();
    });
  }

  std::unique_ptr<rendezvous::RendezvousClient> client_;
  const std::string job_name_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool ended_ = false;
  bool done_ = false;
  std::thread rejoiner_;
};

}  // namespace

int RunParameterServerWorker(const spec::TrainingJob& job, const std::string& job_name) {
  static std::atomic<bool> stop{false};
  if (Status installed = agent::InstallWakePipe({SIGTERM, SIGINT}); !installed.ok()) {
    return Fail(kExitFailure, installed.ToString());
  }
  static std::atomic<int> signal_number{0};
  std::thread([] {
    while (signal_number.load() == 0) {
      for (unsigned char what : agent::WaitForWakes(/*timeout_ms=*/1000)) {
        signal_number.store(what);
        stop.store(true);
      }
    }
  }).detach();

  PsTrainingOptions options;
  options.job = job;
  options.stop = &stop;
  options.wait_timeout_ms = PsWaitTimeoutMs();
  const std::string index = EnvString("LOCKSTEP_WORKER_INDEX", "");
  char* end = nullptr;
  const long worker = std::strtol(index.c_str(), &end, 10);
  if (index.empty() || *end != '\0' || worker < 0 || worker >= job.spec.replicas) {
    return Fail(kExitBadInput, "LOCKSTEP_WORKER_INDEX: expected 0.." +
                                   std::to_string(job.spec.replicas - 1) + ", got \"" + index +
                                   "\"");
  }
  options.worker = static_cast<int>(worker);
  PsClientOptions client_options;
  client_options.servers = SplitList(EnvString("LOCKSTEP_PS_SERVERS", ""));
  client_options.job = job_name;
  StatusOr<PsClientCredentials> credentials = PsClientCredentialsFromEnvironment();
  if (!credentials.ok()) return Fail(kExitBadInput, credentials.status().message());
  client_options.token = credentials->token;
  client_options.tls_ca_pem = credentials->tls_ca_pem;
  // A server being replaced (its pod rescheduled, its shard restored) is waited for as long as
  // the other workers are.
  client_options.down_server_wait_ms = options.wait_timeout_ms;
  if (static_cast<int32_t>(client_options.servers.size()) != job.spec.parameter_servers.replicas) {
    return Fail(kExitBadInput,
                "LOCKSTEP_PS_SERVERS: " + std::to_string(client_options.servers.size()) +
                    " addresses, but spec.parameterServers.replicas is " +
                    std::to_string(job.spec.parameter_servers.replicas));
  }
  SetLogContext("job=" + job_name + " worker=" + std::to_string(worker));

  // The data first: a bad file is bad input, found before anything joins.
  const spec::TrainerSpec& trainer = *job.spec.trainer;
  const int32_t fields = trainer.model.embedding->fields;
  StatusOr<ClickLog> train = ReadClickLogFile(
      "spec.trainer.data.train[0]", spec::ResolveDataPath(job, trainer.data.train[0]), fields);
  if (!train.ok()) return Fail(kExitBadInput, train.status().message());
  std::optional<ClickLog> test;
  if (!trainer.data.test.empty()) {
    StatusOr<ClickLog> read = ReadClickLogFile(
        "spec.trainer.data.test[0]", spec::ResolveDataPath(job, trainer.data.test[0]), fields);
    if (!read.ok()) return Fail(kExitBadInput, read.status().message());
    test = std::move(*read);
  }
  LOCKSTEP_LOG(INFO) << "click log: " << train->samples << " train samples of " << fields
                     << " fields" << (test ? ", " + std::to_string(test->samples) + " test" : "");

  StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(client_options);
  if (!client.ok()) return Fail(kExitBadInput, client.status().message());
  StatusOr<rendezvous::ClientOptions> rendezvous_options =
      rendezvous::ClientOptionsFromEnvironment(job_name);
  if (!rendezvous_options.ok()) return Fail(kExitBadInput, rendezvous_options.status().message());
  StatusOr<std::unique_ptr<rendezvous::RendezvousClient>> rendezvous_client =
      rendezvous::RendezvousClient::Connect(*rendezvous_options);
  if (!rendezvous_client.ok()) return Fail(kExitFailure, rendezvous_client.status().message());
  Membership membership(std::move(*rendezvous_client), job_name);
  if (Status joined = membership.Start(PsJoinTimeoutMs()); !joined.ok()) {
    if (signal_number.load() != 0) return 128 + signal_number.load();
    return Fail(kExitFailure, "rendezvous: " + joined.ToString());
  }

  // The trainer's worker metrics (worker/metrics.h), so a parameter-server job's throughput, step
  // times, loss and world show on the same dashboard: samples count the global batch (this
  // worker's x replicas, as every worker trains at about one pace), the clock's wait is the
  // exposed communication, the pulled and pushed bytes the wire's.
  const int64_t metrics_port = EnvInt("LOCKSTEP_METRICS_PORT", job.spec.metrics.port);
  StatusOr<std::unique_ptr<WorkerMetrics>> metrics =
      WorkerMetrics::Create(job_name, static_cast<int>(metrics_port));
  if (!metrics.ok()) {
    return Fail(
        metrics.status().code() == StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure,
        metrics.status().message());
  }
  (*metrics)->SetGeneration(0, static_cast<int>(worker), job.spec.replicas);
  auto on_step = [&](const PsStep& step) {
    StepObservation observed;
    observed.step_seconds = step.seconds;
    observed.exposed_seconds = step.wait_seconds;
    observed.global_samples = step.samples * job.spec.replicas;
    observed.wire_bytes = step.wire_bytes;
    (*metrics)->ObserveStep(observed);
  };
  rendezvous::ProgressReport report;
  const int64_t batch = trainer.batch_size;
  auto on_progress = [&](const PsProgress& progress) {
    report.step = progress.step;
    report.total_steps = progress.total_steps;
    report.loss = progress.loss;
    // The job's rate, as this worker sees it: every worker trains at about its pace (the
    // launcher and the operator show the job's, as the trainer's rank 0 reports it).
    report.samples_per_second = progress.samples_per_second * job.spec.replicas;
    report.samples = progress.step * batch;
    report.resumed_from_step = progress.resumed_from_step;
    membership.client().SetProgress(report);
    (*metrics)->SetLoss(progress.loss);
    (*metrics)->SetSamplesPerSecond(report.samples_per_second);
    LOCKSTEP_LOG(INFO) << "step " << progress.step << "/" << progress.total_steps << " loss "
                       << progress.loss << " samples/s " << progress.samples_per_second;
  };
  StatusOr<PsTrainingResult> result =
      TrainThroughServers(options, *train, test ? &*test : nullptr, **client, on_progress, on_step);
  if (signal_number.load() != 0) {
    membership.client().StopHeartbeat();
    return 128 + signal_number.load();
  }
  if (!result.ok()) {
    return Fail(
        result.status().code() == StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure,
        result.status().ToString());
  }
  const PsTraffic& traffic = result->traffic;
  std::ostringstream line;
  line << std::fixed << std::setprecision(4) << "worker " << worker << " finished " << result->steps
       << " steps: " << result->samples_per_second << " samples/s, " << traffic.requests
       << " requests, "
       << (traffic.request_bytes + traffic.response_bytes) /
              static_cast<uint64_t>(std::max<int64_t>(1, result->steps))
       << " bytes per step";
  if (result->test_auc >= 0) {
    line << "; test AUC " << result->test_auc << ", log loss " << result->test_log_loss
         << ", accuracy " << result->test_accuracy;
    report.eval_accuracy = result->test_accuracy;
    report.eval_auc = result->test_auc;
  }
  std::cout << line.str() << std::endl;
  LOCKSTEP_LOG(INFO) << line.str();
  report.step = result->steps;
  report.total_steps = result->steps;
  report.loss = result->last_loss;
  report.samples_per_second = result->samples_per_second * job.spec.replicas;
  report.wire_bytes_per_step = static_cast<double>(traffic.request_bytes + traffic.response_bytes) /
                               static_cast<double>(std::max<int64_t>(1, result->steps));
  if (Status left = membership.client().Leave(/*completed=*/true, report); !left.ok()) {
    LOCKSTEP_LOG(WARNING) << "leaving the rendezvous: " << left;
  }
  membership.client().StopHeartbeat();
  return kExitOk;
}

}  // namespace lockstep::ps
