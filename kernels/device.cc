// CreateDevice and the CUDA probes: route to cpu/ or, when the CUDA kernels are built, cuda/.
#include "kernels/device.h"

#include "kernels/cpu/cpu_kernels.h"

#ifdef LOCKSTEP_KERNELS_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace lockstep::kernels {

Status CudaUsable() {
#ifdef LOCKSTEP_KERNELS_WITH_CUDA
  return cuda::Usable();
#else
  return UnavailableError("this build has no CUDA kernels (it was built without nvcc)");
#endif
}

int CudaDeviceCount() {
#ifdef LOCKSTEP_KERNELS_WITH_CUDA
  return cuda::DeviceCount();
#else
  return 0;
#endif
}

Device& CpuDevice() {
  static Device* const device = cpu::CreateCpuDevice().release();  // never destroyed
  return *device;
}

StatusOr<std::unique_ptr<Device>> CreateDevice(DeviceType type, int ordinal, bool allow_tf32) {
  switch (type) {
    case DeviceType::kCpu:
      return cpu::CreateCpuDevice();
    case DeviceType::kCuda:
#ifdef LOCKSTEP_KERNELS_WITH_CUDA
      return cuda::CreateCudaDevice(ordinal, allow_tf32);
#else
      return CudaUsable();
#endif
  }
  return InvalidArgumentError("unknown device type " + std::to_string(static_cast<int>(type)));
}

}  // namespace lockstep::kernels
