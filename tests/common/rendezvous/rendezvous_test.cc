// The rendezvous service end to end: a real server on 127.0.0.1:0, real clients, one thread per
// member. Heartbeat and last-call settings are short so the suite stays within seconds.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/rendezvous/client.h"
#include "common/rendezvous/kv_store.h"
#include "common/rendezvous/server.h"
#include "proto/rendezvous.grpc.pb.h"

namespace lockstep::rendezvous {
namespace {

constexpr char kJob[] = "default/fashion";
constexpr char kToken[] = "s3cret-token-value";
constexpr int64_t kJoinTimeoutMs = 5000;
constexpr int64_t kHeartbeatIntervalMs = 50;
constexpr int64_t kHeartbeatTimeoutMs = 400;
constexpr int64_t kBoundedWaitMs = 3000;  // for things that should happen "at once"

// Polls `condition` until it holds or timeout_ms passes: for state that only Snapshot shows.
bool WaitUntil(const std::function<bool()>& condition, int64_t timeout_ms = kBoundedWaitMs) {
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  while (!condition()) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Records on_generation_ended calls.
class EndWatcher {
 public:
  std::function<void(const GenerationEnd&)> Callback() {
    return [this](const GenerationEnd& end) {
      std::lock_guard<std::mutex> lock(mu_);
      reasons_.push_back(end.reason);
      member_lost_.push_back(end.member_lost);
      cv_.notify_all();
    };
  }
  // True once the generation was reported ended; waits up to timeout_ms.
  bool WaitEnded(int64_t timeout_ms = kBoundedWaitMs) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                        [this] { return !reasons_.empty(); });
  }
  std::vector<std::string> reasons() {
    std::lock_guard<std::mutex> lock(mu_);
    return reasons_;
  }
  std::vector<bool> member_lost() {
    std::lock_guard<std::mutex> lock(mu_);
    return member_lost_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> reasons_;
  std::vector<bool> member_lost_;
};

class RendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = RendezvousServer::Start(ServerOptions{});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(1000);
  }

  static JobConfig Config(int32_t min_members, int32_t max_members, const std::string& job = kJob) {
    JobConfig config;
    config.job = job;
    config.token = kToken;
    config.min_members = min_members;
    config.max_members = max_members;
    config.last_call_ms = 200;
    config.heartbeat_interval_ms = kHeartbeatIntervalMs;
    config.heartbeat_timeout_ms = kHeartbeatTimeoutMs;
    return config;
  }

  std::string Address() const { return "127.0.0.1:" + std::to_string(server_->port()); }
  // A stub of the service's own, for calls the client never makes as a test needs them.
  std::unique_ptr<v1::Rendezvous::Stub> RawStub() const {
    return v1::Rendezvous::NewStub(
        grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials()));
  }

  std::unique_ptr<RendezvousClient> NewClient(const std::string& member_id,
                                              const std::string& job = kJob,
                                              const std::string& token = kToken) {
    ClientOptions options;
    options.address = Address();
    options.job = job;
    options.token = token;
    options.member_id = member_id;
    options.rpc_timeout_ms = 2000;
    auto client = RendezvousClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // Every client joins on its own thread; results in the clients' order.
  static std::vector<StatusOr<Assignment>> JoinAll(const std::vector<RendezvousClient*>& clients,
                                                   int64_t timeout_ms = kJoinTimeoutMs) {
    std::vector<std::future<StatusOr<Assignment>>> futures;
    for (RendezvousClient* client : clients) {
      futures.push_back(std::async(std::launch::async, [client, timeout_ms] {
        return client->Join(/*state_step=*/-1, timeout_ms);
      }));
    }
    std::vector<StatusOr<Assignment>> results;
    for (auto& future : futures) results.push_back(future.get());
    return results;
  }

  // The service shut down and a successor started on its address, as an operator's new leader
  // behind the Service: no job is registered with it yet.
  void RestartServerOnTheSameAddress() {
    const int port = server_->port();
    server_->Shutdown(1000);
    ServerOptions options;
    options.listen_address = "127.0.0.1:" + std::to_string(port);
    auto successor = RendezvousServer::Start(options);
    ASSERT_TRUE(successor.ok()) << successor.status();
    server_ = std::move(*successor);
  }

  JobSnapshot Snap(const std::string& job = kJob) {
    auto snapshot = server_->Snapshot(job);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    return snapshot.ok() ? *snapshot : JobSnapshot{};
  }

  std::unique_ptr<RendezvousServer> server_;
};

TEST_F(RendezvousTest, MembersFormFirstGenerationWithRanksZeroToN) {
  constexpr int kMembers = 4;
  ASSERT_TRUE(server_->AddJob(Config(kMembers, kMembers)).ok());
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  std::vector<RendezvousClient*> raw;
  for (int i = 0; i < kMembers; ++i) {
    clients.push_back(NewClient("w-" + std::to_string(i)));
    raw.push_back(clients.back().get());
  }
  auto results = JoinAll(raw);
  const JobSnapshot formed = Snap();
  ASSERT_EQ(formed.members.size(), static_cast<size_t>(kMembers));
  std::set<int32_t> ranks;
  for (int i = 0; i < kMembers; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    const Assignment& a = *results[i];
    EXPECT_EQ(a.generation, 1);
    EXPECT_EQ(a.world_size, kMembers);
    EXPECT_EQ(a.heartbeat_interval_ms, kHeartbeatIntervalMs);
    EXPECT_EQ(formed.members[a.rank].member_id, "w-" + std::to_string(i));
    // Every member joined from 127.0.0.1: one host, local ranks are ranks.
    EXPECT_EQ(a.first_host, "127.0.0.1");
    EXPECT_EQ(a.host.host_count, 1);
    EXPECT_EQ(a.host.local_rank, a.rank);
    EXPECT_EQ(a.host.local_size, kMembers);
    ranks.insert(a.rank);
  }
  EXPECT_EQ(ranks, (std::set<int32_t>{0, 1, 2, 3}));
  JobSnapshot snapshot = Snap();
  EXPECT_EQ(snapshot.generation, 1);
  EXPECT_TRUE(snapshot.generation_active);
  ASSERT_EQ(snapshot.history.size(), 1u);
  EXPECT_LT(snapshot.history[0].ended_at, 0);
}

// A worker of an older version (no without_members) still gets every member's record; a current
// one gets its own fields only, so the answers of a formation grow with the job, not its square.
TEST_F(RendezvousTest, OnlyAClientThatDoesNotGoWithoutTheMemberListGetsIt) {
  ASSERT_TRUE(server_->AddJob(Config(2, 2)).ok());
  auto stub = RawStub();
  auto join = [&](const std::string& member, const std::string& host, bool without_members) {
    return std::async(std::launch::async, [&stub, member, host, without_members] {
      grpc::ClientContext context;
      context.AddMetadata("x-lockstep-token", kToken);
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(kJoinTimeoutMs));
      v1::JoinRequest request;
      request.set_job(kJob);
      request.set_member_id(member);
      request.set_host(host);
      request.set_state_step(-1);
      request.set_timeout_ms(kJoinTimeoutMs);
      request.set_without_members(without_members);
      v1::JoinResponse response;
      const grpc::Status status = stub->Join(&context, request, &response);
      EXPECT_TRUE(status.ok()) << status.error_message();
      return response;
    });
  };
  auto older = join("w-old", "10.0.0.1", /*without_members=*/false);
  auto current = join("w-new", "10.0.0.2", /*without_members=*/true);
  const v1::JoinResponse old_answer = older.get();
  const v1::JoinResponse new_answer = current.get();
  ASSERT_EQ(old_answer.members_size(), 2);
  EXPECT_EQ(old_answer.members(old_answer.rank()).member_id(), "w-old");
  EXPECT_EQ(old_answer.members(new_answer.rank()).host(), "10.0.0.2");
  EXPECT_EQ(new_answer.members_size(), 0);
  // Both know rank 0's host and their own place among the hosts.
  const std::string first_host = old_answer.rank() == 0 ? "10.0.0.1" : "10.0.0.2";
  EXPECT_EQ(old_answer.first_host(), first_host);
  EXPECT_EQ(new_answer.first_host(), first_host);
  EXPECT_EQ(new_answer.host().host_count(), 2);
  EXPECT_EQ(new_answer.host().host_rank(), new_answer.rank());
  EXPECT_EQ(new_answer.host().local_size(), 1);
}

