// The store calls of a Gloo full-mesh bootstrap, without the sockets: what one rank of Lockstep's
// Gloo communicator (worker/comm/gloo) asks of the rendezvous store when a generation forms, so
// that the bench can make them for a thousand ranks on one machine.
#pragma once

#include <cstdint>

#include "common/rendezvous/kv_store.h"
#include "common/status.h"

namespace lockstep::rendezvous::load {

// Makes rank `rank` of `size`'s calls through the communicator's own store adapter: libgloo's
// connectFullMesh (this libgloo, 0.0~git20220518, as tests/.../gloo_store_calls_test checks
// against the library itself) with made-up pair addresses of the library's size, then the
// communicator's exchange of the addresses its pairs listen on.
Status GlooBootstrapStoreCalls(KeyValueStore& store, int rank, int size, int64_t timeout_ms);

}  // namespace lockstep::rendezvous::load
