#include "cli/run_command.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
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
#include "cli/run_watch.h"
#include "cli/summary.h"
#include "cli/validate_command.h"
#include "cli/worker_commands.h"
#include "common/command_line.h"
#include "common/deadline.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/rendezvous/server.h"
#include "kernels/device.h"

namespace lockstep::cli {

// Once one worker has finished, how long the others may take to finish too (rank 0 evaluates
// after the last step, so its peers finish first). Past it the run fails instead of hanging.
LOCKSTEP_PARAM_INT(RunCompletionDrainMs, "LOCKSTEP_RUN_DRAIN_TIMEOUT_MS", 300000);
// Between SIGTERM and SIGKILL when stopping workers.
LOCKSTEP_PARAM_INT(RunGracePeriodMs, "LOCKSTEP_RUN_GRACE_PERIOD_MS", 5000);
// How long fewer than minReplicas workers may be alive before the job fails. The workers' Join
// gets this plus kJoinTimeoutMarginMs, so the launcher's message, which says what happened,
// comes first. Longer: more patience for a slow replacement; shorter: a lost job fails sooner.
LOCKSTEP_PARAM_INT(RendezvousTimeoutMs, "LOCKSTEP_RENDEZVOUS_TIMEOUT_MS", 30000);
// How long a worker may send no heartbeat before its generation ends: the operator's default
// (--rendezvous-heartbeat-timeout-ms). Only a hung worker waits for it: a dead one closes its
// heartbeat stream, and the launcher reports its exit, both at once.
LOCKSTEP_PARAM_INT(HeartbeatTimeoutMs, "LOCKSTEP_HEARTBEAT_TIMEOUT_MS", 10000);
// First back-off before a failed worker's replacement starts; doubles per restart up to
// kMaxRestartBackoffMs. The survivors of a trainer job train meanwhile, so it does not delay
// their recovery (a fixed-size exec job waits for the replacement); it keeps a worker that
// crashes at once from spinning.
LOCKSTEP_PARAM_INT(RunRestartBackoffMs, "LOCKSTEP_RUN_RESTART_BACKOFF_MS", 200);
// Period of the plain progress lines when stdout is not a terminal. Shorter: finer logs (tests
// and benchmarks follow the step through them); longer: quieter CI logs.
LOCKSTEP_PARAM_INT(RunProgressIntervalMs, "LOCKSTEP_RUN_PROGRESS_INTERVAL_MS", 5000);

namespace {

namespace fs = std::filesystem;

constexpr int kFailureLogLines = 20;
constexpr int64_t kPollIntervalMs = 250;  // also the TTY redraw period
constexpr int64_t kServerShutdownMs = 2000;
constexpr int64_t kJoinTimeoutMarginMs = 5000;
constexpr int64_t kMaxRestartBackoffMs = 10000;
// What an exec agent takes to stop its command (worker/agent/exec_agent.h: grace_ms default,
// kill_wait_ms), and a margin for its own exit (ending what the command left, draining its
// output: up to 2 s each).
constexpr int64_t kAgentGraceMs = 10000;
constexpr int64_t kAgentKillWaitMs = 5000;
constexpr int64_t kAgentExitMarginMs = 4000;

// Most processes (workers x ranks per worker) `lockstep run` starts on one machine.
constexpr int64_t kMaxLocalRanks = 1024;

StatusOr<int32_t> ParseReplicas(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < 1 || value > kMaxLocalRanks) {
    return InvalidArgumentError("--replicas: expected an integer in [1, " +
                                std::to_string(kMaxLocalRanks) + "], got \"" + text + "\"");
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

void FillSummaryFromSnapshot(const rendezvous::JobSnapshot& snapshot, bool exec,
                             RunSummary* summary) {
  const rendezvous::ProgressReport& last = snapshot.progress;
  const rendezvous::ProgressReport& final_progress = snapshot.final_progress;
  const bool have_final = snapshot.completed_members > 0 && final_progress.step > 0;
  const rendezvous::ProgressReport& best = have_final ? final_progress : last;
  summary->mode = exec ? "exec" : "trainer";
  summary->steps = std::max(last.step, final_progress.step);
  summary->total_steps = std::max(last.total_steps, final_progress.total_steps);
  summary->final_loss = best.loss;
  summary->samples_per_second =
      best.samples_per_second > 0 ? best.samples_per_second : last.samples_per_second;
  summary->eval_accuracy =
      final_progress.eval_accuracy >= 0 ? final_progress.eval_accuracy : last.eval_accuracy;
  summary->eval_auc = final_progress.eval_auc >= 0 ? final_progress.eval_auc : last.eval_auc;
  summary->generations = snapshot.generations_formed;
  summary->resumed_from_step = std::max(last.resumed_from_step, final_progress.resumed_from_step);
  summary->recovery_seconds = snapshot.longest_recovery_seconds;
  summary->world_size = snapshot.world_size;
  if (summary->world_size == 0 && !snapshot.history.empty()) {
    summary->world_size = snapshot.history.back().world_size;
  }
  if (exec) {
    // What the program did not report stays unknown, never a 0 that reads like a measurement;
    // the agents count the restarts (the launcher replaces none of them).
    summary->restarts = std::max(last.restarts, final_progress.restarts);
    if (*summary->steps == 0) summary->steps.reset();
    if (!summary->steps.has_value() || (!best.has_loss && !last.has_loss)) {
      summary->final_loss.reset();
    } else if (!best.has_loss) {
      summary->final_loss = last.loss;
    }
    if (*summary->samples_per_second <= 0) summary->samples_per_second.reset();
    summary->eval_accuracy.reset();
    summary->resumed_from_step.reset();
  }
}

// `count` ports free on the loopback now, each bound to port 0, read back and released together
// (so they differ). A process that takes one before its server binds it makes that server fail
// to start, and the run fail with its log.
StatusOr<std::vector<int>> PickLoopbackPorts(int count) {
  std::vector<int> fds, ports;
  Status status = OkStatus();
  for (int i = 0; i < count && status.ok(); ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      status = InternalError(std::string("socket: ") + std::strerror(errno));
      break;
    }
    fds.push_back(fd);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      status = InternalError(std::string("bind 127.0.0.1:0: ") + std::strerror(errno));
      break;
    }
    ports.push_back(ntohs(address.sin_port));
  }
  for (int fd : fds) close(fd);
  if (!status.ok()) return status;
  return ports;
}

std::string JobKey(const spec::TrainingJob& job) {
  return job.metadata.namespace_ + "/" + job.metadata.name;
}

void PrintWorkerFailure(const WorkerExit& exit, const std::string& policy,
                        const std::string& log_path, std::ostream& err) {
  err << "lockstep: worker " << exit.member_id << " (pid " << exit.pid
      << ") failed: " << exit.Describe() << "; not restarted: " << policy << "\n";
  std::vector<std::string> tail = TailOfFile(log_path, kFailureLogLines);
  if (tail.empty()) {
    err << "lockstep: its log " << log_path << " is empty\n";
    return;
  }
  err << "--- last " << tail.size() << " lines of " << log_path << " ---\n";
  for (const std::string& line : tail) err << line << "\n";
  err << "---\n";
}

// `lockstep run`'s command line, defined once for parsing and for --help. The values CLI11
// cannot check as the old parser did (--replicas' bound, --console's words) are read as text and
// checked after, with the same messages.
struct RunFlags {
  RunOptions options;
  std::string replicas;
  std::string console = "all";
};

std::unique_ptr<CLI::App> RunCommandLine(RunFlags& flags) {
  auto app = std::make_unique<CLI::App>(
      "Runs a TrainingJob on this machine: its workers as lockstep-worker processes and an "
      "in-process rendezvous service.",
      "lockstep run");
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->add_option("FILE", flags.options.manifest_path, "the TrainingJob manifest")->required();
  app->add_option("--replicas", flags.replicas, "number of workers (default: spec.replicas)")
      ->type_name("N");
  app->add_option("--summary", flags.options.summary_path, "write the result as JSON to FILE")
      ->type_name("FILE");
  app->add_option("--log-dir", flags.options.log_dir,
                  "worker logs (default: ./lockstep-logs/<name>-<time>/)")
      ->type_name("DIR");
  app->add_option("--console", flags.console,
                  "an exec job's program output on the console, each line prefixed with its "
                  "rank: all (default), rank0 or none; the logs keep it all")
      ->type_name("WHO");
  return app;
}

}  // namespace

