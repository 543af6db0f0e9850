// The rendezvous service on gRPC's callback API: the transport around JobState (job_state.h),
// which decides everything about membership, generations and the store.
//
// Threading. No call holds a thread while it waits: a Join held until its generation forms, a
// StoreGet waiting for keys and a heartbeat stream are each a reactor object that gRPC's own
// threads call into when something happens on the wire. Everything timed (join deadlines, the
// last-call window, heartbeat timeouts, store waits) is a WakeAt from the state machine, run as
// an entry in one TimerQueue per server that ticks the job.
//
// Locking. Each job has one mutex, `Job::mu_`, that guards its JobState and the maps from the
// state machine's call and stream ids to reactors. A reactor is never finished while that mutex
// is held: the state machine's actions become closures while locked and run after unlocking,
// because finishing may run gRPC code that calls straight back into the job (OnCancel,
// OnReadDone) and would deadlock. Reactors are owned by shared_ptrs (a reactor holds itself
// until gRPC's OnDone), so a closure that runs after its call went away finds a live object
// whose "finish once" flag makes the late finish a no-op.
#include "common/rendezvous/server.h"

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <variant>

#include "common/deadline.h"
#include "common/logging.h"
#include "common/rendezvous/job_state.h"
#include "common/rendezvous/timer_queue.h"
#include "common/rendezvous/wire.h"
#include "proto/rendezvous.grpc.pb.h"

namespace lockstep::rendezvous {
namespace {

using Clock = Deadline::Clock;

std::string TokenFromMetadata(const grpc::CallbackServerContext* context) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kTokenMetadataKey);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

// A unary call that may be held (Join, StoreGet) and finished later from any thread, exactly once.
// Its response is a message (StoreGet) or, for a method served raw (Join), encoded bytes.
class HeldCall : public grpc::ServerUnaryReactor, public std::enable_shared_from_this<HeldCall> {
 public:
  static std::shared_ptr<HeldCall> Create(google::protobuf::Message* response) {
    std::shared_ptr<HeldCall> call(new HeldCall(response, nullptr));
    call->self_ = call;
    return call;
  }
  static std::shared_ptr<HeldCall> CreateRaw(grpc::ByteBuffer* response) {
    std::shared_ptr<HeldCall> call(new HeldCall(nullptr, response));
    call->self_ = call;
    return call;
  }

  // Runs when the client goes away or its deadline passes; the owner removes the call from its
  // waiting list. Set before the reactor is handed to gRPC.
  void set_on_cancel(std::function<void()> on_cancel) { on_cancel_ = std::move(on_cancel); }

  // Finishes the call with `status` (and, when OK, a copy of `response`). Later calls do nothing.
  // Callers hold a shared_ptr, so OnDone running inside Finish cannot destroy the object under
  // them; Finish runs outside mu_ for the same reason.
  void Complete(const grpc::Status& status, const google::protobuf::Message* response = nullptr) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    if (status.ok() && response != nullptr) response_->CopyFrom(*response);
    Finish(status);
  }

  // Complete for a raw call: `response` holds the encoded message (its slices are shared).
  void CompleteRaw(const grpc::Status& status, const grpc::ByteBuffer& response) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    if (status.ok()) *raw_response_ = response;
    Finish(status);
  }

  void OnCancel() override {
    if (on_cancel_) on_cancel_();
    Complete(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled by the client"));
  }

  void OnDone() override {
    auto self = std::move(self_);  // may destroy this at the end of the scope
  }

 private:
  HeldCall(google::protobuf::Message* response, grpc::ByteBuffer* raw_response)
      : response_(response), raw_response_(raw_response) {}

  std::mutex mu_;
  bool finished_ = false;
  google::protobuf::Message* response_;  // owned by gRPC, valid until OnDone
  grpc::ByteBuffer* raw_response_;       // the same, for a raw call
  std::function<void()> on_cancel_;
  std::shared_ptr<HeldCall> self_;
};

class Job;
class RendezvousServerImpl;

