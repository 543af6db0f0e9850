// The rendezvous client on gRPC's synchronous API.
//
// Heartbeat. One session per generation: a writer thread opens the bidi stream (its metadata
// names the member) and beats, with new progress at most every heartbeat_interval_ms, without
// every heartbeat_idle_interval_ms; a reader thread waits for GENERATION_ENDED. Whichever learns
// first that the generation is over (the message, or the stream failing) reports it, once.
// A stream that fails because the service went away (UNAVAILABLE, NOT_FOUND, CANCELLED: a leader
// gone, a new one not hosting the job yet) does not end the generation: the writer opens it again
// until ClientOptions::reconnect_timeout_ms has passed without a service accepting one, and every
// stream's first beat carries the member's place (Resume), so a new service takes the generation
// up (proto/rendezvous.proto, step 4). StopHeartbeat cancels the current call's context, which
// unblocks both threads at once, and joins them.
#include "common/rendezvous/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "common/deadline.h"
#include "common/logging.h"
#include "common/rendezvous/channel.h"
#include "common/rendezvous/wire.h"
#include "proto/rendezvous.grpc.pb.h"

namespace lockstep::rendezvous {
namespace {

// A Join or StoreGet is held by the service for up to its timeout_ms and answered with a
// message that says what was missing; the RPC deadline leaves this much more so that the
// service's answer, not the transport's, reaches the caller.
constexpr int64_t kHeldCallMarginMs = 2000;

// A call that failed this way met no service that knows the job: the service went away (a
// refused or broken connection, a service shutting down) or its successor hosts the job not yet.
bool ServiceWentAway(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::NOT_FOUND ||
         status.error_code() == grpc::StatusCode::CANCELLED;
}

std::chrono::system_clock::time_point DeadlineAfterMs(int64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

class GrpcRendezvousClient;

class GenerationScopedStore : public KeyValueStore {
 public:
  GenerationScopedStore(GrpcRendezvousClient* client, int64_t generation)
      : client_(client), generation_(generation) {}
  Status Set(const std::string& key, const std::string& value, int64_t timeout_ms) override;
  StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                         int64_t timeout_ms) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta, int64_t timeout_ms) override;
  StatusOr<std::vector<std::string>> GetRange(const std::vector<std::string>& keys, size_t offset,
                                              size_t length, int64_t timeout_ms) override;

 private:
  GrpcRendezvousClient* client_;
  const int64_t generation_;
};

// The state of one heartbeat stream; owned by the client, shared with its two threads.
struct HeartbeatSession {
  Assignment assignment;
  int64_t state_step = -1;  // what the member held when it joined (Resume.state_step)
  std::function<void(const GenerationEnd&)> on_generation_ended;
  std::mutex mu;
  std::condition_variable cv;
  std::unique_ptr<grpc::ClientContext> context;  // of the current stream; replaced under mu
  bool stop_requested = false;  // StopHeartbeat
  bool stream_ended = false;    // the reader saw the end of the current stream
  // The first progress set during this generation waits for no beat interval: it is how the
  // service learns that training runs again after a re-formation (recovery time).
  bool first_progress_pending = false;
  bool first_progress_sent = false;
  bool progress_unsent = false;  // progress was set after the latest beat
  uint64_t sent_version = 0;     // the progress_version_ the latest beat carried (writer only)
  uint64_t sent_pace_version = 0;  // the pace_version_ the latest beat carried (writer only)
  std::atomic<bool> reported{false};
  std::thread writer;

