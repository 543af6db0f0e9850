// SimulatedMembers: many rendezvous members in one process, for load on the rendezvous service.
//
// Each member is a real gRPC client of the real service (proto/rendezvous.proto) on gRPC's
// callback API, so that thousands fit in one process without a thread each: it joins, holds its
// generation and rank, opens its own heartbeat stream and beats as the worker's client does (rank
// 0 with new progress at every heartbeat interval, as the trainer reports it; the others at the
// idle interval), joins again with its state when the service ends its generation, and leaves.
// No training. By default every member has a connection
// of its own, as workers in their own pods do.
//
//   SimulatedMembers members({.address = "127.0.0.1:" + std::to_string(port)});
//   auto ids = members.Add("default/storm", token, 1024);
//   members.PreConnect(30000);
//   members.Join(ids, /*state_step=*/-1);
//   if (!members.AwaitGeneration(ids, /*after=*/0, 30000)) ...   // every member holds a rank
//   members.Kill(ids[7]);               // what the service sees of a killed process
//   members.AwaitGeneration(survivors, generation, 30000);
//   members.Leave(survivors, /*completed=*/true, 30000);
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace lockstep::rendezvous::load {

using Clock = std::chrono::steady_clock;

struct LoadOptions {
  std::string address;     // host:port of the service
  std::string tls_ca_pem{};  // empty: plaintext
  int members_per_connection = 1;
  int64_t join_timeout_ms = 120000;
};

// What one member holds now.
struct MemberView {
  int64_t generation = 0;  // of its latest assignment; 0 before the first
  int32_t rank = -1;
  int32_t world_size = 0;
  Clock::time_point assigned_at;  // when that assignment arrived
  int64_t generations_ended = 0;  // GENERATION_ENDED messages it received
  int64_t beats_written = 0;      // heartbeats the transport took, in every generation
  bool left = false;
  std::string error;  // the first call that failed, if any
};

class SimulatedMembers {
 public:
  explicit SimulatedMembers(LoadOptions options);
  ~SimulatedMembers();  // cancels every call and waits for them to finish

  // Adds `count` members of `job` ("<job>-m<i>") and returns their indexes. None calls anything.
  std::vector<int> Add(const std::string& job, const std::string& token, int count);
  // Connects every connection not connected yet; false when one is not within timeout_ms.
  bool PreConnect(int64_t timeout_ms);

  // Starts each member's Join now. Once answered, a member opens its heartbeat stream; when the
  // service ends its generation it joins again (state_step: the step it then holds), unless it
  // was killed or left.
  void Join(const std::vector<int>& members, int64_t state_step);
  // Waits until every listed member holds a generation after `after`; false at timeout_ms.
  bool AwaitGeneration(const std::vector<int>& members, int64_t after, int64_t timeout_ms);
  // Waits until the member's transport took `beats` heartbeats in all; false at timeout_ms.
  bool AwaitBeats(int member, int64_t beats, int64_t timeout_ms);
  // Breaks the member's heartbeat stream and stops it from joining again: what the service sees
  // of a process that was killed.
  void Kill(int member);
  // Calls Leave for each listed member and waits for the answers; false when one failed or
  // did not come within timeout_ms.
  bool Leave(const std::vector<int>& members, bool completed, int64_t timeout_ms);

  // The store of the member's current generation, on the callback API: `done` runs on a gRPC
  // thread with the status and (Get) the values.
  void StoreSet(int member, const std::string& key, const std::string& value,
                std::function<void(const Status&)> done);
  void StoreGet(int member, const std::vector<std::string>& keys, int64_t timeout_ms,
                std::function<void(const Status&, std::vector<std::string> values)> done);

  MemberView View(int member) const;
  // The latest assigned_at among the members, and whether any of them failed a call.
  Clock::time_point LatestAssignment(const std::vector<int>& members) const;
  std::vector<std::string> Errors(const std::vector<int>& members) const;
  int64_t beats_sent() const;
  // Bytes of every Join answer received so far (the messages, without HTTP/2 framing).
  int64_t join_answer_bytes() const;

 private:
  struct Member;
  struct Connection;
  class HeartbeatCall;

  Member& At(int member) const;  // takes mu_
  void StartJoin(Member& member, int64_t state_step);
  void Finished();  // a call ended
  void BeatWritten(Member& member);
  void OnJoined(Member& member, const std::string& status_error);
  void OnGenerationEnded(Member& member, int64_t generation);
  void Ticker();

  const LoadOptions options_;
  mutable std::mutex mu_;  // guards members_ (the vector), the views, and waking waiters
  std::condition_variable changed_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::vector<std::unique_ptr<Member>> members_;
  bool stopping_ = false;
  std::atomic<int64_t> outstanding_{0};  // calls started and not yet finished
  std::atomic<int64_t> beats_{0};
  std::atomic<int64_t> join_answer_bytes_{0};
  std::thread ticker_;
};

}  // namespace lockstep::rendezvous::load
