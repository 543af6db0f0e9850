// Job: one hosted job of the rendezvous service (server.cc), its JobState behind a mutex and the
// held calls and streams its actions name. Internal to the service.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/rendezvous/job_state.h"
#include "common/rendezvous/server_calls.h"
#include "common/rendezvous/timer_queue.h"
#include "proto/rendezvous.grpc.pb.h"

namespace lockstep::rendezvous::internal {

// One job: its JobState behind a mutex, and the calls and streams its actions name. Every public
// method feeds one event to the state machine through Feed: under mu_ it turns the resulting
// actions into closures (the ids are looked up under mu_), and runs them after unlocking.
class Job : public std::enable_shared_from_this<Job> {
 public:
  Job(JobConfig config, TimerQueue* timers) : state_(std::move(config)), timers_(timers) {}

  // Immutable after construction: safe to read without mu_.
  const JobConfig& config() const { return state_.config(); }

  void Join(const std::shared_ptr<HeldCall>& call, const v1::JoinRequest& request);
  // opening: the beat the stream's metadata stands for, before the member's first.
  void Beat(const std::shared_ptr<HeartbeatStream>& stream, const v1::HeartbeatRequest& request,
            bool opening = false);
  void StreamClosed(const std::shared_ptr<HeartbeatStream>& stream, const std::string& member_id,
                    int64_t generation, const std::string& how);
  Status Leave(const v1::LeaveRequest& request);
  void RemoveMember(const std::string& member_id, const std::string& reason);
  void SetPodTopology(const std::string& pod, TopologyPath path);
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
  // Feeds one event to the state machine: runs `event(actions)` under mu_, turns the actions into
  // closures while still locked, runs them after unlocking, and returns what `event` returned.
  template <typename Event>
  auto Feed(Event&& event) -> decltype(event(std::declval<Actions&>()));
  // Under mu_: what `actions` mean for the calls and streams, to run after unlocking.
  Closures Resolve(Actions& actions);
  std::shared_ptr<HeldCall> TakeCall(CallId id);
  std::shared_ptr<HeartbeatStream> TakeStream(StreamId id);
  // Under mu_: the members list of `members`' formation as JoinResponse field 4, encoded once
  // and shared by every answer of that formation that asked for it.
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

}  // namespace lockstep::rendezvous::internal
