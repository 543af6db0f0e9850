#include "worker/trainer/gradient_synchronizer.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "kernels/kernels.h"

namespace lockstep::trainer {
namespace {

// A communicator standing for `world` ranks that all hold the same data: a SUM all-reduce
// multiplies by the world size, an all-gather repeats the input. Records the order of calls.
class ReplicaCommunicator : public comm::Communicator {
 public:
  ReplicaCommunicator(int world, bool reduces_halves)
      : world_(world), reduces_halves_(reduces_halves) {}

  int rank() const override { return 0; }
  int size() const override { return world_; }
  std::string backend() const override { return "replica"; }

  Status AllReduce(void* data, size_t count, comm::DataType type, comm::ReduceOp op,
                   int64_t timeout_ms) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (type == comm::DataType::kInt64) {
      // The per-step leave vote (MAX over identical replicas: unchanged). Recorded apart from
      // the buckets, with its position among them.
      vote_positions_.push_back(calls_.size());
      return OkStatus();
    }
    if (fail_next_) return UnavailableError("peer 1 closed the connection");
    calls_.push_back(count);
    if (type == comm::DataType::kFloat32) {
      float* values = static_cast<float*>(data);
      for (size_t i = 0; i < count; ++i) values[i] *= static_cast<float>(world_);
      return OkStatus();
    }
    if (!reduces_halves_) return UnimplementedError("no half reduction");
    uint16_t* values = static_cast<uint16_t*>(data);
    for (size_t i = 0; i < count; ++i) {
      values[i] = kernels::FloatToBf16(kernels::Bf16ToFloat(values[i]) * world_);
    }
    return OkStatus();
  }
  Status Broadcast(void*, size_t, int, int64_t) override { return OkStatus(); }
  Status AllGather(const void* in, size_t bytes_per_rank, void* out, int64_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(bytes_per_rank / 2);
    for (int r = 0; r < world_; ++r) {
      std::memcpy(static_cast<char*>(out) + r * bytes_per_rank, in, bytes_per_rank);
    }
    return OkStatus();
  }
  Status Barrier(int64_t) override { return OkStatus(); }
  Status SendRecv(const void*, size_t, int, void*, size_t, int, int64_t) override {
    return UnimplementedError("not used by this test");
  }
  void Abort(const std::string&) override {}

  void FailNext() {
    std::lock_guard<std::mutex> lock(mu_);
    fail_next_ = true;
  }
  std::vector<size_t> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  // For each leave vote: how many buckets had been reduced before it.
  std::vector<size_t> vote_positions() {
    std::lock_guard<std::mutex> lock(mu_);
    return vote_positions_;
  }

 private:
  const int world_;
  const bool reduces_halves_;
  std::mutex mu_;
  bool fail_next_ = false;
  std::vector<size_t> calls_;
  std::vector<size_t> vote_positions_;
};

std::vector<GradientBucket> ThreeBuckets() { return {{0, 3, 0, 0}, {3, 5, 1, 2}, {8, 2, 3, 3}}; }

void RunStep(GradientSynchronizer& sync, std::vector<float>& grads) {
  sync.BeginStep(grads.data(), 1.0f);
  for (int layer = 0; layer < 4; ++layer) sync.OnLayerReady(layer);
}

TEST(GradientSynchronizerTest, ReducesEveryBucketInBucketOrder) {
  ReplicaCommunicator comm(3, true);
  GradientSynchronizer sync(comm, kernels::CpuDevice(), ThreeBuckets(), {});
  std::vector<float> grads(10);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.5f * i;
  RunStep(sync, grads);
  StepCommStats stats;
  ASSERT_TRUE(sync.Wait(&stats).ok());
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_FLOAT_EQ(grads[i], 1.5f * i);
  EXPECT_EQ(comm.calls(), (std::vector<size_t>{3, 5, 2}));
  EXPECT_EQ(stats.wire_bytes, 40);
  EXPECT_FALSE(stats.overflow);
}

TEST(GradientSynchronizerTest, BucketWaitsForItsLastLayer) {
  ReplicaCommunicator comm(2, true);
  GradientSynchronizer sync(comm, kernels::CpuDevice(), ThreeBuckets(), {});
  std::vector<float> grads(10, 1.0f);
  sync.BeginStep(grads.data(), 1.0f);
  sync.OnLayerReady(0);
  sync.OnLayerReady(1);  // bucket 1 needs layers 1 and 2: not yet
  sync.OnLayerReady(2);
  sync.OnLayerReady(3);
  ASSERT_TRUE(sync.Wait(nullptr).ok());
  EXPECT_EQ(comm.calls(), (std::vector<size_t>{3, 5, 2}));
}

TEST(GradientSynchronizerTest, Bf16CompressionHalvesTheBytesOnTheWire) {
  ReplicaCommunicator comm(2, true);
  GradientSynchronizer sync(comm, kernels::CpuDevice(), ThreeBuckets(), {spec::Compression::kBf16, 1000});
  std::vector<float> grads(10);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.1f * (i + 1);
  const std::vector<float> original = grads;
  RunStep(sync, grads);
  StepCommStats stats;
  ASSERT_TRUE(sync.Wait(&stats).ok());
  EXPECT_EQ(stats.wire_bytes, 20);
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_NEAR(grads[i], 2 * original[i], 2 * original[i] * 1e-2) << i;
  }
  EXPECT_FALSE(sync.using_allgather_fallback());
}

