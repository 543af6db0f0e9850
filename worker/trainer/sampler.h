// The global data order: one seeded permutation of the train set per epoch, consumed through a
// global cursor, so no sample is skipped or repeated within an epoch whatever the world size does
// between steps (elastic training relies on this).
//
// Every rank of a generation holds the same cursor (it is part of the agreed training state and
// of checkpoints). Each step:
//
//   GlobalSampler sampler(train.num_samples, job.spec.trainer.seed);
//   GlobalSampler::GlobalBatch batch =
//       sampler.Next(cursor, spec::GlobalBatchSize(job.spec, world_size));
//   auto [lo, hi] = GlobalSampler::RankSlice(batch, world_size, rank);
//   const std::vector<int64_t>& order = sampler.Permutation(batch.epoch);
//   const int64_t count = GlobalSampler::MicroBatchCount(hi - lo, batch_size);
//   for (int64_t i = 0; i < count; ++i) {
//     auto [micro_lo, micro_hi] = GlobalSampler::MicroBatch(lo, hi, count, i);
//     GatherBatch(train, order.data() + micro_lo, micro_hi - micro_lo, features, labels);
//     ... forward/backward, accumulating the gradient ...
//   }
//   ... all-reduce ...
//   cursor = sampler.Advance(cursor, batch);
//
// The global batch does not depend on the world size when the job keeps it fixed
// (spec.elastic.globalBatch): a smaller world gives each rank a larger slice, which it trains in
// micro-batches of at most batchSize (the rows its memory was sized for), so the samples of
// every step, and so the model, are those of the full world up to float rounding.
//
// The last batch of an epoch is partial (it never wraps into the next epoch's permutation), and
// when G = end - begin < world_size some ranks get an empty slice: the trainer must then weight
// each rank's gradient by its sample count (sum the per-rank sums, divide by G) rather than
// average equally.
//
// Determinism: permutations come from a private splitmix64 generator and Fisher-Yates with an
// unbiased bounded draw, so every process on every platform computes the same order for
// (num_samples, seed, epoch). std::uniform_int_distribution is not used (implementation-defined).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace lockstep::trainer {

// Position in the global data order.
struct DataCursor {
  int64_t epoch = 0;
  int64_t offset = 0;  // samples of this epoch's permutation already consumed, [0, num_samples)

  friend bool operator==(const DataCursor& a, const DataCursor& b) {
    return a.epoch == b.epoch && a.offset == b.offset;
  }
  friend bool operator!=(const DataCursor& a, const DataCursor& b) { return !(a == b); }
};

class GlobalSampler {
 public:
  // Positions [begin, end) of epoch `epoch`'s permutation that one global step consumes.
  struct GlobalBatch {
    int64_t epoch = 0;
    int64_t begin = 0;
    int64_t end = 0;
    int64_t size() const { return end - begin; }
  };

  // num_samples >= 1 (asserted).
  GlobalSampler(int64_t num_samples, uint64_t seed);

  int64_t num_samples() const { return num_samples_; }
  uint64_t seed() const { return seed_; }

  // The next global batch from `cursor`: begin = cursor.offset, end = min(begin + global_batch,
  // num_samples). A cursor whose offset is already >= num_samples (not produced by Advance) is
  // read as the start of the next epoch. global_batch >= 1 (asserted).
  GlobalBatch Next(const DataCursor& cursor, int64_t global_batch) const;

  // The positions [lo, hi) of `batch` that rank `rank` of `world_size` takes: with G = batch
  // size, lo = begin + floor(rank * G / W), hi = begin + floor((rank + 1) * G / W). The slices
  // of all ranks tile [begin, end) in rank order; with G = W * B every rank gets exactly B.
  // Positions index Permutation(batch.epoch), not sample ids.
  static std::pair<int64_t, int64_t> RankSlice(const GlobalBatch& batch, int world_size, int rank);

  // How many micro-batches of at most max_rows (>= 1) a slice of `rows` samples is trained in:
  // ceil(rows / max_rows), and 1 for an empty slice (it still takes part in the step).
  static int64_t MicroBatchCount(int64_t rows, int64_t max_rows);
  // Micro-batch `index` of `count` (MicroBatchCount's) of the slice [lo, hi): [lo + floor(index *
  // R / count), lo + floor((index + 1) * R / count)) with R = hi - lo. The micro-batches tile the
  // slice in order and their sizes differ by at most one, so none exceeds max_rows.
  static std::pair<int64_t, int64_t> MicroBatch(int64_t lo, int64_t hi, int64_t count,
                                                int64_t index);

  // The cursor after consuming `batch` (which Next produced from `cursor`): offset = batch.end,
  // or {epoch + 1, 0} when that reaches the end of the epoch.
  DataCursor Advance(const DataCursor& cursor, const GlobalBatch& batch) const;

  // Sample ids in epoch `epoch`'s order: a permutation of [0, num_samples), a pure function of
  // (num_samples, seed, epoch). The last epoch asked for is cached; the reference stays valid
  // until Permutation is called with another epoch. Not thread-safe (mutates the cache); Next,
  // RankSlice and Advance are const and safe to call concurrently.
  const std::vector<int64_t>& Permutation(int64_t epoch);

 private:
  int64_t num_samples_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> cached_permutation_;
};

}  // namespace lockstep::trainer
