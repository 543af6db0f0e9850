// The NCCL communicator on one GPU (NCCL refuses two ranks on one device; the multi-rank logic
// above the Communicator interface is shared with Gloo and tested there): the collectives every
// backend passes (communicator_conformance.h) at a world of one, with device buffers, and what is
// NCCL's own (streams, host staging, the unique id, devices). Every device test skips without a
// GPU; the last test runs only where there is none and checks what such a machine is told.
#include "worker/comm/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "tests/worker/comm/communicator_conformance.h"
#include "tests/worker/comm/memory_store.h"

namespace lockstep::comm {
namespace {

bool HaveGpu() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

#define REQUIRE_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device"

// A device buffer holding `host`, copied back by Read.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : count_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, Bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), Bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  T* get() { return static_cast<T*>(data_); }
  size_t Bytes() const { return count_ * sizeof(T); }
  std::vector<T> Read() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, Bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t count_;
  void* data_ = nullptr;
};

// Device memory of device 0, for the shared suite's buffers.
class DeviceSpace : public BufferSpace {
 public:
  void* Allocate(size_t bytes) override {
    void* data = nullptr;
    EXPECT_EQ(cudaMalloc(&data, bytes > 0 ? bytes : 1), cudaSuccess);
    return data;
  }
  void Free(void* data) override { cudaFree(data); }
  void CopyIn(void* to, const void* host, size_t bytes) override {
    EXPECT_EQ(cudaMemcpy(to, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void CopyOut(void* host, const void* from, size_t bytes) override {
    EXPECT_EQ(cudaMemcpy(host, from, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
};

const CommunicatorBackend& Nccl() {
  static DeviceSpace device_space;
  static const CommunicatorBackend backend{
      .name = "nccl",
      .create =
          [](int rank, int world, rendezvous::KeyValueStore& store, int64_t connect_timeout_ms) {
            return CreateNcclCommunicator({.rank = rank,
                                           .size = world,
                                           .device = 0,
                                           .connect_timeout_ms = connect_timeout_ms},
                                          store);
          },
      .unavailable_reason =
          [] { return HaveGpu() ? std::string() : std::string("no CUDA device"); },
      .space = &device_space,
      .code_after_error = std::nullopt,  // the error suite is not instantiated: one rank only
  };
  return backend;
}

// One rank: NCCL refuses two ranks on one device. The deadline and refusal suite needs two.
INSTANTIATE_TEST_SUITE_P(Nccl, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ConformanceCases(Nccl(), {1})), ConformanceCaseName);

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  std::vector<float> values(n);
  for (float& value : values) value = uniform(random);
  return values;
}

std::unique_ptr<Communicator> SingleRank(testing::MemoryKeyValueStore& store) {
  auto created = CreateNcclCommunicator({.rank = 0, .size = 1, .device = 0}, store);
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? std::move(*created) : nullptr;
}

TEST(NcclCommunicatorTest, SingleRankCollectivesLeaveTheDataAsARankOfOneMust) {
  REQUIRE_GPU();
  testing::MemoryKeyValueStore store;
  std::unique_ptr<Communicator> comm = SingleRank(store);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  // Rank 0 published the unique id for the others.
  EXPECT_TRUE(store.Get({"nccl/unique-id"}, 10).ok());

  const std::vector<float> values = RandomFloats(1 << 20, 7);
  DeviceBuffer<float> data(values);
  ASSERT_TRUE(comm->AllReduce(data.get(), values.size(), DataType::kFloat32, ReduceOp::kSum, 10000)
                  .ok());
  EXPECT_EQ(data.Read(), values);  // a sum over one rank is the value itself, bit for bit
  ASSERT_TRUE(comm->AllReduce(data.get(), values.size(), DataType::kFloat32, ReduceOp::kMax, 10000)
                  .ok());
  EXPECT_EQ(data.Read(), values);

  const std::vector<int64_t> counts = {1, -2, 1LL << 40};
  DeviceBuffer<int64_t> ints(counts);
  ASSERT_TRUE(
      comm->AllReduce(ints.get(), counts.size(), DataType::kInt64, ReduceOp::kSum, 10000).ok());
  EXPECT_EQ(ints.Read(), counts);

  ASSERT_TRUE(comm->Broadcast(data.get(), data.Bytes(), 0, 10000).ok());
  EXPECT_EQ(data.Read(), values);
  EXPECT_EQ(comm->Broadcast(data.get(), data.Bytes(), 1, 10000).code(),
            StatusCode::kInvalidArgument);

  DeviceBuffer<float> gathered(std::vector<float>(values.size(), 0.0f));
  ASSERT_TRUE(comm->AllGather(data.get(), data.Bytes(), gathered.get(), 10000).ok());
  EXPECT_EQ(gathered.Read(), values);
  EXPECT_TRUE(comm->Barrier(10000).ok());
}

TEST(NcclCommunicatorTest, HostBuffersAreStagedAndComeBackWithTheResult) {
  REQUIRE_GPU();
  testing::MemoryKeyValueStore store;
  std::unique_ptr<Communicator> comm = SingleRank(store);
  ASSERT_NE(comm, nullptr);
  // The trainer's control values live in host memory: a vote, a loss sum, a state header.
  int64_t vote = 1;
  ASSERT_TRUE(comm->AllReduce(&vote, 1, DataType::kInt64, ReduceOp::kMax, 10000).ok());
  EXPECT_EQ(vote, 1);
  double loss = 3.25;
  ASSERT_TRUE(comm->AllReduce(&loss, 1, DataType::kFloat64, ReduceOp::kSum, 10000).ok());
  EXPECT_EQ(loss, 3.25);
  const std::vector<float> values = RandomFloats(100000, 11);  // larger than any earlier staging
  std::vector<float> host = values;
  ASSERT_TRUE(comm->Broadcast(host.data(), host.size() * sizeof(float), 0, 10000).ok());
  EXPECT_EQ(host, values);
  // All-gathers that mix host and device memory, both ways.
  std::vector<float> gathered(values.size(), 0.0f);
  DeviceBuffer<float> device_in(values);
  ASSERT_TRUE(comm->AllGather(device_in.get(), device_in.Bytes(), gathered.data(), 10000).ok());
  EXPECT_EQ(gathered, values);
  DeviceBuffer<float> device_out(std::vector<float>(values.size(), 0.0f));
  ASSERT_TRUE(comm->AllGather(values.data(), device_out.Bytes(), device_out.get(), 10000).ok());
  EXPECT_EQ(device_out.Read(), values);
  // After an abort, a host call fails at once and frees nothing the stream may still use.
  comm->Abort("test");
  EXPECT_EQ(comm->AllReduce(&loss, 1, DataType::kFloat64, ReduceOp::kSum, 10000).code(),
            StatusCode::kAborted);
  std::vector<double> larger(1 << 20, 1.0);
  EXPECT_EQ(comm->AllReduce(larger.data(), larger.size(), DataType::kFloat64, ReduceOp::kSum,
                            10000)
                .code(),
            StatusCode::kAborted);
}

TEST(NcclCommunicatorTest, CollectivesFollowTheWorkOfTheInputStream) {
  REQUIRE_GPU();
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  testing::MemoryKeyValueStore store;
  auto created = CreateNcclCommunicator(
      {.rank = 0, .size = 1, .device = 0, .input_stream = compute}, store);
  ASSERT_TRUE(created.ok()) << created.status();
  const std::vector<float> values = RandomFloats(1 << 22, 9);
  DeviceBuffer<float> data(std::vector<float>(values.size(), 0.0f));
  std::vector<float> source = values;
  // The compute stream writes the buffer; the all-gather (reading it) must come after.
  ASSERT_EQ(cudaMemcpyAsync(data.get(), source.data(), data.Bytes(), cudaMemcpyHostToDevice,
                            compute),
            cudaSuccess);
  DeviceBuffer<float> gathered(std::vector<float>(values.size(), -1.0f));
  ASSERT_TRUE((*created)->AllGather(data.get(), data.Bytes(), gathered.get(), 10000).ok());
  EXPECT_EQ(gathered.Read(), values);
  created->reset();
  cudaStreamDestroy(compute);
}

TEST(NcclCommunicatorTest, AbortMakesEveryLaterCallFailAtOnceWithAborted) {
  REQUIRE_GPU();
  testing::MemoryKeyValueStore store;
  std::unique_ptr<Communicator> comm = SingleRank(store);
  ASSERT_NE(comm, nullptr);
  comm->Abort("generation 3 ended");
  comm->Abort("again");  // idempotent
  DeviceBuffer<float> data(RandomFloats(16, 1));
  const Deadline bound = Deadline::AfterMs(2000);
  Status status = comm->AllReduce(data.get(), 16, DataType::kFloat32, ReduceOp::kSum, 60000);
  EXPECT_FALSE(bound.expired());
  EXPECT_EQ(status.code(), StatusCode::kAborted) << status;
  EXPECT_NE(status.message().find("generation 3 ended"), std::string::npos) << status;
  EXPECT_EQ(comm->Barrier(60000).code(), StatusCode::kAborted);
}

TEST(NcclCommunicatorTest, RankWhosePeersNeverArriveFailsAtTheConnectDeadline) {
  REQUIRE_GPU();
  testing::MemoryKeyValueStore store;  // rank 0 never publishes its id
  const Deadline bound = Deadline::AfterMs(5000);
  auto created = CreateNcclCommunicator(
      {.rank = 1, .size = 2, .device = 0, .connect_timeout_ms = 300}, store);
  EXPECT_FALSE(bound.expired());
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), StatusCode::kDeadlineExceeded) << created.status();
  EXPECT_NE(created.status().message().find("unique id"), std::string::npos) << created.status();
}

TEST(NcclCommunicatorTest, BadRankOrDeviceIsRefusedNamingIt) {
  testing::MemoryKeyValueStore store;
  auto bad_rank = CreateNcclCommunicator({.rank = 2, .size = 2}, store);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_EQ(bad_rank.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_rank.status().message().find("rank 2 of a world of 2"), std::string::npos)
      << bad_rank.status();
  if (!HaveGpu()) return;
  auto bad_device = CreateNcclCommunicator({.rank = 0, .size = 1, .device = 4096}, store);
  ASSERT_FALSE(bad_device.ok());
  EXPECT_EQ(bad_device.status().code(), StatusCode::kInvalidArgument) << bad_device.status();
  EXPECT_NE(bad_device.status().message().find("device 4096"), std::string::npos);
}

TEST(NcclCommunicatorTest, MachineWithoutAGpuIsToldSoAndNothingIsPublished) {
  if (HaveGpu()) GTEST_SKIP() << "this machine has a GPU";
  testing::MemoryKeyValueStore store;
  auto created = CreateNcclCommunicator({.rank = 0, .size = 1}, store);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), StatusCode::kUnavailable) << created.status();
  EXPECT_NE(created.status().message().find("cudaGetDeviceCount"), std::string::npos)
      << created.status();
  EXPECT_FALSE(store.Get({"nccl/unique-id"}, 10).ok());
}

}  // namespace
}  // namespace lockstep::comm
