// RendezvousServer: the rendezvous service of proto/rendezvous.proto as a library. `lockstep run`
// hosts it in-process for one job; the operator hosts it for every job in the cluster.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto server, RendezvousServer::Start({.listen_address =
//   "127.0.0.1:0"})); LOCKSTEP_RETURN_IF_ERROR(server->AddJob({.job = "default/fashion", .token =
//   token,
//                                            .min_members = 4, .max_members = 4}));
//   ... launch workers with LOCKSTEP_RENDEZVOUS=127.0.0.1:<server->port()> ...
//   server->RemoveMember("default/fashion", "fashion-worker-2", "exited with code 137");
//   JobSnapshot s = *server->Snapshot("default/fashion");   // progress, generation, members
//
// Thread safety: every method may be called from any thread while the server runs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/rendezvous/client.h"
#include "common/status.h"

namespace lockstep::rendezvous {

struct ServerOptions {
  std::string listen_address = "127.0.0.1:0";  // port 0: pick a free port
  // TLS: PEM certificate chain and key; both empty for plaintext.
  std::string tls_cert_pem;
  std::string tls_key_pem;
};

struct JobConfig {
  std::string job;    // namespace/name
  std::string token;  // compared in constant time; never logged
  int32_t min_members = 1;
  int32_t max_members = 1;
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
  int64_t heartbeat_timeout_ms = 2000;
  // The number of the first generation this registration forms (>= 1). A job registered again
  // (a restarted operator, or new membership bounds) continues its numbering, so that generation
  // numbers in status, metrics and logs never go back.
  int64_t first_generation = 1;
};

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

// The longest time from a generation ending because a member was lost to training again in a
// later generation (the next one that trained), in seconds; 0 when no member was ever lost.
// A loss after which the job never trained again does not count (the job failed or finished).
double LongestRecoverySeconds(const std::vector<GenerationRecord>& history);

struct JobSnapshot {
  int64_t generation = 0;  // current (first_generation - 1 before the first forms)
  int32_t world_size = 0;
  bool generation_active = false;
  std::vector<MemberInfo> members;           // of the current generation, by rank
  std::vector<std::string> waiting_members;  // ids whose Join is held, in join order
  ProgressReport progress;  // latest reported by any member of the current generation
  std::vector<GenerationRecord> history;
  int32_t completed_members = 0;  // members that called Leave(completed)
  // From the first Leave(completed) that carried progress; a later one replaces it only to add
  // an evaluation the first lacked. Its step is 0 until a member completed.
  ProgressReport final_progress;
};

class RendezvousServer {
 public:
  static StatusOr<std::unique_ptr<RendezvousServer>> Start(const ServerOptions& options);
  virtual ~RendezvousServer() = default;

  virtual int port() const = 0;
  virtual Status AddJob(const JobConfig& config) = 0;  // AlreadyExists when present
  virtual Status RemoveJob(const std::string& job) = 0;
  // The member is gone (its process exited, its pod was deleted): ends its generation at once.
  virtual void RemoveMember(const std::string& job, const std::string& member_id,
                            const std::string& reason) = 0;
  virtual StatusOr<JobSnapshot> Snapshot(const std::string& job) const = 0;
  // Stops accepting calls, fails pending ones with UNAVAILABLE, returns within deadline_ms.
  virtual void Shutdown(int64_t deadline_ms) = 0;
};

}  // namespace lockstep::rendezvous
