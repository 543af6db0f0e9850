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
// Point to point (Send/Recv/SendRecv): after the slots, each rank has a mailbox (a 128-byte
// header and mailbox_bytes of data in two halves) that only it writes. A message travels in
// pieces of at most half the mailbox: the sender waits until the half for its next piece is free
// (posted - taken < 2), copies the piece in, describes it (recipient, the message's total size,
// the piece's size) and increments `posted` (release); the recipient waits until the sender's
// next piece to take is addressed to it (posted != taken, to == itself), copies it out and
// increments `taken`. With two halves the sender's copy of one piece overlaps the recipient's
// copy of the one before. A call returns once its last piece is taken, so a mailbox only ever
// holds pieces of one message. A size mismatch aborts the communicator (the piece could never be
// taken). Either increment
// rings the other rank's doorbell (a futex word per rank in the control block, incremented and
// woken), on which a rank that can make no progress sleeps, re-checking its deadline, the abort
// flag and the peer's pid every 100 ms as a barrier does. SendRecv moves whichever side can
// move, so two ranks sending to each other at once both progress. Messages from one rank to
// another are taken in the order they were posted, so the n-th Send matches the n-th Recv.
// Only the two ranks take part; the collectives' slots and barriers are untouched.
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
#include <sys/syscall.h>
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

namespace lockstep::comm {

const char kShmSegmentKey[] = "lockstep/shm/segment";

namespace {

constexpr uint64_t kMagic = 0x4c4f434b53484d32ull;  // "LOCKSHM2": with mailboxes
constexpr int kMaxRanks = 256;
constexpr size_t kControlBytes = 4096;
constexpr size_t kAlign = 64;
// How often a waiter checks its peers' pids, and the longest single futex sleep.
constexpr int64_t kLivenessIntervalMs = 100;

enum AbortKind : uint32_t { kNotAborted = 0, kAbortCalled = 1, kRankLeft = 2 };

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain words");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex words must be 32 bits");

struct ControlBlock {
  // Geometry, written by rank 0 before it publishes the name; read-only afterwards.
  uint64_t magic;
  uint32_t world_size;
  uint32_t reserved;
  uint64_t slot_bytes;
  uint64_t region_bytes;

  alignas(kAlign) std::atomic<uint32_t> attached;
  alignas(kAlign) std::atomic<uint32_t> arrived;
  alignas(kAlign) std::atomic<uint32_t> epoch;  // futex word: barrier count << 1 | aborted
  std::atomic<uint32_t> sleepers;

  // The first aborter claims abort_claimed, writes its rank, kind and reason, then sets
  // reason_ready; readers that see the flag before reason_ready report "a peer".
  alignas(kAlign) std::atomic<uint32_t> abort_claimed;
  std::atomic<uint32_t> reason_ready;
  int32_t abort_rank;
  uint32_t abort_kind;
  char abort_reason[256];

  alignas(kAlign) std::atomic<int32_t> pids[kMaxRanks];

