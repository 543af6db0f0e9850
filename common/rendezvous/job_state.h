// JobState: one job's rendezvous as a pure state machine: who has joined, when a generation
// forms and ends, who survives into the next, heartbeats, departures, progress, and the
// generation stores. The protocol is proto/rendezvous.proto's; RendezvousServer (server.cc) is
// the transport around it.
//
// Shape (etcd's raft package, controller-runtime's reconcile): events in, Actions out. Each method
// takes the time as an argument and appends what must happen to `out` (answer a held call, end
// or close a heartbeat stream, tick again at a time). It holds no lock, starts no thread, reads no
// clock and finishes no call, so a test drives it with a table of events and a fake clock.
//
//   JobState job(config);
//   Actions out;
//   job.Join(/*call=*/1, {.member_id = "w-0", .host = "10.0.0.1", .timeout_ms = 5000}, now, out);
//   ... run `out`: AnswerJoin{1, OK, assignment}, WakeAt{...} ...
//   job.Tick(now + 2s, out);   // at (or after) every WakeAt
//
// Not thread-safe: the transport serialises calls (one mutex per job).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/rendezvous/actions.h"
#include "common/rendezvous/client.h"
#include "common/rendezvous/generation_stores.h"
#include "common/rendezvous/straggler_detector.h"
#include "common/rendezvous/topology_order.h"
#include "common/status.h"

