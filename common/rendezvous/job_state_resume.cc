// JobState, resuming a generation (proto/rendezvous.proto, protocol step 4): a service that
// formed no generation of the job (an operator's new leader) takes up the one its members are
// training in, from their own word, rather than ending it. Training needs nothing from the
// service while membership holds, so the service going away must cost the members nothing.
#include <algorithm>
#include <string>
#include <unordered_set>

#include "common/logging.h"
#include "common/rendezvous/job_state.h"

namespace lockstep::rendezvous {

using std::chrono::milliseconds;

std::string JobState::ResumeProblem(const ResumeArgs& resume) const {
  const int32_t per_pod = config_.ranks_per_pod;
  const int32_t world = resume.world_size;
  if (world <= 0 || world % per_pod != 0) {
    return "world " + std::to_string(world) + " is not a whole number of pods of " +
           std::to_string(per_pod) + " ranks";
  }
  const int32_t pods = world / per_pod;
  if (pods < config_.min_members || pods > config_.max_members ||
      pods % std::max<int32_t>(1, config_.pods_multiple) != 0) {
    return "its " + std::to_string(pods) + " pods are outside the job's bounds (" +
           std::to_string(config_.min_members) + ".." + std::to_string(config_.max_members) +
           (config_.pods_multiple > 1 ? ", whole groups of " + std::to_string(config_.pods_multiple)
                                      : std::string()) +
           ")";
  }
  if (resume.rank < 0 || resume.rank >= world || resume.local_rank != resume.rank % per_pod) {
    return "rank " + std::to_string(resume.rank) + " (local rank " +
           std::to_string(resume.local_rank) + ") is no place in a world of " +
           std::to_string(world);
  }
  if (resuming_.has_value()) {
    if (world != resuming_->world_size) {
      return "world " + std::to_string(world) + " disagrees with the " +
             std::to_string(resuming_->world_size) + " its other members gave";
    }
    if (resuming_->ranks.count(resume.rank) != 0) {
      return "rank " + std::to_string(resume.rank) + " was resumed by " +
             resuming_->ranks.at(resume.rank).info.member_id;
    }
  }
  return "";
}

JobState::ActiveMember* JobState::FindResumer(const std::string& member_id) {
  if (!resuming_.has_value()) return nullptr;
  for (auto& [rank, member] : resuming_->ranks) {
    if (member.info.member_id == member_id) return &member;
  }
  return nullptr;
}

bool JobState::ResumeBeat(StreamId stream, const BeatArgs& beat, TimePoint now, Actions& out) {
  const int64_t g = beat.generation;
  if (beat.opening && !active_ && (resuming_.has_value() || BeforeFirstGeneration())) {
    return true;  // its first beat says whether it resumes
  }
  if (!resuming_.has_value()) {
    // Only a registration that formed nothing takes a generation up, and never one older than
    // what the job's status showed (first_generation - 1); anything else is answered as any
    // beat (a generation this service knows, or one that is over).
    // A generation whose resume failed here is over: its members rejoin.
    if (!beat.resume.has_value() || active_ || !BeforeFirstGeneration() || g < 1 ||
        g < first_generation_ - 1 || g < generation_floor_) {
      return false;
    }
    if (const std::string problem = ResumeProblem(*beat.resume); !problem.empty()) {
      out.push_back(EndStream{stream, g,
                              "generation " + std::to_string(g) + " cannot resume: member " +
                                  beat.member_id + ": " + problem,
                              /*member_lost=*/true});
      return true;
    }
    resuming_ = Resuming{g, beat.resume->world_size, now + milliseconds(ResumeWaitMs()), {}};
    out.push_back(WakeAt{resuming_->deadline});
    LOCKSTEP_LOG(INFO) << Describe() << ": generation " << g << " resumes ("
                       << resuming_->world_size << " ranks, within " << ResumeWaitMs()
                       << " ms): its members train on";
  } else if (g != resuming_->generation) {
    return false;  // not the generation resuming: ended as any stale beat
  }

  ActiveMember* member = FindResumer(beat.member_id);
  if (member == nullptr) {
    std::string problem = beat.resume.has_value()
                              ? ResumeProblem(*beat.resume)
                              : "it beats without saying where it sits in the generation";
    if (!problem.empty()) {
      problem = "member " + beat.member_id + ": " + problem;
      out.push_back(EndStream{stream, g,
                              "generation " + std::to_string(g) + " cannot resume: " + problem,
                              /*member_lost=*/true});
      AbandonResume(problem, now, out);
      return true;
    }
    ActiveMember resumed;
    resumed.info.member_id = beat.member_id;
    resumed.info.host = beat.resume->host;
    resumed.info.rank = beat.resume->rank;
    resumed.info.state_step = beat.resume->state_step;
    resumed.info.pod = beat.resume->pod.empty() ? beat.member_id : beat.resume->pod;
    resumed.info.local_rank = beat.resume->local_rank;
    member = &resuming_->ranks.emplace(beat.resume->rank, std::move(resumed)).first->second;
  } else if (beat.resume.has_value() && beat.resume->rank != member->info.rank) {
    const std::string problem = "member " + beat.member_id + " resumed as rank " +
                                std::to_string(member->info.rank) + " and as rank " +
                                std::to_string(beat.resume->rank);
    out.push_back(EndStream{stream, g, problem, /*member_lost=*/true});
    AbandonResume(problem, now, out);
    return true;
  }
  if (member->stream != stream) {
    if (member->stream != 0) {
      out.push_back(CloseStream{member->stream, AbortedError("replaced by a newer stream")});
    }
    member->stream = stream;
  }
  member->last_beat = now;
  if (beat.progress.has_value()) UpdateProgress(*beat.progress);
  if (static_cast<int32_t>(resuming_->ranks.size()) == resuming_->world_size) {
    TakeUpResumedGeneration(now, out);
  }
  return true;
}

void JobState::TakeUpResumedGeneration(TimePoint now, Actions& out) {
  // Ranks go pod by pod: each pod's ranks are consecutive and name the same pod, once.
  const int32_t per_pod = config_.ranks_per_pod;
  std::vector<std::string> pods;
  std::unordered_set<std::string> seen;
  for (const auto& [rank, member] : resuming_->ranks) {
    if (rank % per_pod == 0) {
      if (!seen.insert(member.info.pod).second) {
        AbandonResume("pod " + member.info.pod + " holds two places", now, out);
        return;
      }
      pods.push_back(member.info.pod);
    } else if (member.info.pod != pods.back()) {
      AbandonResume("ranks " + std::to_string(rank - 1) + " and " + std::to_string(rank) +
                        " name different pods",
                    now, out);
      return;
    }
  }
  Resuming resumed = std::move(*resuming_);
  resuming_.reset();

  generation_ = resumed.generation;
  first_generation_ = std::min(first_generation_, generation_);
  active_ = true;
  members_.clear();
  member_index_.clear();
  stragglers_ = StragglerDetector(config_.stragglers);
  GenerationRecord record;
  record.generation = generation_;
  record.world_size = resumed.world_size;
  record.formed_at = SecondsOf(now);
  for (auto& [rank, member] : resumed.ranks) {
    record.formed_at_step = std::max(record.formed_at_step, member.info.state_step);
    member_index_[member.info.member_id] = members_.size();
    members_.push_back(std::move(member));
  }
  SetSurvivors(pods);
  RecountPending();
  TrainingAgain(record, now);  // it never stopped
  StartGeneration(record, now, out);
  LOCKSTEP_LOG(INFO) << Describe() << ": took up generation " << generation_ << " (world "
                     << resumed.world_size << ") as its members resumed it";

  // Joins held while it resumed: a newcomer with room re-forms it, as its join would have.
  const auto pods_in_generation = static_cast<int32_t>(pods.size());
  for (const PendingJoin& join : pending_) {
    if (CouldGrow(join.pod, pods_in_generation)) {
      EndGeneration("member " + join.member_id + " joined", /*lost=*/false, now, out);
      TryFormGeneration(now, out);
      return;
    }
  }
}

void JobState::AbandonResume(const std::string& reason, TimePoint now, Actions& out) {
  if (!resuming_.has_value()) return;
  const Resuming resumed = std::move(*resuming_);
  resuming_.reset();
  const std::string why =
      "generation " + std::to_string(resumed.generation) + " cannot resume: " + reason;
  for (const auto& [rank, member] : resumed.ranks) {
    if (member.stream != 0) out.push_back(EndStream{member.stream, resumed.generation, why, true});
  }
  // The generation existed: the next is numbered past it, and recovering from it counts.
  generation_floor_ = std::max(generation_floor_, resumed.generation + 1);
  if (unrecovered_loss_at_ < 0) unrecovered_loss_at_ = SecondsOf(now);
  resume_hold_until_ = now;  // nothing more to wait for: joins form as usual
  LOCKSTEP_LOG(WARNING) << Describe() << ": " << why << "; its members join again";
  TryFormGeneration(now, out);
}

bool JobState::HoldForResume(TimePoint now, Actions& out) {
  if (resuming_.has_value()) return true;
  if (config_.resume_window_ms <= 0 || !BeforeFirstGeneration()) return false;
  // Every expected pod joined (members of a release before Resume, or a generation that had
  // ended): nobody is left to resume.
  if (AllExpectedJoined()) return false;
  if (!resume_hold_until_.has_value()) {
    resume_hold_until_ = now + milliseconds(config_.resume_window_ms);
    out.push_back(WakeAt{*resume_hold_until_});
  }
  return now < *resume_hold_until_;
}

}  // namespace lockstep::rendezvous
