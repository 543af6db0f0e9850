// The parts of `lockstep run` that need no workers: flags, the replicas override, the job token,
// log tails.
#include "cli/run_command.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cli/run_report.h"
#include "cli/run_setup.h"
#include "tests/support/process/process.h"

namespace lockstep::cli {
namespace {

TEST(RunArgsTest, AcceptsFlagsBeforeAndAfterTheManifest) {
  StatusOr<RunOptions> options =
      ParseRunArgs({"--replicas", "3", "job.yaml", "--summary=out.json", "--log-dir", "logs"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->manifest_path, "job.yaml");
  EXPECT_EQ(options->replicas, 3);
  EXPECT_EQ(options->summary_path, "out.json");
  EXPECT_EQ(options->log_dir, "logs");
}

TEST(RunArgsTest, RejectsWhatItDoesNotUnderstand) {
  EXPECT_FALSE(ParseRunArgs({}).ok());
  EXPECT_FALSE(ParseRunArgs({"a.yaml", "b.yaml"}).ok());
  EXPECT_FALSE(ParseRunArgs({"a.yaml", "--replicas"}).ok());
  EXPECT_FALSE(ParseRunArgs({"a.yaml", "--replicas", "0"}).ok());
  EXPECT_FALSE(ParseRunArgs({"a.yaml", "--replicas", "two"}).ok());
  StatusOr<RunOptions> unknown = ParseRunArgs({"a.yaml", "--fast"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("--fast"), std::string::npos);
}

TEST(RunArgsTest, ABadValueIsRefusedNamingTheFlagAndTheValue) {
  for (const auto& [args, flag, value] :
       std::vector<std::tuple<std::vector<std::string>, std::string, std::string>>{
           {{"a.yaml", "--replicas", "0"}, "--replicas", "0"},
           {{"a.yaml", "--replicas=two"}, "--replicas", "two"},
           {{"a.yaml", "--replicas", "1025"}, "--replicas", "1025"},
           {{"a.yaml", "--console", "rank1"}, "--console", "rank1"}}) {
    StatusOr<RunOptions> refused = ParseRunArgs(args);
    ASSERT_FALSE(refused.ok()) << flag << " " << value;
    EXPECT_NE(refused.status().message().find(flag), std::string::npos) << refused.status();
    EXPECT_NE(refused.status().message().find(value), std::string::npos) << refused.status();
  }
  // "--summary=" is an empty path, refused; it never takes the next argument as the path.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"a.yaml", "--summary=", "--log-dir", "logs"},
                                             {"a.yaml", "--log-dir", ""},
                                             {"a.yaml", "--replicas="}}) {
    StatusOr<RunOptions> empty = ParseRunArgs(args);
    ASSERT_FALSE(empty.ok()) << args[1];
    EXPECT_NE(empty.status().message().find(args[1].substr(0, args[1].find('='))),
              std::string::npos)
        << empty.status();
  }
  StatusOr<RunOptions> missing = ParseRunArgs({"a.yaml", "--summary"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--summary"), std::string::npos) << missing.status();
}

TEST(RunArgsTest, ConsoleAndHelpAreRead) {
  StatusOr<RunOptions> options = ParseRunArgs({"a.yaml", "--console=rank0"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->console, ConsoleRanks::kRankZero);
  EXPECT_FALSE(options->help);
  EXPECT_EQ(ParseRunArgs({"a.yaml"})->console, ConsoleRanks::kAll);
  // --help anywhere asks for the usage, which names every flag.
  EXPECT_TRUE(ParseRunArgs({"a.yaml", "--help"})->help);
  EXPECT_TRUE(ParseRunArgs({"-h"})->help);
  EXPECT_TRUE(ParseRunArgs({"a.yaml", "--help", "--replicas"})->help)
      << "the help, whatever else the line holds";
  for (const char* flag : {"FILE", "--replicas", "--summary", "--log-dir", "--console"}) {
    EXPECT_NE(RunUsage().find(flag), std::string::npos) << flag << "\n" << RunUsage();
  }
}

TEST(RunArgsTest, ReplicasOverrideSetsTheRangeOfAFixedSizeJob) {
  spec::TrainingJob job;
  job.spec.replicas = 4;
  job.spec.elastic = {4, 4};
  ASSERT_TRUE(ApplyReplicasOverride(2, &job).ok());
  EXPECT_EQ(job.spec.replicas, 2);
  EXPECT_EQ(job.spec.elastic.min_replicas, 2);
  EXPECT_EQ(job.spec.elastic.max_replicas, 2);
}

TEST(RunArgsTest, ReplicasOverrideMustFitAnElasticRange) {
  spec::TrainingJob job;
  job.spec.replicas = 4;
  job.spec.elastic = {2, 8};
  job.spec.elastic_set = true;
  EXPECT_TRUE(ApplyReplicasOverride(8, &job).ok());
  EXPECT_EQ(job.spec.elastic.min_replicas, 2);
  Status status = ApplyReplicasOverride(9, &job);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("spec.elastic"), std::string::npos) << status;
}

TEST(JobTokenTest, IsFreshRandom256BitHex) {
  std::set<std::string> tokens;
  for (int i = 0; i < 16; ++i) {
    StatusOr<std::string> token = GenerateJobToken();
    ASSERT_TRUE(token.ok());
    EXPECT_EQ(token->size(), 64u);
    EXPECT_EQ(token->find_first_not_of("0123456789abcdef"), std::string::npos);
    tokens.insert(*token);
  }
  EXPECT_EQ(tokens.size(), 16u);
}

TEST(TailOfFileTest, ReturnsTheLastLines) {
  const std::string path = lockstep::testing::MakeTempDir("tail") + "/log";
  std::string text;
  for (int i = 1; i <= 30; ++i) text += "line " + std::to_string(i) + "\n";
  lockstep::testing::WriteFile(path, text);
  std::vector<std::string> tail = TailOfFile(path, 20);
  ASSERT_EQ(tail.size(), 20u);
  EXPECT_EQ(tail.front(), "line 11");
  EXPECT_EQ(tail.back(), "line 30");
  EXPECT_TRUE(TailOfFile(path + ".missing", 20).empty());
}

TEST(LogDirTest, DefaultLogDirIsCreatedAndUniquePerRun) {
  StatusOr<std::string> first = CreateDefaultLogDir("job");
  StatusOr<std::string> second = CreateDefaultLogDir("job");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*first, *second);
  EXPECT_NE(first->find("lockstep-logs/job-"), std::string::npos) << *first;
}

}  // namespace
}  // namespace lockstep::cli
