// Generations. The job keeps `survivors_`: the members of the last generation, in rank order,
// minus those known to be gone (stream broke, heartbeats missed, RemoveMember, Leave). The next
// generation expects every survivor plus whoever else joins; see TryFormGeneration().
#include "common/rendezvous/job_state.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_set>
#include <utility>

#include "common/logging.h"

namespace lockstep::rendezvous {

using std::chrono::milliseconds;

JobState::JobState(JobConfig config)
    : config_(std::move(config)),
      first_generation_(std::max<int64_t>(config_.first_generation, 1)),
      generation_(first_generation_ - 1),
      stores_(config_.store_limits.ScaledTo(0)),
      stragglers_(config_.stragglers) {}

// ---------------------------------------------------------------------------------------------
// Generations

JobState::ActiveMember* JobState::FindMember(const std::string& member_id) {
  auto it = member_index_.find(member_id);
  return it == member_index_.end() ? nullptr : &members_[it->second];
}

bool JobState::IsSurvivor(const std::string& pod) const { return survivor_set_.count(pod) != 0; }

void JobState::RemoveSurvivor(const std::string& pod) {
  if (survivor_set_.erase(pod) == 0) return;
  if (PodComplete(pod)) --complete_survivors_;
  survivors_.erase(std::remove(survivors_.begin(), survivors_.end(), pod), survivors_.end());
}

std::string JobState::PodOfMember(const std::string& member_id) const {
  auto member = member_index_.find(member_id);
  if (member != member_index_.end()) return members_[member->second].info.pod;
  for (const auto& join : pending_) {
    if (join.member_id == member_id) return join.pod;
  }
  return member_id;
}

std::vector<std::string> JobState::PendingPods() const {
  std::vector<std::string> pods;
  std::unordered_set<std::string> seen;
  for (const auto& join : pending_) {
    if (seen.insert(join.pod).second) pods.push_back(join.pod);
  }
  return pods;
}

namespace {
std::string PlaceOf(const std::string& pod, int32_t local_rank) {
  return pod + '\n' + std::to_string(local_rank);
}

void CountKey(std::unordered_map<std::string, int32_t>& counts, const std::string& key,
              int delta) {
  auto it = counts.emplace(key, 0).first;
  it->second += delta;
  if (it->second == 0) counts.erase(it);
}
}  // namespace

void JobState::CountPending(const PendingJoin& join, int delta) {
  // Join keeps at most one pending join per (pod, local rank), each rank in range.
  const bool was_complete = PodComplete(join.pod);
  CountKey(pending_ranks_, join.pod, delta);
  const bool complete = PodComplete(join.pod);
  if (was_complete != complete) {
    const int change = complete ? 1 : -1;
    complete_pods_ += change;
    if (IsSurvivor(join.pod)) complete_survivors_ += change;
  }
  CountKey(pending_members_, join.member_id, delta);
  CountKey(pending_places_, PlaceOf(join.pod, join.local_rank), delta);
}

void JobState::RecountPending() {
  pending_ranks_.clear();
  pending_members_.clear();
  pending_places_.clear();
  complete_pods_ = 0;
  complete_survivors_ = 0;
  for (const auto& join : pending_) CountPending(join, +1);
}

bool JobState::PodComplete(const std::string& pod) const {
  auto it = pending_ranks_.find(pod);
  return it != pending_ranks_.end() && it->second == config_.ranks_per_pod;
}

int32_t JobState::ExpectedPods() const {
  // Before the first generation nobody survives anything: expect the job's initial size.
  if (BeforeFirstGeneration()) {
    return config_.initial_members > 0 ? config_.initial_members : config_.max_members;
  }
  int32_t expected = static_cast<int32_t>(survivors_.size());
  for (const auto& [pod, count] : pending_ranks_) {
    if (!IsSurvivor(pod)) ++expected;
  }
  return expected;
}

bool JobState::AllExpectedJoined() const {
  if (BeforeFirstGeneration()) return complete_pods_ >= ExpectedPods();
  if (complete_survivors_ != static_cast<int32_t>(survivors_.size())) return false;
  // A pod some of whose ranks have joined is expected to complete (they start together).
  return complete_pods_ == static_cast<int32_t>(pending_ranks_.size());
}

// Formation rule (the proto's protocol, step 1):
//  - never while a generation is active: joiners that could not be admitted wait for the next;
//  - at least min_members pods must have joined whole (every local rank);
//  - as soon as every expected member has joined, form;
//  - otherwise form once last_call_ms has passed since the latest arrival, so that a burst of
//    joiners lands in one generation rather than one each;
//  - at most max_members pods are admitted (FormGeneration picks surviving pods first).
void JobState::TryFormGeneration(TimePoint now, Actions& out) {
  if (active_ || !closed_status_.ok()) return;
  if (HoldForResume(now, out)) return;
  if (complete_pods_ < config_.min_members) return;
  // Whole pods left over beyond a multiple of pods_multiple wait for the next generation.
  const int32_t multiple = std::max<int32_t>(1, config_.pods_multiple);
  if (std::min(complete_pods_, config_.max_members) / multiple * multiple < config_.min_members) {
    return;
  }
  bool ready = AllExpectedJoined();
  if (BeforeFirstGeneration() && config_.wait_for_initial_members && !ready) return;
  // Whole groups of pods: a generation with none of the last one's groups whole, but with pods
  // of it, may be missing a pod that closed its stream when it saw the loss and is rejoining
  // (a pipeline would lose a stage): it forms at the last call, not at once.
  if (ready && config_.pods_multiple > 1 && !BeforeFirstGeneration()) {
    size_t in_place = 0;
    const std::vector<std::string> pods = AdmissiblePods(&in_place);
    const bool any_old = std::any_of(pods.begin(), pods.end(), [&](const std::string& pod) {
      return last_places_.count(pod) != 0;
    });
    if (in_place == 0 && any_old) ready = false;
  }
  // A place not reported yet is waited for as a late joiner is (checked only once everyone has
  // joined, so that a storm of joins does not look at every pod each time).
  if (ready && config_.order_by_topology && !EveryAdmissiblePodPlaced()) ready = false;
  if (!ready) {
    const TimePoint last_call_at = latest_arrival_ + milliseconds(config_.last_call_ms);
    if (now < last_call_at) {
      if (last_call_at > last_call_wake_) {
        last_call_wake_ = last_call_at;
        out.push_back(WakeAt{last_call_at});
      }
      return;
    }
  }
  FormGeneration(now, out);
}

std::vector<std::string> JobState::AdmissiblePods(size_t* in_place) const {
  // Survivors keep their relative order, newcomers follow in order of first arrival; only whole
  // pods, at most max_members of them, and a multiple of pods_multiple.
  std::vector<std::string> pods;
  for (const auto& survivor : survivors_) {
    if (PodComplete(survivor)) pods.push_back(survivor);
  }
  for (const auto& pod : PendingPods()) {
    if (!IsSurvivor(pod) && PodComplete(pod)) pods.push_back(pod);
  }
  const int32_t multiple = std::max<int32_t>(1, config_.pods_multiple);
  if (multiple > 1) {
    // Groups of the last generation whose every pod is back go first, each pod in its old place:
    // a pipeline replica keeps its stages. A pod of the last generation counts whether it
    // survived or rejoined as a newcomer (its stream may have closed before the loss was known).
    auto group_of = [&](const std::string& pod) {
      auto it = last_places_.find(pod);
      return it == last_places_.end() ? -1 : it->second / multiple;
    };
    std::map<int32_t, int32_t> group_sizes;
    for (const auto& pod : pods) {
      if (group_of(pod) >= 0) ++group_sizes[group_of(pod)];
    }
    auto whole = [&](const std::string& pod) {
      return group_of(pod) >= 0 && group_sizes[group_of(pod)] == multiple;
    };
    const auto rest = std::stable_partition(pods.begin(), pods.end(), whole);
    std::sort(pods.begin(), rest, [&](const std::string& a, const std::string& b) {
      return last_places_.at(a) < last_places_.at(b);
    });
    if (in_place != nullptr) *in_place = static_cast<size_t>(rest - pods.begin());
  }
  const size_t admitted = std::min(pods.size(), static_cast<size_t>(config_.max_members));
  pods.resize(admitted / static_cast<size_t>(multiple) * static_cast<size_t>(multiple));
  if (in_place != nullptr) *in_place = std::min(*in_place, pods.size());
  return pods;
}

bool JobState::EveryAdmissiblePodPlaced() const {
  for (const auto& pod : AdmissiblePods()) {
    if (places_.count(pod) == 0) return false;
  }
  return true;
}

void JobState::SetPodTopology(const std::string& pod, TopologyPath path, TimePoint now,
                              Actions& out) {
  if (!closed_status_.ok() || pod.empty()) return;
  auto [it, added] = places_.try_emplace(pod);
  if (!added && it->second == path) return;
  it->second = std::move(path);
  // A generation may have waited for this place: only a pod that has joined whole can be that.
  if (!active_ && PodComplete(pod)) TryFormGeneration(now, out);
}

void JobState::FormGeneration(TimePoint now, Actions& out) {
  // Ranks go pod by pod (in the network's order when the job asks for it), local ranks in order.
  size_t in_place = 0;  // leading pods that keep their places (whole surviving groups)
  std::vector<std::string> pods = AdmissiblePods(&in_place);
  if (config_.order_by_topology) {
    std::vector<std::string> rest(pods.begin() + static_cast<std::ptrdiff_t>(in_place), pods.end());
    rest = OrderByTopology(rest, places_);
    std::copy(rest.begin(), rest.end(), pods.begin() + static_cast<std::ptrdiff_t>(in_place));
  }
  const int32_t per_pod = config_.ranks_per_pod;
  std::map<std::pair<std::string, int32_t>, size_t> place;  // (pod, local rank) -> pending_ index
  for (size_t i = 0; i < pending_.size(); ++i) {
    place[{pending_[i].pod, pending_[i].local_rank}] = i;
  }
  std::vector<size_t> order;  // indices into pending_, by rank
  for (const auto& pod : pods) {
    for (int32_t local_rank = 0; local_rank < per_pod; ++local_rank) {
      order.push_back(place.at({pod, local_rank}));
    }
  }
  const size_t world = order.size();

  generation_ = std::max(generation_ + 1, generation_floor_);
  active_ = true;
  members_.clear();
  member_index_.clear();
  stragglers_ = StragglerDetector(config_.stragglers);  // paces compare within a world
  SetSurvivors(pods);
  Assignment assignment;
  assignment.generation = generation_;
  assignment.world_size = static_cast<int32_t>(world);
  assignment.heartbeat_interval_ms = config_.heartbeat_interval_ms;
  assignment.heartbeat_timeout_ms = config_.heartbeat_timeout_ms;
  assignment.heartbeat_idle_interval_ms = IdleHeartbeatIntervalMs(config_);
  assignment.local_world_size = per_pod;
  assignment.pod_count = static_cast<int32_t>(pods.size());
  for (size_t rank = 0; rank < world; ++rank) {
    const PendingJoin& join = pending_[order[rank]];
    ActiveMember member;
    member.info.member_id = join.member_id;
    member.info.host = join.host;
    member.info.rank = static_cast<int32_t>(rank);
    member.info.state_step = join.state_step;
    member.info.pod = join.pod;
    member.info.local_rank = join.local_rank;
    member.last_beat = now;  // the member has heartbeat_timeout_ms to open its stream
    member_index_[member.info.member_id] = members_.size();
    members_.push_back(member);
  }
  std::vector<std::string> hosts;
  hosts.reserve(world);
  for (const auto& member : members_) hosts.push_back(member.info.host);
  const std::vector<HostPlacement> placements = PlaceOnHosts(hosts);
  if (world > 0) assignment.first_host = members_[0].info.host;
  // The whole list only for members that asked for it (older clients), built once for them all.
  std::shared_ptr<const std::vector<MemberInfo>> shared_infos;
  std::vector<bool> admitted(pending_.size(), false);
  for (size_t rank = 0; rank < world; ++rank) {
    const PendingJoin& join = pending_[order[rank]];
    admitted[order[rank]] = true;
    assignment.rank = static_cast<int32_t>(rank);
    assignment.local_rank = join.local_rank;
    assignment.pod_rank = static_cast<int32_t>(rank) / per_pod;
    assignment.host = placements[rank];
    if (join.wants_members && shared_infos == nullptr) {
      auto infos = std::make_shared<std::vector<MemberInfo>>();
      infos->reserve(world);
      for (const auto& member : members_) infos->push_back(member.info);
      shared_infos = std::move(infos);
    }
    out.push_back(AnswerJoin{join.call, OkStatus(), assignment,
                             join.wants_members ? shared_infos : nullptr});
  }
  std::vector<PendingJoin> waiting;
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (!admitted[i]) waiting.push_back(std::move(pending_[i]));
  }
  pending_ = std::move(waiting);
  RecountPending();

