// The rendezvous service on gRPC's callback API.
//
// Threading. No call holds a thread while it waits: a Join held until its generation forms, a
// StoreGet waiting for keys and a heartbeat stream are each a reactor object that gRPC's own
// threads call into when something happens on the wire. Everything timed (join deadlines, the
// last-call window, heartbeat timeouts, store waits) is an entry in one TimerQueue per server.
//
// Locking. Each job has one mutex, `Job::mu_`, that guards all of its state. A reactor is never
// finished while that mutex is held: the job's methods collect "finish this call" actions while
// locked and run them after unlocking, because finishing may run gRPC code that calls straight
// back into the job (OnCancel, OnReadDone) and would deadlock. Reactors are owned by shared_ptrs
// (a reactor holds itself until gRPC's OnDone), so an action that runs after its call went away
// finds a live object whose "finish once" flag makes the late finish a no-op.
//
// Generations. The job keeps `survivors_`: the members of the last generation, in rank order,
// minus those known to be gone (stream broke, heartbeats missed, RemoveMember, Leave). The next
// generation expects every survivor plus whoever else joins; see TryFormGeneration().
#include "common/rendezvous/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <set>
#include <utility>

#include "common/deadline.h"
#include "common/logging.h"
#include "common/rendezvous/timer_queue.h"
#include "common/rendezvous/wire.h"
#include "proto/rendezvous.grpc.pb.h"

