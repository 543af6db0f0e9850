#include "worker/comm/hierarchical/hierarchical_communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/deadline.h"
#include "common/rendezvous/host_placement.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/prefixed_store.h"
#include "worker/comm/shm/shm_communicator.h"

namespace lockstep::comm {
namespace {

// At or below this many bytes an all-reduce takes one ring across hosts (local rank 0's) instead
// of one per local rank: the same bytes cross the network, in half the TCP streams and rounds.
// Measured with bench/pods on the 2-core VM, 2 pods x 2 ranks over a 10 Gbit/s veth: at 1 MiB
// the single ring is 1.25-1.3x faster than the parallel ones, at 2-16 MiB 1.1-1.25x slower
// (docs/benchmarks.md).
constexpr size_t kSingleRingMaxBytes = size_t{1} << 20;

class HierarchicalCommunicator : public Communicator {
 public:
  HierarchicalCommunicator(HostLayout layout, int rank, std::unique_ptr<Communicator> local,
                           std::unique_ptr<Communicator> cross)
      : layout_(std::move(layout)),
        rank_(rank),
        local_rank_(layout_.local_of[rank]),
        local_(std::move(local)),
        cross_(std::move(cross)) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(layout_.host_of.size()); }
  std::string backend() const override { return "shm+gloo"; }

  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                   int64_t timeout_ms) override {
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    // An empty all-reduce moves nothing but answers UNIMPLEMENTED for a type or op the backend
    // lacks: asked first, so that such a call leaves `data` untouched, as the contract says
    // (the trainer then falls back to an all-gather of the same data).
    LOCKSTEP_RETURN_IF_ERROR(cross_->AllReduce(data, 0, type, op, timeout_ms));
    LOCKSTEP_RETURN_IF_ERROR(local_->AllReduce(data, 0, type, op, timeout_ms));
    if (layout_.host_count == 1) return local_->AllReduce(data, count, type, op, timeout_ms);
    const int parts = layout_.ranks_per_host;
    if (parts == 1) return cross_->AllReduce(data, count, type, op, timeout_ms);
    const size_t element = DataTypeSize(type);
    if (count * element <= kSingleRingMaxBytes) {
      // Small: all-reduce inside the host, local rank 0 across hosts, broadcast inside the host.
      LOCKSTEP_RETURN_IF_ERROR(local_->AllReduce(data, count, type, op, timeout_ms));
      if (local_rank_ == 0) {
        LOCKSTEP_RETURN_IF_ERROR(
            cross_->AllReduce(data, count, type, op, deadline.remaining_ms()));
      }
      return local_->Broadcast(data, count * element, 0, deadline.remaining_ms());
    }
    // Part l (ReduceScatter's partition): reduced inside the host by local rank l, then across
    // hosts by the l-th ranks, then gathered inside the host.
    LOCKSTEP_RETURN_IF_ERROR(local_->ReduceScatter(data, count, type, op, timeout_ms));
    const size_t per = PartBegin(count, parts, 1);
    const size_t begin = PartBegin(count, parts, local_rank_);
    const size_t end = PartBegin(count, parts, local_rank_ + 1);
    char* bytes = static_cast<char*>(data);
    if (end > begin) {
      LOCKSTEP_RETURN_IF_ERROR(cross_->AllReduce(bytes + begin * element, end - begin, type, op,
                                                 deadline.remaining_ms()));
    }
    const size_t part_bytes = per * element;
    if (per * parts == count) {
      // Equal parts: gathered in place (the shm all-gather reads this rank's part before it
      // writes any other rank's, and leaves this rank's where it is), saving a copy.
      return local_->AllGather(bytes + begin * element, part_bytes, bytes,
                               deadline.remaining_ms());
    }
    // Every part padded to `per` elements for the all-gather (equal sizes per rank).
    const void* mine = bytes + begin * element;
    if (end - begin < per) {
      padded_.assign(part_bytes, 0);
      std::memcpy(padded_.data(), mine, (end - begin) * element);
      mine = padded_.data();
    }
    gathered_.resize(part_bytes * parts);
    LOCKSTEP_RETURN_IF_ERROR(
        local_->AllGather(mine, part_bytes, gathered_.data(), deadline.remaining_ms()));
    std::memcpy(bytes, gathered_.data(), count * element);
    return OkStatus();
  }

