#include "bench/rendezvous/simulated_members.h"

#include <absl/synchronization/mutex.h>
#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "common/rendezvous/channel.h"
#include "common/rendezvous/wire.h"
#include "proto/rendezvous.grpc.pb.h"

namespace lockstep::rendezvous::load {

namespace {
constexpr int64_t kTickMs = 10;  // heartbeats are spread over the interval in slots of this
constexpr int64_t kCallMarginMs = 5000;
constexpr char kJoinMethod[] = "/lockstep.rendezvous.v1.Rendezvous/Join";

// What a simulated member takes from a JoinResponse: its own numbers. Length-delimited fields (its
// host placement, rank 0's host, and the member list that only an older client asks for) are
// skipped, not decoded: a worker decodes them on its own machine, and decoding them here would
// measure this process, not the service.
bool DecodeOwnFields(grpc::ByteBuffer& buffer, v1::JoinResponse& own) {
  grpc::ProtoBufferReader reader(&buffer);
  google::protobuf::io::CodedInputStream in(&reader);
  while (uint32_t tag = in.ReadTag()) {
    const int field = static_cast<int>(tag >> 3);
    uint64_t value = 0;
    uint32_t length = 0;
    switch (tag & 7) {
      case 0:  // varint
        if (!in.ReadVarint64(&value)) return false;
        break;
      case 2:  // length-delimited
        if (!in.ReadVarint32(&length) || !in.Skip(static_cast<int>(length))) return false;
        continue;
      default:
        return false;
    }
    if (field == v1::JoinResponse::kGenerationFieldNumber) own.set_generation(static_cast<int64_t>(value));
    if (field == v1::JoinResponse::kRankFieldNumber) own.set_rank(static_cast<int32_t>(value));
    if (field == v1::JoinResponse::kWorldSizeFieldNumber) own.set_world_size(static_cast<int32_t>(value));
    if (field == v1::JoinResponse::kHeartbeatIntervalMsFieldNumber) {
      own.set_heartbeat_interval_ms(static_cast<int64_t>(value));
    }
    if (field == v1::JoinResponse::kHeartbeatIdleIntervalMsFieldNumber) {
      own.set_heartbeat_idle_interval_ms(static_cast<int64_t>(value));
    }
  }
  return true;
}

// A unary call on the callback API: what must live until its callback runs.
template <typename Request, typename Response>
struct UnaryCall {
  grpc::ClientContext context;
  Request request;
  Response response;
};

// A call of a member of `job`: its token, due in timeout_ms.
template <typename Call>
std::shared_ptr<Call> NewCall(const std::string& token, const std::string& job,
                              int64_t timeout_ms) {
  auto call = std::make_shared<Call>();
  call->context.AddMetadata(kTokenMetadataKey, token);
  call->context.set_deadline(std::chrono::system_clock::now() +
                             std::chrono::milliseconds(timeout_ms));
  call->request.set_job(job);
  return call;
}
}  // namespace

struct SimulatedMembers::Connection {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Rendezvous::Stub> stub;
  std::unique_ptr<grpc::GenericStub> generic;  // Join, decoded by DecodeOwnFields
};

struct SimulatedMembers::Member {
  int index = 0;
  std::string job;
  std::string token;
  std::string id;
  Connection* connection = nullptr;

  std::mutex mu;  // guards everything below
  MemberView view;
  int64_t interval_ms = 0;
  int64_t state_step = -1;
  int64_t progress_step = 0;
  bool killed = false;
  bool leaving = false;
  std::unique_ptr<grpc::ClientContext> join_context;
  v1::JoinRequest join_request;
  grpc::ByteBuffer join_request_bytes;
  grpc::ByteBuffer join_response_bytes;
  v1::JoinResponse join_response;  // the fields DecodeOwnFields takes
  std::shared_ptr<HeartbeatCall> heartbeat;
};

// One member's heartbeat stream for one generation. The load generator's ticker calls Beat from
// outside the reactions, so the call is held open (AddHold) until the stream ends or is
// cancelled; `mu_` orders Beat against that release.
class SimulatedMembers::HeartbeatCall
    : public grpc::ClientBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
 public:
  HeartbeatCall(SimulatedMembers* owner, Member* member, int64_t generation, bool progress)
      : owner_(owner), member_(member), generation_(generation), progress_(progress) {}