  uint64_t mailbox_bytes;
  // Futex words, one per rank: incremented (and woken) whenever a piece is posted to that rank
  // or its own piece is taken (the protocol's point to point).
  alignas(kAlign) std::atomic<uint32_t> doorbells[kMaxRanks];
  // Which ranks closed their communicator, and whether any rank called Abort(), whoever
  // claimed the abort reason: point to point between two ranks fails only for these.
  alignas(kAlign) std::atomic<uint64_t> left[kMaxRanks / 64];
  std::atomic<uint32_t> abort_called;
};
static_assert(sizeof(ControlBlock) <= kControlBytes, "control block outgrew its page");

// The start of each rank's mailbox; its data follows, in kPiecesInFlight halves. Piece k of
// the owner's pieces (counted over all its messages) goes into half k % 2, so the owner copies
// one piece in while the recipient copies the previous one out. Only the owner writes `posted`
// and a half's description, and only once the piece that half held before was taken
// (posted - taken < kPiecesInFlight); only a piece's recipient advances `taken`, in order. A rank
// reading a description may race with the owner's reuse of that half for a later piece (when the
// piece was another rank's to take), so a reader checks `taken` again after reading it, as a
// seqlock's reader does.
constexpr uint32_t kPiecesInFlight = 2;
struct PieceDescription {
  std::atomic<int32_t> to;            // recipient
  std::atomic<uint64_t> total_bytes;  // of the message it belongs to
  std::atomic<uint64_t> bytes;        // of this piece
};
struct alignas(kAlign) MailboxHeader {
  std::atomic<uint32_t> posted;  // pieces the owner has posted
  PieceDescription pieces[kPiecesInFlight];
  alignas(kAlign) std::atomic<uint32_t> taken;  // pieces recipients have taken
};
static_assert(sizeof(MailboxHeader) == 2 * kAlign, "a mailbox header is two cache lines");

// Where the mailboxes begin in the segment (after the slots, cache-line aligned), and the
// segment's size.
size_t MailboxesOffset(size_t slot_bytes, int world) {
  return kControlBytes + (slot_bytes * world + kAlign - 1) / kAlign * kAlign;
}
size_t SegmentBytes(size_t slot_bytes, size_t mailbox_bytes, int world) {
  return MailboxesOffset(slot_bytes, world) + (sizeof(MailboxHeader) + mailbox_bytes) * world;
}

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

void WakeAll(std::atomic<uint32_t>* word) { Futex(word, FUTEX_WAKE, INT_MAX, nullptr); }

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Spin iterations before a waiter sleeps in the kernel. A peer is usually microseconds away in
// a tight loop of collectives, and a futex round trip costs ~5-10 µs; but on a machine with
// fewer cores than threads a long spin steals the CPU from the very peer (or from this
// process's backward pass) being waited for. Read once; LOCKSTEP_SHM_SPIN overrides.
int SpinIterations() {
  static const int spins = [] {
    const char* value = std::getenv("LOCKSTEP_SHM_SPIN");
    if (value != nullptr && *value != '\0') return std::max(0, std::atoi(value));
    return 2000;
  }();
  return spins;
}

// True when `pid` no longer runs: gone (ESRCH) or a zombie its parent has not reaped yet.
bool ProcessIsGone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  const std::optional<ProcessStat> stat = ReadProcessStat(pid);
  return stat && (stat->state == 'Z' || stat->state == 'X');
}

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

