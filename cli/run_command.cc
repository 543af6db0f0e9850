#include "cli/run_command.h"

#include <openssl/rand.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "cli/exit_codes.h"
#include "cli/launcher.h"
#include "cli/progress_display.h"
#include "cli/summary.h"
#include "cli/validate_command.h"
#include "common/deadline.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/rendezvous/server.h"

namespace lockstep::cli {

// Once one worker has finished, how long the others may take to finish too (rank 0 evaluates
// after the last step, so its peers finish first). Past it the run fails instead of hanging.
LOCKSTEP_PARAM_INT(RunCompletionDrainMs, "LOCKSTEP_RUN_DRAIN_TIMEOUT_MS", 300000);
// Between SIGTERM and SIGKILL when stopping workers.
LOCKSTEP_PARAM_INT(RunGracePeriodMs, "LOCKSTEP_RUN_GRACE_PERIOD_MS", 5000);

namespace {

namespace fs = std::filesystem;

constexpr int kFailureLogLines = 20;
constexpr int64_t kPollIntervalMs = 250;  // also the TTY redraw period
constexpr int64_t kServerShutdownMs = 2000;

StatusOr<int32_t> ParseReplicas(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < 1 || value > 1024) {
    return InvalidArgumentError("--replicas: expected an integer in [1, 1024], got \"" + text +
                                "\"");
  }
  return static_cast<int32_t>(value);
}

// The lockstep-worker binary: LOCKSTEP_WORKER_BINARY when set (tests, custom builds), else the
// one installed beside this executable.
StatusOr<std::string> FindWorkerBinary() {
  std::string path = EnvString("LOCKSTEP_WORKER_BINARY", "");
  if (path.empty()) {
    std::error_code error;
    fs::path self = fs::read_symlink("/proc/self/exe", error);
    if (error) return InternalError("cannot resolve /proc/self/exe: " + error.message());
    path = (self.parent_path() / "lockstep-worker").string();
  }
  if (access(path.c_str(), X_OK) != 0) {
    return NotFoundError("worker binary " + path +
                         " is missing or not executable (build the lockstep-worker target)");
  }
  return fs::absolute(path).string();
}

std::string Timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y%m%d-%H%M%S", &local);
  return buffer;
}

// Creates `base` or, when it exists, base-2, base-3, ...: two runs in the same second get
// separate directories.
StatusOr<std::string> CreateFreshDirectory(const fs::path& base) {
  std::error_code error;
  fs::create_directories(base.parent_path(), error);
  if (error) return InternalError("create " + base.parent_path().string() + ": " + error.message());
  for (int suffix = 1; suffix < 1000; ++suffix) {
    fs::path candidate =
        suffix == 1 ? base : fs::path(base.string() + "-" + std::to_string(suffix));
    if (fs::create_directory(candidate, error)) return candidate.string();
    if (error) return InternalError("create " + candidate.string() + ": " + error.message());
  }
  return AlreadyExistsError("no free log directory name under " + base.string());
}

// Data paths as absolute file paths, so the manifest copy in the log directory reads the same
// files as the original (relative paths resolve against the manifest's own directory).
void MakeDataPathsAbsolute(spec::TrainingJob* job) {
  if (!job->spec.trainer.has_value()) return;
  for (auto* uris : {&job->spec.trainer->data.train, &job->spec.trainer->data.test}) {
    for (std::string& uri : *uris) uri = spec::ResolveDataPath(*job, uri);
  }
}

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::trunc);
  file << text;
  file.close();
  if (!file) return InternalError("cannot write " + path);
  return OkStatus();
}

int TerminalColumns() {
  struct winsize size {};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

// Threads for the linear-algebra library of each worker: the machine's cores shared among the
// local workers, so N workers do not each start one thread per core and thrash. A value the
// user set wins.
std::string ThreadsPerWorker(int32_t workers) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return std::to_string(std::max<unsigned>(1, cores / static_cast<unsigned>(workers)));
}

