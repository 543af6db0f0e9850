// One job on this machine without `lockstep run`: a rendezvous service hosted in the test process
// and `replicas` lockstep-worker processes training a manifest, each logging (stdout and stderr)
// to <dir>/<name><tag>-worker-<i>.log. The test reads the job's state from the service, kills or
// signals workers, and waits for all of them with one deadline.
//
//   LocalJob job(dir, {.job = "default/digits", .manifest = yaml, .replicas = 2});
//   ASSERT_TRUE(job.WaitForStep(20, 30000)) << job.worker(0).StdoutSoFar();
//   JobRun run = job.WaitAll(std::chrono::seconds(60));
//   EXPECT_EQ(run.exit_codes, (std::vector<int>{0, 0})) << run.logs;
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/rendezvous/server.h"
#include "tests/support/job/in_process_rendezvous.h"
#include "tests/support/netns/netns_hosts.h"
#include "tests/support/process/child_process.h"

namespace lockstep::testing {

struct LocalJobSpec {
  std::string job;       // namespace/name
  std::string manifest;  // YAML; written to <dir>/<name><tag>.yaml and passed as --manifest,
                         // unless `env` sets LOCKSTEP_SPEC (the worker then reads that)
  int replicas = 1;
  int min_replicas = 0;  // the service's lower bound of members; 0: replicas
  Environment env{};     // more environment of every worker (overriding MemberEnv)
  std::string tag{};     // tells apart the files of several incarnations of one job in one dir
  // spec.ranksPerWorker of the manifest: each worker is a pod of this many ranks, and the
  // service counts pods (JobConfig::ranks_per_pod).
  int ranks_per_pod = 1;
  // Worker i runs on test host i (inside its network namespace, LOCKSTEP_HOST its address) and
  // the service listens on the hosts' gateway; nullptr: every worker on loopback.
  const NetnsHosts* hosts = nullptr;
};

// The outcome of a job whose workers all ended.
struct JobRun {
  std::vector<int> exit_codes;  // ProcessResult::code() of each worker, in worker order
  std::string logs;             // every worker's log, in worker order
  rendezvous::JobSnapshot snapshot;
};

class LocalJob {
 public:
  // Starts the service and the workers; a failure to start either fails the test.
  LocalJob(const std::filesystem::path& dir, const LocalJobSpec& spec);
  // Kills the workers that still run, then shuts the service down.
  ~LocalJob();
  LocalJob(const LocalJob&) = delete;
  LocalJob& operator=(const LocalJob&) = delete;

  ChildProcess& worker(int i) { return *workers_[static_cast<size_t>(i)]; }
  InProcessRendezvous& rendezvous() { return rendezvous_; }
  rendezvous::JobSnapshot Snapshot() const { return rendezvous_.Snapshot(); }
  // Polls the service until the job's reported progress reaches `step`, at most timeout_ms.
  bool WaitForStep(int64_t step, int64_t timeout_ms) const {
    return rendezvous_.WaitForStep(step, timeout_ms);
  }
  // SIGKILLs every worker and reaps them (each within 10 s).
  void KillAll();
  // Waits for every worker with one deadline `timeout` from now (one still running at it is
  // killed: code -1), then reads the logs and the service's snapshot.
  JobRun WaitAll(std::chrono::seconds timeout);

 private:
  InProcessRendezvous rendezvous_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
};

// Runs a job to its end: LocalJob(dir, spec).WaitAll(timeout).
JobRun RunLocalJob(const std::filesystem::path& dir, const LocalJobSpec& spec,
                   std::chrono::seconds timeout);

}  // namespace lockstep::testing
