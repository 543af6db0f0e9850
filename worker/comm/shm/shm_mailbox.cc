#include "worker/comm/shm/shm_mailbox.h"

#include <linux/futex.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

// The protocol. After the collectives' slots, each rank has a mailbox (a 128-byte header and
// mailbox_bytes of data in two halves) that only it writes. A message travels in pieces of at
// most half the mailbox:
//  - the sender waits until the half for its next piece is free (posted - taken < 2), copies the
//    piece in, describes it (recipient, the message's total size, the piece's size) and
//    increments `posted` (release);
//  - the recipient waits until the sender's next piece to take is addressed to it (posted !=
//    taken, to == itself), copies it out and increments `taken`.
// With two halves the sender's copy of one piece overlaps the recipient's copy of the one
// before. Either increment rings the other rank's doorbell (a futex word per rank in the control
// block, incremented and woken), on which a rank that can make no progress sleeps, re-checking
// its deadline, the abort flag and the peer's pid every 100 ms as a barrier does. An exchange
// moves whichever side can move, so two ranks sending to each other at once both progress, and
// returns once its last piece is taken, so a mailbox only ever holds pieces of one message.
// Messages from one rank to another are taken in the order they were posted: the n-th Send
// matches the n-th Recv. A size mismatch ends the communicator (the piece could never be
// taken). Only the two ranks take part; the collectives' slots and barriers are untouched.

namespace lockstep::comm::shm {

ShmMailboxes::ShmMailboxes(ControlBlock* control, char* mailboxes, size_t mailbox_bytes, int rank,
                           std::vector<pid_t> pids, std::function<Status()> abort_status)
    : control_(control),
      mailboxes_(mailboxes),
      mailbox_bytes_(mailbox_bytes),
      rank_(rank),
      pids_(std::move(pids)),
      abort_status_(std::move(abort_status)) {}

Status ShmMailboxes::Exchange(const void* send, size_t send_bytes, int send_peer, void* recv,
                              size_t recv_bytes, int recv_peer, const Deadline& deadline) {
  LOCKSTEP_RETURN_IF_ERROR(PointToPointAbortStatus(send_peer, recv_peer));
  // Pieces still to move each way; a message of 0 bytes is one empty piece.
  const size_t capacity = PieceCapacity();
  auto pieces = [capacity](size_t bytes) { return std::max<size_t>(1, CeilDiv(bytes, capacity)); };
  size_t to_send = send_peer >= 0 ? pieces(send_bytes) : 0;
  size_t to_receive = recv_peer >= 0 ? pieces(recv_bytes) : 0;
  size_t sent = 0, received = 0;
  MailboxHeader* mine = Mailbox(rank_);
  MailboxHeader* theirs = recv_peer >= 0 ? Mailbox(recv_peer) : nullptr;
  std::atomic<uint32_t>* doorbell = &control_->doorbells[rank_];
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
    if (sent < to_send && posted - mine->taken.load(std::memory_order_acquire) < kPiecesInFlight) {
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
      if (their_posted != taken && next.to.load(std::memory_order_relaxed) == rank_) {
        const uint64_t total = next.total_bytes.load(std::memory_order_relaxed);
        const uint64_t piece = next.bytes.load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        // Unchanged `taken`: the description read is this piece's, and it is this rank's to
        // take, so nobody else changes its half until it does.
        if (theirs->taken.load(std::memory_order_relaxed) == taken) {
          if (total != recv_bytes) {
            // The piece can never be taken: the caller ends the communicator.
            return InvalidArgumentError("shm recv on rank " + std::to_string(rank_) + ": rank " +
                                        std::to_string(recv_peer) + " sent a message of " +
                                        std::to_string(total) + " bytes where " +
                                        std::to_string(recv_bytes) + " were expected");
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
    LOCKSTEP_RETURN_IF_ERROR(WaitForDoorbell(rung, send_peer, recv_peer, deadline));
  }
  return OkStatus();
}

Status ShmMailboxes::PointToPointAbortStatus(int send_peer, int recv_peer) {
  LOCKSTEP_RETURN_IF_ERROR(abort_status_());
  for (int peer : {send_peer, recv_peer}) {
    if (peer >= 0 && (control_->left[peer / 64].load() >> (peer % 64) & 1) != 0) {
      return UnavailableError("shm send/recv on rank " + std::to_string(rank_) + ": rank " +
                              std::to_string(peer) + " closed its communicator");
    }
  }
  return OkStatus();
}

Status ShmMailboxes::WaitForDoorbell(uint32_t rung, int send_peer, int recv_peer,
                                     const Deadline& deadline) {
  std::atomic<uint32_t>* doorbell = &control_->doorbells[rank_];
  const int spins = SpinIterations();
  for (int i = 0; i < spins; ++i) {
    if (doorbell->load(std::memory_order_acquire) != rung) return OkStatus();
    CpuRelax();
  }
  LOCKSTEP_RETURN_IF_ERROR(PointToPointAbortStatus(send_peer, recv_peer));
  const Deadline::Clock::time_point time = Deadline::Clock::now();
  if (time >= deadline.at()) {
    return DeadlineExceededError("shm send/recv on rank " + std::to_string(rank_) +
                                 ": the peer did not take part within the deadline");
  }
  if (time >= next_liveness_check_) {
    for (int peer : {send_peer, recv_peer}) {
      if (peer >= 0 && ProcessIsGone(pids_[peer])) {
        return UnavailableError("shm send/recv on rank " + std::to_string(rank_) + ": rank " +
                                std::to_string(peer) + " (pid " + std::to_string(pids_[peer]) +
                                ") is gone");
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

void ShmMailboxes::RingAll(int world) {
  for (int r = 0; r < world; ++r) Ring(r);
}

}  // namespace lockstep::comm::shm
