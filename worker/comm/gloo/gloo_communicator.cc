#include "worker/comm/gloo/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "common/deadline.h"
#include "common/logging.h"
#include "worker/comm/gloo/full_mesh.h"
#include "worker/comm/gloo/half_reduce.h"
#include "worker/comm/gloo/socket_shutdown.h"

namespace lockstep::comm {
namespace {

// All-reduce algorithm choice (measured with bench/allreduce on loopback, 2 ranks, float32).
//
// Only gloo::allreduce (the "new-style" collective over unbound buffers) honours a per-call
// timeout: the older algorithm classes (AllreduceRing, AllreduceRingChunked,
// AllreduceHalvingDoubling) wait on bound buffers whose timeout is fixed when the pairs are
// connected, which breaks the contract that every call returns within its own timeout_ms. So
// the choice is between gloo::allreduce's two algorithms:
//  - RING: reduce-scatter then all-gather in 1 MiB segments with two in flight; every rank sends
//    2(n-1)/n of the buffer, the bandwidth-optimal amount, in 2(n-1) steps.
//  - BCUBE: recursive halving/doubling over groups of context->base; log2(n) steps, so fewer
//    round trips, but it sends each step's whole half at once (no segment pipelining).
// Small buffers are latency-bound, where BCUBE's fewer steps win; large ones are
// bandwidth-bound, where RING's pipelined segments keep the link and the reduction busy at once.
// Measured (2 ranks, loopback, shared 2-core host, so noisy): BCUBE 2-4x faster at 4 KiB-256 KiB
// (e.g. 256 KiB: 0.80 vs 1.00 ms), about even at 1 MiB, RING ahead from 2 MiB up (16 MiB:
// 25 vs 43 ms; 64 MiB: 163 vs 247 ms). Hence BCUBE up to 1 MiB. BCUBE is kept to power-of-two
// world sizes, where its groups divide evenly; other sizes always use RING.
constexpr size_t kBcubeMaxBytes = 1024 * 1024;

bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

gloo::AllreduceOptions::Algorithm ChooseAllreduceAlgorithm(size_t bytes, int world_size) {
  if (bytes <= kBcubeMaxBytes && IsPowerOfTwo(world_size)) {
    return gloo::AllreduceOptions::Algorithm::BCUBE;
  }
  return gloo::AllreduceOptions::Algorithm::RING;
}

ReduceFunction ReduceFunctionFor(DataType type, ReduceOp op) {
  auto pick = [op](auto tag) -> ReduceFunction {
    using T = decltype(tag);
    switch (op) {
      case ReduceOp::kSum:
        return static_cast<ReduceFunction>(&gloo::sum<T>);
      case ReduceOp::kMax:
        return static_cast<ReduceFunction>(&gloo::max<T>);
      case ReduceOp::kMin:
        return static_cast<ReduceFunction>(&gloo::min<T>);
    }
    return nullptr;
  };
  switch (type) {
    case DataType::kFloat32:
      return pick(float{});
    case DataType::kFloat64:
      return pick(double{});
    case DataType::kInt64:
      return pick(int64_t{});
    case DataType::kBFloat16:
    case DataType::kFloat16:
      return HalfReduceFunction(type, op);
  }
  return nullptr;
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const GlooOptions& options, std::shared_ptr<TimeoutSettingContext> context,
                   std::vector<std::string> peer_addresses, std::vector<sockaddr_storage> local,
                   std::vector<sockaddr_storage> remote)
      : options_(options),
        context_(std::move(context)),
        peer_addresses_(std::move(peer_addresses)),
        local_(std::move(local)),
        remote_(std::move(remote)) {}