  GenerationRecord record;
  record.generation = generation_;
  record.world_size = static_cast<int32_t>(world);
  record.formed_at = SecondsOf(now);
  for (const auto& member : members_) {
    record.formed_at_step = std::max(record.formed_at_step, member.info.state_step);
  }
  ++generations_formed_;
  StartGeneration(record, now, out);
  LOCKSTEP_LOG(INFO) << Describe() << ": formed generation " << generation_ << " (world " << world
                     << ", " << pending_.size() << " waiting for the next)";
}

void JobState::SetSurvivors(const std::vector<std::string>& pods) {
  survivors_ = pods;
  survivor_set_ = std::unordered_set<std::string>(pods.begin(), pods.end());
  last_places_.clear();
  for (size_t i = 0; i < pods.size(); ++i) last_places_[pods[i]] = static_cast<int32_t>(i);
}

void JobState::StartGeneration(const GenerationRecord& record, TimePoint now, Actions& out) {
  history_.push_back(record);
  while (history_.size() > std::max<size_t>(config_.history_kept, 1)) history_.pop_front();

  // A member of g-1 may still be reading g-1's keys while it learns that g-1 ended; anything
  // older is unreachable. The store may hold what a generation of the larger of the two sizes
  // needs (StoreLimits): ranks that are here, not the declared maximum.
  const auto world = static_cast<size_t>(record.world_size);
  stores_.DropBefore(generation_ - 1, out);
  stores_.SetLimits(config_.store_limits.ScaledTo(
      static_cast<int64_t>(std::max(world, previous_world_))));
  previous_world_ = world;

  heartbeat_check_at_ = now + milliseconds(config_.heartbeat_timeout_ms + 1);
  last_check_credited_ = false;
  out.push_back(WakeAt{heartbeat_check_at_});
}