std::string RunUsage() {
  RunFlags flags;
  return RunCommandLine(flags)->help();
}

StatusOr<RunOptions> ParseRunArgs(const std::vector<std::string>& args) {
  RunFlags flags;
  std::unique_ptr<CLI::App> app = RunCommandLine(flags);
  try {
    std::vector<std::string> reversed = Cli11Arguments(args);
    app->parse(reversed);
  } catch (const CLI::CallForHelp&) {
    flags.options.help = true;
    return flags.options;
  } catch (const CLI::ParseError& error) {
    return InvalidArgumentError(error.what());
  }
  RunOptions& options = flags.options;
  if (app->count("--replicas") > 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(options.replicas, ParseReplicas(flags.replicas));
  }
  if (app->count("--summary") > 0 && options.summary_path.empty()) {
    return InvalidArgumentError("--summary: empty path");
  }
  if (app->count("--log-dir") > 0 && options.log_dir.empty()) {
    return InvalidArgumentError("--log-dir: empty path");
  }
  if (options.manifest_path.empty()) return InvalidArgumentError("FILE: empty path");
  LOCKSTEP_ASSIGN_OR_RETURN(options.console, ParseConsoleRanks(flags.console));
  return options;
}

Status CheckDevicePlacement(const spec::TrainingJob& job) {
  if (!UsesCuda(job)) return OkStatus();
  if (Status usable = kernels::CudaUsable(); !usable.ok()) {
    return FailedPreconditionError("spec.trainer.device: cuda cannot be used on this machine: " +
                                   usable.message());
  }
  const int gpus = static_cast<int>(VisibleGpus().size());
  // Standbys hold a GPU each too: they start (and load) before a place is free.
  const int ranks = spec::WorkersToRun(job.spec) * job.spec.ranks_per_worker;
  if (ranks > gpus) {
    const int most = gpus / job.spec.ranks_per_worker;
    return FailedPreconditionError(
        "spec.trainer.device: cuda with " + std::to_string(ranks) + " ranks (" +
        std::to_string(spec::WorkersToRun(job.spec)) + " workers x ranksPerWorker " +
        std::to_string(job.spec.ranks_per_worker) + "), but this machine shows " +
        std::to_string(gpus) +
        " GPU(s): each rank needs a GPU of its own (NCCL cannot put two ranks on one GPU); "
        "use --replicas " +
        std::to_string(most) + " or fewer");
  }
  return OkStatus();
}