  // Closes the connections with a reset, so that a peer blocked in (or starting) a collective
  // fails with UNAVAILABLE at once instead of waiting for its deadline. A healthy communicator
  // first lets what it sent arrive (socket_shutdown.h): a peer may still be receiving the end of
  // the last collective, which returned here once its bytes were handed to the kernel.
  ~GlooCommunicator() override {
    std::lock_guard<std::mutex> lock(context_mu_);
    allreduce_cache_.clear();
    if (!aborted_.load() && broken_.ok() &&
        !WaitUntilSentBytesAcknowledged(local_, remote_, kDeliverBeforeCloseMs)) {
      LOCKSTEP_LOG(WARNING) << "gloo communicator (rank " << options_.rank
                            << "): closing with bytes a peer has not acknowledged after "
                            << kDeliverBeforeCloseMs << " ms";
    }
    try {
      context_->closeConnections();
    } catch (const std::exception& e) {
      LOCKSTEP_LOG(WARNING) << "gloo: closing connections: " << e.what();
    }
    context_.reset();
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string backend() const override { return "gloo"; }

  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                   int64_t timeout_ms) override {
    ReduceFunction reduce = ReduceFunctionFor(type, op);
    if (reduce == nullptr) {
      return UnimplementedError(std::string("gloo all-reduce: no reduction ") + ReduceOpName(op) +
                                " for " + DataTypeName(type));
    }
    LOCKSTEP_RETURN_IF_ERROR(CheckUsable("all-reduce", timeout_ms));
    if (count == 0 || options_.size == 1) return OkStatus();
    return Run("all-reduce", timeout_ms, [&] {
      gloo::AllreduceOptions& opts = CachedAllreduceOptions(data, count, type, op);
      opts.setTag(NextTag());
      opts.setTimeout(std::chrono::milliseconds(timeout_ms));
      gloo::allreduce(opts);
    });
  }