  Status Broadcast(void* data, size_t bytes, int root, int64_t timeout_ms) override {
    if (root < 0 || root >= size()) {
      return InvalidArgumentError("broadcast: root " + std::to_string(root) + " outside 0.." +
                                  std::to_string(size() - 1));
    }
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    const int root_local = layout_.local_of[root];
    if (local_rank_ == root_local) {
      LOCKSTEP_RETURN_IF_ERROR(cross_->Broadcast(data, bytes, layout_.host_of[root], timeout_ms));
    }
    return local_->Broadcast(data, bytes, root_local, deadline.remaining_ms());
  }

  Status AllGather(const void* in, size_t bytes_per_rank, void* out,
                   int64_t timeout_ms) override {
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    const size_t host_block = bytes_per_rank * layout_.ranks_per_host;
    std::vector<char> mine(host_block);
    LOCKSTEP_RETURN_IF_ERROR(local_->AllGather(in, bytes_per_rank, mine.data(), timeout_ms));
    std::vector<char> all(host_block * layout_.host_count);
    LOCKSTEP_RETURN_IF_ERROR(
        cross_->AllGather(mine.data(), host_block, all.data(), deadline.remaining_ms()));
    // Blocks arrive by (host, local index); `out` is by rank.
    char* gathered = static_cast<char*>(out);
    for (int h = 0; h < layout_.host_count; ++h) {
      for (int l = 0; l < layout_.ranks_per_host; ++l) {
        std::memcpy(gathered + static_cast<size_t>(layout_.RankAt(h, l)) * bytes_per_rank,
                    all.data() + static_cast<size_t>(h) * host_block +
                        static_cast<size_t>(l) * bytes_per_rank,
                    bytes_per_rank);
      }
    }
    return OkStatus();
  }

  Status Barrier(int64_t timeout_ms) override {
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    LOCKSTEP_RETURN_IF_ERROR(local_->Barrier(timeout_ms));
    LOCKSTEP_RETURN_IF_ERROR(cross_->Barrier(deadline.remaining_ms()));
    return local_->Barrier(deadline.remaining_ms());
  }

  // Through the communicator that connects the two ranks: the host's (shared memory) for a
  // peer on this host, the cross-host one for the peer of the same local index on another
  // host. A pipeline laid out with its stages on one host (ranksPerWorker) needs only the
  // first. Other peers are not connected to this rank: UNIMPLEMENTED, naming them.
  Status SendRecv(const void* send, size_t send_bytes, int send_peer, void* recv,
                  size_t recv_bytes, int recv_peer, int64_t timeout_ms) override {
    LOCKSTEP_RETURN_IF_ERROR(CheckSendRecv(backend(), rank_, size(), send, send_bytes, send_peer,
                                           recv, recv_bytes, recv_peer));
    const int host = layout_.host_of[rank_];
    // Which communicator reaches `peer` (0 local, 1 cross, -1 none) and the peer's rank in it.
    auto route = [&](int peer) -> std::pair<int, int> {
      if (peer < 0) return {-2, -1};
      if (layout_.host_of[peer] == host) return {0, layout_.local_of[peer]};
      if (layout_.local_of[peer] == local_rank_) return {1, layout_.host_of[peer]};
      return {-1, -1};
    };
    const auto [send_via, send_to] = route(send_peer);
    const auto [recv_via, recv_from] = route(recv_peer);
    for (const auto& [via, peer] :
         {std::pair{send_via, send_peer}, std::pair{recv_via, recv_peer}}) {
      if (via == -1) {
        return UnimplementedError(
            "shm+gloo send/recv: rank " + std::to_string(rank_) + " (host " +
            std::to_string(host) + ", local index " + std::to_string(local_rank_) +
            ") has no connection to rank " + std::to_string(peer) + " (host " +
            std::to_string(layout_.host_of[peer]) + ", local index " +
            std::to_string(layout_.local_of[peer]) +
            "): point to point reaches the ranks of this host and the same local index on "
            "other hosts");
      }
    }
    if (send_via >= 0 && recv_via >= 0 && send_via != recv_via) {
      return UnimplementedError("shm+gloo send/recv: rank " + std::to_string(rank_) +
                                " would send to rank " + std::to_string(send_peer) +
                                " and receive from rank " + std::to_string(recv_peer) +
                                " over different transports at once");
    }
    Communicator& via = (send_via >= 0 ? send_via : recv_via) == 0 ? *local_ : *cross_;
    return via.SendRecv(send, send_bytes, send_to, recv, recv_bytes, recv_from, timeout_ms);
  }

