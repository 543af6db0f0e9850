// How the Gloo communicator's ranks learn each other's pair addresses through the rendezvous store.
//
// Each rank publishes one list: the address of its pair with every peer, fixed-size records in
// peer order with its own place left out. A rank needs one record of each peer's list, the one
// for itself (index rank - 1 in the lists of lower ranks, index rank in those of higher ranks),
// so it reads exactly those with two ranged gets (KeyValueStore::GetRange), which the rendezvous
// service cuts before sending. One set and two gets per rank, size - 1 records received.
// After connecting, AgreeOnConnect (below) costs one set and one get more per rank (and at
// rank 0 a get of every rank's word and the verdict's set).
//
// libgloo's connectFullMesh (0.0~git20220518, which the communicator used before) reads every
// peer's whole list with a wait and a get per peer: 2 * (size - 1) calls and (size - 1)^2 records
// of 136 bytes per rank, 145 GB through the service at 1,024 ranks (the scaling problem of
// pytorch/gloo#408, which batched its reads).
#pragma once

#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/rendezvous/kv_store.h"
#include "common/status.h"

namespace lockstep::comm {

// `mine[peer]`: the address this rank's pair with `peer` listens on (mine[rank] is ignored); all
// of one length. Returns each peer's address for its pair with this rank ([rank] empty).
// `attempt` counts the tries at the mesh from 0 (full_mesh.h); each has its own keys.
StatusOr<std::vector<std::string>> ExchangePairAddresses(rendezvous::KeyValueStore& store,
                                                         int rank, int size,
                                                         const std::vector<std::string>& mine,
                                                         int attempt, const Deadline& deadline);

// After an attempt, whether every rank's pairs connected. Each rank sets whether its own did
// (`mine`), rank 0 reads all of them and sets the verdict, and every rank reads that: one set and
// one get per rank, and at rank 0 also a get of `size` keys and the verdict's set, so that all
// ranks decide alike. OK when all connected; UNAVAILABLE when one could not, a new attempt may
// mend it (a transport fault: a reset, a connection that was not the peer's) and rank 0's
// `may_retry` allows one; INTERNAL otherwise. Both name the rank and its reason. A store error
// (its deadline) is returned as it is.
Status AgreeOnConnect(rendezvous::KeyValueStore& store, int rank, int size, int attempt,
                      const Status& mine, bool may_retry, const Deadline& deadline);

}  // namespace lockstep::comm