namespace lockstep::rendezvous {
namespace {

using Clock = Deadline::Clock;
using Actions = std::vector<std::function<void()>>;

void RunActions(Actions& actions) {
  for (auto& action : actions) action();
  actions.clear();
}

std::string TokenFromMetadata(const grpc::CallbackServerContext* context) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kTokenMetadataKey);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

// A unary call that may be held (Join, StoreGet) and finished later from any thread, exactly once.
class HeldCall : public grpc::ServerUnaryReactor, public std::enable_shared_from_this<HeldCall> {
 public:
  static std::shared_ptr<HeldCall> Create(google::protobuf::Message* response) {
    std::shared_ptr<HeldCall> call(new HeldCall(response));
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

  void OnCancel() override {
    if (on_cancel_) on_cancel_();
    Complete(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled by the client"));
  }

  void OnDone() override {
    auto self = std::move(self_);  // may destroy this at the end of the scope
  }

 private:
  explicit HeldCall(google::protobuf::Message* response) : response_(response) {}

  std::mutex mu_;
  bool finished_ = false;
  google::protobuf::Message* response_;  // owned by gRPC, valid until OnDone
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
    std::shared_ptr<HeartbeatStream> stream(new HeartbeatStream(server, context));
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

  void OnReadDone(bool ok) override;
  void OnCancel() override;
  void OnWriteDone(bool ok) override {}
  void OnDone() override {
    auto self = std::move(self_);  // may destroy this at the end of the scope
  }

 private:
  HeartbeatStream(RendezvousServerImpl* server, grpc::CallbackServerContext* context)
      : server_(server), token_(TokenFromMetadata(context)) {}

  // The client closed or broke the stream: the job decides whether that ends the generation.
  void HandleClosed(const std::string& how);

  RendezvousServerImpl* server_;
  const std::string token_;
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

// One job's rendezvous state. Every public method locks mu_.
class Job : public std::enable_shared_from_this<Job> {
 public:
  Job(JobConfig config, TimerQueue* timers)
      : config_(std::move(config)),
        timers_(timers),
        first_generation_(std::max<int64_t>(config_.first_generation, 1)),
        generation_(first_generation_ - 1) {}

  const JobConfig& config() const { return config_; }

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
  struct PendingJoin {
    uint64_t id = 0;
    std::shared_ptr<HeldCall> call;
    std::string member_id;
    std::string host;
    int64_t state_step = -1;
    Clock::time_point deadline;
    int64_t timeout_ms = 0;
  };
  struct ActiveMember {
    MemberInfo info;
    Clock::time_point last_beat;
    std::shared_ptr<HeartbeatStream> stream;
    bool completed = false;
  };
  struct StoreWaiter {
    std::shared_ptr<HeldCall> call;
    int64_t generation = 0;
    std::vector<std::string> keys;
    int64_t timeout_ms = 0;
  };
  using GenerationStore = std::map<std::string, std::string>;

  std::string Describe() const { return "job " + config_.job; }
  ActiveMember* FindMember(const std::string& member_id);
  void RemoveSurvivor(const std::string& member_id);
  int32_t ExpectedMembers() const;
  bool AllExpectedJoined() const;
  void TryFormGeneration(Actions& actions);
  void FormGeneration(Actions& actions);
  // lost: a member is gone (for the recovery time); false when one joined.
  void EndGeneration(const std::string& reason, bool lost, Actions& actions);
  void ScheduleHeartbeatCheck(int64_t generation, Clock::time_point at);
  void CheckHeartbeats(int64_t generation);
  void ExpireJoin(uint64_t join_id);
  void CancelJoin(uint64_t join_id);
  void UpdateProgress(const v1::Progress& progress);
  Status CheckStoreGeneration(int64_t generation) const;
  void WakeStoreWaiters(int64_t generation, Actions& actions);
  bool TryAnswerWaiter(const StoreWaiter& waiter, Actions& actions);
  void ExpireStoreWaiter(uint64_t waiter_id);
  void CancelStoreWaiter(uint64_t waiter_id);
  std::string MissingKeys(const StoreWaiter& waiter) const;

  // No generation of this registration has formed yet (nobody survives anything).
  bool BeforeFirstGeneration() const { return generation_ < first_generation_; }

  const JobConfig config_;
  TimerQueue* const timers_;
  const int64_t first_generation_;

  mutable std::mutex mu_;
  Status closed_status_;  // not OK once closed
  int64_t generation_;  // the current or latest; first_generation_ - 1 before the first
  bool active_ = false;
  std::vector<ActiveMember> members_;   // of generation_, by rank
  std::vector<std::string> survivors_;  // expected in the next generation, by previous rank
  std::vector<PendingJoin> pending_;    // in join order
  uint64_t next_id_ = 1;
  Clock::time_point latest_arrival_;
  Clock::time_point last_call_check_at_;      // latest last-call timer scheduled
  std::map<int64_t, GenerationStore> store_;  // by generation
  std::map<uint64_t, StoreWaiter> store_waiters_;
  ProgressReport progress_;
  bool has_progress_ = false;
  std::vector<GenerationRecord> history_;
  std::set<std::string> completed_ids_;
  ProgressReport final_progress_;
  bool has_final_progress_ = false;
};

class RendezvousServerImpl : public RendezvousServer, public v1::Rendezvous::CallbackService {
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

  // The job named `job` if `token` is its token: NOT_FOUND for an unknown job, UNAUTHENTICATED
  // for a wrong token.
  StatusOr<std::shared_ptr<Job>> Authorize(const std::string& token, const std::string& job) const;

  // v1::Rendezvous::CallbackService
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override;
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
// Job: generations

Job::ActiveMember* Job::FindMember(const std::string& member_id) {
  for (auto& member : members_) {
    if (member.info.member_id == member_id) return &member;
  }
  return nullptr;
}

void Job::RemoveSurvivor(const std::string& member_id) {
  survivors_.erase(std::remove(survivors_.begin(), survivors_.end(), member_id), survivors_.end());
}

int32_t Job::ExpectedMembers() const {
  // Before the first generation nobody survives anything: expect the job's initial size.
  if (BeforeFirstGeneration()) {
    return config_.initial_members > 0 ? config_.initial_members : config_.max_members;
  }
  int32_t expected = static_cast<int32_t>(survivors_.size());
  for (const auto& join : pending_) {
    if (std::find(survivors_.begin(), survivors_.end(), join.member_id) == survivors_.end()) {
      ++expected;
    }
  }
  return expected;
}

bool Job::AllExpectedJoined() const {
  if (BeforeFirstGeneration()) {
    return static_cast<int32_t>(pending_.size()) >= ExpectedMembers();
  }
  for (const auto& survivor : survivors_) {
    auto same_id = [&](const PendingJoin& join) { return join.member_id == survivor; };
    if (std::none_of(pending_.begin(), pending_.end(), same_id)) return false;
  }
  return true;
}

// Formation rule (the proto's protocol, step 1):
//  - never while a generation is active: joiners that could not be admitted wait for the next;
//  - at least min_members must have joined;
//  - as soon as every expected member has joined, form;
//  - otherwise form once last_call_ms has passed since the latest arrival, so that a burst of
//    joiners lands in one generation rather than one each;
//  - at most max_members are admitted (FormGeneration picks survivors first).
void Job::TryFormGeneration(Actions& actions) {
  if (active_ || !closed_status_.ok()) return;
  if (static_cast<int32_t>(pending_.size()) < config_.min_members) return;
  if (BeforeFirstGeneration() && config_.wait_for_initial_members && !AllExpectedJoined()) {
    return;
  }
  if (!AllExpectedJoined()) {
    const Clock::time_point last_call_at =
        latest_arrival_ + std::chrono::milliseconds(config_.last_call_ms);
    if (Clock::now() < last_call_at) {
      if (last_call_at > last_call_check_at_) {
        last_call_check_at_ = last_call_at;
        std::weak_ptr<Job> weak = weak_from_this();
        timers_->Schedule(last_call_at, [weak] {
          auto job = weak.lock();
          if (job == nullptr) return;
          Actions actions;
          {
            std::lock_guard<std::mutex> lock(job->mu_);
            job->TryFormGeneration(actions);
          }
          RunActions(actions);
        });
      }
      return;
    }
  }
  FormGeneration(actions);
}

void Job::FormGeneration(Actions& actions) {
  // Ranks: survivors keep their relative order, newcomers follow in join order.
  std::vector<size_t> order;
  for (const auto& survivor : survivors_) {
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (pending_[i].member_id == survivor) order.push_back(i);
    }
  }
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (std::find(survivors_.begin(), survivors_.end(), pending_[i].member_id) ==
        survivors_.end()) {
      order.push_back(i);
    }
  }
  const size_t world = std::min(order.size(), static_cast<size_t>(config_.max_members));
  order.resize(world);

  ++generation_;
  active_ = true;
  const Clock::time_point now = Clock::now();
  members_.clear();
  survivors_.clear();
  v1::JoinResponse response;
  response.set_generation(generation_);
  response.set_world_size(static_cast<int32_t>(world));
  response.set_heartbeat_interval_ms(config_.heartbeat_interval_ms);
  response.set_heartbeat_timeout_ms(config_.heartbeat_timeout_ms);
  for (size_t rank = 0; rank < world; ++rank) {
    const PendingJoin& join = pending_[order[rank]];
    ActiveMember member;
    member.info.member_id = join.member_id;
    member.info.host = join.host;
    member.info.rank = static_cast<int32_t>(rank);
    member.info.state_step = join.state_step;
    member.last_beat = now;  // the member has heartbeat_timeout_ms to open its stream
    members_.push_back(member);
    survivors_.push_back(join.member_id);
    v1::Member* wire = response.add_members();
    wire->set_member_id(join.member_id);
    wire->set_host(join.host);
    wire->set_rank(static_cast<int32_t>(rank));
    wire->set_state_step(join.state_step);
  }
  std::vector<bool> admitted(pending_.size(), false);
  for (size_t rank = 0; rank < world; ++rank) {
    admitted[order[rank]] = true;
    auto personal = std::make_shared<v1::JoinResponse>(response);
    personal->set_rank(static_cast<int32_t>(rank));
    actions.push_back([call = pending_[order[rank]].call, personal] {
      call->Complete(grpc::Status::OK, personal.get());
    });
  }
  std::vector<PendingJoin> waiting;
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (!admitted[i]) waiting.push_back(std::move(pending_[i]));
  }
  pending_ = std::move(waiting);

  GenerationRecord record;
  record.generation = generation_;
  record.world_size = static_cast<int32_t>(world);
  record.formed_at = MonotonicSeconds();
  for (const auto& member : members_) {
    record.formed_at_step = std::max(record.formed_at_step, member.info.state_step);
  }
  history_.push_back(record);

  // A member of g-1 may still be reading g-1's keys while it learns that g-1 ended; anything
  // older is unreachable.
  store_.erase(store_.begin(), store_.lower_bound(generation_ - 1));
  for (auto it = store_waiters_.begin(); it != store_waiters_.end();) {
    if (it->second.generation < generation_ - 1) {
      actions.push_back([call = it->second.call, generation = it->second.generation] {
        call->Complete(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                    "store get: generation " + std::to_string(generation) +
                                        " is over and its keys are dropped"));
      });
      it = store_waiters_.erase(it);
    } else {
      ++it;
    }
  }

