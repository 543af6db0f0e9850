#include "common/rendezvous/server_calls.h"

#include <charconv>
#include <system_error>

#include "common/rendezvous/server_job.h"
#include "common/rendezvous/wire.h"

namespace lockstep::rendezvous::internal {

std::string MetadataValue(const grpc::CallbackServerContext* context, const char* key) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(key);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

std::string TokenFromMetadata(const grpc::CallbackServerContext* context) {
  return MetadataValue(context, kTokenMetadataKey);
}

// ---------------------------------------------------------------------------------------------
// HeartbeatStream

void HeartbeatStream::Start(grpc::CallbackServerContext* context) {
  // Named in the metadata, the member is bound to the stream as it opens: a member killed before
  // its first beat is lost when its stream breaks, not only at the heartbeat timeout.
  const std::string job_name = MetadataValue(context, kJobMetadataKey);
  const std::string member_id = MetadataValue(context, kMemberMetadataKey);
  const std::string generation_text = MetadataValue(context, kGenerationMetadataKey);
  if (!job_name.empty() || !member_id.empty() || !generation_text.empty()) {
    int64_t generation = 0;
    const char* end = generation_text.data() + generation_text.size();
    const auto parsed = std::from_chars(generation_text.data(), end, generation);
    if (job_name.empty() || member_id.empty() || parsed.ec != std::errc() || parsed.ptr != end) {
      Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         std::string("heartbeat metadata must name the job, the member and the "
                                     "generation (") + kJobMetadataKey + ", " +
                             kMemberMetadataKey + ", " + kGenerationMetadataKey + ")"));
      return;
    }
    std::shared_ptr<Job> job = Identify(job_name, member_id, generation);
    if (job == nullptr) return;
    v1::HeartbeatRequest opened;
    opened.set_job(job_name);
    opened.set_member_id(member_id);
    opened.set_generation(generation);
    job->Beat(shared_from_this(), opened, /*opening=*/true);
    // Tells the client the stream is its member's now (its initial metadata arrives).
    std::lock_guard<std::mutex> lock(mu_);
    if (!finished_) {
      context->AddInitialMetadata(kStreamAcceptedMetadataKey, "1");
      StartSendInitialMetadata();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!finished_) StartRead(&request_);
}

std::shared_ptr<Job> HeartbeatStream::Identify(const std::string& job_name,
                                               const std::string& member_id, int64_t generation) {
  auto authorized = jobs_->Authorize(token_, job_name);
  if (!authorized.ok()) {
    Close(ToGrpcStatus(authorized.status()));
    return nullptr;
  }
  if (member_id.empty()) {
    Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "heartbeat without member_id"));
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  job_ = *authorized;
  member_id_ = member_id;
  generation_ = generation;
  return *authorized;
}

void HeartbeatStream::OnReadDone(bool ok) {
  if (!ok) {
    HandleClosed("heartbeat stream closed");
    Close(grpc::Status::OK);
    return;
  }
  std::shared_ptr<Job> job = job_.lock();
  if (member_id_.empty()) {
    job = Identify(request_.job(), request_.member_id(), request_.generation());
    if (job == nullptr) return;
  } else if (request_.member_id() != member_id_ || request_.generation() != generation_) {
    Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "a heartbeat stream serves one member in one generation"));
    return;
  } else if (job == nullptr) {
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
