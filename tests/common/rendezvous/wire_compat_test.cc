// A worker of the previous release against today's rendezvous service: the operator is upgraded
// while jobs run, so their workers, built from the release before, keep speaking its wire and
// making its decisions. The worker here speaks previous_wire/rendezvous_previous.proto (the last
// release's proto, renamed only) through the real method paths, and decides as that release's
// client did: on the texts of the service's messages, which this release no longer reads (it
// reads the reason in the status's details) but must keep sending.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/deadline.h"
#include "common/rendezvous/server.h"
#include "common/rendezvous/wire.h"
#include "previous_wire/rendezvous_previous.pb.h"

namespace lockstep::rendezvous {
namespace {

namespace previous = ::lockstep::rendezvous::previous;

constexpr char kJob[] = "default/fashion";
constexpr char kToken[] = "s3cret-token-value";
constexpr char kMethods[] = "/lockstep.rendezvous.v1.Rendezvous/";
constexpr int64_t kCallTimeoutMs = 5000;

// What the previous release's client read in the service's answers (its
// common/rendezvous/client.h and client.cc), spelled here as it spelled them.
constexpr char kPreviousFullText[] = "is active and full";
constexpr char kPreviousCompletedText[] = "has completed; nothing to join";
constexpr char kPreviousServiceDeadlineText[] = "members present";

std::chrono::system_clock::time_point After(int64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

// The previous release's heartbeat stream: the metadata naming its member, beats, and the
// service's GENERATION_ENDED.
class PreviousHeartbeat
    : public grpc::ClientBidiReactor<previous::HeartbeatRequest, previous::HeartbeatResponse> {
 public:
  PreviousHeartbeat(const std::shared_ptr<grpc::Channel>& channel, const std::string& member,
                    int64_t generation)
      : member_(member), generation_(generation) {
    context_.AddMetadata("x-lockstep-token", kToken);
    context_.AddMetadata("x-lockstep-job", kJob);
    context_.AddMetadata("x-lockstep-member", member);
    context_.AddMetadata("x-lockstep-generation", std::to_string(generation));
    grpc::TemplatedGenericStub<previous::HeartbeatRequest, previous::HeartbeatResponse> stub(
        channel);
    stub.PrepareBidiStreamingCall(&context_, std::string(kMethods) + "Heartbeat", {}, this);
    StartRead(&response_);
    StartCall();
  }
  ~PreviousHeartbeat() override {
    context_.TryCancel();
    WaitDone();
  }

  // One beat, with progress when step >= 0; returns once it is written. False when it was not
  // written within kCallTimeoutMs; the stream then takes no more beats (its write is in flight).
  bool Beat(int64_t step = -1) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stuck_) return false;
    }
    request_.Clear();
    request_.set_job(kJob);
    request_.set_member_id(member_);
    request_.set_generation(generation_);
    if (step >= 0) request_.mutable_progress()->set_step(step);
    {
      std::lock_guard<std::mutex> lock(mu_);
      written_ = false;
    }
    StartWrite(&request_);
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::milliseconds(kCallTimeoutMs),
                      [this] { return written_ || done_; })) {
      stuck_ = true;
    }
    return written_;
  }
  // The service's answer on the stream, if one came within kCallTimeoutMs.
  std::optional<previous::HeartbeatResponse> WaitAnswer() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(kCallTimeoutMs),
                 [this] { return answer_.has_value() || done_; });
    return answer_;
  }
  // A worker killed: the stream breaks without a word.
  void Break() { context_.TryCancel(); }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    written_ = ok;
    cv_.notify_all();
  }
  void OnReadDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (ok && !answer_.has_value()) answer_ = response_;
    cv_.notify_all();
  }
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }

 private:
  // After TryCancel gRPC calls OnDone promptly, and holds the reactor until it has: waiting with
  // a limit could free it under gRPC.
  void WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

  const std::string member_;
  const int64_t generation_;
  grpc::ClientContext context_;
  previous::HeartbeatRequest request_;
  previous::HeartbeatResponse response_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool written_ = false;
  bool stuck_ = false;
  bool done_ = false;
  std::optional<previous::HeartbeatResponse> answer_;
};

