// The shared-memory protocol.
//
// Segment layout (one POSIX shm object per communicator, mapped by every rank):
//
//   [ ControlBlock (4 KiB) | slot 0 | slot 1 | ... | slot W-1 ]
//
// Each slot is ShmOptions::slot_bytes, split into W equal regions of region_bytes (64-byte
// aligned). Rank r writes only into slot r, with one exception (all-reduce results, below).
//
// Bootstrap:
//  1. Rank 0 creates the object with a fresh name "/lockstep-<job>-g<generation>-<nonce>"
//     (O_EXCL), sizes it, fills in the control block's geometry and publishes the name under
//     kShmSegmentKey in the generation's store.
//  2. Every other rank reads the name, opens and maps it, and checks the geometry.
//  3. Every rank writes its pid into pids[rank] and increments `attached`. The rank whose
//     increment makes it W unlinks the name: from then on only the mappings keep the memory
//     alive, so no crash of any rank can leak it. (Only a crash of rank 0 between creating the
//     object and the last attach can, and rank 0 unlinks it itself when bootstrap fails.)
//  4. Every rank waits (futex on `attached`, bounded by connect_timeout_ms) until attached == W.
//
// Barrier (central counter, generation word): the futex word `epoch` holds the number of
// completed barriers in bits 1..31 and the abort flag in bit 0. A rank reads `epoch`, then
// increments `arrived`. The last to arrive resets `arrived` to 0 and adds 2 to `epoch`; the
// others wait until epoch's barrier count differs from what they read (the reset happens before
// the bump, so no rank can arrive at the next barrier before `arrived` is reset). Waiting spins
// briefly (a peer is often microseconds away) and then sleeps in FUTEX_WAIT on `epoch` in steps
// of at most 100 ms; the releaser calls FUTEX_WAKE only when `sleepers` says someone sleeps
// (a waiter increments `sleepers` before it re-checks `epoch` in the kernel, the releaser bumps
// `epoch` before it reads `sleepers`, both sequentially consistent, so no wake-up is lost).
// Every step also checks the call's deadline (DEADLINE_EXCEEDED) and, every 100 ms, that each
// peer's pid is still a live process (UNAVAILABLE naming the rank).
//
// Abort: Abort() (and the destructor) publishes who and why in the control block, sets bit 0 of
// `epoch` and wakes every sleeper. Because the flag lives in the futex word itself, a waiter
// that is about to sleep sees the word change and cannot miss the wake-up. A waiter that finds
// its barrier completed returns OK even if the flag is set afterwards (a peer that finished the
// last collective and went away); otherwise it fails with ABORTED (a peer called Abort) or
// UNAVAILABLE (a peer destroyed its communicator). Every call first checks the flag.
//
// All-reduce of n elements (per chunk of at most W × region elements), slice s = elements
// [s·n/W, (s+1)·n/W):
//  1. rank r copies every slice s ≠ r of its input into region s of its slot;
//  2. barrier;
//  3. rank r reduces slice r: its own input (still in private memory) and region r of every
//     other slot, in rank order 0..W-1, into region r of its own slot and into its output;
//  4. barrier;
//  5. rank r copies slice s ≠ r from region s of slot s into its output.
// Phase 1 of the next chunk writes regions s ≠ r of slot r while peers may still be in phase 5
// reading region r of slot r: disjoint, which is why slices live in fixed regions rather than
// contiguously. Phase 3 writes region r of slot r only after the next chunk's first barrier,
// when every peer has finished reading it. Each element is reduced by one rank in a fixed
// order, so results are deterministic and bit-identical on every rank.
// The last chunk's phase 5 has no barrier after it, so an all-reduce leaves a copy-out pending:
// a following all-reduce or reduce-scatter writes only regions s ≠ r of slot r before its first
// barrier and needs nothing, but an all-gather or a broadcast writes from the start of a slot
// (region r of slot r included) and first waits at one barrier for every peer's copy-out.
//
// Reduce-scatter of n elements into parts of p = ceil(n / W) (part s = elements [s·p, (s+1)·p)
// clipped to n), in rounds of at most one region of each part: round k covers elements
// [k·region, (k+1)·region) of every part; rank r copies that piece of every part s ≠ r into
// region s of its slot; barrier; rank r reduces its own piece and region r of every other slot,
// in rank order, into region r of its slot and its output; barrier (peers have read the regions
// before the next round overwrites them). The all-reduce's copy-out (phase 5) is what it saves.
//
// Point to point (Send/Recv/SendRecv) uses each rank's mailbox after the slots: shm_mailbox.cc.
//
// Broadcast: root copies up to W × slot_bytes into the slot area; barrier; the others copy out;
// barrier (so the root does not overwrite a chunk still being read).
// All-gather: rank r copies up to slot_bytes of its input into slot r; barrier; everyone copies
// every slot out; barrier.
#include "worker/comm/shm/shm_communicator.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "common/deadline.h"
#include "common/errno_check.h"
#include "common/logging.h"
#include "common/process_stat.h"
#include "worker/comm/gloo/half_reduce.h"
#include "worker/comm/shm/shm_mailbox.h"
#include "worker/comm/shm/shm_segment.h"

