// Warm spares forked from a zygote (worker/agent/zygote.h, python/lockstep/zygote.py), with the
// real interpreter: what a forked spare runs, whose child it is, what it inherits and shares.
#include "worker/agent/zygote.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <fstream>

#include "tests/support/process/process.h"
#include "worker/agent/supervised_command.h"

namespace lockstep::agent {
namespace {

constexpr int64_t kWaitMs = 20000;
constexpr char kPython[] = "/usr/bin/python3";

std::vector<std::string> Args(std::initializer_list<std::string> args) { return args; }

TEST(ZygoteArgv, PythonScriptsAndModulesAreForkedWithTheInterpretersOptions) {
  EXPECT_EQ(ZygoteArgv({"/usr/bin/python3", "train.py", "--lr", "0.1"}),
            Args({"/usr/bin/python3", "-m", "lockstep.zygote", "--", "train.py", "--lr", "0.1"}));
  EXPECT_EQ(ZygoteArgv({"python3.12", "-u", "-X", "faulthandler", "-m", "pkg.train", "-v"}),
            Args({"python3.12", "-u", "-X", "faulthandler", "-m", "lockstep.zygote", "--", "-m",
                  "pkg.train", "-v"}));
  EXPECT_EQ(ZygoteArgv({"/venv/bin/python", "-uB", "t.py"}),
            Args({"/venv/bin/python", "-uB", "-m", "lockstep.zygote", "--", "t.py"}));
}

TEST(ZygoteArgv, OtherCommandsStartTheirSparesFromNothing) {
  for (const std::vector<std::string>& argv : std::vector<std::vector<std::string>>{
           {"/usr/bin/torchrun", "train.py"},  // not an interpreter
           {"/opt/pythonista", "train.py"},    // a name that only starts like one
           {"python3", "-c", "print(1)"},      // code on the command line
           {"python3", "-I", "train.py"},      // isolated: no PYTHONPATH, no lockstep
           {"python3", "-E", "train.py"},      // environment ignored: the same
           {"python3", "-"},                   // a script on stdin
           {"python3"},                        // interactive
           {"python3", "-m"},                  // no module
           {"python3", "--check-hash-based-pycs", "always", "t.py"}}) {  // unknown option
    EXPECT_EQ(ZygoteArgv(argv), std::nullopt) << argv[0] << " " << (argv.size() > 1 ? argv[1] : "");
  }
}

// A zygote for `python3 <dir>/main.py arg`, importing only `preload` (torch is not needed to
// test the mechanism); this test process is the child subreaper the spares are reparented to.
class ZygoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    dir_ = testing::MakeTempDir("zygote");
  }
  void TearDown() override { prctl(PR_SET_CHILD_SUBREAPER, 0); }

  ChildProcess::Options Options(const std::string& script, const std::string& preload) {
    std::ofstream(dir_ + "/main.py") << script;
    ChildProcess::Options options;
    options.argv = {kPython, dir_ + "/main.py", "arg"};
    options.env = {"PATH=/usr/bin:/bin", "PYTHONPATH=" + dir_ + ":" LOCKSTEP_PYTHON_DIR,
                   "PYTHONUNBUFFERED=1", "LOCKSTEP_EXEC_PRELOAD=" + preload};
    options.output_prefix = "[spare] ";
    return options;
  }

  std::unique_ptr<Zygote> StartReady(const ChildProcess::Options& options) {
    StatusOr<std::unique_ptr<Zygote>> zygote = Zygote::Start(options, *ZygoteArgv(options.argv));
    EXPECT_TRUE(zygote.ok()) << zygote.status();
    if (!zygote.ok()) return nullptr;
    EXPECT_TRUE(testing::PollUntil([&] { return (*zygote)->Ready(); }, kWaitMs, 10))
        << "the zygote never said it was ready";
    return std::move(*zygote);
  }

  static ChildExit WaitForExit(ChildProcess& child) {
    EXPECT_TRUE(testing::PollUntil([&] { return child.TryReap().has_value(); }, kWaitMs, 10));
    return child.exit().value_or(ChildExit{});
  }

  // Forks a process from `zygote` and waits for its exit; what it wrote to stdout (relayed with
  // its prefix to this process's stdout) is captured in *out. Fails the test if the fork fails.
  ChildExit RunForked(Zygote& zygote, const ChildProcess::Options& options,
                      std::string* out = nullptr) {
    const std::string out_path = dir_ + "/out";
    const int saved = dup(STDOUT_FILENO);
    const int file = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    EXPECT_GE(file, 0);
    fflush(stdout);
    dup2(file, STDOUT_FILENO);
    ChildExit exit;
    Status forked;
    {
      StatusOr<HelperChannel::Pair> channel = HelperChannel::Create();
      if (!channel.ok()) {
        forked = channel.status();
      } else {
        StatusOr<std::unique_ptr<ChildProcess>> spare = zygote.Fork(options, channel->program_fd);
        channel->CloseProgramEnd();
        if (spare.ok()) exit = WaitForExit(**spare);
        forked = spare.status();
      }
    }
    dup2(saved, STDOUT_FILENO);
    close(saved);
    close(file);
    EXPECT_TRUE(forked.ok()) << forked;
    if (out != nullptr) *out = testing::ReadFile(out_path);
    return exit;
  }

  std::string dir_;
};

