#include "common/rendezvous/client_environment.h"

#include "common/env.h"
#include "common/pem_file.h"

namespace lockstep::rendezvous {

StatusOr<ClientOptions> ClientOptionsFromEnvironment(const std::string& job_name) {
  for (const char* name : {"LOCKSTEP_RENDEZVOUS", "LOCKSTEP_JOB_TOKEN", "LOCKSTEP_POD"}) {
    if (EnvString(name, "").empty()) {
      return InvalidArgumentError(std::string("environment variable ") + name + " is not set");
    }
  }
  ClientOptions options;
  options.address = EnvString("LOCKSTEP_RENDEZVOUS", "");
  options.job = job_name;
  options.token = EnvString("LOCKSTEP_JOB_TOKEN", "");
  options.member_id = EnvString("LOCKSTEP_POD", "");
  const std::string local_rank = EnvString("LOCKSTEP_LOCAL_RANK", "");
  if (!local_rank.empty()) {
    // One of the pod's ranks (worker/agent/pod_supervisor.h): the pod is the member the
    // launcher and the operator know; this rank is "<pod>/<local rank>" within it.
    const int64_t ranks = EnvInt("LOCKSTEP_LOCAL_WORLD_SIZE", 1);
    const int64_t rank = EnvInt("LOCKSTEP_LOCAL_RANK", -1);
    if (rank < 0 || rank >= ranks || std::to_string(rank) != local_rank) {
      return InvalidArgumentError("LOCKSTEP_LOCAL_RANK=" + local_rank + ": expected 0.." +
                                  std::to_string(ranks - 1) +
                                  " (LOCKSTEP_LOCAL_WORLD_SIZE=" + std::to_string(ranks) + ")");
    }
    options.pod = options.member_id;
    options.local_rank = static_cast<int32_t>(rank);
    options.member_id = options.pod + "/" + local_rank;
  }
  options.host = EnvString("LOCKSTEP_HOST", "127.0.0.1");
  const int64_t reconnect_ms =
      EnvInt("LOCKSTEP_RENDEZVOUS_RECONNECT_MS", options.reconnect_timeout_ms);
  if (reconnect_ms < 0) {
    return InvalidArgumentError("LOCKSTEP_RENDEZVOUS_RECONNECT_MS=" + std::to_string(reconnect_ms) +
                                ": expected milliseconds >= 0");
  }
  options.reconnect_timeout_ms = reconnect_ms;
  LOCKSTEP_ASSIGN_OR_RETURN(options.tls_ca_pem, PemFileNamedBy("LOCKSTEP_RENDEZVOUS_CA_FILE",
                                                               kPemCertificate, "PEM certificate"));
  return options;
}

}  // namespace lockstep::rendezvous