TEST(GradientSynchronizerTest, HalfCompressionFallsBackToAllGatherWhenReductionIsUnsupported) {
  ReplicaCommunicator comm(3, /*reduces_halves=*/false);
  GradientSynchronizer sync(comm, kernels::CpuDevice(), ThreeBuckets(), {spec::Compression::kFp16, 1000});
  std::vector<float> grads(10);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * (i + 1);
  const std::vector<float> original = grads;
  RunStep(sync, grads);
  ASSERT_TRUE(sync.Wait(nullptr).ok());
  EXPECT_TRUE(sync.using_allgather_fallback());
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_NEAR(grads[i], 3 * original[i], 3 * original[i] * 2e-3) << i;
  }
}

TEST(GradientSynchronizerTest, Fp16OverflowIsReportedToSkipTheStep) {
  ReplicaCommunicator comm(2, /*reduces_halves=*/false);
  GradientSynchronizer sync(comm, kernels::CpuDevice(), ThreeBuckets(), {spec::Compression::kFp16, 1000});
  std::vector<float> grads(10, 1.0f);
  sync.BeginStep(grads.data(), /*loss_scale=*/1e6f);  // 1e6 does not fit fp16
  for (int layer = 0; layer < 4; ++layer) sync.OnLayerReady(layer);
  StepCommStats stats;
  ASSERT_TRUE(sync.Wait(&stats).ok());
  EXPECT_TRUE(stats.overflow);
}

TEST(GradientSynchronizerTest, FailedCollectiveSurfacesFromWait) {
  ReplicaCommunicator comm(2, true);
  GradientSynchronizer sync(comm, kernels::CpuDevice(), ThreeBuckets(), {});
  std::vector<float> grads(10, 1.0f);
  comm.FailNext();
  RunStep(sync, grads);
  Status status = sync.Wait(nullptr);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("bucket 0"), std::string::npos) << status;
}

TEST(GradientSynchronizerTest, LeaveVoteIsAgreedAndIssuedBeforeTheFirstBucket) {
  ReplicaCommunicator comm(2, true);
  GradientSynchronizer sync(comm, kernels::CpuDevice(), ThreeBuckets(), {});
  std::vector<float> grads(10, 1.0f);
  StepCommStats stats;

  sync.BeginStep(grads.data(), 1.0f, /*leave_vote=*/false);
  for (int layer = 0; layer < 4; ++layer) sync.OnLayerReady(layer);
  ASSERT_TRUE(sync.Wait(&stats).ok());
  EXPECT_FALSE(stats.leave_agreed);

  sync.BeginStep(grads.data(), 1.0f, /*leave_vote=*/true);
  for (int layer = 0; layer < 4; ++layer) sync.OnLayerReady(layer);
  ASSERT_TRUE(sync.Wait(&stats).ok());
  EXPECT_TRUE(stats.leave_agreed);
  // One vote per step, each issued before that step's first bucket, so every rank issues the
  // collectives in the same order.
  EXPECT_EQ(comm.vote_positions(), (std::vector<size_t>{0, 3}));
}

TEST(GradientSynchronizerTest, WorldOfOneAgreesWithItsOwnVoteWithoutCollectives) {
  ReplicaCommunicator comm(1, true);
  GradientSynchronizer sync(comm, kernels::CpuDevice(), ThreeBuckets(), {});
  std::vector<float> grads(10, 1.0f);
  sync.BeginStep(grads.data(), 1.0f, /*leave_vote=*/true);
  for (int layer = 0; layer < 4; ++layer) sync.OnLayerReady(layer);
  StepCommStats stats;
  ASSERT_TRUE(sync.Wait(&stats).ok());
  EXPECT_TRUE(stats.leave_agreed);
  EXPECT_TRUE(comm.vote_positions().empty());
  EXPECT_TRUE(comm.calls().empty());
}

}  // namespace
}  // namespace lockstep::trainer