ProgressSample SampleFrom(const rendezvous::JobSnapshot& snapshot, int32_t running,
                          double elapsed) {
  ProgressSample sample;
  sample.step = snapshot.progress.step;
  sample.total_steps = snapshot.progress.total_steps;
  sample.loss = snapshot.progress.loss;
  sample.samples_per_second = snapshot.progress.samples_per_second;
  sample.world_size = snapshot.world_size;
  sample.generation = snapshot.generation;
  sample.workers_running = running;
  sample.elapsed_seconds = elapsed;
  return sample;
}

void FillSummaryFromSnapshot(const rendezvous::JobSnapshot& snapshot, RunSummary* summary) {
  const rendezvous::ProgressReport& last = snapshot.progress;
  const rendezvous::ProgressReport& final_progress = snapshot.final_progress;
  const bool have_final = snapshot.completed_members > 0 && final_progress.step > 0;
  const rendezvous::ProgressReport& best = have_final ? final_progress : last;
  summary->steps = std::max(last.step, final_progress.step);
  summary->total_steps = std::max(last.total_steps, final_progress.total_steps);
  summary->final_loss = best.loss;
  summary->samples_per_second =
      best.samples_per_second > 0 ? best.samples_per_second : last.samples_per_second;
  summary->eval_accuracy =
      final_progress.eval_accuracy >= 0 ? final_progress.eval_accuracy : last.eval_accuracy;
  summary->generations = static_cast<int64_t>(snapshot.history.size());
  summary->world_size = snapshot.world_size;
  if (summary->world_size == 0 && !snapshot.history.empty()) {
    summary->world_size = snapshot.history.back().world_size;
  }
}

std::string JobKey(const spec::TrainingJob& job) {
  return job.metadata.namespace_ + "/" + job.metadata.name;
}

// One command per local worker: member id <name>-worker-<i>, the environment of docs/cli.md.
std::vector<WorkerCommand> BuildWorkerCommands(const spec::TrainingJob& job,
                                               const std::string& worker_binary,
                                               const std::string& log_dir,
                                               const std::string& manifest_path,
                                               const std::string& rendezvous_address,
                                               const std::string& token) {
  std::vector<WorkerCommand> commands;
  const int32_t workers = job.spec.replicas;
  const std::string threads = ThreadsPerWorker(workers);
  for (int32_t i = 0; i < workers; ++i) {
    WorkerCommand command;
    command.member_id = job.metadata.name + "-worker-" + std::to_string(i);
    if (job.spec.command.empty()) {
      command.argv = {worker_binary, "train", "--manifest", manifest_path};
    } else {
      // Exec mode: the agent runs spec.command under the rendezvous (docs/exec.md).
      command.argv = {worker_binary, "exec", "--manifest", manifest_path, "--"};
      command.argv.insert(command.argv.end(), job.spec.command.begin(), job.spec.command.end());
    }
    command.log_path = (fs::path(log_dir) / ("worker-" + std::to_string(i) + ".log")).string();
    const int32_t metrics_port = job.spec.metrics.port == 0 ? 0 : job.spec.metrics.port + i;
    command.env = {
        {"LOCKSTEP_RENDEZVOUS", rendezvous_address},
        {"LOCKSTEP_JOB", JobKey(job)},
        {"LOCKSTEP_JOB_TOKEN", token},
        {"LOCKSTEP_POD", command.member_id},
        {"LOCKSTEP_HOST", "127.0.0.1"},
        {"LOCKSTEP_METRICS_PORT", std::to_string(metrics_port)},
        {"OPENBLAS_NUM_THREADS", EnvString("OPENBLAS_NUM_THREADS", threads)},
        {"OMP_NUM_THREADS", EnvString("OMP_NUM_THREADS", threads)},
    };
    commands.push_back(std::move(command));
  }
  return commands;
}

