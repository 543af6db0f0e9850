// The command lines of `lockstep-worker train` and `exec`: the flags and the program read as they
// always were, now through CLI11; a bad flag refused naming it.
#include "worker/agent/worker_command_line.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lockstep::agent {
namespace {

using Args = std::vector<std::string>;

WorkerCommandLine Exec(const Args& args) {
  StatusOr<WorkerCommandLine> line = ParseWorkerCommandLine(WorkerMode::kExec, args);
  EXPECT_TRUE(line.ok()) << line.status().message();
  return line.ok() ? *line : WorkerCommandLine{};
}

std::string ExecError(const Args& args) {
  StatusOr<WorkerCommandLine> line = ParseWorkerCommandLine(WorkerMode::kExec, args);
  EXPECT_FALSE(line.ok());
  return line.ok() ? "" : line.status().message();
}

TEST(WorkerCommandLineTest, TrainReadsTheManifestInEitherSpelling) {
  EXPECT_EQ(ParseWorkerCommandLine(WorkerMode::kTrain, {"--manifest", "job.yaml"})->manifest_path,
            "job.yaml");
  EXPECT_EQ(ParseWorkerCommandLine(WorkerMode::kTrain, {"--manifest=job.yaml"})->manifest_path,
            "job.yaml");
  EXPECT_EQ(ParseWorkerCommandLine(WorkerMode::kTrain, {})->manifest_path, "");
}

TEST(WorkerCommandLineTest, TrainRefusesAnythingElseNamingIt) {
  StatusOr<WorkerCommandLine> line =
      ParseWorkerCommandLine(WorkerMode::kTrain, {"--manifest", "a.yaml", "--steps", "3"});
  ASSERT_FALSE(line.ok());
  EXPECT_NE(line.status().message().find("--steps"), std::string::npos) << line.status().message();
  line = ParseWorkerCommandLine(WorkerMode::kTrain, {"extra.yaml"});
  ASSERT_FALSE(line.ok());
  EXPECT_NE(line.status().message().find("extra.yaml"), std::string::npos)
      << line.status().message();
}

TEST(WorkerCommandLineTest, AManifestFlagWithoutItsValueIsRefusedNamingTheFlag) {
  for (WorkerMode mode : {WorkerMode::kTrain, WorkerMode::kExec}) {
    StatusOr<WorkerCommandLine> line = ParseWorkerCommandLine(mode, {"--manifest"});
    ASSERT_FALSE(line.ok());
    EXPECT_NE(line.status().message().find("--manifest"), std::string::npos)
        << line.status().message();
  }
}

TEST(WorkerCommandLineTest, ExecsProgramFollowsTheDashesAndKeepsItsOwnFlags) {
  WorkerCommandLine line =
      Exec({"--manifest", "job.yaml", "--", "python3", "train.py", "--lr", "0.1", "--help"});
  EXPECT_EQ(line.manifest_path, "job.yaml");
  EXPECT_EQ(line.command, (Args{"python3", "train.py", "--lr", "0.1", "--help"}));
  EXPECT_FALSE(line.help);
}

TEST(WorkerCommandLineTest, ExecsProgramStartsAtTheFirstArgumentThatIsNotAFlag) {
  WorkerCommandLine line = Exec({"--manifest=job.yaml", "python3", "-u", "train.py", "--", "x"});
  EXPECT_EQ(line.manifest_path, "job.yaml");
  // The program's own "--" stays in its arguments.
  EXPECT_EQ(line.command, (Args{"python3", "-u", "train.py", "--", "x"}));
  EXPECT_EQ(Exec({"python3", "--manifest", "m"}).command, (Args{"python3", "--manifest", "m"}))
      << "after the program, --manifest is the program's";
  EXPECT_EQ(Exec({"--", "--manifest", "m"}).command, (Args{"--manifest", "m"}));
}

TEST(WorkerCommandLineTest, ExecsProgramGetsItsArgumentsAsGivenEvenEmptyValues) {
  EXPECT_EQ(Exec({"python3", "train.py", "--resume=", "--lr=0.1", ""}).command,
            (Args{"python3", "train.py", "--resume=", "--lr=0.1", ""}));
  EXPECT_EQ(Exec({"--manifest=", "prog", "--out="}).command, (Args{"prog", "--out="}));
  EXPECT_EQ(Exec({"--", "prog", "--out="}).command, (Args{"prog", "--out="}));
}

TEST(WorkerCommandLineTest, ExecWithoutAProgramLeavesItToTheManifest) {
  EXPECT_TRUE(Exec({"--manifest", "job.yaml"}).command.empty());
  EXPECT_TRUE(Exec({"--manifest", "job.yaml", "--"}).command.empty());
  EXPECT_TRUE(Exec({}).command.empty());
}

TEST(WorkerCommandLineTest, AnUnknownFlagBeforeTheProgramIsRefusedSayingWhereItBelongs) {
  EXPECT_EQ(ExecError({"--manifest", "job.yaml", "--lr", "0.1", "--", "python3"}),
            "unknown flag --lr (the command follows --)");
  EXPECT_EQ(ExecError({"-u", "train.py"}), "unknown flag -u (the command follows --)");
  EXPECT_EQ(ExecError({"-", "train.py"}), "unknown flag - (the command follows --)");
}

TEST(WorkerCommandLineTest, TrainRefusesTheDashesOfAProgramItDoesNotRun) {
  for (const Args& args : {Args{"--"}, Args{"--manifest", "a.yaml", "--"}, Args{"--", "x"}}) {
    StatusOr<WorkerCommandLine> line = ParseWorkerCommandLine(WorkerMode::kTrain, args);
    ASSERT_FALSE(line.ok()) << args.size();
    EXPECT_NE(line.status().message().find("\"--\""), std::string::npos)
        << line.status().message();
  }
}

TEST(WorkerCommandLineTest, HelpBeforeTheProgramIsOursAndListsTheFlags) {
  EXPECT_TRUE(Exec({"--help"}).help);
  EXPECT_TRUE(Exec({"-h"}).help);
  EXPECT_TRUE(ParseWorkerCommandLine(WorkerMode::kTrain, {"--help"})->help);
  EXPECT_FALSE(Exec({"python3", "--help"}).help) << "the program's --help";
  const std::string help = WorkerCommandLineHelp(WorkerMode::kExec, "lockstep-agent");
  EXPECT_NE(help.find("lockstep-agent exec"), std::string::npos) << help;
  EXPECT_NE(help.find("--manifest"), std::string::npos) << help;
  EXPECT_NE(help.find("COMMAND"), std::string::npos) << help;
  const std::string train = WorkerCommandLineHelp(WorkerMode::kTrain, "lockstep-worker");
  EXPECT_NE(train.find("lockstep-worker train"), std::string::npos) << train;
  EXPECT_EQ(train.find("COMMAND"), std::string::npos) << train;
}

}  // namespace
}  // namespace lockstep::agent