  LOCKSTEP_LOG(INFO) << Describe() << ": formed generation " << generation_ << " (world " << world
                     << ", " << pending_.size() << " waiting for the next)";
  ScheduleHeartbeatCheck(generation_,
                         now + std::chrono::milliseconds(config_.heartbeat_timeout_ms + 1));
}

void Job::EndGeneration(const std::string& reason, bool lost, Actions& actions) {
  if (!active_) return;
  active_ = false;
  if (!history_.empty()) {
    history_.back().ended_at = MonotonicSeconds();
    history_.back().end_reason = reason;
    history_.back().ended_by_loss = lost;
  }
  for (auto& member : members_) {
    if (member.stream == nullptr) continue;
    actions.push_back([stream = std::move(member.stream), generation = generation_, reason, lost] {
      stream->EndGeneration(generation, reason, lost);
    });
    member.stream = nullptr;
  }
  LOCKSTEP_LOG(INFO) << Describe() << ": generation " << generation_ << " ended: " << reason;
}

void Job::Join(const std::shared_ptr<HeldCall>& call, const v1::JoinRequest& request) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_status_.ok()) {
      actions.push_back([call, status = ToGrpcStatus(closed_status_)] { call->Complete(status); });
    } else if (request.member_id().empty() || request.timeout_ms() <= 0) {
      actions.push_back([call] {
        call->Complete(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    "join needs a member_id and a positive timeout_ms"));
      });
    } else if (!completed_ids_.empty() && FindMember(request.member_id()) == nullptr &&
               std::find(survivors_.begin(), survivors_.end(), request.member_id()) ==
                   survivors_.end()) {
      // Training is over (a member completed it): a newcomer, such as a replacement that
      // started late, has nothing to join. Survivors may still re-form to finish.
      actions.push_back([call, job = config_.job] {
        call->Complete(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                    "job " + job + " has completed; nothing to join"));
      });
    } else {
      const std::string& member_id = request.member_id();
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if (it->member_id != member_id) continue;
        actions.push_back([older = it->call] {
          older->Complete(grpc::Status(grpc::StatusCode::ABORTED, "replaced by a newer join"));
        });
        pending_.erase(it);
        break;
      }
      if (active_) {
        // A member of the active generation joining again has restarted (or given up on the
        // generation): the others must re-form with it. A newcomer ends the generation so that
        // it can be admitted, unless the generation is already at max_members: then admitting
        // it is impossible and ending would only stall the others.
        const bool is_member = FindMember(member_id) != nullptr;
        if (is_member || static_cast<int32_t>(members_.size()) < config_.max_members) {
          EndGeneration("member " + member_id + " joined", /*lost=*/false, actions);
        } else {
          LOCKSTEP_LOG(INFO) << Describe() << ": " << member_id << " waits: generation "
                             << generation_ << " is at max_members";
        }
      }
      PendingJoin join;
      join.id = next_id_++;
      join.call = call;
      join.member_id = member_id;
      join.host = request.host();
      join.state_step = request.state_step();
      join.timeout_ms = request.timeout_ms();
      join.deadline = Deadline::AfterMs(request.timeout_ms()).at();
      latest_arrival_ = Clock::now();
      std::weak_ptr<Job> weak = weak_from_this();
      const uint64_t join_id = join.id;
      call->set_on_cancel([weak, join_id] {
        if (auto job = weak.lock()) job->CancelJoin(join_id);
      });
      timers_->Schedule(join.deadline, [weak, join_id] {
        if (auto job = weak.lock()) job->ExpireJoin(join_id);
      });
      pending_.push_back(std::move(join));
      TryFormGeneration(actions);
    }
  }
  RunActions(actions);
}

