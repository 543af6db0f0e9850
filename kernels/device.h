// The device layer: where the trainer's tensors live and how work is ordered on them. One
// interface, two implementations (cpu/cpu_device.cc, cuda/cuda_device.cc), so the one trainer
// that CI runs on the CPU is the trainer that runs on a GPU; only the kernels, the copies and the
// NCCL calls differ.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateDevice(DeviceType::kCuda));
//   DeviceArray<float> params;
//   LOCKSTEP_RETURN_IF_ERROR(params.Allocate(*device, n));          // zero-filled
//   LOCKSTEP_RETURN_IF_ERROR(params.CopyFromHost(host.data(), n));  // synchronous
//   kernels::Scale(device->compute(), n, 0.5f, params.device_data());
//   LOCKSTEP_ASSIGN_OR_RETURN(std::vector<float> back, params.ToHost());
//
// Streams. A device has three queues of work, each named by an ExecutionContext:
//  - compute(): every kernel of forward, backward and the optimizer, and the batch copies;
//  - side(): work that must not wait behind compute: the copies of the next training batch (while
//    the current step computes), packing and unpacking gradient buckets around the collectives
//    while backward runs on (the NCCL communicator orders itself after this queue);
//  - background(): long copies that nothing in a step waits for: a checkpoint snapshot's
//    device-to-host copies (hundreds of MB, tens of ms), which on the side queue would hold the
//    next batch's copy, and so the step, behind them.
// Work on one queue runs in the order it was queued; across queues, an Event orders it. On the CPU
// both contexts run synchronously on the calling thread, so events are no-ops and every copy has
// completed when the call returns.
//
// Memory. DeviceArray<T> owns device memory that host code cannot index: it has no operator[], no
// iterators, and its pointer is reached only through device_data(), which is for kernels and
// collectives (grep for it to review every place that touches device memory). Host code moves
// values in and out through the copy functions. Host staging buffers that asynchronous copies read
// or write are page-locked on CUDA (HostArray), so the copies are true DMA and do not block.
//
// Thread safety: a Device may be used from several threads at once (the training thread, the
// gradient synchronizer's communication thread, the checkpoint capture thread). Queuing is
// thread-safe, but work that several threads queue on one context runs in the order the calls
// happened to be made, so each thread orders what it depends on with events, never with call
// order; and Synchronize(on) waits for everybody's work on `on`, not only the caller's. (Today
// the side context serves two threads: the batch copy and the bucket packing each wait on their
// own events; the checkpoint's copies have the background context.) DeviceArray is not
// thread-safe.
//
// Errors: allocation returns RESOURCE_EXHAUSTED naming the bytes and the device. Like the kernels,
// a failed copy or event call aborts naming the call (kernels/cuda/cuda_check.h): CUDA errors in
// a stream are sticky, so the process cannot go on using the device anyway.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "kernels/kernels.h"

namespace lockstep::kernels {

// A point in one context's queue of work.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceType type() const = 0;
  // "cpu", or "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string name() const = 0;

  virtual const ExecutionContext& compute() const = 0;
  virtual const ExecutionContext& side() const = 0;
  virtual const ExecutionContext& background() const = 0;

  // Device memory, `bytes` > 0, zero-filled. RESOURCE_EXHAUSTED when it does not fit.
  virtual StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* memory) = 0;
  // Host memory that asynchronous copies may use (page-locked on CUDA), zero-filled.
  virtual StatusOr<void*> AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* memory) = 0;

  // Copies queued on `on`. On CUDA they are asynchronous: the host side must stay valid (and, for
  // CopyToDevice, unchanged) until `on` passes the copy (Synchronize, or an event). Zero bytes is a
  // no-op.
  virtual void CopyToDevice(const ExecutionContext& on, void* device_dst, const void* host_src,
                            size_t bytes) = 0;
  virtual void CopyToHost(const ExecutionContext& on, void* host_dst, const void* device_src,
                          size_t bytes) = 0;
  virtual void CopyOnDevice(const ExecutionContext& on, void* device_dst, const void* device_src,
                            size_t bytes) = 0;

  // Blocks until every piece of work queued on `on` so far is done.
  virtual void Synchronize(const ExecutionContext& on) = 0;

  virtual std::unique_ptr<DeviceEvent> CreateEvent() = 0;
  // Marks the current end of `on`'s queue.
  virtual void Record(DeviceEvent& event, const ExecutionContext& on) = 0;
  // Work queued on `on` after this call starts only once `event` is reached. Does not block the
  // host. An event never recorded is already reached.
  virtual void Wait(const ExecutionContext& on, const DeviceEvent& event) = 0;
  // Blocks the host until `event` is reached.
  virtual void WaitHost(const DeviceEvent& event) = 0;
};

// Why a CUDA device cannot be used in this process, or OK when one can: "this build has no CUDA
// kernels", "no CUDA driver (...)", "no CUDA device is visible (CUDA_VISIBLE_DEVICES=...)".
Status CudaUsable();
// How many CUDA devices this process sees (0 without a driver or a CUDA build).
int CudaDeviceCount();

