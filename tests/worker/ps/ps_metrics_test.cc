// A parameter server's Prometheus metrics (worker/ps/ps_metrics.h) follow what it served.
#include "worker/ps/ps_metrics.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "worker/ps/ps_client.h"

namespace lockstep::ps {
namespace {

// The value of the sample `name{...labels...}` whose labels contain `has`; -1 when absent.
double Sample(const std::string& text, const std::string& name, const std::string& has) {
  std::regex line("^" + name + "\\{([^}]*)\\} (\\S+)$", std::regex::multiline);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator();
       ++it) {
    if ((*it)[1].str().find(has) != std::string::npos) return std::stod((*it)[2].str());
  }
  return -1;
}

TEST(PsMetricsTest, CountRequestsRowsBytesAndTheWorkersStaleness) {
  ShardServerOptions options;
  options.job = "default/ctr";
  options.token = "t";
  options.workers = 2;
  options.tables = {{.name = "emb", .rows = 100, .dim = 4}};
  auto server = ShardServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto metrics = PsMetrics::Create("default/ctr", 0, 0, **server);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  PsClientOptions client_options;
  client_options.servers = {"127.0.0.1:" + std::to_string((*server)->port())};
  client_options.job = "default/ctr";
  client_options.token = "t";
  auto client = PsClient::Connect(client_options);
  ASSERT_TRUE(client.ok());
  std::vector<float> values(3 * 4, 0.5f);
  ASSERT_TRUE((*client)->Pull("emb", 4, {1, 2, 3}, values.data()).ok());
  ASSERT_TRUE((*client)->Push("emb", 4, {1, 2, 3}, values.data(), PushKind::kGradient).ok());
  ClockOptions clock;
  clock.workers = 2;
  clock.clock = 5;
  ASSERT_TRUE((*client)->Clock(clock).ok());

  const std::string text = (*metrics)->Text();
  EXPECT_EQ(Sample(text, "lockstep_ps_requests_total", "kind=\"pull\""), 1) << text;
  EXPECT_EQ(Sample(text, "lockstep_ps_requests_total", "kind=\"push\""), 1);
  EXPECT_EQ(Sample(text, "lockstep_ps_requests_total", "kind=\"clock\""), 1);
  EXPECT_EQ(Sample(text, "lockstep_ps_rows_total", "direction=\"pulled\""), 3);
  EXPECT_EQ(Sample(text, "lockstep_ps_rows_total", "direction=\"pushed\""), 3);
  // A pull's answer carries 3 rows of 4 floats.
  EXPECT_GT(Sample(text, "lockstep_ps_bytes_total", "direction=\"sent\""), 48);
  EXPECT_GT(Sample(text, "lockstep_ps_bytes_total", "direction=\"received\""), 48);
  // Worker 0 is at step 5, worker 1 at 0.
  EXPECT_EQ(Sample(text, "lockstep_ps_staleness_steps", "shard=\"0\""), 5);
  EXPECT_EQ(Sample(text, "lockstep_ps_min_clock", "job=\"default/ctr\""), 0);
  EXPECT_EQ(Sample(text, "lockstep_ps_restored_step", "shard=\"0\""), -1);
  // Counters only move forward, by what was served since the last scrape.
  ASSERT_TRUE((*client)->Pull("emb", 4, {1}, values.data()).ok());
  EXPECT_EQ(Sample((*metrics)->Text(), "lockstep_ps_requests_total", "kind=\"pull\""), 2);
}

}  // namespace
}  // namespace lockstep::ps