TEST_F(RendezvousTest, PodsOfTwoRanksGetContiguousRanksAndRemovingAPodRemovesBoth) {
  JobConfig config = Config(1, 2);
  config.ranks_per_pod = 2;
  ASSERT_TRUE(server_->AddJob(config).ok());
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  std::vector<RendezvousClient*> raw;
  std::vector<std::string> ids;
  // Joined concurrently, listed in neither pod nor rank order.
  for (const auto& [pod, local_rank] :
       std::vector<std::pair<std::string, int32_t>>{{"p-b", 1}, {"p-a", 0}, {"p-b", 0}, {"p-a", 1}}) {
    ClientOptions options;
    options.address = Address();
    options.job = kJob;
    options.token = kToken;
    options.member_id = pod + "/" + std::to_string(local_rank);
    ids.push_back(options.member_id);
    options.pod = pod;
    options.local_rank = local_rank;
    auto client = RendezvousClient::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    clients.push_back(std::move(*client));
    raw.push_back(clients.back().get());
  }
  auto results = JoinAll(raw);
  const std::vector<MemberInfo> members = Snap().members;
  ASSERT_EQ(members.size(), 4u);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    const Assignment& a = *results[i];
    EXPECT_EQ(a.world_size, 4);
    EXPECT_EQ(a.local_world_size, 2);
    EXPECT_EQ(a.pod_count, 2);
    EXPECT_EQ(a.rank, a.pod_rank * 2 + a.local_rank);
    EXPECT_EQ(members[a.rank].member_id, ids[i]);
    EXPECT_EQ(members[a.rank].local_rank, a.local_rank);
  }
  // Whichever pod arrived whole first is pod 0; its ranks are neighbours.
  EXPECT_EQ(members[0].pod, members[1].pod);
  EXPECT_EQ(members[2].pod, members[3].pod);
  EXPECT_EQ(members[2].local_rank, 0);
  server_->RemoveMember(kJob, members[0].pod, "pod deleted");
  JobSnapshot snapshot = Snap();
  EXPECT_FALSE(snapshot.generation_active);
  ASSERT_EQ(snapshot.history.size(), 1u);
  EXPECT_TRUE(snapshot.history[0].ended_by_loss);
}

TEST_F(RendezvousTest, AWrongTokenGetsTheAnswerOfAJobThatDoesNotExist) {
  ASSERT_TRUE(server_->AddJob(Config(1, 1)).ok());
  // Same answer for both, so a caller without the token cannot probe which job names exist.
  auto wrong_token = NewClient("w-0", kJob, "not-the-token")->Join(-1, 300);
  auto unknown_job = NewClient("w-0", "default/other", "not-the-token")->Join(-1, 300);
  ASSERT_FALSE(wrong_token.ok());
  ASSERT_FALSE(unknown_job.ok());
  EXPECT_EQ(wrong_token.status().code(), StatusCode::kNotFound) << wrong_token.status();
  EXPECT_EQ(unknown_job.status().code(), StatusCode::kNotFound) << unknown_job.status();
  std::string wrong_message = wrong_token.status().message();
  wrong_message.replace(wrong_message.find(kJob), std::string(kJob).size(), "default/other");
  EXPECT_EQ(wrong_message, unknown_job.status().message());
  EXPECT_EQ(wrong_message.find("not-the-token"), std::string::npos);
  EXPECT_EQ(wrong_message.find(kToken), std::string::npos);
}

TEST_F(RendezvousTest, UnknownJobIsRefused) {
  ASSERT_TRUE(server_->AddJob(Config(1, 1)).ok());
  auto client = NewClient("w-0", "default/other");
  auto result = client->Join(-1, 1000);
  ASSERT_FALSE(result.ok());
  // Waited out within the deadline (a restarted operator may not host it yet), then refused.
  EXPECT_EQ(result.status().code(), StatusCode::kNotFound) << result.status();
}

TEST_F(RendezvousTest, ARequestLargerThanTheProtocolNeedsIsRefusedAndTheStoreKeepsNothing) {
  ASSERT_TRUE(server_->AddJob(Config(1, 1)).ok());
  auto client = NewClient("w-0");
  auto joined = client->Join(-1, kJoinTimeoutMs);
  ASSERT_TRUE(joined.ok()) << joined.status();
  std::unique_ptr<KeyValueStore> store = client->GenerationStore(joined->generation);
  const std::string too_large(kMaxRendezvousRequestBytes + 1, 'x');
  Status refused = store->Set("big", too_large, 5000);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(store->Get({"big"}, 0).status().code(), StatusCode::kDeadlineExceeded);
  // What the protocol does need still fits, both ways: Gloo's full-mesh address list (136 bytes
  // a peer) at the replicas bound, past gRPC's default 4 MiB.
  const std::string addresses(50000 * 136, 'a');
  EXPECT_TRUE(store->Set("mesh", addresses, 5000).ok());
  auto read_back = store->Get({"mesh"}, 5000);
  ASSERT_TRUE(read_back.ok()) << read_back.status();
  EXPECT_EQ((*read_back)[0].size(), addresses.size());
}

TEST_F(RendezvousTest, JoinPastDeadlineFailsCleanly) {
  ASSERT_TRUE(server_->AddJob(Config(2, 2)).ok());
  auto client = NewClient("w-0");
  const Deadline bound = Deadline::AfterMs(kBoundedWaitMs);
  auto result = client->Join(-1, 300);
  EXPECT_FALSE(bound.expired());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(result.status().message().find("1 of 2 members present"), std::string::npos)
      << result.status();
  EXPECT_TRUE(Snap().waiting_members.empty());
}

TEST_F(RendezvousTest, StoreGetHonoursItsDeadline) {
  ASSERT_TRUE(server_->AddJob(Config(1, 1)).ok());
  auto client = NewClient("w-0");
  auto a = client->Join(-1, kJoinTimeoutMs);
  ASSERT_TRUE(a.ok()) << a.status();
  auto store = client->GenerationStore(a->generation);
  const auto start = Deadline::Clock::now();
  auto got = store->Get({"rank0/addr", "nccl-id"}, 200);
  const auto elapsed_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Deadline::Clock::now() - start).count();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("rank0/addr, nccl-id"), std::string::npos) << got.status();
  EXPECT_GE(elapsed_ms, 190);
  EXPECT_LT(elapsed_ms, kBoundedWaitMs);
}

