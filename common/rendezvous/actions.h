// What the rendezvous state machine (JobState, GenerationStores) asks its transport to do.
//
// The state machine never touches a call, a stream, a thread or a clock: a held call or a
// heartbeat stream is an id the transport chose, time is an argument, and every effect is an
// Action appended to the caller's list. The transport runs the list in order, after releasing
// whatever lock it holds around the state machine (running an action may call straight back in).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "common/deadline.h"
#include "common/rendezvous/client.h"
#include "common/status.h"

namespace lockstep::rendezvous {

using TimePoint = Deadline::Clock::time_point;

// A held unary call (Join, StoreGet) or a heartbeat stream, as the transport names it.
using CallId = uint64_t;
using StreamId = uint64_t;

// Finish a held Join: with `assignment` when status is OK, else with status alone. `members` is
// set only for a member that asked for every member's record (JoinArgs::wants_members: an older
// client); the list is the same for every member the generation admits, one list shared by all
// the answers of a formation, so that it is copied and encoded once, not once per member.
struct AnswerJoin {
  CallId call = 0;
  Status status;
  Assignment assignment;
  std::shared_ptr<const std::vector<MemberInfo>> members;  // by rank
};

// Finish a held StoreGet: with `values` (in the order of the keys asked) when status is OK.
struct AnswerStoreGet {
  CallId call = 0;
  Status status;
  std::vector<std::string> values;
};

// Tell a member that `generation` is over, then close its stream with OK.
struct EndStream {
  StreamId stream = 0;
  int64_t generation = 0;
  std::string reason;
  bool member_lost = true;
};

// Close a stream with `status` and no message.
struct CloseStream {
  StreamId stream = 0;
  Status status;
};

// Call JobState::Tick at or after `at`. Spurious or repeated ticks are harmless.
struct WakeAt {
  TimePoint at;
};

using Action = std::variant<AnswerJoin, AnswerStoreGet, EndStream, CloseStream, WakeAt>;
using Actions = std::vector<Action>;

// Seconds on the monotonic clock, as GenerationRecord keeps them (MonotonicSeconds()).
inline double SecondsOf(TimePoint at) {
  return std::chrono::duration<double>(at.time_since_epoch()).count();
}

}  // namespace lockstep::rendezvous