// One member's heartbeat stream for one generation. The first beat names the job, the member and
// the generation; every later beat must name the same ones.
class HeartbeatStream : public grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>,
                        public std::enable_shared_from_this<HeartbeatStream> {
 public:
  static HeartbeatStream* Create(RendezvousServerImpl* server,
                                 grpc::CallbackServerContext* context) {
    static std::atomic<StreamId> next_id{1};
    std::shared_ptr<HeartbeatStream> stream(new HeartbeatStream(server, context, next_id++));
    stream->self_ = stream;
    stream->StartRead(&stream->request_);
    return stream.get();
  }

  // Tells the member that `generation` is over and closes the stream. Any thread; once.
  // Callers hold a shared_ptr; Finish runs outside mu_ (see HeldCall::Complete).
  void EndGeneration(int64_t generation, const std::string& reason, bool member_lost) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    response_.set_kind(v1::HeartbeatResponse::GENERATION_ENDED);
    response_.set_generation(generation);
    response_.set_reason(reason);
    response_.set_member_lost(member_lost);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }

  // Closes the stream with `status` without a message. Any thread; once.
  void Close(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(status);
  }

  // How the job's state machine names this stream.
  StreamId id() const { return id_; }

  void OnReadDone(bool ok) override;
  void OnCancel() override;
  void OnWriteDone(bool ok) override {}
  void OnDone() override {
    auto self = std::move(self_);  // may destroy this at the end of the scope
  }

 private:
  HeartbeatStream(RendezvousServerImpl* server, grpc::CallbackServerContext* context, StreamId id)
      : server_(server), token_(TokenFromMetadata(context)), id_(id) {}

  // The client closed or broke the stream: the job decides whether that ends the generation.
  void HandleClosed(const std::string& how);

  RendezvousServerImpl* server_;
  const std::string token_;
  const StreamId id_;
  v1::HeartbeatRequest request_;
  std::mutex mu_;  // guards finished_, starting reads, and the identity below
  bool finished_ = false;
  v1::HeartbeatResponse response_;
  // Set by the first beat (under mu_, since OnCancel may read them on another thread).
  std::weak_ptr<Job> job_;
  std::string member_id_;
  int64_t generation_ = -1;
  std::atomic<bool> closed_reported_{false};
  std::shared_ptr<HeartbeatStream> self_;
};

// One job: its JobState behind a mutex, and the calls and streams its actions name. Every public
// method locks mu_, feeds one event to the state machine, turns the resulting actions into
// closures while still locked (the ids are looked up under mu_), and runs them after unlocking.
class Job : public std::enable_shared_from_this<Job> {
 public:
  Job(JobConfig config, TimerQueue* timers) : state_(std::move(config)), timers_(timers) {}

  // Immutable after construction: safe to read without mu_.
  const JobConfig& config() const { return state_.config(); }

  void Join(const std::shared_ptr<HeldCall>& call, const v1::JoinRequest& request);
  void Beat(const std::shared_ptr<HeartbeatStream>& stream, const v1::HeartbeatRequest& request);
  void StreamClosed(const std::shared_ptr<HeartbeatStream>& stream, const std::string& member_id,
                    int64_t generation, const std::string& how);
  Status Leave(const v1::LeaveRequest& request);
  void RemoveMember(const std::string& member_id, const std::string& reason);
  Status StoreSet(const v1::StoreSetRequest& request);
  StatusOr<int64_t> StoreAdd(const v1::StoreAddRequest& request);
  void StoreGet(const std::shared_ptr<HeldCall>& call, const v1::StoreGetRequest& request);
  JobSnapshot Snapshot() const;
  // Finishes every held call and stream with `status`; later calls are refused with it.
  void Close(const Status& status);

 private:
  using Closures = std::vector<std::function<void()>>;

  // Registers a held call under a new id; its cancellation reaches `cancel` on the state machine.
  CallId HoldCall(const std::shared_ptr<HeldCall>& call,
                  void (JobState::*cancel)(CallId call));
  void Tick();
  // Under mu_: what `actions` mean for the calls and streams, to run after unlocking.
  Closures Resolve(Actions& actions);
  std::shared_ptr<HeldCall> TakeCall(CallId id);
  std::shared_ptr<HeartbeatStream> TakeStream(StreamId id);
  // Under mu_: the members list of `members`' formation as JoinResponse field 4, encoded once
  // and shared by every answer of that formation.
  const grpc::Slice& EncodedMembers(const std::shared_ptr<const std::vector<MemberInfo>>& members);

  mutable std::mutex mu_;
  std::shared_ptr<const std::vector<MemberInfo>> encoded_for_;
  grpc::Slice encoded_members_;
  JobState state_;
  TimerQueue* const timers_;
  CallId next_call_ = 1;
  std::map<CallId, std::shared_ptr<HeldCall>> calls_;              // held and not yet answered
  std::map<StreamId, std::weak_ptr<HeartbeatStream>> streams_;  // that the state may name
};

