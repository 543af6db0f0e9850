// lockstep-operator's flags as a chart or a user writes them: every flag the chart's deployment
// passes, the forms a boolean takes, the defaults the pod's environment gives, and a bad or
// unknown flag refused naming the flag and the value.
#include "operator/operator_flags.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "operator/trainingjob/reconciler.h"

namespace lockstep::op {
namespace {

StatusOr<OperatorCommandLine> Parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv = {"lockstep-operator"};
  argv.insert(argv.end(), args.begin(), args.end());
  return ParseOperatorFlags(static_cast<int>(argv.size()), argv.data());
}

Flags ParseOk(std::initializer_list<const char*> args) {
  StatusOr<OperatorCommandLine> line = Parse(args);
  EXPECT_TRUE(line.ok()) << line.status();
  return line.ok() ? line->flags : Flags{};
}

std::string Refusal(std::initializer_list<const char*> args) {
  StatusOr<OperatorCommandLine> line = Parse(args);
  EXPECT_FALSE(line.ok());
  if (line.ok()) return "";
  EXPECT_EQ(line.status().code(), StatusCode::kInvalidArgument);
  return line.status().message();
}

class OperatorFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("POD_NAMESPACE");
    unsetenv("POD_NAME");
  }
};

TEST_F(OperatorFlagsTest, WithoutFlagsEveryDefaultHolds) {
  const Flags flags = ParseOk({});
  EXPECT_TRUE(flags.kubeconfig.empty());
  EXPECT_TRUE(flags.leader_elect);
  EXPECT_EQ(flags.leader_election_namespace, "default");
  EXPECT_EQ(flags.leader_election_id, "lockstep-operator");
  EXPECT_FALSE(flags.identity.empty());  // the host name and pid
  EXPECT_EQ(flags.metrics_port, 8080);
  EXPECT_EQ(flags.rendezvous_port, 7443);
  EXPECT_FALSE(flags.rendezvous_insecure);
  EXPECT_EQ(flags.webhook_port, 0);
  EXPECT_EQ(flags.webhook_service, "lockstep-webhook");
  EXPECT_EQ(flags.webhook_ca_check_ms, 10000);
  EXPECT_EQ(flags.operator_secret, "lockstep-operator");
  EXPECT_EQ(flags.workers, 4);
  EXPECT_EQ(flags.qps, 50);
  EXPECT_EQ(flags.burst, 100);
  EXPECT_EQ(flags.node_loss_toleration_seconds, 30);
  EXPECT_EQ(flags.heartbeat_timeout_ms, 10000);
  EXPECT_EQ(flags.topology_keys, trainingjob::DefaultTopologyKeys());
}

TEST_F(OperatorFlagsTest, ThePodsEnvironmentNamesTheLeaseNamespaceAndTheIdentity) {
  setenv("POD_NAMESPACE", "lockstep-system", 1);
  setenv("POD_NAME", "lockstep-operator-7d9f-abcde", 1);
  Flags flags = ParseOk({});
  EXPECT_EQ(flags.leader_election_namespace, "lockstep-system");
  EXPECT_EQ(flags.identity, "lockstep-operator-7d9f-abcde");
  // A flag wins over the environment.
  flags = ParseOk({"--leader-election-namespace", "ops", "--identity=replica-1"});
  EXPECT_EQ(flags.leader_election_namespace, "ops");
  EXPECT_EQ(flags.identity, "replica-1");
}

