// In-place recovery of a PyTorch program that uses Lockstep's elastic helper (lockstep.elastic,
// docs/exec.md): `lockstep run` of the DDP example with --in-place (4 workers, gloo, Debian's
// torch), its processes killed mid-run. The survivors keep their processes, a warm spare takes
// the failed rank's place and receives the state from a survivor, and the job ends as an
// undisturbed one does. Every rank appends a line per step (rank, step, pid) to a shared
// timeline, which tells the test which processes train and lets it act mid-run without sleeping.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/exec/pytorch_program.h"
#include "tests/support/job/job.h"

namespace lockstep::agent {
namespace {

using lockstep::testing::ChildProcess;
using lockstep::testing::TorchAvailable;
using lockstep::testing::FindProcessesWithEnv;
using lockstep::testing::MakeTempDir;
using lockstep::testing::PollUntil;
using lockstep::testing::ProcessResult;
using lockstep::testing::ReadFile;
using lockstep::testing::WriteFile;

const std::string& kScript = lockstep::testing::kDdpScript;
const std::string& kPython = lockstep::testing::kTestPython;
constexpr int kWorkers = 4;
// Long enough for several kills and recoveries on a loaded 2-core machine (each worker imports
// torch twice: its program and its warm spare).
constexpr int kSteps = 360;
constexpr int64_t kRunWaitMs = 170000;

struct StepLine {
  int rank = 0;
  int64_t step = 0;
  pid_t pid = 0;
  int world = 0;
};

std::vector<StepLine> ReadTimeline(const std::string& path) {
  std::vector<StepLine> lines;
  std::istringstream in(ReadFile(path));
  for (std::string text; std::getline(in, text);) {
    const nlohmann::json line = nlohmann::json::parse(text, nullptr, false);
    if (line.is_discarded() || line.value("event", "") != "step") continue;  // being written
    lines.push_back({line["rank"], line["step"], line["pid"], line["world"]});
  }
  return lines;
}

// The processes that train now: those that completed the step before the newest one (every
// rank completed it before anyone could complete the newest), by rank.
std::map<int, pid_t> TrainingProcesses(const std::vector<StepLine>& lines, int64_t* step = nullptr) {
  int64_t newest = 0;
  for (const StepLine& line : lines) newest = std::max(newest, line.step);
  std::map<int, pid_t> by_rank;
  for (const StepLine& line : lines) {
    if (line.step == newest - 1) by_rank[line.rank] = line.pid;
  }
  if (step != nullptr) *step = newest - 1;
  return by_rank;
}

class InPlaceRun {
 public:
  // `standby`: spec.elastic.standby, extra workers that wait for a place.
  explicit InPlaceRun(const std::string& name, int standby = 0, int steps = kSteps)
      : name_(name), dir_(MakeTempDir(name)), standby_(standby), steps_(steps) {}

  int steps() const { return steps_; }

  std::string timeline() const { return dir_ + "/timeline.jsonl"; }
  std::string parameters() const { return dir_ + "/parameters.pt"; }

  void Start() {
    const nlohmann::json command = {
        kPython, kScript, "--in-place", "--synthetic", "--hidden", "32", "--steps",
        std::to_string(steps_), "--batch-size", "16", "--step-delay", "0.02",
        "--timeline", timeline(), "--save-parameters", parameters()};
    const std::string manifest = dir_ + "/job.yaml";
    WriteFile(manifest, "apiVersion: lockstep.io/v1alpha1\n"
                        "kind: TrainingJob\n"
                        "metadata: {name: " + name_ + "}\n"
                        "spec:\n"
                        "  replicas: " + std::to_string(kWorkers) + "\n"
                        "  runPolicy: {restartPolicy: OnFailure, backoffLimit: 6}\n" +
                        (standby_ > 0 ? "  elastic: {standby: " + std::to_string(standby_) + "}\n"
                                      : std::string()) +
                        "  command: " + command.dump() + "\n"
                        "  metrics: {port: 0}\n");
    run_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{lockstep::testing::kLockstepBinary, "run", manifest, "--log-dir",
                                 dir_ + "/logs", "--summary", dir_ + "/summary.json", "--console",
                                 "none"},
        lockstep::testing::Environment{{"OMP_NUM_THREADS", "1"}});
  }

