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
#include <malloc.h>

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "common/logging.h"
#include "common/rendezvous/job_state.h"
#include "common/rendezvous/server_calls.h"
#include "common/rendezvous/server_job.h"
#include "common/rendezvous/timer_queue.h"
#include "common/rendezvous/wire.h"
#include "proto/rendezvous.grpc.pb.h"

namespace lockstep::rendezvous {
namespace {

using internal::HeartbeatStream;
using internal::HeldCall;
using internal::Job;
using internal::JobDirectory;
using internal::TokenFromMetadata;

class RendezvousServerImpl;

constexpr int64_t kMemoryCheckMs = 5000;
constexpr int64_t kTrimAfterCalls = 1024;

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

class RendezvousServerImpl : public RendezvousServer,
                             public RendezvousService,
                             public JobDirectory {
 public:
  RendezvousServerImpl() = default;
  ~RendezvousServerImpl() override { Shutdown(/*deadline_ms=*/1000); }

  Status StartServing(const ServerOptions& options);

  int port() const override { return port_; }
  Status AddJob(const JobConfig& config) override;
  Status RemoveJob(const std::string& job) override;
  void RemoveMember(const std::string& job, const std::string& member_id,
                    const std::string& reason) override;
  void SetPodTopology(const std::string& job, const std::string& pod,
                      TopologyPath path) override;
  StatusOr<JobSnapshot> Snapshot(const std::string& job) const override;
  void Shutdown(int64_t deadline_ms) override;

  // The job named `job` if `token` is its token. An unknown job and a wrong token get the same
  // answer (NOT_FOUND, the same message), so a caller without the token cannot tell which job
  // names exist. NOT_FOUND because a worker must wait it out: a restarted operator hosts its jobs
  // again only once its caches are synced.
  StatusOr<std::shared_ptr<Job>> Authorize(const std::string& token,
                                         const std::string& job) const override;
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

  // Gives back what a burst of calls left in glibc's arenas (a join storm, a store exchange, a
  // large job removed): glibc returns free memory to the system only at the top of each heap, so
  // without this the service would keep a storm's peak for good. Checked every
  // kMemoryCheckMs on the timer thread; trims once kTrimAfterCalls calls came since the last
  // trim, so a steady state of heartbeats alone never trims.
  void ScheduleMemoryCheck();
  std::atomic<int64_t> calls_{0};  // calls and streams opened, and jobs removed (weighted)
  int64_t calls_at_trim_ = 0;      // timer thread only

  TimerQueue timers_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  bool shut_down_ = false;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

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
  // No bandwidth-delay probing: it sizes HTTP/2 windows for bulk transfers, and the protocol's
  // messages are small; its ping and ack per burst of reads were a quarter of the service's CPU
  // at 10,000 heartbeating members (docs/benchmarks.md).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  grpc::ResourceQuota quota("lockstep-rendezvous");
  quota.Resize(kRendezvousMemoryQuotaBytes);
  builder.SetResourceQuota(quota);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return UnavailableError("rendezvous server: cannot listen on " + options.listen_address);
  }
  ScheduleMemoryCheck();
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
  if (config.pods_multiple < 1 || config.min_members % config.pods_multiple != 0 ||
      config.max_members < config.pods_multiple) {
    return InvalidArgumentError(
        "rendezvous job " + config.job + ": pods_multiple " + std::to_string(config.pods_multiple) +
        " must be >= 1, divide min_members (" + std::to_string(config.min_members) +
        ") and not exceed max_members");
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
  calls_ += kTrimAfterCalls;  // what it held is free now: give it back at the next check
  return OkStatus();
}

void RendezvousServerImpl::RemoveMember(const std::string& job, const std::string& member_id,
                                        const std::string& reason) {
  auto found = FindJob(job);
  if (found.ok()) (*found)->RemoveMember(member_id, reason);
}

void RendezvousServerImpl::SetPodTopology(const std::string& job, const std::string& pod,
                                          TopologyPath path) {
  auto found = FindJob(job);
  if (found.ok()) (*found)->SetPodTopology(pod, std::move(path));
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

void RendezvousServerImpl::ScheduleMemoryCheck() {
  timers_.ScheduleAfterMs(kMemoryCheckMs, [this] {
    const int64_t calls = calls_.load();
    if (calls - calls_at_trim_ >= kTrimAfterCalls) {
      malloc_trim(0);
      calls_at_trim_ = calls;
    }
    ScheduleMemoryCheck();
  });
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
  ++calls_;
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
  ++calls_;
  return HeartbeatStream::Create(this, context);
}

grpc::ServerUnaryReactor* RendezvousServerImpl::Leave(grpc::CallbackServerContext* context,
                                                      const v1::LeaveRequest* request,
                                                      v1::LeaveResponse* response) {
  ++calls_;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto job = Authorize(TokenFromMetadata(context), request->job());
  reactor->Finish(ToGrpcStatus(job.ok() ? (*job)->Leave(*request) : job.status()));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousServerImpl::StoreSet(grpc::CallbackServerContext* context,
                                                         const v1::StoreSetRequest* request,
                                                         v1::StoreSetResponse* response) {
  ++calls_;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto job = Authorize(TokenFromMetadata(context), request->job());
  reactor->Finish(ToGrpcStatus(job.ok() ? (*job)->StoreSet(*request) : job.status()));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousServerImpl::StoreGet(grpc::CallbackServerContext* context,
                                                         const v1::StoreGetRequest* request,
                                                         v1::StoreGetResponse* response) {
  ++calls_;
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
  ++calls_;
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