void Job::ExpireJoin(uint64_t join_id) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(pending_.begin(), pending_.end(),
                           [&](const PendingJoin& join) { return join.id == join_id; });
    if (it == pending_.end()) return;
    const int32_t needed = std::max(config_.min_members, ExpectedMembers());
    const std::string message =
        "no generation formed within " + std::to_string(it->timeout_ms) +
        " ms: " + std::to_string(pending_.size()) + " of " + std::to_string(needed) +
        " members present (min " + std::to_string(config_.min_members) + ", max " +
        std::to_string(config_.max_members) + ")" +
        (active_ ? "; generation " + std::to_string(generation_) + " is active and full" : "");
    actions.push_back([call = it->call, message] {
      call->Complete(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, message));
    });
    pending_.erase(it);
  }
  RunActions(actions);
}

void Job::CancelJoin(uint64_t join_id) {
  std::lock_guard<std::mutex> lock(mu_);
  // The caller (HeldCall::OnCancel) finishes the call itself.
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [&](const PendingJoin& join) { return join.id == join_id; }),
                 pending_.end());
}

// ---------------------------------------------------------------------------------------------
// Job: heartbeats and departures

void Job::Beat(const std::shared_ptr<HeartbeatStream>& stream,
               const v1::HeartbeatRequest& request) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ActiveMember* member = FindMember(request.member_id());
    if (!closed_status_.ok()) {
      actions.push_back([stream, status = ToGrpcStatus(closed_status_)] { stream->Close(status); });
    } else if (!active_ || request.generation() != generation_ || member == nullptr) {
      // A beat for a generation that is over, or from someone outside it: tell it to rejoin.
      std::string reason;
      const int64_t g = request.generation();
      // Unless the generation is known to have ended by a join, treat it as lost so that the
      // member stops at once. (A beat racing the end of its generation lands here too, and must
      // carry the same cause as the end message it raced.)
      bool lost = true;
      const int64_t index = g - first_generation_;  // history_ starts at first_generation_
      if (index >= 0 && index < static_cast<int64_t>(history_.size()) &&
          history_[index].ended_at >= 0) {
        reason = "generation " + std::to_string(g) + " ended: " + history_[index].end_reason;
        lost = history_[index].ended_by_loss;
      } else if (member == nullptr && g == generation_) {
        reason = "member " + request.member_id() + " is not in generation " + std::to_string(g);
      } else {
        reason = "generation " + std::to_string(g) + " is not current (current " +
                 std::to_string(generation_) + ")";
      }
      actions.push_back([stream, g, reason, lost] { stream->EndGeneration(g, reason, lost); });
    } else {
      if (member->stream != stream) {
        // A second stream for the same member and generation replaces the first; closing the
        // first does not end the generation because it is no longer the member's stream.
        if (member->stream != nullptr) {
          actions.push_back([old = member->stream] {
            old->Close(grpc::Status(grpc::StatusCode::ABORTED, "replaced by a newer stream"));
          });
        }
        member->stream = stream;
      }
      member->last_beat = Clock::now();
      if (request.has_progress()) {
        UpdateProgress(request.progress());
        // A survivor's first beats may repeat its progress from the previous generation; only a
        // step past the newest state at formation shows that this generation trains.
        GenerationRecord& record = history_.back();
        if (record.training_at < 0 && request.progress().step() > record.formed_at_step) {
          record.training_at = MonotonicSeconds();
        }
      }
    }
  }
  RunActions(actions);
}