// A worker of the previous release: its requests, and its decisions on the answers.
class PreviousWorker {
 public:
  PreviousWorker(const std::string& address, std::string member)
      : channel_(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
        member_(std::move(member)) {}

  struct Joined {
    grpc::Status status;
    previous::JoinResponse response;
    // The previous release's readings of a failed join.
    bool full() const {
      return status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
             status.error_message().find(kPreviousFullText) != std::string::npos;
    }
    bool answered_by_the_service() const {
      return status.error_message().find(kPreviousServiceDeadlineText) != std::string::npos;
    }
    bool job_completed() const {
      return status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
             status.error_message().find(kPreviousCompletedText) != std::string::npos;
    }
  };

  Joined Join(int64_t timeout_ms) {
    previous::JoinRequest request;
    request.set_job(kJob);
    request.set_member_id(member_);
    request.set_host("127.0.0.1");
    request.set_state_step(-1);
    request.set_timeout_ms(timeout_ms);
    request.set_without_members(true);
    Joined joined;
    joined.status = Unary("Join", request, &joined.response, timeout_ms + kCallTimeoutMs);
    return joined;
  }

  // The previous release's standby: joins again for as long as the answer reads "full", and,
  // once it has stood by, after any deadline (the job between generations).
  Joined JoinOrStandBy(int64_t timeout_ms, int max_joins, int* full_answers) {
    Joined joined;
    bool standing_by = *full_answers > 0;
    for (int i = 0; i < max_joins; ++i) {
      joined = Join(timeout_ms);
      const bool deadline = joined.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      if (!joined.full() && !(standing_by && deadline)) return joined;
      if (joined.full()) ++*full_answers;
      standing_by = true;
    }
    return joined;
  }

  std::unique_ptr<PreviousHeartbeat> Heartbeat(int64_t generation) {
    return std::make_unique<PreviousHeartbeat>(channel_, member_, generation);
  }

  grpc::Status Leave(bool completed, int64_t step) {
    previous::LeaveRequest request;
    request.set_job(kJob);
    request.set_member_id(member_);
    request.set_completed(completed);
    request.mutable_progress()->set_step(step);
    request.mutable_progress()->set_total_steps(step);
    previous::LeaveResponse response;
    return Unary("Leave", request, &response, kCallTimeoutMs);
  }

 private:
  template <typename Request, typename Response>
  grpc::Status Unary(const std::string& method, const Request& request, Response* response,
                     int64_t timeout_ms) {
    grpc::TemplatedGenericStub<Request, Response> stub(channel_);
    grpc::ClientContext context;
    context.AddMetadata("x-lockstep-token", kToken);
    context.set_deadline(After(timeout_ms));
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, kMethods + method, {}, &request, response,
                   [&done](grpc::Status status) { done.set_value(std::move(status)); });
    return done.get_future().get();  // bounded by the context's deadline
  }

  std::shared_ptr<grpc::Channel> channel_;
  const std::string member_;
};

class WireCompatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = RendezvousServer::Start(ServerOptions{});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    JobConfig config;
    config.job = kJob;
    config.token = kToken;
    config.min_members = 2;
    config.max_members = 2;
    config.last_call_ms = 200;
    config.heartbeat_interval_ms = 50;
    // Long: the tests beat once, and end a member by breaking its stream, not by its silence.
    config.heartbeat_timeout_ms = 60000;
    ASSERT_TRUE(server_->AddJob(config).ok());
  }
  void TearDown() override {
    beat0_.reset();
    beat1_.reset();
    if (server_ != nullptr) server_->Shutdown(1000);
  }

  std::string Address() const { return "127.0.0.1:" + std::to_string(server_->port()); }

  // Both workers join together; their answers in their order.
  static std::pair<PreviousWorker::Joined, PreviousWorker::Joined> JoinBoth(PreviousWorker& a,
                                                                           PreviousWorker& b) {
    auto first = std::async(std::launch::async, [&a] { return a.Join(kCallTimeoutMs); });
    PreviousWorker::Joined second = b.Join(kCallTimeoutMs);
    return {first.get(), second};
  }

  // w-0 and w-1 form generation 1, which is then full (max 2), and beat once each.
  void FormAFullGeneration() {
    w0_ = std::make_unique<PreviousWorker>(Address(), "w-0");
    w1_ = std::make_unique<PreviousWorker>(Address(), "w-1");
    auto [joined0, joined1] = JoinBoth(*w0_, *w1_);
    ASSERT_TRUE(joined0.status.ok() && joined1.status.ok());
    beat0_ = w0_->Heartbeat(1);
    beat1_ = w1_->Heartbeat(1);
    ASSERT_TRUE(beat0_->Beat() && beat1_->Beat());
  }

  JobSnapshot Snap() {
    auto snapshot = server_->Snapshot(kJob);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    return snapshot.ok() ? *snapshot : JobSnapshot{};
  }

  std::unique_ptr<RendezvousServer> server_;
  std::unique_ptr<PreviousWorker> w0_, w1_;  // FormAFullGeneration's
  std::unique_ptr<PreviousHeartbeat> beat0_, beat1_;
};

TEST_F(WireCompatTest, APreviousReleaseWorkerJoinsBeatsAndLeavesCompletedOnTodaysService) {
  PreviousWorker w0(Address(), "w-0");
  PreviousWorker w1(Address(), "w-1");
  auto [joined0, joined1] = JoinBoth(w0, w1);
  ASSERT_TRUE(joined0.status.ok()) << joined0.status.error_message();
  ASSERT_TRUE(joined1.status.ok()) << joined1.status.error_message();
  EXPECT_EQ(joined0.response.generation(), 1);
  EXPECT_EQ(joined0.response.world_size(), 2);
  EXPECT_EQ(joined0.response.rank() + joined1.response.rank(), 1);
  EXPECT_EQ(joined0.response.first_host(), "127.0.0.1");
  EXPECT_EQ(joined0.response.members_size(), 0);  // it asked to go without the list

  auto beat0 = w0.Heartbeat(1);
  auto beat1 = w1.Heartbeat(1);
  ASSERT_TRUE(beat0->Beat(/*step=*/7));
  ASSERT_TRUE(beat1->Beat());
  const Deadline deadline = Deadline::AfterMs(kCallTimeoutMs);
  while (Snap().progress.step != 7 && !deadline.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(Snap().progress.step, 7) << "the previous release's progress beat was not read";

  // Rank 0 finishes: its Leave(completed) ends nothing, and a late joiner is told the job is
  // done in the words the previous release reads.
  ASSERT_TRUE(w0.Leave(/*completed=*/true, /*step=*/10).ok());
  EXPECT_EQ(Snap().completed_members, 1);
  EXPECT_EQ(Snap().final_progress.step, 10);
  PreviousWorker late(Address(), "w-late");
  const PreviousWorker::Joined refused = late.Join(1000);
  EXPECT_TRUE(refused.job_completed()) << refused.status.error_code() << " "
                                       << refused.status.error_message();
}

TEST_F(WireCompatTest, APreviousReleaseStandbyWaitsOnAFullGenerationAndTakesALostMembersPlace) {
  ASSERT_NO_FATAL_FAILURE(FormAFullGeneration());

  // A third worker finds generation 1 full: the previous release reads that as standing by, and
  // tells it from a deadline of the transport.
  PreviousWorker standby(Address(), "w-standby");
  int full_answers = 0;
  const PreviousWorker::Joined waited = standby.JoinOrStandBy(300, 1, &full_answers);
  ASSERT_EQ(full_answers, 1) << waited.status.error_code() << " " << waited.status.error_message();
  EXPECT_TRUE(waited.answered_by_the_service()) << waited.status.error_message();

  // Standing by, it joins again; w-1 is killed, and the generation ends for w-0 with a member
  // lost. The standby and w-0 form generation 2.
  auto standing_by = std::async(std::launch::async, [&standby, &full_answers] {
    return standby.JoinOrStandBy(1000, 20, &full_answers);
  });
  beat1_->Break();
  const std::optional<previous::HeartbeatResponse> ended = beat0_->WaitAnswer();
  ASSERT_TRUE(ended.has_value()) << "w-0 was not told the generation ended";
  EXPECT_EQ(ended->kind(), previous::HeartbeatResponse::GENERATION_ENDED);
  EXPECT_EQ(ended->generation(), 1);
  EXPECT_TRUE(ended->member_lost());
  const PreviousWorker::Joined rejoined = w0_->Join(kCallTimeoutMs);
  const PreviousWorker::Joined promoted = standing_by.get();
  ASSERT_TRUE(rejoined.status.ok()) << rejoined.status.error_message();
  ASSERT_TRUE(promoted.status.ok()) << promoted.status.error_message();
  EXPECT_EQ(promoted.response.generation(), 2);
  EXPECT_EQ(promoted.response.world_size(), 2);
}

// Today's status details, read by any gRPC client: an ErrorInfo under google.rpc's type URL.
TEST_F(WireCompatTest, AFullGenerationsAnswerCarriesItsReasonInTheStatusDetails) {
  ASSERT_NO_FATAL_FAILURE(FormAFullGeneration());

  const PreviousWorker::Joined waited = PreviousWorker(Address(), "w-2").Join(300);
  v1::StatusDetails details;
  ASSERT_TRUE(details.ParseFromString(waited.status.error_details()));
  EXPECT_EQ(details.code(), static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED));
  ASSERT_EQ(details.details_size(), 1);
  EXPECT_EQ(details.details(0).type_url(), "type.googleapis.com/google.rpc.ErrorInfo");
  v1::ErrorInfo info;
  ASSERT_TRUE(info.ParseFromString(details.details(0).value()));
  EXPECT_EQ(info.reason(), "GENERATION_FULL");
  EXPECT_EQ(info.domain(), "rendezvous.lockstep.dev");
  EXPECT_EQ(FromGrpcStatus(waited.status).reason(), kReasonGenerationFull);
}

