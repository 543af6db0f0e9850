// What workers dial to reach the rendezvous service.
//
// By default the operator hands workers the rendezvous Service's DNS name; with
// --rendezvous-service it hands them the Service's cluster IP instead, read from the API server
// at start-up, so that workers need no cluster DNS (a cluster without CoreDNS, or pods whose
// dnsPolicy points elsewhere). The cluster IP of a Service does not change while it exists.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "operator/kube/kube_client.h"

namespace lockstep::op {

// "CLUSTER_IP:PORT" of Service ns/name: the port named "*rendezvous*", or the only one. Retries
// while the Service is missing or has no cluster IP yet, until timeout_ms; a headless Service
// (clusterIP None) or one with several unnamed ports is an error naming the Service.
StatusOr<std::string> RendezvousServiceAddress(kube::KubeClient* client, const std::string& ns,
                                               const std::string& name, int64_t timeout_ms);

}  // namespace lockstep::op