void JobState::EndGeneration(const std::string& reason, bool lost, TimePoint now, Actions& out) {
  if (!active_) return;
  active_ = false;
  if (!history_.empty()) {
    history_.back().ended_at = SecondsOf(now);
    history_.back().end_reason = reason;
    history_.back().ended_by_loss = lost;
    if (lost && unrecovered_loss_at_ < 0) unrecovered_loss_at_ = history_.back().ended_at;
  }
  for (auto& member : members_) {
    if (member.stream == 0) continue;
    out.push_back(EndStream{member.stream, generation_, reason, lost});
    member.stream = 0;
  }
  LOCKSTEP_LOG(INFO) << Describe() << ": generation " << generation_ << " ended: " << reason;
}

void JobState::LoseMembers(const std::string& reason, TimePoint now, Actions& out) {
  EndGeneration(reason, /*lost=*/true, now, out);
  TryFormGeneration(now, out);
}

void JobState::Join(CallId call, const JoinArgs& join, TimePoint now, Actions& out) {
  if (!closed_status_.ok()) {
    out.push_back(AnswerJoin{call, closed_status_, {}, nullptr});
    return;
  }
  if (join.member_id.empty() || join.timeout_ms <= 0) {
    const Status invalid =
        InvalidArgumentError("join needs a member_id and a positive timeout_ms");
    out.push_back(AnswerJoin{call, invalid, {}, nullptr});
    return;
  }
  if (join.local_rank < 0 || join.local_rank >= config_.ranks_per_pod) {
    out.push_back(AnswerJoin{call,
                             InvalidArgumentError("join: local_rank " +
                                                  std::to_string(join.local_rank) +
                                                  " is outside 0.." +
                                                  std::to_string(config_.ranks_per_pod - 1) +
                                                  " (ranks per pod " +
                                                  std::to_string(config_.ranks_per_pod) + ")"),
                             {}, nullptr});
    return;
  }
  const std::string pod = join.pod.empty() ? join.member_id : join.pod;
  if (!completed_ids_.empty() && FindMember(join.member_id) == nullptr && !IsSurvivor(pod)) {
    // Training is over (a member completed it): a newcomer, such as a replacement that started
    // late, has nothing to join. Survivors may still re-form to finish.
    out.push_back(AnswerJoin{call, CompletedError(), {}, nullptr});
    return;
  }
  const std::string& member_id = join.member_id;
  // One pending join per member, and per place in a pod.
  const bool replaces = pending_members_.count(member_id) != 0 ||
                        pending_places_.count(PlaceOf(pod, join.local_rank)) != 0;
  for (auto it = pending_.begin(); replaces && it != pending_.end();) {
    if (it->member_id != member_id && (it->pod != pod || it->local_rank != join.local_rank)) {
      ++it;
      continue;
    }
    out.push_back(AnswerJoin{it->call, AbortedError("replaced by a newer join"), {}, nullptr});
    CountPending(*it, -1);
    it = pending_.erase(it);
  }
  if (FindResumer(member_id) != nullptr) {
    AbandonResume("member " + member_id + " joined again", now, out);
  }
  if (active_) {
    // A member of the active generation joining again has restarted (or given up on the
    // generation): the others must re-form with it. A newcomer ends the generation so that it
    // can be admitted, unless the generation is already at max_members: then admitting it is
    // impossible and ending would only stall the others.
    const bool is_member = FindMember(member_id) != nullptr;
    const auto pods_in_generation =
        static_cast<int32_t>(members_.size()) / config_.ranks_per_pod;
    if (is_member || CouldGrow(pod, pods_in_generation)) {
      EndGeneration("member " + member_id + " joined", /*lost=*/false, now, out);
    } else {
      LOCKSTEP_LOG(INFO) << Describe() << ": " << member_id << " waits: generation " << generation_
                         << (pods_in_generation < config_.max_members
                                 ? " admits pods in whole groups of " +
                                       std::to_string(config_.pods_multiple)
                                 : std::string(" is at max_members"));
    }
  }
  PendingJoin pending;
  pending.call = call;
  pending.member_id = member_id;
  pending.pod = pod;
  pending.local_rank = join.local_rank;
  pending.host = join.host;
  pending.state_step = join.state_step;
  pending.timeout_ms = join.timeout_ms;
  pending.deadline = now + milliseconds(join.timeout_ms);
  pending.wants_members = join.wants_members;
  latest_arrival_ = now;
  out.push_back(WakeAt{pending.deadline});
  CountPending(pending, +1);
  pending_.push_back(std::move(pending));
  TryFormGeneration(now, out);
}

