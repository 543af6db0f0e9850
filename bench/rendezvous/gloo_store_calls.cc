#include "bench/rendezvous/gloo_store_calls.h"

#include <string>
#include <vector>

#include "common/deadline.h"
#include "worker/comm/gloo/pair_addresses.h"

namespace lockstep::rendezvous::load {

namespace {
// gloo::transport::tcp::Address::bytes(): a sockaddr_storage and a sequence number.
constexpr size_t kGlooAddressBytes = 136;

std::string MadeUpAddress(int rank, int peer) {
  std::string address(kGlooAddressBytes, '\0');
  const std::string text = std::to_string(rank) + "/" + std::to_string(peer);
  address.replace(0, text.size(), text);
  return address;
}
}  // namespace

Status GlooBootstrapStoreCalls(KeyValueStore& store, int rank, int size, int64_t timeout_ms) {
  std::vector<std::string> mine(size);
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) mine[peer] = MadeUpAddress(rank, peer);
  }
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::string> theirs,
                            comm::ExchangePairAddresses(store, rank, size, mine, 0, deadline));
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank && theirs[peer] != MadeUpAddress(peer, rank)) {
      return InternalError("rank " + std::to_string(rank) + " got the wrong address of rank " +
                           std::to_string(peer));
    }
  }
  // Every pair connected: the verdict the ranks agree on before the mesh is used.
  return comm::AgreeOnConnect(store, rank, size, 0, OkStatus(), /*may_retry=*/true, deadline);
}

Status LibglooConnectFullMeshStoreCalls(KeyValueStore& store, int rank, int size,
                                        int64_t timeout_ms) {
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  const std::string host = "pod-" + std::to_string(rank);
  LOCKSTEP_RETURN_IF_ERROR(store.Set("gloo/rank_" + std::to_string(rank), host, deadline.remaining_ms()));
  for (int peer = 0; peer < rank; ++peer) {
    LOCKSTEP_RETURN_IF_ERROR(
        store.Get({"gloo/rank_" + std::to_string(peer)}, deadline.remaining_ms()).status());
  }
  LOCKSTEP_RETURN_IF_ERROR(store.Set("gloo/" + std::to_string(rank),
                                     std::string(kGlooAddressBytes * static_cast<size_t>(size - 1), 'a'),
                                     deadline.remaining_ms()));
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    // Store::wait, then Store::get: two calls for each peer's whole list.
    LOCKSTEP_RETURN_IF_ERROR(store.Get({"gloo/" + std::to_string(peer)}, deadline.remaining_ms()).status());
    LOCKSTEP_RETURN_IF_ERROR(store.Get({"gloo/" + std::to_string(peer)}, deadline.remaining_ms()).status());
  }
  return OkStatus();
}

}  // namespace lockstep::rendezvous::load
