#include "worker/ps/click_log.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "worker/trainer/random.h"

namespace lockstep::ps {
namespace {

using trainer::Mix64;

// A uniform in (0, 1) from 53 bits of `bits`.
double Unit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1p-53; }

constexpr double kPi = 3.14159265358979323846;

}  // namespace

double ClickWeight(const ClickLogSpec& spec, int32_t field, uint64_t id) {
  const uint64_t key =
      Mix64(Mix64(spec.seed ^ 0x5eed) ^ Mix64((uint64_t{static_cast<uint32_t>(field)} << 40) | id));
  // Box-Muller: a standard normal from two uniforms.
  const double u1 = Unit(key), u2 = Unit(Mix64(key));
  const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
  return normal * spec.weight_scale / std::sqrt(static_cast<double>(std::max(1, spec.fields)));
}

ClickLog GenerateClickLog(const ClickLogSpec& spec) {
  ClickLog log;
  log.samples = std::max<int64_t>(0, spec.samples);
  log.fields = std::max(1, spec.fields);
  const uint64_t vocabulary = static_cast<uint64_t>(std::max<int64_t>(1, spec.vocabulary));
  log.ids.resize(static_cast<size_t>(log.samples) * static_cast<size_t>(log.fields));
  log.labels.resize(static_cast<size_t>(log.samples));
  log.probabilities.resize(static_cast<size_t>(log.samples));
  for (int64_t s = 0; s < log.samples; ++s) {
    const uint64_t sample_key = Mix64(Mix64(spec.seed) ^ static_cast<uint64_t>(s));
    double logit = spec.bias;
    for (int32_t f = 0; f < log.fields; ++f) {
      // Skewed ids: u^3 puts half the draws in the vocabulary's first eighth.
      const double u = Unit(Mix64(sample_key ^ (uint64_t{static_cast<uint32_t>(f)} + 1) * 0x9e37));
      const uint64_t id = std::min(
          vocabulary - 1, static_cast<uint64_t>(u * u * u * static_cast<double>(vocabulary)));
      log.ids[static_cast<size_t>(s) * static_cast<size_t>(log.fields) + static_cast<size_t>(f)] =
          (uint64_t{static_cast<uint32_t>(f)} << 40) | id;
      logit += ClickWeight(spec, f, id);
    }
    const double p = 1.0 / (1.0 + std::exp(-logit));
    log.probabilities[static_cast<size_t>(s)] = p;
    log.labels[static_cast<size_t>(s)] = Unit(Mix64(sample_key ^ 0xc11c)) < p ? 1 : 0;
  }
  return log;
}

double Auc(const std::vector<double>& scores, const std::vector<int32_t>& labels) {
  const size_t n = std::min(scores.size(), labels.size());
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney: the sum of the positives' ranks (ties get their average rank).
  double positive_rank_sum = 0;
  int64_t positives = 0;
  for (size_t begin = 0; begin < n;) {
    size_t end = begin + 1;
    while (end < n && scores[order[end]] == scores[order[begin]]) ++end;
    const double rank = (static_cast<double>(begin) + 1 + static_cast<double>(end)) / 2.0;
    for (size_t i = begin; i < end; ++i) {
      if (labels[order[i]] == 1) {
        positive_rank_sum += rank;
        ++positives;
      }
    }
    begin = end;
  }
  const int64_t negatives = static_cast<int64_t>(n) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  const double p = static_cast<double>(positives);
  return (positive_rank_sum - p * (p + 1) / 2.0) / (p * static_cast<double>(negatives));
}

}  // namespace lockstep::ps