void Job::StreamClosed(const std::shared_ptr<HeartbeatStream>& stream, const std::string& member_id,
                       int64_t generation, const std::string& how) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ActiveMember* member = FindMember(member_id);
    if (!active_ || generation != generation_ || member == nullptr || member->stream != stream) {
      return;  // a stream of an ended generation, or one already replaced
    }
    member->stream = nullptr;
    if (member->completed) return;  // Leave(completed) came first: finishing is not failing
    RemoveSurvivor(member_id);
    EndGeneration("member " + member_id + " left: " + how, /*lost=*/true, actions);
    TryFormGeneration(actions);
  }
  RunActions(actions);
}

void Job::ScheduleHeartbeatCheck(int64_t generation, Clock::time_point at) {
  std::weak_ptr<Job> weak = weak_from_this();
  timers_->Schedule(at, [weak, generation] {
    if (auto job = weak.lock()) job->CheckHeartbeats(generation);
  });
}

void Job::CheckHeartbeats(int64_t generation) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_ || generation != generation_ || !closed_status_.ok()) return;
    const Clock::time_point now = Clock::now();
    const auto timeout = std::chrono::milliseconds(config_.heartbeat_timeout_ms);
    std::vector<std::string> silent;
    Clock::time_point oldest_beat = now;
    for (const auto& member : members_) {
      if (member.completed) continue;
      if (now - member.last_beat > timeout) {
        silent.push_back(member.info.member_id);
      } else {
        oldest_beat = std::min(oldest_beat, member.last_beat);
      }
    }
    if (silent.empty()) {
      // The next member that can time out is the one that beat longest ago.
      ScheduleHeartbeatCheck(generation, oldest_beat + timeout + std::chrono::milliseconds(1));
      return;
    }
    std::string names;
    for (const auto& id : silent) {
      RemoveSurvivor(id);
      names += (names.empty() ? "" : ", ") + id;
    }
    EndGeneration("member " + names + " missed heartbeats for " +
                      std::to_string(config_.heartbeat_timeout_ms) + " ms",
                  /*lost=*/true, actions);
    TryFormGeneration(actions);
  }
  RunActions(actions);
}