  void Abort(const std::string& reason) override {
    local_->Abort(reason);
    cross_->Abort(reason);
  }

 private:
  const HostLayout layout_;
  const int rank_;
  const int local_rank_;
  std::unique_ptr<Communicator> local_;
  std::unique_ptr<Communicator> cross_;
  // AllReduce's staging, kept across calls (the trainer reduces the same buckets every step).
  std::vector<char> padded_;
  std::vector<char> gathered_;
};

}  // namespace

std::optional<HostLayout> LayoutByHost(const std::vector<std::string>& member_hosts) {
  if (member_hosts.empty()) return std::nullopt;
  const std::vector<rendezvous::HostPlacement> placed = rendezvous::PlaceOnHosts(member_hosts);
  HostLayout layout;
  layout.host_count = placed[0].host_count;
  layout.ranks_per_host = placed[0].local_size;
  layout.ranks_of_host.resize(static_cast<size_t>(layout.host_count));
  for (size_t rank = 0; rank < placed.size(); ++rank) {
    if (placed[rank].local_size != layout.ranks_per_host) return std::nullopt;
    layout.host_of.push_back(placed[rank].host_rank);
    layout.local_of.push_back(placed[rank].local_rank);
    layout.ranks_of_host[placed[rank].host_rank].push_back(static_cast<int>(rank));
  }
  return layout;
}

HostLayout ContiguousLayout(int host_count, int ranks_per_host) {
  HostLayout layout;
  layout.host_count = host_count;
  layout.ranks_per_host = ranks_per_host;
  layout.ranks_of_host.resize(static_cast<size_t>(std::max(host_count, 0)));
  for (int host = 0; host < host_count; ++host) {
    for (int local = 0; local < ranks_per_host; ++local) {
      layout.host_of.push_back(host);
      layout.local_of.push_back(local);
      layout.ranks_of_host[host].push_back(host * ranks_per_host + local);
    }
  }
  return layout;
}

std::unique_ptr<Communicator> ComposeHierarchical(HostLayout layout, int rank,
                                                  std::unique_ptr<Communicator> local,
                                                  std::unique_ptr<Communicator> cross) {
  return std::make_unique<HierarchicalCommunicator>(std::move(layout), rank, std::move(local),
                                                    std::move(cross));
}

StatusOr<std::unique_ptr<Communicator>> CreateHierarchicalCommunicator(
    const HierarchicalOptions& options, rendezvous::KeyValueStore& store) {
  const HostLayout& layout = options.layout;
  if (layout.host_of.empty()) {
    return InvalidArgumentError("communicator shm+gloo: the layout of ranks on hosts is empty");
  }
  if (options.rank < 0 || options.rank >= static_cast<int>(layout.host_of.size())) {
    return InvalidArgumentError("communicator shm+gloo: rank " + std::to_string(options.rank) +
                                " outside the " + std::to_string(layout.host_of.size()) +
                                " members");
  }
  const Deadline deadline = Deadline::AfterMs(options.connect_timeout_ms);
  const int host = layout.host_of[options.rank];
  const int local_rank = layout.local_of[options.rank];

  PrefixedStore host_store(store, "host/" + std::to_string(host) + "/");
  ShmOptions shm;
  shm.rank = local_rank;
  shm.size = layout.ranks_per_host;
  shm.job_name = options.job_name;
  shm.generation = options.generation;
  shm.connect_timeout_ms = options.connect_timeout_ms;
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> local,
                            CreateShmCommunicator(shm, host_store));

  PrefixedStore local_store(store, "local/" + std::to_string(local_rank) + "/");
  GlooOptions gloo;
  gloo.rank = host;
  gloo.size = layout.host_count;
  gloo.listen_host = options.host;
  gloo.connect_timeout_ms = deadline.remaining_ms();
  LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> cross,
                            CreateGlooCommunicator(gloo, local_store));
  return ComposeHierarchical(layout, options.rank, std::move(local), std::move(cross));
}

}  // namespace lockstep::comm