TEST_F(RendezvousTest, SetGetAndAddWorkAcrossMembers) {
  ASSERT_TRUE(server_->AddJob(Config(2, 2)).ok());
  auto a = NewClient("w-0");
  auto b = NewClient("w-1");
  auto results = JoinAll({a.get(), b.get()});
  ASSERT_TRUE(results[0].ok() && results[1].ok());
  const int64_t g = results[0]->generation;
  auto store_a = a->GenerationStore(g);
  auto store_b = b->GenerationStore(g);

  // b waits for a key that a writes afterwards.
  auto waiting = std::async(std::launch::async, [&] {
    return store_b->Get({"addr/0", "addr/1"}, kBoundedWaitMs);
  });
  ASSERT_TRUE(store_b->Set("addr/1", "10.0.0.2:4000", 1000).ok());
  ASSERT_TRUE(store_a->Set("addr/0", "10.0.0.1:4000", 1000).ok());
  auto got = waiting.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"10.0.0.1:4000", "10.0.0.2:4000"}));

  auto add_a = std::async(std::launch::async, [&] { return store_a->Add("barrier", 1, 1000); });
  auto add_b = std::async(std::launch::async, [&] { return store_b->Add("barrier", 1, 1000); });
  auto va = add_a.get();
  auto vb = add_b.get();
  ASSERT_TRUE(va.ok() && vb.ok());
  EXPECT_EQ(std::set<int64_t>({*va, *vb}), (std::set<int64_t>{1, 2}));
  auto counter = store_a->Get({"barrier"}, 0);
  ASSERT_TRUE(counter.ok());
  EXPECT_EQ((*counter)[0], "2");
}

TEST_F(RendezvousTest, KeysOfGenerationAreInvisibleInTheNext) {
  ASSERT_TRUE(server_->AddJob(Config(1, 1)).ok());
  auto client = NewClient("w-0");
  auto first = client->Join(-1, kJoinTimeoutMs);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(client->GenerationStore(first->generation)->Set("nccl-id", "abc", 1000).ok());
  // Joining again as a member of the active generation ends it and forms the next.
  auto second = client->Join(-1, kJoinTimeoutMs);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->generation, first->generation + 1);
  auto in_next = client->GenerationStore(second->generation)->Get({"nccl-id"}, 0);
  EXPECT_EQ(in_next.status().code(), StatusCode::kDeadlineExceeded) << in_next.status();
  auto in_first = client->GenerationStore(first->generation)->Get({"nccl-id"}, 0);
  ASSERT_TRUE(in_first.ok()) << in_first.status();
  EXPECT_EQ((*in_first)[0], "abc");
}

TEST_F(RendezvousTest, DestroyedClientEndsGenerationAndOthersFormTheNextWithoutIt) {
  ASSERT_TRUE(server_->AddJob(Config(2, 3)).ok());
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(NewClient("w-" + std::to_string(i)));
  auto results = JoinAll({clients[0].get(), clients[1].get(), clients[2].get()});
  EndWatcher watchers[3];
  ProgressReport marker;
  marker.step = 7;
  clients[2]->SetProgress(marker);  // its beat arriving shows its stream is attached
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    ASSERT_TRUE(clients[i]->StartHeartbeat(*results[i], watchers[i].Callback()).ok());
  }
  ASSERT_TRUE(WaitUntil([&] { return Snap().progress.step == 7; }));
  clients[2].reset();  // the process of w-2 dies: its stream closes

  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(watchers[i].WaitEnded()) << "member " << i << " was not told";
    EXPECT_NE(watchers[i].reasons()[0].find("member w-2 left"), std::string::npos)
        << watchers[i].reasons()[0];
    EXPECT_TRUE(watchers[i].member_lost()[0]) << "a dead member's peers must abort";
    clients[i]->StopHeartbeat();
  }
  EXPECT_EQ(watchers[0].reasons().size(), 1u);
  auto next = JoinAll({clients[0].get(), clients[1].get()});
  const std::vector<MemberInfo> members = Snap().members;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(next[i].ok()) << next[i].status();
    EXPECT_EQ(next[i]->generation, 2);
    EXPECT_EQ(next[i]->world_size, 2);
    EXPECT_EQ(members.at(next[i]->rank).member_id, "w-" + std::to_string(i));
  }
  // Survivors keep their relative order.
  EXPECT_EQ(next[0]->rank < next[1]->rank, results[0]->rank < results[1]->rank);
  JobSnapshot snapshot = Snap();
  ASSERT_EQ(snapshot.history.size(), 2u);
  EXPECT_GE(snapshot.history[0].ended_at, snapshot.history[0].formed_at);
  EXPECT_NE(snapshot.history[0].end_reason.find("w-2"), std::string::npos);
}

TEST_F(RendezvousTest, MissedHeartbeatsEndGenerationAfterTheTimeout) {
  ASSERT_TRUE(server_->AddJob(Config(2, 2)).ok());
  auto beating = NewClient("w-0");
  auto silent = NewClient("w-1");
  auto results = JoinAll({beating.get(), silent.get()});
  ASSERT_TRUE(results[0].ok() && results[1].ok());
  EndWatcher watcher;
  ASSERT_TRUE(beating->StartHeartbeat(*results[0], watcher.Callback()).ok());

  // w-1 opens its stream and beats once, then hangs without closing it.
  auto stub = RawStub();
  grpc::ClientContext context;
  context.AddMetadata("x-lockstep-token", kToken);
  auto stream = stub->Heartbeat(&context);
  v1::HeartbeatRequest beat;
  beat.set_job(kJob);
  beat.set_member_id("w-1");
  beat.set_generation(results[1]->generation);
  ASSERT_TRUE(stream->Write(beat));

  const auto start = Deadline::Clock::now();
  ASSERT_TRUE(watcher.WaitEnded(kHeartbeatTimeoutMs + kBoundedWaitMs));
  const auto elapsed_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Deadline::Clock::now() - start).count();
  EXPECT_GE(elapsed_ms, kHeartbeatTimeoutMs - 100);
  EXPECT_NE(watcher.reasons()[0].find("w-1 missed heartbeats"), std::string::npos)
      << watcher.reasons()[0];
  // The silent member's own stream is told too.
  v1::HeartbeatResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.kind(), v1::HeartbeatResponse::GENERATION_ENDED);
  context.TryCancel();
  stream->Finish().ok();
}

// The stream names its member in its metadata: a member whose process dies after opening its
// stream but before its first beat is lost when the stream breaks, long before the heartbeat
// timeout.
TEST_F(RendezvousTest, AMemberKilledBeforeItsFirstBeatIsFoundByItsStream) {
  JobConfig config = Config(2, 2);
  config.heartbeat_timeout_ms = 60000;  // a loss found in time cannot be the timeout's
  ASSERT_TRUE(server_->AddJob(config).ok());
  auto beating = NewClient("w-0");
  auto dying = NewClient("w-1");
  auto results = JoinAll({beating.get(), dying.get()});
  ASSERT_TRUE(results[0].ok() && results[1].ok());
  EndWatcher watcher;
  ASSERT_TRUE(beating->StartHeartbeat(*results[0], watcher.Callback()).ok());

  auto stub = RawStub();
  grpc::ClientContext context;
  context.AddMetadata("x-lockstep-token", kToken);
  context.AddMetadata("x-lockstep-job", kJob);
  context.AddMetadata("x-lockstep-member", "w-1");
  context.AddMetadata("x-lockstep-generation", std::to_string(results[1]->generation));
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->Heartbeat(&context);
  // The service answers with its initial metadata once it has bound the stream to w-1; then the
  // process dies without a beat.
  stream->WaitForInitialMetadata();
  context.TryCancel();
  stream->Finish().ok();

  ASSERT_TRUE(watcher.WaitEnded(kBoundedWaitMs)) << "found only by the 60 s heartbeat timeout";
  EXPECT_NE(watcher.reasons()[0].find("member w-1 left: heartbeat stream"), std::string::npos)
      << watcher.reasons()[0];
}

