#include "tests/support/job/local_job.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <fstream>

namespace lockstep::testing {
namespace {

rendezvous::JobConfig ConfigOf(const LocalJobSpec& spec) {
  rendezvous::JobConfig config;
  config.job = spec.job;
  config.token = kTestJobToken;
  config.min_members = spec.min_replicas > 0 ? spec.min_replicas : spec.replicas;
  config.max_members = spec.replicas;
  config.ranks_per_pod = spec.ranks_per_pod;
  return config;
}

bool SetsSpec(const Environment& env) {
  return std::any_of(env.begin(), env.end(),
                     [](const auto& entry) { return entry.first == "LOCKSTEP_SPEC"; });
}

}  // namespace

LocalJob::LocalJob(const std::filesystem::path& dir, const LocalJobSpec& spec)
    : rendezvous_(ConfigOf(spec), spec.hosts != nullptr ? spec.hosts->gateway() : "127.0.0.1") {
  if (!rendezvous_.ok()) return;
  const std::string name = spec.job.substr(spec.job.find('/') + 1) + spec.tag;
  const std::filesystem::path manifest_path = dir / (name + ".yaml");
  std::ofstream(manifest_path) << spec.manifest;
  // With LOCKSTEP_SPEC in the environment the worker reads the manifest from there.
  std::vector<std::string> argv = {LOCKSTEP_WORKER_BINARY, "train"};
  if (!SetsSpec(spec.env)) argv.insert(argv.end(), {"--manifest", manifest_path.string()});
  for (int i = 0; i < spec.replicas; ++i) {
    Environment env = rendezvous_.MemberEnv("worker-" + std::to_string(i));
    if (spec.hosts != nullptr) env.emplace_back("LOCKSTEP_HOST", spec.hosts->address(i));
    env.insert(env.end(), spec.env.begin(), spec.env.end());  // the spec's entries win
    workers_.push_back(std::make_unique<ChildProcess>(
        spec.hosts != nullptr ? spec.hosts->Wrap(i, argv) : argv, env,
        (dir / (name + "-worker-" + std::to_string(i) + ".log")).string()));
    EXPECT_GT(workers_.back()->pid(), 0);
  }
}

LocalJob::~LocalJob() { workers_.clear(); }  // before the service: kills what still runs

void LocalJob::KillAll() {
  for (auto& worker : workers_) {
    if (worker->pid() > 0) kill(worker->pid(), SIGKILL);
  }
  for (auto& worker : workers_) worker->Wait(10000);
}

JobRun LocalJob::WaitAll(std::chrono::seconds timeout) {
  JobRun run;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (auto& worker : workers_) {
    const ProcessResult result = worker->WaitUntil(deadline);
    run.exit_codes.push_back(result.code());
    run.logs += result.out;
  }
  run.snapshot = rendezvous_.Snapshot();
  return run;
}

JobRun RunLocalJob(const std::filesystem::path& dir, const LocalJobSpec& spec,
                   std::chrono::seconds timeout) {
  LocalJob job(dir, spec);
  return job.WaitAll(timeout);
}

}  // namespace lockstep::testing
