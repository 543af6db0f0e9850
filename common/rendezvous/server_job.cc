#include "common/rendezvous/server_job.h"

#include <type_traits>
#include <utility>
#include <variant>

#include "common/deadline.h"
#include "common/rendezvous/wire.h"

namespace lockstep::rendezvous::internal {
namespace {

using Clock = Deadline::Clock;

void RunClosures(const std::vector<std::function<void()>>& closures) {
  for (const auto& closure : closures) closure();
}

}  // namespace

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
      // The answer is this member's fields, followed, for a member that asked for every
      // member's record, by the generation's shared list: protobuf reads fields in any order
      // and appends repeated ones, so the two encodings concatenated are one JoinResponse.
      const std::string own = ToProto(answer->assignment).SerializeAsString();
      std::shared_ptr<grpc::ByteBuffer> response;
      if (answer->members == nullptr) {
        grpc::Slice slice(own);
        response = std::make_shared<grpc::ByteBuffer>(&slice, 1);
      } else {
        grpc::Slice slices[2] = {grpc::Slice(own), EncodedMembers(answer->members)};
        response = std::make_shared<grpc::ByteBuffer>(slices, 2);
      }
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
    encoded_members_ = grpc::Slice(MembersToProto(*members).SerializeAsString());
  }
  return encoded_members_;
}

template <typename Event>
auto Job::Feed(Event&& event) -> decltype(event(std::declval<Actions&>())) {
  using Result = decltype(event(std::declval<Actions&>()));
  std::unique_lock<std::mutex> lock(mu_);
  Actions actions;
  if constexpr (std::is_void_v<Result>) {
    event(actions);
    const Closures closures = Resolve(actions);
    lock.unlock();
    RunClosures(closures);
  } else {
    Result result = event(actions);
    const Closures closures = Resolve(actions);
    lock.unlock();
    RunClosures(closures);
    return result;
  }
}

void Job::Tick() {
  Feed([&](Actions& out) { state_.Tick(Clock::now(), out); });
}

void Job::Join(const std::shared_ptr<HeldCall>& call, const v1::JoinRequest& request) {
  JoinArgs join;
  join.member_id = request.member_id();
  join.host = request.host();
  join.state_step = request.state_step();
  join.timeout_ms = request.timeout_ms();
  join.pod = request.pod();
  join.local_rank = request.local_rank();
  join.wants_members = !request.without_members();
  Feed([&](Actions& out) {
    state_.Join(HoldCall(call, &JobState::CancelJoin), join, Clock::now(), out);
  });
}

void Job::Beat(const std::shared_ptr<HeartbeatStream>& stream,
               const v1::HeartbeatRequest& request, bool opening) {
  BeatArgs beat;
  beat.opening = opening;
  beat.member_id = request.member_id();
  beat.generation = request.generation();
  if (request.has_progress()) beat.progress = FromProto(request.progress());
  if (request.has_pace()) beat.pace = FromProto(request.pace());
  if (request.has_resume()) {
    const v1::Resume& resume = request.resume();
    beat.resume = ResumeArgs{resume.rank(), resume.world_size(), resume.host(),
                             resume.pod(),  resume.local_rank(), resume.state_step()};
  }
  Feed([&](Actions& out) {
    streams_[stream->id()] = stream;
    state_.Beat(stream->id(), beat, Clock::now(), out);
  });
}

void Job::StreamClosed(const std::shared_ptr<HeartbeatStream>& stream, const std::string& member_id,
                       int64_t generation, const std::string& how) {
  Feed([&](Actions& out) {
    state_.StreamClosed(stream->id(), member_id, generation, how, Clock::now(), out);
    streams_.erase(stream->id());
  });
}

Status Job::Leave(const v1::LeaveRequest& request) {
  LeaveArgs leave;
  leave.member_id = request.member_id();
  leave.completed = request.completed();
  if (request.has_progress()) leave.progress = FromProto(request.progress());
  return Feed([&](Actions& out) { return state_.Leave(leave, Clock::now(), out); });
}

void Job::RemoveMember(const std::string& member_id, const std::string& reason) {
  Feed([&](Actions& out) { state_.RemoveMember(member_id, reason, Clock::now(), out); });
}

void Job::SetPodTopology(const std::string& pod, TopologyPath path) {
  Feed([&](Actions& out) { state_.SetPodTopology(pod, std::move(path), Clock::now(), out); });
}

Status Job::StoreSet(const v1::StoreSetRequest& request) {
  return Feed([&](Actions& out) {
    return state_.StoreSet(request.generation(), request.key(), request.value(), out);
  });
}

StatusOr<int64_t> Job::StoreAdd(const v1::StoreAddRequest& request) {
  return Feed([&](Actions& out) {
    return state_.StoreAdd(request.generation(), request.key(), request.delta(), out);
  });
}

void Job::StoreGet(const std::shared_ptr<HeldCall>& call, const v1::StoreGetRequest& request) {
  if (request.value_offset() < 0 || request.value_length() < 0) {
    call->Complete(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                "store get: value_offset and value_length must be >= 0"));
    return;
  }
  const std::vector<std::string> keys(request.keys().begin(), request.keys().end());
  const ByteRange range{static_cast<size_t>(request.value_offset()),
                        static_cast<size_t>(request.value_length())};
  Feed([&](Actions& out) {
    state_.StoreGet(HoldCall(call, &JobState::CancelStoreGet), request.generation(), keys,
                    request.timeout_ms(), Clock::now(), out, range);
  });
}

JobSnapshot Job::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.Snapshot();
}

void Job::Close(const Status& status) {
  Feed([&](Actions& out) { state_.Close(status, Clock::now(), out); });
}

}  // namespace lockstep::rendezvous::internal