  void ReportEnded(const GenerationEnd& end) {
    if (reported.exchange(true)) return;
    if (on_generation_ended) on_generation_ended(end);
  }
};

class GrpcRendezvousClient : public RendezvousClient {
 public:
  GrpcRendezvousClient(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
      : options_(std::move(options)),
        channel_(std::move(channel)),
        stub_(v1::Rendezvous::NewStub(channel_)) {}
  ~GrpcRendezvousClient() override { StopHeartbeat(); }

  StatusOr<Assignment> Join(int64_t state_step, int64_t timeout_ms) override;
  Status StartHeartbeat(const Assignment& a,
                        std::function<void(const GenerationEnd& end)> on_ended) override;
  void StopHeartbeat() override;
  void SetProgress(const ProgressReport& progress) override {
    {
      std::lock_guard<std::mutex> lock(progress_mu_);
      progress_ = progress;
      has_progress_ = true;
      ++progress_version_;
    }
    std::lock_guard<std::mutex> lock(heartbeat_mu_);
    if (heartbeat_ == nullptr) return;
    std::lock_guard<std::mutex> session_lock(heartbeat_->mu);
    if (!heartbeat_->first_progress_sent) {
      heartbeat_->first_progress_pending = true;
    } else if (!heartbeat_->progress_unsent) {
      heartbeat_->progress_unsent = true;
    } else {
      return;  // the writer already knows
    }
    heartbeat_->cv.notify_all();
  }
  void SetPace(int64_t steps, double compute_seconds) override {
    std::lock_guard<std::mutex> lock(progress_mu_);
    pace_.set_steps(steps);
    pace_.set_compute_seconds(compute_seconds);
    ++pace_version_;
  }
  Status Leave(bool completed, const ProgressReport& final_progress) override;
  std::unique_ptr<KeyValueStore> GenerationStore(int64_t generation) override {
    return std::make_unique<GenerationScopedStore>(this, generation);
  }

  Status StoreSet(int64_t generation, const std::string& key, const std::string& value,
                  int64_t timeout_ms);
  // length > 0: the service cuts each value to [offset, offset + length).
  StatusOr<std::vector<std::string>> StoreGet(int64_t generation,
                                              const std::vector<std::string>& keys,
                                              int64_t timeout_ms, size_t offset = 0,
                                              size_t length = 0);
  StatusOr<int64_t> StoreAdd(int64_t generation, const std::string& key, int64_t delta,
                             int64_t timeout_ms);

 private:
  void PrepareContext(grpc::ClientContext* context, int64_t deadline_ms) const {
    context->set_deadline(DeadlineAfterMs(deadline_ms));
    context->AddMetadata(kTokenMetadataKey, options_.token);
  }
  void RunHeartbeat(HeartbeatSession* session);
  // One stream of the session: beats until it ends. Returns its status; *accepted: the service
  // took it (its initial metadata arrived), *ended_by_service: it said the generation ended.
  grpc::Status BeatOnStream(HeartbeatSession* session, bool after_outage, bool* accepted,
                            bool* ended_by_service);

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;

  std::mutex progress_mu_;
  ProgressReport progress_;
  bool has_progress_ = false;
  uint64_t progress_version_ = 0;  // counts SetProgress calls
  v1::Pace pace_;
  uint64_t pace_version_ = 0;  // counts SetPace calls; 0: never set
  std::atomic<int64_t> joined_state_step_{-1};  // the latest Join's state_step

  std::mutex heartbeat_mu_;  // serializes StartHeartbeat/StopHeartbeat
  std::unique_ptr<HeartbeatSession> heartbeat_;
};

StatusOr<Assignment> GrpcRendezvousClient::Join(int64_t state_step, int64_t timeout_ms) {
  if (timeout_ms <= 0) return InvalidArgumentError("rendezvous join: timeout_ms must be > 0");
  joined_state_step_ = state_step;
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  v1::JoinResponse response;
  int64_t backoff_ms = 100;
  while (true) {
    grpc::ClientContext context;
    const int64_t left_ms = std::max<int64_t>(1, deadline.remaining_ms());
    PrepareContext(&context, left_ms + kHeldCallMarginMs);
    // A worker may start before the service listens: wait for it within the deadline rather
    // than failing on the first refused connection.
    context.set_wait_for_ready(true);
    v1::JoinRequest request;
    request.set_job(options_.job);
    request.set_member_id(options_.member_id);
    request.set_host(options_.host);
    request.set_state_step(state_step);
    request.set_timeout_ms(left_ms);
    request.set_pod(options_.pod);
    request.set_local_rank(options_.local_rank);
    request.set_without_members(true);
    const grpc::Status status = stub_->Join(&context, request, &response);
    if (status.ok()) break;
    Status error = FromGrpcStatus(status);
    // Waited out within the deadline, as a service that is down is (wait_for_ready):
    //  - NOT_FOUND: the service does not host the job (yet): a restarted operator registers its
    //    jobs only once its caches are synced, and a worker that reconnects first must wait;
    //  - UNAVAILABLE: the service is shutting down (an operator replica handing over to the
    //    next leader, a rolling update) or the connection broke mid-call: its successor on the
    //    same address answers the retry. Failing here instead would count as a worker failure.
    const bool transient =
        error.code() == StatusCode::kNotFound || error.code() == StatusCode::kUnavailable;
    if (transient && deadline.remaining_ms() > backoff_ms) {
      std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
      backoff_ms = std::min<int64_t>(backoff_ms * 2, 1000);
      continue;
    }
    // A deadline the service answered carries its reason; one without came from the transport.
    if (error.code() == StatusCode::kDeadlineExceeded && JoinRefusalReason(error).empty()) {
      error = DeadlineExceededError("no answer from the rendezvous service at " + options_.address +
                                    " within " + std::to_string(timeout_ms + kHeldCallMarginMs) +
                                    " ms");
    }
    return error.WithContext("rendezvous join as " + options_.member_id);
  }
  return FromProto(response);
}

Status GrpcRendezvousClient::StartHeartbeat(
    const Assignment& a, std::function<void(const GenerationEnd& end)> on_ended) {
  if (a.heartbeat_interval_ms <= 0) {
    return InvalidArgumentError("rendezvous heartbeat: assignment has no heartbeat interval");
  }
  StopHeartbeat();
  std::lock_guard<std::mutex> lock(heartbeat_mu_);
  heartbeat_ = std::make_unique<HeartbeatSession>();
  HeartbeatSession* session = heartbeat_.get();
  session->assignment = a;
  session->state_step = joined_state_step_;
  session->on_generation_ended = std::move(on_ended);
  session->writer = std::thread([this, session] { RunHeartbeat(session); });
  return OkStatus();
}

void GrpcRendezvousClient::RunHeartbeat(HeartbeatSession* session) {
  const int64_t generation = session->assignment.generation;
  bool away = false;  // the service went away and no stream has been taken since
  Deadline reconnect_by = Deadline::AfterMs(0);
  int64_t backoff_ms = 100;
  grpc::Status status;
  while (true) {
    bool accepted = false, ended_by_service = false;
    status = BeatOnStream(session, away, &accepted, &ended_by_service);
    {
      std::lock_guard<std::mutex> lock(session->mu);
      if (session->stop_requested) return;
    }
    if (ended_by_service) return;  // reported by the reader
    if (accepted) {
      away = false;
      backoff_ms = 100;
    }
    if (!ServiceWentAway(status) || options_.reconnect_timeout_ms <= 0) break;
    if (!away) {
      away = true;
      reconnect_by = Deadline::AfterMs(options_.reconnect_timeout_ms);
      LOCKSTEP_LOG(WARNING) << "rendezvous: the service went away ("
                            << FromGrpcStatus(status).ToString() << "); " << options_.member_id
                            << " trains on in generation " << generation
                            << " and reconnects for up to " << options_.reconnect_timeout_ms
                            << " ms";
    }
    if (reconnect_by.expired()) {
      session->ReportEnded(GenerationEnd{
          "no rendezvous service at " + options_.address + " for " +
              std::to_string(options_.reconnect_timeout_ms) + " ms: " +
              FromGrpcStatus(status).ToString(),
          /*member_lost=*/true});
      return;
    }
    std::unique_lock<std::mutex> lock(session->mu);
    session->cv.wait_for(lock, std::chrono::milliseconds(std::min(
                                   backoff_ms, std::max<int64_t>(1, reconnect_by.remaining_ms()))),
                         [session] { return session->stop_requested; });
    if (session->stop_requested) return;
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 1000);
  }
  // The service did not say why: assume the worst (a member lost) so collectives abort.
  session->ReportEnded(
      GenerationEnd{status.ok() ? "heartbeat stream closed by the rendezvous service"
                                : "heartbeat stream failed: " + FromGrpcStatus(status).ToString(),
                    /*member_lost=*/true});
}

grpc::Status GrpcRendezvousClient::BeatOnStream(HeartbeatSession* session, bool after_outage,
                                                bool* accepted, bool* ended_by_service) {
  grpc::ClientContext* context;
  {
    std::lock_guard<std::mutex> lock(session->mu);
    if (session->stop_requested) return grpc::Status::CANCELLED;
    session->context = std::make_unique<grpc::ClientContext>();
    session->stream_ended = false;
    context = session->context.get();
  }
  const Assignment& a = session->assignment;
  const int64_t generation = a.generation;
  // No overall deadline: the stream lives as long as the generation. Liveness is bounded by the
  // channel's keepalive and by the service's heartbeat timeout instead.
  context->AddMetadata(kTokenMetadataKey, options_.token);
  context->AddMetadata(kJobMetadataKey, options_.job);
  context->AddMetadata(kMemberMetadataKey, options_.member_id);
  context->AddMetadata(kGenerationMetadataKey, std::to_string(generation));
  // Fails fast while no service answers (RunHeartbeat retries within reconnect_timeout_ms; the
  // channel tries to connect again at least every second, channel.cc).
  auto stream = stub_->Heartbeat(context);
  std::atomic<bool> service_ended{false};
  std::atomic<bool> taken{false};

  std::thread reader([this, session, context, after_outage, generation, &stream, &service_ended,
                       &taken] {
    stream->WaitForInitialMetadata();
    taken = context->GetServerInitialMetadata().count(kStreamAcceptedMetadataKey) != 0;
    if (taken && after_outage) {
      LOCKSTEP_LOG(INFO) << "rendezvous: " << options_.member_id << " beats again for generation "
                         << generation << " at " << options_.address;
    }
    v1::HeartbeatResponse response;
    while (stream->Read(&response)) {
      if (response.kind() == v1::HeartbeatResponse::GENERATION_ENDED) {
        service_ended = true;
        session->ReportEnded(GenerationEnd{response.reason(), response.member_lost()});
      }
    }
    {
      std::lock_guard<std::mutex> lock(session->mu);
      session->stream_ended = true;
    }
    session->cv.notify_all();
  });

  // A beat carries progress when there is new progress, at most every interval; a member with
  // none new beats every idle interval (an older service sends none: the interval). A member
  // that dies is found by its stream breaking; one that hangs or loses its node, by beats
  // missing for the heartbeat timeout, which holds several idle intervals.
  const auto interval = std::chrono::milliseconds(a.heartbeat_interval_ms);
  const auto idle =
      std::chrono::milliseconds(std::max(a.heartbeat_idle_interval_ms, a.heartbeat_interval_ms));
  bool first = true;
  while (true) {
    v1::HeartbeatRequest beat;
    beat.set_job(options_.job);
    beat.set_member_id(options_.member_id);
    beat.set_generation(generation);
    if (first) {
      // Where the member sits: a service that never formed the generation takes it up.
      v1::Resume* resume = beat.mutable_resume();
      resume->set_rank(a.rank);
      resume->set_world_size(a.world_size);
      resume->set_host(options_.host);
      resume->set_pod(options_.pod);
      resume->set_local_rank(a.local_rank);
      resume->set_state_step(session->state_step);
      first = false;
    }
    {
      // Cleared before the progress is read: progress set while it is in flight prompts another
      // beat.
      std::lock_guard<std::mutex> lock(session->mu);
      if (session->first_progress_pending) session->first_progress_sent = true;
      session->first_progress_pending = false;
      session->progress_unsent = false;
    }
    {
      std::lock_guard<std::mutex> lock(progress_mu_);
      if (has_progress_ && progress_version_ != session->sent_version) {
        *beat.mutable_progress() = ToProto(progress_);
        session->sent_version = progress_version_;
      }
      // The pace rides along with whatever beat comes next; it never prompts one.
      if (pace_version_ != session->sent_pace_version) {
        *beat.mutable_pace() = pace_;
        session->sent_pace_version = pace_version_;
      }
    }
    if (!stream->Write(beat)) break;  // the stream is over; the reader sees why
    const auto sent_at = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(session->mu);
    auto over = [session] { return session->stop_requested || session->stream_ended; };
    // Until the interval is up only the first progress (or the end) wakes the writer; after it,
    // any new progress does, or the idle interval passing.
    session->cv.wait_until(lock, sent_at + interval,
                           [&] { return over() || session->first_progress_pending; });
    if (over()) break;
    if (session->first_progress_pending) continue;
    session->cv.wait_until(lock, sent_at + idle, [&] {
      return over() || session->first_progress_pending || session->progress_unsent;
    });
    if (over()) break;
  }
  reader.join();  // returns once the service finishes the stream or StopHeartbeat cancels it
  const grpc::Status status = stream->Finish();
  *accepted = taken;
  *ended_by_service = service_ended;
  // Progress sent on a stream the service never accepted may not have reached it: send the
  // latest again on the next.
  if (!*accepted) session->sent_version = 0;
  return status;
}

void GrpcRendezvousClient::StopHeartbeat() {
  std::unique_ptr<HeartbeatSession> session;
  {
    std::lock_guard<std::mutex> lock(heartbeat_mu_);
    session = std::move(heartbeat_);
  }
  if (session == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(session->mu);
    session->stop_requested = true;
    if (session->context != nullptr) session->context->TryCancel();
  }
  session->cv.notify_all();
  if (session->writer.joinable()) session->writer.join();
}

Status GrpcRendezvousClient::Leave(bool completed, const ProgressReport& final_progress) {
  v1::LeaveRequest request;
  request.set_job(options_.job);
  request.set_member_id(options_.member_id);
  request.set_completed(completed);
  *request.mutable_progress() = ToProto(final_progress);
  // A member that completed while the service was away (an operator's leader replaced) tells
  // its successor, within the reconnect timeout: its report is the job's final progress.
  const Deadline deadline =
      Deadline::AfterMs(completed ? options_.reconnect_timeout_ms : 0);
  int64_t backoff_ms = 100;
  while (true) {
    grpc::ClientContext context;
    PrepareContext(&context, options_.rpc_timeout_ms);
    v1::LeaveResponse response;
    const grpc::Status status = stub_->Leave(&context, request, &response);
    if (ServiceWentAway(status) && deadline.remaining_ms() > backoff_ms) {
      std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
      backoff_ms = std::min<int64_t>(backoff_ms * 2, 1000);
      continue;
    }
    return FromGrpcStatus(status).WithContext("rendezvous leave as " + options_.member_id);
  }
}

Status GrpcRendezvousClient::StoreSet(int64_t generation, const std::string& key,
                                      const std::string& value, int64_t timeout_ms) {
  grpc::ClientContext context;
  PrepareContext(&context, timeout_ms);
  v1::StoreSetRequest request;
  request.set_job(options_.job);
  request.set_generation(generation);
  request.set_key(key);
  request.set_value(value);
  v1::StoreSetResponse response;
  return FromGrpcStatus(stub_->StoreSet(&context, request, &response))
      .WithContext("rendezvous store set " + key);
}

StatusOr<std::vector<std::string>> GrpcRendezvousClient::StoreGet(
    int64_t generation, const std::vector<std::string>& keys, int64_t timeout_ms, size_t offset,
    size_t length) {
  grpc::ClientContext context;
  PrepareContext(&context, timeout_ms + kHeldCallMarginMs);
  v1::StoreGetRequest request;
  request.set_job(options_.job);
  request.set_generation(generation);
  for (const auto& key : keys) request.add_keys(key);
  request.set_timeout_ms(timeout_ms);
  request.set_value_offset(static_cast<int64_t>(offset));
  request.set_value_length(static_cast<int64_t>(length));
  v1::StoreGetResponse response;
  const grpc::Status status = stub_->StoreGet(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status).WithContext("rendezvous");
  if (response.values_size() != static_cast<int>(keys.size())) {
    return InternalError("rendezvous store get: asked for " + std::to_string(keys.size()) +
                         " keys, got " + std::to_string(response.values_size()) + " values");
  }
  return std::vector<std::string>(response.values().begin(), response.values().end());
}

StatusOr<int64_t> GrpcRendezvousClient::StoreAdd(int64_t generation, const std::string& key,
                                                 int64_t delta, int64_t timeout_ms) {
  grpc::ClientContext context;
  PrepareContext(&context, timeout_ms);
  v1::StoreAddRequest request;
  request.set_job(options_.job);
  request.set_generation(generation);
  request.set_key(key);
  request.set_delta(delta);
  v1::StoreAddResponse response;
  const grpc::Status status = stub_->StoreAdd(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status).WithContext("rendezvous");
  return response.value();
}

Status GenerationScopedStore::Set(const std::string& key, const std::string& value,
                                  int64_t timeout_ms) {
  return client_->StoreSet(generation_, key, value, timeout_ms);
}

StatusOr<std::vector<std::string>> GenerationScopedStore::Get(const std::vector<std::string>& keys,
                                                              int64_t timeout_ms) {
  return client_->StoreGet(generation_, keys, timeout_ms);
}

StatusOr<std::vector<std::string>> GenerationScopedStore::GetRange(
    const std::vector<std::string>& keys, size_t offset, size_t length, int64_t timeout_ms) {
  // The service reads value_length 0 as "whole values": cut those here.
  if (length == 0) return KeyValueStore::GetRange(keys, offset, length, timeout_ms);
  return client_->StoreGet(generation_, keys, timeout_ms, offset, length);
}

StatusOr<int64_t> GenerationScopedStore::Add(const std::string& key, int64_t delta,
                                             int64_t timeout_ms) {
  return client_->StoreAdd(generation_, key, delta, timeout_ms);
}

}  // namespace

