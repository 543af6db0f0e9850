#include "bench/rendezvous/gloo_store_calls.h"

#include <chrono>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "worker/comm/gloo/kv_store_adapter.h"

namespace lockstep::rendezvous::load {

namespace {
// gloo::transport::tcp::Address::bytes(): a sockaddr_storage and a sequence number.
constexpr size_t kGlooAddressBytes = 136;
}  // namespace

Status GlooBootstrapStoreCalls(KeyValueStore& store, int rank, int size, int64_t timeout_ms) {
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  comm::KvStoreAdapter adapter(store, "gloo/", deadline);
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  try {
    // libgloo's connectFullMesh: its hostname (for local ranks), the lower ranks' hostnames,
    // then its pairs' addresses, and each peer's list once it exists.
    const std::string host = "pod-" + std::to_string(rank);
    adapter.set("rank_" + std::to_string(rank), std::vector<char>(host.begin(), host.end()));
    for (int peer = 0; peer < rank; ++peer) adapter.get("rank_" + std::to_string(peer));
    adapter.set(std::to_string(rank),
                std::vector<char>(kGlooAddressBytes * static_cast<size_t>(size - 1),
                                  static_cast<char>(rank)));
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      adapter.wait({std::to_string(peer)}, timeout);
      adapter.get(std::to_string(peer));
    }
  } catch (const std::exception& e) {
    Status error = adapter.last_error();
    return error.ok() ? InternalError(e.what()) : error;
  }
  // The communicator's ExchangePeerAddresses: one line per peer, everyone's lists read back.
  std::string mine;
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) mine += "10.0." + std::to_string(rank % 250) + ".1:" + std::to_string(40000 + peer);
    mine += '\n';
  }
  const std::string prefix = "lockstep/gloo_peer_addresses/";
  LOCKSTEP_RETURN_IF_ERROR(store.Set(prefix + std::to_string(rank), mine, deadline.remaining_ms()));
  std::vector<std::string> keys;
  for (int peer = 0; peer < size; ++peer) keys.push_back(prefix + std::to_string(peer));
  return store.Get(keys, deadline.remaining_ms()).status();
}

}  // namespace lockstep::rendezvous::load
