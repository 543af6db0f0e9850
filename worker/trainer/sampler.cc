#include "worker/trainer/sampler.h"

#include <algorithm>
#include <cassert>
#include <numeric>

namespace lockstep::trainer {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): a fixed, fully specified generator, so the data order
// is identical on every process, compiler and standard library.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Uniform in [0, bound) without modulo bias: draws below 2^64 mod bound are rejected.
  uint64_t Bounded(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t r = Next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  uint64_t state_;
};

// Seeds differ per (seed, epoch) pair: the epoch is mixed first so nearby seeds and epochs do
// not give correlated streams.
uint64_t EpochStreamSeed(uint64_t seed, int64_t epoch) {
  SplitMix64 epoch_mix(static_cast<uint64_t>(epoch) ^ 0x6a09e667f3bcc909ULL);
  return seed ^ epoch_mix.Next();
}

}  // namespace

GlobalSampler::GlobalSampler(int64_t num_samples, uint64_t seed)
    : num_samples_(num_samples), seed_(seed) {
  assert(num_samples >= 1);
}

GlobalSampler::GlobalBatch GlobalSampler::Next(const DataCursor& cursor,
                                               int64_t global_batch) const {
  assert(global_batch >= 1);
  GlobalBatch batch;
  batch.epoch = cursor.epoch;
  batch.begin = cursor.offset;
  if (batch.begin >= num_samples_) {
    ++batch.epoch;
    batch.begin = 0;
  }
  batch.end = std::min(batch.begin + global_batch, num_samples_);
  return batch;
}

std::pair<int64_t, int64_t> GlobalSampler::RankSlice(const GlobalBatch& batch, int world_size,
                                                     int rank) {
  assert(world_size >= 1 && rank >= 0 && rank < world_size);
  const int64_t size = batch.size();
  const int64_t lo = batch.begin + size * rank / world_size;
  const int64_t hi = batch.begin + size * (rank + 1) / world_size;
  return {lo, hi};
}

int64_t GlobalSampler::MicroBatchCount(int64_t rows, int64_t max_rows) {
  assert(rows >= 0 && max_rows >= 1);
  return std::max<int64_t>(1, (rows + max_rows - 1) / max_rows);
}

std::pair<int64_t, int64_t> GlobalSampler::MicroBatch(int64_t lo, int64_t hi, int64_t count,
                                                      int64_t index) {
  assert(lo <= hi && count >= 1 && index >= 0 && index < count);
  const int64_t rows = hi - lo;
  return {lo + rows * index / count, lo + rows * (index + 1) / count};
}

DataCursor GlobalSampler::Advance(const DataCursor& cursor, const GlobalBatch& batch) const {
  (void)cursor;  // The batch already carries the position Next derived from the cursor.
  if (batch.end >= num_samples_) return DataCursor{batch.epoch + 1, 0};
  return DataCursor{batch.epoch, batch.end};
}

const std::vector<int64_t>& GlobalSampler::Permutation(int64_t epoch) {
  if (epoch == cached_epoch_) return cached_permutation_;
  cached_permutation_.resize(static_cast<size_t>(num_samples_));
  std::iota(cached_permutation_.begin(), cached_permutation_.end(), int64_t{0});
  SplitMix64 rng(EpochStreamSeed(seed_, epoch));
  for (int64_t i = num_samples_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.Bounded(static_cast<uint64_t>(i) + 1));
    std::swap(cached_permutation_[i], cached_permutation_[j]);
  }
  cached_epoch_ = epoch;
  return cached_permutation_;
}

}  // namespace lockstep::trainer