bool JobState::CouldGrow(const std::string& joining_pod, int32_t pods_in_generation) const {
  if (pods_in_generation >= config_.max_members) return false;
  const int32_t multiple = std::max<int32_t>(1, config_.pods_multiple);
  if (multiple == 1) return true;
  // The whole pods waiting outside the generation, this one included once its join completes it:
  // a re-formation admits them only in whole groups, so ending the generation for fewer (or for
  // a pod some of whose ranks are missing) would only stall it.
  std::unordered_set<std::string> waiting;
  for (const auto& [pod, ranks] : pending_ranks_) {
    if (ranks + (pod == joining_pod ? 1 : 0) >= config_.ranks_per_pod) waiting.insert(pod);
  }
  if (config_.ranks_per_pod == 1) waiting.insert(joining_pod);
  for (const auto& member : members_) waiting.erase(member.info.pod);
  const int32_t pods =
      std::min(config_.max_members, pods_in_generation + static_cast<int32_t>(waiting.size()));
  return pods / multiple * multiple > pods_in_generation;
}

void JobState::ExpireJoins(TimePoint now, Actions& out) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->deadline > now) {
      ++it;
      continue;
    }
    const int32_t needed = std::max(config_.min_members, ExpectedPods());
    const std::string bounds = "min " + std::to_string(config_.min_members) + ", max " +
                               std::to_string(config_.max_members);
    const std::string present =
        config_.ranks_per_pod == 1
            ? std::to_string(pending_.size()) + " of " + std::to_string(needed) +
                  " members present (" + bounds + ")"
            : std::to_string(complete_pods_) + " of " + std::to_string(needed) +
                  " pods complete (" + std::to_string(pending_.size()) +
                  " members present, " + std::to_string(config_.ranks_per_pod) +
                  " ranks per pod; " + bounds + " pods)";
    const std::string message =
        "no generation formed within " + std::to_string(it->timeout_ms) + " ms: " + present +
        (active_ ? "; generation " + std::to_string(generation_) + " " + kGenerationFullMarker
                 : std::string());
    const Status refusal = DeadlineExceededError(message).WithReason(
        active_ ? kReasonGenerationFull : kReasonNoGenerationFormed);
    out.push_back(AnswerJoin{it->call, refusal, {}, nullptr});
    CountPending(*it, -1);
    it = pending_.erase(it);
  }
}

