// `lockstep-worker ps` as a process (worker/ps/ps_command.h): it serves its table to a client
// over gRPC until SIGTERM, then exits 0; bad arguments exit 2 naming what is wrong.
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>
#include <string>
#include <vector>

#include "tests/support/process/process.h"
#include "worker/ps/ps_client.h"
#include "worker/ps/shard_table.h"

namespace lockstep::ps {
namespace {

using testing::ChildProcess;
using testing::PollUntil;
using testing::RunProcess;

TEST(ParameterServerProcessTest, ServesItsTableUntilSigtermAndThenExitsZero) {
  ChildProcess server({LOCKSTEP_WORKER_BINARY, "ps", "--job", "default/ctr", "--shard", "0",
                       "--shards", "1", "--listen", "127.0.0.1:0", "--table", "emb:1000:4:0.5:7"},
                      {{"LOCKSTEP_PS_TOKEN", "process-token"}});
  int port = 0;
  ASSERT_TRUE(PollUntil(
      [&] {
        std::smatch match;
        const std::string out = server.StdoutSoFar();
        if (!std::regex_search(out, match, std::regex("listening on port ([0-9]+)"))) return false;
        port = std::stoi(match[1]);
        return true;
      },
      30000, 20))
      << server.StdoutSoFar();
  EXPECT_NE(server.StdoutSoFar().find("parameter server 0 of 1 of job default/ctr"),
            std::string::npos);

  PsClientOptions options;
  options.servers = {"127.0.0.1:" + std::to_string(port)};
  options.job = "default/ctr";
  options.token = "process-token";
  auto client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  TableSpec spec;
  spec.name = "emb";
  spec.rows = 1000;
  spec.dim = 4;
  spec.learning_rate = 0.5f;
  spec.seed = 7;
  std::vector<float> rows(8);
  ASSERT_TRUE((*client)->Pull("emb", 4, {3, 999}, rows.data()).ok());
  EXPECT_EQ(rows[0], InitialValue(spec, 3, 0));
  EXPECT_EQ(rows[7], InitialValue(spec, 999, 3));
  const std::vector<float> gradient(4, 2.0f);
  ASSERT_TRUE((*client)->Push("emb", 4, {3}, gradient.data(), PushKind::kGradient).ok());
  std::vector<float> after(4);
  ASSERT_TRUE((*client)->Pull("emb", 4, {3}, after.data()).ok());
  EXPECT_EQ(after[0], rows[0] - 0.5f * 2.0f);

  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  const testing::ProcessResult result = server.Wait(15000);
  EXPECT_EQ(result.code(), 0) << result.out;
  EXPECT_NE(result.out.find("stopping (signal 15): 2 pulls, 1 pushes, 0 refused"),
            std::string::npos)
      << result.out;
}

TEST(ParameterServerProcessTest, BadArgumentsExit2NamingWhatIsWrong) {
  const std::vector<std::string> base = {LOCKSTEP_WORKER_BINARY, "ps", "--job", "default/ctr"};
  auto run = [&](std::vector<std::string> extra, testing::Environment env) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunProcess(argv, env, 30000);
  };
  const testing::Environment token = {{"LOCKSTEP_PS_TOKEN", "t"}};
  testing::ProcessResult result = run({"--table", "emb:ten:4"}, token);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--table: rows \"ten\" is not a number"), std::string::npos)
      << result.err;
  result = run({"--table", "emb:10:4"}, {{"LOCKSTEP_PS_TOKEN", ""}, {"LOCKSTEP_JOB_TOKEN", ""}});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("LOCKSTEP_PS_TOKEN is not set"), std::string::npos) << result.err;
  result = run({"--table", "emb:10:4", "--shard", "2", "--shards", "2", "--listen", "127.0.0.1:0"},
               token);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("shard 2 of 2 does not exist"), std::string::npos) << result.err;
  result = run({"--bogus", "1"}, token);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("not expected: "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("--bogus"), std::string::npos) << result.err;
  result = run({"--shard", "first", "--table", "emb:10:4"}, token);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--shard: \"first\" is not a whole number"), std::string::npos)
      << result.err;
  result = run({"--listen"}, token);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--listen"), std::string::npos) << result.err;
}

}  // namespace
}  // namespace lockstep::ps