std::string JoinRefusalReason(const Status& status) {
  if (!status.reason().empty() || status.ok()) return status.reason();
  // A service from before the reasons: what its texts meant. Goes once no such operator runs.
  const std::string& message = status.message();
  const auto says = [&message](const char* text) {
    return message.find(text) != std::string::npos;
  };
  if (status.code() == StatusCode::kDeadlineExceeded && says(kNoGenerationMarker)) {
    return says(kGenerationFullMarker) ? kReasonGenerationFull : kReasonNoGenerationFormed;
  }
  if (status.code() == StatusCode::kFailedPrecondition && says(kJobCompletedMarker)) {
    return kReasonJobCompleted;
  }
  return "";
}

StatusOr<Assignment> JoinOrStandBy(RendezvousClient& client, int64_t state_step,
                                   int64_t timeout_ms, const std::function<bool()>& keep_waiting,
                                   const std::function<void()>& on_standby) {
  bool standing_by = false;
  while (true) {
    StatusOr<Assignment> assignment = client.Join(state_step, timeout_ms);
    const bool deadline =
        !assignment.ok() && assignment.status().code() == StatusCode::kDeadlineExceeded;
    const bool full =
        deadline && JoinRefusalReason(assignment.status()) == kReasonGenerationFull;
    // Once a standby, a join that ended between generations (the job waiting for replacements
    // of several lost workers) is waited out too: the standby is one of the members to come.
    if (!(full || (standing_by && deadline)) || (keep_waiting && !keep_waiting())) {
      return assignment;
    }
    if (!standing_by) {
      standing_by = true;
      LOCKSTEP_LOG(INFO) << "standing by: the generation is full; waiting for a place";
      if (on_standby) on_standby();
    }
  }
}

StatusOr<std::unique_ptr<RendezvousClient>> RendezvousClient::Connect(
    const ClientOptions& options) {
  if (options.address.empty() || options.job.empty() || options.member_id.empty()) {
    return InvalidArgumentError("rendezvous client: address, job and member_id are required");
  }
  auto channel = NewRendezvousChannel(options.address, options.tls_ca_pem);
  if (channel == nullptr) {
    return UnavailableError("rendezvous client: cannot create a channel to " + options.address);
  }
  return std::unique_ptr<RendezvousClient>(
      std::make_unique<GrpcRendezvousClient>(options, std::move(channel)));
}

}  // namespace lockstep::rendezvous