namespace lockstep::comm {

const char kShmSegmentKey[] = "lockstep/shm/segment";

namespace {

using shm::AbortKind;
using shm::ControlBlock;
using shm::CpuRelax;
using shm::Futex;
using shm::kAbortCalled;
using shm::kAlign;
using shm::kControlBytes;
using shm::kLivenessIntervalMs;
using shm::kMagic;
using shm::kMaxRanks;
using shm::kPiecesInFlight;
using shm::kRankLeft;
using shm::MailboxesOffset;
using shm::Mapping;
using shm::ProcessIsGone;
using shm::SegmentBytes;
using shm::SpinIterations;
using shm::WakeAll;

std::string SanitizedForName(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  if (out.size() > 128) out.resize(128);
  return out;
}

template <typename T>
struct SumOp {
  T operator()(T a, T b) const { return a + b; }
};
template <typename T>
struct MaxOp {
  T operator()(T a, T b) const { return std::max(a, b); }
};
template <typename T>
struct MinOp {
  T operator()(T a, T b) const { return std::min(a, b); }
};

// out[i] = op(...op(op(src[0][i], src[1][i]), src[2][i])..., src[W-1][i]), for a plain type.
template <typename T, typename Op>
void ReduceSlices(const void* const* sources, int world, void* out_bytes, size_t count) {
  T* __restrict out = static_cast<T*>(out_bytes);
  const T* __restrict a = static_cast<const T*>(sources[0]);
  Op op;
  if (world == 1) {
    std::memcpy(out, a, count * sizeof(T));
    return;
  }
  const T* __restrict b = static_cast<const T*>(sources[1]);
  for (size_t i = 0; i < count; ++i) out[i] = op(a[i], b[i]);
  for (int s = 2; s < world; ++s) {
    const T* __restrict c = static_cast<const T*>(sources[s]);
    for (size_t i = 0; i < count; ++i) out[i] = op(out[i], c[i]);
  }
}

// The same for 16-bit floats: widened to float, reduced in rank order, rounded once.
template <float (*kToFloat)(uint16_t), uint16_t (*kFromFloat)(float), typename Op>
void ReduceHalfSlices(const void* const* sources, int world, void* out_bytes, size_t count,
                      std::vector<float>& scratch) {
  scratch.resize(count);
  Op op;
  const auto* first = static_cast<const uint16_t*>(sources[0]);
  for (size_t i = 0; i < count; ++i) scratch[i] = kToFloat(first[i]);
  for (int s = 1; s < world; ++s) {
    const auto* src = static_cast<const uint16_t*>(sources[s]);
    for (size_t i = 0; i < count; ++i) scratch[i] = op(scratch[i], kToFloat(src[i]));
  }
  auto* out = static_cast<uint16_t*>(out_bytes);
  for (size_t i = 0; i < count; ++i) out[i] = kFromFloat(scratch[i]);
}

template <template <typename> class Op>
void ReduceTyped(DataType type, const void* const* sources, int world, void* out, size_t count,
                 std::vector<float>& scratch) {
  switch (type) {
    case DataType::kFloat32:
      return ReduceSlices<float, Op<float>>(sources, world, out, count);
    case DataType::kFloat64:
      return ReduceSlices<double, Op<double>>(sources, world, out, count);
    case DataType::kInt64:
      return ReduceSlices<int64_t, Op<int64_t>>(sources, world, out, count);
    case DataType::kBFloat16:
      return ReduceHalfSlices<BFloat16ToFloat, FloatToBFloat16, Op<float>>(sources, world, out,
                                                                           count, scratch);
    case DataType::kFloat16:
      return ReduceHalfSlices<Float16ToFloat, FloatToFloat16, Op<float>>(sources, world, out, count,
                                                                         scratch);
  }
}

void Reduce(DataType type, ReduceOp op, const void* const* sources, int world, void* out,
            size_t count, std::vector<float>& scratch) {
  switch (op) {
    case ReduceOp::kSum:
      return ReduceTyped<SumOp>(type, sources, world, out, count, scratch);
    case ReduceOp::kMax:
      return ReduceTyped<MaxOp>(type, sources, world, out, count, scratch);
    case ReduceOp::kMin:
      return ReduceTyped<MinOp>(type, sources, world, out, count, scratch);
  }
}

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(const ShmOptions& options, std::unique_ptr<Mapping> mapping)
      : options_(options), mapping_(std::move(mapping)), control_(mapping_->control()) {
    data_ = static_cast<char*>(mapping_->base) + kControlBytes;
    slot_bytes_ = control_->slot_bytes;
    region_bytes_ = control_->region_bytes;
    for (int r = 0; r < options_.size; ++r) pids_.push_back(control_->pids[r].load());
    mailboxes_ = std::make_unique<shm::ShmMailboxes>(
        control_, static_cast<char*>(mapping_->base) + MailboxesOffset(slot_bytes_, options_.size),
        control_->mailbox_bytes, options_.rank, pids_, [this] { return PointToPointAbort(); });
  }