void JobState::CancelJoin(CallId call) {
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [&](const PendingJoin& join) { return join.call == call; }),
                 pending_.end());
  RecountPending();
}

void JobState::Tick(TimePoint now, Actions& out) {
  if (!closed_status_.ok()) return;
  if (resuming_.has_value() && now >= resuming_->deadline) {
    AbandonResume(std::to_string(resuming_->ranks.size()) + " of its " +
                      std::to_string(resuming_->world_size) + " ranks resumed within " +
                      std::to_string(ResumeWaitMs()) + " ms",
                  now, out);
  }
  if (active_ && now >= heartbeat_check_at_) CheckHeartbeats(now, out);
  TryFormGeneration(now, out);  // a last call may be over
  ExpireJoins(now, out);
  stores_.Expire(now, out);
}

// ---------------------------------------------------------------------------------------------
// Heartbeats and departures

void JobState::Beat(StreamId stream, const BeatArgs& beat, TimePoint now, Actions& out) {
  ActiveMember* member = FindMember(beat.member_id);
  if (!closed_status_.ok()) {
    out.push_back(CloseStream{stream, closed_status_});
    return;
  }
  if (ResumeBeat(stream, beat, now, out)) return;
  if (!active_ || beat.generation != generation_ || member == nullptr) {
    // A beat for a generation that is over, or from someone outside it: tell it to rejoin.
    // Unless the generation is known to have ended by a join, treat it as lost so that the
    // member stops at once. (A beat racing the end of its generation lands here too, and must
    // carry the same cause as the end message it raced.)
    const int64_t g = beat.generation;
    std::string reason;
    bool lost = true;
    const GenerationRecord* record = Record(g);
    if (record != nullptr && record->ended_at >= 0) {
      reason = "generation " + std::to_string(g) + " ended: " + record->end_reason;
      lost = record->ended_by_loss;
    } else if (member == nullptr && g == generation_) {
      reason = "member " + beat.member_id + " is not in generation " + std::to_string(g);
    } else {
      reason = "generation " + std::to_string(g) + " is not current (current " +
               std::to_string(generation_) + ")";
    }
    out.push_back(EndStream{stream, g, reason, lost});
    return;
  }
  if (member->stream != stream) {
    // A second stream for the same member and generation replaces the first; closing the first
    // does not end the generation because it is no longer the member's stream.
    if (member->stream != 0) {
      out.push_back(CloseStream{member->stream, AbortedError("replaced by a newer stream")});
    }
    member->stream = stream;
  }
  member->last_beat = now;
  if (beat.pace.has_value() && !member->completed &&
      stragglers_.Report(beat.member_id, *beat.pace, now)) {
    LogStragglers();
  }
  if (beat.progress.has_value()) {
    UpdateProgress(*beat.progress);
    // A survivor's first beats may repeat its progress from the previous generation; only a
    // step past the newest state at formation shows that this generation trains.
    GenerationRecord& record = history_.back();
    if (record.training_at < 0 && beat.progress->step > record.formed_at_step) {
      TrainingAgain(record, now);
    }
  }
}

