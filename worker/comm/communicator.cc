#include "worker/comm/communicator.h"

#include <algorithm>

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

}  // namespace lockstep::comm