// Refuses a call whose token is no hosted job's from its metadata, before its request is read.
// gRPC's HTTP/2 transport reads a whole message before max_receive_message_length applies
// (grpc/grpc#43012), so without this a stranger's oversized request would be held in full (up to
// the resource quota) before the handler could refuse it. The answer is Authorize's (NOT_FOUND:
// a worker waits it out while a restarted operator registers its jobs again). gRPC takes an
// AuthMetadataProcessor on secure credentials only: TLS, as the operator serves.
class TokenGate : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenGate(const RendezvousServerImpl* server) : server_(server) {}
  bool IsBlocking() const override { return false; }  // a map walk under a short lock
  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed, OutputMetadata* response) override;

 private:
  const RendezvousServerImpl* server_;
};

// Join is served raw (its response is encoded by hand, see Job::Resolve); the rest as messages.
using RendezvousService = v1::Rendezvous::WithRawCallbackMethod_Join<v1::Rendezvous::CallbackService>;

class RendezvousServerImpl : public RendezvousServer, public RendezvousService {
 public:
  RendezvousServerImpl() = default;
  ~RendezvousServerImpl() override { Shutdown(/*deadline_ms=*/1000); }

  Status StartServing(const ServerOptions& options);

  int port() const override { return port_; }
  Status AddJob(const JobConfig& config) override;
  Status RemoveJob(const std::string& job) override;
  void RemoveMember(const std::string& job, const std::string& member_id,
                    const std::string& reason) override;
  StatusOr<JobSnapshot> Snapshot(const std::string& job) const override;
  void Shutdown(int64_t deadline_ms) override;

  // The job named `job` if `token` is its token. An unknown job and a wrong token get the same
  // answer (NOT_FOUND, the same message), so a caller without the token cannot tell which job
  // names exist. NOT_FOUND because a worker must wait it out: a restarted operator hosts its jobs
  // again only once its caches are synced.
  StatusOr<std::shared_ptr<Job>> Authorize(const std::string& token, const std::string& job) const;
  // Whether `token` is some hosted job's (compared in constant time with every job's).
  bool HostsToken(const std::string& token) const;

  // v1::Rendezvous::CallbackService
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>* Heartbeat(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* context,
                                     const v1::StoreSetRequest* request,
                                     v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* context,
                                     const v1::StoreGetRequest* request,
                                     v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext* context,
                                     const v1::StoreAddRequest* request,
                                     v1::StoreAddResponse* response) override;

 private:
  StatusOr<std::shared_ptr<Job>> FindJob(const std::string& job) const;

  TimerQueue timers_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  bool shut_down_ = false;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// ---------------------------------------------------------------------------------------------
// HeartbeatStream

void HeartbeatStream::OnReadDone(bool ok) {
  if (!ok) {
    HandleClosed("heartbeat stream closed");
    Close(grpc::Status::OK);
    return;
  }
  std::shared_ptr<Job> job = job_.lock();
  if (member_id_.empty()) {
    auto authorized = server_->Authorize(token_, request_.job());
    if (!authorized.ok()) {
      Close(ToGrpcStatus(authorized.status()));
      return;
    }
    if (request_.member_id().empty()) {
      Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "heartbeat without member_id"));
      return;
    }
    job = *authorized;
    std::lock_guard<std::mutex> lock(mu_);
    job_ = job;
    member_id_ = request_.member_id();
    generation_ = request_.generation();
  } else if (request_.member_id() != member_id_ || request_.generation() != generation_) {
    Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "a heartbeat stream serves one member in one generation"));
    return;
  }
  if (job == nullptr) {
    Close(grpc::Status(grpc::StatusCode::NOT_FOUND, "job was removed"));
    return;
  }
  job->Beat(shared_from_this(), request_);
  std::lock_guard<std::mutex> lock(mu_);
  if (!finished_) StartRead(&request_);
}

void HeartbeatStream::OnCancel() {
  HandleClosed("heartbeat stream broken");
  Close(grpc::Status(grpc::StatusCode::CANCELLED, "heartbeat stream cancelled"));
}