  // Tells peers still blocked in a collective with this rank that it is gone (UNAVAILABLE),
  // as closing Gloo's connections does. Harmless after a clean last collective: a peer that
  // already saw its barrier complete returns OK.
  ~ShmCommunicator() override {
    PublishAbort(kRankLeft, "rank " + std::to_string(options_.rank) + " closed its communicator");
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string backend() const override { return "shm"; }

  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                   int64_t timeout_ms) override {
    LOCKSTEP_RETURN_IF_ERROR(CheckUsable("all-reduce", timeout_ms));
    if (count == 0 || options_.size == 1) return OkStatus();
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    const int world = options_.size;
    const int me = options_.rank;
    const size_t element = DataTypeSize(type);
    const size_t chunk_max = (region_bytes_ / element) * world;
    char* bytes = static_cast<char*>(data);
    std::vector<const void*> sources(world);
    for (size_t done = 0; done < count;) {
      const size_t n = std::min(chunk_max, count - done);
      char* chunk = bytes + done * element;
      auto slice_begin = [&](int s) { return n * s / world; };
      auto slice_count = [&](int s) { return slice_begin(s + 1) - slice_begin(s); };
      for (int s = 0; s < world; ++s) {
        if (s == me) continue;
        std::memcpy(Region(me, s), chunk + slice_begin(s) * element, slice_count(s) * element);
      }
      LOCKSTEP_RETURN_IF_ERROR(Fail(BarrierWait("all-reduce", deadline)));
      for (int s = 0; s < world; ++s) {
        sources[s] = s == me ? chunk + slice_begin(me) * element : Region(s, me);
      }
      Reduce(type, op, sources.data(), world, Region(me, me), slice_count(me), scratch_);
      std::memcpy(chunk + slice_begin(me) * element, Region(me, me), slice_count(me) * element);
      LOCKSTEP_RETURN_IF_ERROR(Fail(BarrierWait("all-reduce", deadline)));
      for (int s = 0; s < world; ++s) {
        if (s == me) continue;
        std::memcpy(chunk + slice_begin(s) * element, Region(s, s), slice_count(s) * element);
      }
      done += n;
    }
    copy_out_pending_ = true;
    return OkStatus();
  }

