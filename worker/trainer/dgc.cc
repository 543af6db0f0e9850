#include "worker/trainer/dgc.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "worker/trainer/random.h"

namespace lockstep::trainer {
namespace {

// The paper's first warm-up stage sends 25% of the entries (75% sparsity).
constexpr double kWarmupStartDensity = 0.25;
// The threshold is estimated on 1% of the entries (the paper samples 0.1% to 1%), at least this
// many.
constexpr int64_t kMinSampleSize = 256;

// |value|, with NaN above everything (so a NaN gradient is sent, and seen, rather than making the
// order undefined).
float Magnitude(float value) {
  return std::isnan(value) ? std::numeric_limits<float>::infinity() : std::fabs(value);
}

// The order of the selection: larger magnitude first, the lower index among equal magnitudes.
struct LargerMagnitude {
  const float* values;
  bool operator()(uint32_t a, uint32_t b) const {
    const float x = Magnitude(values[a]), y = Magnitude(values[b]);
    return x > y || (x == y && a < b);
  }
};

}  // namespace

double DgcDensity(const spec::DgcSpec& spec, int64_t step) {
  const double target = 1.0 - spec.sparsity;
  if (spec.warmup_steps <= 0 || step >= spec.warmup_steps || target >= kWarmupStartDensity) {
    return target;
  }
  const double progress = static_cast<double>(step) / static_cast<double>(spec.warmup_steps);
  return kWarmupStartDensity * std::pow(target / kWarmupStartDensity, progress);
}

DgcExchanger::DgcExchanger(const spec::DgcSpec& spec, double momentum, double weight_decay,
                           uint64_t seed)
    : spec_(spec),
      momentum_(static_cast<float>(momentum)),
      weight_decay_(static_cast<float>(weight_decay)),
      seed_(seed) {}

bool DgcExchanger::IsSparse(const GradientBucket& bucket) const {
  return spec_.sparsity > 0 && bucket.count >= spec_.min_bucket_elements;
}

std::vector<uint32_t> DgcExchanger::SelectLargest(const float* values, int64_t count, int64_t k,
                                                  uint64_t sample_seed) {
  std::vector<uint32_t> selected;
  k = std::clamp<int64_t>(k, 0, count);
  if (k == 0) return selected;
  const LargerMagnitude larger{values};
  // The threshold: a magnitude that about 2k entries reach, estimated on a sample. Every entry
  // of the exact top k reaches any threshold that k or more entries reach, so the candidates hold
  // the top k whenever there are at least k of them: the sample changes the cost, never the
  // result.
  float threshold = 0;
  const int64_t sample_size = std::min(count, std::max(kMinSampleSize, count / 100));
  const int64_t rank_in_sample = (2 * k * sample_size + count - 1) / count;
  if (rank_in_sample < sample_size) {
    std::vector<float> sample(static_cast<size_t>(sample_size));
    SplitMix64 random(sample_seed);
    for (float& magnitude : sample) {
      magnitude = Magnitude(values[random.Next() % static_cast<uint64_t>(count)]);
    }
    std::nth_element(sample.begin(), sample.begin() + rank_in_sample, sample.end(),
                     std::greater<float>());
    threshold = sample[static_cast<size_t>(rank_in_sample)];
  }
  for (int64_t i = 0; i < count; ++i) {
    if (Magnitude(values[i]) >= threshold) selected.push_back(static_cast<uint32_t>(i));
  }
  if (static_cast<int64_t>(selected.size()) < k) {
    // The estimate was too high (a rare sample): take the exact top k of everything.
    selected.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) selected[static_cast<size_t>(i)] = static_cast<uint32_t>(i);
  }
  if (static_cast<int64_t>(selected.size()) > k) {
    std::nth_element(selected.begin(), selected.begin() + k, selected.end(), larger);
    selected.resize(static_cast<size_t>(k));
  }
  std::sort(selected.begin(), selected.end());
  return selected;
}

