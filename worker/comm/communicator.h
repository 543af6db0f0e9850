// Communicator: the collectives data-parallel training needs, behind one interface with one
// implementation per backend (gloo/ for CPU over TCP, nccl/ for GPU).
//
// Contract for every collective:
//  - every rank of the generation calls the same collectives in the same order with the same
//    counts and types (the DDP engine guarantees this by issuing buckets in a fixed order);
//  - each call returns within timeout_ms: DEADLINE_EXCEEDED if the peers do not take part in time,
//    ABORTED once Abort() was called, UNAVAILABLE when a peer's connection breaks. After any
//    error the communicator is unusable: drop it and build a new one for the next generation.
//  - buffers are in the backend's memory (host for gloo, device for nccl).
// A communicator is used by one thread at a time (the engine's communication thread), except
// Abort(), which any thread may call to make blocked and later calls fail promptly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace lockstep::comm {

enum class DataType { kFloat32, kFloat64, kInt64, kBFloat16, kFloat16 };
enum class ReduceOp { kSum, kMax, kMin };

size_t DataTypeSize(DataType type);
const char* DataTypeName(DataType type);

// Where part `part` of `count` elements split into `parts` begins: parts of ceil(count / parts)
// elements, in order, the last ones shorter or empty. ReduceScatter's partition.
size_t PartBegin(size_t count, int parts, int part);

// The arguments of a SendRecv of `backend` on rank `rank` of `size`: INVALID_ARGUMENT naming
// what is wrong (a peer outside the world or this rank itself, neither side given, a null
// buffer with bytes, send and recv buffers that overlap). Every backend calls it first.
Status CheckSendRecv(const std::string& backend, int rank, int size, const void* send,
                     size_t send_bytes, int send_peer, const void* recv, size_t recv_bytes,
                     int recv_peer);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "gloo" | "nccl"

  // In place: data[0..count) becomes the reduction over ranks.
  virtual Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                           int64_t timeout_ms) = 0;
  // In place: data[PartBegin(count, size(), rank()) .. PartBegin(count, size(), rank() + 1))
  // becomes the reduction over ranks of those elements; the rest of data is left unspecified
  // (partial reductions). The default all-reduces the whole buffer; a backend overrides it where
  // reducing only this rank's part moves fewer bytes.
  virtual Status ReduceScatter(void* data, size_t count, DataType type, ReduceOp op,
                               int64_t timeout_ms) {
    return AllReduce(data, count, type, op, timeout_ms);
  }
  // data[0..bytes) on every rank becomes root's.
  virtual Status Broadcast(void* data, size_t bytes, int root, int64_t timeout_ms) = 0;
  // out[r * bytes_per_rank ...] = in of rank r; out holds size() * bytes_per_rank bytes.
  virtual Status AllGather(const void* in, size_t bytes_per_rank, void* out,
                           int64_t timeout_ms) = 0;
  virtual Status Barrier(int64_t timeout_ms) = 0;

  // Point to point, between two ranks (pipeline stages pass activations and their gradients):
  // the n-th message this rank sends to `peer` is the n-th that `peer` receives from this rank,
  // of the same size, whatever else either of them calls in between. A send completes only
  // once the peer receives (rendezvous: no unbounded buffering), so two ranks that send to each
  // other at the same time must do it in one SendRecv each; two plain Sends would each wait for
  // the other's Recv until their deadline. Only the two ranks take part: the others call
  // nothing. Same deadlines and errors as the collectives. A Recv whose size differs from the
  // message's is INVALID_ARGUMENT and ends the communicator for both ranks on Gloo and shm;
  // NCCL cannot tell (its behaviour is undefined), so callers agree on sizes beforehand.
  Status Send(const void* data, size_t bytes, int peer, int64_t timeout_ms) {
    return SendRecv(data, bytes, peer, nullptr, 0, -1, timeout_ms);
  }
  Status Recv(void* data, size_t bytes, int peer, int64_t timeout_ms) {
    return SendRecv(nullptr, 0, -1, data, bytes, peer, timeout_ms);
  }
  // Sends send[0..send_bytes) to send_peer and receives recv[0..recv_bytes) from recv_peer at
  // once; returns when both are done. A peer of -1 leaves that side out; the two peers may be
  // the same rank or different ones (a stage's forward to the next and backward from it, or a
  // ring shift).
  virtual Status SendRecv(const void* send, size_t send_bytes, int send_peer, void* recv,
                          size_t recv_bytes, int recv_peer, int64_t timeout_ms) = 0;
  // Makes every later call fail with ABORTED at once, and closes this rank's connections so that
  // peers blocked on it fail at once (UNAVAILABLE). A call of this rank that is already blocked
  // returns when a peer closes its side or at its deadline: libgloo 0.5 offers no way to wake a
  // blocked pair from outside. When a generation ends every member aborts, so every connection
  // closes and no member waits for its deadline. Safe from any thread, idempotent.
  virtual void Abort(const std::string& reason) = 0;
};

}  // namespace lockstep::comm
