// The processes of a local run (`lockstep run`): one command per worker, with the environment a
// pod of the operator's would give it (docs/cli.md), and the GPUs this machine can hand out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/launcher.h"
#include "common/spec/training_job.h"

namespace lockstep::cli {

struct WorkerCommandOptions {
  std::string worker_binary;       // lockstep-worker, absolute
  std::string log_dir;             // worker i logs to log_dir/worker-<i>.log
  std::string manifest_path;       // the effective manifest every worker reads
  std::string rendezvous_address;  // host:port
  std::string token;               // the job's token
  std::string join_timeout_ms;     // LOCKSTEP_JOIN_TIMEOUT_MS of every worker
  // host:port of each parameter server (LOCKSTEP_PS_SERVERS); empty without spec.parameterServers.
  std::vector<std::string> parameter_servers;
  // An exec job with parameter servers: host:port of each worker's TensorFlow task, by index
  // (TF_CONFIG, common/spec/tf_config.h); parameter_servers then holds the ps tasks'.
  std::vector<std::string> tf_workers;
  // The built-in trainer's parameter servers: their own token (never the rendezvous token, which
  // they are not given) and, when set, TLS files (ps_credentials.h's variables).
  std::string ps_token;
  std::string ps_tls_cert_file;  // the servers' certificate chain and key
  std::string ps_tls_key_file;
  std::string ps_ca_file;  // what the workers trust
};

// Threads for the linear-algebra library of each of `workers` local workers.
std::string ThreadsPerWorker(int32_t workers);

bool UsesCuda(const spec::TrainingJob& job);

// The GPUs this process may hand out, as CUDA_VISIBLE_DEVICES entries: the launcher's own
// CUDA_VISIBLE_DEVICES list when it is set (indices or UUIDs), else 0 .. count - 1.
std::vector<std::string> VisibleGpus();

// One command per local worker pod: member id <name>-worker-<i>, argv (train, or exec for a
// command:), its log, metrics port (spec.metrics.port + i * ranksPerWorker; its ranks add
// their local rank) and environment; pod i of a cuda job sees only its ranksPerWorker visible
// GPUs, from the (i * ranksPerWorker)-th on.
// Worker i also gets LOCKSTEP_WORKER_INDEX i, and LOCKSTEP_PS_SERVERS when the job has parameter
// servers (TF_CONFIG instead for an exec job: options.tf_workers).
std::vector<WorkerCommand> BuildWorkerCommands(const spec::TrainingJob& job,
                                               const WorkerCommandOptions& options);

// One command per parameter server of spec.parameterServers: member id <name>-ps-<s>,
// `lockstep-worker ps --manifest ... --shard s --listen <options.parameter_servers[s]>`, its log
// log_dir/ps-<s>.log, and the job's token; restartable (from its shard's checkpoint) only when the
// job has spec.checkpoint.uri. An exec job's server runs spec.command itself as TensorFlow's ps
// task s (TF_CONFIG), restartable under the run policy.
std::vector<WorkerCommand> BuildParameterServerCommands(const spec::TrainingJob& job,
                                                        const WorkerCommandOptions& options);

}  // namespace lockstep::cli