// A worker of this release on an operator of the previous one: the answers carry no reason, and
// what their texts meant is read instead, so a standby still stands by and a late replacement of
// a completed job still ends as a success.
TEST(JoinRefusalReasonTest, AnAnswerFromAServiceBeforeTheReasonsIsReadFromItsTexts) {
  EXPECT_EQ(JoinRefusalReason(DeadlineExceededError(
                "no generation formed within 400 ms: 1 of 3 members present (min 1, max 2); "
                "generation 1 is active and full")),
            kReasonGenerationFull);
  EXPECT_EQ(JoinRefusalReason(DeadlineExceededError(
                "no generation formed within 300 ms: 1 of 2 members present (min 2, max 2)")),
            kReasonNoGenerationFormed);
  EXPECT_EQ(JoinRefusalReason(
                FailedPreconditionError("job default/fashion has completed; nothing to join")),
            kReasonJobCompleted);
  EXPECT_TRUE(JobCompletedWhileJoining(
      FailedPreconditionError("job default/fashion has completed; nothing to join")));
  // A deadline of the transport has no reason; a reason given wins over any text.
  EXPECT_EQ(JoinRefusalReason(DeadlineExceededError("Deadline Exceeded")), "");
  EXPECT_EQ(JoinRefusalReason(DeadlineExceededError("1 of 2 members present; is active and full")
                                  .WithReason(kReasonNoGenerationFormed)),
            kReasonNoGenerationFormed);
}

}  // namespace
}  // namespace lockstep::rendezvous
