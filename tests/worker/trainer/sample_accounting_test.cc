#include "worker/trainer/sample_accounting.h"

#include <gtest/gtest.h>

#include <vector>

namespace lockstep::trainer {
namespace {

const std::vector<int64_t> kOrder{3, 0, 4, 1, 2};

TEST(SampleAccountingTest, EpochTrainedOnceInBatchesIsComplete) {
  std::vector<int32_t> counts(5, 0);
  CountGlobalBatch(kOrder, 0, 2, counts);
  CountGlobalBatch(kOrder, 2, 5, counts);
  const EpochAccount account = SummariseEpoch(kOrder, 5, counts);
  EXPECT_EQ(account.trained_once, 5);
  EXPECT_EQ(account.never, 0);
  EXPECT_EQ(account.more_than_once, 0);
  EXPECT_TRUE(account.complete);
  EXPECT_EQ(FormatEpochAccount(2, 7, false, 5, account),
            "{\"epoch\": 2, \"samples\": 5, \"trained_once\": 5, \"never\": 0, "
            "\"more_than_once\": 0, \"complete\": true, \"partial\": false, \"consumed\": 5, "
            "\"step\": 7}");
}

TEST(SampleAccountingTest, RepeatedBatchIsReportedAsMoreThanOnce) {
  std::vector<int32_t> counts(5, 0);
  CountGlobalBatch(kOrder, 0, 2, counts);
  CountGlobalBatch(kOrder, 0, 2, counts);  // the same global batch trained again
  CountGlobalBatch(kOrder, 2, 5, counts);
  const EpochAccount account = SummariseEpoch(kOrder, 5, counts);
  EXPECT_EQ(account.more_than_once, 2);
  EXPECT_FALSE(account.complete);
}

TEST(SampleAccountingTest, SkippedBatchIsReportedAsNever) {
  std::vector<int32_t> counts(5, 0);
  CountGlobalBatch(kOrder, 0, 2, counts);
  CountGlobalBatch(kOrder, 3, 5, counts);
  const EpochAccount account = SummariseEpoch(kOrder, 5, counts);
  EXPECT_EQ(account.never, 1);
  EXPECT_FALSE(account.complete);
}

TEST(SampleAccountingTest, PartialEpochIsExactWhenOnlyTheConsumedPrefixWasTrained) {
  std::vector<int32_t> counts(5, 0);
  CountGlobalBatch(kOrder, 0, 3, counts);
  EXPECT_TRUE(SummariseEpoch(kOrder, 3, counts).complete);
  EXPECT_FALSE(SummariseEpoch(kOrder, 4, counts).complete);
  EXPECT_FALSE(SummariseEpoch(kOrder, 2, counts).complete);
}

}  // namespace
}  // namespace lockstep::trainer