void HeartbeatStream::HandleClosed(const std::string& how) {
  // OnReadDone(false) and OnCancel may both report the same closure.
  if (closed_reported_.exchange(true)) return;
  std::shared_ptr<Job> job;
  std::string member_id;
  int64_t generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job = job_.lock();
    member_id = member_id_;
    generation = generation_;
  }
  if (job != nullptr) job->StreamClosed(shared_from_this(), member_id, generation, how);
}

// ---------------------------------------------------------------------------------------------
// Job

CallId Job::HoldCall(const std::shared_ptr<HeldCall>& call,
                     void (JobState::*cancel)(CallId call)) {
  const CallId id = next_call_++;
  calls_.emplace(id, call);
  std::weak_ptr<Job> weak = weak_from_this();
  call->set_on_cancel([weak, id, cancel] {
    auto job = weak.lock();
    if (job == nullptr) return;
    std::lock_guard<std::mutex> lock(job->mu_);
    (job->state_.*cancel)(id);  // HeldCall::OnCancel finishes the call itself
    job->calls_.erase(id);
  });
  return id;
}

std::shared_ptr<HeldCall> Job::TakeCall(CallId id) {
  auto it = calls_.find(id);
  if (it == calls_.end()) return nullptr;  // cancelled meanwhile
  auto call = std::move(it->second);
  calls_.erase(it);
  return call;
}

std::shared_ptr<HeartbeatStream> Job::TakeStream(StreamId id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return nullptr;
  auto stream = it->second.lock();
  streams_.erase(it);
  return stream;
}

Job::Closures Job::Resolve(Actions& actions) {
  Closures closures;
  for (auto& action : actions) {
    if (auto* answer = std::get_if<AnswerJoin>(&action)) {
      auto call = TakeCall(answer->call);
      if (call == nullptr) continue;
      if (!answer->status.ok()) {
        closures.push_back(
            [call, status = ToGrpcStatus(answer->status)] { call->Complete(status); });
        continue;
      }
      // The answer is this member's fields followed by the generation's shared member list:
      // protobuf reads fields in any order and appends repeated ones, so the two encodings
      // concatenated are one JoinResponse.
      const std::string own = ToProto(answer->assignment).SerializeAsString();
      grpc::Slice slices[2] = {grpc::Slice(own), EncodedMembers(answer->members)};
      auto response = std::make_shared<grpc::ByteBuffer>(slices, 2);
      closures.push_back([call, response] { call->CompleteRaw(grpc::Status::OK, *response); });
    } else if (auto* answer = std::get_if<AnswerStoreGet>(&action)) {
      auto call = TakeCall(answer->call);
      if (call == nullptr) continue;
      auto response = std::make_shared<v1::StoreGetResponse>();
      for (auto& value : answer->values) response->add_values(std::move(value));
      closures.push_back([call, status = ToGrpcStatus(answer->status), response] {
        call->Complete(status, response.get());
      });
    } else if (auto* end = std::get_if<EndStream>(&action)) {
      auto stream = TakeStream(end->stream);
      if (stream == nullptr) continue;
      closures.push_back([stream, end = std::move(*end)] {
        stream->EndGeneration(end.generation, end.reason, end.member_lost);
      });
    } else if (auto* close = std::get_if<CloseStream>(&action)) {
      auto stream = TakeStream(close->stream);
      if (stream == nullptr) continue;
      closures.push_back(
          [stream, status = ToGrpcStatus(close->status)] { stream->Close(status); });
    } else if (auto* wake = std::get_if<WakeAt>(&action)) {
      std::weak_ptr<Job> weak = weak_from_this();
      timers_->Schedule(wake->at, [weak] {
        if (auto job = weak.lock()) job->Tick();
      });
    }
  }
  actions.clear();
  return closures;
}

const grpc::Slice& Job::EncodedMembers(
    const std::shared_ptr<const std::vector<MemberInfo>>& members) {
  if (members != encoded_for_) {
    encoded_for_ = members;
    encoded_members_ = grpc::Slice(
        MembersToProto(members != nullptr ? *members : std::vector<MemberInfo>{})
            .SerializeAsString());
  }
  return encoded_members_;
}

void RunClosures(const std::vector<std::function<void()>>& closures) {
  for (const auto& closure : closures) closure();
}

void Job::Tick() {
  Closures closures;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Actions actions;
    state_.Tick(Clock::now(), actions);
    closures = Resolve(actions);
  }
  RunClosures(closures);
}