  // Waits until the job has trained `step` steps; the processes training then, by rank.
  std::map<int, pid_t> WaitForStep(int64_t step) {
    std::map<int, pid_t> training;
    const bool reached = PollUntil(
        [&] {
          int64_t done = 0;
          training = TrainingProcesses(ReadTimeline(timeline()), &done);
          return done >= step && static_cast<int>(training.size()) == kWorkers;
        },
        kRunWaitMs, 20);
    EXPECT_TRUE(reached) << "step " << step << " not reached:\n" << run_->StdoutSoFar();
    return training;
  }

  // The job's warm spares now: the live processes the agents' logs say they started or forked
  // as warm spares, which never trained. (Not read from /proc/<pid>/environ: a forked process
  // shows its zygote's there.)
  std::vector<pid_t> Spares() const {
    std::set<pid_t> trained;
    for (const StepLine& line : ReadTimeline(timeline())) trained.insert(line.pid);
    static const std::regex spare("(?:started|forked) a warm spare \\(pid (\\d+)\\)");
    const std::string logs = Logs();
    std::vector<pid_t> spares;
    for (auto it = std::sregex_iterator(logs.begin(), logs.end(), spare);
         it != std::sregex_iterator(); ++it) {
      const pid_t pid = std::stoi((*it)[1]);
      if (trained.count(pid) == 0 && kill(pid, 0) == 0) spares.push_back(pid);
    }
    return spares;
  }

  ProcessResult Finish() { return run_->Wait(kRunWaitMs); }
  nlohmann::json Summary() const {
    return nlohmann::json::parse(ReadFile(dir_ + "/summary.json"), nullptr, false);
  }
  std::string Logs() const {
    std::string logs;
    for (int i = 0; i < kWorkers + standby_; ++i) logs += WorkerLog(i);
    return logs;
  }
  std::string WorkerLog(int i) const {
    return ReadFile(dir_ + "/logs/worker-" + std::to_string(i) + ".log");
  }