// How watching a run ended: at most one of failure, failure_reason and interrupt_signal is set;
// none means every worker finished.
struct WatchOutcome {
  std::optional<WorkerExit> failure;  // the first worker that failed for good
  std::string failure_reason;         // a failure that is not a worker's exit
  int interrupt_signal = 0;           // SIGINT or SIGTERM to the launcher
  rendezvous::JobSnapshot snapshot;   // the latest seen
};

// Polls the supervisor (every kPollIntervalMs, which is also the TTY redraw period) and the
// rendezvous snapshot until every worker has finished, one fails, a signal arrives, or a
// deadline passes. Reports failed workers to the rendezvous service as it sees them.
WatchOutcome WatchUntilDone(const spec::TrainingJob& job, Supervisor& supervisor,
                            rendezvous::RendezvousServer& server, ProgressDisplay& display,
                            double started_at) {
  WatchOutcome outcome;
  const std::string job_key = JobKey(job);
  std::vector<bool> finished(supervisor.size(), false);
  std::optional<Deadline> active_deadline;
  if (job.spec.run_policy.active_deadline_seconds.has_value()) {
    active_deadline = Deadline::AfterMs(*job.spec.run_policy.active_deadline_seconds * 1000);
  }
  std::optional<Deadline> drain_deadline;
  while (true) {
    StatusOr<std::vector<SupervisorEvent>> events = supervisor.Poll(kPollIntervalMs);
    if (!events.ok()) {
      outcome.failure_reason = events.status().message();
      return outcome;
    }
    for (const SupervisorEvent& event : *events) {
      switch (event.kind) {
        case SupervisorEvent::Kind::kSignal:
          if (outcome.interrupt_signal == 0) outcome.interrupt_signal = event.signal;
          break;
        case SupervisorEvent::Kind::kWorkerExited:
          if (event.exit.success()) {
            finished[event.exit.slot] = true;
            if (!drain_deadline) drain_deadline = Deadline::AfterMs(RunCompletionDrainMs());
            break;
          }
          // The launcher is the failure detector on one machine: the generation ends now, not
          // after a heartbeat timeout.
          server.RemoveMember(job_key, event.exit.member_id,
                              "process exited with " + event.exit.Describe());
          if (!event.restart_scheduled && !outcome.failure) outcome.failure = event.exit;
          break;
        case SupervisorEvent::Kind::kWorkerRestarted:
          break;
      }
    }
    if (StatusOr<rendezvous::JobSnapshot> latest = server.Snapshot(job_key); latest.ok()) {
      outcome.snapshot = *latest;
    }
    if (outcome.interrupt_signal != 0 || outcome.failure) return outcome;
    if (std::all_of(finished.begin(), finished.end(), [](bool done) { return done; })) {
      return outcome;
    }
    if (active_deadline && active_deadline->expired()) {
      outcome.failure_reason = "spec.runPolicy.activeDeadlineSeconds (" +
                               std::to_string(*job.spec.run_policy.active_deadline_seconds) +
                               ") exceeded";
      return outcome;
    }
    if (drain_deadline && drain_deadline->expired()) {
      outcome.failure_reason = "a worker finished but the others did not within " +
                               std::to_string(RunCompletionDrainMs() / 1000) + " s";
      return outcome;
    }
    const double now = MonotonicSeconds();
    display.Update(SampleFrom(outcome.snapshot, supervisor.running(), now - started_at), now);
  }
}

void PrintWorkerFailure(const WorkerExit& exit, const std::string& log_path, std::ostream& err) {
  err << "lockstep: worker " << exit.member_id << " (pid " << exit.pid
      << ") failed: " << exit.Describe() << "\n";
  std::vector<std::string> tail = TailOfFile(log_path, kFailureLogLines);
  if (tail.empty()) {
    err << "lockstep: its log " << log_path << " is empty\n";
    return;
  }
  err << "--- last " << tail.size() << " lines of " << log_path << " ---\n";
  for (const std::string& line : tail) err << line << "\n";
  err << "---\n";
}

}  // namespace

