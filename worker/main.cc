// lockstep-worker: one worker of a Lockstep job.
//
//   lockstep-worker train [--manifest FILE]
//
// The manifest comes from --manifest, else from LOCKSTEP_SPEC (the JSON of spec::ToJson).
// A manifest with spec.ranksPerWorker N > 1 makes this process the pod's supervisor: it runs N
// copies of itself as the pod's ranks (worker/agent/pod_supervisor.h).
//
// Environment: LOCKSTEP_RENDEZVOUS (host:port), LOCKSTEP_JOB (namespace/name),
// LOCKSTEP_JOB_TOKEN, LOCKSTEP_POD (member id: the pod), LOCKSTEP_LOCAL_RANK (set by the pod
// supervisor), LOCKSTEP_HOST (address peers reach; default 127.0.0.1), LOCKSTEP_METRICS_PORT
// (overrides spec.metrics.port, + the local rank; 0: no endpoint),
// LOCKSTEP_DUMP_PARAMS (rank 0 writes the final parameters there as raw float32),
// LOCKSTEP_SAMPLE_ACCOUNTING (rank 0 appends one JSON line per epoch there: the format is in
// worker/trainer/sample_accounting.h).
//
// Exit codes: 0 done; 2 bad input (manifest or data; one line on stderr); 1 any other failure;
// 143 after SIGTERM (130 after SIGINT), having left the rendezvous with completed=false.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/env.h"
#include "common/errno_check.h"
#include "common/logging.h"
#include "common/rendezvous/client_environment.h"
#include "common/spec/training_job.h"
#include "common/termination_message.h"
#include "kernels/kernels.h"
#include "worker/agent/exec_agent.h"
#include "worker/agent/pod_supervisor.h"
#include "worker/agent/worker_command_line.h"
#include "worker/comm/rdma/nccl_rdma_setup.h"
#include "worker/metrics.h"
#include "worker/ps/ps_command.h"
#include "worker/ps/ps_train_command.h"
#include "worker/trainer/dataset.h"
#include "worker/trainer/trainer.h"
#include "worker/trainer/training_worker.h"

namespace lockstep {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

// How long Run gets to return after SIGTERM before the signal thread leaves on its behalf and
// exits (Run may be inside a Join that cannot be interrupted).
constexpr auto kStopGrace = std::chrono::seconds(3);

// How long one Join may wait for the generation to form (all members must have started).
LOCKSTEP_PARAM_INT(JoinTimeoutMs, "LOCKSTEP_JOIN_TIMEOUT_MS", 600000);
// Checkpoints: the limit of one persist attempt, the attempts per checkpoint, the first pause
// between attempts (doubling), and how long the end of training waits for the final one.
LOCKSTEP_PARAM_INT(CheckpointAttemptTimeoutMs, "LOCKSTEP_CHECKPOINT_ATTEMPT_TIMEOUT_MS", 60000);
LOCKSTEP_PARAM_INT(CheckpointMaxAttempts, "LOCKSTEP_CHECKPOINT_MAX_ATTEMPTS", 5);
// Asynchronous checkpoints' copy of the state on its device (TrainingCheckpointerOptions::
// device_copy): -1 automatic (on a GPU), 0 never (the memory is needed), 1 always.
LOCKSTEP_PARAM_INT(CheckpointDeviceCopy, "LOCKSTEP_CHECKPOINT_DEVICE_COPY", -1);
LOCKSTEP_PARAM_INT(CheckpointRetryBackoffMs, "LOCKSTEP_CHECKPOINT_RETRY_BACKOFF_MS", 1000);
LOCKSTEP_PARAM_INT(FinalCheckpointTimeoutMs, "LOCKSTEP_FINAL_CHECKPOINT_TIMEOUT_MS", 300000);

// One line on stderr and in the termination log (docs/operator.md, "Failures").
int Fail(int code, const std::string& message) {
  return ReportFatalError("lockstep-worker", code, message);
}

// The commands; each one's own --help is generated from its flags (worker_command_line.h,
// ps_command.h).
void Usage() {
  std::cerr << "usage: lockstep-worker COMMAND [ARGS...]\n"
               "  train   runs the built-in trainer as a member of the job\n"
               "  exec    runs a program (a PyTorch script) as a member of the job, under the\n"
               "          rendezvous and restart rules (docs/exec.md)\n"
               "  ps      serves one parameter server of a job\n"
               "The manifest comes from --manifest or the LOCKSTEP_SPEC environment variable.\n"
               "lockstep-worker COMMAND --help describes a command's flags.\n";
}

// SIGTERM/SIGINT: the handler only writes the signal number to a pipe (async-signal-safe);
// a watcher thread reads it and stops the worker. A handler, rather than blocking the signals
// and sigwait, because libraries start threads before main (OpenBLAS's pool) whose signal mask
// we do not control, and the kernel may deliver the signal to any of them.
int g_signal_pipe[2] = {-1, -1};

extern "C" void ForwardSignal(int signal_number) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  [[maybe_unused]] ssize_t ignored = write(g_signal_pipe[1], &byte, 1);
  errno = saved_errno;
}