  static std::shared_ptr<HeartbeatCall> Start(SimulatedMembers* owner, Member* member,
                                              int64_t generation, bool progress) {
    auto call = std::make_shared<HeartbeatCall>(owner, member, generation, progress);
    call->self_ = call;
    call->context_.AddMetadata(kTokenMetadataKey, member->token);
    // Named in the metadata, as the worker's client names itself (wire.h).
    call->context_.AddMetadata(kJobMetadataKey, member->job);
    call->context_.AddMetadata(kMemberMetadataKey, member->id);
    call->context_.AddMetadata(kGenerationMetadataKey, std::to_string(generation));
    owner->outstanding_.fetch_add(1);
    member->connection->stub->async()->Heartbeat(&call->context_, call.get());
    call->AddHold();
    call->held_ = true;
    call->StartRead(&call->response_);
    call->Beat(/*step=*/-1);  // the first beat at once, as the real client sends it
    call->StartCall();
    return call;
  }

  // Sends a beat unless the previous one is still in flight. step >= 0: with progress.
  void Beat(int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!held_ || writing_.exchange(true)) return;
    request_.Clear();
    request_.set_job(member_->job);
    request_.set_member_id(member_->id);
    request_.set_generation(generation_);
    if (progress_ && step >= 0) {
      v1::Progress* progress = request_.mutable_progress();
      progress->set_step(step);
      progress->set_total_steps(1 << 30);
      progress->set_loss(0.5);
      progress->set_samples_per_second(10000);
      progress->set_scaling_efficiency(0.95);
      progress->set_samples(step * 256);
      progress->set_eval_accuracy(-1);
      progress->set_last_checkpoint_step(-1);
      progress->set_resumed_from_step(-1);
    }
    owner_->beats_.fetch_add(1, std::memory_order_relaxed);
    StartWrite(&request_);
  }

  void Cancel() {
    context_.TryCancel();
    Release();
  }

  void OnWriteDone(bool ok) override {
    if (ok) owner_->BeatWritten(*member_);
    writing_.store(false);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Release();
      return;
    }
    if (response_.kind() == v1::HeartbeatResponse::GENERATION_ENDED) {
      Release();
      owner_->OnGenerationEnded(*member_, generation_);
      return;
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    owner_->Finished();
    auto self = std::move(self_);  // may destroy this at the end of the scope
  }

 private:
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!held_) return;
    held_ = false;
    RemoveHold();
  }

  SimulatedMembers* const owner_;
  Member* const member_;
  const int64_t generation_;
  const bool progress_;
  grpc::ClientContext context_;
  v1::HeartbeatRequest request_;
  v1::HeartbeatResponse response_;
  std::mutex mu_;
  bool held_ = false;
  std::atomic<bool> writing_{false};
  std::shared_ptr<HeartbeatCall> self_;
};

SimulatedMembers::SimulatedMembers(LoadOptions options) : options_(std::move(options)) {
  // As the service does (server.cc): the generator shares the cores with it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  ticker_ = std::thread([this] { Ticker(); });
}

SimulatedMembers::~SimulatedMembers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  ticker_.join();
  for (auto& member : members_) Kill(member->index);
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return outstanding_.load() == 0; });
}