  Status ReduceScatter(void* data, size_t count, DataType type, ReduceOp op,
                       int64_t timeout_ms) override {
    LOCKSTEP_RETURN_IF_ERROR(CheckUsable("reduce-scatter", timeout_ms));
    if (count == 0 || options_.size == 1) return OkStatus();
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    const int world = options_.size;
    const int me = options_.rank;
    const size_t element = DataTypeSize(type);
    const size_t round_max = region_bytes_ / element;
    const size_t per = PartBegin(count, world, 1);
    char* bytes = static_cast<char*>(data);
    // Elements [offset, offset + length) of part s, as an offset into data and a length.
    auto piece = [&](int s, size_t offset) -> std::pair<size_t, size_t> {
      const size_t begin = std::min(PartBegin(count, world, s) + offset, count);
      const size_t end = std::min(PartBegin(count, world, s + 1), begin + round_max);
      return {begin, end > begin ? end - begin : 0};
    };
    std::vector<const void*> sources(world);
    for (size_t offset = 0; offset < per; offset += round_max) {
      for (int s = 0; s < world; ++s) {
        if (s == me) continue;
        auto [begin, length] = piece(s, offset);
        std::memcpy(Region(me, s), bytes + begin * element, length * element);
      }
      LOCKSTEP_RETURN_IF_ERROR(Fail(BarrierWait("reduce-scatter", deadline)));
      auto [begin, length] = piece(me, offset);
      if (length > 0) {
        for (int s = 0; s < world; ++s) {
          sources[s] = s == me ? bytes + begin * element : Region(s, me);
        }
        Reduce(type, op, sources.data(), world, Region(me, me), length, scratch_);
        std::memcpy(bytes + begin * element, Region(me, me), length * element);
      }
      LOCKSTEP_RETURN_IF_ERROR(Fail(BarrierWait("reduce-scatter", deadline)));
    }
    copy_out_pending_ = false;
    return OkStatus();
  }

  Status Broadcast(void* data, size_t bytes, int root, int64_t timeout_ms) override {
    if (root < 0 || root >= options_.size) {
      return InvalidArgumentError("shm broadcast: root " + std::to_string(root) +
                                  " outside world of " + std::to_string(options_.size));
    }
    LOCKSTEP_RETURN_IF_ERROR(CheckUsable("broadcast", timeout_ms));
    if (bytes == 0 || options_.size == 1) return OkStatus();
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    const size_t chunk_max = slot_bytes_ * options_.size;
    char* out = static_cast<char*>(data);
    LOCKSTEP_RETURN_IF_ERROR(SettleCopyOut("broadcast", deadline));
    for (size_t done = 0; done < bytes;) {
      const size_t n = std::min(chunk_max, bytes - done);
      if (options_.rank == root) std::memcpy(data_, out + done, n);
      LOCKSTEP_RETURN_IF_ERROR(Fail(BarrierWait("broadcast", deadline)));
      if (options_.rank != root) std::memcpy(out + done, data_, n);
      LOCKSTEP_RETURN_IF_ERROR(Fail(BarrierWait("broadcast", deadline)));
      done += n;
    }
    return OkStatus();
  }

  Status AllGather(const void* in, size_t bytes_per_rank, void* out, int64_t timeout_ms) override {
    LOCKSTEP_RETURN_IF_ERROR(CheckUsable("all-gather", timeout_ms));
    if (bytes_per_rank == 0) return OkStatus();
    char* gathered = static_cast<char*>(out);
    if (options_.size == 1) {
      std::memmove(gathered, in, bytes_per_rank);
      return OkStatus();
    }
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    const char* mine = static_cast<const char*>(in);
    LOCKSTEP_RETURN_IF_ERROR(SettleCopyOut("all-gather", deadline));
    for (size_t done = 0; done < bytes_per_rank;) {
      const size_t n = std::min(slot_bytes_, bytes_per_rank - done);
      std::memcpy(Slot(options_.rank), mine + done, n);
      LOCKSTEP_RETURN_IF_ERROR(Fail(BarrierWait("all-gather", deadline)));
      for (int s = 0; s < options_.size; ++s) {
        char* to = gathered + s * bytes_per_rank + done;
        // In place (in at out + rank * bytes_per_rank), this rank's bytes are already there.
        if (s == options_.rank && to == mine + done) continue;
        std::memcpy(to, Slot(s), n);
      }
      LOCKSTEP_RETURN_IF_ERROR(Fail(BarrierWait("all-gather", deadline)));
      done += n;
    }
    return OkStatus();
  }

  // Waits at one barrier when an all-reduce's copy-out may still be reading the slots (see the
  // protocol), before a collective that writes from the start of a slot.
  Status SettleCopyOut(const char* what, const Deadline& deadline) {
    if (!copy_out_pending_) return OkStatus();
    copy_out_pending_ = false;
    return Fail(BarrierWait(what, deadline));
  }

  Status Barrier(int64_t timeout_ms) override {
    LOCKSTEP_RETURN_IF_ERROR(CheckUsable("barrier", timeout_ms));
    if (options_.size == 1) return OkStatus();
    copy_out_pending_ = false;
    return Fail(BarrierWait("barrier", Deadline::AfterMs(timeout_ms)));
  }

