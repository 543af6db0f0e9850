#include "cli/run_setup.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "cli/exit_codes.h"
#include "cli/validate_command.h"
#include "common/errno_check.h"
#include "common/tls/certificates.h"
#include "kernels/device.h"

namespace lockstep::cli {
namespace {

namespace fs = std::filesystem;

// What an exec agent takes to stop its command (worker/agent/exec_agent.h: grace_ms default,
// kill_wait_ms), and a margin for its own exit (ending what the command left, draining its
// output: up to 2 s each).
constexpr int64_t kAgentGraceMs = 10000;
constexpr int64_t kAgentKillWaitMs = 5000;
constexpr int64_t kAgentExitMarginMs = 4000;

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

}  // namespace

int PrepareLocalRun(const RunOptions& options, std::ostream& err, LocalRun* run) {
  ManifestCheck check = CheckManifest(options.manifest_path);
  if (!check.ok()) {
    for (const std::string& problem : check.problems) err << problem << "\n";
    return kExitBadInput;
  }
  run->job = *check.job;
  spec::TrainingJob& job = run->job;
  if (options.replicas.has_value()) {
    if (Status status = ApplyReplicasOverride(*options.replicas, &job); !status.ok()) {
      err << "lockstep run: " << status.message() << "\n";
      return kExitBadInput;
    }
  }
  if (Status placed = CheckDevicePlacement(job); !placed.ok()) {
    err << options.manifest_path << ": " << placed.message() << "\n";
    return kExitBadInput;
  }
  if (Status fits = CheckLocalCapacity(job, check.rank_memory); !fits.ok()) {
    err << options.manifest_path << ": " << fits.message() << "\n";
    return kExitBadInput;
  }
  run->key = job.metadata.namespace_ + "/" + job.metadata.name;
  run->exec = !job.spec.trainer.has_value();

  StatusOr<std::string> worker_binary = FindWorkerBinary();
  if (!worker_binary.ok()) {
    err << "lockstep run: " << worker_binary.status().message() << "\n";
    return kExitFailure;
  }
  run->worker_binary = *worker_binary;
  StatusOr<std::string> log_dir = options.log_dir.empty() ? CreateDefaultLogDir(job.metadata.name)
                                                          : StatusOr<std::string>(options.log_dir);
  if (log_dir.ok() && !options.log_dir.empty()) {
    std::error_code error;
    fs::create_directories(*log_dir, error);
    if (error) log_dir = InternalError("create " + *log_dir + ": " + error.message());
  }
  if (!log_dir.ok()) {
    err << "lockstep run: log directory: " << log_dir.status().message() << "\n";
    return kExitFailure;
  }
  run->log_dir = *log_dir;
  run->manifest_copy = (fs::path(*log_dir) / "manifest.json").string();
  spec::TrainingJob effective = job;
  MakeDataPathsAbsolute(&effective);
  if (Status status = WriteTextFile(run->manifest_copy, spec::ToJson(effective).dump(2) + "\n");
      !status.ok()) {
    err << "lockstep run: " << status.message() << "\n";
    return kExitFailure;
  }
  return kExitOk;
}

rendezvous::JobConfig LocalJobConfig(const LocalRun& run, const std::string& token) {
  const spec::TrainingJob& job = run.job;
  rendezvous::JobConfig config;
  config.job = run.key;
  config.token = token;
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
  const bool whole_world = run.exec || job.spec.trainer->pipeline.stages > 1;
  config.min_members =
      elastic ? job.spec.elastic.min_replicas : (whole_world ? job.spec.elastic.max_replicas : 1);
  config.max_members = spec::MaxWorld(job.spec);
  // Every local worker is started at once; the first generation takes replicas of them and any
  // standbys wait.
  config.initial_members = job.spec.replicas;
  config.store_limits = config.store_limits.SetByJob(job.spec.rendezvous.store.max_keys,
                                                     job.spec.rendezvous.store.max_bytes);
  config.ranks_per_pod = job.spec.ranks_per_worker;
  config.pods_multiple = spec::PodsPerPipelineReplicas(job.spec);
  config.wait_for_initial_members = true;
  config.heartbeat_timeout_ms = HeartbeatTimeoutMs();
  return config;
}

StatusOr<std::vector<WorkerCommand>> LocalCommands(const LocalRun& run,
                                                   const std::string& rendezvous_address,
                                                   const std::string& token,
                                                   int32_t* worker_slots) {
  WorkerCommandOptions options;
  options.worker_binary = run.worker_binary;
  options.log_dir = run.log_dir;
  options.manifest_path = run.manifest_copy;
  options.rendezvous_address = rendezvous_address;
  options.token = token;
  options.join_timeout_ms = EnvString("LOCKSTEP_JOIN_TIMEOUT_MS",
                                      std::to_string(RendezvousTimeoutMs() + kJoinTimeoutMarginMs));
  const int32_t servers = run.job.spec.parameter_servers.replicas;
  if (servers > 0) {
    // An exec job's TensorFlow tasks (TF_CONFIG): a port for every worker and server; the
    // built-in trainer's: one per server.
    const int32_t tf_workers = run.exec ? spec::WorkersToRun(run.job.spec) : 0;
    StatusOr<std::vector<int>> ports = PickLoopbackPorts(tf_workers + servers);
    if (!ports.ok()) {
      return Status(ports.status().code(), "parameter servers: " + ports.status().message());
    }
    for (int i = 0; i < tf_workers + servers; ++i) {
      (i < tf_workers ? options.tf_workers : options.parameter_servers)
          .push_back("127.0.0.1:" + std::to_string((*ports)[static_cast<size_t>(i)]));
    }
  }
  if (servers > 0 && !run.exec) {
    Status written = WriteLocalParameterServerCredentials(run.log_dir, &options);
    if (!written.ok()) return written.WithContext("parameter servers");
  }
  std::vector<WorkerCommand> commands = BuildWorkerCommands(run.job, options);
  *worker_slots = static_cast<int32_t>(commands.size());
  for (WorkerCommand& command : BuildParameterServerCommands(run.job, options)) {
    commands.push_back(std::move(command));
  }
  return commands;
}

SupervisorOptions LocalSupervisorOptions(const LocalRun& run) {
  SupervisorOptions options;
  options.grace_period_ms = RunGracePeriodMs();
  if (run.exec) {
    // An exec agent that is told to stop stops its command first (SIGTERM, SIGKILL after
    // LOCKSTEP_EXEC_GRACE_MS, then up to kAgentKillWaitMs for the exit), and only the agent can
    // end the command's group and its setsid descendants: killing the agent sooner would leave
    // them running.
    options.grace_period_ms =
        std::max(options.grace_period_ms,
                 std::max<int64_t>(0, EnvInt("LOCKSTEP_EXEC_GRACE_MS", kAgentGraceMs)) +
                     kAgentKillWaitMs + kAgentExitMarginMs);
  }
  return options;
}

std::string RunningLine(const LocalRun& run) {
  const spec::TrainingJobSpec& spec = run.job.spec;
  const int32_t ranks_per_worker = spec.ranks_per_worker;
  const int32_t replicas = spec.replicas, standby = spec.elastic.standby;
  const int32_t servers = spec.parameter_servers.replicas;
  std::ostringstream line;
  line << "lockstep: running " << run.key << " with " << replicas << " worker"
       << (replicas == 1 ? "" : "s")
       << (ranks_per_worker == 1 ? std::string()
                                 : " x " + std::to_string(ranks_per_worker) + " ranks = " +
                                       std::to_string(replicas * ranks_per_worker) + " ranks")
       << (standby == 0
               ? std::string()
               : " and " + std::to_string(standby) + " standby" + (standby == 1 ? "" : "s"))
       << (servers == 0 ? std::string()
                        : " and " + std::to_string(servers) + " parameter server" +
                              (servers == 1 ? "" : "s"))
       << "; logs in " << run.log_dir << "\n";
  return line.str();
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

std::string LocalParameterServerTlsDir(const std::string& log_dir) {
  return (fs::path(log_dir) / "ps-tls").string();
}

Status WriteLocalParameterServerCredentials(const std::string& log_dir,
                                            WorkerCommandOptions* options) {
  LOCKSTEP_ASSIGN_OR_RETURN(options->ps_token, GenerateJobToken());
  // The servers listen on 127.0.0.1, which is the name the workers dial and check. A day is
  // longer than any run this machine holds in memory; the CA signs nothing else.
  LOCKSTEP_ASSIGN_OR_RETURN(tls::KeyPair ca,
                            tls::CreateCertificateAuthority("lockstep run parameter servers", 1));
  LOCKSTEP_ASSIGN_OR_RETURN(tls::KeyPair serving,
                            tls::IssueServingCertificate(ca, {"localhost"}, {"127.0.0.1"}, 1));
  const fs::path dir = LocalParameterServerTlsDir(log_dir);
  std::error_code error;
  fs::remove_all(dir, error);
  if (mkdir(dir.c_str(), 0700) != 0) {
    return ErrnoStatus("cannot make " + dir.string(), errno);
  }
  const std::vector<std::pair<std::string, std::string>> files = {
      {"tls.crt", serving.cert_pem + ca.cert_pem},
      {"tls.key", serving.key_pem},
      {"ca.crt", ca.cert_pem}};
  for (const auto& [name, pem] : files) {
    const std::string path = (dir / name).string();
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoStatus("cannot write " + path, errno);
    const bool written = write(fd, pem.data(), pem.size()) == static_cast<ssize_t>(pem.size());
    const int write_error = errno;
    close(fd);
    if (!written) return ErrnoStatus("cannot write " + path, write_error);
  }
  options->ps_tls_cert_file = (dir / "tls.crt").string();
  options->ps_tls_key_file = (dir / "tls.key").string();
  options->ps_ca_file = (dir / "ca.crt").string();
  return OkStatus();
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

}  // namespace lockstep::cli