void Job::Join(const std::shared_ptr<HeldCall>& call, const v1::JoinRequest& request) {
  Closures closures;
  {
    std::lock_guard<std::mutex> lock(mu_);
    JoinArgs join;
    join.member_id = request.member_id();
    join.host = request.host();
    join.state_step = request.state_step();
    join.timeout_ms = request.timeout_ms();
    join.pod = request.pod();
    join.local_rank = request.local_rank();
    Actions actions;
    state_.Join(HoldCall(call, &JobState::CancelJoin), join, Clock::now(), actions);
    closures = Resolve(actions);
  }
  RunClosures(closures);
}

void Job::Beat(const std::shared_ptr<HeartbeatStream>& stream,
               const v1::HeartbeatRequest& request) {
  Closures closures;
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams_[stream->id()] = stream;
    BeatArgs beat;
    beat.member_id = request.member_id();
    beat.generation = request.generation();
    if (request.has_progress()) beat.progress = FromProto(request.progress());
    Actions actions;
    state_.Beat(stream->id(), beat, Clock::now(), actions);
    closures = Resolve(actions);
  }
  RunClosures(closures);
}

void Job::StreamClosed(const std::shared_ptr<HeartbeatStream>& stream, const std::string& member_id,
                       int64_t generation, const std::string& how) {
  Closures closures;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Actions actions;
    state_.StreamClosed(stream->id(), member_id, generation, how, Clock::now(), actions);
    streams_.erase(stream->id());
    closures = Resolve(actions);
  }
  RunClosures(closures);
}

Status Job::Leave(const v1::LeaveRequest& request) {
  Closures closures;
  Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    LeaveArgs leave;
    leave.member_id = request.member_id();
    leave.completed = request.completed();
    if (request.has_progress()) leave.progress = FromProto(request.progress());
    Actions actions;
    status = state_.Leave(leave, Clock::now(), actions);
    closures = Resolve(actions);
  }
  RunClosures(closures);
  return status;
}

void Job::RemoveMember(const std::string& member_id, const std::string& reason) {
  Closures closures;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Actions actions;
    state_.RemoveMember(member_id, reason, Clock::now(), actions);
    closures = Resolve(actions);
  }
  RunClosures(closures);
}

Status Job::StoreSet(const v1::StoreSetRequest& request) {
  Closures closures;
  Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Actions actions;
    status = state_.StoreSet(request.generation(), request.key(), request.value(), actions);
    closures = Resolve(actions);
  }
  RunClosures(closures);
  return status;
}

StatusOr<int64_t> Job::StoreAdd(const v1::StoreAddRequest& request) {
  Closures closures;
  StatusOr<int64_t> value = int64_t{0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    Actions actions;
    value = state_.StoreAdd(request.generation(), request.key(), request.delta(), actions);
    closures = Resolve(actions);
  }
  RunClosures(closures);
  return value;
}

void Job::StoreGet(const std::shared_ptr<HeldCall>& call, const v1::StoreGetRequest& request) {
  if (request.value_offset() < 0 || request.value_length() < 0) {
    call->Complete(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                "store get: value_offset and value_length must be >= 0"));
    return;
  }
  Closures closures;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::vector<std::string> keys(request.keys().begin(), request.keys().end());
    const ByteRange range{static_cast<size_t>(request.value_offset()),
                          static_cast<size_t>(request.value_length())};
    Actions actions;
    state_.StoreGet(HoldCall(call, &JobState::CancelStoreGet), request.generation(), keys,
                    request.timeout_ms(), Clock::now(), actions, range);
    closures = Resolve(actions);
  }
  RunClosures(closures);
}

JobSnapshot Job::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.Snapshot();
}

void Job::Close(const Status& status) {
  Closures closures;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Actions actions;
    state_.Close(status, Clock::now(), actions);
    closures = Resolve(actions);
  }
  RunClosures(closures);
}

// ---------------------------------------------------------------------------------------------
// RendezvousServerImpl

