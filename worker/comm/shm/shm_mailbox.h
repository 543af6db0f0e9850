// Point to point over ShmCommunicator's segment: each rank's mailbox (shm_segment.h), the
// protocol at the top of shm_mailbox.cc. ShmCommunicator::SendRecv checks its arguments and
// its own state, then calls Exchange; internal to worker/comm/shm.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"
#include "worker/comm/shm/shm_segment.h"

namespace lockstep::comm::shm {

class ShmMailboxes {
 public:
  // `mailboxes`: where the mailboxes begin in this rank's mapping; `pids`: every rank's, read
  // at bootstrap; `abort_status`: why this rank's exchanges must stop (its own Abort() or any
  // rank's), or OK.
  ShmMailboxes(ControlBlock* control, char* mailboxes, size_t mailbox_bytes, int rank,
               std::vector<pid_t> pids, std::function<Status()> abort_status);

  // Communicator::SendRecv on valid arguments: both sides at once, returning once every piece
  // sent is taken and every piece due is received. INVALID_ARGUMENT when the peer's message has
  // another size than recv_bytes (its piece can never be taken: the caller ends the
  // communicator); DEADLINE_EXCEEDED, ABORTED or UNAVAILABLE as the collectives.
  Status Exchange(const void* send, size_t send_bytes, int send_peer, void* recv, size_t recv_bytes,
                  int recv_peer, const Deadline& deadline);

  // Wakes every rank waiting in an exchange (an abort, a departure).
  void RingAll(int world);

 private:
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
  Status PointToPointAbortStatus(int send_peer, int recv_peer);

  // Sleeps until this rank's doorbell moves past `rung`, spinning briefly first; returns an
  // error for a passed deadline, a set abort flag or a peer (of this exchange) that is gone.
  Status WaitForDoorbell(uint32_t rung, int send_peer, int recv_peer, const Deadline& deadline);

  ControlBlock* const control_;
  char* const mailboxes_;
  const size_t mailbox_bytes_;
  const int rank_;
  const std::vector<pid_t> pids_;
  const std::function<Status()> abort_status_;
  Deadline::Clock::time_point next_liveness_check_{};  // of a wait
};

}  // namespace lockstep::comm::shm
