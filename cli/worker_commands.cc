#include "cli/worker_commands.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <thread>

#include "common/env.h"
#include "common/program_path.h"
#include "common/spec/tf_config.h"
#include "common/termination_message.h"
#include "kernels/device.h"

namespace lockstep::cli {

namespace fs = std::filesystem;

// Threads for the linear-algebra library of each worker: the machine's cores shared among the
// local workers, so N workers do not each start one thread per core and thrash. A value the
// user set wins.
std::string ThreadsPerWorker(int32_t workers) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return std::to_string(std::max<unsigned>(1, cores / static_cast<unsigned>(workers)));
}

bool UsesCuda(const spec::TrainingJob& job) {
  return job.spec.trainer.has_value() && job.spec.trainer->device == spec::Device::kCuda;
}

std::vector<std::string> VisibleGpus() {
  std::vector<std::string> gpus;
  const std::string visible = EnvString("CUDA_VISIBLE_DEVICES", "");
  const int count = kernels::CudaDeviceCount();
  if (!visible.empty()) {
    std::stringstream entries(visible);
    std::string entry;
    while (std::getline(entries, entry, ',') && static_cast<int>(gpus.size()) < count) {
      if (!entry.empty()) gpus.push_back(entry);
    }
    return gpus;
  }
  for (int i = 0; i < count; ++i) gpus.push_back(std::to_string(i));
  return gpus;
}

std::vector<WorkerCommand> BuildWorkerCommands(const spec::TrainingJob& job,
                                               const WorkerCommandOptions& options) {
  const std::string& worker_binary = options.worker_binary;
  const std::string& log_dir = options.log_dir;
  const std::string& manifest_path = options.manifest_path;
  const std::string& rendezvous_address = options.rendezvous_address;
  const std::string& token = options.token;
  const std::string& join_timeout_ms = options.join_timeout_ms;
  std::vector<WorkerCommand> commands;
  const int32_t workers = spec::WorkersToRun(job.spec);  // replicas, then the standbys
  const int32_t ranks = job.spec.ranks_per_worker;       // each pod's supervisor starts its ranks
  // Threads for the ranks that train: a standby waits, and takes a trainer's place.
  const std::string threads = ThreadsPerWorker(job.spec.replicas * ranks);
  const std::vector<std::string> gpus = UsesCuda(job) ? VisibleGpus() : std::vector<std::string>{};
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
    if (!job.spec.command.empty()) {
      command.termination_log =
          (fs::path(log_dir) / ("worker-" + std::to_string(i) + ".termination")).string();
    }
    // Rank r of pod i serves on port + i * ranks + r.
    const int32_t metrics_port = job.spec.metrics.port == 0 ? 0 : job.spec.metrics.port + i * ranks;
    command.env = {
        {"LOCKSTEP_RENDEZVOUS", rendezvous_address},
        {"LOCKSTEP_JOB", job.metadata.namespace_ + "/" + job.metadata.name},
        {"LOCKSTEP_JOB_TOKEN", token},
        {"LOCKSTEP_POD", command.member_id},
        {"LOCKSTEP_HOST", "127.0.0.1"},
        {"LOCKSTEP_METRICS_PORT", std::to_string(metrics_port)},
        {"LOCKSTEP_JOIN_TIMEOUT_MS", join_timeout_ms},
        {"OPENBLAS_NUM_THREADS", EnvString("OPENBLAS_NUM_THREADS", threads)},
        {"OMP_NUM_THREADS", EnvString("OMP_NUM_THREADS", threads)},
    };
    if (!command.termination_log.empty()) {
      command.env.emplace_back(kTerminationLogEnv, command.termination_log);
    }
    command.env.emplace_back("LOCKSTEP_WORKER_INDEX", std::to_string(i));
    if (!options.tf_workers.empty()) {
      command.env.emplace_back(
          "TF_CONFIG",
          spec::TfConfig(options.tf_workers, options.parameter_servers, spec::TfTaskOfWorker(i)));
    } else if (!options.parameter_servers.empty()) {
      std::string servers;
      for (const std::string& server : options.parameter_servers) {
        servers += (servers.empty() ? "" : ",") + server;
      }
      command.env.emplace_back("LOCKSTEP_PS_SERVERS", servers);
      command.env.emplace_back("LOCKSTEP_PS_TOKEN", options.ps_token);
      if (!options.ps_ca_file.empty()) {
        command.env.emplace_back("LOCKSTEP_PS_CA_FILE", options.ps_ca_file);
      }
    }
    if ((i + 1) * ranks <= static_cast<int32_t>(gpus.size())) {
      // Pod i sees only its GPUs, i * ranks .. (i + 1) * ranks - 1 (as a device plugin gives a
      // pod its own), its rank r uses the r-th of them, and a replacement in the same slot gets
      // the same ones.
      std::string visible;
      for (int32_t r = 0; r < ranks; ++r) {
        visible += (r == 0 ? "" : ",") + gpus[static_cast<size_t>(i * ranks + r)];
      }
      command.env.emplace_back("CUDA_VISIBLE_DEVICES", visible);
    }
    commands.push_back(std::move(command));
  }
  return commands;
}