void JobState::StreamClosed(StreamId stream, const std::string& member_id, int64_t generation,
                            const std::string& how, TimePoint now, Actions& out) {
  if (resuming_.has_value() && generation == resuming_->generation) {
    ActiveMember* resumer = FindResumer(member_id);
    if (resumer != nullptr && resumer->stream == stream) {
      resumer->stream = 0;
      if (!resumer->completed) AbandonResume("member " + member_id + " left: " + how, now, out);
    }
    return;
  }
  ActiveMember* member = FindMember(member_id);
  if (!active_ || generation != generation_ || member == nullptr || member->stream != stream) {
    return;  // a stream of an ended generation, or one already replaced
  }
  member->stream = 0;
  if (member->completed) return;  // Leave(completed) came first: finishing is not failing
  RemoveSurvivor(member->info.pod);
  LoseMembers("member " + member_id + " left: " + how, now, out);
}

void JobState::ScheduleHeartbeatCheck(TimePoint now, Actions& out) {
  // The next member that can time out is the one that beat longest ago; never sooner than now.
  TimePoint oldest_beat = now;
  for (const auto& member : members_) {
    if (!member.completed) oldest_beat = std::min(oldest_beat, member.last_beat);
  }
  heartbeat_check_at_ =
      std::max(oldest_beat + milliseconds(config_.heartbeat_timeout_ms), now) + milliseconds(1);
  out.push_back(WakeAt{heartbeat_check_at_});
}

void JobState::CheckHeartbeats(TimePoint now, Actions& out) {
  const auto timeout = milliseconds(config_.heartbeat_timeout_ms);
  // A check that runs more than a beat interval late means the service itself was not running
  // (a machine-wide stall, a paused or starved process): beats sent meanwhile wait unread in its
  // sockets, so that silence is no evidence against the members. The time the check is late is
  // credited to every member; a member that really died shows it by its stream closing, or stays
  // silent through the credited timeout. Only every other check may credit, so a service that is
  // late at every check (a throttled pod) still finds a hung member within two timeouts.
  const auto late = now - heartbeat_check_at_;
  if (late > milliseconds(config_.heartbeat_interval_ms) && !last_check_credited_) {
    LOCKSTEP_LOG(WARNING) << Describe() << ": heartbeat check ran "
                          << std::chrono::duration_cast<milliseconds>(late).count()
                          << " ms late (the service was stalled); that time is not counted as "
                             "the members' silence";
    for (auto& member : members_) member.last_beat += late;
    last_check_credited_ = true;
    ScheduleHeartbeatCheck(now, out);
    return;
  }
  last_check_credited_ = false;
  std::vector<std::string> silent;
  for (const auto& member : members_) {
    if (member.completed || now - member.last_beat <= timeout) continue;
    silent.push_back(member.info.member_id);
    RemoveSurvivor(member.info.pod);
  }
  if (silent.empty()) {
    ScheduleHeartbeatCheck(now, out);
    return;
  }
  std::string names;
  for (const auto& id : silent) names += (names.empty() ? "" : ", ") + id;
  LoseMembers("member " + names + " missed heartbeats for " +
                  std::to_string(config_.heartbeat_timeout_ms) + " ms",
              now, out);
}

Status JobState::Leave(const LeaveArgs& leave, TimePoint now, Actions& out) {
  if (!closed_status_.ok()) return closed_status_;
  const std::string& member_id = leave.member_id;
  if (member_id.empty()) return InvalidArgumentError("leave without member_id");
  if (leave.progress.has_value()) UpdateProgress(*leave.progress);
  RemoveSurvivor(PodOfMember(member_id));
  ActiveMember* member = FindMember(member_id);
  if (ActiveMember* resumer = FindResumer(member_id); resumer != nullptr) {
    if (leave.completed) {
      resumer->completed = true;
    } else {
      AbandonResume("member " + member_id + " left", now, out);
    }
  }
  if (leave.completed) {
    completed_ids_.insert(member_id);
    if (member != nullptr) member->completed = true;
    if (leave.progress.has_value()) RecordFinalProgress(*leave.progress);
    LOCKSTEP_LOG(INFO) << Describe() << ": member " << member_id << " completed";
    // Standbys, and replacements that came too late, have nothing to wait for: answered now,
    // as a newcomer's join is from here on, not at their deadlines.
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (FindMember(it->member_id) != nullptr || IsSurvivor(it->pod)) {
        ++it;
        continue;
      }
      out.push_back(AnswerJoin{it->call, CompletedError(), {}, nullptr});
      CountPending(*it, -1);
      it = pending_.erase(it);
    }
  } else if (active_ && member != nullptr) {
    LoseMembers("member " + member_id + " left", now, out);
  }
  return OkStatus();
}

