// The shared-memory segment of ShmCommunicator, as every rank maps it: its layout, the control
// block's words and the waiting primitives the collectives (shm_communicator.cc) and point to
// point (shm_mailbox.cc) share. Internal to worker/comm/shm.
#pragma once

#include <sys/mman.h>
#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace lockstep::comm::shm {

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
inline size_t MailboxesOffset(size_t slot_bytes, int world) {
  return kControlBytes + (slot_bytes * world + kAlign - 1) / kAlign * kAlign;
}
inline size_t SegmentBytes(size_t slot_bytes, size_t mailbox_bytes, int world) {
  return MailboxesOffset(slot_bytes, world) + (sizeof(MailboxHeader) + mailbox_bytes) * world;
}

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout);

void WakeAll(std::atomic<uint32_t>* word);

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
int SpinIterations();

// True when `pid` no longer runs: gone (ESRCH) or a zombie its parent has not reaped yet.
bool ProcessIsGone(pid_t pid);

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

}  // namespace lockstep::comm::shm
