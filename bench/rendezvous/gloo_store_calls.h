// The store calls of a Gloo full-mesh bootstrap, without the sockets: what one rank of Lockstep's
// Gloo communicator (worker/comm/gloo) asks of the rendezvous store when a generation forms, so
// that the bench can make them for a thousand ranks on one machine.
#pragma once

#include <cstdint>

#include "common/rendezvous/kv_store.h"
#include "common/status.h"

namespace lockstep::rendezvous::load {

// Rank `rank` of `size`: the communicator's own exchange (worker/comm/gloo/pair_addresses.h),
// with made-up pair addresses of libgloo's size, and the verdict after
// connecting (AgreeOnConnect).
Status GlooBootstrapStoreCalls(KeyValueStore& store, int rank, int size, int64_t timeout_ms);

// The same rank's calls as libgloo's own connectFullMesh makes them (0.0~git20220518: its
// hostname, the lower ranks' hostnames, its pairs' addresses, then a wait and a get of each
// peer's whole list), to compare.
Status LibglooConnectFullMeshStoreCalls(KeyValueStore& store, int rank, int size,
                                        int64_t timeout_ms);

}  // namespace lockstep::rendezvous::load