void JobState::RecordFinalProgress(const ProgressReport& progress) {
  // The first completed member's report is final (a job without a test split has no accuracy
  // in it); a later report replaces it only to add an evaluation it lacked.
  if (!has_final_progress_ || (final_progress_.eval_accuracy < 0 && progress.eval_accuracy >= 0) ||
      (final_progress_.eval_auc < 0 && progress.eval_auc >= 0)) {
    const int64_t committed_step = final_progress_.last_checkpoint_step;
    const std::string committed_uri = final_progress_.last_checkpoint_uri;
    final_progress_ = progress;
    if (has_final_progress_ && committed_step > final_progress_.last_checkpoint_step) {
      final_progress_.last_checkpoint_step = committed_step;
      final_progress_.last_checkpoint_uri = committed_uri;
    }
    has_final_progress_ = true;
  } else if (progress.last_checkpoint_step > final_progress_.last_checkpoint_step) {
    // Only rank 0 knows which checkpoint was committed; its report may come second.
    final_progress_.last_checkpoint_step = progress.last_checkpoint_step;
    final_progress_.last_checkpoint_uri = progress.last_checkpoint_uri;
  }
}

void JobState::RemoveMember(const std::string& id, const std::string& reason, TimePoint now,
                            Actions& out) {
  // `id` names a member or a whole pod. A pending Join of it is left alone: it may come from a
  // restarted process, and a dead process's Join is cancelled by its transport anyway.
  places_.erase(id);
  if (resuming_.has_value()) {
    for (const auto& [rank, resumer] : resuming_->ranks) {
      if (resumer.info.member_id == id || resumer.info.pod == id) {
        AbandonResume("member " + id + " removed: " + reason, now, out);
        break;
      }
    }
  }
  const size_t survivors_before = survivors_.size();
  RemoveSurvivor(PodOfMember(id));
  bool lost = false;
  for (const auto& member : members_) {
    if (member.info.member_id != id && member.info.pod != id) continue;
    RemoveSurvivor(member.info.pod);
    lost = lost || !member.completed;
  }
  if (active_ && lost) {
    LoseMembers("member " + id + " removed: " + reason, now, out);
  } else if (!active_ && survivors_.size() < survivors_before && !survivors_.empty()) {
    // The generation already ended (a survivor saw the loss first and rejoined): the next one
    // may have waited only for this survivor, which it no longer expects. (Not once no survivor
    // is left: pods deleted one by one at a suspend must not leave a generation of newcomers.)
    TryFormGeneration(now, out);
  }
}

void JobState::UpdateProgress(const ProgressReport& progress) {
  // Beats from different ranks interleave; the job's progress is the furthest any has reached.
  // Restarts only grow, whatever step their report carries (a restarted program reports an
  // older step until it passes the furthest one).
  const int32_t restarts = std::max(progress_.restarts, progress.restarts);
  if (!has_progress_ || progress.step > progress_.step) {
    progress_ = progress;
    has_progress_ = true;
  } else if (progress.step == progress_.step) {
    // Another rank at the same step: take what it knows, keep what only the last one knew (an
    // exec program may report its loss or rate from rank 0 only).
    const ProgressReport before = progress_;
    progress_ = progress;
    if (!progress.has_loss && before.has_loss) {
      progress_.loss = before.loss;
      progress_.has_loss = true;
    }
    if (progress.total_steps == 0) progress_.total_steps = before.total_steps;
    if (progress.samples == 0) progress_.samples = before.samples;
    if (progress.samples_per_second == 0) progress_.samples_per_second = before.samples_per_second;
    if (progress.scaling_efficiency == 0) {
      progress_.scaling_efficiency = before.scaling_efficiency;
      progress_.comm_exposed_fraction = before.comm_exposed_fraction;
    }
  }
  progress_.restarts = restarts;
}

// ---------------------------------------------------------------------------------------------
// Store