void DgcExchanger::DropAllResiduals() {
  for (Residual& residual : residuals_) {
    std::fill(residual.momentum.begin(), residual.momentum.end(), 0.0f);
    std::fill(residual.velocity.begin(), residual.velocity.end(), 0.0f);
  }
}

Status DgcExchanger::Exchange(comm::Communicator& comm, size_t bucket_index, float* slice,
                              const float* params, int64_t count, double density, int64_t step,
                              int64_t timeout_ms, DgcExchangeStats* stats) {
  if (residuals_.size() <= bucket_index) residuals_.resize(bucket_index + 1);
  Residual& residual = residuals_[bucket_index];
  const size_t n = static_cast<size_t>(count);
  if (residual.velocity.size() != n) {
    residual.momentum.assign(n, 0.0f);
    residual.velocity.assign(n, 0.0f);
  }
  float* u = residual.momentum.data();
  float* v = residual.velocity.data();
  const int world = comm.size();
  // 1. Momentum correction, this rank's share of the weight decay included.
  const float decay = weight_decay_ / static_cast<float>(world);
  for (size_t i = 0; i < n; ++i) {
    u[i] = momentum_ * u[i] + (slice[i] + decay * params[i]);
    v[i] += u[i];
  }

  // (The slack keeps a density that is k / n up to rounding, 1 - (1 - k / n), at k.)
  const int64_t k =
      std::clamp<int64_t>(static_cast<int64_t>(std::ceil(density * count - 1e-6)), 1, count);
  stats->sent = k;
  // 2. Selection; at density 1 every entry goes.
  const bool everything = k == count;
  if (!everything) {
    selected_ = SelectLargest(v, count, k, MixSeed(seed_, MixSeed(step, bucket_index)) +
                                               static_cast<uint64_t>(comm.rank()));
  }
  // 3. Exchange.
  if (k * world >= count) {
    // Dense: the selected entries in a zeroed slice, all-reduced.
    if (everything) {
      std::memcpy(slice, v, n * sizeof(float));
    } else {
      std::fill(slice, slice + n, 0.0f);
      for (uint32_t i : selected_) slice[i] = v[i];
    }
    stats->wire_bytes = count * static_cast<int64_t>(sizeof(float));
    LOCKSTEP_RETURN_IF_ERROR(comm.AllReduce(slice, n, comm::DataType::kFloat32,
                                            comm::ReduceOp::kSum, timeout_ms));
  } else {
    outgoing_.resize(selected_.size());
    for (size_t j = 0; j < selected_.size(); ++j) outgoing_[j] = {selected_[j], v[selected_[j]]};
    const size_t bytes_per_rank = outgoing_.size() * sizeof(SparseEntry);
    gathered_.resize(bytes_per_rank * static_cast<size_t>(world));
    stats->wire_bytes = static_cast<int64_t>(bytes_per_rank);
    LOCKSTEP_RETURN_IF_ERROR(
        comm.AllGather(outgoing_.data(), bytes_per_rank, gathered_.data(), timeout_ms));
    // Sum in rank order: the same additions in the same order on every rank.
    std::fill(slice, slice + n, 0.0f);
    for (int r = 0; r < world; ++r) {
      const char* base = gathered_.data() + static_cast<size_t>(r) * bytes_per_rank;
      for (size_t j = 0; j < outgoing_.size(); ++j) {
        SparseEntry entry;
        std::memcpy(&entry, base + j * sizeof(SparseEntry), sizeof(entry));
        if (entry.index >= n) {
          return InternalError("dgc: rank " + std::to_string(r) + " sent index " +
                               std::to_string(entry.index) + " of a bucket of " +
                               std::to_string(count));
        }
        slice[entry.index] += entry.value;
      }
    }
  }
  // 4. Momentum factor masking where this rank sent.
  if (everything) {
    std::fill(u, u + n, 0.0f);
    std::fill(v, v + n, 0.0f);
  } else {
    for (uint32_t i : selected_) {
      u[i] = 0;
      v[i] = 0;
    }
  }
  return OkStatus();
}

}  // namespace lockstep::trainer
