#include "worker/trainer/buckets.h"

#include <gtest/gtest.h>

namespace lockstep::trainer {
namespace {

// Layers of 784-256-128-10: backward order sizes 1290, 32896, 200960 floats.
ParameterLayout Layout() {
  auto model = MlpModel::Create(784, {256, 128}, 10, kernels::ActivationType::kRelu);
  EXPECT_TRUE(model.ok());
  return model->layout();
}

void ExpectTilesBufferInOrder(const std::vector<GradientBucket>& buckets,
                              const ParameterLayout& layout) {
  int64_t offset = 0;
  int next_layer = 0;
  for (const GradientBucket& bucket : buckets) {
    EXPECT_EQ(bucket.offset, offset);
    EXPECT_EQ(bucket.first_backward_layer, next_layer);
    offset += bucket.count;
    next_layer = bucket.last_backward_layer + 1;
  }
  EXPECT_EQ(offset, layout.num_params);
  EXPECT_EQ(next_layer, layout.num_layers());
}

TEST(AssignBucketsTest, LargeCapPutsEveryLayerInOneBucket) {
  const ParameterLayout layout = Layout();
  auto buckets = AssignBuckets(layout, BucketCapBytes(25));
  ASSERT_EQ(buckets.size(), 1u);
  ExpectTilesBufferInOrder(buckets, layout);
}

TEST(AssignBucketsTest, BucketsFollowBackwardOrderAndRespectTheCap) {
  const ParameterLayout layout = Layout();
  // 34186 floats fit the first two layers (1290 + 32896) but not the third.
  auto buckets = AssignBuckets(layout, 34186 * 4);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].first_backward_layer, 0);
  EXPECT_EQ(buckets[0].last_backward_layer, 1);
  EXPECT_EQ(buckets[0].count, 1290 + 32896);
  EXPECT_EQ(buckets[1].first_backward_layer, 2);
  ExpectTilesBufferInOrder(buckets, layout);
}

TEST(AssignBucketsTest, LayerLargerThanTheCapIsItsOwnBucketAndNeverSplit) {
  const ParameterLayout layout = Layout();
  auto buckets = AssignBuckets(layout, BucketCapBytes(0.05));  // 13107 floats
  ASSERT_EQ(buckets.size(), 3u);
  for (int b = 0; b < 3; ++b) {
    EXPECT_EQ(buckets[b].first_backward_layer, b);
    EXPECT_EQ(buckets[b].last_backward_layer, b);
  }
  EXPECT_EQ(buckets[2].count, 200960);
  ExpectTilesBufferInOrder(buckets, layout);
}

TEST(AssignBucketsTest, AssignmentIsAPureFunctionOfLayoutAndCap) {
  const ParameterLayout layout = Layout();
  auto a = AssignBuckets(layout, 100000);
  auto b = AssignBuckets(layout, 100000);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].offset, b[i].offset);
    EXPECT_EQ(a[i].count, b[i].count);
  }
}

}  // namespace
}  // namespace lockstep::trainer
