// Exec mode end to end: a RendezvousServer in the test process, real exec agents
// (lockstep-exec-agent-test, i.e. `lockstep-worker exec`) as processes, and real commands: the
// PyTorch DDP example under Debian's /usr/bin/python3 (torch 1.13, gloo), and shell commands for
// the failure cases.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "common/process_stat.h"
#include "common/rendezvous/server.h"
#include "tests/integration/exec/pytorch_program.h"
#include "tests/support/job/job.h"

namespace lockstep::agent {
namespace {

using lockstep::testing::ChildProcess;
using lockstep::testing::TorchAvailable;
using lockstep::testing::ChildrenWithEnv;
using lockstep::testing::MakeTempDir;
using lockstep::testing::PollUntil;
using lockstep::testing::ProcessResult;
using lockstep::testing::ReadFile;
using lockstep::testing::WriteFile;

const std::string kAgent = LOCKSTEP_EXEC_AGENT_BINARY;
const std::string& kScript = lockstep::testing::kDdpScript;
const std::string& kPython = lockstep::testing::kTestPython;
// Every wait below is bounded by this or less; a loaded 2-core machine imports torch in ~3 s.
constexpr int64_t kTrainWaitMs = 90000;

// A job on an in-process rendezvous service, and agents started against it.
class ExecJob {
 public:
  ExecJob(const std::string& name, int32_t min_members, int32_t max_members,
          int32_t initial_members, int32_t backoff_limit)
      : name_(name),
        backoff_limit_(backoff_limit),
        rendezvous_(Config(name, min_members, max_members, initial_members)) {}

  std::unique_ptr<ChildProcess> StartAgent(int index, const std::vector<std::string>& command,
                                          const std::string& grace_ms = "3000") {
    const std::string member = name_ + "-worker-" + std::to_string(index);
    nlohmann::json manifest = {{"apiVersion", "lockstep.io/v1alpha1"},
                               {"kind", "TrainingJob"},
                               {"metadata", {{"name", name_}}},
                               {"spec",
                                {{"replicas", 1},
                                 {"command", command},
                                 {"runPolicy", {{"backoffLimit", backoff_limit_}}},
                                 {"metrics", {{"port", 0}}}}}};
    std::vector<std::string> argv = {kAgent, "exec", "--"};
    argv.insert(argv.end(), command.begin(), command.end());
    lockstep::testing::Environment env = rendezvous_.MemberEnv(member);
    env.insert(env.end(), {{"LOCKSTEP_SPEC", manifest.dump()},
                           {"LOCKSTEP_EXEC_GRACE_MS", grace_ms},
                           {"LOCKSTEP_EXEC_BACKOFF_MS", "200"},
                           {"OMP_NUM_THREADS", "1"}});
    return std::make_unique<ChildProcess>(argv, env);
  }

  rendezvous::JobSnapshot Snapshot() const { return rendezvous_.Snapshot(); }
  // Waits until some member reported training progress of at least `step`.
  bool WaitForStep(int64_t step, int64_t timeout_ms) const {
    return PollUntil([&] { return Snapshot().progress.step >= step; }, timeout_ms, 50);
  }

 private:
  static rendezvous::JobConfig Config(const std::string& name, int32_t min_members,
                                      int32_t max_members, int32_t initial_members) {
    rendezvous::JobConfig config;
    config.job = "default/" + name;
    config.token = "test-token-" + name;
    config.min_members = min_members;
    config.max_members = max_members;
    config.initial_members = initial_members;
    return config;
  }

