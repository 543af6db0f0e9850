// The gRPC channel a rendezvous client talks over: its credentials, keepalive and message bound.
// RendezvousClient::Connect uses it, and so does the load generator of simulated members
// (bench/rendezvous), so that what the service is measured against is what workers send.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace lockstep::rendezvous {

// tls_ca_pem: PEM of the CA that signed the service's certificate; empty for plaintext.
// own_connection: the channel opens a connection of its own instead of sharing the process's
// subchannel with other channels to the same address (a process that stands for many workers,
// each of which would have its own connection).
std::shared_ptr<grpc::Channel> NewRendezvousChannel(const std::string& address,
                                                    const std::string& tls_ca_pem,
                                                    bool own_connection = false);

}  // namespace lockstep::rendezvous
