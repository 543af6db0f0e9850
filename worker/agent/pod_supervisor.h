// The pod supervisor: a worker pod of `spec.ranksPerWorker` N > 1 runs N ranks, the way
// torchrun's --nproc-per-node runs one process per GPU of a node.
//
//   // worker/main.cc, before train or exec, when the manifest says N > 1 and this process is
//   // not itself one of the ranks (LOCKSTEP_LOCAL_RANK unset):
//   return lockstep::agent::RunPod({"/proc/self/exe", "train", "--manifest", path}, N, {});
//
// The supervisor starts N copies of the worker command, rank r with LOCKSTEP_LOCAL_RANK=r and
// LOCKSTEP_LOCAL_WORLD_SIZE=N added to its environment; each joins the rendezvous as local rank
// r of the pod (common/rendezvous/client_environment.h) and holds global rank
// pod_rank * N + r. Their output is relayed line by line (each line one write(2), so ranks'
// lines never interleave mid-line) to the supervisor's stdout and stderr.
//
// The pod is one member: whatever happens to one rank happens to the pod.
//  - Every rank exits 0: the supervisor exits 0.
//  - A rank fails (non-zero exit, or a signal): the supervisor stops the others (SIGTERM to each
//    rank's process group, SIGKILL after grace_ms) and exits with the failed rank's status in
//    the shell's convention (exit code, or 128 + signal). So the launcher or the kubelet sees
//    one failure of one pod, and the restart rules count it once; the rendezvous already took
//    the pod out of the generation when the rank's stream broke.
//  - SIGTERM or SIGINT to the supervisor (pod deletion, `lockstep run` stopping): forwarded to
//    every rank, which leaves the rendezvous and exits; then 128 + the signal.
//  - The supervisor is SIGKILLed: every rank dies with it (PR_SET_PDEATHSIG).
// Every wait is bounded: the supervisor returns within grace_ms + kill_wait_ms of deciding to stop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::agent {

struct PodOptions {
  // SIGTERM to SIGKILL when stopping the ranks. Longer than a rank's own stop (the trainer
  // leaves within 3 s; an exec agent gives its command LOCKSTEP_EXEC_GRACE_MS).
  int64_t grace_ms = 20000;
  int64_t kill_wait_ms = 5000;
};

// Runs `ranks` copies of `argv` (argv[0] an absolute path) as above and returns the pod's exit
// status. Installs handlers for SIGTERM, SIGINT and SIGCHLD: call it as the whole of a
// process's work.
int RunPod(const std::vector<std::string>& argv, int32_t ranks, const PodOptions& options);

// spec.ranksPerWorker when this process is a worker pod of several ranks, which it then
// supervises (RunPod); 1 when it is a rank itself (LOCKSTEP_LOCAL_RANK is set), when the pod runs
// one rank, and when the manifest cannot be read (the rank reports why). `args`: the worker's
// arguments from its command on ("train --manifest FILE", "exec -- python3 ..."); the manifest is
// --manifest's, else LOCKSTEP_SPEC.
int32_t RanksToSupervise(const std::vector<std::string>& args);

// The environment of local rank `local_rank` of `ranks`: `inherited` (NAME=value entries) with
// LOCKSTEP_LOCAL_RANK and LOCKSTEP_LOCAL_WORLD_SIZE set.
std::vector<std::string> RankEnvironment(const std::vector<std::string>& inherited,
                                         int32_t local_rank, int32_t ranks);

}  // namespace lockstep::agent