// Metadata that names a member must name all three: a malformed generation is refused.
TEST_F(RendezvousTest, HeartbeatMetadataWithAMalformedGenerationIsRefused) {
  ASSERT_TRUE(server_->AddJob(Config(1, 1)).ok());
  auto stub = RawStub();
  grpc::ClientContext context;
  context.AddMetadata("x-lockstep-token", kToken);
  context.AddMetadata("x-lockstep-job", kJob);
  context.AddMetadata("x-lockstep-member", "w-0");
  context.AddMetadata("x-lockstep-generation", "one");
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(kBoundedWaitMs));
  auto stream = stub->Heartbeat(&context);
  v1::HeartbeatResponse response;
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("x-lockstep-generation"), std::string::npos)
      << status.error_message();
}

TEST_F(RendezvousTest, RemoveMemberEndsGenerationAtOnce) {
  ASSERT_TRUE(server_->AddJob(Config(2, 2)).ok());
  auto a = NewClient("w-0");
  auto b = NewClient("w-1");
  auto results = JoinAll({a.get(), b.get()});
  ASSERT_TRUE(results[0].ok() && results[1].ok());
  EndWatcher watcher_a, watcher_b;
  ASSERT_TRUE(a->StartHeartbeat(*results[0], watcher_a.Callback()).ok());
  ASSERT_TRUE(b->StartHeartbeat(*results[1], watcher_b.Callback()).ok());
  server_->RemoveMember(kJob, "w-1", "exited with code 137");
  EXPECT_FALSE(Snap().generation_active);
  ASSERT_TRUE(watcher_a.WaitEnded());
  EXPECT_NE(watcher_a.reasons()[0].find("exited with code 137"), std::string::npos)
      << watcher_a.reasons()[0];
  ASSERT_TRUE(watcher_b.WaitEnded());
}

TEST_F(RendezvousTest, LateJoinerEndsActiveGenerationAndNextIncludesEveryone) {
  JobConfig config = Config(2, 3);
  config.initial_members = 2;
  ASSERT_TRUE(server_->AddJob(config).ok());
  auto a = NewClient("w-0");
  auto b = NewClient("w-1");
  auto c = NewClient("w-2");
  auto first = JoinAll({a.get(), b.get()});
  ASSERT_TRUE(first[0].ok() && first[1].ok());
  EXPECT_EQ(first[0]->world_size, 2);
  EndWatcher watcher_a, watcher_b;
  ASSERT_TRUE(a->StartHeartbeat(*first[0], watcher_a.Callback()).ok());
  ASSERT_TRUE(b->StartHeartbeat(*first[1], watcher_b.Callback()).ok());
  auto late = std::async(std::launch::async, [&] { return c->Join(-1, kJoinTimeoutMs); });
  ASSERT_TRUE(watcher_a.WaitEnded());
  ASSERT_TRUE(watcher_b.WaitEnded());
  EXPECT_NE(watcher_a.reasons()[0].find("member w-2 joined"), std::string::npos)
      << watcher_a.reasons()[0];
  // Nobody was lost: members may finish their step and leave together instead of aborting.
  EXPECT_FALSE(watcher_a.member_lost()[0]);
  EXPECT_FALSE(watcher_b.member_lost()[0]);
  a->StopHeartbeat();
  b->StopHeartbeat();
  auto second = JoinAll({b.get(), a.get()});
  auto joined = late.get();
  ASSERT_TRUE(second[0].ok() && second[1].ok() && joined.ok());
  EXPECT_EQ(joined->generation, 2);
  EXPECT_EQ(joined->world_size, 3);
  EXPECT_EQ(joined->rank, 2);  // newcomers after survivors
  // Survivors keep their previous relative order, whatever order they rejoined in.
  EXPECT_EQ(second[1]->rank < second[0]->rank, first[0]->rank < first[1]->rank);
}

TEST_F(RendezvousTest, DuplicateJoinReplacesTheOlderCall) {
  ASSERT_TRUE(server_->AddJob(Config(2, 2)).ok());
  auto first_process = NewClient("w-0");
  auto restarted = NewClient("w-0");
  auto other = NewClient("w-1");
  auto older =
      std::async(std::launch::async, [&] { return first_process->Join(-1, kJoinTimeoutMs); });
  ASSERT_TRUE(WaitUntil([&] { return Snap().waiting_members.size() == 1; }));
  auto newer = std::async(std::launch::async, [&] { return restarted->Join(-1, kJoinTimeoutMs); });
  auto replaced = older.get();
  ASSERT_FALSE(replaced.ok());
  EXPECT_EQ(replaced.status().code(), StatusCode::kAborted);
  EXPECT_NE(replaced.status().message().find("replaced by a newer join"), std::string::npos);
  auto results = JoinAll({other.get()});
  auto kept = newer.get();
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  EXPECT_EQ(kept->world_size, 2);
}

TEST_F(RendezvousTest, MaxMembersIsRespected) {
  JobConfig config = Config(1, 2);
  // The admitted members do not beat here; keep them from timing out while the third waits.
  config.heartbeat_timeout_ms = 10000;
  ASSERT_TRUE(server_->AddJob(config).ok());
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(NewClient("w-" + std::to_string(i)));
  auto results = JoinAll({clients[0].get(), clients[1].get(), clients[2].get()}, 1000);
  int admitted = 0;
  for (const auto& result : results) {
    if (result.ok()) {
      ++admitted;
      EXPECT_EQ(result->world_size, 2);
    } else {
      EXPECT_EQ(result.status().code(), StatusCode::kDeadlineExceeded) << result.status();
    }
  }
  EXPECT_EQ(admitted, 2);
  EXPECT_EQ(Snap().generation, 1);
}

TEST_F(RendezvousTest, ElasticRangeFormsWithMinAfterLastCall) {
  JobConfig config = Config(2, 4);
  config.last_call_ms = 300;
  ASSERT_TRUE(server_->AddJob(config).ok());
  auto a = NewClient("w-0");
  auto b = NewClient("w-1");
  const auto start = Deadline::Clock::now();
  auto results = JoinAll({a.get(), b.get()});
  const auto elapsed_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Deadline::Clock::now() - start).count();
  ASSERT_TRUE(results[0].ok() && results[1].ok());
  EXPECT_EQ(results[0]->world_size, 2);
  EXPECT_GE(elapsed_ms, 250);  // waited for the last call, since 4 could have come
  EXPECT_LT(elapsed_ms, kBoundedWaitMs);
}

TEST_F(RendezvousTest, LeaveCompletedDoesNotEndGeneration) {
  ASSERT_TRUE(server_->AddJob(Config(2, 2)).ok());
  auto a = NewClient("w-0");
  auto b = NewClient("w-1");
  auto results = JoinAll({a.get(), b.get()});
  ASSERT_TRUE(results[0].ok() && results[1].ok());
  EndWatcher watcher_a, watcher_b;
  ProgressReport progress;
  progress.step = 42;
  a->SetProgress(progress);
  ASSERT_TRUE(a->StartHeartbeat(*results[0], watcher_a.Callback()).ok());
  ASSERT_TRUE(b->StartHeartbeat(*results[1], watcher_b.Callback()).ok());
  ASSERT_TRUE(WaitUntil([&] { return Snap().progress.step == 42; }));

  ProgressReport final_progress;
  final_progress.step = 100;
  final_progress.eval_accuracy = 0.87;
  ASSERT_TRUE(a->Leave(/*completed=*/true, final_progress).ok());
  a->StopHeartbeat();
  // Longer than the heartbeat timeout: neither the closed stream nor the silence ends it.
  EXPECT_FALSE(watcher_b.WaitEnded(2 * kHeartbeatTimeoutMs));
  EXPECT_TRUE(watcher_a.reasons().empty());
  JobSnapshot snapshot = Snap();
  EXPECT_TRUE(snapshot.generation_active);
  EXPECT_EQ(snapshot.completed_members, 1);
  EXPECT_DOUBLE_EQ(snapshot.final_progress.eval_accuracy, 0.87);
  EXPECT_EQ(snapshot.progress.step, 100);
}

