// The environment the exec agent gives the user's command in one generation: what PyTorch's
// `init_process_group(init_method="env://")` and torchrun-aware scripts expect, computed from the
// rendezvous assignment and rank 0's plan.
//
//   std::vector<std::string> env = BuildExecEnvironment(environ_entries, assignment, plan, extra);
//
// Each agent runs one process, one rank; a pod of spec.ranksPerWorker N runs N agents
// (worker/agent/pod_supervisor.h), torchrun's --nproc-per-node=N. So:
//   RANK = ROLE_RANK = the member's rank; WORLD_SIZE = ROLE_WORLD_SIZE = the world;
//   N > 1: LOCAL_RANK / LOCAL_WORLD_SIZE = the rank's place in its pod and N, GROUP_RANK /
//   GROUP_WORLD_SIZE = the pod's index and the number of pods;
//   N = 1: GROUP_RANK = RANK, GROUP_WORLD_SIZE = WORLD_SIZE, and LOCAL_RANK / LOCAL_WORLD_SIZE =
//   the member's index among, and the number of, the members whose host equals its own (by
//   rank order), e.g. for GPU selection when several members share a machine;
//   MASTER_ADDR = rank 0's host, MASTER_PORT = the plan's port;
//   TORCHELASTIC_RESTART_COUNT = failure restarts so far, TORCHELASTIC_MAX_RESTARTS =
//   backoffLimit, TORCHELASTIC_RUN_ID = the job (namespace/name).
// The agent's own environment is passed through except LOCKSTEP_JOB_TOKEN: the program has no
// use for the job's secret, so it is not handed to user code. PYTHONUNBUFFERED=1 is added unless
// set, so a Python program's lines reach the relay as they are printed.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/rendezvous/client.h"
#include "worker/agent/restart_protocol.h"

namespace lockstep::agent {

struct ExecEnvironmentExtras {
  std::string run_id;  // TORCHELASTIC_RUN_ID: the job
  int32_t max_restarts = 0;
  std::string progress_file;  // LOCKSTEP_PROGRESS_FILE
};

struct LocalPlacement {
  int32_t local_rank = 0;
  int32_t local_world_size = 1;
};
// LOCAL_RANK and LOCAL_WORLD_SIZE of `rank` among `members` (which are by rank).
LocalPlacement ComputeLocalPlacement(const std::vector<rendezvous::MemberInfo>& members,
                                     int32_t rank);

// The variables the agent sets (name, value), in a fixed order.
std::vector<std::pair<std::string, std::string>> ExecVariables(
    const rendezvous::Assignment& assignment, const GenerationPlan& plan,
    const ExecEnvironmentExtras& extras);

// `inherited` (NAME=value entries, e.g. from environ) without LOCKSTEP_JOB_TOKEN, with
// ExecVariables overriding any entry of the same name.
std::vector<std::string> BuildExecEnvironment(const std::vector<std::string>& inherited,
                                              const rendezvous::Assignment& assignment,
                                              const GenerationPlan& plan,
                                              const ExecEnvironmentExtras& extras);

}  // namespace lockstep::agent
