// The held calls of the rendezvous service (server.cc): a unary call answered later (HeldCall) and
// a member's heartbeat stream (HeartbeatStream), both reactors of gRPC's callback API that any
// thread may finish, exactly once. Internal to the service.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/rendezvous/actions.h"
#include "common/status.h"
#include "proto/rendezvous.grpc.pb.h"

namespace lockstep::rendezvous::internal {

class Job;

// The value a call carries under `key` in its metadata ("" when none).
std::string MetadataValue(const grpc::CallbackServerContext* context, const char* key);
// The job token a call carries ("" when none).
std::string TokenFromMetadata(const grpc::CallbackServerContext* context);

// Where a heartbeat stream finds its job: the service's jobs, checked against the token.
class JobDirectory {
 public:
  virtual ~JobDirectory() = default;
  // The job named `job` if `token` is its token; NOT_FOUND for an unknown job and a wrong token
  // alike.
  virtual StatusOr<std::shared_ptr<Job>> Authorize(const std::string& token,
                                                   const std::string& job) const = 0;
};

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

// One member's heartbeat stream for one generation. The stream's metadata names the job, the
// member and the generation (wire.h); a client that leaves them out names them in its first beat.
// Every beat must name the same ones.
class HeartbeatStream : public grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>,
                        public std::enable_shared_from_this<HeartbeatStream> {
 public:
  static HeartbeatStream* Create(const JobDirectory* jobs,
                                 grpc::CallbackServerContext* context) {
    static std::atomic<StreamId> next_id{1};
    std::shared_ptr<HeartbeatStream> stream(new HeartbeatStream(jobs, context, next_id++));
    stream->self_ = stream;
    stream->Start(context);
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
  HeartbeatStream(const JobDirectory* jobs, grpc::CallbackServerContext* context, StreamId id)
      : jobs_(jobs), token_(TokenFromMetadata(context)), id_(id) {}

  // Binds the stream to its member from the metadata, if named there, then starts reading.
  void Start(grpc::CallbackServerContext* context);
  // Binds the stream to `member_id` in `generation` of `job_name` if the token authorizes it;
  // otherwise closes the stream and returns null.
  std::shared_ptr<Job> Identify(const std::string& job_name, const std::string& member_id,
                                int64_t generation);
  // The client closed or broke the stream: the job decides whether that ends the generation.
  void HandleClosed(const std::string& how);

  const JobDirectory* jobs_;
  const std::string token_;
  const StreamId id_;
  v1::HeartbeatRequest request_;
  std::mutex mu_;  // guards finished_, starting reads, and the identity below
  bool finished_ = false;
  v1::HeartbeatResponse response_;
  // Set from the metadata as the stream opens, else by the first beat (under mu_, since OnCancel
  // may read them on another thread).
  std::weak_ptr<Job> job_;
  std::string member_id_;
  int64_t generation_ = -1;
  std::atomic<bool> closed_reported_{false};
  std::shared_ptr<HeartbeatStream> self_;
};

}  // namespace lockstep::rendezvous::internal