TEST_F(RendezvousTest, LeaveNotCompletedEndsGeneration) {
  ASSERT_TRUE(server_->AddJob(Config(2, 2)).ok());
  auto a = NewClient("w-0");
  auto b = NewClient("w-1");
  auto results = JoinAll({a.get(), b.get()});
  ASSERT_TRUE(results[0].ok() && results[1].ok());
  EndWatcher watcher_b;
  ASSERT_TRUE(b->StartHeartbeat(*results[1], watcher_b.Callback()).ok());
  ASSERT_TRUE(a->Leave(/*completed=*/false, ProgressReport{}).ok());
  ASSERT_TRUE(watcher_b.WaitEnded());
  EXPECT_NE(watcher_b.reasons()[0].find("member w-0 left"), std::string::npos);
}

TEST_F(RendezvousTest, TwoJobsOnOneServerAreIsolated) {
  ASSERT_TRUE(server_->AddJob(Config(1, 1, "team-a/x")).ok());
  JobConfig other = Config(1, 1, "team-b/y");
  other.token = "another-token";
  ASSERT_TRUE(server_->AddJob(other).ok());
  EXPECT_EQ(server_->AddJob(other).code(), StatusCode::kAlreadyExists);

  auto x = NewClient("w-0", "team-a/x");
  auto y = NewClient("w-0", "team-b/y", "another-token");
  auto cross = NewClient("w-9", "team-b/y", kToken);  // job a's token on job b
  auto refused = cross->Join(-1, 300);
  EXPECT_EQ(refused.status().code(), StatusCode::kNotFound);

  auto ax = x->Join(-1, kJoinTimeoutMs);
  auto ay = y->Join(-1, kJoinTimeoutMs);
  ASSERT_TRUE(ax.ok() && ay.ok());
  EXPECT_EQ(ax->generation, 1);
  EXPECT_EQ(ay->generation, 1);
  ASSERT_TRUE(x->GenerationStore(1)->Set("k", "from-x", 1000).ok());
  EXPECT_EQ(y->GenerationStore(1)->Get({"k"}, 0).status().code(), StatusCode::kDeadlineExceeded);

  server_->RemoveMember("team-a/x", "w-0", "pod deleted");
  EXPECT_FALSE(Snap("team-a/x").generation_active);
  EXPECT_TRUE(Snap("team-b/y").generation_active);
}

// A job registered again (a restarted operator) continues the numbering it is given: the first
// generation it forms is first_generation, its store and the members' heartbeats work under
// that number, and the next generation follows it.
TEST_F(RendezvousTest, RegistrationContinuesTheGenerationNumberingItIsGiven) {
  JobConfig config = Config(1, 2);
  config.first_generation = 7;
  ASSERT_TRUE(server_->AddJob(config).ok());
  EXPECT_EQ(Snap().generation, 6);
  EXPECT_FALSE(Snap().generation_active);
  auto a = NewClient("w-0");
  auto first = a->Join(-1, kJoinTimeoutMs);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->generation, 7);
  EXPECT_EQ(first->world_size, 1);
  ASSERT_TRUE(a->GenerationStore(7)->Set("k", "v", 1000).ok());
  EndWatcher ended;
  ASSERT_TRUE(a->StartHeartbeat(*first, ended.Callback()).ok());
  // A second member arrives: generation 7 ends and 8 forms with both.
  auto b = NewClient("w-1");
  auto joining = std::async(std::launch::async, [&] { return b->Join(-1, kJoinTimeoutMs); });
  ASSERT_TRUE(ended.WaitEnded());
  a->StopHeartbeat();
  auto again = a->Join(0, kJoinTimeoutMs);
  auto second = joining.get();
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(again->generation, 8);
  EXPECT_EQ(second->generation, 8);
  ASSERT_EQ(Snap().history.size(), 2u);
  EXPECT_EQ(Snap().history[0].generation, 7);
}

// An operator replica handing over (rolling update, leader change): a join pending when the
// service shuts down is answered by its successor on the same address, within the join's
// deadline, instead of failing the worker.
TEST_F(RendezvousTest, JoinPendingAtShutdownIsAnsweredByTheSuccessorOnTheSameAddress) {
  ASSERT_TRUE(server_->AddJob(Config(2, 2)).ok());
  auto client = NewClient("w-0");
  auto pending = std::async(std::launch::async, [&] { return client->Join(-1, kJoinTimeoutMs); });
  ASSERT_TRUE(WaitUntil([&] { return Snap().waiting_members.size() == 1; }));
  ASSERT_NO_FATAL_FAILURE(RestartServerOnTheSameAddress());
  ASSERT_TRUE(server_->AddJob(Config(1, 1)).ok());
  auto result = pending.get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->world_size, 1);
}

// The service restarted under a training generation (an operator's leader replaced): its members
// are never told their generation ended. Their heartbeats wait for the successor on the same
// address, which takes the generation up from their word (proto/rendezvous.proto, step 4); from
// there it is the successor's own, and losing a member ends it as usual.
TEST_F(RendezvousTest, AGenerationTrainsOnThroughARestartOfItsServiceAndTheSuccessorTakesItUp) {
  ASSERT_TRUE(server_->AddJob(Config(2, 3)).ok());
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(NewClient("w-" + std::to_string(i)));
  auto results = JoinAll({clients[0].get(), clients[1].get(), clients[2].get()});
  EndWatcher watchers[3];
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    ASSERT_TRUE(clients[i]->StartHeartbeat(*results[i], watchers[i].Callback()).ok());
  }
  ProgressReport progress;
  progress.step = 40;
  clients[0]->SetProgress(progress);
  ASSERT_TRUE(WaitUntil([&] { return Snap().progress.step == 40; }));
  ASSERT_NO_FATAL_FAILURE(RestartServerOnTheSameAddress());

  // The successor registers the job as a new leader does: numbering on from the status (1).
  JobConfig config = Config(2, 3);
  config.first_generation = 2;
  config.resume_window_ms = kHeartbeatTimeoutMs;
  ASSERT_TRUE(server_->AddJob(config).ok());
  progress.step = 41;  // trained on while the service was away
  clients[0]->SetProgress(progress);
  ASSERT_TRUE(WaitUntil([&] { return Snap().generation_active; }))
      << "the successor did not take generation 1 up";
  JobSnapshot snapshot = Snap();
  EXPECT_EQ(snapshot.generation, 1);
  ASSERT_EQ(snapshot.members.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(snapshot.members[static_cast<size_t>(results[i]->rank)].member_id,
              "w-" + std::to_string(i));
    EXPECT_TRUE(watchers[i].reasons().empty())
        << "member " << i << " was told its generation ended: " << watchers[i].reasons()[0];
  }
  EXPECT_TRUE(WaitUntil([&] { return Snap().progress.step == 41; }));

  clients[2].reset();  // now a member dies: the successor ends the generation as its own
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(watchers[i].WaitEnded()) << "member " << i << " was not told";
    EXPECT_NE(watchers[i].reasons()[0].find("member w-2 left"), std::string::npos)
        << watchers[i].reasons()[0];
    clients[i]->StopHeartbeat();
  }
  auto next = JoinAll({clients[0].get(), clients[1].get()});
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(next[i].ok()) << next[i].status();
    EXPECT_EQ(next[i]->generation, 2);
  }
}