// The process-wide CPU device.
Device& CpuDevice();

// kCpu: a CPU device; kCuda: the CUDA device `ordinal` with its own streams and cuBLAS handle
// (allow_tf32 goes to its compute context). UNAVAILABLE with CudaUsable()'s reason when no CUDA
// device can be used; INVALID_ARGUMENT for an ordinal it does not see.
StatusOr<std::unique_ptr<Device>> CreateDevice(DeviceType type, int ordinal = 0,
                                               bool allow_tf32 = false);

namespace internal {

// Where an OwnedArray's memory comes from: Device::Allocate/Free or AllocateHost/FreeHost.
enum class MemoryKind { kDevice, kHost };

// The ownership both arrays below share: `count` zeroed elements from one device's allocator,
// released on destruction or reallocation. Movable, not copyable.
template <typename T, MemoryKind kKind>
class OwnedArray {
 public:
  OwnedArray() = default;
  ~OwnedArray() { Release(); }
  OwnedArray(OwnedArray&& other) noexcept { *this = std::move(other); }
  OwnedArray& operator=(OwnedArray&& other) noexcept {
    if (this != &other) {
      Release();
      device_ = std::exchange(other.device_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  OwnedArray(const OwnedArray&) = delete;
  OwnedArray& operator=(const OwnedArray&) = delete;

  // (Re)allocates `count` zero elements on `device` (0: empty).
  Status Allocate(Device& device, int64_t count) {
    Release();
    device_ = &device;
    if (count <= 0) return OkStatus();
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    LOCKSTEP_ASSIGN_OR_RETURN(void* memory, kKind == MemoryKind::kDevice
                                                ? device.Allocate(bytes)
                                                : device.AllocateHost(bytes));
    data_ = static_cast<T*>(memory);
    size_ = count;
    return OkStatus();
  }

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t bytes() const { return static_cast<size_t>(size_) * sizeof(T); }
  Device* device() const { return device_; }

 protected:
  T* memory() const { return data_; }

 private:
  void Release() {
    if (data_ == nullptr) return;
    if (kKind == MemoryKind::kDevice) {
      device_->Free(data_);
    } else {
      device_->FreeHost(data_);
    }
    data_ = nullptr;
    size_ = 0;
  }

  Device* device_ = nullptr;
  T* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace internal

// An owned array of T in a device's memory (see the file comment). Movable, not copyable.
template <typename T>
class DeviceArray : public internal::OwnedArray<T, internal::MemoryKind::kDevice> {
  using Base = internal::OwnedArray<T, internal::MemoryKind::kDevice>;

 public:
  // For kernels and collectives only: the memory is the device's.
  T* device_data() { return Base::memory(); }
  const T* device_data() const { return Base::memory(); }

  // Synchronous copies through the compute queue (they follow the work queued there): elements
  // [offset, offset + count) from or to host memory. INVALID_ARGUMENT when out of range.
  Status CopyFromHost(const T* host, int64_t count, int64_t offset = 0) {
    LOCKSTEP_RETURN_IF_ERROR(CheckRange(count, offset));
    if (count == 0) return OkStatus();
    Device& device = *Base::device();
    device.CopyToDevice(device.compute(), Base::memory() + offset, host,
                        static_cast<size_t>(count) * sizeof(T));
    device.Synchronize(device.compute());
    return OkStatus();
  }
  Status CopyToHost(T* host, int64_t count, int64_t offset = 0) const {
    LOCKSTEP_RETURN_IF_ERROR(CheckRange(count, offset));
    if (count == 0) return OkStatus();
    Device& device = *Base::device();
    device.CopyToHost(device.compute(), host, Base::memory() + offset,
                      static_cast<size_t>(count) * sizeof(T));
    device.Synchronize(device.compute());
    return OkStatus();
  }
  StatusOr<std::vector<T>> ToHost() const {
    std::vector<T> host(static_cast<size_t>(Base::size()));
    LOCKSTEP_RETURN_IF_ERROR(CopyToHost(host.data(), Base::size()));
    return host;
  }

 private:
  Status CheckRange(int64_t count, int64_t offset) const {
    if (count < 0 || offset < 0 || offset + count > Base::size()) {
      return InvalidArgumentError("device array of " + std::to_string(Base::size()) +
                                  " elements: copy of [" + std::to_string(offset) + ", " +
                                  std::to_string(offset + count) + ") is out of range");
    }
    return OkStatus();
  }
};

// An owned array of T in host memory that a device's asynchronous copies may use: indexable by
// the host, page-locked on CUDA. Movable, not copyable.
template <typename T>
class HostArray : public internal::OwnedArray<T, internal::MemoryKind::kHost> {
  using Base = internal::OwnedArray<T, internal::MemoryKind::kHost>;

 public:
  T* data() { return Base::memory(); }
  const T* data() const { return Base::memory(); }
  T& operator[](int64_t i) { return Base::memory()[i]; }
  const T& operator[](int64_t i) const { return Base::memory()[i]; }
};

}  // namespace lockstep::kernels