  // Point to point through the mailboxes (shm_mailbox.cc): only the two ranks take part, so a
  // rank that left does not end it unless it is one of them (the abort flag is not checked).
  Status SendRecv(const void* send, size_t send_bytes, int send_peer, void* recv, size_t recv_bytes,
                  int recv_peer, int64_t timeout_ms) override {
    LOCKSTEP_RETURN_IF_ERROR(CheckSendRecv("shm", options_.rank, options_.size, send, send_bytes,
                                           send_peer, recv, recv_bytes, recv_peer));
    LOCKSTEP_RETURN_IF_ERROR(CheckUsable("send/recv", timeout_ms, /*peers_flag=*/false));
    Status status = mailboxes_->Exchange(send, send_bytes, send_peer, recv, recv_bytes, recv_peer,
                                         Deadline::AfterMs(timeout_ms));
    if (status.code() == StatusCode::kInvalidArgument) {
      // A message of another size can never be taken, so its sender would wait for nothing:
      // the generation's communicator ends here for everyone, naming why.
      Abort(status.message());
    }
    return Fail(status);
  }

  void Abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      if (aborted_.load()) return;
      abort_reason_ = reason;
      aborted_.store(true);
    }
    LOCKSTEP_LOG(WARNING) << "shm communicator (rank " << options_.rank << ") aborted: " << reason;
    PublishAbort(kAbortCalled, reason);
  }

 private:
  char* Slot(int rank) const { return data_ + static_cast<size_t>(rank) * slot_bytes_; }
  char* Region(int slot, int region) const {
    return Slot(slot) + static_cast<size_t>(region) * region_bytes_;
  }

  // Sets the shared abort flag (first caller's reason wins) and wakes every waiter of every
  // rank. Safe from any thread; touches only atomics and, once, the reason.
  void PublishAbort(AbortKind kind, const std::string& reason) {
    if (kind == kRankLeft) {
      control_->left[options_.rank / 64].fetch_or(uint64_t{1} << (options_.rank % 64));
    } else {
      control_->abort_called.store(1);
    }
    if (control_->abort_claimed.exchange(1) == 0) {
      control_->abort_rank = options_.rank;
      control_->abort_kind = kind;
      std::snprintf(control_->abort_reason, sizeof(control_->abort_reason), "%s", reason.c_str());
      control_->reason_ready.store(1);
    }
    control_->epoch.fetch_or(1);
    WakeAll(&control_->epoch);
    mailboxes_->RingAll(options_.size);
  }

  // With `peers_flag` false the shared abort flag is left to the mailboxes' wait: point to point
  // involves two ranks, so another rank that left (done with the generation) must not end it.
  Status CheckUsable(const char* op, int64_t timeout_ms, bool peers_flag = true) {
    if (aborted_.load()) return AbortedStatus(op);
    // A peer's Abort() or departure outranks this rank's own earlier error: it is the cause.
    if (peers_flag && (control_->epoch.load() & 1) != 0) return Fail(PeerAbortStatus(op));
    if (timeout_ms <= 0) {
      return InvalidArgumentError(std::string("shm ") + op + ": timeout_ms must be positive, got " +
                                  std::to_string(timeout_ms));
    }
    if (!broken_.ok()) {
      return FailedPreconditionError(std::string("shm ") + op +
                                     ": communicator unusable after an earlier error (" +
                                     broken_.ToString() + "); build a new one");
    }
    return OkStatus();
  }

  // Why point to point must stop: this rank's Abort() or any rank's (a departure alone ends
  // only the exchanges with the rank that left, which the mailboxes check).
  Status PointToPointAbort() {
    if (aborted_.load()) return AbortedStatus("send/recv");
    if (control_->abort_called.load() == 0) return OkStatus();
    Status status = PeerAbortStatus("send/recv");
    // The reason's claim may be an earlier departure's; the cause here is the Abort().
    if (status.code() == StatusCode::kAborted) return status;
    return AbortedError("shm send/recv on rank " + std::to_string(options_.rank) +
                        ": communicator aborted by a peer");
  }

  Status AbortedStatus(const char* op) {
    std::lock_guard<std::mutex> lock(abort_mu_);
    return AbortedError(std::string("shm ") + op + " on rank " + std::to_string(options_.rank) +
                        ": communicator aborted: " + abort_reason_);
  }

  // The status for a set shared abort flag: ABORTED when this rank or a peer called Abort(),
  // UNAVAILABLE when a peer destroyed its communicator.
  Status PeerAbortStatus(const char* op) {
    if (aborted_.load()) return AbortedStatus(op);
    const std::string where =
        std::string("shm ") + op + " on rank " + std::to_string(options_.rank);
    if (control_->reason_ready.load() == 0) {
      return AbortedError(where + ": communicator aborted by a peer");
    }
    const std::string who = "rank " + std::to_string(control_->abort_rank);
    if (control_->abort_kind == kRankLeft) {
      return UnavailableError(where + ": " + control_->abort_reason);
    }
    return AbortedError(where + ": communicator aborted by " + who + ": " + control_->abort_reason);
  }

  // Records the first error: after it the communicator is unusable, as the contract says.
  Status Fail(Status status) {
    if (!status.ok() && broken_.ok()) {
      broken_ = status;
      LOCKSTEP_LOG(WARNING) << status;
    }
    return status;
  }

  // The peer rank whose process is gone, or -1.
  int DeadPeer() const {
    for (int r = 0; r < options_.size; ++r) {
      if (r != options_.rank && ProcessIsGone(pids_[r])) return r;
    }
    return -1;
  }

  // One barrier over every rank (see the protocol at the top of this file).
  Status BarrierWait(const char* op, const Deadline& deadline) {
    const uint32_t seen = control_->epoch.load();
    if ((seen & 1) != 0) return PeerAbortStatus(op);
    if (control_->arrived.fetch_add(1) + 1 == static_cast<uint32_t>(options_.size)) {
      control_->arrived.store(0);
      control_->epoch.fetch_add(2);
      if (control_->sleepers.load() > 0) WakeAll(&control_->epoch);
      return OkStatus();
    }
    auto passed = [seen](uint32_t now) { return (now >> 1) != (seen >> 1); };
    const int spins = SpinIterations();
    for (int i = 0; i < spins; ++i) {
      const uint32_t now = control_->epoch.load(std::memory_order_acquire);
      if (passed(now)) return OkStatus();
      if ((now & 1) != 0) return PeerAbortStatus(op);
      CpuRelax();
    }
    Deadline::Clock::time_point next_liveness_check = Deadline::Clock::now();
    for (;;) {
      const uint32_t now = control_->epoch.load();
      if (passed(now)) return OkStatus();
      if ((now & 1) != 0) return PeerAbortStatus(op);
      const Deadline::Clock::time_point time = Deadline::Clock::now();
      if (time >= deadline.at()) {
        return DeadlineExceededError(std::string("shm ") + op + " on rank " +
                                     std::to_string(options_.rank) +
                                     ": peers did not take part within the deadline");
      }
      if (time >= next_liveness_check) {
        const int dead = DeadPeer();
        if (dead >= 0) {
          return UnavailableError(std::string("shm ") + op + " on rank " +
                                  std::to_string(options_.rank) + ": rank " + std::to_string(dead) +
                                  " (pid " + std::to_string(pids_[dead]) + ") is gone");
        }
        next_liveness_check = time + std::chrono::milliseconds(kLivenessIntervalMs);
      }
      const auto sleep = std::min(deadline.at(), next_liveness_check) - time;
      const auto sleep_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(sleep).count();
      timespec timeout{static_cast<time_t>(sleep_ns / 1000000000),
                       static_cast<long>(sleep_ns % 1000000000)};
      control_->sleepers.fetch_add(1);
      Futex(&control_->epoch, FUTEX_WAIT, now, &timeout);  // EAGAIN/EINTR/ETIMEDOUT: re-check
      control_->sleepers.fetch_sub(1);
    }
  }

  const ShmOptions options_;
  const std::unique_ptr<Mapping> mapping_;
  ControlBlock* const control_;
  char* data_ = nullptr;
  size_t slot_bytes_ = 0;
  size_t region_bytes_ = 0;
  std::vector<pid_t> pids_;  // by rank, read once at bootstrap
  std::unique_ptr<shm::ShmMailboxes> mailboxes_;
  // The last collective was an all-reduce whose copy-out peers may still be doing (see the
  // protocol). Every rank issues the same collectives, so every rank holds the same value.
  bool copy_out_pending_ = false;

  std::mutex abort_mu_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;

  Status broken_;
  std::vector<float> scratch_;  // 16-bit reductions' float accumulators
};