Status RendezvousServerImpl::StartServing(const ServerOptions& options) {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (options.tls_cert_pem.empty() != options.tls_key_pem.empty()) {
    return InvalidArgumentError("rendezvous server: TLS needs both a certificate and a key");
  }
  if (!options.tls_cert_pem.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
    credentials = grpc::SslServerCredentials(ssl);
    credentials->SetAuthMetadataProcessor(std::make_shared<TokenGate>(this));
  } else {
    credentials = grpc::InsecureServerCredentials();
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, credentials, &port_);
  builder.RegisterService(this);
  // Clients keep idle connections alive with pings (a Join may wait minutes without traffic);
  // accept them instead of answering with GOAWAY "too_many_pings".
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Bounds on what one client can make the service hold: a request is at most what the protocol
  // needs (kMaxRendezvousRequestBytes, server.h), and the quota bounds the memory of every
  // connection's buffers together, so many large requests at once are refused instead of growing
  // the operator.
  builder.SetMaxReceiveMessageSize(kMaxRendezvousRequestBytes);
  grpc::ResourceQuota quota("lockstep-rendezvous");
  quota.Resize(kRendezvousMemoryQuotaBytes);
  builder.SetResourceQuota(quota);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return UnavailableError("rendezvous server: cannot listen on " + options.listen_address);
  }
  LOCKSTEP_LOG(INFO) << "rendezvous service listening on port " << port_
                     << (options.tls_cert_pem.empty() ? " (plaintext)" : " (TLS)");
  return OkStatus();
}

Status RendezvousServerImpl::AddJob(const JobConfig& config) {
  if (config.job.empty()) return InvalidArgumentError("rendezvous job: name is empty");
  if (config.token.empty()) {
    return InvalidArgumentError("rendezvous job " + config.job + ": token is empty");
  }
  if (config.min_members < 1 || config.max_members < config.min_members) {
    return InvalidArgumentError(
        "rendezvous job " + config.job + ": need 1 <= min_members <= max_members, got " +
        std::to_string(config.min_members) + ".." + std::to_string(config.max_members));
  }
  if (config.initial_members != 0 && (config.initial_members < config.min_members ||
                                      config.initial_members > config.max_members)) {
    return InvalidArgumentError("rendezvous job " + config.job +
                                ": initial_members must lie in min_members..max_members");
  }
  if (config.ranks_per_pod < 1) {
    return InvalidArgumentError("rendezvous job " + config.job + ": ranks_per_pod must be >= 1, got " +
                                std::to_string(config.ranks_per_pod));
  }
  if (config.heartbeat_interval_ms <= 0 ||
      config.heartbeat_timeout_ms <= config.heartbeat_interval_ms || config.last_call_ms < 0) {
    return InvalidArgumentError("rendezvous job " + config.job +
                                ": need 0 < heartbeat_interval_ms < heartbeat_timeout_ms and "
                                "last_call_ms >= 0");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return FailedPreconditionError("rendezvous server is shut down");
  if (jobs_.count(config.job) != 0) {
    return AlreadyExistsError("rendezvous job " + config.job + " already exists");
  }
  jobs_.emplace(config.job, std::make_shared<Job>(config, &timers_));
  LOCKSTEP_LOG(INFO) << "rendezvous: added job " << config.job << " (members " << config.min_members
                     << ".." << config.max_members << ")";
  return OkStatus();
}

Status RendezvousServerImpl::RemoveJob(const std::string& job) {
  std::shared_ptr<Job> removed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return NotFoundError("unknown rendezvous job " + job);
    removed = std::move(it->second);
    jobs_.erase(it);
  }
  removed->Close(NotFoundError("rendezvous job " + job + " was removed"));
  return OkStatus();
}

void RendezvousServerImpl::RemoveMember(const std::string& job, const std::string& member_id,
                                        const std::string& reason) {
  auto found = FindJob(job);
  if (found.ok()) (*found)->RemoveMember(member_id, reason);
}

StatusOr<JobSnapshot> RendezvousServerImpl::Snapshot(const std::string& job) const {
  LOCKSTEP_ASSIGN_OR_RETURN(auto found, FindJob(job));
  return found->Snapshot();
}

void RendezvousServerImpl::Shutdown(int64_t deadline_ms) {
  std::map<std::string, std::shared_ptr<Job>> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    jobs.swap(jobs_);
  }
  // Finish every held call first, so that gRPC's shutdown has nothing left to wait for.
  for (auto& [name, job] : jobs) {
    job->Close(UnavailableError("rendezvous service is shutting down"));
  }
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  }
  timers_.Stop();
}

StatusOr<std::shared_ptr<Job>> RendezvousServerImpl::FindJob(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return UnavailableError("rendezvous service is shutting down");
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return NotFoundError("unknown rendezvous job " + job);
  return it->second;
}