// Every rank of a local run is a process on this machine: their count is bounded like
// --replicas, and together they must fit in its memory.
Status CheckLocalCapacity(const spec::TrainingJob& job,
                          const std::optional<trainer::MemoryEstimate>& rank_memory) {
  const int64_t ranks = int64_t{spec::WorkersToRun(job.spec)} * job.spec.ranks_per_worker;
  if (ranks > kMaxLocalRanks) {
    return InvalidArgumentError(
        "spec.replicas: " + std::to_string(spec::WorkersToRun(job.spec)) + " workers" +
        (job.spec.elastic.standby > 0 ? " (standbys included)" : "") + " x ranksPerWorker " +
        std::to_string(job.spec.ranks_per_worker) + " = " + std::to_string(ranks) +
        " processes, more than lockstep run starts on one machine (" +
        std::to_string(kMaxLocalRanks) + "); use --replicas to run fewer");
  }
  const double machine = trainer::MachineMemoryBytes();
  if (!rank_memory.has_value() || machine <= 0) return OkStatus();
  const double total = rank_memory->total() * static_cast<double>(ranks);
  if (total <= machine) return OkStatus();
  return InvalidArgumentError(
      "spec.replicas: " + std::to_string(ranks) + " ranks on this machine are estimated to need " +
      trainer::FormatBytes(total) + " (each " + rank_memory->Describe() + "), more than its " +
      trainer::FormatBytes(machine) + " of memory; use --replicas to run fewer");
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
  StatusOr<RunOptions> options = ParseRunArgs(args);
  if (!options.ok()) {
    err << "lockstep run: " << options.status().message() << "\n" << RunUsage();
    return kExitBadInput;
  }
  if (options->help) {
    out << RunUsage();
    return kExitOk;
  }

  if (HeartbeatTimeoutMs() < 500 || HeartbeatTimeoutMs() > 600000) {
    err << "lockstep run: LOCKSTEP_HEARTBEAT_TIMEOUT_MS: expected 500..600000 ms, got "
        << HeartbeatTimeoutMs() << "\n";
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
  if (Status placed = CheckDevicePlacement(job); !placed.ok()) {
    err << options->manifest_path << ": " << placed.message() << "\n";
    return kExitBadInput;
  }
  if (Status fits = CheckLocalCapacity(job, check.rank_memory); !fits.ok()) {
    err << options->manifest_path << ": " << fits.message() << "\n";
    return kExitBadInput;
  }
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
  // A fixed-size trainer job's survivors train on at a smaller world size while a failed
  // worker's replacement starts (the data order and the global-mean gradient do not depend on
  // the world size), so the rendezvous admits any number up to replicas; whether the job may go
  // on without the worker is the restart policy's decision (WatchUntilDone). A fixed-size exec
  // job forms only at its full size, as in a cluster: a program need not cope with another world
  // size, and a generation formed without a member that is still stopping its command would end
  // as soon as it came back. So does a fixed-size pipeline job: every replica of the pipeline
  // needs all its stages (docs/pipeline.md). An elastic job's range is the spec's (a pipeline's
  // generations in whole replicas).
  const bool elastic = job.spec.elastic.min_replicas < job.spec.elastic.max_replicas;
  const bool exec = !job.spec.trainer.has_value();
  const bool whole_world = exec || job.spec.trainer->pipeline.stages > 1;
  job_config.min_members =
      elastic ? job.spec.elastic.min_replicas : (whole_world ? job.spec.elastic.max_replicas : 1);
  job_config.max_members = spec::MaxWorld(job.spec);
  // Every local worker is started at once; the first generation takes replicas of them and any
  // standbys wait.
  job_config.initial_members = job.spec.replicas;
  job_config.ranks_per_pod = job.spec.ranks_per_worker;
  job_config.pods_multiple = spec::PodsPerPipelineReplicas(job.spec);
  job_config.wait_for_initial_members = true;
  job_config.heartbeat_timeout_ms = HeartbeatTimeoutMs();
  if (Status status = (*server)->AddJob(job_config); !status.ok()) {
    err << "lockstep run: rendezvous service: " << status.message() << "\n";
    (*server)->Shutdown(kServerShutdownMs);
    return kExitFailure;
  }

  // 3. The workers.
  WorkerCommandOptions command_options;
  command_options.worker_binary = *worker_binary;
  command_options.log_dir = *log_dir;
  command_options.manifest_path = manifest_copy;
  command_options.rendezvous_address = "127.0.0.1:" + std::to_string((*server)->port());
  command_options.token = *token;
  command_options.join_timeout_ms = EnvString(
      "LOCKSTEP_JOIN_TIMEOUT_MS", std::to_string(RendezvousTimeoutMs() + kJoinTimeoutMarginMs));
  const int32_t servers = job.spec.parameter_servers.replicas;
  if (servers > 0) {
    // An exec job's TensorFlow tasks (TF_CONFIG): a port for every worker and server; the
    // built-in trainer's: one per server.
    const int32_t tf_workers = exec ? spec::WorkersToRun(job.spec) : 0;
    StatusOr<std::vector<int>> ports = PickLoopbackPorts(tf_workers + servers);
    if (!ports.ok()) {
      err << "lockstep run: parameter servers: " << ports.status().message() << "\n";
      (*server)->Shutdown(kServerShutdownMs);
      return kExitFailure;
    }
    for (int i = 0; i < tf_workers + servers; ++i) {
      (i < tf_workers ? command_options.tf_workers : command_options.parameter_servers)
          .push_back("127.0.0.1:" + std::to_string((*ports)[static_cast<size_t>(i)]));
    }
  }
  // The workers in slots 0 .. workers - 1, the parameter servers after them (the workers wait
  // for the servers to listen).
  std::vector<WorkerCommand> commands = BuildWorkerCommands(job, command_options);
  const int32_t worker_slots = static_cast<int32_t>(commands.size());
  for (WorkerCommand& command : BuildParameterServerCommands(job, command_options)) {
    commands.push_back(std::move(command));
  }
  SupervisorOptions supervisor_options;
  supervisor_options.grace_period_ms = RunGracePeriodMs();
  if (exec) {
    // An exec agent that is told to stop stops its command first (SIGTERM, SIGKILL after
    // LOCKSTEP_EXEC_GRACE_MS, then up to kAgentKillWaitMs for the exit), and only the agent can
    // end the command's group and its setsid descendants: killing the agent sooner would leave
    // them running.
    supervisor_options.grace_period_ms =
        std::max(supervisor_options.grace_period_ms,
                 std::max<int64_t>(0, EnvInt("LOCKSTEP_EXEC_GRACE_MS", kAgentGraceMs)) +
                     kAgentKillWaitMs + kAgentExitMarginMs);
  }
  Supervisor supervisor(supervisor_options,
                        std::make_unique<RunPolicyRestarts>(
                            job.spec.run_policy, RunRestartBackoffMs(), kMaxRestartBackoffMs,
                            /*workers_restart_their_commands=*/!job.spec.trainer.has_value()));
  // Before the workers start: the console shows this run's lines, not a reused log's old ones.
  std::optional<ConsoleRelay> console;
  if (exec) {
    std::vector<std::string> log_paths;
    for (const WorkerCommand& command : commands) log_paths.push_back(command.log_path);
    console.emplace(log_paths, options->console);
  }
  const double started_at = MonotonicSeconds();
  if (Status status = supervisor.Start(commands); !status.ok()) {
    err << "lockstep run: " << status.message() << "\n";
    (*server)->Shutdown(kServerShutdownMs);
    return kExitFailure;
  }
  const int32_t ranks_per_worker = job.spec.ranks_per_worker;
  const int32_t replicas = job.spec.replicas, standby = job.spec.elastic.standby;
  out << "lockstep: running " << job_key << " with " << replicas << " worker"
      << (replicas == 1 ? "" : "s")
      << (ranks_per_worker == 1 ? std::string()
                                : " x " + std::to_string(ranks_per_worker) + " ranks = " +
                                      std::to_string(replicas * ranks_per_worker) + " ranks")
      << (standby == 0 ? std::string()
                       : " and " + std::to_string(standby) + " standby" + (standby == 1 ? "" : "s"))
      << (servers == 0
              ? std::string()
              : " and " + std::to_string(servers) + " parameter server" + (servers == 1 ? "" : "s"))
      << "; logs in " << *log_dir << "\n"
      << std::flush;

  // 4. Watch until done, failed or interrupted.
  const bool tty = isatty(STDOUT_FILENO) == 1;
  ProgressDisplayOptions display_options;
  display_options.tty = tty;
  display_options.columns = tty ? TerminalColumns() : 0;
  display_options.plain_interval_ms = std::max<int64_t>(1, RunProgressIntervalMs());
  ProgressDisplay display(out, display_options);
  WatchOptions watch_options;
  watch_options.poll_interval_ms = kPollIntervalMs;
  watch_options.rendezvous_timeout_ms = RendezvousTimeoutMs();
  watch_options.drain_ms = RunCompletionDrainMs();
  watch_options.worker_slots = worker_slots;
  WatchOutcome outcome = WatchUntilDone(job, watch_options, supervisor, **server, display,
                                        console ? &*console : nullptr, out, started_at);
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
  // The last lines, after the exits: the workers write no more, so this drains.
  if (console) {
    do {
      PrintProgramLines(*console, display, out);
    } while (console->read_last_poll());
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
  FillSummaryFromSnapshot(snapshot, exec, &summary);
  summary.stragglers = outcome.stragglers;
  int exit_code = kExitOk;
  const std::optional<WorkerExit>& failure = outcome.failure;
  if (outcome.interrupt_signal != 0) {
    summary.status = "interrupted";
    exit_code = outcome.interrupt_signal == SIGINT ? kExitInterrupted : kExitTerminated;
  } else if (failure) {
    summary.status = "failed";
    summary.failed_worker = failure->member_id;
    summary.failed_worker_exit = failure->Describe();
    PrintWorkerFailure(*failure, outcome.failure_policy, supervisor.command(failure->slot).log_path,
                       err);
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
