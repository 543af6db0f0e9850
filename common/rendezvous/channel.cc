#include "common/rendezvous/channel.h"

#include "common/rendezvous/client.h"

namespace lockstep::rendezvous {

std::shared_ptr<grpc::Channel> NewRendezvousChannel(const std::string& address,
                                                    const std::string& tls_ca_pem,
                                                    bool own_connection) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (!tls_ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = tls_ca_pem;
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  // A Join can wait minutes without traffic, and a dead peer must be noticed even then.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A member whose service went away (an operator's leader replaced) reconnects within about a
  // second of its successor listening, not after gRPC's default backoff of up to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // The minimum backoff is each attempt's connect timeout, TLS handshake included: gRPC's 20 s,
  // said here because a resume waits for it (kConnectAttemptTimeoutMs). Shorter ones (100 ms,
  // 4 s) failed every handshake with a new leader on the two-node cluster, for reasons not yet
  // understood.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(kConnectAttemptTimeoutMs));
  // Small messages only: no bandwidth-delay probing (server.cc says why).
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // The service sends back what its clients may send it (a store value, server.h's bound).
  args.SetMaxReceiveMessageSize(kMaxRendezvousRequestBytes);
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, credentials, args);
}

}  // namespace lockstep::rendezvous