Status Job::Leave(const v1::LeaveRequest& request) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_status_.ok()) return closed_status_;
    const std::string& member_id = request.member_id();
    if (member_id.empty()) return InvalidArgumentError("leave without member_id");
    if (request.has_progress()) UpdateProgress(request.progress());
    RemoveSurvivor(member_id);
    ActiveMember* member = FindMember(member_id);
    if (request.completed()) {
      completed_ids_.insert(member_id);
      if (member != nullptr) member->completed = true;
      // The first completed member's report is final (a job without a test split has no
      // accuracy in it); a later report replaces it only to add an evaluation it lacked.
      if (request.has_progress() &&
          (!has_final_progress_ ||
           (final_progress_.eval_accuracy < 0 && request.progress().eval_accuracy() >= 0))) {
        const int64_t committed_step = final_progress_.last_checkpoint_step;
        const std::string committed_uri = final_progress_.last_checkpoint_uri;
        final_progress_ = FromProto(request.progress());
        if (has_final_progress_ && committed_step > final_progress_.last_checkpoint_step) {
          final_progress_.last_checkpoint_step = committed_step;
          final_progress_.last_checkpoint_uri = committed_uri;
        }
        has_final_progress_ = true;
      } else if (request.has_progress() &&
                 request.progress().last_checkpoint_step() > final_progress_.last_checkpoint_step) {
        // Only rank 0 knows which checkpoint was committed; its report may come second.
        final_progress_.last_checkpoint_step = request.progress().last_checkpoint_step();
        final_progress_.last_checkpoint_uri = request.progress().last_checkpoint_uri();
      }
      LOCKSTEP_LOG(INFO) << Describe() << ": member " << member_id << " completed";
    } else if (active_ && member != nullptr) {
      EndGeneration("member " + member_id + " left", /*lost=*/true, actions);
      TryFormGeneration(actions);
    }
  }
  RunActions(actions);
  return OkStatus();
}

void Job::RemoveMember(const std::string& member_id, const std::string& reason) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A pending Join of this id is left alone: it may come from the member's restarted process,
    // and a dead process's Join is cancelled by gRPC anyway.
    RemoveSurvivor(member_id);
    ActiveMember* member = FindMember(member_id);
    if (active_ && member != nullptr && !member->completed) {
      EndGeneration("member " + member_id + " removed: " + reason, /*lost=*/true, actions);
      TryFormGeneration(actions);
    }
  }
  RunActions(actions);
}

void Job::UpdateProgress(const v1::Progress& progress) {
  // Beats from different ranks interleave; the job's progress is the furthest any has reached.
  if (has_progress_ && progress.step() < progress_.step) return;
  progress_ = FromProto(progress);
  has_progress_ = true;
}