class SignalWatcher {
 public:
  // Installs the handlers; false when the pipe cannot be made.
  bool Install() {
    if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) return false;
    struct sigaction action {};
    action.sa_handler = ForwardSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGINT, &action, nullptr);
    return true;
  }

  void Start(trainer::TrainingWorker* worker) {
    std::thread([this, worker] {
      unsigned char byte = 0;
      ssize_t got = 0;
      LOCKSTEP_SYSCALL_RETRY(got, read(g_signal_pipe[0], &byte, 1));
      if (got != 1) return;
      const int signal_number = byte;
      // Under the lock until the wait: Finish (main, on its way out) waits for it, and once Run
      // has returned a signal is ignored, since the process is exiting and its globals (the
      // log context) may already be gone.
      std::unique_lock<std::mutex> lock(mu_);
      if (done_) return;
      signal_ = signal_number;
      LOCKSTEP_LOG(WARNING) << "received signal " << signal_number << "; stopping";
      worker->RequestStop();
      // Waiting in a Join (e.g. a sibling of a failed rank of the same pod): nothing to finish.
      const auto grace = worker->joining() ? std::chrono::seconds(0) : kStopGrace;
      if (!done_cv_.wait_for(lock, grace, [this] { return done_; })) {
        // Still under the lock: Finish waits, so the worker outlives these calls.
        LOCKSTEP_LOG(WARNING) << "still blocked after the grace period; leaving and exiting";
        worker->LeaveNow();
        std::_Exit(128 + signal_number);
      }
    }).detach();
  }

  // Called when Run returned; the signal number that stopped it, or 0.
  int Finish() {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    done_cv_.notify_all();
    return signal_;
  }

 private:
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  int signal_ = 0;
};