// The flags charts/lockstep/templates/deployment.yaml passes, in its `--name=value` form.
TEST_F(OperatorFlagsTest, TheChartsFlagsAreRead) {
  const Flags flags = ParseOk(
      {"--leader-elect=true", "--metrics-port=8080", "--rendezvous-port=7443",
       "--rendezvous-service=lockstep-rendezvous", "--webhook-port=9443",
       "--webhook-service=lockstep-webhook",
       "--webhook-configuration=lockstep-trainingjob-validation",
       "--worker-image=registry.example/lockstep-worker:0.1",
       "--agent-image=registry.example/lockstep-agent:0.1", "--workers=8", "--qps=100",
       "--burst=200", "--node-loss-toleration-seconds=-1",
       "--topology-keys=topology.kubernetes.io/zone,example.com/rack", "--watch-namespace=team-a",
       "--rendezvous-heartbeat-timeout-ms=20000", "--progress-interval-ms=5000", "--io-threads=2"});
  EXPECT_TRUE(flags.leader_elect);
  EXPECT_EQ(flags.rendezvous_service, "lockstep-rendezvous");
  EXPECT_EQ(flags.webhook_port, 9443);
  EXPECT_EQ(flags.webhook_configuration, "lockstep-trainingjob-validation");
  EXPECT_EQ(flags.worker_image, "registry.example/lockstep-worker:0.1");
  EXPECT_EQ(flags.agent_image, "registry.example/lockstep-agent:0.1");
  EXPECT_EQ(flags.workers, 8);
  EXPECT_EQ(flags.qps, 100);
  EXPECT_EQ(flags.burst, 200);
  EXPECT_EQ(flags.node_loss_toleration_seconds, -1);
  EXPECT_EQ(flags.topology_keys,
            (std::vector<std::string>{"topology.kubernetes.io/zone", "example.com/rack"}));
  EXPECT_EQ(flags.watch_namespace, "team-a");
  EXPECT_EQ(flags.heartbeat_timeout_ms, 20000);
  EXPECT_EQ(flags.progress_interval_ms, 5000);
  EXPECT_EQ(flags.io_threads, 2);
}

TEST_F(OperatorFlagsTest, ABooleanFlagIsSetAloneOrByTrueOrFalse) {
  EXPECT_FALSE(ParseOk({"--leader-elect=false"}).leader_elect);
  EXPECT_TRUE(ParseOk({"--leader-elect"}).leader_elect);
  EXPECT_TRUE(ParseOk({"--rendezvous-insecure"}).rendezvous_insecure);
  EXPECT_FALSE(ParseOk({"--rendezvous-insecure=false"}).rendezvous_insecure);
  const std::string refused = Refusal({"--leader-elect=maybe"});
  EXPECT_NE(refused.find("--leader-elect"), std::string::npos) << refused;
  EXPECT_NE(refused.find("maybe"), std::string::npos) << refused;
  // A boolean never takes the next argument as its value.
  EXPECT_NE(Refusal({"--leader-elect", "false"}).find("false"), std::string::npos);
}

TEST_F(OperatorFlagsTest, AnEmptyTopologyKeyListNumbersPodsAsTheyJoin) {
  EXPECT_TRUE(ParseOk({"--topology-keys="}).topology_keys.empty());
  EXPECT_TRUE(ParseOk({"--topology-keys", ""}).topology_keys.empty());
  const std::string refused = Refusal({"--topology-keys=a,,b"});
  EXPECT_NE(refused.find("--topology-keys: an empty key in \"a,,b\""), std::string::npos)
      << refused;
}

// "--name=" is an empty value, never "take the next argument": the chart may render one.
TEST_F(OperatorFlagsTest, AnEmptyValueIsEmptyAndNeverTakesTheNextArgument) {
  setenv("POD_NAME", "from-the-pod", 1);
  const Flags flags = ParseOk(
      {"--identity=", "--leader-elect=false", "--gang-scheduler-name-volcano=", "--workers=2"});
  EXPECT_EQ(flags.identity, "from-the-pod");  // empty: the default
  EXPECT_FALSE(flags.leader_elect);
  EXPECT_EQ(flags.volcano_scheduler, "");
  EXPECT_EQ(flags.workers, 2);
  const std::string refused = Refusal({"--metrics-port=", "--workers=2"});
  EXPECT_NE(refused.find("--metrics-port"), std::string::npos) << refused;
}

