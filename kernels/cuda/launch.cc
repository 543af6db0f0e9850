#include "kernels/cuda/launch.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <cstdlib>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace lockstep::kernels::cuda {
namespace {

// Per-device values read once; a process sees at most a few devices, 64 is a generous bound.
constexpr int kMaxDevices = 64;

int CurrentDevice() {
  int device = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) device = kMaxDevices - 1;  // shares the last slot
  return device;
}

// Threads the whole device runs at once: multiprocessors * threads per multiprocessor.
int64_t ResidentThreads(int device) {
  static std::array<std::atomic<int64_t>, kMaxDevices> cache{};
  int64_t threads = cache[device].load(std::memory_order_relaxed);
  if (threads == 0) {
    int multiprocessors = 0, threads_per_multiprocessor = 0;
    LOCKSTEP_CUDA_CHECK(
        cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
    LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&threads_per_multiprocessor,
                                               cudaDevAttrMaxThreadsPerMultiProcessor, device));
    threads = int64_t{multiprocessors} * threads_per_multiprocessor;
    cache[device].store(threads, std::memory_order_relaxed);
  }
  return threads;
}

cudaMemPool_t ScratchPool(int device) {
  static std::mutex mutex;
  static std::array<cudaMemPool_t, kMaxDevices> pools{};
  std::lock_guard<std::mutex> lock(mutex);
  if (pools[device] == nullptr) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    LOCKSTEP_CUDA_CHECK(cudaMemPoolCreate(&pools[device], &props));
    // Keep freed memory in the pool: the same few MiB are reused by every training step.
    uint64_t threshold = std::numeric_limits<uint64_t>::max();
    LOCKSTEP_CUDA_CHECK(
        cudaMemPoolSetAttribute(pools[device], cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  return pools[device];
}

}  // namespace

namespace {

// cudaGetDeviceCount's answer, read once: the set of visible devices cannot change during the
// process. A missing driver or device is an answer, not an error.
struct DeviceCountAnswer {
  cudaError_t error;
  int count;
};

const DeviceCountAnswer& CountDevices() {
  static const DeviceCountAnswer answer = [] {
    int count = 0;
    const cudaError_t error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess) (void)cudaGetLastError();  // not sticky; leave no trace
    return DeviceCountAnswer{error, error == cudaSuccess ? count : 0};
  }();
  return answer;
}

}  // namespace

bool DeviceAvailable() { return CountDevices().count > 0; }

int DeviceCount() { return CountDevices().count; }

Status Usable() {
  const DeviceCountAnswer& answer = CountDevices();
  if (answer.error == cudaErrorNoDevice || (answer.error == cudaSuccess && answer.count == 0)) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return UnavailableError(std::string("no CUDA device is visible") +
                            (visible != nullptr ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible +
                                                      ")"
                                                : std::string()));
  }
  if (answer.error == cudaErrorInsufficientDriver) {
    return UnavailableError(std::string("no CUDA driver is installed, or it is older than this "
                                        "build's CUDA runtime (") +
                            cudaGetErrorName(answer.error) + ")");
  }
  if (answer.error != cudaSuccess) {
    return UnavailableError(std::string("CUDA cannot start: ") + cudaGetErrorName(answer.error) +
                            ": " + cudaGetErrorString(answer.error));
  }
  return OkStatus();
}

int GridSizeFor(int64_t work_items, int threads_per_block) {
  if (work_items <= 0) return 1;
  const int64_t needed = (work_items + threads_per_block - 1) / threads_per_block;
  const int64_t one_wave =
      std::max<int64_t>(1, ResidentThreads(CurrentDevice()) / threads_per_block);
  return static_cast<int>(std::min(needed, one_wave));
}

int VectorPrologue(std::initializer_list<ArrayAddress> arrays) {
  int prologue = 0;
  bool first = true;
  for (const ArrayAddress& array : arrays) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(array.pointer);
    const uintptr_t vector_bytes = 4 * array.element_bytes;
    if (address % array.element_bytes != 0) return -1;
    const int needed = static_cast<int>((vector_bytes - address % vector_bytes) % vector_bytes /
                                        array.element_bytes);
    if (first) {
      prologue = needed;
      first = false;
    } else if (needed != prologue) {
      return -1;
    }
  }
  return prologue;
}

VectorSplit SplitForVectors(int64_t n, int prologue) {
  if (n <= 0) return {0, 0, 0};
  if (prologue < 0) return {n, 0, n};
  const int64_t head = std::min<int64_t>(prologue, n);
  return {head, (n - head) / 4, n};
}

DeviceScratch::DeviceScratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes == 0) return;
  LOCKSTEP_CUDA_CHECK(
      cudaMallocFromPoolAsync(&memory_, bytes, ScratchPool(CurrentDevice()), stream_));
}

DeviceScratch::~DeviceScratch() {
  if (memory_ != nullptr) LOCKSTEP_CUDA_CHECK(cudaFreeAsync(memory_, stream_));
}

}  // namespace lockstep::kernels::cuda