TEST_F(ZygoteTest, AForkedSpareRunsTheScriptAsTheInterpreterWouldAsThisProcesssChild) {
  ChildProcess::Options options = Options(
      "import os, sys\n"
      "print(__name__, sys.argv[1:], os.environ['ROLE'], os.getppid(), os.getpgid(0) == "
      "os.getpid(),\n"
      "      open('/proc/self/comm').read().strip())\n"
      "print('to stderr', file=sys.stderr)\n"
      "sys.exit(3)\n",
      "json");
  std::unique_ptr<Zygote> zygote = StartReady(options);
  ASSERT_NE(zygote, nullptr);
  options.env.push_back("ROLE=spare-1");
  std::string out;
  const ChildExit exit = RunForked(*zygote, options, &out);
  EXPECT_FALSE(exit.signaled);
  EXPECT_EQ(exit.exit_code, 3) << "its own exit code, reaped by this process";
  EXPECT_EQ(out,
            "[spare] __main__ ['arg'] spare-1 " + std::to_string(getpid()) + " True python3\n");
  EXPECT_EQ(testing::ReadFile("/proc/" + std::to_string(zygote->pid()) + "/comm"),
            "lockstep-zygote\n")
      << "the zygote is named in ps and top; its spares are not";
  EXPECT_TRUE(zygote->Usable()) << "the zygote goes on serving";
}

TEST_F(ZygoteTest, AModuleRunWithDashMIsRunAsTheInterpreterWouldRunIt) {
  ChildProcess::Options options = Options("", "json");
  std::ofstream(dir_ + "/trainmod.py") << "import os, sys\n"
                                          "print(__name__, sys.argv == [__file__, 'x'],\n"
                                          "      sys.path[0] == os.getcwd())\n";
  options.argv = {kPython, "-m", "trainmod", "x"};
  std::unique_ptr<Zygote> zygote = StartReady(options);
  ASSERT_NE(zygote, nullptr);
  std::string out;
  const ChildExit exit = RunForked(*zygote, options, &out);
  EXPECT_TRUE(exit.success()) << exit.Describe();
  EXPECT_EQ(out, "[spare] __main__ True True\n");
}

TEST_F(ZygoteTest, TheImportsAreDoneOnceInTheZygoteAndEverySpareFindsThemDone) {
  // heavy.py stands for torch: it records every process that executes it.
  std::ofstream(dir_ + "/heavy.py") << "import os\n"
                                       "with open(os.path.join(os.path.dirname(__file__), "
                                       "'imported'), 'a') as f:\n"
                                       "    f.write('%d\\n' % os.getpid())\n";
  ChildProcess::Options options = Options("import heavy\n", "heavy");
  std::unique_ptr<Zygote> zygote = StartReady(options);
  ASSERT_NE(zygote, nullptr);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(RunForked(*zygote, options).success());
  EXPECT_EQ(testing::ReadFile(dir_ + "/imported"), std::to_string(zygote->pid()) + "\n");
}

TEST_F(ZygoteTest, AModuleTheScriptNeverImportsIsNotPreloaded) {
  std::ofstream(dir_ + "/heavy.py") << "open(__file__ + '.imported', 'w').close()\n";
  ChildProcess::Options options = Options("import json\n", "heavy,json");
  std::unique_ptr<Zygote> zygote = StartReady(options);
  ASSERT_NE(zygote, nullptr);
  EXPECT_NE(access((dir_ + "/heavy.py.imported").c_str(), F_OK), 0)
      << "a script that does not import heavy does not pay for it in the zygote";
}

TEST_F(ZygoteTest, AForkedSpareSpeaksToTheAgentOnItsHelperChannel) {
  ChildProcess::Options options = Options(
      "import os, sys, time\n"
      "os.write(int(os.environ['LOCKSTEP_AGENT_FD']), b'{\"type\": \"hello\"}\\n')\n"
      "sys.stdin.read()\n"  // stdin is /dev/null: returns at once
      "time.sleep(60)\n",
      "json");
  std::unique_ptr<Zygote> zygote = StartReady(options);
  ASSERT_NE(zygote, nullptr);
  StatusOr<std::unique_ptr<SupervisedCommand>> spare = SupervisedCommand::Fork(*zygote, options);
  ASSERT_TRUE(spare.ok()) << spare.status();
  EXPECT_TRUE(testing::PollUntil(
      [&] {
        (*spare)->Absorb();
        return (*spare)->recoverable();
      },
      kWaitMs, 10));
  // Stopped as the agent stops any program: SIGTERM to its group.
  const ChildExit exit = (*spare)->process().Stop(/*grace_ms=*/5000, /*kill_wait_ms=*/5000);
  EXPECT_TRUE(exit.signaled);
  EXPECT_EQ(exit.signal, SIGTERM);
}

TEST_F(ZygoteTest, AZygoteThatDiedIsNoLongerUsableAndSaysSo) {
  ChildProcess::Options options = Options("pass\n", "json");
  std::unique_ptr<Zygote> zygote = StartReady(options);
  ASSERT_NE(zygote, nullptr);
  ASSERT_EQ(kill(zygote->pid(), SIGKILL), 0);
  EXPECT_TRUE(testing::PollUntil([&] { return !zygote->Usable(); }, kWaitMs, 10));
  auto channel = HelperChannel::Create();
  ASSERT_TRUE(channel.ok());
  EXPECT_FALSE(zygote->Fork(options, channel->program_fd).ok());
}

TEST_F(ZygoteTest, AScriptThatCannotBeFoundFailsInTheSpareNotInTheZygote) {
  ChildProcess::Options options = Options("pass\n", "json");
  options.argv = {kPython, dir_ + "/missing.py"};
  std::unique_ptr<Zygote> zygote = StartReady(options);
  ASSERT_NE(zygote, nullptr);
  const ChildExit exit = RunForked(*zygote, options);
  EXPECT_EQ(exit.exit_code, 2) << "as `python3 missing.py` fails";
  EXPECT_TRUE(zygote->Usable());
}

}  // namespace
}  // namespace lockstep::agent
