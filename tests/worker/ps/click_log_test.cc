// The synthetic click log and the AUC metric (worker/ps/click_log.h).
#include "worker/ps/click_log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace lockstep::ps {
namespace {

TEST(AucTest, MatchesTheDefinitionOnSmallCases) {
  // The textbook case: of the 4 positive-negative pairs, 3 are ordered right.
  EXPECT_DOUBLE_EQ(Auc({0.1, 0.4, 0.35, 0.8}, {0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(Auc({0.1, 0.2, 0.8, 0.9}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Auc({0.9, 0.8, 0.2, 0.1}, {0, 0, 1, 1}), 0.0);
  // Ties count half.
  EXPECT_DOUBLE_EQ(Auc({0.5, 0.5}, {0, 1}), 0.5);
  EXPECT_DOUBLE_EQ(Auc({0.2, 0.5, 0.5}, {0, 0, 1}), 0.75);
  // One class only: nothing to rank.
  EXPECT_DOUBLE_EQ(Auc({0.1, 0.9}, {1, 1}), 0.5);
  EXPECT_DOUBLE_EQ(Auc({}, {}), 0.5);
}

TEST(ClickLogTest, IsDeterministicAndALongerLogExtendsAShorterOne) {
  ClickLogSpec spec;
  spec.samples = 1000;
  spec.seed = 3;
  const ClickLog a = GenerateClickLog(spec);
  spec.samples = 2000;
  const ClickLog b = GenerateClickLog(spec);
  ASSERT_EQ(a.ids.size(), 1000u * 8u);
  EXPECT_TRUE(std::equal(a.ids.begin(), a.ids.end(), b.ids.begin()));
  EXPECT_TRUE(std::equal(a.labels.begin(), a.labels.end(), b.labels.begin()));
  spec.seed = 4;
  EXPECT_NE(GenerateClickLog(spec).ids, b.ids);
}

TEST(ClickLogTest, IdsAreSkewedWithinEachFieldsVocabularyAndTheCeilingIsLearnable) {
  ClickLogSpec spec;
  spec.samples = 50000;
  spec.fields = 4;
  spec.vocabulary = 1000;
  const ClickLog log = GenerateClickLog(spec);
  int64_t common = 0;
  for (int64_t s = 0; s < log.samples; ++s) {
    for (int32_t f = 0; f < log.fields; ++f) {
      const uint64_t id = log.ids[static_cast<size_t>(s * log.fields + f)];
      ASSERT_EQ(id >> 40, static_cast<uint64_t>(f));
      ASSERT_LT(id & ((uint64_t{1} << 40) - 1), 1000u);
      if ((id & 0xffffffffffULL) < 125) ++common;
    }
  }
  // The vocabulary's first eighth holds half the draws (u^3 < 1/8 when u < 1/2).
  EXPECT_NEAR(static_cast<double>(common) / (log.samples * log.fields), 0.5, 0.02);
  int64_t clicks = 0;
  for (int32_t label : log.labels) clicks += label;
  const double rate = static_cast<double>(clicks) / log.samples;
  EXPECT_GT(rate, 0.10);
  EXPECT_LT(rate, 0.35);
  // The true probabilities rank the clicks well, but not perfectly: there is something to
  // learn and a ceiling below 1.
  const double ceiling = Auc(log.probabilities, log.labels);
  EXPECT_GT(ceiling, 0.70);
  EXPECT_LT(ceiling, 0.95);
  // A constant score knows nothing.
  EXPECT_DOUBLE_EQ(Auc(std::vector<double>(log.labels.size(), 0.3), log.labels), 0.5);
}

}  // namespace
}  // namespace lockstep::ps
