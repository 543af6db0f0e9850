// Deep Gradient Compression (Lin et al., ICLR 2018) for the DDP engine: per gradient bucket,
// each rank sends only the largest entries of its momentum-corrected gradient and keeps the rest
// as a local residual that later steps add to.
//
//   DgcExchanger dgc(spec.sync.dgc, spec.optimizer.momentum, seed);
//   if (dgc.IsSparse(bucket)) {
//     dgc.Exchange(comm, bucket_index, slice, bucket.count, dgc.Density(step), step, ...);
//   }
//
// One exchange, on rank r with local gradient g (this rank's share of the global-mean gradient,
// as the DDP engine computes it) of parameters p:
//  1. momentum correction, with the weight decay inside it as in Fleet's dgc op: u = m u + g +
//     wd p / W; v = v + u (u and v are this rank's, per entry; the W shares of the decay sum to
//     the all-reduce's wd p);
//  2. selection: the k = ceil(density x n) entries of largest |v|. As in the paper, a threshold
//     is first estimated on a 1% sample of |v| (drawn from a stream seeded by the job's seed,
//     the step, the bucket and the rank, so a run is reproducible), every entry above it is a
//     candidate, and an exact top-k of the candidates picks k (an exact top-k of all of |v| when
//     the estimate found too few);
//  3. exchange: an all-gather of the k (index, value) pairs of every rank, summed into the
//     zeroed slice in rank order, so every rank ends with bit-identical sums; when k x world >= n
//     the gathered pairs would outweigh the dense vector, and the selected entries are scattered
//     into the zeroed slice and all-reduced instead;
//  4. momentum factor masking: u and v are zeroed where this rank sent.
// The slice then holds the sum over ranks of what they sent: the update the optimizer applies
// with neither momentum nor weight decay (both are in u; optimizer.h's momentum-free ranges).
//
// The residuals are this rank's alone and are not in the training state, so the trainer drops
// them (zeroes them) at every checkpoint step: a run resumed from that checkpoint then continues
// exactly as the undisturbed one did. With 99.9% sparsity an entry waits about a thousand steps
// for its turn, so checkpoints much more often than that throw most of the held-back gradient
// away (docs/strategies.md). A failed step drops them too: it took its gradient in before the
// collective failed, and the next generation trains that step again. Sending them instead was
// tried and is worse: the last step's flush of residuals accumulated over hundreds of steps moved
// the model by a stale update (69.8% test accuracy against 81.3%, docs/strategies.md). The
// residuals outlive a generation (the trainer owns the exchanger): a survivor keeps its own, a new
// member starts from zero.
//
// Not done (the paper's other two techniques): local gradient clipping (the trainer clips no
// gradient) and the sampled-threshold hierarchy beyond one level.
//
// Host memory only (validation refuses dgc on cuda). Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "common/spec/training_job.h"
#include "common/status.h"
#include "worker/comm/communicator.h"
#include "worker/trainer/buckets.h"

namespace lockstep::trainer {

// The density (1 - sparsity) of step `step`: the target after warmupSteps; during the warm-up it
// falls geometrically from 25% (the paper's first stage, 75% sparsity) to the target. A target
// density at or above 25% has no warm-up.
double DgcDensity(const spec::DgcSpec& spec, int64_t step);

struct DgcExchangeStats {
  int64_t wire_bytes = 0;  // what this rank handed to the collective
  int64_t sent = 0;        // entries this rank sent
};

class DgcExchanger {
 public:
  DgcExchanger(const spec::DgcSpec& spec, double momentum, double weight_decay, uint64_t seed);

  // Whether the bucket is exchanged sparsely (else the DDP engine all-reduces it as usual):
  // sparsity above 0 and at least minBucketElements entries.
  bool IsSparse(const GradientBucket& bucket) const;
  double Density(int64_t step) const { return DgcDensity(spec_, step); }

  // One exchange of bucket `bucket_index` (see the file comment); `slice` holds this rank's
  // gradient on entry and the summed update on return, `params` the bucket's parameters (host
  // memory, `count` floats each). Errors are the communicator's; the residuals then hold a step
  // that was never applied: drop them (DropAllResiduals).
  Status Exchange(comm::Communicator& comm, size_t bucket_index, float* slice,
                  const float* params, int64_t count, double density, int64_t step,
                  int64_t timeout_ms, DgcExchangeStats* stats);
  // Zeroes every residual (a checkpoint step, a failed step, a generation of one rank).
  void DropAllResiduals();

  // The selection of step 2 alone, for tests: the indices (ascending) of the k entries of
  // largest |values[i]|, ties broken towards the lower index.
  static std::vector<uint32_t> SelectLargest(const float* values, int64_t count, int64_t k,
                                             uint64_t sample_seed);

 private:
  struct Residual {
    std::vector<float> momentum;  // u
    std::vector<float> velocity;  // v
  };
  struct SparseEntry {  // what travels: 8 bytes per sent entry
    uint32_t index;
    float value;
  };
  static_assert(sizeof(SparseEntry) == 8, "(index, value) pairs travel as 8 bytes");

  spec::DgcSpec spec_;
  float momentum_;
  float weight_decay_;
  uint64_t seed_;
  std::vector<Residual> residuals_;  // per bucket index, allocated at its first exchange
  // Buffers of one exchange, kept between steps.
  std::vector<uint32_t> selected_;
  std::vector<SparseEntry> outgoing_;
  std::vector<char> gathered_;
};

}  // namespace lockstep::trainer
