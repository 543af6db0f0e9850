#include "worker/trainer/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "worker/trainer/random.h"

namespace lockstep::trainer {

using kernels::ActivationType;

namespace {

// In bf16, gelu and tanh take the rounded pre-activation and their output is rounded again;
// relu and the identity commute with rounding, so one fused pass and one rounding suffice.
bool RoundsBetweenBiasAndActivation(ActivationType activation) {
  return activation == ActivationType::kGelu || activation == ActivationType::kTanh;
}

}  // namespace

StatusOr<MlpWorkspace> MlpWorkspace::Create(const MlpModel& model, int64_t max_rows,
                                            kernels::Device& device) {
  const ParameterLayout& layout = model.layout();
  MlpWorkspace workspace;
  workspace.max_rows_ = max_rows;
  int64_t widest = 0;
  workspace.outputs_.resize(layout.layers.size());
  workspace.pre_activations_.resize(layout.layers.size());
  for (size_t l = 0; l < layout.layers.size(); ++l) {
    const LayerLayout& layer = layout.layers[l];
    LOCKSTEP_RETURN_IF_ERROR(workspace.outputs_[l].Allocate(device, max_rows * layer.out));
    if (layer.activation == ActivationType::kGelu) {
      LOCKSTEP_RETURN_IF_ERROR(workspace.pre_activations_[l].Allocate(device, max_rows * layer.out));
    }
    widest = std::max({widest, layer.in, layer.out});
  }
  LOCKSTEP_RETURN_IF_ERROR(workspace.grad_a_.Allocate(device, max_rows * widest));
  LOCKSTEP_RETURN_IF_ERROR(workspace.grad_b_.Allocate(device, max_rows * widest));
  if (model.precision() == Precision::kBf16) {
    LOCKSTEP_RETURN_IF_ERROR(workspace.bf16_params_.Allocate(device, layout.num_params));
    LOCKSTEP_RETURN_IF_ERROR(
        workspace.bf16_features_.Allocate(device, max_rows * model.input_features()));
    LOCKSTEP_RETURN_IF_ERROR(workspace.bf16_zero_bias_.Allocate(device, widest));
    kernels::SetZero(device.compute(), widest, workspace.bf16_zero_bias_.device_data());
    LOCKSTEP_RETURN_IF_ERROR(workspace.bf16_discarded_dbias_.Allocate(device, widest));
  }
  return workspace;
}

StatusOr<MlpModel> MlpModel::Create(int64_t input_features, const std::vector<int32_t>& hidden,
                                    int64_t num_classes, ActivationType activation,
                                    Precision precision) {
  if (input_features < 1) {
    return InvalidArgumentError("model: input features must be >= 1 (got " +
                                std::to_string(input_features) + ")");
  }
  if (num_classes < 2) {
    return InvalidArgumentError("model: the data must have at least 2 classes (got " +
                                std::to_string(num_classes) + ")");
  }
  std::vector<int64_t> widths{input_features};
  for (size_t i = 0; i < hidden.size(); ++i) {
    if (hidden[i] < 1) {
      return InvalidArgumentError("spec.trainer.model.hidden[" + std::to_string(i) +
                                  "]: must be >= 1 (got " + std::to_string(hidden[i]) + ")");
    }
    widths.push_back(hidden[i]);
  }
  widths.push_back(num_classes);

  ParameterLayout layout;
  const int num_layers = static_cast<int>(widths.size()) - 1;
  layout.layers.resize(static_cast<size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) {
    LayerLayout& layer = layout.layers[static_cast<size_t>(l)];
    layer.in = widths[static_cast<size_t>(l)];
    layer.out = widths[static_cast<size_t>(l) + 1];
    layer.activation = (l == num_layers - 1) ? ActivationType::kIdentity : activation;
  }
  // Backward order: the last layer first (see the header).
  int64_t offset = 0;
  for (int l = num_layers - 1; l >= 0; --l) {
    LayerLayout& layer = layout.layers[static_cast<size_t>(l)];
    layer.weight_offset = offset;
    layer.bias_offset = offset + layer.in * layer.out;
    offset += layer.num_params();
  }
  layout.num_params = offset;
  return MlpModel(std::move(layout), precision);
}

void MlpModel::InitializeParameters(uint64_t seed, float* params) const {
  for (int l = 0; l < layout_.num_layers(); ++l) {
    const LayerLayout& layer = layout_.layers[static_cast<size_t>(l)];
    // One stream per layer: a layer's values do not depend on the other layers' sizes.
    SplitMix64 rng(MixSeed(seed, static_cast<uint64_t>(l)));
    const float bound = 1.0f / std::sqrt(static_cast<float>(layer.in));
    float* weight = params + layer.weight_offset;
    for (int64_t i = 0; i < layer.in * layer.out; ++i) weight[i] = rng.UniformFloat(-bound, bound);
    float* bias = params + layer.bias_offset;
    for (int64_t i = 0; i < layer.out; ++i) bias[i] = rng.UniformFloat(-bound, bound);
  }
}

const float* MlpModel::Forward(const kernels::ExecutionContext& ctx, const float* params,
                               const float* features, int64_t rows, MlpWorkspace& workspace) const {
  const float* input = features;
  if (bf16() && rows > 0) {
    float* rounded_params = workspace.bf16_params_.device_data();
    kernels::RoundToBf16(ctx, layout_.num_params, params, rounded_params);
    params = rounded_params;
    float* rounded_features = workspace.bf16_features_.device_data();
    kernels::RoundToBf16(ctx, rows * input_features(), features, rounded_features);
    input = rounded_features;
  }
  for (int l = 0; l < layout_.num_layers(); ++l) {
    const LayerLayout& layer = layout_.layers[static_cast<size_t>(l)];
    float* out = workspace.outputs_[static_cast<size_t>(l)].device_data();
    if (rows > 0) {
      // out[rows, out] = input[rows, in] * W^T, W being [out, in].
      kernels::Gemm(ctx, false, true, rows, layer.out, layer.in, 1.0f, input,
                    params + layer.weight_offset, 0.0f, out);
      float* pre = workspace.pre_activations_[static_cast<size_t>(l)].empty()
                       ? nullptr
                       : workspace.pre_activations_[static_cast<size_t>(l)].device_data();
      if (bf16() && RoundsBetweenBiasAndActivation(layer.activation)) {
        // z = bf16(x W^T + b), then y = bf16(act(z)), pre = z (z + 0 is z).
        kernels::BiasActivationForward(ctx, ActivationType::kIdentity, rows, layer.out,
                                       params + layer.bias_offset, out, nullptr);
        kernels::RoundToBf16(ctx, rows * layer.out, out, out);
        kernels::BiasActivationForward(ctx, layer.activation, rows, layer.out,
                                       workspace.bf16_zero_bias_.device_data(), out, pre);
        kernels::RoundToBf16(ctx, rows * layer.out, out, out);
      } else {
        kernels::BiasActivationForward(ctx, layer.activation, rows, layer.out,
                                       params + layer.bias_offset, out, pre);
        // relu and the identity commute with rounding: rounding once after is the same.
        if (bf16()) kernels::RoundToBf16(ctx, rows * layer.out, out, out);
      }
    }
    input = out;
  }
  return input;
}

void MlpModel::ForwardBackward(const kernels::ExecutionContext& ctx, const float* params,
                               const float* features, const int32_t* labels, int64_t rows,
                               float grad_scale, float* grads, MlpWorkspace& workspace,
                               const LayerReadyFn& on_layer_ready, double* loss_sum,
                               bool accumulate) const {
  const int num_layers = layout_.num_layers();
  if (rows == 0) {
    // A rank whose slice of a short final batch is empty still takes part in every all-reduce
    // with zero gradients, in the same bucket order as its peers.
    if (!accumulate) kernels::SetZero(ctx, layout_.num_params, grads);
    for (int b = 0; b < num_layers; ++b) {
      if (on_layer_ready) on_layer_ready(b);
    }
    return;
  }
  const float* logits = Forward(ctx, params, features, rows, workspace);
  if (bf16()) {
    // What the layers read in Forward: the rounded copies.
    params = workspace.bf16_params_.device_data();
    features = workspace.bf16_features_.device_data();
  }

  const LayerLayout& last = layout_.layers.back();
  float* dy = workspace.grad_a_.device_data();
  float* dx = workspace.grad_b_.device_data();
  kernels::SoftmaxCrossEntropyAccumulate(ctx, rows, last.out, logits, labels, grad_scale, dy,
                                         loss_sum);
  // The gradient of the bf16 logits is bf16.
  if (bf16()) kernels::RoundToBf16(ctx, rows * last.out, dy, dy);

  for (int l = num_layers - 1; l >= 0; --l) {
    const LayerLayout& layer = layout_.layers[static_cast<size_t>(l)];
    const float* y = workspace.outputs_[static_cast<size_t>(l)].device_data();
    const float* pre = workspace.pre_activations_[static_cast<size_t>(l)].empty()
                           ? nullptr
                           : workspace.pre_activations_[static_cast<size_t>(l)].device_data();
    // dy: d(loss)/d(output) becomes d(loss)/d(pre-activation); the bias gradient is its column
    // sum.
    if (bf16() && RoundsBetweenBiasAndActivation(layer.activation)) {
      // dy * act'(z), rounded; the bias gradient is the sum of the rounded values.
      kernels::BiasActivationBackward(ctx, layer.activation, rows, layer.out, y, pre, dy,
                                      workspace.bf16_discarded_dbias_.device_data());
      kernels::RoundToBf16(ctx, rows * layer.out, dy, dy);
      kernels::BiasActivationBackward(ctx, ActivationType::kIdentity, rows, layer.out, nullptr,
                                      nullptr, dy, grads + layer.bias_offset, accumulate);
    } else {
      // relu's and the identity's backward only mask a bf16 dy: still bf16.
      kernels::BiasActivationBackward(ctx, layer.activation, rows, layer.out, y, pre, dy,
                                      grads + layer.bias_offset, accumulate);
    }
    const float* input =
        (l == 0) ? features : workspace.outputs_[static_cast<size_t>(l) - 1].device_data();
    // dW[out, in] = dy^T[out, rows] * input[rows, in].
    kernels::Gemm(ctx, true, false, layer.out, layer.in, rows, 1.0f, dy, input,
                  accumulate ? 1.0f : 0.0f, grads + layer.weight_offset);
    // The layer's gradients are final: its bucket may go on the wire while the rest of
    // backward runs.
    if (on_layer_ready) on_layer_ready(num_layers - 1 - l);
    if (l > 0) {
      // dx[rows, in] = dy[rows, out] * W[out, in].
      kernels::Gemm(ctx, false, false, rows, layer.in, layer.out, 1.0f, dy,
                    params + layer.weight_offset, 0.0f, dx);
      if (bf16()) kernels::RoundToBf16(ctx, rows * layer.in, dx, dx);
      std::swap(dy, dx);
    }
  }
}

}  // namespace lockstep::trainer