const char kRunUsage[] =
    "usage: lockstep run FILE [--replicas N] [--summary FILE] [--log-dir DIR]\n"
    "  Runs a TrainingJob on this machine: N lockstep-worker processes and an in-process\n"
    "  rendezvous service.\n"
    "  --replicas N     number of workers (default: spec.replicas)\n"
    "  --summary FILE   write the result as JSON to FILE\n"
    "  --log-dir DIR    worker logs (default: ./lockstep-logs/<name>-<time>/)\n";

StatusOr<RunOptions> ParseRunArgs(const std::vector<std::string>& args) {
  RunOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    std::string flag = arg, value;
    bool has_inline_value = false;
    if (arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos) {
      flag = arg.substr(0, arg.find('='));
      value = arg.substr(arg.find('=') + 1);
      has_inline_value = true;
    }
    auto take_value = [&]() -> StatusOr<std::string> {
      if (has_inline_value) return value;
      if (i + 1 >= args.size()) return InvalidArgumentError(flag + ": missing value");
      return args[++i];
    };
    if (flag == "--replicas") {
      LOCKSTEP_ASSIGN_OR_RETURN(std::string text, take_value());
      LOCKSTEP_ASSIGN_OR_RETURN(options.replicas, ParseReplicas(text));
    } else if (flag == "--summary") {
      LOCKSTEP_ASSIGN_OR_RETURN(options.summary_path, take_value());
      if (options.summary_path.empty()) return InvalidArgumentError("--summary: empty path");
    } else if (flag == "--log-dir") {
      LOCKSTEP_ASSIGN_OR_RETURN(options.log_dir, take_value());
      if (options.log_dir.empty()) return InvalidArgumentError("--log-dir: empty path");
    } else if (arg.size() > 1 && arg[0] == '-') {
      return InvalidArgumentError("unknown flag " + arg);
    } else if (options.manifest_path.empty()) {
      options.manifest_path = arg;
    } else {
      return InvalidArgumentError("unexpected argument " + arg + " (one manifest per run)");
    }
  }
  if (options.manifest_path.empty()) return InvalidArgumentError("missing manifest FILE");
  return options;
}

Status ApplyReplicasOverride(int32_t replicas, spec::TrainingJob* job) {
  spec::TrainingJobSpec& spec = job->spec;
  if (spec.elastic_set) {
    if (replicas < spec.elastic.min_replicas || replicas > spec.elastic.max_replicas) {
      return InvalidArgumentError("--replicas " + std::to_string(replicas) +
                                  " is outside spec.elastic [" +
                                  std::to_string(spec.elastic.min_replicas) + ", " +
                                  std::to_string(spec.elastic.max_replicas) + "]");
    }
  } else {
    spec.elastic.min_replicas = replicas;
    spec.elastic.max_replicas = replicas;
  }
  spec.replicas = replicas;
  return OkStatus();
}

StatusOr<std::string> CreateDefaultLogDir(const std::string& job_name) {
  const std::string leaf = job_name + "-" + Timestamp();
  if (access(".", W_OK) == 0) {
    StatusOr<std::string> dir = CreateFreshDirectory(fs::absolute("lockstep-logs") / leaf);
    if (dir.ok()) return dir;
  }
  const std::string tmp = EnvString("TMPDIR", "/tmp");
  return CreateFreshDirectory(fs::path(tmp) / "lockstep-logs" / leaf);
}

StatusOr<std::string> GenerateJobToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return InternalError("RAND_bytes failed: the OpenSSL random generator is not seeded");
  }
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  token.reserve(2 * sizeof(bytes));
  for (unsigned char byte : bytes) {
    token.push_back(kHex[byte >> 4]);
    token.push_back(kHex[byte & 0xf]);
  }
  return token;
}

