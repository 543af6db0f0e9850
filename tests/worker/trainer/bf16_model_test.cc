// The model's bf16 mixed precision (model.h, "Precision") against a reference written here from
// autocast's rules, with naive loops: the implementation rounds where autocast would cast to
// bf16, keeps the parameters and the gradients it accumulates in fp32, and stays within bf16's
// precision of the fp32 model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "tests/kernels/test_util.h"
#include "worker/trainer/model.h"
#include "worker/trainer/random.h"

namespace lockstep::trainer {
namespace {

using kernels::ActivationType;
using kernels::testing::ActivationName;
using kernels::testing::ReferenceActivation;
using kernels::testing::ReferenceDerivative;

float Bf16(float value) { return kernels::Bf16ToFloat(kernels::FloatToBf16(value)); }

bool IsBf16Value(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return (bits & 0xffffu) == 0;
}

// d(activation)/dz as the kernels take it: tanh's from its output y (here rounded to bf16),
// 1 - y^2; the others from the (rounded) pre-activation z.
double Derivative(ActivationType act, double z, double y) {
  return act == ActivationType::kTanh ? 1 - y * y : ReferenceDerivative(act, z);
}

struct Result {
  std::vector<float> grads;
  double loss_sum = 0;
};

// Autocast's nn.Linear stack, written out: inputs, weights and biases rounded to bf16, products
// summed in fp32, every pre-activation, output and activation gradient rounded to bf16; softmax,
// loss, and the weight and bias gradients in fp32 (summed in double here).
Result Reference(const MlpModel& model, const std::vector<float>& params,
                 const std::vector<float>& x, const std::vector<int32_t>& labels, int64_t rows,
                 float grad_scale) {
  const ParameterLayout& layout = model.layout();
  const int layers = layout.num_layers();
  std::vector<float> p(params.size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = Bf16(params[i]);
  std::vector<std::vector<float>> inputs(static_cast<size_t>(layers) + 1);
  std::vector<std::vector<float>> pre(static_cast<size_t>(layers));
  inputs[0].resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) inputs[0][i] = Bf16(x[i]);
  for (int l = 0; l < layers; ++l) {
    const LayerLayout& layer = layout.layers[static_cast<size_t>(l)];
    const std::vector<float>& in = inputs[static_cast<size_t>(l)];
    std::vector<float>& out = inputs[static_cast<size_t>(l) + 1];
    out.assign(static_cast<size_t>(rows * layer.out), 0);
    pre[static_cast<size_t>(l)] = out;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < layer.out; ++o) {
        float sum = 0;
        for (int64_t k = 0; k < layer.in; ++k) {
          sum += in[r * layer.in + k] * p[layer.weight_offset + o * layer.in + k];
        }
        const float z = Bf16(sum + p[layer.bias_offset + o]);
        pre[static_cast<size_t>(l)][r * layer.out + o] = z;
        out[r * layer.out + o] = Bf16(static_cast<float>(ReferenceActivation(layer.activation, z)));
      }
    }
  }
  Result result;
  result.grads.assign(params.size(), 0);
  const LayerLayout& last = layout.layers.back();
  const std::vector<float>& logits = inputs.back();
  std::vector<float> dy(static_cast<size_t>(rows * last.out));
  for (int64_t r = 0; r < rows; ++r) {
    double max = logits[r * last.out];
    for (int64_t c = 1; c < last.out; ++c) max = std::max(max, double(logits[r * last.out + c]));
    double denominator = 0;
    for (int64_t c = 0; c < last.out; ++c) denominator += std::exp(logits[r * last.out + c] - max);
    const int32_t label = labels[static_cast<size_t>(r)];
    result.loss_sum += std::log(denominator) - (logits[r * last.out + label] - max);
    for (int64_t c = 0; c < last.out; ++c) {
      const double softmax = std::exp(logits[r * last.out + c] - max) / denominator;
      dy[r * last.out + c] = Bf16(static_cast<float>((softmax - (c == label)) * grad_scale));
    }
  }
  for (int l = layers - 1; l >= 0; --l) {
    const LayerLayout& layer = layout.layers[static_cast<size_t>(l)];
    const std::vector<float>& y = inputs[static_cast<size_t>(l) + 1];
    const std::vector<float>& z = pre[static_cast<size_t>(l)];
    const std::vector<float>& in = inputs[static_cast<size_t>(l)];
    for (int64_t o = 0; o < layer.out; ++o) {
      double bias_sum = 0;
      for (int64_t r = 0; r < rows; ++r) {
        float& d = dy[r * layer.out + o];
        d = Bf16(static_cast<float>(
            d * Derivative(layer.activation, z[r * layer.out + o], y[r * layer.out + o])));
        bias_sum += d;
      }
      result.grads[layer.bias_offset + o] = static_cast<float>(bias_sum);
      for (int64_t k = 0; k < layer.in; ++k) {
        double sum = 0;
        for (int64_t r = 0; r < rows; ++r)
          sum += double(dy[r * layer.out + o]) * in[r * layer.in + k];
        result.grads[layer.weight_offset + o * layer.in + k] = static_cast<float>(sum);
      }
    }
    if (l == 0) break;
    std::vector<float> dx(static_cast<size_t>(rows * layer.in));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < layer.in; ++k) {
        float sum = 0;
        for (int64_t o = 0; o < layer.out; ++o) {
          sum += dy[r * layer.out + o] * p[layer.weight_offset + o * layer.in + k];
        }
        dx[r * layer.in + k] = Bf16(sum);
      }
    }
    dy = std::move(dx);
  }
  return result;
}

