#include "worker/comm/communicator.h"

#include <algorithm>
#include <string>
#include <utility>

namespace lockstep::comm {

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
    case DataType::kBFloat16:
    case DataType::kFloat16:
      return 2;
  }
  return 0;
}

const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kInt64:
      return "int64";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kFloat16:
      return "float16";
  }
  return "unknown";
}

size_t PartBegin(size_t count, int parts, int part) {
  const size_t per = (count + parts - 1) / parts;
  return std::min(count, per * static_cast<size_t>(part));
}

Status CheckSendRecv(const std::string& backend, int rank, int size, const void* send,
                     size_t send_bytes, int send_peer, const void* recv, size_t recv_bytes,
                     int recv_peer) {
  const std::string where = backend + " send/recv on rank " + std::to_string(rank) + ": ";
  if (send_peer < 0 && recv_peer < 0) {
    return InvalidArgumentError(where + "neither a peer to send to nor one to receive from");
  }
  for (const auto& [side, peer] : {std::pair{"send", send_peer}, std::pair{"recv", recv_peer}}) {
    if (peer == rank || peer < -1 || peer >= size) {
      return InvalidArgumentError(
          where + side + " peer " + std::to_string(peer) +
          (peer == rank ? " is this rank itself" : " outside world of " + std::to_string(size)));
    }
  }
  if (send_peer >= 0 && send == nullptr && send_bytes > 0) {
    return InvalidArgumentError(where + "a null send buffer for " + std::to_string(send_bytes) +
                                " bytes");
  }
  if (recv_peer >= 0 && recv == nullptr && recv_bytes > 0) {
    return InvalidArgumentError(where + "a null recv buffer for " + std::to_string(recv_bytes) +
                                " bytes");
  }
  if (send_peer >= 0 && recv_peer >= 0 && send_bytes > 0 && recv_bytes > 0) {
    const auto* send_begin = static_cast<const char*>(send);
    const auto* recv_begin = static_cast<const char*>(recv);
    if (send_begin < recv_begin + recv_bytes && recv_begin < send_begin + send_bytes) {
      return InvalidArgumentError(where + "the send and recv buffers overlap");
    }
  }
  return OkStatus();
}

}  // namespace lockstep::comm