namespace lockstep::rendezvous {

struct JobConfig {
  std::string job;    // namespace/name
  std::string token;  // compared in constant time; never logged
  // min_members, max_members and initial_members count pods: with ranks_per_pod 1 a member is
  // its own pod (proto/rendezvous.proto, "Pods").
  int32_t min_members = 1;
  int32_t max_members = 1;
  int32_t ranks_per_pod = 1;
  // Every generation holds a multiple of this many pods (a pipeline's replicas are whole: its
  // stages / gcd(stages, ranks_per_pod)); the pods left over wait for the next. Survivors whose
  // group of this many pods (by their places in the last generation) survived whole go first and
  // keep their places within it, so a pipeline replica that lost nobody keeps its stages.
  int32_t pods_multiple = 1;
  // How many members the first generation expects (no generation before it has survivors):
  // it forms at once when this many have joined, else last_call_ms after the latest arrival
  // once min_members have. 0: max_members.
  int32_t initial_members = 0;
  // The first generation waits for all initial_members (no last call once min_members have
  // joined). For a launcher that starts every member at once (`lockstep run`): a slow starter
  // is waited for instead of forcing a re-formation when it arrives. Joins stay bounded by their
  // own timeouts.
  bool wait_for_initial_members = false;
  // After min_members have joined and not all expected have, how long to wait for more.
  int64_t last_call_ms = 1000;
  int64_t heartbeat_interval_ms = 200;
  int64_t heartbeat_timeout_ms = 10000;
  // The number of the first generation this registration forms (>= 1). A job registered again
  // (a restarted operator, or new membership bounds) continues its numbering, so that generation
  // numbers in status, metrics and logs never go back.
  int64_t first_generation = 1;
  // When a member is named a straggler (straggler_detector.h): from the pace its beats carry.
  StragglerOptions stragglers;
  // Ranks follow the network (topology_order.h): pods are numbered by the places SetPodTopology
  // gives them, and a generation whose pods have all joined waits for their places as for a late
  // joiner, until the last call.
  bool order_by_topology = false;
  // What the job's store may hold (generation_stores.h), scaled at each formation to the ranks
  // of that generation or the one before, the larger.
  StoreLimits store_limits;
  // How many of the latest generations' records the job keeps (JobSnapshot::history); the
  // counts and the longest recovery cover every generation.
  size_t history_kept = 64;
  // A registration of a job whose generation was training when the service that formed it went
  // away (an operator's new leader): before this registration's first generation forms, joins
  // are held this long from the first of them, so that the members may resume their generation
  // (BeatArgs::resume) rather than a standby's or a replacement's join forming a new one. 0:
  // no hold (a resume is still taken up while nothing has formed). A resume also waits this
  // long (at least heartbeat_timeout_ms) from its first rank for the others.
  int64_t resume_window_ms = 0;
};

// How often a member with no new progress beats: a quarter of the heartbeat timeout (so that a
// hung member is still found within it, with three beats to spare), never more often than the
// interval.
int64_t IdleHeartbeatIntervalMs(const JobConfig& config);

struct GenerationRecord {
  int64_t generation = 0;
  int32_t world_size = 0;
  double formed_at = 0;  // MonotonicSeconds()
  double ended_at = -1;  // -1 while current
  std::string end_reason;
  // The newest step any member held when the generation formed (-1: none had state).
  int64_t formed_at_step = -1;
  // When a member first reported progress beyond formed_at_step: training runs again.
  // -1 until then (and for a generation that ended before it trained).
  double training_at = -1;
  // Ended because a member was lost (stream broke, missed heartbeats, RemoveMember, Leave
  // without completing), as opposed to a member joining or the service closing.
  bool ended_by_loss = false;
};

// A member of the current generation whose compute time per step stays well above its peers'.
struct StragglerInfo {
  std::string member_id;
  std::string pod;
  int32_t rank = -1;
  double ratio = 0;     // its compute time per step over the members' median
  double named_at = 0;  // MonotonicSeconds()
};

struct JobSnapshot {
  int64_t generation = 0;  // current (first_generation - 1 before the first forms)
  int32_t world_size = 0;
  bool generation_active = false;
  std::vector<MemberInfo> members;           // of the current generation, by rank
  std::vector<std::string> waiting_members;  // ids whose Join is held, in join order
  ProgressReport progress;  // latest reported by any member of the current generation
  // The latest generations (at most JobConfig::history_kept), oldest first.
  std::vector<GenerationRecord> history;
  int64_t generations_formed = 0;  // by this registration, history's included
  // The longest time from a generation ending because a member was lost to training again in a
  // later generation (the next one that trained), in seconds; 0 when no member was ever lost.
  // A loss after which the job never trained again does not count (the job failed or finished).
  double longest_recovery_seconds = 0;
  int32_t completed_members = 0;  // members that called Leave(completed)
  // From the first Leave(completed) that carried progress; a later one replaces it only to add
  // an evaluation the first lacked. Its step is 0 until a member completed.
  ProgressReport final_progress;
  // Members of the current generation named stragglers now, in the order they were named.
  std::vector<StragglerInfo> stragglers;
  // Members are resuming a generation this registration did not form (BeatArgs::resume): it
  // trains, but is not this service's yet (`generation` and `world_size` are from before).
  bool resuming = false;
  // Store calls of this registration refused past the job's limits, and the last refusal's
  // message (GenerationStores::refusals).
  int64_t store_refusals = 0;
  std::string last_store_refusal;
};

// Members waiting while the generation is active: it is full, so they are hot standbys
// (spec.elastic.standby). Between generations everyone waiting is about to be admitted or not:
// none counts.
int32_t StandbyCount(const JobSnapshot& snapshot);

// A Join as the state machine sees it.
struct JoinArgs {
  std::string member_id;
  std::string host;
  int64_t state_step = -1;  // newest step the member holds, -1 for none
  int64_t timeout_ms = 0;   // the join fails with DEADLINE_EXCEEDED this long after it arrives
  std::string pod;          // empty: the member is its own pod
  int32_t local_rank = 0;   // 0..ranks_per_pod-1
  // The answer carries every member's record (AnswerJoin::members): for a client of an older
  // version, which did not say it goes without (proto/rendezvous.proto).
  bool wants_members = false;
};

// A member's place in the generation it resumes (proto/rendezvous.proto, Resume).
struct ResumeArgs {
  int32_t rank = 0;
  int32_t world_size = 0;
  std::string host;
  std::string pod;  // empty: the member is its own pod
  int32_t local_rank = 0;
  int64_t state_step = -1;
};

// One heartbeat of `member_id` for `generation`, with its latest progress if any.
struct BeatArgs {
  std::string member_id;
  int64_t generation = 0;
  std::optional<ProgressReport> progress;
  std::optional<Pace> pace;  // its own counters (straggler_detector.h)
  // The first beat of a stream opened again after the service went away.
  std::optional<ResumeArgs> resume;
  // The stream opening (its metadata), before any beat the member sent.
  bool opening = false;
};

struct LeaveArgs {
  std::string member_id;
  bool completed = false;  // training finished for this member (not a failure)
  std::optional<ProgressReport> progress;
};

class JobState {
 public:
  explicit JobState(JobConfig config);

