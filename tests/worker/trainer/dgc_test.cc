#include "worker/trainer/dgc.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "worker/trainer/random.h"

namespace lockstep::trainer {
namespace {

// `world` ranks that all hold this rank's data: a SUM all-reduce multiplies by the world size,
// an all-gather repeats the input. Counts the bytes it was handed per kind of collective.
class ReplicaCommunicator : public comm::Communicator {
 public:
  explicit ReplicaCommunicator(int world) : world_(world) {}
  int rank() const override { return 0; }
  int size() const override { return world_; }
  std::string backend() const override { return "replica"; }
  Status AllReduce(void* data, size_t count, comm::DataType type, comm::ReduceOp,
                   int64_t) override {
    if (type != comm::DataType::kFloat32) return UnimplementedError("float32 only");
    float* values = static_cast<float*>(data);
    for (size_t i = 0; i < count; ++i) values[i] *= static_cast<float>(world_);
    ++all_reduces;
    return OkStatus();
  }
  Status Broadcast(void*, size_t, int, int64_t) override { return OkStatus(); }
  Status AllGather(const void* in, size_t bytes_per_rank, void* out, int64_t) override {
    for (int r = 0; r < world_; ++r) {
      std::memcpy(static_cast<char*>(out) + r * bytes_per_rank, in, bytes_per_rank);
    }
    ++all_gathers;
    return OkStatus();
  }
  Status Barrier(int64_t) override { return OkStatus(); }
  Status SendRecv(const void*, size_t, int, void*, size_t, int, int64_t) override {
    return UnimplementedError("not used by this test");
  }
  void Abort(const std::string&) override {}

  int all_reduces = 0;
  int all_gathers = 0;

 private:
  int world_;
};

std::vector<float> RandomValues(int64_t count, uint64_t seed) {
  SplitMix64 random(seed);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = random.UniformFloat(-1.0f, 1.0f);
  return values;
}

// The exact top k by sorting everything: larger magnitude first, the lower index among ties.
std::vector<uint32_t> SortedTopK(const std::vector<float>& values, int64_t k) {
  std::vector<uint32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return std::fabs(values[a]) > std::fabs(values[b]);
  });
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

TEST(DgcSelectionTest, SampledThresholdSelectsExactlyTheTopKOfTheWholeVector) {
  for (int64_t count : {1, 7, 300, 20000, 250000}) {
    for (double density : {0.001, 0.01, 0.25, 1.0}) {
      const std::vector<float> values = RandomValues(count, static_cast<uint64_t>(count));
      const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(density * count)));
      for (uint64_t sample_seed : {1u, 2u, 3u}) {
        EXPECT_EQ(DgcExchanger::SelectLargest(values.data(), count, k, sample_seed),
                  SortedTopK(values, k))
            << count << " entries, k " << k << ", sample seed " << sample_seed;
      }
    }
  }
}

TEST(DgcSelectionTest, TiesAreBrokenTowardsTheLowerIndex) {
  std::vector<float> values(1000, 0.5f);
  values[10] = -0.5f;
  EXPECT_EQ(DgcExchanger::SelectLargest(values.data(), 1000, 3, 9),
            (std::vector<uint32_t>{0, 1, 2}));
  values.assign(1000, 0.0f);  // a zero gradient: still k entries (zeros) are sent
  EXPECT_EQ(DgcExchanger::SelectLargest(values.data(), 1000, 2, 9).size(), 2u);
}

TEST(DgcDensityTest, WarmUpFallsGeometricallyFromTwentyFivePercentToTheTarget) {
  spec::DgcSpec spec;
  spec.sparsity = 0.999;
  spec.warmup_steps = 100;
  EXPECT_DOUBLE_EQ(DgcDensity(spec, 0), 0.25);
  EXPECT_NEAR(DgcDensity(spec, 50), std::sqrt(0.25 * 0.001), 1e-12);
  EXPECT_NEAR(DgcDensity(spec, 100), 0.001, 1e-12);
  EXPECT_NEAR(DgcDensity(spec, 100000), 0.001, 1e-12);
  for (int64_t step = 1; step < 100; ++step) {
    EXPECT_LT(DgcDensity(spec, step), DgcDensity(spec, step - 1)) << step;
  }
  spec.warmup_steps = 0;
  EXPECT_NEAR(DgcDensity(spec, 0), 0.001, 1e-12);
  spec.sparsity = 0.5;  // already at or below the first stage's sparsity: no ramp
  spec.warmup_steps = 100;
  EXPECT_DOUBLE_EQ(DgcDensity(spec, 0), 0.5);
}

TEST(DgcExchangeTest, EveryGradientEntryIsSentOnceAndOnlyOnceWithoutMomentum) {
  // One gradient, then zeros: the residual sends every entry exactly once, k per step, largest
  // first; the sum of what was applied is the gradient summed over the ranks.
  constexpr int kWorld = 4;
  constexpr int64_t kCount = 20000;
  constexpr int64_t kK = 50;  // density 0.0025: 4 x 50 < 20000, so all-gathered
  ReplicaCommunicator comm(kWorld);
  spec::DgcSpec spec;
  spec.sparsity = 1.0 - static_cast<double>(kK) / kCount;
  DgcExchanger dgc(spec, /*momentum=*/0.0, /*weight_decay=*/0.0, /*seed=*/1);
  const std::vector<float> gradient = RandomValues(kCount, 5);
  std::vector<float> applied(kCount, 0.0f);
  const std::vector<float> zeros(kCount, 0.0f);  // parameters (no weight decay here)
  std::vector<float> slice = gradient;
  for (int64_t step = 0; step < kCount / kK; ++step) {
    DgcExchangeStats stats;
    ASSERT_TRUE(dgc.Exchange(comm, 0, slice.data(), zeros.data(), kCount, dgc.Density(step),
                             step, 1000, &stats)
                    .ok());
    EXPECT_EQ(stats.sent, kK);
    EXPECT_EQ(stats.wire_bytes, kK * 8);  // (index, value) pairs
    int64_t nonzero = 0;
    for (int64_t i = 0; i < kCount; ++i) {
      if (slice[i] != 0) {
        ++nonzero;
        EXPECT_EQ(applied[i], 0.0f) << "entry " << i << " sent twice";
        applied[i] = slice[i];
      }
    }
    EXPECT_EQ(nonzero, kK) << "step " << step;
    std::fill(slice.begin(), slice.end(), 0.0f);
  }
  for (int64_t i = 0; i < kCount; ++i) ASSERT_EQ(applied[i], kWorld * gradient[i]) << i;
  EXPECT_EQ(comm.all_gathers, kCount / kK);
  EXPECT_EQ(comm.all_reduces, 0);
}