std::vector<int> SimulatedMembers::Add(const std::string& job, const std::string& token,
                                       int count) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> added;
  for (int i = 0; i < count; ++i) {
    const int per_connection = std::max(1, options_.members_per_connection);
    if (members_.size() % per_connection == 0) {
      auto connection = std::make_unique<Connection>();
      connection->channel = NewRendezvousChannel(options_.address, options_.tls_ca_pem,
                                                 /*own_connection=*/true);
      connection->stub = v1::Rendezvous::NewStub(connection->channel);
      connection->generic = std::make_unique<grpc::GenericStub>(connection->channel);
      connections_.push_back(std::move(connection));
    }
    auto member = std::make_unique<Member>();
    member->index = static_cast<int>(members_.size());
    member->job = job;
    member->token = token;
    member->id = job + "-m" + std::to_string(i);
    member->connection = connections_.back().get();
    added.push_back(member->index);
    members_.push_back(std::move(member));
  }
  return added;
}

bool SimulatedMembers::PreConnect(int64_t timeout_ms) {
  std::vector<grpc::Channel*> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& connection : connections_) channels.push_back(connection->channel.get());
  }
  for (grpc::Channel* channel : channels) channel->GetState(/*try_to_connect=*/true);
  const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (grpc::Channel* channel : channels) {
    if (!channel->WaitForConnected(deadline)) return false;
  }
  return true;
}

void SimulatedMembers::Join(const std::vector<int>& members, int64_t state_step) {
  for (int index : members) {
    Member& member = At(index);
    std::lock_guard<std::mutex> lock(member.mu);
    member.state_step = state_step;
    StartJoin(member, state_step);
  }
}

// Under member.mu.
void SimulatedMembers::StartJoin(Member& member, int64_t state_step) {
  member.join_context = std::make_unique<grpc::ClientContext>();
  member.join_context->AddMetadata(kTokenMetadataKey, member.token);
  member.join_context->set_deadline(std::chrono::system_clock::now() +
                                    std::chrono::milliseconds(options_.join_timeout_ms +
                                                              kCallMarginMs));
  member.join_request.Clear();
  member.join_request.set_job(member.job);
  member.join_request.set_member_id(member.id);
  member.join_request.set_host("10.0." + std::to_string(member.index / 250 % 250) + "." +
                               std::to_string(member.index % 250 + 1));
  member.join_request.set_state_step(state_step);
  member.join_request.set_timeout_ms(options_.join_timeout_ms);
  member.join_request.set_without_members(true);  // as the worker's client asks
  member.join_response.Clear();
  const grpc::Slice request(member.join_request.SerializeAsString());
  member.join_request_bytes = grpc::ByteBuffer(&request, 1);
  member.join_response_bytes.Clear();
  outstanding_.fetch_add(1);
  member.connection->generic->UnaryCall(
      member.join_context.get(), kJoinMethod, grpc::StubOptions(), &member.join_request_bytes,
      &member.join_response_bytes, [this, &member](grpc::Status status) {
        if (status.ok()) {
          join_answer_bytes_ += static_cast<int64_t>(member.join_response_bytes.Length());
        }
        if (status.ok() && !DecodeOwnFields(member.join_response_bytes, member.join_response)) {
          status = grpc::Status(grpc::StatusCode::INTERNAL, "malformed JoinResponse");
        }
        OnJoined(member, status.ok() ? std::string() : FromGrpcStatus(status).ToString());
        Finished();
      });
}

