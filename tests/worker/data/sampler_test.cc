#include "worker/trainer/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace lockstep::trainer {
namespace {

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  return ids;
}

TEST(GlobalSamplerTest, PermutationHoldsEverySampleIdOnce) {
  for (int64_t n : {1, 2, 7, 1000, 60000}) {
    GlobalSampler sampler(n, 1);
    std::vector<int64_t> order = sampler.Permutation(0);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, Iota(n)) << "num_samples " << n;
  }
}

TEST(GlobalSamplerTest, PermutationIsDeterministicForSeedAndEpoch) {
  GlobalSampler a(5000, 42);
  GlobalSampler b(5000, 42);
  const std::vector<int64_t> a_epoch3 = a.Permutation(3);
  b.Permutation(0);  // a different cache history must not change the result
  EXPECT_EQ(b.Permutation(3), a_epoch3);
  EXPECT_EQ(a.Permutation(3), a_epoch3);
}

TEST(GlobalSamplerTest, PermutationIsPinnedAcrossPlatforms) {
  // The order is part of the training state that checkpoints and elastic resumes rely on: a
  // change here changes every job's data order. Values cross-checked against an independent
  // Python implementation of splitmix64 + Fisher-Yates.
  GlobalSampler sampler(10, 1);
  EXPECT_EQ(sampler.Permutation(0), (std::vector<int64_t>{2, 4, 7, 8, 3, 6, 5, 9, 0, 1}));
  EXPECT_EQ(sampler.Permutation(1), (std::vector<int64_t>{6, 5, 0, 7, 3, 2, 9, 8, 1, 4}));
}

TEST(GlobalSamplerTest, PermutationDiffersByEpochAndSeed) {
  GlobalSampler seed1(1000, 1);
  GlobalSampler seed2(1000, 2);
  const std::vector<int64_t> epoch0 = seed1.Permutation(0);
  EXPECT_NE(seed1.Permutation(1), epoch0);
  EXPECT_NE(seed2.Permutation(0), epoch0);
  EXPECT_NE(epoch0, Iota(1000));
}

TEST(GlobalSamplerTest, RankSliceGivesEveryRankExactlyItsBatchWhenDivisible) {
  const GlobalSampler::GlobalBatch batch{0, 128, 128 + 4 * 64};
  for (int rank = 0; rank < 4; ++rank) {
    auto [lo, hi] = GlobalSampler::RankSlice(batch, 4, rank);
    EXPECT_EQ(lo, 128 + rank * 64);
    EXPECT_EQ(hi - lo, 64);
  }
}

TEST(GlobalSamplerTest, RankSlicesTileAPartialBatchInRankOrder) {
  const GlobalSampler::GlobalBatch batch{2, 990, 1000};  // 10 samples over 4 ranks
  std::vector<int64_t> sizes;
  int64_t expected_lo = batch.begin;
  for (int rank = 0; rank < 4; ++rank) {
    auto [lo, hi] = GlobalSampler::RankSlice(batch, 4, rank);
    EXPECT_EQ(lo, expected_lo);
    sizes.push_back(hi - lo);
    expected_lo = hi;
  }
  EXPECT_EQ(expected_lo, batch.end);
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 3, 2, 3}));

  // Fewer samples than ranks: some ranks get empty slices, none gets a sample twice.
  const GlobalSampler::GlobalBatch tiny{0, 0, 2};
  int64_t total = 0;
  for (int rank = 0; rank < 5; ++rank) {
    auto [lo, hi] = GlobalSampler::RankSlice(tiny, 5, rank);
    EXPECT_LE(lo, hi);
    total += hi - lo;
  }
  EXPECT_EQ(total, 2);
}

TEST(GlobalSamplerTest, LastBatchOfEpochIsPartialAndAdvanceStartsNextEpoch) {
  GlobalSampler sampler(100, 7);
  DataCursor cursor{0, 96};
  const GlobalSampler::GlobalBatch last = sampler.Next(cursor, 32);
  EXPECT_EQ(last.epoch, 0);
  EXPECT_EQ(last.begin, 96);
  EXPECT_EQ(last.end, 100);
  cursor = sampler.Advance(cursor, last);
  EXPECT_EQ(cursor, (DataCursor{1, 0}));

  const GlobalSampler::GlobalBatch first = sampler.Next(cursor, 32);
  EXPECT_EQ(first.epoch, 1);
  EXPECT_EQ(first.begin, 0);
  EXPECT_EQ(first.end, 32);
  EXPECT_EQ(sampler.Advance(cursor, first), (DataCursor{1, 32}));
}

TEST(GlobalSamplerTest, BatchEndingExactlyAtEpochEndAdvancesToNextEpoch) {
  GlobalSampler sampler(64, 7);
  const GlobalSampler::GlobalBatch batch = sampler.Next(DataCursor{3, 32}, 32);
  EXPECT_EQ(batch.end, 64);
  EXPECT_EQ(sampler.Advance(DataCursor{3, 32}, batch), (DataCursor{4, 0}));
}