  std::string name_;
  int32_t backoff_limit_;
  lockstep::testing::InProcessRendezvous rendezvous_;
};

std::vector<std::string> DdpCommand(const std::string& dir, int steps, double step_delay) {
  return {kPython,
          kScript,
          "--synthetic",
          "--hidden",
          "32",
          "--steps",
          std::to_string(steps),
          "--checkpoint",
          dir + "/ckpt.pt",
          "--checkpoint-every",
          "10",
          "--step-delay",
          std::to_string(step_delay)};
}

// The manifest of an exec job for `lockstep run`: `replicas` workers running `command`, no
// metrics endpoint, and `spec_lines` (each "  field: value\n") in its spec. Written to
// dir/job.yaml; returns that path.
std::string WriteExecManifest(const std::string& dir, const std::string& name, int replicas,
                              const nlohmann::json& command, const std::string& spec_lines = "") {
  const std::string path = dir + "/job.yaml";
  WriteFile(path, "apiVersion: lockstep.io/v1alpha1\n"
                  "kind: TrainingJob\n"
                  "metadata: {name: " + name + "}\n"
                  "spec:\n"
                  "  replicas: " + std::to_string(replicas) + "\n" + spec_lines +
                  "  command: " + command.dump() + "\n"
                  "  metrics: {port: 0}\n");
  return path;
}

// The python process the agent `agent` runs: its child whose environment names the member.
pid_t CommandOf(pid_t agent, const std::string& member) {
  const std::vector<pid_t> children = ChildrenWithEnv(agent, {{"LOCKSTEP_POD", member}});
  return children.empty() ? -1 : children.front();
}

int64_t ResumedFromStep(const std::string& output) {
  std::smatch match;
  static const std::regex pattern("resumed from step (\\d+)");
  if (!std::regex_search(output, match, pattern)) return -1;
  return std::stoll(match[1]);
}

TEST(ExecIntegration, TwoAgentsTrainDdpScriptToTheEnd) {
  if (!TorchAvailable()) GTEST_SKIP() << kPython << " has no torch";
  const std::string dir = MakeTempDir("exec-two");
  ExecJob job("ddp-two", 2, 2, 2, 3);
  auto agent0 = job.StartAgent(0, DdpCommand(dir, 30, 0));
  auto agent1 = job.StartAgent(1, DdpCommand(dir, 30, 0));
  const ProcessResult r0 = agent0->Wait(kTrainWaitMs);
  const ProcessResult r1 = agent1->Wait(kTrainWaitMs);
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.out << r1.err;
  EXPECT_NE((r0.out + r1.out).find("[rank 0] finished at step 30 (world 2"), std::string::npos)
      << r0.out << r1.out;
  EXPECT_NE((r0.out + r1.out).find("[rank 1] starting at step 0 (world 2, restart 0)"),
            std::string::npos);
  const rendezvous::JobSnapshot snapshot = job.Snapshot();
  EXPECT_EQ(snapshot.progress.step, 30) << "the progress file reached the rendezvous";
  EXPECT_EQ(snapshot.progress.total_steps, 30);
  EXPECT_EQ(snapshot.generations_formed, 1);
  EXPECT_EQ(snapshot.completed_members, 2);
}

// A finished job applied again with the same checkpoint, or pods lost after the last save: the
// program starts at its final step. It must end at once and succeed, not crash on a step it never
// ran and be restarted until backoffLimit. Every exec example that checkpoints (train_ddp.py,
// plain and in place; train_pipeline.py keeps no checkpoint).
class ExecExampleAtItsEnd : public ::testing::TestWithParam<bool> {};

TEST_P(ExecExampleAtItsEnd, ResumedAtItsFinalStepEndsAtOnceAndSucceeds) {
  if (!TorchAvailable()) GTEST_SKIP() << kPython << " has no torch";
  const bool in_place = GetParam();
  const std::string dir = MakeTempDir("exec-at-end");
  std::vector<std::string> command = DdpCommand(dir, 10, 0);
  if (in_place) command.push_back("--in-place");
  for (const char* round : {"first", "again"}) {
    ExecJob job(std::string("ddp-end-") + (in_place ? "ip-" : "") + round, 2, 2, 2, 3);
    auto agent0 = job.StartAgent(0, command);
    auto agent1 = job.StartAgent(1, command);
    const ProcessResult r0 = agent0->Wait(kTrainWaitMs);
    const ProcessResult r1 = agent1->Wait(kTrainWaitMs);
    ASSERT_EQ(r0.exit_code, 0) << round << "\n" << r0.out << r0.err;
    ASSERT_EQ(r1.exit_code, 0) << round << "\n" << r1.out << r1.err;
    const rendezvous::JobSnapshot snapshot = job.Snapshot();
    EXPECT_EQ(snapshot.generations_formed, 1) << round << ": no restart";
    EXPECT_EQ(snapshot.progress.step, 10) << round << ": the progress says where it is";
    if (std::string(round) == "again") {
      EXPECT_NE((r0.out + r1.out).find("finished at step 10 (world 2, nothing left to train)"),
                std::string::npos)
          << r0.out << r1.out;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DdpExample, ExecExampleAtItsEnd, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "InPlace" : "RestartAll";
                         });

TEST(ExecIntegration, KilledTrainingProcessRestartsGroupThatResumesFromItsCheckpoint) {
  if (!TorchAvailable()) GTEST_SKIP() << kPython << " has no torch";
  const std::string dir = MakeTempDir("exec-kill");
  ExecJob job("ddp-kill", 2, 2, 2, 3);
  auto agent0 = job.StartAgent(0, DdpCommand(dir, 60, 0.05));
  auto agent1 = job.StartAgent(1, DdpCommand(dir, 60, 0.05));
  ASSERT_TRUE(job.WaitForStep(25, kTrainWaitMs)) << agent1->StdoutSoFar();
  const pid_t python = CommandOf(agent1->pid(), "ddp-kill-worker-1");
  ASSERT_GT(python, 0) << "no python child of agent " << agent1->pid();
  ASSERT_EQ(kill(python, SIGKILL), 0);

  const ProcessResult r0 = agent0->Wait(kTrainWaitMs);
  const ProcessResult r1 = agent1->Wait(kTrainWaitMs);
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.out << r1.err;
  const std::string out = r0.out + r1.out;
  const int64_t resumed = ResumedFromStep(out);
  EXPECT_GE(resumed, 20) << "restarted from scratch instead of the checkpoint:\n" << out;
  EXPECT_NE(out.find("restart 1)"), std::string::npos) << "TORCHELASTIC_RESTART_COUNT:\n" << out;
  EXPECT_NE(out.find("finished at step 60"), std::string::npos) << out;
  EXPECT_NE(r1.err.find("signal 9"), std::string::npos) << "the kill is reported as it is";
  const rendezvous::JobSnapshot snapshot = job.Snapshot();
  EXPECT_GE(snapshot.generations_formed, 2);
  EXPECT_EQ(snapshot.progress.step, 60);
}

TEST(ExecIntegration, ScalingFromOneToTwoAgentsReformsTheGroupWithoutUsingARestart) {
  if (!TorchAvailable()) GTEST_SKIP() << kPython << " has no torch";
  const std::string dir = MakeTempDir("exec-scale");
  ExecJob job("ddp-scale", 1, 2, 1, 3);
  auto agent0 = job.StartAgent(0, DdpCommand(dir, 60, 0.05));
  ASSERT_TRUE(job.WaitForStep(12, kTrainWaitMs)) << agent0->StdoutSoFar();
  EXPECT_EQ(job.Snapshot().world_size, 1);
  auto agent1 = job.StartAgent(1, DdpCommand(dir, 60, 0.05));

  const ProcessResult r0 = agent0->Wait(kTrainWaitMs);
  const ProcessResult r1 = agent1->Wait(kTrainWaitMs);
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.out << r1.err;
  const rendezvous::JobSnapshot snapshot = job.Snapshot();
  ASSERT_GE(snapshot.history.size(), 2u);
  EXPECT_EQ(snapshot.history.front().world_size, 1);
  EXPECT_EQ(snapshot.history.back().world_size, 2);
  EXPECT_GE(ResumedFromStep(r1.out), 10) << r1.out;
  EXPECT_NE(r1.out.find("(world 2, restart 0)"), std::string::npos)
      << "a membership change costs no restart:\n"
      << r1.out;
  EXPECT_NE((r0.out + r1.out).find("finished at step 60 (world 2"), std::string::npos);
}

// `lockstep run` of a manifest with `command:` starts `lockstep-worker exec` agents and shows
// their progress.
TEST(ExecIntegration, LockstepRunTrainsCommandManifestAndSummarizesIt) {
  if (!TorchAvailable()) GTEST_SKIP() << kPython << " has no torch";
  const std::string dir = MakeTempDir("exec-run");
  // Paced to about 2 s of training, so that the agents read the progress file more than once and
  // know a rate.
  const std::string manifest = WriteExecManifest(dir, "ddp-run", 2, DdpCommand(dir, 40, 0.05),
                                                 "  runPolicy: {backoffLimit: 2}\n");
  const ProcessResult result = lockstep::testing::RunProcess(
      {lockstep::testing::kLockstepBinary, "run", manifest, "--log-dir", dir + "/logs", "--summary",
       dir + "/summary.json"},
      {{"OMP_NUM_THREADS", "1"}}, kTrainWaitMs);
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  EXPECT_EQ(summary["status"], "succeeded");
  EXPECT_EQ(summary["mode"], "exec");
  EXPECT_EQ(summary["steps"], 40);
  EXPECT_EQ(summary["total_steps"], 40);
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_EQ(summary["restarts"], 0);
  // What the script reported through the helper (examples/pytorch/train_ddp.py).
  ASSERT_TRUE(summary["final_loss"].is_number()) << summary.dump();
  EXPECT_GT(summary["final_loss"].get<double>(), 0);
  ASSERT_TRUE(summary["samples_per_second"].is_number()) << summary.dump();
  EXPECT_GT(summary["samples_per_second"].get<double>(), 0);
  EXPECT_TRUE(summary["eval_accuracy"].is_null()) << "Lockstep never evaluated the program";
  // Ranks follow the rendezvous's join order, not the launch order: either log may hold rank 0.
  const std::string logs =
      ReadFile(dir + "/logs/worker-0.log") + ReadFile(dir + "/logs/worker-1.log");
  for (const std::string& text : {logs, result.out}) {
    EXPECT_NE(text.find("[rank 0] finished at step 40"), std::string::npos) << text;
    EXPECT_NE(text.find("[rank 1] finished at step 40"), std::string::npos) << text;
  }
}

// A pipeline-parallel PyTorch program (examples/pytorch/train_pipeline.py) on the ranks the
// rendezvous gives: 2 replicas of 2 stages, activations and their gradients over
// torch.distributed send/recv, and it ends with the parameters one process training the whole
// model reaches (the script checks, on rank 0).
TEST(ExecIntegration, APipelineProgramOnTheRendezvousRanksEndsAsOneProcessWould) {
  if (!TorchAvailable()) GTEST_SKIP() << kPython << " has no torch";
  const std::string dir = MakeTempDir("exec-pipeline");
  const std::string manifest =
      WriteExecManifest(dir, "pytorch-pipeline", 4,
                        {kPython, lockstep::testing::kPipelineScript, "--stages", "2",
                         "--micro-batches", "4", "--steps", "30", "--check"},
                        "  runPolicy: {backoffLimit: 0}\n");
  const ProcessResult result = lockstep::testing::RunProcess(
      {lockstep::testing::kLockstepBinary, "run", manifest, "--log-dir", dir + "/logs", "--summary",
       dir + "/summary.json"},
      {{"OMP_NUM_THREADS", "1"}}, kTrainWaitMs);
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  EXPECT_EQ(summary["status"], "succeeded");
  EXPECT_EQ(summary["world_size"], 4);
  EXPECT_EQ(summary["steps"], 30) << summary.dump();
  EXPECT_NE(result.out.find("[rank 0] pipeline matches one process"), std::string::npos)
      << result.out;
  // Every rank sits where Lockstep's own pipelines put it: stage rank % 2, replica rank / 2.
  for (const std::string line : {"[rank 0] rank 0: stage 0 of 2", "[rank 1] rank 1: stage 1 of 2",
                                 "[rank 2] rank 2: stage 0 of 2 (modules 0..3), replica 1 of 2",
                                 "[rank 3] rank 3: stage 1 of 2 (modules 4..8), replica 1 of 2"}) {
    EXPECT_NE(result.out.find(line), std::string::npos) << line << "\n" << result.out;
  }
}

// A program that reports nothing: the console still carries its lines (here rank 0's only), and
// the summary claims no steps, loss or rate for it.
TEST(ExecIntegration, LockstepRunShowsTheProgramsLinesAndClaimsNoProgressItDidNotReport) {
  const std::string dir = MakeTempDir("exec-quiet");
  const std::string manifest = WriteExecManifest(
      dir, "quiet", 2, {"/bin/sh", "-c", "echo hello from $RANK of $WORLD_SIZE"});
  const ProcessResult result = lockstep::testing::RunProcess(
      {lockstep::testing::kLockstepBinary, "run", manifest, "--log-dir", dir + "/logs", "--summary",
       dir + "/summary.json", "--console", "rank0"},
      {}, kTrainWaitMs);
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_NE(result.out.find("[rank 0] hello from 0 of 2"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("[rank 1]"), std::string::npos) << "--console rank0:\n" << result.out;
  EXPECT_NE(result.out.find("not reported by the program"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("final loss"), std::string::npos) << result.out;
  const std::string logs =
      ReadFile(dir + "/logs/worker-0.log") + ReadFile(dir + "/logs/worker-1.log");
  EXPECT_NE(logs.find("[rank 1] hello from 1 of 2"), std::string::npos) << "the logs keep all";
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  EXPECT_EQ(summary["status"], "succeeded");
  for (const char* key : {"steps", "final_loss", "samples_per_second", "eval_accuracy"}) {
    EXPECT_TRUE(summary[key].is_null()) << key << ": " << summary.dump();
  }
  EXPECT_EQ(summary["restarts"], 0);
  EXPECT_EQ(summary["world_size"], 2);
}

// The pure-Python helper, found on the PYTHONPATH the agent sets, without torch: what it reports
// reaches the summary.
TEST(ExecIntegration, ProgressReportedThroughThePythonHelperReachesTheSummary) {
  const std::string dir = MakeTempDir("exec-helper");
  const std::string program =
      "import time\n"
      "from lockstep import progress\n"
      "for step in range(1, 21):\n"
      "    with progress.computing():\n"
      "        time.sleep(0.05)\n"
      "    progress.report(step=step, samples=64 * step, loss=1.0 / step, total_steps=20)\n"
      "print('reported', flush=True)\n";
  const std::string manifest = WriteExecManifest(dir, "helper", 1, {kPython, "-c", program});
  const ProcessResult result = lockstep::testing::RunProcess(
      {lockstep::testing::kLockstepBinary, "run", manifest, "--log-dir", dir + "/logs", "--summary",
       dir + "/summary.json"},
      {}, kTrainWaitMs);
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err
                                 << ReadFile(dir + "/logs/worker-0.log");
  EXPECT_NE(result.out.find("[rank 0] reported"), std::string::npos) << result.out;
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  EXPECT_EQ(summary["steps"], 20) << summary.dump();
  EXPECT_EQ(summary["total_steps"], 20) << summary.dump();
  ASSERT_TRUE(summary["final_loss"].is_number()) << summary.dump();
  EXPECT_DOUBLE_EQ(summary["final_loss"].get<double>(), 0.05);
  ASSERT_TRUE(summary["samples_per_second"].is_number()) << summary.dump();
  EXPECT_GT(summary["samples_per_second"].get<double>(), 0);
}

// Two pods of two processes each (torchrun's --nproc-per-node=2 on two nodes): four ranks, the
// pods' processes numbered pod by pod; a killed process restarts the whole group once.
TEST(ExecIntegration, TwoPodsOfTwoProcessesTrainTheDdpScriptAndAKilledOneRestartsTheGroupOnce) {
  if (!TorchAvailable()) GTEST_SKIP() << kPython << " has no torch";
  const std::string dir = MakeTempDir("exec-pods");
  const std::string name = "ddp-pods-" + std::to_string(getpid());
  const std::string manifest =
      WriteExecManifest(dir, name, 2, DdpCommand(dir, 60, 0.05),
                        "  ranksPerWorker: 2\n  runPolicy: {backoffLimit: 2}\n");
  ChildProcess run({lockstep::testing::kLockstepBinary, "run", manifest, "--log-dir", dir + "/logs",
                    "--summary", dir + "/summary.json"},
                   {{"OMP_NUM_THREADS", "1"},
                    {"LOCKSTEP_RUN_PROGRESS_INTERVAL_MS", "50"},
                    {"LOCKSTEP_EXEC_GRACE_MS", "3000"}});
  // Local rank 1 of pod 1: the python child of that pod's second agent.
  pid_t python = -1;
  ASSERT_TRUE(PollUntil(
      [&] {
        // `lockstep run`'s progress lines, from the script's progress file.
        if (lockstep::testing::LatestStep(run.StdoutSoFar()) < 20) return false;
        const pid_t pod = lockstep::testing::WorkerOfLauncher(run.pid(), name, name + "-worker-1");
        const std::vector<pid_t> agents = ChildrenWithEnv(pod, {{"LOCKSTEP_LOCAL_RANK", "1"}});
        if (agents.size() != 1) return false;
        const std::vector<pid_t> children = ChildrenWithEnv(agents[0], {{"LOCAL_RANK", "1"}});
        if (children.size() != 1) return false;
        python = children[0];
        return true;
      },
      kTrainWaitMs, 50))
      << run.StdoutSoFar();
  ASSERT_EQ(kill(python, SIGKILL), 0);
  const ProcessResult result = run.Wait(kTrainWaitMs);
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  EXPECT_EQ(summary["status"], "succeeded") << summary.dump();
  EXPECT_EQ(summary["steps"], 60) << summary.dump();
  EXPECT_EQ(summary["world_size"], 4) << summary.dump();
  const std::string logs =
      ReadFile(dir + "/logs/worker-0.log") + ReadFile(dir + "/logs/worker-1.log");
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(logs.find("[rank " + std::to_string(rank) + "] finished at step 60 (world 4"),
              std::string::npos)
        << logs;
  }
  // One failure, one restart of the whole group (TORCHELASTIC_RESTART_COUNT 1), never 2; the
  // summary and the console count the same restart.
  EXPECT_NE(logs.find("(world 4, restart 1)"), std::string::npos) << logs;
  EXPECT_EQ(logs.find("restart 2)"), std::string::npos) << logs;
  EXPECT_EQ(summary["restarts"], 1) << summary.dump();
  EXPECT_NE(result.out.find("lockstep: restart 1 of backoffLimit 2"), std::string::npos)
      << result.out;
}

// SIGTERM to `lockstep run` of an exec job: each agent stops its command (SIGTERM, SIGKILL after
// the agents' grace), also one that ignores SIGTERM, and nothing outlives the run, although the
// launcher's own grace is shorter than the agents' (it waits for them instead of killing them
// first and orphaning their commands).
TEST(ExecIntegration, InterruptingLockstepRunLeavesNoCommandBehindEvenOneIgnoringSigterm) {
  const std::string dir = MakeTempDir("exec-interrupt");
  const std::string marker = "exec-interrupt-" + std::to_string(getpid());
  const std::string manifest = WriteExecManifest(
      dir, "interrupted", 2,
      {"/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"});
  ChildProcess run(
      {lockstep::testing::kLockstepBinary, "run", manifest, "--log-dir", dir + "/logs"},
      {{"LOCKSTEP_TEST_MARKER", marker},
       {"LOCKSTEP_EXEC_GRACE_MS", "1500"},
       {"LOCKSTEP_RUN_GRACE_PERIOD_MS", "300"}});
  ASSERT_TRUE(PollUntil(
      [&] {
        const std::string out = run.StdoutSoFar();
        return out.find("[rank 0] ready") != std::string::npos &&
               out.find("[rank 1] ready") != std::string::npos;
      },
      kTrainWaitMs, 50))
      << run.StdoutSoFar();
  ASSERT_EQ(kill(run.pid(), SIGTERM), 0);
  const ProcessResult result = run.Wait(kTrainWaitMs);
  EXPECT_EQ(result.exit_code, 143) << result.out << result.err;
  EXPECT_TRUE(lockstep::testing::FindProcessesWithEnv("LOCKSTEP_TEST_MARKER", marker).empty())
      << "a command outlived lockstep run";
  for (pid_t pid : lockstep::testing::FindProcessesWithEnv("LOCKSTEP_TEST_MARKER", marker)) {
    kill(pid, SIGKILL);
  }
}

// A pod of two ranks loses one of its agents (not the command: the agent itself, as an OOM kill
// would): the pod's supervisor stops its other rank and exits 137, and `lockstep run` replaces the
// pod as a lost pod, as the operator would; only agents that gave up are not replaced.
TEST(ExecIntegration, APodWhoseAgentWasKilledIsReplacedAndTheJobFinishes) {
  const std::string dir = MakeTempDir("exec-lost-agent");
  const std::string name = "lost-agent-" + std::to_string(getpid());
  const std::string manifest = WriteExecManifest(
      dir, name, 2,
      {"/bin/sh", "-c",
       "echo up $LOCKSTEP_GENERATION; while [ ! -e " + dir + "/done ]; do sleep 0.05; done"},
      "  ranksPerWorker: 2\n  runPolicy: {backoffLimit: 2}\n");
  ChildProcess run({lockstep::testing::kLockstepBinary, "run", manifest, "--log-dir", dir + "/logs",
                    "--summary", dir + "/summary.json"},
                   {{"LOCKSTEP_EXEC_GRACE_MS", "2000"}});
  pid_t agent = -1;
  ASSERT_TRUE(PollUntil(
      [&] {
        if (run.StdoutSoFar().find("[rank 3] up") == std::string::npos) return false;
        const pid_t pod = lockstep::testing::WorkerOfLauncher(run.pid(), name, name + "-worker-1");
        const std::vector<pid_t> agents = ChildrenWithEnv(pod, {{"LOCKSTEP_LOCAL_RANK", "1"}});
        if (agents.size() != 1) return false;
        agent = agents[0];
        return true;
      },
      kTrainWaitMs, 50))
      << run.StdoutSoFar();
  ASSERT_EQ(kill(agent, SIGKILL), 0);
  // Every rank runs its command again in a later generation, with the replacement pod.
  ASSERT_TRUE(PollUntil(
      [&] {
        const std::string out = run.StdoutSoFar();
        const size_t replaced = out.find("started replacement for " + name + "-worker-1");
        if (replaced == std::string::npos) return false;
        for (int rank = 0; rank < 4; ++rank) {
          const std::string line = "[rank " + std::to_string(rank) + "] up";
          if (out.find(line, replaced) == std::string::npos) return false;
        }
        return true;
      },
      kTrainWaitMs, 50))
      << run.StdoutSoFar();
  WriteFile(dir + "/done", "");
  const ProcessResult result = run.Wait(kTrainWaitMs);
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
}

// `lockstep run` of a 2-worker exec job with one standby whose command is `script` (with the
// job's directory as its argument): a Python script that prints "up <generation> pid <pid>" once
// it runs as a member and then waits for the file done in that directory.
class StandbyExecRun {
 public:
  StandbyExecRun(const std::string& name, const std::string& script_text)
      : dir_(MakeTempDir(name)), name_(name + "-" + std::to_string(getpid())) {
    const std::string script = dir_ + "/script.py";
    WriteFile(script, script_text);
    const std::string manifest =
        WriteExecManifest(dir_, name_, 2, {kPython, script, dir_},
                          "  elastic: {standby: 1}\n  runPolicy: {backoffLimit: 2}\n");
    run_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{lockstep::testing::kLockstepBinary, "run", manifest, "--log-dir",
                                 dir_ + "/logs", "--summary", dir_ + "/summary.json"},
        lockstep::testing::Environment{{"LOCKSTEP_EXEC_GRACE_MS", "2000"},
                                       {"LOCKSTEP_EXEC_PRELOAD", "json"}});
  }
  static std::string UpScript(const std::string& first_lines) {
    return first_lines +
           "print('up', os.environ['LOCKSTEP_GENERATION'], 'pid', os.getpid(), flush=True)\n"
           "deadline = time.monotonic() + 120\n"
           "while not os.path.exists(sys.argv[1] + '/done') and time.monotonic() < deadline:\n"
           "    time.sleep(0.05)\n";
  }

  std::string Log(int i) const {
    return ReadFile(dir_ + "/logs/worker-" + std::to_string(i) + ".log");
  }
  std::string Logs() const { return Log(0) + Log(1) + Log(2); }
  // The worker that stood by while the other two formed generation 1 (-1 after the wait).
  int Standby() const {
    int standby = -1;
    PollUntil(
        [&] {
          int members = 0;
          for (int i = 0; i < 3; ++i) {
            if (Log(i).find("joined generation 1 ") != std::string::npos) {
              ++members;
            } else {
              standby = i;
            }
          }
          return members == 2;
        },
        kTrainWaitMs, 50);
    return standby;
  }
  ProcessResult Finish() {
    WriteFile(dir_ + "/done", "");
    return run_->Wait(kTrainWaitMs);
  }

 private:
  std::string dir_;
  std::string name_;
  std::unique_ptr<ChildProcess> run_;
};

// A script that imports lockstep.elastic but reads its rank first (init_process_group first, as
// train_ddp.py without --in-place) cannot wait for a place in the helper: what its start-up did
// may be stale by then. The standby's agent forks it ahead, hears that it read RANK, ends it and
// forks it no more; when a training worker's pod is lost, the standby starts the command anew and
// the job finishes.
TEST(ExecIntegration, AStandbyDoesNotKeepAProgramThatAskedForItsRankAheadOfAPlace) {
  StandbyExecRun run("exec-ahead-refused", StandbyExecRun::UpScript("import os, sys, time\n"
                                                                    "from lockstep import elastic\n"
                                                                    "rank = os.environ['RANK']\n"));
  const int standby = run.Standby();
  ASSERT_GE(standby, 0) << run.Logs();
  const std::string refused = "read RANK before it reached lockstep.elastic's run()";
  ASSERT_TRUE(PollUntil([&] { return run.Log(standby).find(refused) != std::string::npos; },
                        kTrainWaitMs, 50))
      << "the standby never forked the command ahead, or kept it:\n"
      << run.Log(standby);
  EXPECT_EQ(run.Log(standby).find("] up 1"), std::string::npos) << "the standby ran as a member";
  // A training worker's pod is lost: its agent, with its program.
  const int victim = standby == 0 ? 1 : 0;
  static const std::regex up_pid("up 1 pid (\\d+)");
  std::smatch match;
  std::string victim_log;
  ASSERT_TRUE(PollUntil(
      [&] {
        victim_log = run.Log(victim);
        return std::regex_search(victim_log, match, up_pid);
      },
      kTrainWaitMs, 50));
  const std::optional<ProcessStat> program = ReadProcessStat(std::stoi(match[1]));
  ASSERT_TRUE(program.has_value());
  ASSERT_EQ(kill(program->parent, SIGKILL), 0);
  // The standby takes the place with the command started anew (its imports done by its zygote).
  ASSERT_TRUE(PollUntil([&] { return run.Log(standby).find("] up 2") != std::string::npos; },
                        kTrainWaitMs, 50))
      << run.Log(standby);
  const std::string standby_log = run.Log(standby);
  EXPECT_NE(standby_log.find("forked from the zygote " + kPython), std::string::npos)
      << standby_log;
  EXPECT_EQ(standby_log.find("promoted the warm spare"), std::string::npos) << standby_log;
  EXPECT_EQ(standby_log.find("ahead of a place", standby_log.find(refused)), std::string::npos)
      << "forked ahead again after it asked for its rank:\n"
      << standby_log;
  const ProcessResult result = run.Finish();
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
}

// A script that does not import lockstep.elastic is never forked ahead of a place.
TEST(ExecIntegration, AStandbyForksNoProgramAheadForAScriptWithoutTheElasticHelper) {
  StandbyExecRun run("exec-ahead-none",
                     StandbyExecRun::UpScript("import os, sys, time\nimport json\n"));
  const int standby = run.Standby();
  ASSERT_GE(standby, 0) << run.Logs();
  ASSERT_TRUE(PollUntil(
      [&] {
        return run.Log(standby).find("the script does not import lockstep.elastic") !=
               std::string::npos;
      },
      kTrainWaitMs, 50))
      << run.Log(standby);
  EXPECT_EQ(run.Log(standby).find("ahead of a place"), std::string::npos) << run.Log(standby);
  const ProcessResult result = run.Finish();
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
}

struct BadCommandCase {
  std::string name;
  std::string job;  // a DNS label, unique per case
  int expected_status;
  std::string expected_message;
};
void PrintTo(const BadCommandCase& param, std::ostream* os) { *os << param.name; }

class ExecBadCommand : public ::testing::TestWithParam<BadCommandCase> {};

TEST_P(ExecBadCommand, GivesClearErrorAfterAtMostBackoffLimitPlusOneStarts) {
  const BadCommandCase& param = GetParam();
  const std::string dir = MakeTempDir("exec-bad");
  const std::string starts = dir + "/starts";
  std::vector<std::string> command;
  if (param.name == "not_found") {
    command = {dir + "/no-such-train.py"};
  } else if (param.name == "not_executable") {
    command = {dir + "/train.sh"};
    WriteFile(command[0], "#!/bin/sh\nexit 0\n");
    chmod(command[0].c_str(), 0644);
  } else {
    command = {"/bin/sh", "-c", "echo started >> " + starts + "; exit 3"};
  }
  constexpr int kBackoffLimit = 2;
  ExecJob job(param.job, 1, 1, 1, kBackoffLimit);
  auto agent = job.StartAgent(0, command);
  const ProcessResult result = agent->Wait(30000);
  ASSERT_FALSE(result.timed_out) << result.err;
  EXPECT_EQ(result.exit_code, param.expected_status) << result.err;
  EXPECT_NE(result.err.find(param.expected_message), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("restarts exhausted: 2 of 2"), std::string::npos) << result.err;
  // One generation per start, and a last one whose plan tells every agent to give up.
  EXPECT_EQ(job.Snapshot().generations_formed, kBackoffLimit + 2);
  if (param.name == "exits_at_once") {
    EXPECT_EQ(ReadFile(starts), "started\nstarted\nstarted\n");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Commands, ExecBadCommand,
    ::testing::Values(
        BadCommandCase{"not_found", "bad-nf", 127, "No such file or directory (errno 2)"},
        BadCommandCase{"not_executable", "bad-nx", 126, "Permission denied (errno 13)"},
        BadCommandCase{"exits_at_once", "bad-x3", 3, "exit code 3"}),
    [](const ::testing::TestParamInfo<BadCommandCase>& info) { return info.param.name; });

TEST(ExecIntegration, SigtermToAgentReachesCommandAndAgentExitsWithItsStatus) {
  const std::string dir = MakeTempDir("exec-term");
  const std::string ready = dir + "/ready";
  ExecJob job("term", 1, 1, 1, 3);
  auto agent = job.StartAgent(
      0,
      {"/bin/sh", "-c", "trap 'exit 7' TERM; touch " + ready + "; while :; do sleep 0.05; done"});
  ASSERT_TRUE(PollUntil([&] { return access(ready.c_str(), F_OK) == 0; }, 30000, 20));
  ASSERT_EQ(kill(agent->pid(), SIGTERM), 0);
  const ProcessResult result = agent->Wait(20000);
  EXPECT_EQ(result.exit_code, 7) << result.err;

  ExecJob killed_job("term-default", 1, 1, 1, 3);
  const std::string ready2 = dir + "/ready2";
  auto agent2 = killed_job.StartAgent(0, {"/bin/sh", "-c", "touch " + ready2 + "; exec sleep 60"});
  ASSERT_TRUE(PollUntil([&] { return access(ready2.c_str(), F_OK) == 0; }, 30000, 20));
  ASSERT_EQ(kill(agent2->pid(), SIGTERM), 0);
  const ProcessResult result2 = agent2->Wait(20000);
  EXPECT_EQ(result2.exit_code, 128 + SIGTERM) << result2.err;
}

// Lines "<word> <pod> <world size> <restart count> <nanoseconds>" appended by the commands below.
struct CommandEvent {
  std::string what, pod;
  int world_size = 0, restart = 0;
  int64_t at_ns = 0;
};
std::vector<CommandEvent> ReadEvents(const std::string& path) {
  std::vector<CommandEvent> events;
  std::istringstream lines(ReadFile(path));
  CommandEvent e;
  while (lines >> e.what >> e.pod >> e.world_size >> e.restart >> e.at_ns) events.push_back(e);
  return events;
}
std::string EventLine(const std::string& what, const std::string& file) {
  return "echo " + what + " $LOCKSTEP_POD $WORLD_SIZE $TORCHELASTIC_RESTART_COUNT $(date +%s%N) >> " +
         file;
}

// A PyTorch script that saves in its SIGTERM handler takes a moment to stop. One rank fails; the
// other's command needs 2 s to stop. The survivor must not run the next generation alone (a
// fixed-size program cannot), and nobody starts the next command before every previous one has
// stopped: before, the failed rank formed a world-1 generation, the late one's return ended it,
// and so on for ever.
TEST(ExecIntegration, ACommandThatStopsSlowlyIsWaitedForBeforeAnyoneStartsAgain) {
  const std::string dir = MakeTempDir("exec-slow-stop");
  const std::string events = dir + "/events";
  const std::string script =
      EventLine("start", events) + "\n" +
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then\n"
      "  if [ \"$RANK\" = 1 ]; then\n"
      "    while [ ! -e " + dir + "/trapped ]; do sleep 0.02; done\n"
      "    " + EventLine("stop", events) + "; exit 1\n"
      "  fi\n"
      "  trap 'sleep 2; " + EventLine("termstop", events) + "; exit 143' TERM\n"
      "  touch " + dir + "/trapped\n"
      "  sleep 60 & wait\n"
      "fi\n" +
      EventLine("stop", events) + "\n";
  // The range `lockstep run` gave a fixed-size job of two: any generation of 1 or 2 could form.
  ExecJob job("slow-stop", 1, 2, 2, 3);
  // A grace far above the handler's 2 s: the handler is waited for, never cut by SIGKILL.
  auto a = job.StartAgent(0, {"/bin/sh", "-c", script}, "20000");
  auto b = job.StartAgent(1, {"/bin/sh", "-c", script}, "20000");
  const ProcessResult ra = a->Wait(60000), rb = b->Wait(60000);
  ASSERT_FALSE(ra.timed_out || rb.timed_out) << ReadFile(events);
  EXPECT_EQ(ra.exit_code, 0) << ra.err;
  EXPECT_EQ(rb.exit_code, 0) << rb.err;
  const std::vector<CommandEvent> all = ReadEvents(events);
  int64_t last_first_stop = 0;
  for (const CommandEvent& e : all) {
    if (e.what != "start" && e.restart == 0) last_first_stop = std::max(last_first_stop, e.at_ns);
  }
  // The survivor's command was stopped, and took its 2 s (its handler was not cut short).
  EXPECT_EQ(std::count_if(all.begin(), all.end(),
                          [](const CommandEvent& e) { return e.what == "termstop"; }),
            1)
      << ReadFile(events);
  int starts = 0;
  for (const CommandEvent& e : all) {
    if (e.what != "start") continue;
    ++starts;
    EXPECT_EQ(e.world_size, 2) << ReadFile(events);
    if (e.restart > 0) {
      EXPECT_GE(e.at_ns, last_first_stop) << ReadFile(events);
    }
  }
  EXPECT_EQ(starts, 4) << ReadFile(events);
  // The first generation, and the one after the failure: nothing formed in between.
  EXPECT_EQ(job.Snapshot().generations_formed, 2) << ReadFile(events);
}

// backoffLimit + 1 starts of each member's command, whatever fails at once.
TEST(ExecIntegration, SimultaneousFailuresUseOneRestartAndTheBoundHolds) {
  const std::string dir = MakeTempDir("exec-simultaneous");
  const std::string events = dir + "/events";
  constexpr int kBackoffLimit = 3;
  ExecJob job("simultaneous", 1, 2, 2, kBackoffLimit);
  const std::vector<std::string> command = {"/bin/sh", "-c",
                                            EventLine("start", events) + "; exit 1"};
  auto a = job.StartAgent(0, command);
  auto b = job.StartAgent(1, command);
  const ProcessResult ra = a->Wait(60000), rb = b->Wait(60000);
  ASSERT_FALSE(ra.timed_out || rb.timed_out) << ReadFile(events);
  EXPECT_EQ(ra.exit_code, 1) << ra.err;
  EXPECT_EQ(rb.exit_code, 1) << rb.err;
  EXPECT_NE(ra.err.find("restarts exhausted: 3 of 3"), std::string::npos) << ra.err;
  std::map<std::string, int> starts;
  for (const CommandEvent& e : ReadEvents(events)) {
    if (e.what == "start") ++starts[e.pod];
  }
  ASSERT_EQ(starts.size(), 2u) << ReadFile(events);
  // At most: a generation that ends before a member's command starts (the other failed first)
  // uses a restart without a start there.
  for (const auto& [pod, count] : starts) {
    EXPECT_LE(count, kBackoffLimit + 1) << pod << "\n" << ReadFile(events);
  }
  // One generation per restart, and the last whose plan says give up.
  EXPECT_EQ(job.Snapshot().generations_formed, kBackoffLimit + 2);
}

// The same under `lockstep run`, which also replaces failed workers: an agent that gave up
// after spending the budget is not replaced (which started the command again, 12 times for a
// budget of 8 starts), and a fixed-size job never forms a generation smaller than its size.
TEST(ExecIntegration, LockstepRunStartsAFailingCommandBackoffLimitPlusOneTimesPerWorker) {
  const std::string dir = MakeTempDir("exec-run-bound");
  const std::string events = dir + "/events";
  const std::string manifest =
      WriteExecManifest(dir, "run-bound", 2, {"/bin/sh", "-c", EventLine("start", events) + "; exit 1"},
                        "  runPolicy: {restartPolicy: OnFailure, backoffLimit: 3}\n");
  const ProcessResult result = lockstep::testing::RunProcess(
      {lockstep::testing::kLockstepBinary, "run", manifest, "--log-dir", dir + "/logs"},
      {{"LOCKSTEP_EXEC_BACKOFF_MS", "50"}}, 60000);
  ASSERT_FALSE(result.timed_out) << result.out << result.err;
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  std::map<std::string, int> starts;
  for (const CommandEvent& e : ReadEvents(events)) {
    if (e.what != "start") continue;
    ++starts[e.pod];
    EXPECT_EQ(e.world_size, 2) << ReadFile(events);
  }
  ASSERT_EQ(starts.size(), 2u) << ReadFile(events);
  // At most: a generation that ends before a member's command starts (the other failed first)
  // uses a restart without a start there.
  for (const auto& [pod, count] : starts) EXPECT_LE(count, 4) << pod << "\n" << ReadFile(events);
}

// A daemon the command starts in a session of its own (setsid) is not in the command's process
// group, so stopping the group misses it; the agent is its subreaper and ends it with the command.
TEST(ExecIntegration, ADaemonTheCommandStartedInItsOwnSessionEndsWithIt) {
  const std::string dir = MakeTempDir("exec-setsid");
  const std::string pid_file = dir + "/daemon.pid";
  ExecJob job("setsid", 1, 1, 1, 0);
  auto agent = job.StartAgent(
      0, {"/bin/sh", "-c",
          "setsid /bin/sh -c 'echo $$ > " + pid_file + ".tmp; mv " + pid_file + ".tmp " +
              pid_file + "; exec sleep 300' &\n"
              "while [ ! -s " + pid_file + " ]; do sleep 0.02; done; exit 0"});
  const ProcessResult result = agent->Wait(30000);
  ASSERT_FALSE(result.timed_out) << result.err;
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const pid_t daemon = static_cast<pid_t>(std::stol(ReadFile(pid_file)));
  ASSERT_GT(daemon, 1);
  const bool gone = PollUntil([&] { return kill(daemon, 0) != 0 && errno == ESRCH; }, 10000, 20);
  if (!gone) kill(daemon, SIGKILL);
  EXPECT_TRUE(gone) << "the setsid daemon (pid " << daemon << ") outlived the job";
}

// Zombie children of `parent`, read from /proc.
int ZombieChildren(pid_t parent) {
  int zombies = 0;
  for (const ProcessEntry& process : ProcessTable()) {
    if (process.stat.parent == parent && process.stat.state == 'Z') ++zombies;
  }
  return zombies;
}

// Orphans of a long-running command (a grandchild whose parent went first) come to the agent,
// a subreaper; those that exit are reaped while the command runs, not left as zombies until it
// ends.
TEST(ExecIntegration, OrphansThatExitWhileTheCommandRunsAreReaped) {
  ExecJob job("orphans", 1, 1, 1, 0);
  auto agent = job.StartAgent(
      0, {"/bin/sh", "-c",
          "for i in 1 2 3 4 5; do (sleep 0.2 &); done; sleep 1; echo orphans-gone; "
          "while :; do sleep 1; done"});
  ASSERT_TRUE(PollUntil(
      [&] { return agent->StdoutSoFar().find("orphans-gone") != std::string::npos; }, 30000, 20))
      << agent->StdoutSoFar();
  EXPECT_TRUE(PollUntil([&] { return ZombieChildren(agent->pid()) == 0; }, 5000, 20))
      << ZombieChildren(agent->pid()) << " zombie children of the agent";
  kill(agent->pid(), SIGTERM);
  EXPECT_FALSE(agent->Wait(30000).timed_out);
}

}  // namespace
}  // namespace lockstep::agent
