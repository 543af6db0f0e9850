// RendezvousClient: a worker's side of the rendezvous protocol in proto/rendezvous.proto.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto client, RendezvousClient::Connect(options));
//   LOCKSTEP_ASSIGN_OR_RETURN(Assignment a, client->Join(/*state_step=*/-1, timeout_ms));
//   client->StartHeartbeat(a, [&](const GenerationEnd& end) { StopTraining(end); });
//   auto store = client->GenerationStore(a.generation);   // for Gloo/NCCL bootstrap
//   ... train; client->SetProgress(progress) every few steps (rank 0), SetPace (every rank) ...
//   client->StopHeartbeat();  // before joining the next generation
//   client->Leave(/*completed=*/true, final_progress);
//
// Thread safety: all methods may be called from any thread. The on_generation_ended callback
// runs on the heartbeat thread, once per generation; it must not block, and must not call
// StartHeartbeat/StopHeartbeat (they join that thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/rendezvous/host_placement.h"
#include "common/rendezvous/kv_store.h"
#include "common/status.h"

namespace lockstep::rendezvous {

// Each connection attempt's timeout, TLS handshake included (gRPC's minimum reconnect backoff,
// whose default this is; channel.cc sets it). A member reconnecting to a new leader may come back
// this much later than another: one attempt can hang on an address that no longer answers.
inline constexpr int64_t kConnectAttemptTimeoutMs = 20000;

struct ClientOptions {
  std::string address;             // host:port of the rendezvous service (LOCKSTEP_RENDEZVOUS)
  std::string job;                 // namespace/name (LOCKSTEP_JOB)
  std::string token;               // LOCKSTEP_JOB_TOKEN; sent as metadata, never logged
  std::string member_id;           // LOCKSTEP_POD, or LOCKSTEP_POD/LOCKSTEP_LOCAL_RANK
  std::string host = "127.0.0.1";  // address peers reach this member at
  // The member's pod and its place in it (proto/rendezvous.proto, "Pods"); an empty pod: the
  // member is its own pod.
  std::string pod;
  int32_t local_rank = 0;
  // TLS: PEM of the CA that signed the service's certificate; empty for plaintext (loopback).
  std::string tls_ca_pem;
  int64_t rpc_timeout_ms = 10000;  // deadline of each non-blocking RPC
  // How long a member trains on while the service is away (its heartbeat stream failed with
  // UNAVAILABLE, NOT_FOUND or CANCELLED: an operator's leader gone and its successor not serving
  // the job yet), opening the stream again, before it gives up its generation. 0: the generation
  // ends with the stream (LOCKSTEP_RENDEZVOUS_RECONNECT_MS).
  int64_t reconnect_timeout_ms = 60000;
};

struct MemberInfo {
  std::string member_id;
  std::string host;
  int32_t rank = 0;
  int64_t state_step = -1;
  std::string pod;  // == member_id when the member is its own pod
  int32_t local_rank = 0;
};

struct Assignment {
  int64_t generation = 0;
  int32_t rank = 0;
  int32_t world_size = 0;
  int64_t heartbeat_interval_ms = 0;
  // How often a member beats while it has no new progress to report (>= the interval; 0 from an
  // older service: the interval).
  int64_t heartbeat_idle_interval_ms = 0;
  int64_t heartbeat_timeout_ms = 0;
  // The member's pod in this generation: ranks pod_rank * local_world_size .. + local_world_size-1.
  int32_t local_rank = 0;
  int32_t local_world_size = 1;
  int32_t pod_rank = 0;
  int32_t pod_count = 0;
  std::string first_host;  // rank 0's host (torchrun's MASTER_ADDR)
  // Where the member sits among the generation's hosts. The other members' records are not
  // sent (proto/rendezvous.proto, JoinRequest.without_members); what a communicator exchanges
  // beyond this goes through the generation's store.
  HostPlacement host;
};

// Why a generation ended, as the heartbeat stream reports it.
struct GenerationEnd {
  std::string reason;
  // True when a member is gone (exited, left, missed heartbeats, removed), or the stream itself
  // failed: collectives with the gone member cannot complete, so abort them. False when a member
  // joined: every member is alive, so finish the current step together and leave at a step
  // boundary (no abort, no lost work).
  bool member_lost = true;
};

struct ProgressReport {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  double samples_per_second = 0;
  double scaling_efficiency = 0;
  int64_t samples = 0;
  double eval_accuracy = -1;
  int64_t last_checkpoint_step = -1;
  std::string last_checkpoint_uri;
  double comm_exposed_fraction = 0;
  int64_t resumed_from_step = -1;  // the checkpoint step this job resumed from, -1 if none
  // Exec mode: restarts after failures so far, as the agents count them (restart_protocol.h).
  int32_t restarts = 0;
  bool has_loss = true;  // false: an exec program that reported no loss (`loss` means nothing)
  double wire_bytes_per_step = 0;  // built-in trainer's final report; 0: unknown
  double eval_auc = -1;  // a parameter-server job's chief, final report: the test AUC; -1: none
};

// The largest message the service accepts, and its clients too; a larger one is refused
// (RESOURCE_EXHAUSTED) before it is held. What the protocol needs: Gloo's full-mesh bootstrap
// stores one value per rank of about 136 bytes per peer (a sockaddr_storage and a sequence
// number), so 8 MiB admits a flat Gloo world of about 60,000 ranks, past the 50,000-replica bound
// of a one-rank-per-pod job. (gRPC's default, 4 MiB, stops at about 30,000.)
inline constexpr int kMaxRendezvousRequestBytes = 8 << 20;

class RendezvousClient {
 public:
  static StatusOr<std::unique_ptr<RendezvousClient>> Connect(const ClientOptions& options);
  virtual ~RendezvousClient() = default;