  const JobConfig& config() const { return config_; }

  // Holds `call` until a generation admits the member (AnswerJoin OK), a newer join of the same
  // member replaces it (ABORTED), its timeout passes (DEADLINE_EXCEEDED) or the job closes.
  // A member of the active generation joining again, or a newcomer while the generation has
  // room, ends the generation so that the next one includes it.
  void Join(CallId call, const JoinArgs& join, TimePoint now, Actions& out);
  // The client went away; the transport finishes the call itself.
  void CancelJoin(CallId call);

  // A beat on `stream`. A beat for a generation that is over, or from a non-member, is answered
  // with EndStream so that the member rejoins. A second stream of the same member replaces the
  // first (CloseStream ABORTED). A beat that resumes a generation this registration never
  // formed, before it formed any, is taken up (job_state_resume.cc): once every rank of it has
  // resumed, it is the current generation.
  void Beat(StreamId stream, const BeatArgs& beat, TimePoint now, Actions& out);
  // `stream` (of member_id in generation) broke or was closed by the client: unless the member
  // completed first, the member is lost and its generation ends.
  void StreamClosed(StreamId stream, const std::string& member_id, int64_t generation,
                    const std::string& how, TimePoint now, Actions& out);
  // A member leaves: completed (training done; its generation goes on) or not (its generation
  // ends as for a loss). The first completed member's progress is the job's final progress.
  Status Leave(const LeaveArgs& leave, TimePoint now, Actions& out);
  // The member, or every member of the pod, `id` is gone (a process exited, a pod was deleted):
  // its generation ends at once.
  void RemoveMember(const std::string& id, const std::string& reason, TimePoint now,
                    Actions& out);
  // Where pod `pod` sits in the network, coarse to fine (topology_order.h); with
  // order_by_topology, the next generation numbers it there. The place of a removed pod is
  // forgotten (its replacement may land elsewhere).
  void SetPodTopology(const std::string& pod, TopologyPath path, TimePoint now, Actions& out);

  // The store of a generation: readable while it is current or the one before.
  Status StoreSet(int64_t generation, const std::string& key, const std::string& value,
                  Actions& out);
  StatusOr<int64_t> StoreAdd(int64_t generation, const std::string& key, int64_t delta,
                             Actions& out);
  // range.length > 0: each value is cut to [range.offset, range.offset + range.length).
  void StoreGet(CallId call, int64_t generation, const std::vector<std::string>& keys,
                int64_t timeout_ms, TimePoint now, Actions& out, ByteRange range = {});
  void CancelStoreGet(CallId call);

  // Everything due at `now`: missed heartbeats, the end of a last call, join and store deadlines.
  void Tick(TimePoint now, Actions& out);

  // Answers every held call and closes every stream with `status` (not OK); later events are
  // refused with it. Idempotent.
  void Close(const Status& status, TimePoint now, Actions& out);

  JobSnapshot Snapshot() const;

 private:
  struct PendingJoin {
    CallId call = 0;
    std::string member_id;
    std::string pod;
    int32_t local_rank = 0;
    std::string host;
    int64_t state_step = -1;
    int64_t timeout_ms = 0;
    TimePoint deadline;
    bool wants_members = false;
  };
  struct ActiveMember {
    MemberInfo info;
    TimePoint last_beat;
    StreamId stream = 0;  // 0: no stream yet (or it closed)
    bool completed = false;
  };

