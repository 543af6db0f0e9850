// The Gloo communicator's full mesh: a TCP pair per peer, each connected to the address the
// peer's pair with this rank listens on (pair_addresses.h), tried again when a connection fails.
//
// Why a second try. libgloo 0.0~git20220518 gives each pair its own listening socket and accepts
// the first connection that arrives there, from anyone: a stray connection to a freshly bound port
// (a client still retrying a server that has gone, whose port the kernel handed out again) is
// taken for the peer, and the peer's own connection is then reset. CI saw it once in ~70 runs
// (`connect [127.0.0.1]:23971: Connection reset by peer`), and every other rank then waited five
// times its connect timeout (a pair waits 5x its timeout to connect). pytorch/gloo#413 (2025)
// answered the same class of failure with connection retries; the Debian package predates it.
// So here:
//  - a pair that fails does not stop the others: the rank still connects its remaining pairs, so
//    no peer waits for a connection that will never come; pairs get a fifth of the time left;
//  - every pair is greeted, so a connection that is not the peer's is found now;
//  - the ranks then agree through the store whether every pair of every rank connected
//    (AgreeOnConnect; rank 0 decides whether to try again), and on a failure all of them drop the
//    attempt and build the mesh anew on fresh ports, up to kConnectAttempts times within the
//    connect deadline.
// A peer that never arrives is not retried: the others' waits end at the deadline.
#pragma once

#include <sys/socket.h>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/rendezvous/kv_store.h"
#include "common/status.h"
#include "worker/comm/gloo/gloo_communicator.h"

namespace lockstep::comm {

constexpr int kConnectAttempts = 3;

// Whether a libgloo error message speaks of a timeout (it has no distinct exception for one).
bool MentionsTimeout(const std::string& message);

// gloo::Context::setTimeout only changes the value later operations' options copy; the buffers
// that gloo::allreduce waits on internally (its scratch buffer) use the transport context's
// timeout, which the public API sets once at connect time. This subclass sets both, so every
// call really returns by its own deadline.
//
// It also makes the full mesh itself, as gloo::rendezvous::Context::connectFullMesh does, except
// for how the addresses travel (pair_addresses.h: size - 1 addresses per rank where
// connectFullMesh reads (size - 1)^2) and for what a failed pair does to the others (above).
class TimeoutSettingContext : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;
  void SetOperationTimeout(std::chrono::milliseconds timeout) {
    setTimeout(timeout);
    if (transportContext_ != nullptr) transportContext_->setTimeout(timeout);
  }

  // Creates a pair per peer and returns the address each listens on, by peer ([rank] empty).
  std::vector<std::string> CreatePairs(const std::shared_ptr<::gloo::transport::Device>& device);

  // Connects each pair to `theirs[peer]`, the address of the peer's pair with this rank. A pair
  // that fails does not stop the others (until the deadline has passed); returns the first
  // failure, naming the peer.
  Status ConnectPairs(const std::vector<std::string>& theirs, const GlooOptions& options,
                      const Deadline& deadline);
};

// A connected mesh and the addresses Abort() and error messages need.
struct FullMesh {
  std::shared_ptr<TimeoutSettingContext> context;
  // peer_addresses[r]: rank r's socket address as this rank's connection to r sees it.
  std::vector<std::string> peer_addresses;
  // This rank's listening address for each peer, and the peers' (in peer order, self left out).
  std::vector<sockaddr_storage> local, remote;
};

// Connects the mesh within options.connect_timeout_ms. DEADLINE_EXCEEDED when it runs out,
// UNAVAILABLE when every attempt had a failed connection, INVALID_ARGUMENT or INTERNAL for what
// no retry mends.
StatusOr<FullMesh> ConnectFullMesh(const GlooOptions& options, rendezvous::KeyValueStore& store);

}  // namespace lockstep::comm