// `name` as execve needs it: a path is taken as it is (relative to the working directory), a bare
// name is looked up on PATH (as a shell would); a name not found stays, and its start fails
// naming it.
std::string FindProgram(const std::string& name) {
  StatusOr<std::string> program =
      ResolveProgram(name, EnvString("PATH", "/usr/local/bin:/usr/bin:/bin"));
  return program.ok() ? fs::absolute(*program).string() : name;  // exec names a missing one
}

std::vector<WorkerCommand> BuildParameterServerCommands(const spec::TrainingJob& job,
                                                        const WorkerCommandOptions& options) {
  std::vector<WorkerCommand> commands;
  for (size_t s = 0; s < options.parameter_servers.size(); ++s) {
    WorkerCommand command;
    command.member_id = job.metadata.name + "-ps-" + std::to_string(s);
    if (!job.spec.command.empty()) {
      // TensorFlow's ps task s: the job's own program, told its place by TF_CONFIG.
      command.argv = job.spec.command;
      command.argv[0] = FindProgram(command.argv[0]);
      command.log_path =
          (fs::path(options.log_dir) / ("ps-" + std::to_string(s) + ".log")).string();
      command.env = {
          {"LOCKSTEP_JOB", job.metadata.namespace_ + "/" + job.metadata.name},
          {"LOCKSTEP_POD", command.member_id},
          {"TF_CONFIG", spec::TfConfig(options.tf_workers, options.parameter_servers,
                                       spec::TfTaskOfServer(static_cast<int>(s)))},
      };
      commands.push_back(std::move(command));
      continue;
    }
    command.argv = {options.worker_binary,
                    "ps",
                    "--manifest",
                    options.manifest_path,
                    "--shard",
                    std::to_string(s),
                    "--listen",
                    options.parameter_servers[s]};
    command.log_path = (fs::path(options.log_dir) / ("ps-" + std::to_string(s) + ".log")).string();
    command.env = {
        {"LOCKSTEP_JOB", job.metadata.namespace_ + "/" + job.metadata.name},
        {"LOCKSTEP_PS_TOKEN", options.ps_token},
        {"LOCKSTEP_POD", command.member_id},
        // After the workers' ports (theirs: spec.metrics.port + worker x ranksPerWorker + rank).
        {"LOCKSTEP_METRICS_PORT",
         std::to_string(job.spec.metrics.port == 0
                            ? 0
                            : job.spec.metrics.port +
                                  spec::WorkersToRun(job.spec) * job.spec.ranks_per_worker +
                                  static_cast<int32_t>(s))},
    };
    if (!options.ps_tls_cert_file.empty()) {
      command.env.emplace_back("LOCKSTEP_PS_TLS_CERT_FILE", options.ps_tls_cert_file);
      command.env.emplace_back("LOCKSTEP_PS_TLS_KEY_FILE", options.ps_tls_key_file);
    }
    // A server restarts from its shard's newest checkpoint; without checkpoints its shard would
    // start over, and the job fails instead.
    command.restartable = !job.spec.checkpoint.uri.empty();
    commands.push_back(std::move(command));
  }
  return commands;
}

}  // namespace lockstep::cli
