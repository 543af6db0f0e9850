#include "worker/comm/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/logging.h"

namespace lockstep::comm {
namespace {

constexpr char kUniqueIdKey[] = "nccl/unique-id";

std::string CudaError(cudaError_t error, const char* what) {
  return std::string(what) + ": " + cudaGetErrorName(error) + ": " + cudaGetErrorString(error);
}

Status NcclError(ncclResult_t result, ncclComm_t comm, const std::string& what) {
  std::string message = what + ": " + ncclGetErrorString(result);
  const char* last = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') message += " (" + std::string(last) + ")";
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return InvalidArgumentError(message);
    case ncclSystemError:
    case ncclRemoteError:
    case ncclUnhandledCudaError:
      return UnavailableError(message);
    default:
      return InternalError(message);
  }
}

std::optional<ncclDataType_t> NcclType(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat16:
      return ncclFloat16;
  }
  return std::nullopt;
}

std::optional<ncclRedOp_t> NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return std::nullopt;
}

std::string ToHex(const void* data, size_t bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes * 2);
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned char byte = static_cast<const unsigned char*>(data)[i];
    out.push_back(kDigits[byte >> 4]);
    out.push_back(kDigits[byte & 15]);
  }
  return out;
}

bool FromHex(const std::string& text, void* data, size_t bytes) {
  if (text.size() != bytes * 2) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < bytes; ++i) {
    const int hi = nibble(text[2 * i]);
    const int lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    static_cast<unsigned char*>(data)[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclCommunicatorOptions& options, ncclComm_t comm, cudaStream_t stream,
                   cudaEvent_t input_ready, cudaEvent_t done, void* scratch)
      : options_(options),
        comm_(comm),
        stream_(stream),
        input_ready_(input_ready),
        done_(done),
        scratch_(scratch) {
    watchdog_ = std::thread([this] { Watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    cudaSetDevice(options_.device);
    std::lock_guard<std::mutex> comm_lock(comm_mu_);
    if (!aborted_) {
      // Flush what was issued, bounded; a communicator that does not finalize in time is aborted.
      const ncclResult_t finalized = ncclCommFinalize(comm_);
      const Deadline deadline = Deadline::AfterMs(10000);
      ncclResult_t state = finalized;
      while (state == ncclInProgress && !deadline.expired()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
      }
      if (state == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        LOCKSTEP_LOG(WARNING) << "nccl communicator did not finalize cleanly ("
                              << ncclGetErrorString(state) << "); aborting it";
        ncclCommAbort(comm_);
      }
      aborted_ = true;
    }
    cudaFree(scratch_);
    if (staging_device_ != nullptr) cudaFree(staging_device_);
    if (staging_host_ != nullptr) cudaFreeHost(staging_host_);
    cudaEventDestroy(done_);
    cudaEventDestroy(input_ready_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string backend() const override { return "nccl"; }

  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op,
                   int64_t timeout_ms) override {
    const std::optional<ncclDataType_t> nccl_type = NcclType(type);
    const std::optional<ncclRedOp_t> nccl_op = NcclOp(op);
    if (!nccl_type || !nccl_op) return InvalidArgumentError("nccl all-reduce: unsupported type");
    const size_t bytes = count * DataTypeSize(type);
    if (IsDeviceMemory(data)) {
      return Run("all-reduce", timeout_ms, [&] {
        return ncclAllReduce(data, data, count, *nccl_type, *nccl_op, comm_, stream_);
      });
    }
    return RunStaged("all-reduce", timeout_ms, data, bytes, data, bytes, [&](void* in, void* out) {
      return ncclAllReduce(in, out, count, *nccl_type, *nccl_op, comm_, stream_);
    });
  }

  Status Broadcast(void* data, size_t bytes, int root, int64_t timeout_ms) override {
    if (root < 0 || root >= options_.size) {
      return InvalidArgumentError("nccl broadcast: root " + std::to_string(root) +
                                  " outside the world of " + std::to_string(options_.size));
    }
    if (IsDeviceMemory(data)) {
      return Run("broadcast", timeout_ms, [&] {
        return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_);
      });
    }
    return RunStaged("broadcast", timeout_ms, data, bytes, data, bytes, [&](void* in, void* out) {
      return ncclBroadcast(in, out, bytes, ncclUint8, root, comm_, stream_);
    });
  }

  Status AllGather(const void* in, size_t bytes_per_rank, void* out, int64_t timeout_ms) override {
    if (IsDeviceMemory(in) && IsDeviceMemory(out)) {
      return Run("all-gather", timeout_ms, [&] {
        return ncclAllGather(in, out, bytes_per_rank, ncclUint8, comm_, stream_);
      });
    }
    const size_t out_bytes = bytes_per_rank * static_cast<size_t>(options_.size);
    return RunStaged("all-gather", timeout_ms, in, bytes_per_rank, out, out_bytes,
                     [&](void* staged_in, void* staged_out) {
                       return ncclAllGather(staged_in, staged_out, bytes_per_rank, ncclUint8,
                                            comm_, stream_);
                     });
  }

  Status Barrier(int64_t timeout_ms) override {
    // A one-element all-reduce on a scratch word: every rank has entered once it completes.
    return Run("barrier", timeout_ms, [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
    });
  }

  // ncclSend/ncclRecv in one group, so that both sides of an exchange progress together (NCCL
  // matches the n-th send to a peer with that peer's n-th receive from this rank). Host memory
  // is staged like the collectives'.
  Status SendRecv(const void* send, size_t send_bytes, int send_peer, void* recv,
                  size_t recv_bytes, int recv_peer, int64_t timeout_ms) override {
    LOCKSTEP_RETURN_IF_ERROR(CheckSendRecv("nccl", options_.rank, options_.size, send,
                                           send_bytes, send_peer, recv, recv_bytes, recv_peer));
    auto enqueue = [&](const void* in, void* out) {
      ncclResult_t result = ncclGroupStart();
      if (result == ncclSuccess && send_peer >= 0) {
        result = ncclSend(in, send_bytes, ncclUint8, send_peer, comm_, stream_);
      }
      if (result == ncclSuccess && recv_peer >= 0) {
        result = ncclRecv(out, recv_bytes, ncclUint8, recv_peer, comm_, stream_);
      }
      const ncclResult_t ended = ncclGroupEnd();
      return result != ncclSuccess ? result : ended;
    };
    if ((send_peer < 0 || IsDeviceMemory(send)) && (recv_peer < 0 || IsDeviceMemory(recv))) {
      return Run("send/recv", timeout_ms, [&] { return enqueue(send, recv); });
    }
    // One side may be absent: a byte of its own stands in for its buffer.
    static uint8_t none = 0;
    return RunStaged("send/recv", timeout_ms, send_peer >= 0 ? send : &none,
                     send_peer >= 0 ? send_bytes : 0, recv_peer >= 0 ? recv : &none,
                     recv_peer >= 0 ? recv_bytes : 0,
                     [&](void* in, void* out) { return enqueue(in, out); });
  }

  void Abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (abort_reason_.empty()) abort_reason_ = reason.empty() ? "aborted" : reason;
    }
    AbortComm(Status());
    cv_.notify_all();
  }

 private:
  // Issues one NCCL operation, then `after_issued` (more work on stream_ that must follow it),
  // and waits for both within timeout_ms.
  template <typename Enqueue, typename AfterIssued = cudaError_t (*)()>
  Status Run(const char* what, int64_t timeout_ms, Enqueue enqueue,
             AfterIssued after_issued = [] { return cudaSuccess; }) {
    const std::string name = std::string("nccl ") + what;
    if (Status failed = Failure(); !failed.ok()) return failed.WithContext(name);
    if (timeout_ms <= 0) return InvalidArgumentError(name + ": timeout_ms must be > 0");
    cudaError_t error = cudaSetDevice(options_.device);
    if (error == cudaSuccess) {
      error = cudaEventRecord(input_ready_, static_cast<cudaStream_t>(options_.input_stream));
    }
    if (error == cudaSuccess) error = cudaStreamWaitEvent(stream_, input_ready_, 0);
    if (error != cudaSuccess) return UnavailableError(CudaError(error, name.c_str()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_deadline_ = Deadline::AfterMs(timeout_ms);
      in_flight_ = true;
    }
    cv_.notify_all();
    // Non-blocking communicator: the enqueue may itself be in progress; the state says when it
    // is issued (or failed).
    std::optional<ncclResult_t> result = WithComm(enqueue);
    while (result == ncclInProgress) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      result = WithComm([this] {
        ncclResult_t state = ncclSuccess;
        return ncclCommGetAsyncError(comm_, &state) == ncclSuccess ? state : ncclInternalError;
      });
    }
    if (!result) return Finish(Failure().WithContext(name));  // aborted meanwhile
    if (*result != ncclSuccess) {
      Status status = NcclError(*result, nullptr, name);
      AbortComm(status);
      return Finish(status);
    }
    error = after_issued();
    if (error == cudaSuccess) error = cudaEventRecord(done_, stream_);
    if (error != cudaSuccess) return Finish(UnavailableError(CudaError(error, name.c_str())));
    // Completion: polled with a short sleep that grows to 100 µs (a bucket all-reduce takes
    // tens of µs to ms; a spin would take a core from the input pipeline).
    int64_t pause_us = 1;
    while (true) {
      error = cudaEventQuery(done_);
      if (error == cudaSuccess) return Finish(OkStatus());
      if (error != cudaErrorNotReady) {
        Status status = UnavailableError(CudaError(error, name.c_str()));
        AbortComm(status);
        return Finish(status);
      }
      if (Status failed = Failure(); !failed.ok()) return Finish(failed.WithContext(name));
      std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      pause_us = std::min<int64_t>(pause_us * 2, 100);
    }
  }

  // Whether NCCL can use `pointer` directly: device (or managed) memory. Host memory, such as
  // the trainer's small control values (a leave vote, a loss sum, a state header), is staged.
  static bool IsDeviceMemory(const void* pointer) {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
      (void)cudaGetLastError();  // an unknown host pointer on old runtimes: not sticky
      return false;
    }
    return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  }

  // Grows the staging buffers (device, and page-locked host for asynchronous copies) to `bytes`.
  Status ReserveStaging(size_t bytes) {
    if (bytes <= staging_bytes_) return OkStatus();
    if (staging_device_ != nullptr) cudaFree(staging_device_);
    if (staging_host_ != nullptr) cudaFreeHost(staging_host_);
    staging_device_ = staging_host_ = nullptr;
    staging_bytes_ = 0;
    cudaError_t error = cudaMalloc(&staging_device_, bytes);
    if (error == cudaSuccess) error = cudaMallocHost(&staging_host_, bytes);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      return ResourceExhaustedError(CudaError(error, "nccl: staging buffer"));
    }
    staging_bytes_ = bytes;
    return OkStatus();
  }

  // A collective on host memory (either side; the other may be device memory): `in` is copied to
  // the device staging buffer (input at offset 0, output after it unless the operation is in
  // place), the operation runs there, and the result is copied into `out` once it completed. The copies go through page-locked memory on the
  // communication stream, so the whole call is polled against its deadline like any other.
  template <typename Enqueue>
  Status RunStaged(const char* what, int64_t timeout_ms, const void* in, size_t in_bytes,
                   void* out, size_t out_bytes, Enqueue enqueue) {
    // An aborted communicator's stream may still hold work on the staging buffers: never free
    // them (ReserveStaging) after a failure.
    if (Status failed = Failure(); !failed.ok()) {
      return failed.WithContext(std::string("nccl ") + what);
    }
    const bool in_place = in == out;
    const bool in_on_device = IsDeviceMemory(in);  // an all-gather may mix the two
    const bool out_on_device = IsDeviceMemory(out);
    const size_t out_offset = in_place ? 0 : (in_bytes + 255) / 256 * 256;
    LOCKSTEP_RETURN_IF_ERROR(ReserveStaging(std::max<size_t>(1, out_offset + out_bytes)));
    char* device = static_cast<char*>(staging_device_);
    char* host = static_cast<char*>(staging_host_);
    if (!in_on_device) std::memcpy(host, in, in_bytes);
    Status status = Run(
        what, timeout_ms,
        [&] {
          const cudaError_t error =
              in_on_device
                  ? cudaMemcpyAsync(device, in, in_bytes, cudaMemcpyDeviceToDevice, stream_)
                  : cudaMemcpyAsync(device, host, in_bytes, cudaMemcpyHostToDevice, stream_);
          if (error != cudaSuccess) return ncclUnhandledCudaError;
          return enqueue(device, device + out_offset);
        },
        // Only once the non-blocking communicator has issued the operation is it on the stream,
        // so the copy back is queued then, behind it.
        [&] {
          return out_on_device ? cudaMemcpyAsync(out, device + out_offset, out_bytes,
                                                 cudaMemcpyDeviceToDevice, stream_)
                               : cudaMemcpyAsync(host + out_offset, device + out_offset,
                                                 out_bytes, cudaMemcpyDeviceToHost, stream_);
        });
    if (status.ok() && !out_on_device) std::memcpy(out, host + out_offset, out_bytes);
    return status;
  }

  Status Finish(Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ = false;
    return status;
  }

  // Why the communicator is unusable, or OK.
  Status Failure() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!abort_reason_.empty()) return AbortedError("communicator aborted: " + abort_reason_);
    return failure_;
  }

  // Aborts the NCCL communicator once; `cause` (when not OK and the first) is what later calls
  // report. ncclCommAbort is what makes kernels that wait for a dead peer return.
  void AbortComm(const Status& cause) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failure_.ok() && !cause.ok()) failure_ = cause;
    }
    std::lock_guard<std::mutex> comm_lock(comm_mu_);
    if (aborted_) return;
    aborted_ = true;
    cudaSetDevice(options_.device);
    const ncclResult_t result = ncclCommAbort(comm_);
    if (result != ncclSuccess) {
      LOCKSTEP_LOG(WARNING) << "ncclCommAbort: " << ncclGetErrorString(result);
    }
  }

  // Calls `call` (an NCCL function of comm_) unless the communicator was aborted (nullopt then):
  // NCCL calls on one communicator, ncclCommAbort included, never overlap, and none follows the
  // abort that freed it.
  template <typename Call>
  std::optional<ncclResult_t> WithComm(Call call) {
    std::lock_guard<std::mutex> comm_lock(comm_mu_);
    if (aborted_) return std::nullopt;
    return call();
  }

  // The watchdog: NCCL's asynchronous error (a peer died, the network failed) and the deadline
  // of the collective in flight, every watchdog_interval_ms.
  void Watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock,
                   std::chrono::milliseconds(std::max<int64_t>(1, options_.watchdog_interval_ms)));
      if (stopping_ || !failure_.ok() || !abort_reason_.empty()) continue;
      Status cause;
      if (in_flight_ && in_flight_deadline_.expired()) {
        cause = DeadlineExceededError(
            "nccl collective: the peers did not take part within its deadline");
      } else {
        lock.unlock();
        std::optional<ncclResult_t> state = WithComm([this] {
          ncclResult_t async = ncclSuccess;
          const ncclResult_t queried = ncclCommGetAsyncError(comm_, &async);
          return queried == ncclSuccess ? async : queried;
        });
        lock.lock();
        if (state && *state != ncclSuccess && *state != ncclInProgress) {
          // A peer that died or a broken network: the Communicator contract's UNAVAILABLE.
          cause = UnavailableError(NcclError(*state, nullptr, "nccl: asynchronous error").message());
        }
      }
      if (cause.ok()) continue;
      LOCKSTEP_LOG(WARNING) << "nccl watchdog (rank " << options_.rank << "): " << cause.message()
                            << "; aborting the communicator";
      lock.unlock();
      AbortComm(cause);
      lock.lock();
    }
  }

  const NcclCommunicatorOptions options_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  cudaEvent_t input_ready_;
  cudaEvent_t done_;
  void* scratch_;  // one float for Barrier
  // Staging of host buffers (RunStaged); used by the one calling thread.
  void* staging_device_ = nullptr;
  void* staging_host_ = nullptr;
  size_t staging_bytes_ = 0;

  std::mutex comm_mu_;   // held around every NCCL call on comm_ (see WithComm)
  bool aborted_ = false;  // under comm_mu_: comm_ was aborted or destroyed (the handle is gone)

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::string abort_reason_;   // Abort() was called
  Status failure_;             // the first error, when not Abort()
  bool in_flight_ = false;
  Deadline in_flight_deadline_ = Deadline::AfterMs(0);
  std::thread watchdog_;
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const NcclCommunicatorOptions& options, rendezvous::KeyValueStore& store) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return InvalidArgumentError("nccl communicator: rank " + std::to_string(options.rank) +
                                " of a world of " + std::to_string(options.size));
  }
  int devices = 0;
  cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess) {
    return UnavailableError(CudaError(error, "nccl communicator: cudaGetDeviceCount"));
  }
  if (options.device < 0 || options.device >= devices) {
    return InvalidArgumentError("nccl communicator: device " + std::to_string(options.device) +
                                " of " + std::to_string(devices));
  }
  error = cudaSetDevice(options.device);
  if (error != cudaSuccess) return UnavailableError(CudaError(error, "cudaSetDevice"));
  const Deadline deadline = Deadline::AfterMs(options.connect_timeout_ms);

  // 1. The unique id, through the generation's store.
  ncclUniqueId id;
  if (options.rank == 0) {
    const ncclResult_t drawn = ncclGetUniqueId(&id);
    if (drawn != ncclSuccess) return NcclError(drawn, nullptr, "ncclGetUniqueId");
    LOCKSTEP_RETURN_IF_ERROR(
        store.Set(kUniqueIdKey, ToHex(&id, sizeof(id)), std::max<int64_t>(1, deadline.remaining_ms()))
            .WithContext("nccl communicator: publishing the unique id"));
  } else {
    StatusOr<std::vector<std::string>> got =
        store.Get({kUniqueIdKey}, std::max<int64_t>(1, deadline.remaining_ms()));
    if (!got.ok()) return got.status().WithContext("nccl communicator: reading rank 0's unique id");
    if (!FromHex((*got)[0], &id, sizeof(id))) {
      return InternalError("nccl communicator: malformed unique id in the store");
    }
  }

  // 2. The communicator, non-blocking, polled against the deadline.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  while (result == ncclInProgress) {
    if (deadline.expired()) {
      ncclCommAbort(comm);
      return DeadlineExceededError("nccl communicator: not every rank of " +
                                   std::to_string(options.size) + " connected within " +
                                   std::to_string(options.connect_timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(comm, &result) != ncclSuccess) result = ncclInternalError;
  }
  if (result != ncclSuccess) {
    Status status = NcclError(result, comm, "ncclCommInitRankConfig");
    if (comm != nullptr) ncclCommAbort(comm);
    return status;
  }

  // 3. The stream, the events and the barrier's scratch word.
  cudaStream_t stream = nullptr;
  cudaEvent_t input_ready = nullptr, done = nullptr;
  void* scratch = nullptr;
  error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (error == cudaSuccess) error = cudaEventCreateWithFlags(&input_ready, cudaEventDisableTiming);
  if (error == cudaSuccess) error = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (error == cudaSuccess) error = cudaMalloc(&scratch, sizeof(float));
  if (error == cudaSuccess) error = cudaMemsetAsync(scratch, 0, sizeof(float), stream);
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  if (error != cudaSuccess) {
    if (scratch != nullptr) cudaFree(scratch);
    if (done != nullptr) cudaEventDestroy(done);
    if (input_ready != nullptr) cudaEventDestroy(input_ready);
    if (stream != nullptr) cudaStreamDestroy(stream);
    ncclCommAbort(comm);
    return UnavailableError(CudaError(error, "nccl communicator: stream and events"));
  }
  LOCKSTEP_LOG(INFO) << "nccl communicator: rank " << options.rank << " of " << options.size
                     << " on device " << options.device;
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(options, comm, stream, input_ready, done, scratch));
}

}  // namespace lockstep::comm
