// The CUDA device of kernels/device.h: cudaMalloc'd memory, page-locked host staging, three
// non-blocking streams (compute, side, background) and a cuBLAS handle bound to the compute
// stream. Host
// code only, so g++ compiles it.
//
// Every call first makes the device current on the calling thread (cudaSetDevice is per thread,
// and the synchronizer's and the checkpoint's threads use the device too). Failures of copies,
// events and synchronisation abort like the kernels' (cuda_check.h): such errors are sticky.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <utility>

#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.h"

namespace lockstep::kernels::cuda {
namespace {

class CudaEvent final : public DeviceEvent {
 public:
  explicit CudaEvent(cudaEvent_t event) : event_(event) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_;
};

cudaEvent_t EventOf(const DeviceEvent& event) { return static_cast<const CudaEvent&>(event).get(); }

class CudaDeviceImpl final : public Device {
 public:
  CudaDeviceImpl(int ordinal, std::string name, cudaStream_t compute, cudaStream_t side,
                 cudaStream_t background, cublasHandle_t blas, bool allow_tf32)
      : ordinal_(ordinal), name_(std::move(name)), blas_(blas) {
    compute_.device = DeviceType::kCuda;
    compute_.cuda_stream = compute;
    compute_.blas_handle = blas;
    compute_.allow_tf32 = allow_tf32;
    // The side queue runs no Gemm: no handle, so a Gemm queued there fails loudly.
    side_.device = DeviceType::kCuda;
    side_.cuda_stream = side;
    background_.device = DeviceType::kCuda;
    background_.cuda_stream = background;
  }

  ~CudaDeviceImpl() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(StreamOf(compute_));
    cudaStreamSynchronize(StreamOf(side_));
    cudaStreamSynchronize(StreamOf(background_));
    Cublas().destroy(blas_);
    cudaStreamDestroy(StreamOf(background_));
    cudaStreamDestroy(StreamOf(side_));
    cudaStreamDestroy(StreamOf(compute_));
  }

  DeviceType type() const override { return DeviceType::kCuda; }
  std::string name() const override { return name_; }
  const ExecutionContext& compute() const override { return compute_; }
  const ExecutionContext& side() const override { return side_; }
  const ExecutionContext& background() const override { return background_; }

  StatusOr<void*> Allocate(size_t bytes) override {
    Bind();
    void* memory = nullptr;
    const cudaError_t error = cudaMalloc(&memory, bytes);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();  // out of memory is not sticky
      return ResourceExhaustedError(name_ + ": cannot allocate " + std::to_string(bytes) +
                                    " bytes of device memory (" + cudaGetErrorName(error) + ")");
    }
    // Zero-filled, like the CPU device, so no buffer ever starts from garbage. On the compute
    // stream and waited for: a plain cudaMemset runs on the legacy default stream, which the
    // non-blocking streams do not wait for, so it could land after a later copy into the memory.
    LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(memory, 0, bytes, StreamOf(compute_)));
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(StreamOf(compute_)));
    return memory;
  }
  void Free(void* memory) override {
    Bind();
    // cudaFree waits for the device to finish using the memory.
    LOCKSTEP_CUDA_CHECK(cudaFree(memory));
  }
  StatusOr<void*> AllocateHost(size_t bytes) override {
    Bind();
    void* memory = nullptr;
    const cudaError_t error = cudaMallocHost(&memory, bytes);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      return ResourceExhaustedError(name_ + ": cannot allocate " + std::to_string(bytes) +
                                    " bytes of page-locked host memory (" +
                                    cudaGetErrorName(error) + ")");
    }
    std::memset(memory, 0, bytes);
    return memory;
  }
  void FreeHost(void* memory) override {
    Bind();
    LOCKSTEP_CUDA_CHECK(cudaFreeHost(memory));
  }

  void CopyToDevice(const ExecutionContext& on, void* dst, const void* src, size_t bytes) override {
    Copy(on, dst, src, bytes, cudaMemcpyHostToDevice);
  }
  void CopyToHost(const ExecutionContext& on, void* dst, const void* src, size_t bytes) override {
    Copy(on, dst, src, bytes, cudaMemcpyDeviceToHost);
  }
  void CopyOnDevice(const ExecutionContext& on, void* dst, const void* src, size_t bytes) override {
    Copy(on, dst, src, bytes, cudaMemcpyDeviceToDevice);
  }

  void Synchronize(const ExecutionContext& on) override {
    Bind();
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(StreamOf(on)));
  }

  std::unique_ptr<DeviceEvent> CreateEvent() override {
    Bind();
    cudaEvent_t event = nullptr;
    LOCKSTEP_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return std::make_unique<CudaEvent>(event);
  }
  void Record(DeviceEvent& event, const ExecutionContext& on) override {
    Bind();
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(EventOf(event), StreamOf(on)));
  }
  void Wait(const ExecutionContext& on, const DeviceEvent& event) override {
    Bind();
    LOCKSTEP_CUDA_CHECK(cudaStreamWaitEvent(StreamOf(on), EventOf(event), 0));
  }
  void WaitHost(const DeviceEvent& event) override {
    Bind();
    LOCKSTEP_CUDA_CHECK(cudaEventSynchronize(EventOf(event)));
  }

 private:
  void Bind() const { LOCKSTEP_CUDA_CHECK(cudaSetDevice(ordinal_)); }
  void Copy(const ExecutionContext& on, void* dst, const void* src, size_t bytes,
            cudaMemcpyKind kind) {
    if (bytes == 0) return;
    Bind();
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, StreamOf(on)));
  }

  const int ordinal_;
  const std::string name_;
  cublasHandle_t blas_;
  ExecutionContext compute_;
  ExecutionContext side_;
  ExecutionContext background_;
};

}  // namespace

StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal, bool allow_tf32) {
  LOCKSTEP_RETURN_IF_ERROR(Usable());
  if (ordinal < 0 || ordinal >= DeviceCount()) {
    return InvalidArgumentError("cuda device " + std::to_string(ordinal) + ": this process sees " +
                                std::to_string(DeviceCount()) + " device(s)");
  }
  LOCKSTEP_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice", __FILE__, __LINE__));
  cudaDeviceProp properties{};
  LOCKSTEP_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&properties, ordinal),
                                      "cudaGetDeviceProperties", __FILE__, __LINE__));
  if (properties.major < 8) {
    // The kernels are built for sm_90 and compute_80 PTX (kernels/CMakeLists.txt).
    return FailedPreconditionError(
        "cuda device " + std::to_string(ordinal) + " (" + properties.name +
        ") has compute capability " + std::to_string(properties.major) + "." +
        std::to_string(properties.minor) + "; Lockstep's kernels need 8.0 or newer");
  }
  cudaStream_t compute = nullptr, side = nullptr, background = nullptr;
  cublasHandle_t blas = nullptr;
  Status status = CudaStatus(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking),
                             "cudaStreamCreateWithFlags", __FILE__, __LINE__);
  if (status.ok()) {
    status = CudaStatus(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking),
                        "cudaStreamCreateWithFlags", __FILE__, __LINE__);
  }
  if (status.ok()) {
    status = CudaStatus(cudaStreamCreateWithFlags(&background, cudaStreamNonBlocking),
                        "cudaStreamCreateWithFlags", __FILE__, __LINE__);
  }
  StatusOr<const CublasLibrary*> cublas = LoadCublas();
  if (status.ok() && !cublas.ok()) status = cublas.status();
  if (status.ok()) {
    status = CublasStatus((*cublas)->create(&blas), "cublasCreate", __FILE__, __LINE__);
  }
  if (status.ok()) {
    status =
        CublasStatus((*cublas)->set_stream(blas, compute), "cublasSetStream", __FILE__, __LINE__);
  }
  if (!status.ok()) {
    if (blas != nullptr) (*cublas)->destroy(blas);
    if (background != nullptr) cudaStreamDestroy(background);
    if (side != nullptr) cudaStreamDestroy(side);
    if (compute != nullptr) cudaStreamDestroy(compute);
    return status;
  }
  const std::string name =
      "cuda:" + std::to_string(ordinal) + " (" + std::string(properties.name) + ")";
  return std::unique_ptr<Device>(
      new CudaDeviceImpl(ordinal, name, compute, side, background, blas, allow_tf32));
}

}  // namespace lockstep::kernels::cuda
