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
#include "common/rendezvous/job_state.h"
#include "common/status.h"

namespace lockstep::rendezvous {

// What the service's connection buffers may hold together (a gRPC resource quota).
inline constexpr int64_t kRendezvousMemoryQuotaBytes = int64_t{256} << 20;

struct ServerOptions {
  std::string listen_address = "127.0.0.1:0";  // port 0: pick a free port
  // TLS: PEM certificate chain and key; both empty for plaintext.
  std::string tls_cert_pem;
  std::string tls_key_pem;
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
  // Where pod `pod` of `job` sits in the network, coarse to fine (topology_order.h): a job
  // registered with order_by_topology numbers its pods by it. Ignored for an unknown job.
  virtual void SetPodTopology(const std::string& job, const std::string& pod,
                              TopologyPath path) = 0;
  virtual StatusOr<JobSnapshot> Snapshot(const std::string& job) const = 0;
  // Stops accepting calls, fails pending ones with UNAVAILABLE, returns within deadline_ms.
  virtual void Shutdown(int64_t deadline_ms) = 0;
};

}  // namespace lockstep::rendezvous