// A member whose service stays away trains on for its reconnect timeout, then gives its
// generation up, saying so.
TEST_F(RendezvousTest, AMemberWhoseServiceStaysAwayGivesItsGenerationUpAfterItsReconnectTimeout) {
  ASSERT_TRUE(server_->AddJob(Config(1, 1)).ok());
  ClientOptions options;
  options.address = Address();
  options.job = kJob;
  options.token = kToken;
  options.member_id = "w-0";
  options.reconnect_timeout_ms = 500;
  auto client = RendezvousClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto joined = (*client)->Join(-1, kJoinTimeoutMs);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EndWatcher watcher;
  ASSERT_TRUE((*client)->StartHeartbeat(*joined, watcher.Callback()).ok());
  ASSERT_TRUE(WaitUntil([&] { return Snap().generation_active; }));
  server_->Shutdown(1000);
  server_.reset();
  ASSERT_TRUE(watcher.WaitEnded(500 + kBoundedWaitMs));
  EXPECT_NE(watcher.reasons()[0].find("no rendezvous service at"), std::string::npos)
      << watcher.reasons()[0];
  EXPECT_TRUE(watcher.member_lost()[0]);
}

// With no successor, the join still ends at its own deadline, naming the service.
TEST_F(RendezvousTest, JoinPendingAtShutdownWithoutSuccessorFailsAtItsDeadline) {
  ASSERT_TRUE(server_->AddJob(Config(2, 2)).ok());
  auto client = NewClient("w-0");
  // The join's 1 s, the 2 s the client allows a held call on top (client.cc), and slack.
  const Deadline bound = Deadline::AfterMs(1000 + 2000 + kBoundedWaitMs);
  auto pending = std::async(std::launch::async, [&] { return client->Join(-1, 1000); });
  ASSERT_TRUE(WaitUntil([&] { return Snap().waiting_members.size() == 1; }));
  server_->Shutdown(1000);
  auto result = pending.get();
  EXPECT_FALSE(bound.expired());
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(result.status().code() == StatusCode::kDeadlineExceeded ||
              result.status().code() == StatusCode::kUnavailable)
      << result.status();
  EXPECT_NE(result.status().message().find("rendezvous"), std::string::npos) << result.status();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// Joins every (client, state_step) pair on its own thread; results in the same order.
std::vector<StatusOr<Assignment>> JoinWithState(
    const std::vector<std::pair<RendezvousClient*, int64_t>>& joiners,
    int64_t timeout_ms = kJoinTimeoutMs) {
  std::vector<std::future<StatusOr<Assignment>>> futures;
  for (const auto& [client, state_step] : joiners) {
    futures.push_back(
        std::async(std::launch::async, [client = client, state_step = state_step, timeout_ms] {
          return client->Join(state_step, timeout_ms);
        }));
  }
  std::vector<StatusOr<Assignment>> results;
  for (auto& future : futures) results.push_back(future.get());
  return results;
}

TEST_F(RendezvousTest, SurvivorsReformAtOnceAfterADeathWithoutTheLastCall) {
  JobConfig config = Config(1, 3);
  config.last_call_ms = 60000;  // any wait for it would blow the bounded wait below
  config.initial_members = 3;
  config.heartbeat_timeout_ms = 10000;  // only the RemoveMember below may end generation 1
  ASSERT_TRUE(server_->AddJob(config).ok());
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(NewClient("w-" + std::to_string(i)));
  auto first = JoinAll({clients[0].get(), clients[1].get(), clients[2].get()});
  for (const auto& result : first) ASSERT_TRUE(result.ok()) << result.status();
  server_->RemoveMember(kJob, "w-1", "process exited with signal 9 (SIGKILL)");

  const auto start = Deadline::Clock::now();
  auto second = JoinWithState({{clients[0].get(), 40}, {clients[2].get(), 40}}, kBoundedWaitMs);
  const auto elapsed_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Deadline::Clock::now() - start).count();
  for (const auto& result : second) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->generation, 2);
    EXPECT_EQ(result->world_size, 2);
  }
  EXPECT_LT(elapsed_ms, kBoundedWaitMs);
  // The replacement (same member id) ends the smaller generation and the job grows back, again
  // without a last call: every expected member is there.
  EndWatcher watcher_0, watcher_2;
  ASSERT_TRUE(clients[0]->StartHeartbeat(*second[0], watcher_0.Callback()).ok());
  ASSERT_TRUE(clients[2]->StartHeartbeat(*second[1], watcher_2.Callback()).ok());
  auto replacement = NewClient("w-1");
  auto grown_back =
      std::async(std::launch::async, [&] { return replacement->Join(-1, kBoundedWaitMs); });
  ASSERT_TRUE(watcher_0.WaitEnded());
  ASSERT_TRUE(watcher_2.WaitEnded());
  clients[0]->StopHeartbeat();
  clients[2]->StopHeartbeat();
  auto third = JoinWithState({{clients[0].get(), 45}, {clients[2].get(), 45}}, kBoundedWaitMs);
  auto joined = grown_back.get();
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->generation, 3);
  EXPECT_EQ(joined->world_size, 3);
  EXPECT_EQ(Snap().members.at(0).state_step, 45);  // the survivors lead: they hold the state
  for (const auto& result : third) ASSERT_TRUE(result.ok()) << result.status();
}

// A hot standby: a member beyond max_members is held while the generation is full; each of its
// joins ends at its deadline saying so, and JoinOrStandBy joins again, so it is still waiting
// when a member is lost, and the survivors re-form with it at once, at full size.
TEST_F(RendezvousTest, AStandbyWaitsPastItsJoinDeadlinesAndTakesALostMembersPlace) {
  JobConfig config = Config(1, 2);
  config.last_call_ms = 60000;  // the re-formation must not wait for a last call
  config.initial_members = 2;
  config.heartbeat_timeout_ms = 10000;  // only the RemoveMember below may end generation 1
  ASSERT_TRUE(server_->AddJob(config).ok());
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int i = 0; i < 2; ++i) clients.push_back(NewClient("w-" + std::to_string(i)));
  auto first = JoinAll({clients[0].get(), clients[1].get()});
  for (const auto& result : first) ASSERT_TRUE(result.ok()) << result.status();

  auto standby = NewClient("w-2");
  std::promise<void> stood_by;
  std::atomic<int> standby_calls{0};
  auto promoted = std::async(std::launch::async, [&] {
    return JoinOrStandBy(
        *standby, -1, /*timeout_ms=*/2000, [] { return true; },
        [&] {
          if (standby_calls.fetch_add(1) == 0) stood_by.set_value();
        });
  });
  // The first join has ended at its deadline and the standby has joined again (between its
  // joins it is briefly not waiting: a loss in that moment would re-form without it).
  ASSERT_EQ(stood_by.get_future().wait_for(std::chrono::milliseconds(kBoundedWaitMs)),
            std::future_status::ready);
  const Deadline waited = Deadline::AfterMs(kBoundedWaitMs);
  const auto standby_waits = [&] {
    const std::vector<std::string> waiting = Snap().waiting_members;
    return std::find(waiting.begin(), waiting.end(), "w-2") != waiting.end();
  };
  while (!standby_waits() && !waited.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(standby_waits());
  EXPECT_EQ(Snap().generation, 1) << "a standby's join must not end a full generation";
  server_->RemoveMember(kJob, "w-1", "process exited with signal 9 (SIGKILL)");
  auto second = JoinWithState({{clients[0].get(), 30}}, kBoundedWaitMs);
  ASSERT_TRUE(second[0].ok()) << second[0].status();
  EXPECT_EQ(second[0]->generation, 2);
  EXPECT_EQ(second[0]->world_size, 2);
  StatusOr<Assignment> taken = promoted.get();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->generation, 2);
  EXPECT_EQ(taken->world_size, 2);
  EXPECT_EQ(standby_calls.load(), 1) << "on_standby is called once";
}

