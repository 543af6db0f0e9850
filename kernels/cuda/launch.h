// Launch configuration, device queries and scratch memory shared by the CUDA kernels. Host code
// only: included by the .cu files and by the host-only .cc files of kernels/cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kernels/kernels.h"

namespace lockstep::kernels::cuda {

inline cudaStream_t StreamOf(const ExecutionContext& ctx) {
  return static_cast<cudaStream_t>(ctx.cuda_stream);
}

// Blocks for a grid-stride loop over `work_items` items, `threads_per_block` threads each: one
// full-occupancy wave on the current device (every SM at its thread limit), never more blocks
// than there are items. Memory-bound loops need no more: more blocks only add scheduling.
int GridSizeFor(int64_t work_items, int threads_per_block);

// An array of the elementwise kernels, for VectorPrologue.
struct ArrayAddress {
  const void* pointer;
  size_t element_bytes;
};

// How many leading elements to process one at a time so that every array's remaining elements
// start on a 4-element vector boundary (16 bytes for float, 8 for uint16_t): 0..3, or -1 when the
// arrays are misaligned relative to each other (a slice at an odd offset in one of them), in
// which case the caller processes every element one at a time.
int VectorPrologue(std::initializer_list<ArrayAddress> arrays);

// Splits [0, n) into a scalar head, `vectors` groups of 4 elements and a scalar tail.
struct VectorSplit {
  int64_t head;     // elements [0, head) one at a time
  int64_t vectors;  // then groups [head + 4 v, head + 4 v + 4) for v < vectors
  int64_t n;        // then [head + 4 * vectors, n) one at a time
};
VectorSplit SplitForVectors(int64_t n, int prologue);

// Scratch device memory taken from a lockstep-owned stream-ordered pool of the current device
// (cudaMallocFromPoolAsync), released with cudaFreeAsync on the same stream when the object goes
// out of scope; work queued on that stream before the release may still use it. The pool keeps
// freed memory for the next call (release threshold: unlimited) and holds at most the largest
// scratch in use at once, a few MiB; the device's default pool and its settings, which other
// code may rely on, are left alone. Fatal on failure, like every kernel error.
class DeviceScratch {
 public:
  DeviceScratch(size_t bytes, cudaStream_t stream);
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  // The memory at byte `offset` (offsets the caller keeps aligned).
  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(memory_) + offset);
  }

 private:
  void* memory_ = nullptr;
  cudaStream_t stream_;
};

// Rounds `bytes` up to a multiple of 256, the alignment cudaMalloc gives, for scratch layouts.
constexpr size_t AlignScratch(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace lockstep::kernels::cuda
