// The exec agent: `lockstep-worker exec [--manifest FILE] -- COMMAND...` runs any training
// program (a PyTorch script) as one member of a Lockstep job, the way torchrun's elastic agent
// runs one node's workers.
//
//   int main(int argc, char** argv) {   // worker/main.cc, for argv[1] == "exec"
//     return lockstep::agent::RunExecAgent({argv + 2, argv + argc});
//   }
//
// For every rendezvous generation the agent: joins; heartbeats; agrees with the other agents on
// the generation's plan (master port, restart count, back-off, give-up) through the generation's
// store (the protocol is in restart_protocol.h); starts COMMAND with MASTER_ADDR, MASTER_PORT,
// RANK, WORLD_SIZE, LOCAL_RANK, ... (exec_environment.h), its output relayed with a `[rank N] `
// prefix; reports the program's progress file (progress_file.h) on its heartbeats and metrics;
// and, when the command fails anywhere or the membership changes, stops it (SIGTERM to its
// process group, SIGKILL after LOCKSTEP_EXEC_GRACE_MS) while it joins the next generation, and
// starts it again there once every member's previous command has stopped. The agent is a child
// subreaper: what the command leaves behind (a setsid daemon) is ended with it.
// docs/exec.md is the user's page.
//
// Inputs. Environment: LOCKSTEP_RENDEZVOUS, LOCKSTEP_JOB, LOCKSTEP_JOB_TOKEN, LOCKSTEP_POD,
// LOCKSTEP_HOST (default 127.0.0.1), LOCKSTEP_METRICS_PORT (default spec.metrics.port; 0: no
// endpoint). The manifest (for spec.runPolicy, spec.command and spec.network, which decides the
// NCCL IB settings the command inherits: docs/rdma.md) from --manifest FILE or
// LOCKSTEP_SPEC (JSON); without either, runPolicy's defaults apply. COMMAND after `--` wins over
// spec.command.
//
// Exit status: 0 when this member's command exited 0; when restarts are exhausted (or the
// restart policy forbids one), the last failure's status as the shell reports it (exit code, or
// 128 + signal; 127 not found, 126 not executable) on every agent; after SIGTERM/SIGINT to the
// agent, the command's own status (143 when SIGTERM killed it); 2 for bad usage, a bad manifest
// or a missing variable; 1 when the rendezvous fails (no generation within the join timeout).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/rendezvous/client.h"
#include "common/spec/training_job.h"
#include "common/status.h"
#include "worker/agent/restart_protocol.h"

namespace lockstep::agent {

// Runs the agent with the arguments that follow "exec"; returns the process exit status.
// Installs handlers for SIGTERM, SIGINT and SIGCHLD and ignores SIGPIPE: call it as the whole
// of a process's work. A SIGTERM/SIGINT that arrives while the agent waits in a rendezvous Join
// (which cannot be interrupted) makes it Leave and _Exit(128 + signal) at once.
int RunExecAgent(const std::vector<std::string>& args);

// The program's name in the agent's error lines ("lockstep-worker exec: error: ..."); main sets
// it once, before RunExecAgent (a rank of a pod is started as /proc/self/exe, whose name says
// nothing). Default "lockstep-worker".
void SetAgentProgramName(const std::string& name);

struct ExecAgentOptions {
  rendezvous::ClientOptions client;
  std::string job;  // namespace/name, for logs, metrics and TORCHELASTIC_RUN_ID
  std::vector<std::string> command;
  RestartBudget budget;
  int metrics_port = 0;
  // SIGTERM to SIGKILL when stopping the command. Longer: the program may save a checkpoint;
  // shorter: faster recovery from a hung program.
  int64_t grace_ms = 10000;
  int64_t kill_wait_ms = 5000;       // after SIGKILL, how long to wait for the exit
  int64_t join_timeout_ms = 600000;  // one Join: every member must have started by then
  int64_t plan_timeout_ms = 60000;   // waiting for rank 0's plan
  int64_t store_timeout_ms = 10000;  // each store call
  // spec.network (default without a manifest: tcp): decides the NCCL IB settings the command
  // inherits (worker/comm/rdma/nccl_rdma_setup.h).
  spec::NetworkSpec network;
  // Keep a warm spare of a program that uses the helper's elastic entry point
  // (LOCKSTEP_EXEC_WARM_SPARE, default 1): a failed process is replaced by one whose start-up is
  // done. Costs a second idle process (its memory) per member.
  bool warm_spare = true;
  // The spare waits under SCHED_IDLE (common/cpu_priority.h), where the agent can undo that
  // (LOCKSTEP_EXEC_SPARE_IDLE, default 0): for nodes whose CPUs idle while they train. Where the
  // ranks keep every core busy the spare starves, and is promoted before its start-up is done
  // (docs/benchmarks.md, "Goodput under repeated failures").
  bool spare_at_idle_priority = false;
  // Fork the warm spares of a Python command, and the program of a member whose join waited (a
  // standby's), from a zygote that did the command's imports once (LOCKSTEP_EXEC_ZYGOTE, default
  // 1; zygote.h): a replaced spare costs milliseconds of CPU, not the seconds of `import torch`.
  bool zygote = true;
  // With the zygote: a member whose join waits (a standby) forks a script that imports
  // lockstep.elastic ahead of a place; it runs its start-up and takes the place if it waits in
  // elastic.run() (LOCKSTEP_EXEC_PROGRAM_AHEAD, default 1; python/lockstep/identity.py).
  bool program_ahead = true;
  // Appended to the command's PYTHONPATH: the pure-Python helpers installed with the worker
  // (FindPythonHelpers); empty: none found.
  std::string python_path;
};

// Parses the arguments after "exec" and the LOCKSTEP_ environment (read through getenv) into
// options. InvalidArgument with one line naming what is wrong.
StatusOr<ExecAgentOptions> ParseExecAgentArgs(const std::vector<std::string>& args);

}  // namespace lockstep::agent