  std::string Describe() const { return "job " + config_.job; }
  // How long a resume waits, from its first rank, for the others to come back.
  int64_t ResumeWaitMs() const {
    return std::max(config_.heartbeat_timeout_ms, config_.resume_window_ms);
  }
  // The answer to a newcomer's join once a member completed training.
  Status CompletedError() const {
    return FailedPreconditionError("job " + config_.job + " " + kJobCompletedMarker)
        .WithReason(kReasonJobCompleted);
  }
  // The detector's stragglers as members of the current generation.
  std::vector<StragglerInfo> StragglerInfos() const;
  // After the stragglers changed: who they are now.
  void LogStragglers() const;
  // No generation of this registration has formed yet (nobody survives anything).
  bool BeforeFirstGeneration() const { return generation_ < first_generation_; }
  ActiveMember* FindMember(const std::string& member_id);
  // Pods, by id: survivors_ holds pods; a lost member takes its pod out.
  bool IsSurvivor(const std::string& pod) const;
  // The pod of an active or pending member; the id itself when it is neither.
  std::string PodOfMember(const std::string& member_id) const;
  void RemoveSurvivor(const std::string& pod);
  // Pods with a pending join, in order of their first.
  std::vector<std::string> PendingPods() const;
  // Pending joins per pod, kept as joins come and go (CountPending), so that deciding whether a
  // generation forms costs the same at the 4,096th join as at the first.
  using PodTally = std::unordered_map<std::string, int32_t>;
  void CountPending(const PendingJoin& join, int delta);
  void RecountPending();  // after pending_ or survivors_ changed wholesale
  bool PodComplete(const std::string& pod) const;  // every rank pending
  int32_t ExpectedPods() const;
  bool AllExpectedJoined() const;
  // The pods the next generation would admit, in order: surviving pods, then newcomers by first
  // arrival (whole groups of survivors first when pods_multiple > 1); whole pods only, at most
  // max_members, a multiple of pods_multiple.
  // `in_place`, when given: how many leading pods are whole surviving groups, which keep their
  // places (topology ordering orders the rest).
  std::vector<std::string> AdmissiblePods(size_t* in_place = nullptr) const;
  // Whether a re-formation would admit more pods than the active generation's
  // `pods_in_generation`, now that `joining_pod` joins: below max_members, by whole groups of
  // pods_multiple.
  bool CouldGrow(const std::string& joining_pod, int32_t pods_in_generation) const;
  // Whether every one of them has a place (SetPodTopology).
  bool EveryAdmissiblePodPlaced() const;
  void TryFormGeneration(TimePoint now, Actions& out);
  void FormGeneration(TimePoint now, Actions& out);
  // The pods of the generation now current, in rank order: the survivors the next one expects,
  // and their places.
  void SetSurvivors(const std::vector<std::string>& pods);
  // What every generation that becomes current needs, formed here or taken up (generation_
  // already its number): its record, the store's generations and limits, the heartbeat check.
  void StartGeneration(const GenerationRecord& record, TimePoint now, Actions& out);
  // lost: a member is gone (for the recovery time); false when one joined.
  void EndGeneration(const std::string& reason, bool lost, TimePoint now, Actions& out);
  // Ends the generation for a lost member and forms the next from the survivors if it can.
  void LoseMembers(const std::string& reason, TimePoint now, Actions& out);
  void CheckHeartbeats(TimePoint now, Actions& out);
  // Wakes the job when the member heard from longest ago could next have gone silent.
  void ScheduleHeartbeatCheck(TimePoint now, Actions& out);
  void ExpireJoins(TimePoint now, Actions& out);
  void UpdateProgress(const ProgressReport& progress);
  void RecordFinalProgress(const ProgressReport& progress);
  Status CheckStoreGeneration(int64_t generation) const;
  // The record of generation `g` while it is kept, else nullptr.
  const GenerationRecord* Record(int64_t g) const;
  // The current generation's record trains: a loss before it is recovered.
  void TrainingAgain(GenerationRecord& record, TimePoint now);

