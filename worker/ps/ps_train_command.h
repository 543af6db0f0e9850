// `lockstep-worker train` for a job whose sync.strategy is parameterServer: one worker of it
// (TrainThroughServers, ps_job.h) in the job's rendezvous, which reports its progress and
// completion to the launcher or the operator as the built-in trainer's workers do.
//
// Environment, besides the rendezvous client's (common/rendezvous/client_environment.h):
//   LOCKSTEP_PS_SERVERS          host:port of each parameter server, comma-separated, server s
//                                at place s (required)
//   LOCKSTEP_WORKER_INDEX        this worker's index, 0 .. replicas - 1 (required): its batches
//                                and its clock on the servers, kept by its replacements
//   LOCKSTEP_PS_WAIT_TIMEOUT_MS  how long a wait for the other workers may last (default 300000)
//
// Unlike the built-in trainer's workers, a parameter-server worker keeps training when the
// rendezvous generation changes (another worker lost or back): its state is on the servers, and
// it joins the next generation beside its training. Exit status: 0 done, 2 bad input, 1 any
// other failure, 128 + the signal after SIGTERM or SIGINT.
#pragma once

#include <string>

#include "common/spec/training_job.h"

namespace lockstep::ps {

int RunParameterServerWorker(const spec::TrainingJob& job, const std::string& job_name);

}  // namespace lockstep::ps