void SimulatedMembers::OnJoined(Member& member, const std::string& status_error) {
  {
    std::lock_guard<std::mutex> lock(member.mu);
    if (!status_error.empty()) {
      if (member.view.error.empty() && !member.killed) member.view.error = "join: " + status_error;
    } else {
      member.view.generation = member.join_response.generation();
      member.view.rank = member.join_response.rank();
      member.view.world_size = member.join_response.world_size();
      member.view.assigned_at = Clock::now();
      // Rank 0 has new progress at every beat; the others have none, and beat at the idle
      // interval, as the worker's client does.
      member.interval_ms = member.view.rank == 0
                               ? member.join_response.heartbeat_interval_ms()
                               : std::max(member.join_response.heartbeat_idle_interval_ms(),
                                          member.join_response.heartbeat_interval_ms());
      if (!member.killed) {
        member.heartbeat = HeartbeatCall::Start(this, &member, member.view.generation,
                                                /*progress=*/member.view.rank == 0);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  changed_.notify_all();
}

void SimulatedMembers::OnGenerationEnded(Member& member, int64_t generation) {
  std::lock_guard<std::mutex> lock(member.mu);
  member.view.generations_ended++;
  member.heartbeat.reset();
  if (member.killed || member.leaving || member.view.generation != generation) return;
  StartJoin(member, member.state_step);
}

bool SimulatedMembers::AwaitGeneration(const std::vector<int>& members, int64_t after,
                                       int64_t timeout_ms) {
  auto holds = [&] {
    for (int index : members) {
      Member& member = *members_.at(index);
      std::lock_guard<std::mutex> lock(member.mu);
      if (member.view.generation <= after) return false;
    }
    return true;
  };
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), holds);
}

SimulatedMembers::Member& SimulatedMembers::At(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return *members_.at(index);
}

void SimulatedMembers::BeatWritten(Member& member) {
  {
    std::lock_guard<std::mutex> lock(member.mu);
    member.view.beats_written++;
  }
  std::lock_guard<std::mutex> lock(mu_);
  changed_.notify_all();
}

bool SimulatedMembers::AwaitBeats(int index, int64_t beats, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  Member& member = *members_.at(index);
  return changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    std::lock_guard<std::mutex> member_lock(member.mu);
    return member.view.beats_written >= beats;
  });
}

void SimulatedMembers::Kill(int index) {
  Member& member = At(index);
  std::shared_ptr<HeartbeatCall> heartbeat;
  grpc::ClientContext* join = nullptr;
  {
    std::lock_guard<std::mutex> lock(member.mu);
    member.killed = true;
    join = member.join_context.get();  // stays: a killed member starts no other join
    heartbeat = std::move(member.heartbeat);
  }
  // Outside member.mu: a cancellation may finish its call on this thread.
  if (join != nullptr) join->TryCancel();
  if (heartbeat != nullptr) heartbeat->Cancel();
}

bool SimulatedMembers::Leave(const std::vector<int>& members, bool completed,
                             int64_t timeout_ms) {
  using LeaveCall = UnaryCall<v1::LeaveRequest, v1::LeaveResponse>;
  auto pending = std::make_shared<std::atomic<int>>(static_cast<int>(members.size()));
  auto failed = std::make_shared<std::atomic<bool>>(false);
  for (int index : members) {
    Member& member = At(index);
    std::shared_ptr<HeartbeatCall> heartbeat;
    auto call = NewCall<LeaveCall>(member.token, member.job, timeout_ms);
    call->request.set_member_id(member.id);
    call->request.set_completed(completed);
    {
      std::lock_guard<std::mutex> lock(member.mu);
      member.leaving = true;
      heartbeat = member.heartbeat;
    }
    outstanding_.fetch_add(1);
    member.connection->stub->async()->Leave(
        &call->context, &call->request, &call->response,
        [this, call, heartbeat, pending, failed, &member](grpc::Status status) {
          {
            std::lock_guard<std::mutex> lock(member.mu);
            if (status.ok()) {
              member.view.left = true;
            } else {
              failed->store(true);
              if (member.view.error.empty()) {
                member.view.error = "leave: " + FromGrpcStatus(status).ToString();
              }
            }
          }
          // A completed member closes its stream after leaving, as the real client does.
          if (heartbeat != nullptr) heartbeat->Cancel();
          pending->fetch_sub(1);
          {
            std::lock_guard<std::mutex> lock(mu_);
            changed_.notify_all();
          }
          Finished();
        });
  }
  std::unique_lock<std::mutex> lock(mu_);
  const bool answered = changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                          [&] { return pending->load() == 0; });
  return answered && !failed->load();
}