  // Resuming a generation formed by a service before this one (job_state_resume.cc).
  struct Resuming {
    int64_t generation = 0;
    int32_t world_size = 0;
    TimePoint deadline;                    // every rank resumed by then, or it ends
    std::map<int32_t, ActiveMember> ranks;  // those that resumed, by rank
  };
  // Handles `beat` if it belongs to a resume (starting one): true when it did.
  bool ResumeBeat(StreamId stream, const BeatArgs& beat, TimePoint now, Actions& out);
  // Why `resume` cannot take a place in a generation of its world (empty: it can).
  std::string ResumeProblem(const ResumeArgs& resume) const;
  // The resumed member `member_id`, or nullptr.
  ActiveMember* FindResumer(const std::string& member_id);
  // Every rank resumed: the generation is this registration's current one.
  void TakeUpResumedGeneration(TimePoint now, Actions& out);
  // The resume fails: those that resumed are told their generation ended (lost).
  void AbandonResume(const std::string& reason, TimePoint now, Actions& out);
  // Whether a generation must not form yet: a resume is under way, or the resume window
  // (JobConfig::resume_window_ms) of a registration with none formed is not over.
  bool HoldForResume(TimePoint now, Actions& out);

  const JobConfig config_;
  // Lowered to a generation taken up by resuming, when that is older.
  int64_t first_generation_;

  Status closed_status_;  // not OK once closed
  int64_t generation_;    // the current or latest; first_generation_ - 1 before the first
  bool active_ = false;
  std::vector<ActiveMember> members_;   // of generation_, by rank
  std::unordered_map<std::string, size_t> member_index_;  // member id -> index in members_
  std::vector<std::string> survivors_;  // pods expected in the next generation, by previous rank
  std::unordered_set<std::string> survivor_set_;  // the same pods, to look up
  // Each pod's place in the last generation (0 = its first pod): its group is place /
  // pods_multiple.
  std::unordered_map<std::string, int32_t> last_places_;
  std::vector<PendingJoin> pending_;    // in join order
  std::unordered_map<std::string, TopologyPath> places_;  // pod -> its place (SetPodTopology)
  // Indexes of pending_ (CountPending): ranks pending per pod, how many pods (and surviving
  // pods) have every rank pending, and how many pending joins name each member and each place.
  PodTally pending_ranks_;
  int32_t complete_pods_ = 0;
  int32_t complete_survivors_ = 0;
  std::unordered_map<std::string, int32_t> pending_members_;
  std::unordered_map<std::string, int32_t> pending_places_;
  TimePoint latest_arrival_;
  TimePoint last_call_wake_;        // latest last-call WakeAt asked for
  TimePoint heartbeat_check_at_;    // while active_: when a member can next have gone silent
  bool last_check_credited_ = false;  // the last check ran late and credited that time to all
  GenerationStores stores_;
  size_t previous_world_ = 0;  // ranks of the latest generation formed
  ProgressReport progress_;
  bool has_progress_ = false;
  std::deque<GenerationRecord> history_;  // the latest history_kept, oldest first
  int64_t generations_formed_ = 0;
  double longest_recovery_ = 0;
  double unrecovered_loss_at_ = -1;  // when the earliest loss not yet trained past ended
  std::set<std::string> completed_ids_;
  ProgressReport final_progress_;
  bool has_final_progress_ = false;
  StragglerDetector stragglers_;  // of the current generation
  std::optional<Resuming> resuming_;
  std::optional<TimePoint> resume_hold_until_;  // set by the first join held for a resume
  // The next generation formed is numbered at least this (past a resume that failed).
  int64_t generation_floor_ = 0;
};

}  // namespace lockstep::rendezvous
