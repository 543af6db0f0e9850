// ParseExecAgentArgs (exec_agent.h): the arguments after "exec" (worker_command_line.h), the
// manifest and the LOCKSTEP_ environment, with the tunables of docs/exec.md.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/rendezvous/client_environment.h"
#include "common/spec/training_job.h"
#include "worker/agent/exec_agent.h"
#include "worker/agent/exec_environment.h"
#include "worker/agent/worker_command_line.h"

namespace lockstep::agent {

// Tunables (docs/exec.md).
LOCKSTEP_PARAM_INT(ExecGraceMs, "LOCKSTEP_EXEC_GRACE_MS", 10000);
LOCKSTEP_PARAM_INT(ExecBackoffMs, "LOCKSTEP_EXEC_BACKOFF_MS", 1000);
LOCKSTEP_PARAM_INT(ExecMaxBackoffMs, "LOCKSTEP_EXEC_MAX_BACKOFF_MS", 30000);
LOCKSTEP_PARAM_INT(ExecJoinTimeoutMs, "LOCKSTEP_JOIN_TIMEOUT_MS", 600000);
LOCKSTEP_PARAM_INT(ExecPlanTimeoutMs, "LOCKSTEP_EXEC_PLAN_TIMEOUT_MS", 60000);
LOCKSTEP_PARAM_INT(ExecWarmSpare, "LOCKSTEP_EXEC_WARM_SPARE", 1);
LOCKSTEP_PARAM_INT(ExecSpareIdle, "LOCKSTEP_EXEC_SPARE_IDLE", 0);
LOCKSTEP_PARAM_INT(ExecZygote, "LOCKSTEP_EXEC_ZYGOTE", 1);
LOCKSTEP_PARAM_INT(ExecProgramAhead, "LOCKSTEP_EXEC_PROGRAM_AHEAD", 1);

StatusOr<ExecAgentOptions> ParseExecAgentArgs(const std::vector<std::string>& args) {
  StatusOr<WorkerCommandLine> line = ParseWorkerCommandLine(WorkerMode::kExec, args);
  if (!line.ok()) return line.status();
  const std::string& manifest_path = line->manifest_path;
  std::vector<std::string> command = line->command;

  std::optional<spec::TrainingJob> job;
  // A manifest is optional here: the command may come after --.
  if (!manifest_path.empty() || !EnvString("LOCKSTEP_SPEC", "").empty()) {
    StatusOr<spec::TrainingJob> loaded = spec::LoadTrainingJobFileOrEnv(manifest_path);
    if (!loaded.ok()) return loaded.status();
    job = *loaded;
  }

  ExecAgentOptions options;
  if (command.empty() && job) command = job->spec.command;
  if (command.empty()) {
    return InvalidArgumentError("no command: give it after -- or in the manifest's spec.command");
  }
  options.command = command;
  options.job = EnvString(
      "LOCKSTEP_JOB", job ? job->metadata.namespace_ + "/" + job->metadata.name : std::string());
  if (options.job.empty()) {
    return InvalidArgumentError("environment variable LOCKSTEP_JOB is not set (and no manifest)");
  }
  StatusOr<rendezvous::ClientOptions> client =
      rendezvous::ClientOptionsFromEnvironment(options.job);
  if (!client.ok()) return client.status();
  options.client = *client;
  // Rank r of a pod of several ranks serves on the pod's port + r.
  const int64_t base_port = EnvInt("LOCKSTEP_METRICS_PORT", job ? job->spec.metrics.port : 0);
  const int64_t metrics_port = base_port == 0 ? 0 : base_port + options.client.local_rank;
  if (metrics_port < 0 || metrics_port > 65535) {
    return InvalidArgumentError("LOCKSTEP_METRICS_PORT " + std::to_string(metrics_port) +
                                " outside 0..65535");
  }
  options.metrics_port = static_cast<int>(metrics_port);
  if (job) {
    options.budget.policy = job->spec.run_policy.restart_policy;
    options.budget.backoff_limit = job->spec.run_policy.backoff_limit;
    options.budget.retryable_exit_codes = job->spec.run_policy.retryable_exit_codes;
    options.network = job->spec.network;
  }
  options.python_path = FindPythonHelpers("/proc/self/exe");
  options.budget.initial_backoff_ms = std::max<int64_t>(0, ExecBackoffMs());
  options.budget.max_backoff_ms = std::max(options.budget.initial_backoff_ms, ExecMaxBackoffMs());
  options.grace_ms = std::max<int64_t>(0, ExecGraceMs());
  options.warm_spare = ExecWarmSpare() != 0;
  options.spare_at_idle_priority = ExecSpareIdle() != 0;
  options.zygote = ExecZygote() != 0;
  options.program_ahead = ExecProgramAhead() != 0;
  options.join_timeout_ms = std::max<int64_t>(1, ExecJoinTimeoutMs());
  options.plan_timeout_ms = std::max<int64_t>(1, ExecPlanTimeoutMs());
  return options;
}

}  // namespace lockstep::agent
