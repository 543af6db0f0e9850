// A synthetic click log drawn from a known logistic model, so that the best AUC any model can
// reach on it is known (the AUC of the true click probabilities), and the AUC metric.
//
// No public click log (Criteo's, Avazu's) is reachable through Debian's packages or npm, so the
// sparse models are trained on this: each sample has one categorical feature per field, its id
// drawn from a skewed distribution over the field's vocabulary (a few ids are common, most are
// rare, as in real logs), and it is a click with probability
//   p = sigmoid(bias + sum over fields f of weight(f, id_f)),
// each weight a normal draw fixed by the seed, the field and the id. A model that learns every
// weight reaches the ceiling; one that has seen an id too rarely cannot.
//
//   ClickLogSpec spec{.samples = 100'000, .fields = 8, .vocabulary = 10'000, .seed = 1};
//   ClickLog log = GenerateClickLog(spec);
//   double ceiling = Auc(log.probabilities, log.labels);   // the best reachable AUC
//   uint64_t id = log.ids[sample * log.fields + field];    // a global feature id
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep::ps {

struct ClickLogSpec {
  int64_t samples = 0;
  int32_t fields = 8;
  int64_t vocabulary = 10000;  // ids per field
  double weight_scale = 1.0;   // each weight ~ N(0, weight_scale^2 / fields)
  double bias = -1.5;          // the click rate's baseline (sigmoid(-1.5) = 18%)
  uint64_t seed = 1;
};

struct ClickLog {
  int64_t samples = 0;
  int32_t fields = 0;
  // samples x fields feature ids, each unique to its field: (field << 40) | id.
  std::vector<uint64_t> ids;
  std::vector<int32_t> labels;        // 1: click
  std::vector<double> probabilities;  // the true click probability of each sample
};

// Deterministic in the spec. The same seed with more samples extends the same log.
ClickLog GenerateClickLog(const ClickLogSpec& spec);

// The true model's weight of `id` in `field`.
double ClickWeight(const ClickLogSpec& spec, int32_t field, uint64_t id);

// The area under the ROC curve of `scores` for `labels` (1 positive, 0 negative): the chance
// that a random positive scores above a random negative, ties counting half. 0.5 when either
// class is empty.
double Auc(const std::vector<double>& scores, const std::vector<int32_t>& labels);

}  // namespace lockstep::ps