std::string NewSegmentName(const ShmOptions& options) {
  std::random_device random;
  const uint64_t nonce = (uint64_t{random()} << 32) ^ random();
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), "-g%lld-%016llx",
                static_cast<long long>(options.generation), static_cast<unsigned long long>(nonce));
  return "/lockstep-" + SanitizedForName(options.job_name) + suffix;
}

// Rank 0's half of bootstrap steps 1: create, size, map, describe.
StatusOr<std::unique_ptr<Mapping>> CreateSegment(const std::string& name, size_t slot_bytes,
                                                 size_t region_bytes, size_t mailbox_bytes,
                                                 int world) {
  const size_t total = SegmentBytes(slot_bytes, mailbox_bytes, world);
  int fd;
  LOCKSTEP_SYSCALL_RETRY(fd, shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  if (fd < 0) return ErrnoStatus("shm_open " + name, errno);
  int result;
  LOCKSTEP_SYSCALL_RETRY(result, ftruncate(fd, static_cast<off_t>(total)));
  if (result != 0) {
    const int error = errno;
    close(fd);
    shm_unlink(name.c_str());
    return ErrnoStatus("ftruncate " + name + " to " + std::to_string(total) + " bytes", error);
  }
  auto mapping = std::make_unique<Mapping>();
  mapping->base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (mapping->base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return ErrnoStatus("mmap " + name, error);
  }
  mapping->bytes = total;
  // A fresh object is zero-filled: every counter starts at 0; only the geometry is set.
  ControlBlock* control = mapping->control();
  control->world_size = static_cast<uint32_t>(world);
  control->slot_bytes = slot_bytes;
  control->region_bytes = region_bytes;
  control->mailbox_bytes = mailbox_bytes;
  control->magic = kMagic;
  return mapping;
}

// The other ranks' half of step 2.
StatusOr<std::unique_ptr<Mapping>> OpenSegment(const std::string& name, size_t slot_bytes,
                                               size_t mailbox_bytes, int world) {
  int fd;
  LOCKSTEP_SYSCALL_RETRY(fd, shm_open(name.c_str(), O_RDWR, 0600));
  if (fd < 0) {
    Status status = ErrnoStatus("shm_open " + name, errno);
    // Not there although rank 0 published it: /dev/shm is not shared with rank 0 (separate
    // containers), which the backend choice could not see.
    if (status.code() == StatusCode::kNotFound) {
      return UnavailableError(status.message() +
                              " (is /dev/shm shared between the ranks? LOCKSTEP_COMM=gloo "
                              "avoids shared memory)");
    }
    return status;
  }
  // The control block first: ranks that disagree on the options (or run builds with another
  // layout) are told which value differs, before the size that follows from it.
  struct stat info;
  if (fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) < kControlBytes) {
    close(fd);
    return InternalError("shm segment " + name + " has " + std::to_string(info.st_size) +
                         " bytes, less than its control block");
  }
  const size_t mapped = static_cast<size_t>(info.st_size);
  auto mapping = std::make_unique<Mapping>();
  mapping->base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (mapping->base == MAP_FAILED) return ErrnoStatus("mmap " + name, error);
  mapping->bytes = mapped;
  const ControlBlock* control = mapping->control();
  auto differs = [&](const char* what, uint64_t here, uint64_t there) {
    return FailedPreconditionError("shm segment " + name + " was made with " + what + " " +
                                   std::to_string(there) + ", this rank has " +
                                   std::to_string(here) + " (ranks disagree on ShmOptions)");
  };
  if (control->magic != kMagic) {
    return FailedPreconditionError("shm segment " + name +
                                   " has another layout (a build of another version made it)");
  }
  if (control->world_size != static_cast<uint32_t>(world)) {
    return differs("world size", world, control->world_size);
  }
  if (control->slot_bytes != slot_bytes)
    return differs("slot_bytes", slot_bytes, control->slot_bytes);
  if (control->mailbox_bytes != mailbox_bytes) {
    return differs("mailbox_bytes", mailbox_bytes, control->mailbox_bytes);
  }
  const size_t total = SegmentBytes(slot_bytes, mailbox_bytes, world);
  if (mapped != total) {
    return InternalError("shm segment " + name + " has " + std::to_string(mapped) +
                         " bytes, expected " + std::to_string(total));
  }
  return mapping;
}

