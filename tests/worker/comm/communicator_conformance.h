// What every Communicator must do, whatever its backend: one value-parameterized GoogleTest suite
// over a backend (how to build rank r of n, where its buffers live) and a world size, which each
// backend's test program instantiates for itself (so the NCCL instantiation keeps its own program
// and its label "gpu"). Every rank runs as a thread of the test process, bootstrapping through one
// in-memory store; RunRanks surfaces the first rank's failure.
//
//   const CommunicatorBackend& Gloo() { static const CommunicatorBackend b{...}; return b; }
//   INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorConformanceTest,
//                            ::testing::ValuesIn(ConformanceCases(Gloo(), {1, 2, 4})),
//                            ConformanceCaseName);
//   INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorErrorTest, ::testing::Values(&Gloo()),
//                            BackendName);
//
// What only one backend does (shm segment cleanup, Gloo's abort of a blocked call, NCCL streams)
// is tested in that backend's own file, with RunRanks where ranks are threads.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/rendezvous/kv_store.h"
#include "common/status.h"
#include "worker/comm/communicator.h"

namespace lockstep::comm {

// The timeout of every collective and bootstrap the suite expects to succeed.
inline constexpr int64_t kConformanceTimeoutMs = 20000;

// Milliseconds of the steady clock since `start`: for the deadline checks of every backend's tests.
inline int64_t MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

// Where a backend's collective buffers live: host memory for gloo and shm, device memory for
// nccl. The suite fills and reads buffers only through this.
class BufferSpace {
 public:
  virtual ~BufferSpace() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* data) = 0;
  virtual void CopyIn(void* to, const void* host, size_t bytes) = 0;
  virtual void CopyOut(void* host, const void* from, size_t bytes) = 0;
};
BufferSpace& HostSpace();

// A buffer of `T` in a BufferSpace, holding a copy of host values until it is Read back.
template <typename T>
class SpaceBuffer {
 public:
  SpaceBuffer(BufferSpace& space, const std::vector<T>& values)
      : space_(space), count_(values.size()), data_(space.Allocate(Bytes())) {
    space_.CopyIn(data_, values.data(), Bytes());
  }
  ~SpaceBuffer() { space_.Free(data_); }
  SpaceBuffer(const SpaceBuffer&) = delete;
  SpaceBuffer& operator=(const SpaceBuffer&) = delete;

  T* data() { return static_cast<T*>(data_); }
  size_t Bytes() const { return count_ * sizeof(T); }
  std::vector<T> Read() const {
    std::vector<T> values(count_);
    space_.CopyOut(values.data(), data_, Bytes());
    return values;
  }

 private:
  BufferSpace& space_;
  size_t count_;
  void* data_;
};

// One backend under test, and how precisely it keeps its deadlines.
struct CommunicatorBackend {
  std::string name;  // Communicator::backend()
  // Builds rank `rank` of `world`, bootstrapping through `store`, waiting at most
  // connect_timeout_ms for the peers.
  std::function<StatusOr<std::unique_ptr<Communicator>>(
      int rank, int world, rendezvous::KeyValueStore& store, int64_t connect_timeout_ms)>
      create;
  // Why this machine cannot run the backend ("no CUDA device"), or "" when it can.
  std::function<std::string()> unavailable_reason = [] { return std::string(); };
  BufferSpace* space = &HostSpace();
  // A collective whose peer is absent returns DEADLINE_EXCEEDED no earlier than
  // deadline_early_ms before its deadline and no later than deadline_late_ms after it. The late
  // bound tells a call that keeps its deadline from one that hangs, not a fast machine from a
  // loaded one: it leaves 10x the 500 ms deadline the tests give.
  int64_t deadline_early_ms = 50;
  int64_t deadline_late_ms = 4500;
  // A bootstrap without peers gives up no later than this after its connect timeout: 10x the
  // 300 ms timeout the test gives, for the same reason.
  int64_t connect_late_ms = 2700;
  // What a call returns after an earlier call failed; nullopt: any error.
  std::optional<StatusCode> code_after_error;
  // Why point to point reaches only some pairs of ranks ("" when it reaches every pair): the
  // suite's point-to-point tests skip, and the backend's own file tests what it reaches.
  std::string point_to_point_limit{};
};

// Runs body(rank, communicator) on `world` threads, every rank built by `backend` through one
// store (`shared_store`, or one of its own), and returns the first failure in time (prefixed with
// its rank), or OK. A failing rank drops its communicator, which makes its peers fail too;
// reporting the earliest failure surfaces the cause, not the consequence.
Status RunRanks(const CommunicatorBackend& backend, int world,
                const std::function<Status(int, Communicator&)>& body,
                rendezvous::KeyValueStore* shared_store = nullptr);

// Every type (float32, float64, int64) and op at sizes 1, odd, several shm chunks, and 4 MiB,
// with exact expected values; buffers in `space`.
Status CheckEveryAllReduce(int rank, int world, Communicator& comm,
                           BufferSpace& space = HostSpace());

struct ConformanceCase {
  const CommunicatorBackend* backend;
  int world;
};
void PrintTo(const ConformanceCase& param, std::ostream* os);
std::vector<ConformanceCase> ConformanceCases(const CommunicatorBackend& backend,
                                              std::initializer_list<int> worlds);
std::string ConformanceCaseName(const ::testing::TestParamInfo<ConformanceCase>& info);
std::string BackendName(const ::testing::TestParamInfo<const CommunicatorBackend*>& info);

// The collectives at one world size; skips where the backend cannot run.
class CommunicatorConformanceTest : public ::testing::TestWithParam<ConformanceCase> {
 protected:
  void SetUp() override;
  const CommunicatorBackend& backend() const { return *GetParam().backend; }
  int world() const { return GetParam().world; }
};

// Deadlines and refusals, with two ranks where a peer must be absent.
class CommunicatorErrorTest : public ::testing::TestWithParam<const CommunicatorBackend*> {
 protected:
  void SetUp() override;
  const CommunicatorBackend& backend() const { return *GetParam(); }
};

}  // namespace lockstep::comm