 private:
  std::string name_;
  std::string dir_;
  int standby_ = 0;
  int steps_ = kSteps;
  std::unique_ptr<ChildProcess> run_;
};

// The largest difference between two saved parameter sets (torch.save of a state_dict).
double ParameterDistance(const std::string& a, const std::string& b) {
  const ProcessResult result = lockstep::testing::RunProcess(
      {kPython, "-c",
       "import sys, torch\n"
       "a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])\n"
       "assert a.keys() == b.keys()\n"
       "print(max(float((a[k] - b[k]).abs().max()) for k in a))\n",
       a, b},
      {}, 60000);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  return result.exit_code == 0 ? std::stod(result.out) : 1e9;
}

// restarts < 0: not checked.
void ExpectFinishedExactly(InPlaceRun& run, const ProcessResult& result, int restarts) {
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err << run.Logs();
  const nlohmann::json summary = run.Summary();
  EXPECT_EQ(summary["status"], "succeeded") << summary.dump();
  EXPECT_EQ(summary["steps"], run.steps()) << summary.dump();
  if (restarts >= 0) {
    EXPECT_EQ(summary["restarts"], restarts) << "once per failure: " << summary.dump();
  }
  // Every step was completed by every rank of its generation exactly once, whatever the kills.
  std::map<int64_t, std::set<int>> ranks_of_step;
  for (const StepLine& line : ReadTimeline(run.timeline())) {
    ranks_of_step[line.step].insert(line.rank);
  }
  EXPECT_EQ(ranks_of_step.size(), static_cast<size_t>(run.steps()));
  EXPECT_EQ(ranks_of_step[run.steps()].size(), static_cast<size_t>(kWorkers));
}

void ExpectNoProcessLeft(const std::string& name) {
  EXPECT_TRUE(PollUntil(
      [&] { return FindProcessesWithEnv("LOCKSTEP_JOB", "default/" + name).empty(); }, 10000, 50))
      << "processes of the job outlived lockstep run";
}

TEST(InPlaceRecovery, KilledProcessesAreReplacedWhileTheSurvivorsTrainOnToTheUndisturbedResult) {
  if (!TorchAvailable()) GTEST_SKIP() << kPython << " has no torch";
  InPlaceRun undisturbed("in-place-calm");
  undisturbed.Start();
  ASSERT_EQ(undisturbed.Finish().exit_code, 0) << undisturbed.Logs();

  InPlaceRun run("in-place-kills");
  run.Start();
  const std::map<int, pid_t> first = run.WaitForStep(60);
  ASSERT_EQ(kill(first.at(1), SIGKILL), 0);
  const std::map<int, pid_t> second = run.WaitForStep(160);
  // The second victim is a survivor of the first kill: its process trained through it.
  pid_t second_victim = -1;
  for (const auto& [rank, pid] : second) {
    for (const auto& [first_rank, first_pid] : first) {
      if (pid == first_pid && pid != first.at(1) && second_victim < 0) second_victim = pid;
    }
  }
  ASSERT_GT(second_victim, 0) << "no process of the first generation trains any more";
  ASSERT_EQ(kill(second_victim, SIGKILL), 0);
  const std::map<int, pid_t> after = run.WaitForStep(260);
  const ProcessResult result = run.Finish();
  ExpectFinishedExactly(run, result, /*restarts=*/2);

  std::set<pid_t> surviving;
  for (const auto& [rank, pid] : first) {
    if (pid != first.at(1) && pid != second_victim) surviving.insert(pid);
  }
  ASSERT_EQ(surviving.size(), 2u);
  std::set<pid_t> training_after;
  for (const auto& [rank, pid] : after) training_after.insert(pid);
  for (pid_t pid : surviving) {
    EXPECT_EQ(training_after.count(pid), 1u) << "survivor pid " << pid << " was restarted";
  }
  EXPECT_NE(run.Logs().find("promoted the warm spare"), std::string::npos) << run.Logs();
  EXPECT_NE(run.Logs().find("from the zygote"), std::string::npos)
      << "the spares of a python3 command are forked from the zygote: " << run.Logs();
  EXPECT_LT(ParameterDistance(undisturbed.parameters(), run.parameters()), 1e-4)
      << "the final parameters differ from an undisturbed run's";
  ExpectNoProcessLeft("in-place-kills");
}

TEST(InPlaceRecovery, AWarmSpareKilledBeforeUseCostsNoRestartAndTheNextFailureIsRecovered) {
  if (!TorchAvailable()) GTEST_SKIP() << kPython << " has no torch";
  InPlaceRun run("in-place-spare");
  run.Start();
  run.WaitForStep(40);
  std::vector<pid_t> spares;
  ASSERT_TRUE(PollUntil([&] { return !(spares = run.Spares()).empty(); }, kRunWaitMs, 50))
      << "no warm spare started";
  for (pid_t spare : spares) kill(spare, SIGKILL);
  const std::map<int, pid_t> training = run.WaitForStep(120);
  ASSERT_EQ(kill(training.at(0), SIGKILL), 0);
  const ProcessResult result = run.Finish();
  ExpectFinishedExactly(run, result, /*restarts=*/1);
  EXPECT_NE(run.Logs().find("ended unused"), std::string::npos) << run.Logs();
  ExpectNoProcessLeft("in-place-spare");
}

// Two processes killed together, then a third while the job recovers from a fourth: each
// failure is recovered, and the job ends exactly.
TEST(InPlaceRecovery, FailuresTogetherAndDuringRecoveryEndWell) {
  if (!TorchAvailable()) GTEST_SKIP() << kPython << " has no torch";
  InPlaceRun run("in-place-storm");
  run.Start();
  const std::map<int, pid_t> first = run.WaitForStep(60);
  kill(first.at(0), SIGKILL);
  kill(first.at(3), SIGKILL);
  const std::map<int, pid_t> second = run.WaitForStep(160);
  auto generations_left = [&] {
    const std::string logs = run.Logs();
    int count = 0;
    for (size_t at = logs.find(" is over ("); at != std::string::npos;
         at = logs.find(" is over (", at + 1)) {
      ++count;
    }
    return count;
  };
  const int left_before = generations_left();
  kill(second.at(1), SIGKILL);
  // The survivors learn of the failure within milliseconds and re-form within a fraction of a
  // second: a kill right after the first survivor left the broken group lands in the recovery.
  ASSERT_TRUE(PollUntil([&] { return generations_left() > left_before; }, kRunWaitMs, 2))
      << run.Logs();
  kill(second.at(2), SIGKILL);
  const ProcessResult result = run.Finish();
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err << run.Logs();
  const nlohmann::json summary = run.Summary();
  EXPECT_EQ(summary["steps"], kSteps) << summary.dump();
  EXPECT_GE(summary["restarts"].get<int>(), 2) << summary.dump();
  EXPECT_LE(summary["restarts"].get<int>(), 4) << summary.dump();
  ExpectNoProcessLeft("in-place-storm");
}

// The parent of `pid` (its agent, for a program of the job), from /proc; 0 when it is gone.
pid_t ParentOf(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t close_paren = stat.rfind(')');
  if (close_paren == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close_paren + 1));
  std::string state;
  pid_t parent = 0;
  rest >> state >> parent;
  return parent;
}