// A join that failed for another reason than a full generation is returned as it is.
TEST_F(RendezvousTest, JoinOrStandByReturnsADeadlineThatIsNotAFullGeneration) {
  ASSERT_TRUE(server_->AddJob(Config(2, 2)).ok());
  auto alone = NewClient("w-0");
  bool stood_by = false;
  StatusOr<Assignment> result =
      JoinOrStandBy(*alone, -1, 200, [] { return true; }, [&] { stood_by = true; });
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kDeadlineExceeded) << result.status();
  EXPECT_FALSE(stood_by);
}

TEST_F(RendezvousTest, FirstGenerationWaitsForEveryInitialMemberWhenAsked) {
  JobConfig config = Config(1, 3);
  config.last_call_ms = 50;
  config.initial_members = 3;
  config.wait_for_initial_members = true;
  ASSERT_TRUE(server_->AddJob(config).ok());
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(NewClient("w-" + std::to_string(i)));
  auto early = std::async(std::launch::async, [&] {
    return JoinAll({clients[0].get(), clients[1].get()});
  });
  ASSERT_TRUE(WaitUntil([&] { return Snap().waiting_members.size() == 2; }));
  // Many last-call windows pass: still no generation without w-2.
  EXPECT_FALSE(WaitUntil([&] { return Snap().generation > 0; }, 10 * config.last_call_ms));
  auto late = JoinAll({clients[2].get()});
  ASSERT_TRUE(late[0].ok()) << late[0].status();
  EXPECT_EQ(late[0]->world_size, 3);
  for (const auto& result : early.get()) ASSERT_TRUE(result.ok()) << result.status();
}

TEST_F(RendezvousTest, GenerationRecordsWhenTrainingResumesAfterALoss) {
  JobConfig config = Config(1, 2);
  config.heartbeat_timeout_ms = 10000;  // only rank 0 beats; the loss is the RemoveMember
  ASSERT_TRUE(server_->AddJob(config).ok());
  auto a = NewClient("w-0");
  auto b = NewClient("w-1");
  auto first = JoinAll({a.get(), b.get()});
  ASSERT_TRUE(first[0].ok() && first[1].ok());
  RendezvousClient* rank0 = first[0]->rank == 0 ? a.get() : b.get();
  const Assignment& rank0_assignment = first[0]->rank == 0 ? *first[0] : *first[1];
  EndWatcher watcher;
  ProgressReport progress;
  progress.step = 20;
  rank0->SetProgress(progress);
  ASSERT_TRUE(rank0->StartHeartbeat(rank0_assignment, watcher.Callback()).ok());
  ASSERT_TRUE(WaitUntil([&] { return Snap().history[0].training_at >= 0; }));

  const std::string lost = rank0 == a.get() ? "w-1" : "w-0";
  server_->RemoveMember(kJob, lost, "process exited with signal 9 (SIGKILL)");
  ASSERT_TRUE(watcher.WaitEnded());
  rank0->StopHeartbeat();
  auto second = JoinWithState({{rank0, 23}});
  ASSERT_TRUE(second[0].ok()) << second[0].status();
  EndWatcher second_watcher;
  ASSERT_TRUE(rank0->StartHeartbeat(*second[0], second_watcher.Callback()).ok());
  // Beats repeating the step the survivor held do not count as training again...
  progress.step = 23;
  rank0->SetProgress(progress);
  EXPECT_FALSE(WaitUntil([&] { return Snap().history[1].training_at >= 0; }, 300));
  // ...the first step past it does.
  progress.step = 24;
  rank0->SetProgress(progress);
  ASSERT_TRUE(WaitUntil([&] { return Snap().history[1].training_at >= 0; }));
  JobSnapshot snapshot = Snap();
  ASSERT_EQ(snapshot.history.size(), 2u);
  EXPECT_TRUE(snapshot.history[0].ended_by_loss);
  EXPECT_EQ(snapshot.history[1].formed_at_step, 23);
  const double recovery = snapshot.longest_recovery_seconds;
  EXPECT_GT(recovery, 0);
  EXPECT_DOUBLE_EQ(recovery, snapshot.history[1].training_at - snapshot.history[0].ended_at);
  rank0->StopHeartbeat();
}

TEST_F(RendezvousTest, FirstCompletedLeaveIsFinalProgressEvenWithoutEvaluation) {
  ASSERT_TRUE(server_->AddJob(Config(2, 2)).ok());
  auto a = NewClient("w-0");
  auto b = NewClient("w-1");
  auto results = JoinAll({a.get(), b.get()});
  ASSERT_TRUE(results[0].ok() && results[1].ok());
  ProgressReport final_progress;
  final_progress.step = 300;
  final_progress.total_steps = 300;
  final_progress.loss = 0.25;
  final_progress.resumed_from_step = 150;
  // No test split: eval_accuracy stays -1.
  ASSERT_TRUE(a->Leave(/*completed=*/true, final_progress).ok());
  ProgressReport later = final_progress;
  later.loss = 9.0;
  ASSERT_TRUE(b->Leave(/*completed=*/true, later).ok());
  JobSnapshot snapshot = Snap();
  EXPECT_EQ(snapshot.completed_members, 2);
  EXPECT_EQ(snapshot.final_progress.step, 300);
  EXPECT_DOUBLE_EQ(snapshot.final_progress.loss, 0.25);
  EXPECT_EQ(snapshot.final_progress.resumed_from_step, 150);
  EXPECT_LT(snapshot.final_progress.eval_accuracy, 0);
}

TEST(RendezvousTlsTest, MembersJoinOverTlsWithTheServiceCertificate) {
  // A self-signed certificate for 127.0.0.1, made by the openssl CLI at test time.
  const std::string dir = ::testing::TempDir() + "/rendezvous_tls_" + std::to_string(::getpid());
  const std::string command = "mkdir -p " + dir +
                              " && openssl req -x509 -newkey rsa:2048 -nodes -keyout " + dir +
                              "/key.pem -out " + dir +
                              "/cert.pem -days 1 -subj /CN=127.0.0.1 "
                              "-addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1";
  if (std::system(command.c_str()) != 0) GTEST_SKIP() << "openssl CLI cannot make a certificate";
  ServerOptions server_options;
  server_options.tls_cert_pem = ReadFile(dir + "/cert.pem");
  server_options.tls_key_pem = ReadFile(dir + "/key.pem");
  auto server = RendezvousServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  JobConfig config;
  config.job = kJob;
  config.token = kToken;
  ASSERT_TRUE((*server)->AddJob(config).ok());

  ClientOptions options;
  options.address = "127.0.0.1:" + std::to_string((*server)->port());
  options.job = kJob;
  options.token = kToken;
  options.member_id = "w-0";
  options.tls_ca_pem = server_options.tls_cert_pem;
  auto client = RendezvousClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto assignment = (*client)->Join(-1, kJoinTimeoutMs);
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  EXPECT_EQ(assignment->world_size, 1);

  // A wrong token is refused from its metadata, before any request body is read (TokenGate;
  // bench/rendezvous measures the memory), with the answer a wrong token always gets.
  options.token = "not-the-token";
  options.member_id = "w-2";
  auto stranger = RendezvousClient::Connect(options);
  ASSERT_TRUE(stranger.ok());
  auto refused = (*stranger)->Join(-1, 500);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kNotFound) << refused.status();
  options.token = kToken;

  // A plaintext client cannot talk to the TLS service.
  options.tls_ca_pem.clear();
  options.member_id = "w-1";
  auto plaintext = RendezvousClient::Connect(options);
  ASSERT_TRUE(plaintext.ok());
  EXPECT_FALSE((*plaintext)->Join(-1, 300).ok());
  (*server)->Shutdown(1000);
}

