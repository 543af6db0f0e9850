// The CPU device: plain host memory, and every "queued" operation runs at once on the calling
// thread, so a copy has completed when it returns and events have nothing to order.
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/device.h"

namespace lockstep::kernels::cpu {
namespace {

class CpuEvent final : public DeviceEvent {};

// 64-byte alignment: a cache line, and enough for every vector width the CPU kernels use.
constexpr size_t kAlignment = 64;

class CpuDeviceImpl final : public Device {
 public:
  DeviceType type() const override { return DeviceType::kCpu; }
  std::string name() const override { return "cpu"; }
  const ExecutionContext& compute() const override { return context_; }
  const ExecutionContext& side() const override { return context_; }
  const ExecutionContext& background() const override { return context_; }

  StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* memory = std::aligned_alloc(kAlignment, rounded);
    if (memory == nullptr) {
      return ResourceExhaustedError("cpu: cannot allocate " + std::to_string(bytes) + " bytes");
    }
    std::memset(memory, 0, rounded);
    return memory;
  }
  void Free(void* memory) override { std::free(memory); }
  StatusOr<void*> AllocateHost(size_t bytes) override { return Allocate(bytes); }
  void FreeHost(void* memory) override { std::free(memory); }

  void CopyToDevice(const ExecutionContext&, void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void CopyToHost(const ExecutionContext&, void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void CopyOnDevice(const ExecutionContext&, void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void Synchronize(const ExecutionContext&) override {}
  std::unique_ptr<DeviceEvent> CreateEvent() override { return std::make_unique<CpuEvent>(); }
  void Record(DeviceEvent&, const ExecutionContext&) override {}
  void Wait(const ExecutionContext&, const DeviceEvent&) override {}
  void WaitHost(const DeviceEvent&) override {}

 private:
  const ExecutionContext context_{};
};

}  // namespace

std::unique_ptr<Device> CreateCpuDevice() { return std::make_unique<CpuDeviceImpl>(); }

}  // namespace lockstep::kernels::cpu
