// The worker side of the environment contract (docs/architecture.md, "The worker's environment"):
// how a worker or the exec agent finds its rendezvous service, from the variables the operator or
// `lockstep run` set.
//
//   LOCKSTEP_RENDEZVOUS          host:port of the service (required)
//   LOCKSTEP_JOB_TOKEN           the job's token (required; never logged)
//   LOCKSTEP_POD                 this member's id (required): the pod's name
//   LOCKSTEP_LOCAL_RANK          set by the pod supervisor when a pod runs several ranks: this
//                                rank's place in the pod, 0..LOCKSTEP_LOCAL_WORLD_SIZE-1; the
//                                member id is then "<LOCKSTEP_POD>/<local rank>" and the pod
//                                joins as one unit (proto/rendezvous.proto, "Pods")
//   LOCKSTEP_HOST                the address peers reach this member at (default 127.0.0.1)
//   LOCKSTEP_RENDEZVOUS_CA_FILE  PEM of the CA that signed the service's certificate: TLS when
//                                set (the operator mounts it from the job's Secret), plaintext
//                                otherwise (loopback, `lockstep run`)
#pragma once

#include <string>

#include "common/rendezvous/client.h"
#include "common/status.h"

namespace lockstep::rendezvous {

// INVALID_ARGUMENT naming the variable when a required one is missing or the CA file cannot be
// read.
StatusOr<ClientOptions> ClientOptionsFromEnvironment(const std::string& job_name);

}  // namespace lockstep::rendezvous
