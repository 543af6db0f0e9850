// The path bench/rendezvous/scale_bench measures, kept correct in CI (not timed): a job of 300
// and of 1,024 simulated members (real gRPC clients, a connection each) against the real service
// forms, loses a member, re-forms without it and leaves cleanly; its ranks bootstrap Gloo's full
// mesh through the store and each gets exactly its peers' addresses.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "bench/rendezvous/gloo_store_calls.h"
#include "bench/rendezvous/simulated_members.h"
#include "common/rendezvous/client.h"
#include "common/rendezvous/server.h"

namespace lockstep::rendezvous::load {
namespace {

constexpr char kJob[] = "default/many";
constexpr char kToken[] = "many-token";
constexpr int kMembers = 300;
constexpr int64_t kBoundMs = 60000;  // generous: CI machines are slow; nothing here is timed

class ScaleTest : public ::testing::Test {
 protected:
  // Starts the service with one job of `size` members.
  void StartJob(int size) {
    // Every member is a connection with a socket at each end, both in this process.
    rlimit files{};
    getrlimit(RLIMIT_NOFILE, &files);
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
    auto server = RendezvousServer::Start({});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    JobConfig job;
    job.job = kJob;
    job.token = kToken;
    job.min_members = size / 2;
    job.max_members = size;
    job.initial_members = size;
    job.heartbeat_interval_ms = 200;
    job.heartbeat_timeout_ms = 20000;
    ASSERT_TRUE(server_->AddJob(job).ok());
  }

  std::string Address() const { return "127.0.0.1:" + std::to_string(server_->port()); }

  // Every listed member holds `generation`, a world of ids.size() and a distinct rank.
  static void ExpectOneGeneration(const SimulatedMembers& members, const std::vector<int>& ids,
                                  int64_t generation) {
    std::set<int32_t> ranks;
    for (int id : ids) {
      const MemberView view = members.View(id);
      EXPECT_EQ(view.generation, generation) << id;
      EXPECT_EQ(view.world_size, static_cast<int32_t>(ids.size())) << id;
      ranks.insert(view.rank);
    }
    ASSERT_EQ(ranks.size(), ids.size());
    EXPECT_EQ(*ranks.begin(), 0);
    EXPECT_EQ(*ranks.rbegin(), static_cast<int32_t>(ids.size()) - 1);
  }

  // A job of `size` members forms, loses one (killed once it beat, so its stream is open),
  // re-forms without it and leaves cleanly.
  void FormLoseOneReformAndLeave(int size) {
    StartJob(size);
    if (HasFatalFailure()) return;
    SimulatedMembers members({.address = Address()});
    const std::vector<int> ids = members.Add(kJob, kToken, size);
    members.Join(ids, /*state_step=*/-1);
    ASSERT_TRUE(members.AwaitGeneration(ids, 0, kBoundMs)) << "the first generation never formed";
    const int64_t first = members.View(ids[0]).generation;
    ExpectOneGeneration(members, ids, first);

    const int victim = ids[size / 3];
    std::vector<int> survivors = ids;
    survivors.erase(std::find(survivors.begin(), survivors.end(), victim));
    ASSERT_TRUE(members.AwaitBeats(victim, 2, kBoundMs));
    members.Kill(victim);
    ASSERT_TRUE(members.AwaitGeneration(survivors, first, kBoundMs))
        << "the survivors never re-formed";
    const int64_t second = members.View(survivors[0]).generation;
    ExpectOneGeneration(members, survivors, second);
    EXPECT_EQ(members.View(victim).generation, first);
    for (int id : survivors) EXPECT_EQ(members.View(id).generations_ended, 1) << id;

    ASSERT_TRUE(members.Leave(survivors, /*completed=*/true, kBoundMs));
    EXPECT_TRUE(members.Errors(ids).empty()) << members.Errors(ids).front();
    auto snapshot = server_->Snapshot(kJob);
    ASSERT_TRUE(snapshot.ok());
    EXPECT_EQ(snapshot->completed_members, size - 1);
    EXPECT_EQ(snapshot->generation, second);
    EXPECT_TRUE(snapshot->waiting_members.empty());
  }

  std::unique_ptr<RendezvousServer> server_;
};

TEST_F(ScaleTest, HundredsOfMembersFormLoseOneReformWithoutItAndLeaveCleanly) {
  FormLoseOneReformAndLeave(kMembers);
}

TEST_F(ScaleTest, AThousandMembersFormLoseOneReformWithoutItAndLeaveCleanly) {
  FormLoseOneReformAndLeave(1024);
}


TEST_F(ScaleTest, EveryRankOfAGlooBootstrapThroughTheServiceGetsExactlyItsPeersAddresses) {
  constexpr int kRanks = 64;
  StartJob(kMembers);
  if (HasFatalFailure()) return;
  SimulatedMembers members({.address = Address()});
  const std::vector<int> ids = members.Add(kJob, kToken, kMembers);
  members.Join(ids, -1);
  ASSERT_TRUE(members.AwaitGeneration(ids, 0, kBoundMs));
  const int64_t generation = members.View(ids[0]).generation;
  std::vector<Status> results(kRanks);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      ClientOptions options;
      options.address = Address();
      options.job = kJob;
      options.token = kToken;
      options.member_id = "gloo-" + std::to_string(rank);
      auto client = RendezvousClient::Connect(options);
      results[rank] = client.ok() ? GlooBootstrapStoreCalls(*(*client)->GenerationStore(generation),
                                                            rank, kRanks, kBoundMs)
                                  : client.status();
    });
  }
  for (auto& rank : ranks) rank.join();
  for (int rank = 0; rank < kRanks; ++rank) EXPECT_TRUE(results[rank].ok()) << results[rank];
  EXPECT_TRUE(members.Leave(ids, true, kBoundMs));
}

}  // namespace
}  // namespace lockstep::rendezvous::load