// A mapped segment; unmaps on destruction.
struct Mapping {
  void* base = MAP_FAILED;
  size_t bytes = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base != MAP_FAILED) munmap(base, bytes);
  }
  ControlBlock* control() const { return static_cast<ControlBlock*>(base); }
};

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(const ShmOptions& options, std::unique_ptr<Mapping> mapping)
      : options_(options), mapping_(std::move(mapping)), control_(mapping_->control()) {
    data_ = static_cast<char*>(mapping_->base) + kControlBytes;
    slot_bytes_ = control_->slot_bytes;
    region_bytes_ = control_->region_bytes;
    mailbox_bytes_ = control_->mailbox_bytes;
    mailboxes_ = static_cast<char*>(mapping_->base) + MailboxesOffset(slot_bytes_, options_.size);
    for (int r = 0; r < options_.size; ++r) pids_.push_back(control_->pids[r].load());
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

  Status SendRecv(const void* send, size_t send_bytes, int send_peer, void* recv, size_t recv_bytes,
                  int recv_peer, int64_t timeout_ms) override {
    LOCKSTEP_RETURN_IF_ERROR(CheckSendRecv("shm", options_.rank, options_.size, send, send_bytes,
                                           send_peer, recv, recv_bytes, recv_peer));
    LOCKSTEP_RETURN_IF_ERROR(CheckUsable("send/recv", timeout_ms, /*peers_flag=*/false));
    if (Status aborted = PointToPointAbortStatus(send_peer, recv_peer); !aborted.ok()) {
      return Fail(aborted);
    }
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    // Pieces still to move each way; a message of 0 bytes is one empty piece.
    const size_t capacity = PieceCapacity();
    auto pieces = [capacity](size_t bytes) {
      return std::max<size_t>(1, CeilDiv(bytes, capacity));
    };
    size_t to_send = send_peer >= 0 ? pieces(send_bytes) : 0;
    size_t to_receive = recv_peer >= 0 ? pieces(recv_bytes) : 0;
    size_t sent = 0, received = 0;
    MailboxHeader* mine = Mailbox(options_.rank);
    MailboxHeader* theirs = recv_peer >= 0 ? Mailbox(recv_peer) : nullptr;
    std::atomic<uint32_t>* doorbell = &control_->doorbells[options_.rank];
    // Done once every piece is received and every piece sent is taken: a Send returns when its
    // peer has the message, as on Gloo and NCCL, so a mailbox never holds pieces of two calls
    // (nor for two recipients).
    const uint32_t first_posted = mine->posted.load(std::memory_order_relaxed);
    auto all_taken = [&] {
      return mine->taken.load(std::memory_order_acquire) - first_posted == to_send;
    };
    while (sent < to_send || received < to_receive || !all_taken()) {
      const uint32_t rung = doorbell->load(std::memory_order_acquire);
      bool moved = false;
      const uint32_t posted = mine->posted.load(std::memory_order_relaxed);
      if (sent < to_send &&
          posted - mine->taken.load(std::memory_order_acquire) < kPiecesInFlight) {
        // Readers of the description that see these stores also see `taken` as it is now.
        std::atomic_thread_fence(std::memory_order_release);
        const size_t offset = sent * capacity;
        const size_t bytes = std::min(capacity, send_bytes - std::min(send_bytes, offset));
        PieceDescription& piece = mine->pieces[posted % kPiecesInFlight];
        piece.to.store(send_peer, std::memory_order_relaxed);
        piece.total_bytes.store(send_bytes, std::memory_order_relaxed);
        piece.bytes.store(bytes, std::memory_order_relaxed);
        if (bytes > 0) {
          std::memcpy(PieceData(mine, posted), static_cast<const char*>(send) + offset, bytes);
        }
        mine->posted.store(posted + 1, std::memory_order_release);
        Ring(send_peer);
        ++sent;
        moved = true;
      }
      if (received < to_receive) {
        const uint32_t taken = theirs->taken.load(std::memory_order_acquire);
        const uint32_t their_posted = theirs->posted.load(std::memory_order_acquire);
        PieceDescription& next = theirs->pieces[taken % kPiecesInFlight];
        if (their_posted != taken && next.to.load(std::memory_order_relaxed) == options_.rank) {
          const uint64_t total = next.total_bytes.load(std::memory_order_relaxed);
          const uint64_t piece = next.bytes.load(std::memory_order_relaxed);
          std::atomic_thread_fence(std::memory_order_acquire);
          // Unchanged `taken`: the description read is this piece's, and it is this rank's to
          // take, so nobody else changes its half until it does.
          if (theirs->taken.load(std::memory_order_relaxed) == taken) {
            if (total != recv_bytes) {
              // The piece can never be taken, so its sender would wait for nothing: the
              // generation's communicator ends here for everyone, naming why.
              Status mismatch = InvalidArgumentError(
                  "shm recv on rank " + std::to_string(options_.rank) + ": rank " +
                  std::to_string(recv_peer) + " sent a message of " + std::to_string(total) +
                  " bytes where " + std::to_string(recv_bytes) + " were expected");
              Abort(mismatch.message());
              return Fail(mismatch);
            }
            const size_t offset = received * capacity;
            if (piece > 0) {
              std::memcpy(static_cast<char*>(recv) + offset, PieceData(theirs, taken), piece);
            }
            theirs->taken.store(taken + 1, std::memory_order_release);
            Ring(recv_peer);
            ++received;
            moved = true;
          }
        }
      }
      if (moved) continue;
      LOCKSTEP_RETURN_IF_ERROR(Fail(WaitForDoorbell(rung, send_peer, recv_peer, deadline)));
    }
    return OkStatus();
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
  MailboxHeader* Mailbox(int rank) const {
    return reinterpret_cast<MailboxHeader*>(
        mailboxes_ + static_cast<size_t>(rank) * (sizeof(MailboxHeader) + mailbox_bytes_));
  }
  // Bytes of one piece: half the mailbox, in whole cache lines.
  size_t PieceCapacity() const { return mailbox_bytes_ / kPiecesInFlight / kAlign * kAlign; }
  // Where piece number `piece` of the mailbox's owner lies.
  char* PieceData(MailboxHeader* header, uint32_t piece) const {
    return reinterpret_cast<char*>(header) + sizeof(MailboxHeader) +
           (piece % kPiecesInFlight) * PieceCapacity();
  }
  static size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

  void Ring(int rank) {
    control_->doorbells[rank].fetch_add(1, std::memory_order_release);
    WakeAll(&control_->doorbells[rank]);
  }

  // What ends an exchange between this rank and its peers: an Abort() of any rank, or the
  // departure of one of the two (the other ranks may be done with the generation).
  Status PointToPointAbortStatus(int send_peer, int recv_peer) {
    if (aborted_.load()) return AbortedStatus("send/recv");
    if (control_->abort_called.load() != 0) {
      Status status = PeerAbortStatus("send/recv");
      // The reason's claim may be an earlier departure's; the cause here is the Abort().
      if (status.code() == StatusCode::kAborted) return status;
      return AbortedError("shm send/recv on rank " + std::to_string(options_.rank) +
                          ": communicator aborted by a peer");
    }
    for (int peer : {send_peer, recv_peer}) {
      if (peer >= 0 && (control_->left[peer / 64].load() >> (peer % 64) & 1) != 0) {
        return UnavailableError("shm send/recv on rank " + std::to_string(options_.rank) +
                                ": rank " + std::to_string(peer) + " closed its communicator");
      }
    }
    return OkStatus();
  }

  // Sleeps until this rank's doorbell moves past `rung`, spinning briefly first; returns an
  // error for a passed deadline, a set abort flag or a peer (of this exchange) that is gone.
  Status WaitForDoorbell(uint32_t rung, int send_peer, int recv_peer, const Deadline& deadline) {
    std::atomic<uint32_t>* doorbell = &control_->doorbells[options_.rank];
    const int spins = SpinIterations();
    for (int i = 0; i < spins; ++i) {
      if (doorbell->load(std::memory_order_acquire) != rung) return OkStatus();
      CpuRelax();
    }
    LOCKSTEP_RETURN_IF_ERROR(PointToPointAbortStatus(send_peer, recv_peer));
    const Deadline::Clock::time_point time = Deadline::Clock::now();
    if (time >= deadline.at()) {
      return DeadlineExceededError("shm send/recv on rank " + std::to_string(options_.rank) +
                                   ": the peer did not take part within the deadline");
    }
    if (time >= next_liveness_check_) {
      for (int peer : {send_peer, recv_peer}) {
        if (peer >= 0 && ProcessIsGone(pids_[peer])) {
          return UnavailableError("shm send/recv on rank " + std::to_string(options_.rank) +
                                  ": rank " + std::to_string(peer) + " (pid " +
                                  std::to_string(pids_[peer]) + ") is gone");
        }
      }
      next_liveness_check_ = time + std::chrono::milliseconds(kLivenessIntervalMs);
    }
    const auto sleep = std::min<Deadline::Clock::duration>(
        deadline.at() - time, std::chrono::milliseconds(kLivenessIntervalMs));
    const auto sleep_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(sleep).count();
    timespec timeout{static_cast<time_t>(sleep_ns / 1000000000),
                     static_cast<long>(sleep_ns % 1000000000)};
    Futex(doorbell, FUTEX_WAIT, rung, &timeout);  // EAGAIN/EINTR/ETIMEDOUT: the caller re-checks
    return OkStatus();
  }
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
    for (int r = 0; r < options_.size; ++r) Ring(r);
  }

  // With `peers_flag` false the shared abort flag is left to the wait: a point-to-point message
  // a peer posted before it left can still be taken.
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
  size_t mailbox_bytes_ = 0;
  char* mailboxes_ = nullptr;
  Deadline::Clock::time_point next_liveness_check_{};  // of a point-to-point wait
  std::vector<pid_t> pids_;                            // by rank, read once at bootstrap
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
  struct stat info;
  const size_t total = SegmentBytes(slot_bytes, mailbox_bytes, world);
  if (fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) != total) {
    close(fd);
    return InternalError("shm segment " + name + " has " + std::to_string(info.st_size) +
                         " bytes, expected " + std::to_string(total));
  }
  auto mapping = std::make_unique<Mapping>();
  mapping->base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (mapping->base == MAP_FAILED) return ErrnoStatus("mmap " + name, error);
  mapping->bytes = total;
  const ControlBlock* control = mapping->control();
  if (control->magic != kMagic || control->world_size != static_cast<uint32_t>(world) ||
      control->slot_bytes != slot_bytes || control->mailbox_bytes != mailbox_bytes) {
    return FailedPreconditionError("shm segment " + name +
                                   " was made for another world, slot or mailbox size (ranks "
                                   "disagree "
                                   "on ShmOptions)");
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