TEST(GlobalSamplerTest, ExhaustedCursorReadsAsStartOfNextEpoch) {
  GlobalSampler sampler(50, 7);
  const GlobalSampler::GlobalBatch batch = sampler.Next(DataCursor{0, 50}, 10);
  EXPECT_EQ(batch.epoch, 1);
  EXPECT_EQ(batch.begin, 0);
  EXPECT_EQ(batch.end, 10);
}

// The elastic contract: whatever the world size does between steps, every sample id is used
// exactly once per epoch when every rank takes its slice of each global batch.
TEST(GlobalSamplerTest, ChangingWorldSizeCoversEverySampleExactlyOncePerEpoch) {
  const int64_t num_samples = 997;  // prime: no world size divides it
  const int64_t batch_per_rank = 8;
  const std::vector<int> world_sizes = {4, 4, 3, 1, 2, 7, 5, 5, 1, 8, 3, 6, 2};
  GlobalSampler sampler(num_samples, 2024);
  DataCursor cursor;
  std::vector<int> uses(static_cast<size_t>(num_samples), 0);
  int64_t completed_epochs = 0;
  for (int64_t step = 0; completed_epochs < 3; ++step) {
    const int world_size = world_sizes[step % world_sizes.size()];
    const GlobalSampler::GlobalBatch batch = sampler.Next(cursor, world_size * batch_per_rank);
    ASSERT_EQ(batch.epoch, completed_epochs);
    const std::vector<int64_t>& order = sampler.Permutation(batch.epoch);
    for (int rank = 0; rank < world_size; ++rank) {
      auto [lo, hi] = GlobalSampler::RankSlice(batch, world_size, rank);
      for (int64_t position = lo; position < hi; ++position) ++uses[order[position]];
    }
    cursor = sampler.Advance(cursor, batch);
    if (cursor.epoch != batch.epoch) {
      for (int64_t id = 0; id < num_samples; ++id) {
        ASSERT_EQ(uses[id], 1) << "sample " << id << " in epoch " << batch.epoch;
      }
      std::fill(uses.begin(), uses.end(), 0);
      ++completed_epochs;
    }
  }
}

TEST(GlobalSamplerTest, MicroBatchesTileASliceInOrderNoneLargerThanTheBatch) {
  for (int64_t rows : {0, 1, 15, 16, 17, 24, 32, 33, 85, 86, 256}) {
    const int64_t max_rows = 16;
    const int64_t count = GlobalSampler::MicroBatchCount(rows, max_rows);
    EXPECT_EQ(count, std::max<int64_t>(1, (rows + max_rows - 1) / max_rows)) << rows;
    int64_t next = 100, smallest = rows, largest = 0;
    for (int64_t i = 0; i < count; ++i) {
      auto [lo, hi] = GlobalSampler::MicroBatch(100, 100 + rows, count, i);
      EXPECT_EQ(lo, next) << rows << " rows, micro-batch " << i;
      EXPECT_LE(hi - lo, max_rows) << rows << " rows, micro-batch " << i;
      smallest = std::min(smallest, hi - lo);
      largest = std::max(largest, hi - lo);
      next = hi;
    }
    EXPECT_EQ(next, 100 + rows);
    EXPECT_LE(largest - smallest, 1) << rows << " rows";
  }
}

// A fixed global batch at a smaller world: every rank's slice, in micro-batches of at most the
// per-rank batch, still covers exactly the global batch the full world trains.
TEST(GlobalSamplerTest, FixedGlobalBatchAtASmallerWorldTrainsTheSameSamplesInBatchSizedPieces) {
  const int64_t batch_per_rank = 16, full_world = 4;
  GlobalSampler sampler(1000, 5);
  const GlobalSampler::GlobalBatch batch = sampler.Next(DataCursor{0, 40}, full_world * 16);
  for (int world_size = 1; world_size <= 6; ++world_size) {
    std::vector<int64_t> positions;
    for (int rank = 0; rank < world_size; ++rank) {
      auto [lo, hi] = GlobalSampler::RankSlice(batch, world_size, rank);
      const int64_t count = GlobalSampler::MicroBatchCount(hi - lo, batch_per_rank);
      for (int64_t i = 0; i < count; ++i) {
        auto [micro_lo, micro_hi] = GlobalSampler::MicroBatch(lo, hi, count, i);
        EXPECT_LE(micro_hi - micro_lo, batch_per_rank);
        for (int64_t p = micro_lo; p < micro_hi; ++p) positions.push_back(p);
      }
    }
    std::vector<int64_t> expected(static_cast<size_t>(batch.size()));
    std::iota(expected.begin(), expected.end(), batch.begin);
    EXPECT_EQ(positions, expected) << "world size " << world_size;
  }
}

}  // namespace
}  // namespace lockstep::trainer