TEST(InMemoryStoreTest, GetWaitsForSetAndHonoursDeadline) {
  auto store = NewInMemoryStore();
  auto missing = store->Get({"a"}, 50);
  EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded);
  auto waiting = std::async(std::launch::async, [&] { return store->Get({"a"}, kBoundedWaitMs); });
  ASSERT_TRUE(store->Set("a", "1", 100).ok());
  auto got = waiting.get();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0], "1");
  auto added = store->Add("a", 2, 100);
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(*added, 3);
}

// ---------------------------------------------------------------------------------------------
// One job cannot hurt another

// This process's resident memory, in bytes (VmRSS); -1 when unreadable.
int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// A member of job A (it holds A's token, as any program of A's pods can) writes 4 MiB values
// until refused, sets small keys until refused, and forces 10,000 generations. The service
// refuses it within A's limits and its memory stays bounded, while job B beside it keeps its
// generation (no heartbeat missed) and its store. Prints B's slowest store round trip, with
// and without the flood.
TEST_F(RendezvousTest, AFloodingMemberOfOneJobIsRefusedWhileAnotherJobTrainsOn) {
  JobConfig a = Config(1, 1, "default/a");
  a.token = "token-of-a";
  JobConfig b = Config(1, 1, "default/b");
  b.heartbeat_timeout_ms = 10000;  // the operator's default: a loaded machine is no loss
  ASSERT_TRUE(server_->AddJob(a).ok());
  ASSERT_TRUE(server_->AddJob(b).ok());

  auto trainer = NewClient("b-0", "default/b");
  auto joined_b = trainer->Join(-1, kJoinTimeoutMs);
  ASSERT_TRUE(joined_b.ok()) << joined_b.status();
  EndWatcher b_ended;
  ASSERT_TRUE(trainer->StartHeartbeat(*joined_b, b_ended.Callback()).ok());
  auto b_store = trainer->GenerationStore(joined_b->generation);
  std::atomic<int64_t> b_rounds{0}, b_failures{0};
  // B's slowest store set-and-get, in microseconds: [0] before the flood, [1] during it.
  std::atomic<int64_t> b_slowest[2] = {0, 0};
  std::atomic<int> phase{0};
  std::thread b_thread([&] {
    for (int64_t i = 0; phase.load() < 2; ++i) {
      const auto started = std::chrono::steady_clock::now();
      const std::string key = "b-" + std::to_string(i % 64);
      Status set = b_store->Set(key, std::to_string(i), 10000);
      StatusOr<std::vector<std::string>> got = b_store->Get({key}, 10000);
      if (!set.ok() || !got.ok() || (*got)[0] != std::to_string(i)) ++b_failures;
      const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::steady_clock::now() - started)
                             .count();
      std::atomic<int64_t>& slowest = b_slowest[std::min(phase.load(), 1)];
      slowest.store(std::max(slowest.load(), us));
      ++b_rounds;
    }
  });
  // B's thread ends however the test does (an ASSERT returns early).
  struct StopB {
    std::atomic<int>& phase;
    std::thread& thread;
    ~StopB() {
      phase.store(2);
      if (thread.joinable()) thread.join();
    }
  } stop_b{phase, b_thread};
  ASSERT_TRUE(WaitUntil([&] { return b_rounds.load() >= 200; }, 30000));

  const int64_t resident_before = ResidentBytes();
  phase.store(1);
  auto hostile = NewClient("a-0", "default/a", "token-of-a");
  auto joined_a = hostile->Join(-1, kJoinTimeoutMs);
  ASSERT_TRUE(joined_a.ok()) << joined_a.status();
  auto a_store = hostile->GenerationStore(joined_a->generation);

  // 4 MiB values under fresh keys, up to 1 GiB: refused after A's 16 MiB.
  const std::string big(4 << 20, 'x');
  int big_accepted = 0;
  Status refused;
  for (int i = 0; i < 256 && refused.ok(); ++i) {
    refused = a_store->Set("big-" + std::to_string(i), big, 10000);
    if (refused.ok()) ++big_accepted;
  }
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused;
  EXPECT_LE(big_accepted, 4);
  // An answer past the clients' 8 MiB is refused before it is built.
  StatusOr<std::vector<std::string>> thrice = a_store->Get({"big-0", "big-0", "big-0"}, 10000);
  EXPECT_EQ(thrice.status().code(), StatusCode::kResourceExhausted) << thrice.status();

  // Small keys, up to 10^6, in a generation two past the big values' (which drops them): refused
  // after A's 4,096 keys and 16 per rank.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(hostile->Leave(false, {}).ok());
    joined_a = hostile->Join(-1, kJoinTimeoutMs);
    ASSERT_TRUE(joined_a.ok()) << joined_a.status();
  }
  auto a_keys = hostile->GenerationStore(joined_a->generation);
  int keys_accepted = 0;
  refused = OkStatus();
  for (int i = 0; i < 1000000 && refused.ok(); ++i) {
    refused = a_keys->Set("k" + std::to_string(i), "v", 10000);
    if (refused.ok()) ++keys_accepted;
  }
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused;
  EXPECT_LE(keys_accepted, 4096 + 16);
  EXPECT_NE(refused.message().find("keys, its limit is"), std::string::npos) << refused;

  // 10,000 generations: leave, join again.
  for (int g = 0; g < 10000; ++g) {
    ASSERT_TRUE(hostile->Leave(false, {}).ok());
    ASSERT_TRUE(hostile->Join(-1, kJoinTimeoutMs).ok()) << g;
  }
  const JobSnapshot a_snapshot = *server_->Snapshot("default/a");
  EXPECT_EQ(a_snapshot.generations_formed, 10003);
  EXPECT_LE(a_snapshot.history.size(), 64u);
  const int64_t resident_after = ResidentBytes();
  phase.store(2);
  b_thread.join();

  // A's store and history are bounded: without the limits the first loop alone stores 1 GiB.
  EXPECT_LT(resident_after - resident_before, int64_t{128} << 20)
      << "resident " << resident_before / 1048576 << " -> " << resident_after / 1048576 << " MiB";
  // B lost nothing: its generation is the one it formed, and every store round trip answered.
  EXPECT_TRUE(b_ended.reasons().empty()) << b_ended.reasons().front();
  EXPECT_EQ(b_failures.load(), 0);
  EXPECT_EQ(server_->Snapshot("default/b")->generation, joined_b->generation);
  std::printf("job A: %d values of 4 MiB and %d small keys accepted before refused; job B's "
              "slowest store round trip: %.1f ms alone, %.1f ms beside job A's flood (%lld "
              "rounds); resident %lld -> %lld MiB\n",
              big_accepted, keys_accepted, b_slowest[0].load() / 1000.0,
              b_slowest[1].load() / 1000.0,
              static_cast<long long>(b_rounds.load()),
              static_cast<long long>(resident_before / 1048576),
              static_cast<long long>(resident_after / 1048576));
  trainer->StopHeartbeat();
}

}  // namespace
}  // namespace lockstep::rendezvous
