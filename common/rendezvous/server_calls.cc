#include "common/rendezvous/server_calls.h"

#include "common/rendezvous/server_job.h"
#include "common/rendezvous/wire.h"

namespace lockstep::rendezvous::internal {

std::string TokenFromMetadata(const grpc::CallbackServerContext* context) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kTokenMetadataKey);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

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
    auto authorized = jobs_->Authorize(token_, request_.job());
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

}  // namespace lockstep::rendezvous::internal