// ---------------------------------------------------------------------------------------------
// Job: store

Status Job::CheckStoreGeneration(int64_t generation) const {
  if (!closed_status_.ok()) return closed_status_;
  if (generation < first_generation_ || generation > generation_) {
    return FailedPreconditionError("generation " + std::to_string(generation) +
                                   " has not formed (current " + std::to_string(generation_) + ")");
  }
  if (generation < generation_ - 1) {
    return FailedPreconditionError("generation " + std::to_string(generation) +
                                   " is over and its keys are dropped");
  }
  return OkStatus();
}

Status Job::StoreSet(const v1::StoreSetRequest& request) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    LOCKSTEP_RETURN_IF_ERROR(CheckStoreGeneration(request.generation()).WithContext("store set"));
    store_[request.generation()][request.key()] = request.value();
    WakeStoreWaiters(request.generation(), actions);
  }
  RunActions(actions);
  return OkStatus();
}

StatusOr<int64_t> Job::StoreAdd(const v1::StoreAddRequest& request) {
  Actions actions;
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    LOCKSTEP_RETURN_IF_ERROR(CheckStoreGeneration(request.generation()).WithContext("store add"));
    std::string& stored = store_[request.generation()][request.key()];
    if (!stored.empty()) {
      char* end = nullptr;
      errno = 0;
      value = std::strtoll(stored.c_str(), &end, 10);
      if (errno != 0 || end == stored.c_str() || *end != '\0') {
        return InvalidArgumentError("store add: value of key " + request.key() +
                                    " is not an integer");
      }
    }
    value += request.delta();
    stored = std::to_string(value);
    WakeStoreWaiters(request.generation(), actions);
  }
  RunActions(actions);
  return value;
}

void Job::StoreGet(const std::shared_ptr<HeldCall>& call, const v1::StoreGetRequest& request) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status status = CheckStoreGeneration(request.generation()).WithContext("store get");
    if (!status.ok()) {
      actions.push_back([call, status = ToGrpcStatus(status)] { call->Complete(status); });
    } else {
      StoreWaiter waiter;
      waiter.call = call;
      waiter.generation = request.generation();
      waiter.keys.assign(request.keys().begin(), request.keys().end());
      waiter.timeout_ms = std::max<int64_t>(0, request.timeout_ms());
      if (!TryAnswerWaiter(waiter, actions)) {
        if (waiter.timeout_ms == 0) {
          actions.push_back([call, message = "store get: keys missing: " + MissingKeys(waiter)] {
            call->Complete(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, message));
          });
        } else {
          const uint64_t waiter_id = next_id_++;
          std::weak_ptr<Job> weak = weak_from_this();
          call->set_on_cancel([weak, waiter_id] {
            if (auto job = weak.lock()) job->CancelStoreWaiter(waiter_id);
          });
          timers_->ScheduleAfterMs(waiter.timeout_ms, [weak, waiter_id] {
            if (auto job = weak.lock()) job->ExpireStoreWaiter(waiter_id);
          });
          store_waiters_.emplace(waiter_id, std::move(waiter));
        }
      }
    }
  }
  RunActions(actions);
}

bool Job::TryAnswerWaiter(const StoreWaiter& waiter, Actions& actions) {
  auto generation_store = store_.find(waiter.generation);
  auto response = std::make_shared<v1::StoreGetResponse>();
  for (const auto& key : waiter.keys) {
    if (generation_store == store_.end()) return false;
    auto it = generation_store->second.find(key);
    if (it == generation_store->second.end()) return false;
    response->add_values(it->second);
  }
  actions.push_back(
      [call = waiter.call, response] { call->Complete(grpc::Status::OK, response.get()); });
  return true;
}

