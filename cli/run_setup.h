// What `lockstep run` does before its workers start (run_command.h, steps 1 to 3): the manifest
// checked against this machine and copied into the log directory, the rendezvous job, and the
// workers' and parameter servers' command lines. Also the run's tunables (docs/cli.md).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "cli/launcher.h"
#include "cli/run_command.h"
#include "cli/worker_commands.h"
#include "common/env.h"
#include "common/rendezvous/job_state.h"
#include "common/spec/training_job.h"
#include "common/status.h"

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

// Most processes (workers x ranks per worker) `lockstep run` starts on one machine.
inline constexpr int64_t kMaxLocalRanks = 1024;
// Between the rendezvous timeout and the workers' Join deadline (RendezvousTimeoutMs).
inline constexpr int64_t kJoinTimeoutMarginMs = 5000;

// A run ready to start: the effective job and where everything of it is.
struct LocalRun {
  spec::TrainingJob job;      // --replicas applied
  std::string key;            // NAMESPACE/NAME: the job's name at the rendezvous
  std::string worker_binary;  // lockstep-worker, absolute
  std::string log_dir;
  std::string manifest_copy;  // log_dir/manifest.json, data paths absolute: what the workers read
  bool exec = false;          // a command job (spec.command) rather than the built-in trainer
};

// Step 1: the manifest checked as `lockstep validate` checks it, --replicas applied, the job
// checked against this machine's GPUs and memory, the log directory made and the effective
// manifest written there. kExitOk, or the exit code once err says why; nothing has started.
int PrepareLocalRun(const RunOptions& options, std::ostream& err, LocalRun* run);

// Step 2: the job as the in-process rendezvous service holds it, its members from spec.elastic.
rendezvous::JobConfig LocalJobConfig(const LocalRun& run, const std::string& token);

// Step 3: the commands, the workers' in slots 0 .. *worker_slots - 1 and the parameter servers'
// after them (the workers wait for the servers to listen).
StatusOr<std::vector<WorkerCommand>> LocalCommands(const LocalRun& run,
                                                   const std::string& rendezvous_address,
                                                   const std::string& token, int32_t* worker_slots);

// How the supervisor stops the run's processes: an exec agent gets the time it needs to stop its
// command first.
SupervisorOptions LocalSupervisorOptions(const LocalRun& run);

// "lockstep: running NAMESPACE/NAME with 4 workers ...; logs in DIR", newline included.
std::string RunningLine(const LocalRun& run);

// Applies --replicas to the job: sets spec.replicas and, for a job without spec.elastic, the
// elastic range to exactly that many. InvalidArgument when it falls outside spec.elastic.
Status ApplyReplicasOverride(int32_t replicas, spec::TrainingJob* job);

// device: cuda needs a usable CUDA device on this machine and a GPU of its own for every worker
// (worker i is given the i-th visible GPU through CUDA_VISIBLE_DEVICES). FAILED_PRECONDITION
// naming spec.trainer.device and the reason otherwise; OK for every other manifest.
Status CheckDevicePlacement(const spec::TrainingJob& job);

// ./lockstep-logs/<name>-<YYYYmmdd-HHMMSS> when the working directory is writable, else
// ${TMPDIR:-/tmp}/lockstep-logs/<name>-<YYYYmmdd-HHMMSS>; "-2", "-3", ... when taken. Creates it.
StatusOr<std::string> CreateDefaultLogDir(const std::string& job_name);

// 32 bytes from OpenSSL's CSPRNG, as 64 lowercase hex digits.
StatusOr<std::string> GenerateJobToken();

// The built-in trainer's parameter servers under `lockstep run`: a token of their own, and a CA
// and a certificate for 127.0.0.1 written under LocalParameterServerTlsDir (0700, files 0600),
// which the run removes at its end. Sets options' ps_* fields.
std::string LocalParameterServerTlsDir(const std::string& log_dir);
Status WriteLocalParameterServerCredentials(const std::string& log_dir,
                                            WorkerCommandOptions* options);

}  // namespace lockstep::cli