// A lost pod, not only a lost process: the agent of a training member is SIGKILLed with its
// program, spare and zygote. The standby worker, whose agent forked the command ahead of a place
// from a zygote while it waited (the script's start-up done, the program waiting in
// elastic.run()), takes the place with that very process, and the job trains on at full size to
// the end.
TEST(InPlaceRecovery, AStandbysProgramWaitsWarmInTheHelperAndTakesALostWorkersPlace) {
  if (!TorchAvailable()) GTEST_SKIP() << kPython << " has no torch";
  // Long enough that the standby's program (forked after its join waited
  // kPrepareWhileJoiningMs, 5 s, and its zygote's imports) is waiting well before the end on a
  // loaded 2-core machine.
  InPlaceRun run("in-place-standby", /*standby=*/1, /*steps=*/1500);
  run.Start();
  const std::map<int, pid_t> training = run.WaitForStep(40);
  static const std::regex ahead("\\(pid (\\d+)\\) ahead of a place");
  int standby = -1;
  pid_t waiting = 0;
  ASSERT_TRUE(PollUntil(
      [&] {
        for (int i = 0; i < kWorkers + 1 && standby < 0; ++i) {
          const std::string log = run.WorkerLog(i);
          std::smatch match;
          // Not a member of generation 1 (a training worker whose first join took 5 s on a
          // loaded machine forks ahead too), and its program says hello once it waits in
          // elastic.run().
          if (log.find("joined generation 1 ") == std::string::npos &&
              std::regex_search(log, match, ahead) &&
              log.find("pid " + match[1].str() + " runs Lockstep's elastic helper") !=
                  std::string::npos) {
            standby = i;
            waiting = std::stoi(match[1]);
          }
        }
        return standby >= 0;
      },
      kRunWaitMs, 50))
      << "no standby's program waited in the helper:\n"
      << run.Logs();
  const pid_t agent = ParentOf(training.at(1));
  ASSERT_GT(agent, 1);
  ASSERT_EQ(kill(agent, SIGKILL), 0);
  const ProcessResult result = run.Finish();
  // A lost agent records no failure of its own (restarts stay 0 in exec mode; the built-in
  // trainer counts one): what is exact is one re-formation, with the standby.
  ExpectFinishedExactly(run, result, /*restarts=*/-1);
  EXPECT_EQ(run.Summary()["generations"], 2) << run.Summary().dump();
  bool waiting_trained = false;
  for (const StepLine& line : ReadTimeline(run.timeline())) {
    ASSERT_EQ(line.world, kWorkers) << "step " << line.step << " trained by a smaller world";
    waiting_trained = waiting_trained || line.pid == waiting;
  }
  EXPECT_TRUE(waiting_trained) << "the program that waited (pid " << waiting << ") never trained";
  EXPECT_NE(
      run.WorkerLog(standby).find("gen=2] promoted the warm spare (pid " + std::to_string(waiting)),
      std::string::npos)
      << run.WorkerLog(standby);
  ExpectNoProcessLeft("in-place-standby");
}

}  // namespace
}  // namespace lockstep::agent