  Status Broadcast(void* data, size_t bytes, int root, int64_t timeout_ms) override {
    if (root < 0 || root >= options_.size) {
      return InvalidArgumentError("gloo broadcast: root " + std::to_string(root) +
                                  " outside world of " + std::to_string(options_.size));
    }
    LOCKSTEP_RETURN_IF_ERROR(CheckUsable("broadcast", timeout_ms));
    if (bytes == 0 || options_.size == 1) return OkStatus();
    return Run("broadcast", timeout_ms, [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), bytes);
      opts.setRoot(root);
      opts.setTag(NextTag());
      opts.setTimeout(std::chrono::milliseconds(timeout_ms));
      gloo::broadcast(opts);
    });
  }

  Status AllGather(const void* in, size_t bytes_per_rank, void* out, int64_t timeout_ms) override {
    LOCKSTEP_RETURN_IF_ERROR(CheckUsable("all-gather", timeout_ms));
    if (bytes_per_rank == 0) return OkStatus();
    if (options_.size == 1) {
      std::memmove(out, in, bytes_per_rank);
      return OkStatus();
    }
    return Run("all-gather", timeout_ms, [&] {
      gloo::AllgatherOptions opts(context_);
      // Gloo's input pointer is non-const but it only reads from it.
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), bytes_per_rank);
      opts.setOutput(static_cast<uint8_t*>(out), bytes_per_rank * options_.size);
      opts.setTag(NextTag());
      opts.setTimeout(std::chrono::milliseconds(timeout_ms));
      gloo::allgather(opts);
    });
  }

  Status Barrier(int64_t timeout_ms) override {
    LOCKSTEP_RETURN_IF_ERROR(CheckUsable("barrier", timeout_ms));
    if (options_.size == 1) return OkStatus();
    return Run("barrier", timeout_ms, [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(NextTag());
      opts.setTimeout(std::chrono::milliseconds(timeout_ms));
      gloo::barrier(opts);
    });
  }

  // Gloo's unbound buffers: send posts the bytes under a slot, recv the buffer for a slot, and
  // the transport moves them once both sides are posted. A slot of its own per direction of a
  // pair and per message keeps the n-th send matched with the n-th recv, whatever collectives
  // run in between (those use Gloo's own slot prefixes and the shared tag). Each message is
  // preceded by its size (8 bytes, its own slot): Gloo's TCP transport would fill a longer
  // buffer silently, and fail an assertion in its event thread on a shorter one.
  Status SendRecv(const void* send, size_t send_bytes, int send_peer, void* recv,
                  size_t recv_bytes, int recv_peer, int64_t timeout_ms) override {
    LOCKSTEP_RETURN_IF_ERROR(CheckSendRecv("gloo", options_.rank, options_.size, send,
                                           send_bytes, send_peer, recv, recv_bytes, recv_peer));
    LOCKSTEP_RETURN_IF_ERROR(CheckUsable("send/recv", timeout_ms));
    if (sent_to_.empty()) {
      sent_to_.assign(options_.size, 0);
      received_from_.assign(options_.size, 0);
    }
    Status mismatch;
    Status status = Run("send/recv", timeout_ms, [&] {
      const Deadline deadline = Deadline::AfterMs(timeout_ms);
      auto remaining = [&] {
        return std::chrono::milliseconds(std::max<int64_t>(1, deadline.remaining_ms()));
      };
      auto check = [](bool done, const std::string& what) {
        if (!done) throw ::gloo::IoException(what + " aborted");
      };
      uint64_t out_size = send_bytes, in_size = 0;
      uint8_t empty = 0;  // Gloo needs a buffer even for an empty message
      std::unique_ptr<::gloo::transport::UnboundBuffer> out_header, out, in_header, in;
      if (send_peer >= 0) {
        const uint32_t n = sent_to_[send_peer]++;
        out_header = context_->createUnboundBuffer(&out_size, sizeof(out_size));
        out_header->send(send_peer, P2pSlot(options_.rank, send_peer, n, /*payload=*/false));
        out = context_->createUnboundBuffer(
            send_bytes > 0 ? const_cast<void*>(send) : &empty, send_bytes);
        out->send(send_peer, P2pSlot(options_.rank, send_peer, n, /*payload=*/true));
      }
      if (recv_peer >= 0) {
        const uint32_t n = received_from_[recv_peer]++;
        in_header = context_->createUnboundBuffer(&in_size, sizeof(in_size));
        in_header->recv(recv_peer, P2pSlot(recv_peer, options_.rank, n, /*payload=*/false));
        check(in_header->waitRecv(remaining()), "size from rank " + std::to_string(recv_peer));
        if (in_size != recv_bytes) {
          mismatch = InvalidArgumentError(
              "gloo recv on rank " + std::to_string(options_.rank) + ": rank " +
              std::to_string(recv_peer) + " sent a message of " + std::to_string(in_size) +
              " bytes where " + std::to_string(recv_bytes) + " were expected");
          return;
        }
        in = context_->createUnboundBuffer(recv_bytes > 0 ? recv : &empty, recv_bytes);
        in->recv(recv_peer, P2pSlot(recv_peer, options_.rank, n, /*payload=*/true));
      }
      if (out != nullptr) {
        check(out_header->waitSend(remaining()), "send to rank " + std::to_string(send_peer));
        check(out->waitSend(remaining()), "send to rank " + std::to_string(send_peer));
      }
      if (in != nullptr) {
        check(in->waitRecv(remaining()), "receive from rank " + std::to_string(recv_peer));
      }
    });
    if (!mismatch.ok()) {
      // The peer's message can never be received: end the communicator for both (its peers'
      // calls fail at once), naming why.
      Abort(mismatch.message());
      broken_ = mismatch;
      return mismatch;
    }
    return status;
  }

  void Abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      if (aborted_.load()) return;
      abort_reason_ = reason;
      aborted_.store(true);
    }
    LOCKSTEP_LOG(WARNING) << "gloo communicator (rank " << options_.rank << ") aborted: " << reason;
    // What libgloo 0.5 (Debian, git 2022-05-18) can and cannot do here:
    //  - Context::closeConnections() resets every connection (SO_LINGER 0). Peers blocked in or
    //    entering a collective with this rank see the reset and fail at once (UNAVAILABLE), and
    //    any send or receive this rank starts afterwards throws at once (ABORTED below).
    //  - Nothing public wakes a thread of this rank already waiting in a collective: closing a
    //    pair does not signal the buffers waited on; the call that does
    //    (tcp::Pair::signalExceptionExternal) is protected, and Debian's libgloo-dev cannot even
    //    compile tcp/pair.h (it includes gloo/common/memory.h, which the package does not
    //    ship). UnboundBuffer::abortWait* reaches only caller-owned buffers, not the ring's
    //    internal scratch buffer, and gloo::allreduce ignores its "aborted" result.
    // So the sockets are shut down instead (socket_shutdown.h): libgloo's event loop reads
    // their end and fails the pairs, which wakes a call blocked in a collective (it returns
    // ABORTED at once, and every later call too), and the peers read the end as well. The
    // connections are not closed here: closing takes a pair out of the event loop, and if that
    // came before the loop read the end, the blocked call would not wake. The destructor closes
    // them. Only when no socket was found are they reset at once.
    std::lock_guard<std::mutex> lock(context_mu_);
    if (context_ == nullptr) return;
    if (ShutdownConnectedSockets(local_, remote_) > 0) return;
    try {
      context_->closeConnections();
    } catch (const std::exception& e) {
      LOCKSTEP_LOG(WARNING) << "gloo abort: closing connections: " << e.what();
    }
  }

 private:
  struct AllreduceKey {
    void* data;
    size_t count;
    DataType type;
    ReduceOp op;
    bool operator<(const AllreduceKey& other) const {
      return std::tie(data, count, type, op) <
             std::tie(other.data, other.count, other.type, other.op);
    }
  };
  // How long the destructor waits for peers to acknowledge what this rank sent. A live peer's
  // kernel acknowledges within round trips; a peer that stopped reading holds the close this long.
  static constexpr int64_t kDeliverBeforeCloseMs = 1000;

  // The trainer reduces the same bucket buffers every step; their options (unbound buffer
  // registration, algorithm, reduction) are built once. Bounded so that a caller cycling
  // through fresh buffers cannot grow it without limit.
  static constexpr size_t kMaxCachedAllreduces = 256;

  gloo::AllreduceOptions& CachedAllreduceOptions(void* data, size_t count, DataType type,
                                                 ReduceOp op) {
    AllreduceKey key{data, count, type, op};
    auto it = allreduce_cache_.find(key);
    if (it != allreduce_cache_.end()) return *it->second;
    if (allreduce_cache_.size() >= kMaxCachedAllreduces) allreduce_cache_.clear();
    const size_t bytes = count * DataTypeSize(type);
    auto opts = std::make_unique<gloo::AllreduceOptions>(context_);
    // setOutput<T> derives the element count and size from sizeof(T); an element-sized stand-in
    // type keeps that right for every data type (the reduction function knows the real one).
    auto buffer = context_->createUnboundBuffer(data, bytes);
    switch (DataTypeSize(type)) {
      case 2:
        opts->setOutput<uint16_t>(std::move(buffer));
        break;
      case 4:
        opts->setOutput<uint32_t>(std::move(buffer));
        break;
      default:
        opts->setOutput<uint64_t>(std::move(buffer));
        break;
    }
    opts->setAlgorithm(ChooseAllreduceAlgorithm(bytes, options_.size));
    opts->setReduceFunction(ReduceFunctionFor(type, op));
    return *allreduce_cache_.emplace(key, std::move(opts)).first->second;
  }

  uint32_t NextTag() { return next_tag_++; }

  // The slot of the n-th message from rank `from` to rank `to`, its size or its payload: a
  // prefix no Gloo collective uses, the direction in the low bit (both directions of a pair may
  // be in flight at once).
  static uint64_t P2pSlot(int from, int to, uint32_t n, bool payload) {
    constexpr uint8_t kPointToPointSlotPrefix = 0x40;
    return ::gloo::Slot::build(kPointToPointSlotPrefix,
                               (n << 2) | (payload ? 2u : 0u) | (from < to ? 0u : 1u));
  }

  Status CheckUsable(const char* op, int64_t timeout_ms) {
    if (aborted_.load()) return AbortedStatus(op);
    if (timeout_ms <= 0) {
      return InvalidArgumentError(std::string("gloo ") + op +
                                  ": timeout_ms must be positive, got " +
                                  std::to_string(timeout_ms));
    }
    if (!broken_.ok()) {
      return FailedPreconditionError(std::string("gloo ") + op +
                                     ": communicator unusable after an earlier error (" +
                                     broken_.ToString() + "); build a new one");
    }
    return OkStatus();
  }

  Status AbortedStatus(const char* op) {
    std::lock_guard<std::mutex> lock(abort_mu_);
    return AbortedError(std::string("gloo ") + op + " on rank " + std::to_string(options_.rank) +
                        ": communicator aborted: " + abort_reason_);
  }

  // Runs one Gloo collective and turns every exception into the contract's Status; after any
  // error the communicator stays broken (Gloo's pairs are closed by then).
  template <typename Fn>
  Status Run(const char* op, int64_t timeout_ms, Fn&& fn) {
    const Deadline::Clock::time_point start = Deadline::Clock::now();
    Status status;
    try {
      context_->SetOperationTimeout(std::chrono::milliseconds(timeout_ms));
      fn();
      return OkStatus();
    } catch (const ::gloo::IoException& e) {
      status = MapIoError(op, timeout_ms, start, e.what());
    } catch (const ::gloo::Exception& e) {
      status = aborted_.load() ? AbortedStatus(op)
                               : InternalError(std::string("gloo ") + op + ": " + e.what());
    } catch (const std::exception& e) {
      status = InternalError(std::string("gloo ") + op + ": " + e.what());
    }
    broken_ = status;
    LOCKSTEP_LOG(WARNING) << status;
    return status;
  }

  Status MapIoError(const char* op, int64_t timeout_ms, Deadline::Clock::time_point start,
                    const std::string& message) {
    if (aborted_.load()) return AbortedStatus(op);
    const auto elapsed_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Deadline::Clock::now() - start)
            .count();
    const std::string where =
        std::string("gloo ") + op + " on rank " + std::to_string(options_.rank);
    if (MentionsTimeout(message) || elapsed_ms >= timeout_ms) {
      return DeadlineExceededError(where + ": peers did not take part within " +
                                   std::to_string(timeout_ms) + " ms: " + message);
    }
    const int peer = PeerNamedIn(message);
    const std::string who = peer >= 0 ? "rank " + std::to_string(peer) : "a peer";
    return UnavailableError(where + ": connection to " + who + " broke: " + message);
  }

  // The rank whose socket address appears in `message`, or -1. Gloo names the peer's socket
  // address; this rank knows each peer's listening address, which is what the connecting side
  // of a pair sees. The accepting side sees the peer's ephemeral port, which no public Gloo call
  // reveals, so that case is only resolved when there is a single peer.
  int PeerNamedIn(const std::string& message) const {
    if (options_.size == 2) return 1 - options_.rank;
    for (int peer = 0; peer < static_cast<int>(peer_addresses_.size()); ++peer) {
      const std::string& address = peer_addresses_[peer];
      if (address.empty()) continue;
      for (size_t at = message.find(address); at != std::string::npos;
           at = message.find(address, at + 1)) {
        const size_t end = at + address.size();
        if (end >= message.size() || !std::isdigit(static_cast<unsigned char>(message[end]))) {
          return peer;
        }
      }
    }
    return -1;
  }

  const GlooOptions options_;
  std::shared_ptr<TimeoutSettingContext> context_;
  // peer_addresses_[r]: rank r's socket address as this rank's connection to r sees it.
  const std::vector<std::string> peer_addresses_;
  // This rank's listening address, and the peers': how Abort() finds the mesh's sockets.
  const std::vector<sockaddr_storage> local_;
  const std::vector<sockaddr_storage> remote_;

  // Held by Abort() while it signals the pairs and by the destructor while it closes them.
  std::mutex context_mu_;
  std::mutex abort_mu_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;

  Status broken_;
  uint32_t next_tag_ = 0;
  // Messages sent to and received from each rank so far (point to point).
  std::vector<uint32_t> sent_to_, received_from_;
  std::map<AllreduceKey, std::unique_ptr<gloo::AllreduceOptions>> allreduce_cache_;
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options,
                                                               rendezvous::KeyValueStore& store) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return InvalidArgumentError("gloo communicator: rank " + std::to_string(options.rank) +
                                " outside world of " + std::to_string(options.size));
  }
  if (options.connect_timeout_ms <= 0) {
    return InvalidArgumentError("gloo communicator: connect_timeout_ms must be positive");
  }
  IgnoreSigpipeUnlessHandled();
  LOCKSTEP_ASSIGN_OR_RETURN(FullMesh mesh, ConnectFullMesh(options, store));
  LOCKSTEP_LOG(INFO) << "gloo communicator connected: rank " << options.rank << " of "
                     << options.size << " on " << options.listen_host;
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(options, std::move(mesh.context), std::move(mesh.peer_addresses),
                           std::move(mesh.local), std::move(mesh.remote)));
}

}  // namespace lockstep::comm