TEST_F(OperatorFlagsTest, NumbersAreDecimalAndBooleansAreTrueOrFalse) {
  EXPECT_EQ(ParseOk({"--metrics-port=010"}).metrics_port, 10);
  EXPECT_EQ(ParseOk({"--metrics-port=08080"}).metrics_port, 8080);
  for (const char* arg : {"--metrics-port=0x1F90", "--workers=+", "--qps=1e2"}) {
    const std::string refused = Refusal({arg});
    EXPECT_NE(refused.find("is not a whole number"), std::string::npos) << arg << ": " << refused;
  }
  for (const char* arg : {"--leader-elect=yes", "--leader-elect=1", "--rendezvous-insecure=on"}) {
    const std::string refused = Refusal({arg});
    EXPECT_NE(refused.find("expected true or false"), std::string::npos) << arg << ": " << refused;
  }
}

TEST_F(OperatorFlagsTest, AFlagGivenTwiceKeepsItsLastValue) {
  EXPECT_EQ(ParseOk({"--workers=2", "--workers", "6"}).workers, 6);
}

TEST_F(OperatorFlagsTest, ABadValueIsRefusedNamingTheFlagAndTheValue) {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--metrics-port", "70000"},
           {"--rendezvous-port", "-1"},
           {"--webhook-port", "https"},
           {"--workers", "0"},
           {"--io-threads", "257"},
           {"--qps", "2.5"},
           {"--burst", "0"},
           {"--webhook-ca-check-ms", "99"},
           {"--progress-interval-ms", "3600001"},
           {"--node-loss-toleration-seconds", "-2"},
           {"--rendezvous-heartbeat-timeout-ms", "499"}}) {
    const std::string arg = flag + "=" + value;
    const std::string refused = Refusal({arg.c_str()});
    EXPECT_NE(refused.find(flag), std::string::npos) << arg << ": " << refused;
    EXPECT_NE(refused.find(value), std::string::npos) << arg << ": " << refused;
  }
}

TEST_F(OperatorFlagsTest, AMissingValueOrAnUnknownFlagIsRefusedByName) {
  EXPECT_NE(Refusal({"--kubeconfig"}).find("--kubeconfig"), std::string::npos);
  EXPECT_NE(Refusal({"--rendezvous-portt=7443"}).find("--rendezvous-portt"), std::string::npos);
  EXPECT_NE(Refusal({"stray"}).find("stray"), std::string::npos);
}

TEST_F(OperatorFlagsTest, HelpListsEveryFlagWithItsDefault) {
  StatusOr<OperatorCommandLine> line = Parse({"--help"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_TRUE(line->help);
  for (const char* flag : {"--kubeconfig",
                           "--watch-namespace",
                           "--leader-elect",
                           "--leader-election-namespace",
                           "--leader-election-id",
                           "--identity",
                           "--metrics-port",
                           "--metrics-host",
                           "--rendezvous-port",
                           "--rendezvous-host",
                           "--rendezvous-address",
                           "--rendezvous-service",
                           "--rendezvous-insecure",
                           "--rendezvous-heartbeat-timeout-ms",
                           "--webhook-port",
                           "--webhook-host",
                           "--webhook-service",
                           "--webhook-configuration",
                           "--webhook-ca-check-ms",
                           "--operator-secret",
                           "--worker-image",
                           "--agent-image",
                           "--workers",
                           "--io-threads",
                           "--qps",
                           "--burst",
                           "--gang-scheduler-name-volcano",
                           "--gang-scheduler-name-scheduler-plugins",
                           "--progress-interval-ms",
                           "--node-loss-toleration-seconds",
                           "--topology-keys"}) {
    EXPECT_NE(line->usage.find(flag), std::string::npos) << flag << "\n" << line->usage;
  }
  EXPECT_NE(line->usage.find("=7443"), std::string::npos) << line->usage;
  EXPECT_TRUE(Parse({"-h"})->help);
}

TEST_F(OperatorFlagsTest, HelpIsShownWhateverElseTheLineHolds) {
  // CLI11 alone checked the other values first and refused the line.
  StatusOr<OperatorCommandLine> line = Parse({"--metrics-port=70000", "--help"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_TRUE(line->help);
  EXPECT_NE(line->usage.find("--metrics-port"), std::string::npos) << line->usage;
  EXPECT_TRUE(Parse({"-h", "--qps=-1", "--no-such-flag"})->help);
}

}  // namespace
}  // namespace lockstep::op
