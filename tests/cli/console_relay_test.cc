// What `lockstep run` relays of an exec job's worker logs to its console.
#include "cli/console_relay.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/support/process/process.h"

namespace lockstep::cli {
namespace {

using lockstep::testing::MakeTempDir;

void Append(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::app | std::ios::binary);
  file << text;
}

TEST(ConsoleRelay, RelaysTheProgramsLinesOfEveryRankAsTheLogsGrow) {
  const std::string dir = MakeTempDir("relay");
  const std::string a = dir + "/worker-0.log", b = dir + "/worker-1.log";
  ConsoleRelay relay({a, b}, ConsoleRanks::kAll);
  EXPECT_TRUE(relay.Poll().empty()) << "logs not created yet";
  Append(a, "2026-11-24 I agent started\n[rank 1] epoch 1\n[rank 1] half a li");
  Append(b, "[rank 0] epoch 1\n[rankless line\n");
  EXPECT_EQ(relay.Poll(), (std::vector<std::string>{"[rank 1] epoch 1", "[rank 0] epoch 1"}));
  Append(a, "ne\n");
  EXPECT_EQ(relay.Poll(), (std::vector<std::string>{"[rank 1] half a line"}));
  EXPECT_TRUE(relay.Poll().empty()) << "each line once";
}

TEST(ConsoleRelay, AReusedLogDirectorysEarlierRunIsNotReplayed) {
  const std::string dir = MakeTempDir("relay");
  const std::string log = dir + "/worker-0.log";
  Append(log, "[rank 0] the last run's line\n");
  ConsoleRelay relay({log}, ConsoleRanks::kAll);
  Append(log, "[rank 0] this run's line\n");
  EXPECT_EQ(relay.Poll(), (std::vector<std::string>{"[rank 0] this run's line"}));
}

TEST(ConsoleRelay, RankZeroOnlyAndNone) {
  const std::string dir = MakeTempDir("relay");
  const std::string log = dir + "/worker-0.log";
  ConsoleRelay rank_zero({log}, ConsoleRanks::kRankZero);
  ConsoleRelay none({log}, ConsoleRanks::kNone);
  Append(log, "[rank 0] mine\n[rank 10] not mine\n[rank 1] nor this\n");
  EXPECT_EQ(rank_zero.Poll(), (std::vector<std::string>{"[rank 0] mine"}));
  EXPECT_TRUE(none.Poll().empty());
}

TEST(ConsoleRelay, AnEndlessLineIsRelayedInPiecesNotHeldWhole) {
  const std::string dir = MakeTempDir("relay");
  const std::string log = dir + "/worker-0.log";
  ConsoleRelay relay({log}, ConsoleRanks::kRankZero);
  Append(log, "[rank 0] " + std::string(100 << 10, 'x'));
  std::vector<std::string> lines = relay.Poll();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].size(), (64u << 10) + 32);
  Append(log, "tail\n[rank 1] " + std::string(70 << 10, 'y') + "\n[rank 0] next\n");
  lines = relay.Poll();
  ASSERT_EQ(lines.size(), 2u) << "the rest of rank 0's line, not rank 1's, then rank 0's next";
  EXPECT_EQ(lines[0].substr(lines[0].size() - 4), "tail");
  EXPECT_EQ(lines[1], "[rank 0] next");
}

TEST(ConsoleRelay, ConsoleFlagNamesWhatItTakes) {
  EXPECT_EQ(*ParseConsoleRanks("rank0"), ConsoleRanks::kRankZero);
  StatusOr<ConsoleRanks> bad = ParseConsoleRanks("some");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--console"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::cli