std::vector<std::string> TailOfFile(const std::string& path, int max_lines) {
  std::vector<std::string> lines;
  std::ifstream file(path, std::ios::binary);
  if (!file) return lines;
  constexpr std::streamoff kMaxBytes = 64 * 1024;
  file.seekg(0, std::ios::end);
  const std::streamoff size = file.tellg();
  const std::streamoff start = std::max<std::streamoff>(0, size - kMaxBytes);
  file.seekg(start);
  std::string line;
  if (start > 0) std::getline(file, line);  // drop the partial first line
  while (std::getline(file, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > max_lines) lines.erase(lines.begin());
  }
  return lines;
}

int RunRunCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.size() == 1 && (args[0] == "-h" || args[0] == "--help")) {
    out << kRunUsage;
    return kExitOk;
  }
  StatusOr<RunOptions> options = ParseRunArgs(args);
  if (!options.ok()) {
    err << "lockstep run: " << options.status().message() << "\n" << kRunUsage;
    return kExitBadInput;
  }

  // 1. Nothing starts unless the manifest and its data are sound.
  ManifestCheck check = CheckManifest(options->manifest_path);
  if (!check.ok()) {
    for (const std::string& problem : check.problems) err << problem << "\n";
    return kExitBadInput;
  }
  spec::TrainingJob job = *check.job;
  if (options->replicas.has_value()) {
    Status status = ApplyReplicasOverride(*options->replicas, &job);
    if (!status.ok()) {
      err << "lockstep run: " << status.message() << "\n";
      return kExitBadInput;
    }
  }
  const int32_t workers = job.spec.replicas;
  // The in-process rendezvous service logs every join and generation at info level; on a
  // terminal that would tear the progress line, so only warnings show unless asked for.
  if (EnvString("LOCKSTEP_LOG_LEVEL", "").empty()) SetLogLevel(LogLevel::kWarning);
  const std::string job_key = JobKey(job);

  StatusOr<std::string> worker_binary = FindWorkerBinary();
  if (!worker_binary.ok()) {
    err << "lockstep run: " << worker_binary.status().message() << "\n";
    return kExitFailure;
  }
  StatusOr<std::string> log_dir = options->log_dir.empty()
                                      ? CreateDefaultLogDir(job.metadata.name)
                                      : StatusOr<std::string>(options->log_dir);
  if (log_dir.ok() && !options->log_dir.empty()) {
    std::error_code error;
    fs::create_directories(*log_dir, error);
    if (error) log_dir = InternalError("create " + *log_dir + ": " + error.message());
  }
  if (!log_dir.ok()) {
    err << "lockstep run: log directory: " << log_dir.status().message() << "\n";
    return kExitFailure;
  }
  const std::string manifest_copy = (fs::path(*log_dir) / "manifest.json").string();
  {
    spec::TrainingJob effective = job;
    MakeDataPathsAbsolute(&effective);
    Status status = WriteTextFile(manifest_copy, spec::ToJson(effective).dump(2) + "\n");
    if (!status.ok()) {
      err << "lockstep run: " << status.message() << "\n";
      return kExitFailure;
    }
  }

  // 2. The rendezvous service, in-process, for this one job.
  StatusOr<std::string> token = GenerateJobToken();
  if (!token.ok()) {
    err << "lockstep run: " << token.status().message() << "\n";
    return kExitFailure;
  }
  rendezvous::ServerOptions server_options;
  server_options.listen_address = "127.0.0.1:0";
  auto server = rendezvous::RendezvousServer::Start(server_options);
  if (!server.ok()) {
    err << "lockstep run: rendezvous service: " << server.status().message() << "\n";
    return kExitFailure;
  }
  rendezvous::JobConfig job_config;
  job_config.job = job_key;
  job_config.token = *token;
  job_config.min_members = job.spec.elastic.min_replicas;
  job_config.max_members = job.spec.elastic.max_replicas;
  job_config.initial_members = workers;  // every local worker is started at once
  if (Status status = (*server)->AddJob(job_config); !status.ok()) {
    err << "lockstep run: rendezvous service: " << status.message() << "\n";
    (*server)->Shutdown(kServerShutdownMs);
    return kExitFailure;
  }

  // 3. The workers.
  const std::vector<WorkerCommand> commands =
      BuildWorkerCommands(job, *worker_binary, *log_dir, manifest_copy,
                          "127.0.0.1:" + std::to_string((*server)->port()), *token);
  SupervisorOptions supervisor_options;
  supervisor_options.grace_period_ms = RunGracePeriodMs();
  // Restarts need a replacement to join a later rendezvous generation and recover state; until
  // the elastic work lands, a failed worker ends the run (NeverRestart).
  Supervisor supervisor(supervisor_options, std::make_unique<NeverRestart>());
  const double started_at = MonotonicSeconds();
  if (Status status = supervisor.Start(commands); !status.ok()) {
    err << "lockstep run: " << status.message() << "\n";
    (*server)->Shutdown(kServerShutdownMs);
    return kExitFailure;
  }
  out << "lockstep: running " << job_key << " with " << workers << " worker"
      << (workers == 1 ? "" : "s") << "; logs in " << *log_dir << "\n"
      << std::flush;

  // 4. Watch until done, failed or interrupted.
  const bool tty = isatty(STDOUT_FILENO) == 1;
  ProgressDisplayOptions display_options;
  display_options.tty = tty;
  display_options.columns = tty ? TerminalColumns() : 0;
  ProgressDisplay display(out, display_options);
  WatchOutcome outcome = WatchUntilDone(job, supervisor, **server, display, started_at);
  display.Clear();

  // Stop whatever still runs; bounded by the grace period plus the kill wait.
  const int32_t still_running = supervisor.running();
  if (still_running > 0) {
    if (outcome.interrupt_signal != 0) {
      out << "lockstep: " << (outcome.interrupt_signal == SIGINT ? "interrupted" : "terminated")
          << "; stopping " << still_running << " worker" << (still_running == 1 ? "" : "s") << "\n"
          << std::flush;
    }
    supervisor.StopAll();
  }
  const double wall_seconds = MonotonicSeconds() - started_at;
  rendezvous::JobSnapshot snapshot = outcome.snapshot;
  if (StatusOr<rendezvous::JobSnapshot> latest = (*server)->Snapshot(job_key); latest.ok()) {
    snapshot = *latest;
  }
  (*server)->Shutdown(kServerShutdownMs);

  // 5. Report.
  RunSummary summary;
  summary.job = job_key;
  summary.log_dir = *log_dir;
  summary.wall_seconds = wall_seconds;
  summary.restarts = supervisor.restarts();
  FillSummaryFromSnapshot(snapshot, &summary);
  int exit_code = kExitOk;
  const std::optional<WorkerExit>& failure = outcome.failure;
  if (outcome.interrupt_signal != 0) {
    summary.status = "interrupted";
    exit_code = outcome.interrupt_signal == SIGINT ? kExitInterrupted : kExitTerminated;
  } else if (failure) {
    summary.status = "failed";
    summary.failed_worker = failure->member_id;
    summary.failed_worker_exit = failure->Describe();
    PrintWorkerFailure(*failure, supervisor.command(failure->slot).log_path, err);
    // Exit 2 from a worker means it found its input bad; pass that on so scripts can tell a
    // broken manifest from a crash.
    exit_code =
        !failure->signaled && failure->exit_code == kExitBadInput ? kExitBadInput : kExitFailure;
  } else if (!outcome.failure_reason.empty()) {
    summary.status = "failed";
    err << "lockstep: " << outcome.failure_reason << "\n";
    exit_code = kExitFailure;
  } else {
    summary.status = "succeeded";
  }
  PrintResultBlock(summary, out);
  if (!options->summary_path.empty()) {
    if (Status status = WriteSummaryFile(summary, options->summary_path); !status.ok()) {
      err << "lockstep run: summary: " << status.message() << "\n";
      if (exit_code == kExitOk) exit_code = kExitFailure;
    }
  }
  return exit_code;
}

}  // namespace lockstep::cli
