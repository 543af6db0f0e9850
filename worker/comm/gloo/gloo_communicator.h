// GlooCommunicator: the Communicator over Debian's libgloo with its TCP transport.
//
// Bootstrap: ranks exchange their addresses through a rendezvous KeyValueStore scoped to the
// generation (an adapter to gloo::rendezvous::Store) and connect a full mesh.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/rendezvous/kv_store.h"
#include "common/status.h"
#include "worker/comm/communicator.h"

namespace lockstep::comm {

struct GlooOptions {
  int rank = 0;
  int size = 1;
  // Interface address this rank listens on; peers must reach it ("127.0.0.1" locally; the pod IP
  // in a cluster).
  std::string listen_host = "127.0.0.1";
  // Deadline for the full-mesh connection at bootstrap.
  int64_t connect_timeout_ms = 30000;
};

StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options,
                                                               rendezvous::KeyValueStore& store);

}  // namespace lockstep::comm