double RelativeNormError(const std::vector<float>& a, const std::vector<float>& b) {
  double difference = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return std::sqrt(difference / norm);
}

struct Problem {
  static constexpr int64_t kRows = 24, kFeatures = 40, kClasses = 6;
  std::vector<float> x;
  std::vector<int32_t> labels;
  float grad_scale = 1.0f / 32;
  Problem() {
    SplitMix64 rng(17);
    for (int64_t i = 0; i < kRows * kFeatures; ++i) x.push_back(rng.UniformFloat(-2, 2));
    for (int64_t r = 0; r < kRows; ++r)
      labels.push_back(static_cast<int32_t>(rng.Next() % kClasses));
  }
};

Result TrainStep(const MlpModel& model, const std::vector<float>& params, const Problem& problem,
                 std::vector<float>* logits = nullptr) {
  MlpWorkspace workspace = *MlpWorkspace::Create(model, Problem::kRows, kernels::CpuDevice());
  Result result;
  result.grads.assign(params.size(), 0);
  model.ForwardBackward({}, params.data(), problem.x.data(), problem.labels.data(), Problem::kRows,
                        problem.grad_scale, result.grads.data(), workspace, nullptr,
                        &result.loss_sum);
  if (logits != nullptr) {
    const float* out =
        model.Forward({}, params.data(), problem.x.data(), Problem::kRows, workspace);
    logits->assign(out, out + Problem::kRows * Problem::kClasses);
  }
  return result;
}

class Bf16ModelTest : public ::testing::TestWithParam<ActivationType> {};

// Rounding in the wrong place, or not at all, would leave the implementation as far from the
// reference as the fp32 model is (about 3e-3 here); rounding where the reference does leaves only
// the differences of summation order (the BLAS's against the loops', about 2e-8 here), which could
// flip a bf16 rounding now and then.
TEST_P(Bf16ModelTest, GradientsAndLossMatchAReferenceThatRoundsWhereAutocastDoes) {
  const Problem problem;
  auto bf16 = MlpModel::Create(Problem::kFeatures, {32, 24}, Problem::kClasses, GetParam(),
                               Precision::kBf16);
  auto fp32 = MlpModel::Create(Problem::kFeatures, {32, 24}, Problem::kClasses, GetParam());
  ASSERT_TRUE(bf16.ok() && fp32.ok());
  EXPECT_EQ(bf16->precision(), Precision::kBf16);
  std::vector<float> params(static_cast<size_t>(bf16->layout().num_params));
  bf16->InitializeParameters(5, params.data());

  const Result reference =
      Reference(*bf16, params, problem.x, problem.labels, Problem::kRows, problem.grad_scale);
  const Result mixed = TrainStep(*bf16, params, problem);
  const Result full = TrainStep(*fp32, params, problem);
  const double mixed_error = RelativeNormError(mixed.grads, reference.grads);
  const double full_error = RelativeNormError(full.grads, reference.grads);
  std::printf("gradient error against the bf16 reference: bf16 model %.3g, fp32 model %.3g\n",
              mixed_error, full_error);
  EXPECT_GT(full_error, 1e-3) << "the problem is too small to tell bf16 from fp32";
  EXPECT_LT(mixed_error, full_error / 100);
  EXPECT_NEAR(mixed.loss_sum, reference.loss_sum, 1e-6 * reference.loss_sum);
}