int Train(const std::string& manifest_path) {
  // Never destroyed: the detached signal thread may wake after Train returned, while the
  // process exits, and must still find its mutex.
  SignalWatcher& watcher = *new SignalWatcher;
  if (!watcher.Install()) return Fail(kExitFailure, "cannot install the signal handlers");

  StatusOr<spec::TrainingJob> job = spec::LoadTrainingJobFileOrEnv(manifest_path);
  if (!job.ok()) return Fail(kExitBadInput, job.status().message());
  if (!job->spec.trainer.has_value()) {
    return Fail(kExitBadInput,
                "spec.trainer: lockstep-worker train runs the built-in trainer; "
                "this manifest has none (exec mode is run by the agent)");
  }
  const std::string job_name =
      EnvString("LOCKSTEP_JOB", job->metadata.namespace_ + "/" + job->metadata.name);
  SetLogContext("job=" + job_name + " rank=- gen=-");
  if (job->spec.trainer->sync.strategy == spec::SyncStrategy::kParameterServer) {
    // A parameter-server job's worker trains the sparse model through the servers.
    return ps::RunParameterServerWorker(*job, job_name);
  }
  // Logs the node's RDMA devices and, for roce/infiniband, adds NCCL_IB_HCA/NCCL_IB_GID_INDEX
  // (docs/rdma.md). Here, before this process starts any thread of its own: setenv is not safe
  // against a concurrent getenv, and NCCL reads its variables when the communicator is created.
  rdma::SetUpNcclRdmaEnvironment(job->spec.network);

  trainer::TrainingWorkerOptions options;
  options.job_name = job_name;
  StatusOr<rendezvous::ClientOptions> client = rendezvous::ClientOptionsFromEnvironment(job_name);
  if (!client.ok()) return Fail(kExitBadInput, client.status().message());
  options.client = *client;
  options.join_timeout_ms = JoinTimeoutMs();
  options.dump_params_path = EnvString("LOCKSTEP_DUMP_PARAMS", "");
  options.checkpoint.checkpoint = job->spec.checkpoint;
  options.checkpoint.attempt_timeout_ms = CheckpointAttemptTimeoutMs();
  options.checkpoint.max_attempts = static_cast<int>(CheckpointMaxAttempts());
  options.checkpoint.retry_initial_backoff_ms = CheckpointRetryBackoffMs();
  options.checkpoint.device_copy =
      CheckpointDeviceCopy() == 0   ? trainer::TrainingCheckpointerOptions::DeviceCopy::kNever
      : CheckpointDeviceCopy() == 1 ? trainer::TrainingCheckpointerOptions::DeviceCopy::kAlways
                                    : trainer::TrainingCheckpointerOptions::DeviceCopy::kAuto;
  options.final_checkpoint_timeout_ms = FinalCheckpointTimeoutMs();
  // Rank r of a pod of several serves its metrics on the pod's port + r, and uses GPU r.
  const int64_t local_rank = EnvInt("LOCKSTEP_LOCAL_RANK", 0);
  const int64_t base_port = EnvInt("LOCKSTEP_METRICS_PORT", job->spec.metrics.port);
  const int64_t metrics_port = base_port == 0 ? 0 : base_port + local_rank;

  // One BLAS thread per worker: several workers share the machine's cores.
  kernels::SetCpuBlasThreads(1);

  const double load_started = MonotonicSeconds();
  StatusOr<trainer::DataSplits> splits = trainer::LoadDatasets(*job);
  if (!splits.ok()) return Fail(kExitBadInput, splits.status().message());
  LOCKSTEP_LOG(INFO) << splits->train.description << " loaded in "
                     << static_cast<int64_t>((MonotonicSeconds() - load_started) * 1000) << " ms";

  auto metrics = WorkerMetrics::Create(job_name, static_cast<int>(metrics_port));
  if (!metrics.ok()) {
    return Fail(
        metrics.status().code() == StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure,
        metrics.status().message());
  }

  auto trainer = trainer::Trainer::Create(*job, std::move(splits).value(), metrics->get(),
                                          static_cast<int>(local_rank));
  if (!trainer.ok()) return Fail(kExitBadInput, trainer.status().message());

  const std::string accounting_path = EnvString("LOCKSTEP_SAMPLE_ACCOUNTING", "");
  if (!accounting_path.empty()) (*trainer)->EnableSampleAccounting(accounting_path);

  trainer::TrainingWorker worker(options, std::move(trainer).value(), metrics->get());
  watcher.Start(&worker);
  Status status = worker.Run();
  const int signal_number = watcher.Finish();
  if (signal_number != 0) return 128 + signal_number;
  if (!status.ok()) {
    const bool bad_input = status.code() == StatusCode::kInvalidArgument;
    return Fail(bad_input ? kExitBadInput : kExitFailure, status.ToString());
  }
  return kExitOk;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  // A write to a socket or pipe whose reader is gone fails with EPIPE, which every caller handles
  // (libgloo's writev after an abort, a metrics scrape cut short), instead of ending the worker.
  // Set here, before any thread starts; the programs it starts get the default back (ChildProcess).
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    lockstep::Usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "exec" || command == "train") {
    const std::vector<std::string> args(argv + 1, argv + argc);
    const int32_t ranks = lockstep::agent::RanksToSupervise(args);
    if (ranks > 1) {
      std::vector<std::string> rank_argv = {"/proc/self/exe"};
      rank_argv.insert(rank_argv.end(), args.begin(), args.end());
      return lockstep::agent::RunPod(rank_argv, ranks, {});
    }
  }
  if (command == "exec") {
    return lockstep::agent::RunExecAgent(std::vector<std::string>(argv + 2, argv + argc));
  }
  if (command == "ps") {
    return lockstep::ps::RunParameterServerCommand(std::vector<std::string>(argv + 2, argv + argc));
  }
  if (command != "train") {
    lockstep::Usage();
    return lockstep::Fail(2, "unknown command \"" + command + "\"");
  }
  using lockstep::agent::WorkerMode;
  lockstep::StatusOr<lockstep::agent::WorkerCommandLine> line =
      lockstep::agent::ParseWorkerCommandLine(WorkerMode::kTrain,
                                              std::vector<std::string>(argv + 2, argv + argc));
  if (!line.ok()) return lockstep::Fail(2, line.status().message() + " (see --help)");
  if (line->help) {
    std::cout << lockstep::agent::WorkerCommandLineHelp(WorkerMode::kTrain, "lockstep-worker");
    return 0;
  }
  return lockstep::Train(line->manifest_path);
}