// Step 4: waits until every rank attached, with the same futex discipline as a barrier.
Status WaitForAllAttached(ControlBlock* control, int world, const Deadline& deadline) {
  for (;;) {
    const uint32_t attached = control->attached.load();
    if (attached >= static_cast<uint32_t>(world)) return OkStatus();
    const int64_t remaining_ms = deadline.remaining_ms();
    if (remaining_ms <= 0) {
      return DeadlineExceededError("shm bootstrap: " + std::to_string(attached) + " of " +
                                   std::to_string(world) + " ranks attached within the deadline");
    }
    const int64_t sleep_ms = std::min(remaining_ms, kLivenessIntervalMs);
    timespec timeout{static_cast<time_t>(sleep_ms / 1000),
                     static_cast<long>(sleep_ms % 1000) * 1000000};
    Futex(&control->attached, FUTEX_WAIT, attached, &timeout);
  }
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CreateShmCommunicator(const ShmOptions& options,
                                                              rendezvous::KeyValueStore& store) {
  if (options.size < 1 || options.size > kMaxRanks || options.rank < 0 ||
      options.rank >= options.size) {
    return InvalidArgumentError("shm communicator: rank " + std::to_string(options.rank) +
                                " outside world of " + std::to_string(options.size) + " (at most " +
                                std::to_string(kMaxRanks) + " ranks)");
  }
  if (options.connect_timeout_ms <= 0) {
    return InvalidArgumentError("shm communicator: connect_timeout_ms must be positive");
  }
  const size_t region_bytes = options.slot_bytes / options.size / kAlign * kAlign;
  if (region_bytes < kAlign) {
    return InvalidArgumentError("shm communicator: slot_bytes " +
                                std::to_string(options.slot_bytes) + " too small for " +
                                std::to_string(options.size) + " ranks");
  }
  if (options.mailbox_bytes < kPiecesInFlight * kAlign) {
    return InvalidArgumentError("shm communicator: mailbox_bytes " +
                                std::to_string(options.mailbox_bytes) + " below " +
                                std::to_string(kPiecesInFlight * kAlign));
  }
  // Whole cache lines, so that every mailbox header stays aligned.
  const size_t mailbox_bytes = options.mailbox_bytes / kAlign * kAlign;
  const Deadline deadline = Deadline::AfterMs(options.connect_timeout_ms);
  std::unique_ptr<Mapping> mapping;
  std::string name;
  if (options.rank == 0) {
    name = NewSegmentName(options);
    LOCKSTEP_ASSIGN_OR_RETURN(mapping, CreateSegment(name, options.slot_bytes, region_bytes,
                                                     mailbox_bytes, options.size));
    Status published = store.Set(kShmSegmentKey, name, deadline.remaining_ms());
    if (!published.ok()) {
      shm_unlink(name.c_str());
      return published.WithContext("shm bootstrap: publishing the segment name");
    }
  } else {
    auto values = store.Get({kShmSegmentKey}, deadline.remaining_ms());
    if (!values.ok()) return values.status().WithContext("shm bootstrap: rank 0's segment name");
    name = (*values)[0];
    LOCKSTEP_ASSIGN_OR_RETURN(mapping,
                              OpenSegment(name, options.slot_bytes, mailbox_bytes, options.size));
  }
  ControlBlock* control = mapping->control();
  control->pids[options.rank].store(static_cast<int32_t>(getpid()));
  if (control->attached.fetch_add(1) + 1 == static_cast<uint32_t>(options.size)) {
    // Last to attach: nobody needs the name any more.
    shm_unlink(name.c_str());
    WakeAll(&control->attached);
  }
  Status attached = WaitForAllAttached(control, options.size, deadline);
  if (!attached.ok()) {
    // Whoever did attach keeps the memory alive through its mapping; the name must not outlive
    // a failed bootstrap (any rank may unlink; ENOENT after the first is harmless).
    shm_unlink(name.c_str());
    return attached.WithContext("rank " + std::to_string(options.rank));
  }
  LOCKSTEP_LOG(INFO) << "shm communicator attached: rank " << options.rank << " of " << options.size
                     << ", " << (mapping->bytes >> 20) << " MiB segment " << name;
  return std::unique_ptr<Communicator>(new ShmCommunicator(options, std::move(mapping)));
}

}  // namespace lockstep::comm