// Mixed precision is the same model: the bf16 gradients are the fp32 ones to within bf16's
// relative precision (2^-8) accumulated over three layers, and the logits are bf16 values.
TEST_P(Bf16ModelTest, StaysWithinBf16PrecisionOfFp32WithBf16Logits) {
  const Problem problem;
  auto bf16 = MlpModel::Create(Problem::kFeatures, {32, 24}, Problem::kClasses, GetParam(),
                               Precision::kBf16);
  auto fp32 = MlpModel::Create(Problem::kFeatures, {32, 24}, Problem::kClasses, GetParam());
  ASSERT_TRUE(bf16.ok() && fp32.ok());
  std::vector<float> params(static_cast<size_t>(bf16->layout().num_params));
  bf16->InitializeParameters(9, params.data());
  std::vector<float> logits, fp32_logits;
  const Result mixed = TrainStep(*bf16, params, problem, &logits);
  const Result full = TrainStep(*fp32, params, problem, &fp32_logits);
  EXPECT_LT(RelativeNormError(mixed.grads, full.grads), 3e-2);
  EXPECT_NEAR(mixed.loss_sum, full.loss_sum, 1e-2 * full.loss_sum);
  int not_bf16 = 0;
  for (float logit : logits) not_bf16 += IsBf16Value(logit) ? 0 : 1;
  EXPECT_EQ(not_bf16, 0) << "every logit is a bf16 value";
  int fp32_not_bf16 = 0;
  for (float logit : fp32_logits) fp32_not_bf16 += IsBf16Value(logit) ? 0 : 1;
  EXPECT_GT(fp32_not_bf16, 0);
}

// Rounding is per sample and the gradients accumulate in fp32, so micro-batches of one step add
// up to the whole batch's gradient in bf16 as in fp32.
TEST_P(Bf16ModelTest, AccumulatedMicroBatchGradientsEqualTheWholeBatchGradient) {
  const Problem problem;
  auto model = MlpModel::Create(Problem::kFeatures, {32, 24}, Problem::kClasses, GetParam(),
                                Precision::kBf16);
  ASSERT_TRUE(model.ok());
  std::vector<float> params(static_cast<size_t>(model->layout().num_params));
  model->InitializeParameters(13, params.data());
  const Result whole = TrainStep(*model, params, problem);

  MlpWorkspace workspace = *MlpWorkspace::Create(*model, 10, kernels::CpuDevice());
  std::vector<float> accumulated(params.size(), 9.0f);  // overwritten by the first piece
  double loss = 0;
  int64_t begin = 0;
  for (int64_t piece : {10, 0, 7, 7}) {
    model->ForwardBackward({}, params.data(), problem.x.data() + begin * Problem::kFeatures,
                           problem.labels.data() + begin, piece, problem.grad_scale,
                           accumulated.data(), workspace, nullptr, &loss,
                           /*accumulate=*/begin > 0);
    begin += piece;
  }
  ASSERT_EQ(begin, Problem::kRows);
  EXPECT_NEAR(loss, whole.loss_sum, 1e-9 * whole.loss_sum);
  EXPECT_LT(RelativeNormError(accumulated, whole.grads), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Activations, Bf16ModelTest,
                         ::testing::Values(ActivationType::kRelu, ActivationType::kGelu,
                                           ActivationType::kTanh),
                         [](const auto& info) { return ActivationName(info.param); });

}  // namespace
}  // namespace lockstep::trainer
