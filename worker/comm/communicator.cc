#include "worker/comm/communicator.h"

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

}  // namespace lockstep::comm
