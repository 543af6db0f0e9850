// LeaderElector against a real kube-apiserver: one leader among candidates, a released lease
// is taken over without waiting it out, a leader whose lease is taken stops leading, and the
// Lease it writes passes the server's validation with the fields client-go writes.
#include "operator/controller/leader_election.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <regex>
#include <set>
#include <string>

#include "tests/operator/kube/kube_server.h"

namespace lockstep::op::controller {
namespace {

using lockstep::testing::KubeTestEnv;
using op::testing::KubeServer;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

LeaderElectionOptions Options(const std::string& ns, const std::string& identity,
                              int64_t lease_duration_ms = 3000) {
  LeaderElectionOptions options;
  options.lease_namespace = ns;
  options.lease_name = "lockstep-operator";
  options.identity = identity;
  options.lease_duration_ms = lease_duration_ms;
  options.renew_deadline_ms = lease_duration_ms * 2 / 3;
  options.retry_period_ms = 200;
  return options;
}

struct Callbacks {
  std::atomic<int> started{0};
  std::atomic<int> stopped{0};
  std::function<void()> on_started() {
    return [this] { ++started; };
  }
  std::function<void()> on_stopped() {
    return [this] { ++stopped; };
  }
};

TEST(LeaderElectionTest, ExactlyOneOfTwoCandidatesLeadsAndTheLeaseIsValid) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("election");
  Callbacks one_calls, two_calls;
  LeaderElector one(client.get(), Options(ns, "replica-one"));
  LeaderElector two(client.get(), Options(ns, "replica-two"));
  one.Run(one_calls.on_started(), one_calls.on_stopped());
  two.Run(two_calls.on_started(), two_calls.on_stopped());
  ASSERT_TRUE(KubeTestEnv::WaitFor([&] { return one.IsLeader() || two.IsLeader(); }, 10000));
  // Three renew rounds, counted by the lease's renewTime (the leader writes it each round):
  // leadership never doubles and never changes hands meanwhile. The 30 s only bounds a leader
  // that stopped renewing.
  const bool one_leads = one.IsLeader();
  std::set<std::string> renew_times;
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  while (renew_times.size() < 4 && Clock::now() < give_up) {
    ASSERT_NE(one.IsLeader(), two.IsLeader());
    ASSERT_EQ(one.IsLeader(), one_leads);
    if (StatusOr<json> seen = client->Get(kube::resources::kLeases, ns, "lockstep-operator");
        seen.ok()) {
      renew_times.insert((*seen)["spec"].value("renewTime", ""));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(renew_times.size(), 4u) << "the leader renewed its lease three times";
  EXPECT_EQ(one_calls.started + two_calls.started, 1);

  StatusOr<json> lease = client->Get(kube::resources::kLeases, ns, "lockstep-operator");
  ASSERT_TRUE(lease.ok()) << lease.status();
  const json& spec = (*lease)["spec"];
  EXPECT_EQ(spec["holderIdentity"], one_leads ? "replica-one" : "replica-two");
  EXPECT_EQ(spec["leaseDurationSeconds"], 3);
  const std::regex micro_time(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)");
  EXPECT_TRUE(std::regex_match(spec["renewTime"].get<std::string>(), micro_time)) << spec;
  EXPECT_TRUE(std::regex_match(spec["acquireTime"].get<std::string>(), micro_time)) << spec;
  EXPECT_TRUE(spec["leaseTransitions"].is_number_integer()) << spec;
  // The leader keeps renewing.
  const std::string renewed = spec["renewTime"];
  ASSERT_TRUE(KubeTestEnv::WaitFor(
      [&] {
        auto again = client->Get(kube::resources::kLeases, ns, "lockstep-operator");
        return again.ok() && (*again)["spec"]["renewTime"] != renewed;
      },
      5000));
  one.Stop();
  two.Stop();
}

TEST(LeaderElectionTest, StoppedLeaderReleasesAndTheStandbyTakesOverQuickly) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("release");
  // A long lease: a takeover in far less than 20 s can only come from the release.
  Callbacks first_calls, standby_calls;
  auto first = std::make_unique<LeaderElector>(client.get(), Options(ns, "first", 20000));
  first->Run(first_calls.on_started(), first_calls.on_stopped());
  ASSERT_TRUE(KubeTestEnv::WaitFor([&] { return first->IsLeader(); }, 10000));
  LeaderElector standby(client.get(), Options(ns, "standby", 20000));
  standby.Run(standby_calls.on_started(), standby_calls.on_stopped());
  // The standby has read the held lease, and left it to its holder.
  ASSERT_TRUE(KubeTestEnv::WaitFor([&] { return standby.ObservedLeader() == "first"; }, 10000));
  ASSERT_FALSE(standby.IsLeader());

  const auto stopped_at = Clock::now();
  first->Stop();
  EXPECT_FALSE(first->IsLeader());
  EXPECT_EQ(first_calls.stopped, 1);
  ASSERT_TRUE(KubeTestEnv::WaitFor([&] { return standby.IsLeader(); }, 10000));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - stopped_at).count(), 5.0);
  EXPECT_EQ(standby_calls.started, 1);

  StatusOr<json> lease = client->Get(kube::resources::kLeases, ns, "lockstep-operator");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ((*lease)["spec"]["holderIdentity"], "standby");
  EXPECT_GE((*lease)["spec"]["leaseTransitions"].get<int>(), 1);
  standby.Stop();
}

TEST(LeaderElectionTest, LeaderWhoseLeaseIsTakenStopsLeading) {
  LOCKSTEP_REQUIRE_KUBE();
  auto client = KubeServer::AdminClient();
  const std::string ns = KubeServer::NewNamespace("taken");
  Callbacks calls;
  LeaderElector elector(client.get(), Options(ns, "victim", 20000));
  elector.Run(calls.on_started(), calls.on_stopped());
  ASSERT_TRUE(KubeTestEnv::WaitFor([&] { return elector.IsLeader(); }, 10000));

  // A third party (another operator build, an admin) writes itself in as the holder.
  Status taken = kube::RetryOnConflict([&]() -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(json lease,
                              client->Get(kube::resources::kLeases, ns, "lockstep-operator"));
    lease["spec"]["holderIdentity"] = "intruder";
    return client->Update(kube::resources::kLeases, ns, lease).status();
  });
  ASSERT_TRUE(taken.ok()) << taken;
  ASSERT_TRUE(KubeTestEnv::WaitFor([&] { return calls.stopped.load() == 1; }, 5000));
  EXPECT_FALSE(elector.IsLeader());
  elector.Stop();
  EXPECT_EQ(calls.stopped, 1);  // no second call: it was no longer leading
  StatusOr<json> lease = client->Get(kube::resources::kLeases, ns, "lockstep-operator");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ((*lease)["spec"]["holderIdentity"], "intruder");  // not "released" by the loser
}

}  // namespace
}  // namespace lockstep::op::controller