bool RendezvousServerImpl::HostsToken(const std::string& token) const {
  std::lock_guard<std::mutex> lock(mu_);
  bool hosted = false;
  for (const auto& [name, job] : jobs_) hosted |= TokensEqual(job->config().token, token);
  return hosted;
}

grpc::Status TokenGate::Process(const InputMetadata& metadata, grpc::AuthContext* context,
                                OutputMetadata* consumed, OutputMetadata* response) {
  auto it = metadata.find(kTokenMetadataKey);
  if (it != metadata.end() && server_->HostsToken(std::string(it->second.data(), it->second.size()))) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::NOT_FOUND, "no rendezvous job with this token here");
}

StatusOr<std::shared_ptr<Job>> RendezvousServerImpl::Authorize(const std::string& token,
                                                               const std::string& job) const {
  StatusOr<std::shared_ptr<Job>> found = FindJob(job);
  if (found.ok() && TokensEqual((*found)->config().token, token)) return found;
  if (!found.ok() && found.status().code() != StatusCode::kNotFound) return found.status();
  return NotFoundError("no rendezvous job " + job + " with this token here");
}

grpc::ServerUnaryReactor* RendezvousServerImpl::Join(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  auto call = HeldCall::CreateRaw(response);
  grpc::ByteBuffer bytes(*request);  // shares the slices; deserializing consumes them
  v1::JoinRequest parsed;
  if (!grpc::SerializationTraits<v1::JoinRequest>::Deserialize(&bytes, &parsed).ok()) {
    call->Complete(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "join: malformed request"));
    return call.get();
  }
  auto job = Authorize(TokenFromMetadata(context), parsed.job());
  if (!job.ok()) {
    call->Complete(ToGrpcStatus(job.status()));
  } else {
    (*job)->Join(call, parsed);
  }
  return call.get();
}

grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>*
RendezvousServerImpl::Heartbeat(grpc::CallbackServerContext* context) {
  return HeartbeatStream::Create(this, context);
}

grpc::ServerUnaryReactor* RendezvousServerImpl::Leave(grpc::CallbackServerContext* context,
                                                      const v1::LeaveRequest* request,
                                                      v1::LeaveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto job = Authorize(TokenFromMetadata(context), request->job());
  reactor->Finish(ToGrpcStatus(job.ok() ? (*job)->Leave(*request) : job.status()));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousServerImpl::StoreSet(grpc::CallbackServerContext* context,
                                                         const v1::StoreSetRequest* request,
                                                         v1::StoreSetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto job = Authorize(TokenFromMetadata(context), request->job());
  reactor->Finish(ToGrpcStatus(job.ok() ? (*job)->StoreSet(*request) : job.status()));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousServerImpl::StoreGet(grpc::CallbackServerContext* context,
                                                         const v1::StoreGetRequest* request,
                                                         v1::StoreGetResponse* response) {
  auto call = HeldCall::Create(response);
  auto job = Authorize(TokenFromMetadata(context), request->job());
  if (!job.ok()) {
    call->Complete(ToGrpcStatus(job.status()));
  } else {
    (*job)->StoreGet(call, *request);
  }
  return call.get();
}

grpc::ServerUnaryReactor* RendezvousServerImpl::StoreAdd(grpc::CallbackServerContext* context,
                                                         const v1::StoreAddRequest* request,
                                                         v1::StoreAddResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto job = Authorize(TokenFromMetadata(context), request->job());
  if (!job.ok()) {
    reactor->Finish(ToGrpcStatus(job.status()));
    return reactor;
  }
  auto value = (*job)->StoreAdd(*request);
  if (value.ok()) response->set_value(*value);
  reactor->Finish(ToGrpcStatus(value.status()));
  return reactor;
}

}  // namespace

StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(const ServerOptions& options) {
  // Debian's Abseil checks every absl::Mutex acquisition for lock-order cycles (a debugging aid
  // gRPC's locks go through): 12% of the service's CPU at 10,000 heartbeating members, measured
  // with perf (docs/benchmarks.md). Production builds of Abseil leave it off; so does the service.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  auto server = std::make_unique<RendezvousServerImpl>();
  LOCKSTEP_RETURN_IF_ERROR(server->StartServing(options));
  return std::unique_ptr<RendezvousServer>(std::move(server));
}

}  // namespace lockstep::rendezvous