Status JobState::CheckStoreGeneration(int64_t generation) const {
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

Status JobState::StoreSet(int64_t generation, const std::string& key, const std::string& value,
                          Actions& out) {
  LOCKSTEP_RETURN_IF_ERROR(CheckStoreGeneration(generation).WithContext("store set"));
  return stores_.Set(generation, key, value, out);
}

StatusOr<int64_t> JobState::StoreAdd(int64_t generation, const std::string& key, int64_t delta,
                                     Actions& out) {
  LOCKSTEP_RETURN_IF_ERROR(CheckStoreGeneration(generation).WithContext("store add"));
  return stores_.Add(generation, key, delta, out);
}

void JobState::StoreGet(CallId call, int64_t generation, const std::vector<std::string>& keys,
                        int64_t timeout_ms, TimePoint now, Actions& out, ByteRange range) {
  Status status = CheckStoreGeneration(generation).WithContext("store get");
  if (!status.ok()) {
    out.push_back(AnswerStoreGet{call, std::move(status), {}});
    return;
  }
  stores_.Get(call, generation, keys, timeout_ms, now, out, range);
}

void JobState::CancelStoreGet(CallId call) { stores_.Cancel(call); }

// ---------------------------------------------------------------------------------------------
// Snapshot and close

JobSnapshot JobState::Snapshot() const {
  JobSnapshot snapshot;
  snapshot.generation = generation_;
  snapshot.world_size = static_cast<int32_t>(members_.size());
  snapshot.generation_active = active_;
  for (const auto& member : members_) snapshot.members.push_back(member.info);
  for (const auto& join : pending_) snapshot.waiting_members.push_back(join.member_id);
  snapshot.progress = progress_;
  snapshot.history.assign(history_.begin(), history_.end());
  snapshot.generations_formed = generations_formed_;
  snapshot.longest_recovery_seconds = longest_recovery_;
  snapshot.completed_members = static_cast<int32_t>(completed_ids_.size());
  snapshot.final_progress = final_progress_;
  if (active_) snapshot.stragglers = StragglerInfos();
  snapshot.resuming = resuming_.has_value();
  snapshot.store_refusals = stores_.refusals();
  snapshot.last_store_refusal = stores_.last_refusal();
  return snapshot;
}

std::vector<StragglerInfo> JobState::StragglerInfos() const {
  std::vector<StragglerInfo> infos;
  for (const Straggler& straggler : stragglers_.stragglers()) {
    auto it = member_index_.find(straggler.member_id);
    if (it == member_index_.end()) continue;
    const MemberInfo& member = members_[it->second].info;
    infos.push_back(StragglerInfo{member.member_id, member.pod, member.rank, straggler.ratio,
                                  SecondsOf(straggler.named_at)});
  }
  return infos;
}

void JobState::LogStragglers() const {
  const std::vector<StragglerInfo> infos = StragglerInfos();
  if (infos.empty()) {
    LOCKSTEP_LOG(INFO) << Describe() << ": generation " << generation_ << " has no straggler";
    return;
  }
  for (const StragglerInfo& straggler : infos) {
    LOCKSTEP_LOG(WARNING) << Describe() << ": straggler: member " << straggler.member_id
                          << " (rank " << straggler.rank << ") computes "
                          << std::round(straggler.ratio * 10) / 10
                          << "x the median time per step of generation " << generation_;
  }
}

void JobState::Close(const Status& status, TimePoint now, Actions& out) {
  if (!closed_status_.ok()) return;
  closed_status_ = status;
  for (auto& join : pending_) out.push_back(AnswerJoin{join.call, status, {}, nullptr});
  pending_.clear();
  RecountPending();
  stores_.FailAll(status, out);
  if (active_ && !history_.empty()) {
    history_.back().ended_at = SecondsOf(now);
    history_.back().end_reason = status.message();
  }
  active_ = false;
  for (auto& member : members_) {
    if (member.stream == 0) continue;
    out.push_back(CloseStream{member.stream, status});
    member.stream = 0;
  }
  if (resuming_.has_value()) {
    for (const auto& [rank, resumer] : resuming_->ranks) {
      if (resumer.stream != 0) out.push_back(CloseStream{resumer.stream, status});
    }
    resuming_.reset();
  }
}

int64_t IdleHeartbeatIntervalMs(const JobConfig& config) {
  return std::max(config.heartbeat_interval_ms, config.heartbeat_timeout_ms / 4);
}

int32_t StandbyCount(const JobSnapshot& snapshot) {
  return snapshot.generation_active ? static_cast<int32_t>(snapshot.waiting_members.size()) : 0;
}

const GenerationRecord* JobState::Record(int64_t g) const {
  if (history_.empty() || g < history_.front().generation) return nullptr;
  const auto index = static_cast<size_t>(g - history_.front().generation);
  return index < history_.size() ? &history_[index] : nullptr;
}

void JobState::TrainingAgain(GenerationRecord& record, TimePoint now) {
  record.training_at = SecondsOf(now);
  // The next generation may end before it trains (the replacement joins at once): recovery from
  // the earliest loss since the last training lasts until some later generation trains.
  if (unrecovered_loss_at_ >= 0) {
    longest_recovery_ = std::max(longest_recovery_, record.training_at - unrecovered_loss_at_);
    unrecovered_loss_at_ = -1;
  }
}

}  // namespace lockstep::rendezvous
