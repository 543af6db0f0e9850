// Parameter-server jobs through `lockstep run`, end to end: the real launcher starts the job's
// parameter servers and workers as processes; the workers train a click model on a click log
// written by lockstep-click-log. What a user would check: the run ends with the test AUC near
// the log's ceiling in every mode, a worker killed mid-run is replaced without stopping the others
// and goes on from its clock (the run still ends at its step count with the AUC held), and a lost
// server ends the job naming it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/job/job.h"

namespace lockstep::cli {
namespace {

using lockstep::testing::ChildProcess;
using lockstep::testing::LatestStep;
using lockstep::testing::MakeTempDir;
using lockstep::testing::PollUntil;
using lockstep::testing::ProcessResult;
using lockstep::testing::ReadFile;
using lockstep::testing::ReadRunSummary;
using lockstep::testing::RunProcess;
using lockstep::testing::WorkerOfLauncher;
using lockstep::testing::WriteFile;

constexpr int64_t kRunTimeoutMs = 120000;
// Long enough that a replacement started after a kill at step 100 joins well before the others
// finish (about 5 s of training on a loaded 2-core machine).
constexpr int64_t kSteps = 1200;

// The click log every test trains on, written once: 50,000 train and 10,000 test samples of 8
// fields over 200 ids each (every id seen often enough to be learned).
const std::string& DataDir() {
  static const std::string dir = [] {
    const std::string made = MakeTempDir("lockstep-ps-data");
    ProcessResult written = RunProcess({LOCKSTEP_CLICK_LOG_BINARY, "--samples", "50000",
                                        "--test-samples", "10000", "--vocabulary", "200", made},
                                       {}, 60000);
    EXPECT_EQ(written.exit_code, 0) << written.out << written.err;
    return made;
  }();
  return dir;
}

std::string WriteManifest(const std::string& dir, const std::string& name, const std::string& mode,
                          double learning_rate, const std::string& checkpoint = "") {
  std::ostringstream yaml;
  yaml << "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: " << name
       << "}\nspec:\n  replicas: 4\n  parameterServers: {replicas: 2}\n  trainer:\n"
       << "    model: {hidden: [32], embedding: {fields: 8, dim: 8, rows: 65536}}\n"
       << "    data: {format: clickLog, train: [" << DataDir() << "/train.tsv.gz], test: ["
       << DataDir() << "/test.tsv.gz]}\n"
       << "    batchSize: 64\n    steps: " << kSteps << "\n"
       << "    optimizer: {type: sgd, learningRate: " << learning_rate << ", momentum: 0}\n"
       << "    logIntervalSteps: 10\n"
       << "    sync: {strategy: parameterServer, parameterServer: " << mode << "}\n"
       << "  runPolicy: {restartPolicy: OnFailure, backoffLimit: 3}\n  metrics: {port: 0}\n";
  if (!checkpoint.empty()) yaml << "  checkpoint: " << checkpoint << "\n";
  const std::string path = dir + "/" + name + ".yaml";
  WriteFile(path, yaml.str());
  return path;
}

const std::vector<std::pair<std::string, std::string>> kRunEnv = {
    {"LOCKSTEP_RUN_PROGRESS_INTERVAL_MS", "50"}, {"LOCKSTEP_RUN_RESTART_BACKOFF_MS", "20"}};

struct Mode {
  std::string name;
  std::string spec;
  double learning_rate;
};

// Synchronous steps train the 4 workers' batches at once: 4x the rate (the linear scaling rule).
const Mode kModes[] = {{"sync", "{mode: sync}", 2.0},
                       {"async", "{mode: async, staleness: 4}", 0.5},
                       {"geo", "{mode: geo, geoInterval: 8}", 0.5}};

class PsRunTest : public ::testing::TestWithParam<Mode> {};

TEST_P(PsRunTest, AWorkerKilledMidRunIsReplacedFromItsClockAndTheAucHolds) {
  const Mode& mode = GetParam();
  const std::string dir = MakeTempDir("lockstep-ps-" + mode.name);
  const std::string base = "ps-" + mode.name + "-base-" + std::to_string(getpid());
  ProcessResult undisturbed =
      RunProcess({LOCKSTEP_BINARY, "run", WriteManifest(dir, base, mode.spec, mode.learning_rate),
                  "--summary", dir + "/base.json", "--log-dir", dir + "/logs-base"},
                 kRunEnv, kRunTimeoutMs);
  ASSERT_FALSE(undisturbed.timed_out) << undisturbed.out << undisturbed.err;
  ASSERT_EQ(undisturbed.exit_code, 0) << undisturbed.out << undisturbed.err;
  EXPECT_NE(undisturbed.out.find("with 4 workers and 2 parameter servers"), std::string::npos)
      << undisturbed.out;
  EXPECT_NE(undisturbed.out.find("test AUC"), std::string::npos) << undisturbed.out;
  const nlohmann::json base_summary = ReadRunSummary(dir + "/base.json");
  const double base_auc = base_summary["eval_auc"].get<double>();
  // The log's ceiling is 0.747; a model whose embeddings never learned stays near 0.6.
  EXPECT_GT(base_auc, 0.70) << base_summary.dump();
  EXPECT_EQ(base_summary["steps"], kSteps);

  const std::string name = "ps-" + mode.name + "-" + std::to_string(getpid());
  ChildProcess run({LOCKSTEP_BINARY, "run", WriteManifest(dir, name, mode.spec, mode.learning_rate),
                    "--summary", dir + "/run.json", "--log-dir", dir + "/logs"},
                   kRunEnv);
  ASSERT_TRUE(PollUntil([&] { return LatestStep(run.StdoutSoFar()) >= 100; }, 60000, 10))
      << run.StdoutSoFar();
  // The servers speak TLS from a key only the run's user can read, kept for the run alone.
  const std::string tls_dir = dir + "/logs/ps-tls";
  struct stat info {};
  ASSERT_EQ(stat(tls_dir.c_str(), &info), 0) << tls_dir;
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((tls_dir + "/tls.key").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  const std::string member = name + "-worker-2";
  const pid_t pid = WorkerOfLauncher(run.pid(), name, member);
  ASSERT_NE(pid, 0) << member << " not found";
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ProcessResult result = run.Wait(kRunTimeoutMs);
  ASSERT_FALSE(result.timed_out) << result.out << result.err;
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  const nlohmann::json summary = ReadRunSummary(dir + "/run.json");
  EXPECT_EQ(summary["steps"], kSteps) << summary.dump();
  EXPECT_EQ(summary["restarts"], 1) << summary.dump();
  EXPECT_NE(result.out.find("worker " + member + " failed (signal 9 (SIGKILL))"),
            std::string::npos)
      << result.out;
  EXPECT_NE(stat(tls_dir.c_str(), &info), 0) << tls_dir << " outlived the run";
  // The replacement went on where its predecessor's last reported step left it.
  const std::string log = ReadFile(dir + "/logs/worker-2.log");
  EXPECT_NE(log.find("worker 2 resumes at step "), std::string::npos) << log;
  // At most one step of one worker was lost or trained twice, out of 4 x 1200.
  EXPECT_NEAR(summary["eval_auc"].get<double>(), base_auc, 0.01) << summary.dump();
  std::printf("%s: test AUC %.4f, undisturbed %.4f\n", mode.name.c_str(),
              summary["eval_auc"].get<double>(), base_auc);
}

INSTANTIATE_TEST_SUITE_P(Modes, PsRunTest, ::testing::ValuesIn(kModes),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return info.param.name;
                         });

class PsServerKillTest : public ::testing::TestWithParam<Mode> {};

TEST_P(PsServerKillTest, AServerKilledMidRunRestartsFromItsShardsCheckpointAndTheAucHolds) {
  const Mode& mode = GetParam();
  const std::string dir = MakeTempDir("lockstep-ps-server-restored-" + mode.name);
  const std::string checkpoint = "{uri: \"file://" + dir + "/ckpt\", intervalSteps: 50, keep: 2}";
  const std::string base = "ps-restore-" + mode.name + "-base-" + std::to_string(getpid());
  ProcessResult undisturbed = RunProcess(
      {LOCKSTEP_BINARY, "run", WriteManifest(dir, base, mode.spec, mode.learning_rate, checkpoint),
       "--summary", dir + "/base.json", "--log-dir", dir + "/logs-base"},
      kRunEnv, kRunTimeoutMs);
  ASSERT_EQ(undisturbed.exit_code, 0) << undisturbed.out << undisturbed.err;
  const double base_auc = ReadRunSummary(dir + "/base.json")["eval_auc"].get<double>();

  const std::string name = "ps-restore-" + mode.name + "-" + std::to_string(getpid());
  const std::string ckpt_dir = dir + "/ckpt2";
  ChildProcess run({LOCKSTEP_BINARY, "run",
                    WriteManifest(dir, name, mode.spec, mode.learning_rate,
                                  "{uri: \"file://" + ckpt_dir + "\", intervalSteps: 50, keep: 2}"),
                    "--summary", dir + "/run.json", "--log-dir", dir + "/logs"},
                   kRunEnv);
  // Past the first checkpoints of both shards.
  ASSERT_TRUE(PollUntil([&] { return LatestStep(run.StdoutSoFar()) >= 300; }, 60000, 10))
      << run.StdoutSoFar();
  const pid_t pid = WorkerOfLauncher(run.pid(), name, name + "-ps-1");
  ASSERT_NE(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ProcessResult result = run.Wait(kRunTimeoutMs);
  ASSERT_FALSE(result.timed_out) << result.out << result.err;
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_NE(result.out.find("parameter server " + name +
                            "-ps-1 failed (signal 9 (SIGKILL)); it "
                            "restarts from its shard's newest checkpoint"),
            std::string::npos)
      << result.out;
  const std::string log = ReadFile(dir + "/logs/ps-1.log");
  EXPECT_NE(log.find("parameter server 1 restored its shard from the checkpoint of step "),
            std::string::npos)
      << log;
  const nlohmann::json summary = ReadRunSummary(dir + "/run.json");
  EXPECT_EQ(summary["steps"], kSteps) << summary.dump();
  EXPECT_EQ(summary["restarts"], 1) << summary.dump();
  // What the workers pushed to shard 1 in the steps since its checkpoint is lost (at most 50
  // steps' pushes to half the rows); the others' are not.
  EXPECT_NEAR(summary["eval_auc"].get<double>(), base_auc, 0.01) << summary.dump();
  std::printf("%s, a server restored: test AUC %.4f, undisturbed %.4f\n", mode.name.c_str(),
              summary["eval_auc"].get<double>(), base_auc);
}

INSTANTIATE_TEST_SUITE_P(Modes, PsServerKillTest, ::testing::ValuesIn(kModes),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return info.param.name;
                         });

TEST(PsRunFailureTest, ALostParameterServerWithoutCheckpointsEndsTheJobNamingIt) {
  const std::string dir = MakeTempDir("lockstep-ps-server-lost");
  const std::string name = "ps-lost-" + std::to_string(getpid());
  ChildProcess run({LOCKSTEP_BINARY, "run", WriteManifest(dir, name, "{mode: async}", 0.5),
                    "--log-dir", dir + "/logs"},
                   kRunEnv);
  ASSERT_TRUE(PollUntil([&] { return LatestStep(run.StdoutSoFar()) >= 100; }, 60000, 10))
      << run.StdoutSoFar();
  const pid_t pid = WorkerOfLauncher(run.pid(), name, name + "-ps-1");
  ASSERT_NE(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ProcessResult result = run.Wait(kRunTimeoutMs);
  ASSERT_FALSE(result.timed_out) << result.out << result.err;
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_NE(result.err.find("parameter server " + name + "-ps-1"), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("set spec.checkpoint.uri"), std::string::npos) << result.err;
}

// A TensorFlow-style program in exec mode (spec.command with spec.parameterServers) gets
// TF_CONFIG as TensorFlow documents it: worker 0 is the chief, the others workers 0.., each server
// a ps task running the same program. The program here stands in for TensorFlow (not packaged):
// a ps task listens where TF_CONFIG says, and every chief and worker task connects to every ps
// task and records what it was told, so the addresses are proven reachable, not just well formed.
constexpr char kTensorflowStandIn[] = R"(import json, os, socket, sys, time
config = json.loads(os.environ["TF_CONFIG"])
task, cluster, out = config["task"], config["cluster"], sys.argv[1]
name = "%s-%d" % (task["type"], task["index"])
if task["type"] == "ps":
    host, port = cluster["ps"][task["index"]].rsplit(":", 1)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen()
    while True:
        conn, _ = server.accept()
        peer = conn.recv(100).decode()
        open(os.path.join(out, name + "-saw-" + peer), "w").close()
        conn.sendall(name.encode())
        conn.close()
answers = []
for address in cluster["ps"]:
    host, port = address.rsplit(":", 1)
    deadline = time.time() + 60
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    conn.sendall(name.encode())
    answers.append(conn.recv(100).decode())
    conn.close()
with open(os.path.join(out, name + ".json"), "w") as f:
    json.dump({"config": config, "answers": answers}, f)
)";

TEST(PsRunExecTest, ATensorflowProgramsTasksGetTfConfigAndReachEveryParameterServer) {
  const std::string dir = MakeTempDir("lockstep-ps-tf-config");
  WriteFile(dir + "/task.py", kTensorflowStandIn);
  const std::string out = dir + "/out";
  ASSERT_EQ(RunProcess({"/bin/mkdir", "-p", out}, {}, 10000).exit_code, 0);
  const std::string name = "tf-" + std::to_string(getpid());
  WriteFile(dir + "/job.yaml",
            "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\n"
            "metadata: {name: " +
                name +
                "}\nspec:\n  replicas: 3\n"
                "  parameterServers: {replicas: 2}\n"
                "  command: [python3, " +
                dir + "/task.py, " + out +
                "]\n"
                "  metrics: {port: 0}\n");
  ProcessResult result = RunProcess(
      {LOCKSTEP_BINARY, "run", dir + "/job.yaml", "--log-dir", dir + "/logs", "--console", "none"},
      kRunEnv, kRunTimeoutMs);
  ASSERT_FALSE(result.timed_out) << result.out << result.err;
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  nlohmann::json cluster;
  for (const std::string task : {"chief-0", "worker-0", "worker-1"}) {
    const nlohmann::json seen = nlohmann::json::parse(ReadFile(out + "/" + task + ".json"));
    EXPECT_EQ(seen["answers"], nlohmann::json({"ps-0", "ps-1"})) << task;
    if (cluster.is_null()) cluster = seen["config"]["cluster"];
    EXPECT_EQ(seen["config"]["cluster"], cluster) << task << ": every task sees one cluster";
    for (const std::string server : {"ps-0", "ps-1"}) {
      EXPECT_EQ(access((out + "/" + server + "-saw-" + task).c_str(), F_OK), 0)
          << server << " never heard from " << task;
    }
  }
  EXPECT_EQ(cluster["chief"].size(), 1u);
  EXPECT_EQ(cluster["worker"].size(), 2u);
  EXPECT_EQ(cluster["ps"].size(), 2u);
}

}  // namespace
}  // namespace lockstep::cli