TEST(DgcExchangeTest, MomentumCorrectionAccumulatesVelocityUntilAnEntryIsSent) {
  // Two entries, k = 1, momentum 0.5; the same gradient every step. Entry 0 (larger) is sent at
  // step 0; entry 1 accumulates v = u1 + u2 + ... with u_t = 0.5 u_{t-1} + g.
  ReplicaCommunicator comm(1);
  spec::DgcSpec spec;
  spec.sparsity = 0.5;
  spec.min_bucket_elements = 1;
  DgcExchanger dgc(spec, /*momentum=*/0.5, /*weight_decay=*/0.0, /*seed=*/1);
  std::vector<float> slice = {1.0f, 0.75f};
  const std::vector<float> zeros(2, 0.0f);
  DgcExchangeStats stats;
  ASSERT_TRUE(dgc.Exchange(comm, 0, slice.data(), zeros.data(), 2, 0.5, 0, 1000, &stats).ok());
  EXPECT_EQ(slice, (std::vector<float>{1.0f, 0.0f}));  // sent entry 0; masked its u and v
  slice = {1.0f, 0.75f};
  ASSERT_TRUE(dgc.Exchange(comm, 0, slice.data(), zeros.data(), 2, 0.5, 1, 1000, &stats).ok());
  // Entry 0 restarted from u = 0: v = 1. Entry 1: u = 0.5 x 0.75 + 0.75 = 1.125, v = 1.875.
  EXPECT_EQ(slice, (std::vector<float>{0.0f, 1.875f}));
}

TEST(DgcExchangeTest, DenseBucketsAreAllReducedWhenTheGatheredPairsWouldOutweighThem) {
  ReplicaCommunicator comm(4);
  spec::DgcSpec spec;
  spec.sparsity = 0.75;  // k = n / 4: 4 ranks' pairs would be as large as the vector
  DgcExchanger dgc(spec, 0.0, 0.0, 1);
  std::vector<float> slice = RandomValues(1000, 3);
  const std::vector<float> zeros(1000, 0.0f);
  const std::vector<uint32_t> top = SortedTopK(slice, 250);
  const std::vector<float> gradient = slice;
  DgcExchangeStats stats;
  ASSERT_TRUE(
      dgc.Exchange(comm, 0, slice.data(), zeros.data(), 1000, 0.25, 0, 1000, &stats).ok());
  EXPECT_EQ(comm.all_reduces, 1);
  EXPECT_EQ(comm.all_gathers, 0);
  EXPECT_EQ(stats.wire_bytes, 1000 * 4);
  std::vector<float> expected(1000, 0.0f);
  for (uint32_t i : top) expected[i] = 4 * gradient[i];
  EXPECT_EQ(slice, expected);
}

TEST(DgcExchangeTest, DroppedResidualsAreNeverSent) {
  ReplicaCommunicator comm(1);
  spec::DgcSpec spec;
  spec.sparsity = 0.5;
  spec.min_bucket_elements = 1;
  DgcExchanger dgc(spec, 0.0, 0.0, 1);
  std::vector<float> slice = {2.0f, 1.0f};
  const std::vector<float> zeros(2, 0.0f);
  DgcExchangeStats stats;
  ASSERT_TRUE(dgc.Exchange(comm, 0, slice.data(), zeros.data(), 2, 0.5, 0, 1000, &stats).ok());
  dgc.DropAllResiduals();
  slice = {0.0f, 0.0f};
  ASSERT_TRUE(dgc.Exchange(comm, 0, slice.data(), zeros.data(), 2, 0.5, 1, 1000, &stats).ok());
  EXPECT_EQ(slice, (std::vector<float>{0.0f, 0.0f}));  // entry 1's residual is gone
}

TEST(DgcExchangeTest, WeightDecayIsSharedOverTheRanksInsideTheMomentumCorrection) {
  // A zero gradient on 2 ranks: each adds wd p / 2 to u, so what is sent sums to wd p, the decay
  // the all-reduce's optimizer would apply (which does not apply it again on these layers).
  ReplicaCommunicator comm(2);
  spec::DgcSpec spec;
  spec.sparsity = 0.5;
  spec.min_bucket_elements = 1;
  DgcExchanger dgc(spec, /*momentum=*/0.0, /*weight_decay=*/0.1, 1);
  std::vector<float> slice = {0.0f, 0.0f};
  const std::vector<float> params = {4.0f, 1.0f};
  DgcExchangeStats stats;
  ASSERT_TRUE(dgc.Exchange(comm, 0, slice.data(), params.data(), 2, 0.5, 0, 1000, &stats).ok());
  EXPECT_FLOAT_EQ(slice[0], 0.1f * 4.0f);
  EXPECT_EQ(slice[1], 0.0f);  // held back: next time
}

}  // namespace
}  // namespace lockstep::trainer
