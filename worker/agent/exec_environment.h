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
// set, so a Python program's lines reach the relay as they are printed, and the helpers' directory
// is appended to PYTHONPATH, so `import lockstep.progress` works in any interpreter.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/rendezvous/client.h"
#include "common/status.h"
#include "worker/agent/restart_protocol.h"

namespace lockstep::agent {

struct ExecEnvironmentExtras {
  std::string run_id;  // TORCHELASTIC_RUN_ID: the job
  int32_t max_restarts = 0;
  std::string progress_file;  // LOCKSTEP_PROGRESS_FILE
  // Appended to PYTHONPATH: where Lockstep's pure-Python helpers are (`import lockstep.progress`);
  // empty: PYTHONPATH is left as inherited.
  std::string python_path;
  // LOCKSTEP_STATE_SNAPSHOT: where the elastic helper keeps a copy of the program's state between
  // its saves (empty: not set).
  std::string state_snapshot;
};

// The directory of the Python helpers installed with `worker_binary`: <prefix>/lib/lockstep/python
// beside <prefix>/bin/lockstep-worker (the image, and the build tree, which copies them there);
// empty when it is not there.
std::string FindPythonHelpers(const std::string& worker_binary);

// A port free on this host now (MASTER_PORT): bound to port 0 on all interfaces (where PyTorch's
// TCPStore will listen), read back, released. Another process could take it before the program
// binds it; the window is the program's start-up, the same as torchrun's, and a new generation
// picks again.
StatusOr<int32_t> PickFreePort();

// `env` (NAME=value entries) with every loader variable the launcher parked back under its own
// name (LOCKSTEP_IMAGE_LD_PRELOAD=x becomes LD_PRELOAD=x, winning over an LD_PRELOAD already
// there; parked_loader.h): the environment the programs the agent starts inherit, as the image
// gave it. Other LOCKSTEP_IMAGE_ variables (not the launcher's) stay as they are.
std::vector<std::string> RestoreParkedLoaderVariables(const std::vector<std::string>& env);

// A private directory (mkdtemp under `parent`, default $TMPDIR or /tmp, else /dev/shm for an image
// without /tmp) for the progress file and the helper's state snapshot; removed with everything in
// it when this object is destroyed.
class PrivateDirectory {
 public:
  static StatusOr<PrivateDirectory> Create(const std::string& parent = "");
  PrivateDirectory(PrivateDirectory&& other) noexcept;
  PrivateDirectory& operator=(PrivateDirectory&&) = delete;
  ~PrivateDirectory();
  const std::string& path() const { return path_; }

 private:
  explicit PrivateDirectory(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// Names the variables a process started before it has a place must not read yet
// (BuildAwaitingEnvironment; python/lockstep/identity.py).
inline constexpr char kAwaitIdentityEnv[] = "LOCKSTEP_AWAIT_IDENTITY";

// The variables that say who a process is in its generation (rank, world, master, restart
// count), from the assignment and the plan, in a fixed order.
std::vector<std::pair<std::string, std::string>> IdentityVariables(
    const rendezvous::Assignment& assignment, const GenerationPlan& plan);

// The variables the agent sets (name, value): IdentityVariables, then the job's (ROLE_NAME,
// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, the progress file, the state snapshot).
std::vector<std::pair<std::string, std::string>> ExecVariables(
    const rendezvous::Assignment& assignment, const GenerationPlan& plan,
    const ExecEnvironmentExtras& extras);

// `inherited` (NAME=value entries, e.g. from environ) without LOCKSTEP_JOB_TOKEN, with
// ExecVariables overriding any entry of the same name.
std::vector<std::string> BuildExecEnvironment(const std::vector<std::string>& inherited,
                                              const rendezvous::Assignment& assignment,
                                              const GenerationPlan& plan,
                                              const ExecEnvironmentExtras& extras);

// The environment of a process forked before its worker has a place (a standby's program,
// started ahead so that its start-up is done when a place comes): BuildExecEnvironment's without
// the IdentityVariables (removed from `inherited` too), and kAwaitIdentityEnv naming them,
// comma-separated. The process's Python side (lockstep/identity.py) waits for them where the
// program first reads one; the agent sends them with the assignment (helper_channel.h).
std::vector<std::string> BuildAwaitingEnvironment(const std::vector<std::string>& inherited,
                                                  const ExecEnvironmentExtras& extras);

}  // namespace lockstep::agent