void SimulatedMembers::StoreSet(int index, const std::string& key, const std::string& value,
                                std::function<void(const Status&)> done) {
  using SetCall = UnaryCall<v1::StoreSetRequest, v1::StoreSetResponse>;
  Member& member = At(index);
  auto call = NewCall<SetCall>(member.token, member.job, options_.join_timeout_ms);
  call->request.set_generation(View(index).generation);
  call->request.set_key(key);
  call->request.set_value(value);
  outstanding_.fetch_add(1);
  member.connection->stub->async()->StoreSet(
      &call->context, &call->request, &call->response,
      [this, call, done = std::move(done)](grpc::Status status) {
        done(FromGrpcStatus(status));
        Finished();
      });
}

void SimulatedMembers::StoreGet(
    int index, const std::vector<std::string>& keys, int64_t timeout_ms,
    std::function<void(const Status&, std::vector<std::string> values)> done) {
  using GetCall = UnaryCall<v1::StoreGetRequest, v1::StoreGetResponse>;
  Member& member = At(index);
  auto call = NewCall<GetCall>(member.token, member.job, timeout_ms + kCallMarginMs);
  call->request.set_generation(View(index).generation);
  for (const auto& key : keys) call->request.add_keys(key);
  call->request.set_timeout_ms(timeout_ms);
  outstanding_.fetch_add(1);
  member.connection->stub->async()->StoreGet(
      &call->context, &call->request, &call->response,
      [this, call, done = std::move(done)](grpc::Status status) {
        std::vector<std::string> values(call->response.values().begin(),
                                        call->response.values().end());
        done(FromGrpcStatus(status), std::move(values));
        Finished();
      });
}

MemberView SimulatedMembers::View(int index) const {
  Member& member = At(index);
  std::lock_guard<std::mutex> lock(member.mu);
  return member.view;
}

Clock::time_point SimulatedMembers::LatestAssignment(const std::vector<int>& members) const {
  Clock::time_point latest{};
  for (int index : members) latest = std::max(latest, View(index).assigned_at);
  return latest;
}

std::vector<std::string> SimulatedMembers::Errors(const std::vector<int>& members) const {
  std::vector<std::string> errors;
  for (int index : members) {
    MemberView view = View(index);
    if (!view.error.empty()) errors.push_back(At(index).id + ": " + view.error);
  }
  return errors;
}

int64_t SimulatedMembers::join_answer_bytes() const { return join_answer_bytes_.load(); }

int64_t SimulatedMembers::beats_sent() const { return beats_.load(); }

void SimulatedMembers::Finished() {
  if (outstanding_.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> lock(mu_);
    changed_.notify_all();
  }
}

// Every kTickMs, beats the members whose slot of their interval this is: member i beats at
// offset (i mod slots) * kTickMs of each interval, so beats are spread as independent workers'
// would be, not sent in one burst.
void SimulatedMembers::Ticker() {
  int64_t tick = 0;
  auto next = Clock::now();
  std::vector<Member*> members;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (changed_.wait_until(lock, next, [this] { return stopping_; })) return;
      members.clear();
      for (auto& member : members_) members.push_back(member.get());
    }
    next += std::chrono::milliseconds(kTickMs);
    ++tick;
    for (Member* member : members) {
      std::shared_ptr<HeartbeatCall> heartbeat;
      int64_t step = -1;
      {
        std::lock_guard<std::mutex> lock(member->mu);
        if (member->heartbeat == nullptr || member->interval_ms <= 0) continue;
        const int64_t slots = std::max<int64_t>(1, member->interval_ms / kTickMs);
        if (tick % slots != member->index % slots) continue;
        heartbeat = member->heartbeat;
        if (member->view.rank == 0) step = ++member->progress_step;
      }
      heartbeat->Beat(step);
    }
  }
}

}  // namespace lockstep::rendezvous::load
