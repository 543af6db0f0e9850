// Softmax cross-entropy and argmax accuracy. One pass per row over `classes` values, which is
// small (tens to a few thousand); rows are independent.
#include <cmath>
#include <cstdlib>

#include "common/logging.h"
#include "kernels/cpu/cpu_kernels.h"

namespace lockstep::kernels::cpu {
namespace {

// First index of the maximum, as torch.argmax; NaN entries are never chosen.
int64_t ArgMax(const float* row, int64_t classes) {
  int64_t best = 0;
  for (int64_t c = 1; c < classes; ++c) {
    if (row[c] > row[best]) best = c;
  }
  return best;
}

// A label outside [0, classes) would read or write out of bounds: the data loader validates
// labels, so reaching here with one is a bug.
void CheckLabel(const char* kernel, int64_t row, int32_t label, int64_t classes) {
  if (label < 0 || label >= classes) {
    LOCKSTEP_LOG(ERROR) << "kernels::" << kernel << ": label " << label << " of row " << row
                        << " is outside [0, " << classes << ")";
    std::abort();
  }
}

}  // namespace

void SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits, const int32_t* labels,
                         float grad_scale, float* dlogits, double* loss_sum, int64_t* correct) {
  double total_loss = 0.0;
  int64_t total_correct = 0;
  if (classes > 0) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* __restrict x = logits + r * classes;
      float* __restrict d = dlogits + r * classes;
      const int32_t label = labels[r];
      CheckLabel("SoftmaxCrossEntropy", r, label, classes);

      float max_logit = x[0];
      for (int64_t c = 1; c < classes; ++c) max_logit = x[c] > max_logit ? x[c] : max_logit;

      // exp(x - max) <= 1, so nothing overflows however large the logits; the sum is in double.
      double sum = 0.0;
      for (int64_t c = 0; c < classes; ++c) {
        const float e = std::exp(x[c] - max_logit);
        d[c] = e;
        sum += e;
      }
      // loss = logsumexp(x) - x[label] = log(sum) - (x[label] - max).
      total_loss += std::log(sum) - (static_cast<double>(x[label]) - max_logit);

      const double scale_over_sum = grad_scale / sum;
      for (int64_t c = 0; c < classes; ++c) {
        d[c] = static_cast<float>(d[c] * scale_over_sum);
      }
      d[label] -= grad_scale;

      if (ArgMax(x, classes) == label) ++total_correct;
    }
  }
  if (loss_sum != nullptr) *loss_sum = total_loss;
  if (correct != nullptr) *correct = total_correct;
}

int64_t CountCorrect(int64_t rows, int64_t classes, const float* logits, const int32_t* labels) {
  if (classes <= 0) return 0;
  int64_t total_correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    CheckLabel("CountCorrect", r, labels[r], classes);
    if (ArgMax(logits + r * classes, classes) == labels[r]) ++total_correct;
  }
  return total_correct;
}

}  // namespace lockstep::kernels::cpu