void Job::WakeStoreWaiters(int64_t generation, Actions& actions) {
  for (auto it = store_waiters_.begin(); it != store_waiters_.end();) {
    if (it->second.generation == generation && TryAnswerWaiter(it->second, actions)) {
      it = store_waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

std::string Job::MissingKeys(const StoreWaiter& waiter) const {
  auto generation_store = store_.find(waiter.generation);
  std::string missing;
  for (const auto& key : waiter.keys) {
    if (generation_store == store_.end() || generation_store->second.count(key) == 0) {
      missing += (missing.empty() ? "" : ", ") + key;
    }
  }
  return missing;
}

void Job::ExpireStoreWaiter(uint64_t waiter_id) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = store_waiters_.find(waiter_id);
    if (it == store_waiters_.end()) return;
    const std::string message = "store get: keys still missing after " +
                                std::to_string(it->second.timeout_ms) +
                                " ms: " + MissingKeys(it->second);
    actions.push_back([call = it->second.call, message] {
      call->Complete(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, message));
    });
    store_waiters_.erase(it);
  }
  RunActions(actions);
}

void Job::CancelStoreWaiter(uint64_t waiter_id) {
  std::lock_guard<std::mutex> lock(mu_);
  store_waiters_.erase(waiter_id);  // HeldCall::OnCancel finishes the call
}

// ---------------------------------------------------------------------------------------------
// Job: snapshot and close

JobSnapshot Job::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  JobSnapshot snapshot;
  snapshot.generation = generation_;
  snapshot.world_size = static_cast<int32_t>(members_.size());
  snapshot.generation_active = active_;
  for (const auto& member : members_) snapshot.members.push_back(member.info);
  for (const auto& join : pending_) snapshot.waiting_members.push_back(join.member_id);
  snapshot.progress = progress_;
  snapshot.history = history_;
  snapshot.completed_members = static_cast<int32_t>(completed_ids_.size());
  snapshot.final_progress = final_progress_;
  return snapshot;
}

void Job::Close(const Status& status) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_status_.ok()) return;
    closed_status_ = status;
    const grpc::Status wire = ToGrpcStatus(status);
    for (auto& join : pending_) {
      actions.push_back([call = join.call, wire] { call->Complete(wire); });
    }
    pending_.clear();
    for (auto& [id, waiter] : store_waiters_) {
      actions.push_back([call = waiter.call, wire] { call->Complete(wire); });
    }
    store_waiters_.clear();
    if (active_ && !history_.empty()) {
      history_.back().ended_at = MonotonicSeconds();
      history_.back().end_reason = status.message();
    }
    active_ = false;
    for (auto& member : members_) {
      if (member.stream == nullptr) continue;
      actions.push_back([stream = std::move(member.stream), wire] { stream->Close(wire); });
    }
  }
  RunActions(actions);
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

StatusOr<std::shared_ptr<Job>> RendezvousServerImpl::Authorize(const std::string& token,
                                                               const std::string& job) const {
  LOCKSTEP_ASSIGN_OR_RETURN(auto found, FindJob(job));
  if (!TokensEqual(found->config().token, token)) {
    return UnauthenticatedError("invalid token for job " + job);
  }
  return found;
}

grpc::ServerUnaryReactor* RendezvousServerImpl::Join(grpc::CallbackServerContext* context,
                                                     const v1::JoinRequest* request,
                                                     v1::JoinResponse* response) {
  auto call = HeldCall::Create(response);
  auto job = Authorize(TokenFromMetadata(context), request->job());
  if (!job.ok()) {
    call->Complete(ToGrpcStatus(job.status()));
  } else {
    (*job)->Join(call, *request);
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

double LongestRecoverySeconds(const std::vector<GenerationRecord>& history) {
  double longest = 0;
  for (size_t i = 0; i < history.size(); ++i) {
    if (!history[i].ended_by_loss || history[i].ended_at < 0) continue;
    // The next generation may end before it trains (the replacement joins at once): recovery
    // lasts until some later generation trains.
    for (size_t j = i + 1; j < history.size(); ++j) {
      if (history[j].training_at < 0) continue;
      longest = std::max(longest, history[j].training_at - history[i].ended_at);
      break;
    }
  }
  return longest;
}

StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(const ServerOptions& options) {
  auto server = std::make_unique<RendezvousServerImpl>();
  LOCKSTEP_RETURN_IF_ERROR(server->StartServing(options));
  return std::unique_ptr<RendezvousServer>(std::move(server));
}

}  // namespace lockstep::rendezvous