  // Blocks until the next generation forms (or timeout_ms passes: DEADLINE_EXCEEDED; an unknown
  // job or a wrong token, waited out as a job not hosted yet: NOT_FOUND). state_step: the newest
  // step held in memory, -1 for none.
  virtual StatusOr<Assignment> Join(int64_t state_step, int64_t timeout_ms) = 0;

  // Opens the heartbeat stream for a.generation and beats: with new progress at most every
  // a.heartbeat_interval_ms, without every a.heartbeat_idle_interval_ms. on_generation_ended
  // is called once, when the service ends the generation or the stream fails, but not while
  // the service is away (options.reconnect_timeout_ms): then the stream is opened again and
  // resumes the generation. Replaces any previous heartbeat.
  virtual Status StartHeartbeat(
      const Assignment& a, std::function<void(const GenerationEnd& end)> on_generation_ended) = 0;
  // Closes the stream without ending the generation for others only if preceded by Leave; a
  // member that stops beating otherwise ends the generation (that is the point).
  virtual void StopHeartbeat() = 0;
  virtual void SetProgress(const ProgressReport& progress) = 0;
  // This member's own pace, for straggler detection: steps trained by this process and the
  // seconds of them spent computing (not waiting on a collective), both cumulative. Carried by
  // the next beat, whenever that is; never prompts one.
  virtual void SetPace(int64_t steps, double compute_seconds) = 0;

  virtual Status Leave(bool completed, const ProgressReport& final_progress) = 0;

  // A store whose keys are scoped to `generation`. Valid while the client lives.
  virtual std::unique_ptr<KeyValueStore> GenerationStore(int64_t generation) = 0;
};

// Why the service refused a join: the reason its status carries (Status::reason(); on the wire,
// an ErrorInfo in the status's details, proto/rendezvous.proto). Clients decide on these.
//  - DEADLINE_EXCEEDED, kNoGenerationFormed: the join's deadline passed with too few members.
//  - DEADLINE_EXCEEDED, kGenerationFull: the same, while the current generation is active and
//    has no room: the member is a hot standby (a job's `spec.elastic.standby`, or a replacement
//    whose place a standby took).
//  - FAILED_PRECONDITION, kJobCompleted: the job has completed training: a standby or a late
//    replacement has nothing to do, and ends as a success.
inline constexpr char kReasonNoGenerationFormed[] = "NO_GENERATION_FORMED";
inline constexpr char kReasonGenerationFull[] = "GENERATION_FULL";
inline constexpr char kReasonJobCompleted[] = "JOB_COMPLETED";
// A store call past one of the job's limits (generation_stores.h, StoreLimits): RESOURCE_EXHAUSTED.
inline constexpr char kReasonStoreLimit[] = "STORE_LIMIT";
// The texts the service's messages keep for clients from before the reasons, which read them
// (tests/common/rendezvous/wire_compat_test.cc).
inline constexpr char kGenerationFullMarker[] = "is active and full";
inline constexpr char kJobCompletedMarker[] = "has completed; nothing to join";
inline constexpr char kNoGenerationMarker[] = "members present";
// Why a join was refused: the reason the service gave; from a service of the release before the
// reasons (an operator not yet upgraded, the answer without details), the one its message's
// words meant, so that a worker newer than its operator still stands by and ends. "" for any
// other answer (a deadline of the transport, a refused connection).
std::string JoinRefusalReason(const Status& status);
// Whether `status` (of a join) is the answer that the job has completed.
inline bool JobCompletedWhileJoining(const Status& status) {
  return status.code() == StatusCode::kFailedPrecondition &&
         JoinRefusalReason(status) == kReasonJobCompleted;
}

// Joins, and joins again for as long as the service answers that the generation is full: a
// standby waits, process started and data loaded, until a member is lost and the next
// generation admits it. Once it has stood by, any join past its deadline is joined again. Each
// join is bounded by timeout_ms; between them `keep_waiting` is asked (false: the last answer is
// returned). The first time it stands by it logs so and calls `on_standby` (either callback may
// be empty). Any other answer is returned as it is.
StatusOr<Assignment> JoinOrStandBy(RendezvousClient& client, int64_t state_step,
                                   int64_t timeout_ms, const std::function<bool()>& keep_waiting,
                                   const std::function<void()>& on_standby = {});

}  // namespace lockstep::rendezvous
