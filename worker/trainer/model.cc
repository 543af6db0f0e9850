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

// The context the layers' GEMMs run in: in bf16 both operands of every GEMM are rounded values
// (rounded weights, input, outputs and activation gradients), which lets a GPU use its bf16
// tensor cores for them (kernels::ExecutionContext::bf16_operands).
kernels::ExecutionContext GemmContext(const kernels::ExecutionContext& ctx, bool bf16) {
  kernels::ExecutionContext gemm = ctx;
  gemm.bf16_operands = bf16;
  return gemm;
}

}  // namespace

int64_t RangeOffset(const ParameterLayout& layout, LayerRange range) {
  return layout.layers[static_cast<size_t>(range.last) - 1].weight_offset;
}

int64_t RangeCount(const ParameterLayout& layout, LayerRange range) {
  const LayerLayout& first = layout.layers[static_cast<size_t>(range.first)];
  return first.bias_offset + first.out - RangeOffset(layout, range);
}

StatusOr<MlpWorkspace> MlpWorkspace::Create(const MlpModel& model, int64_t max_rows,
                                            kernels::Device& device,
                                            std::optional<LayerRange> layers) {
  const ParameterLayout& layout = model.layout();
  const LayerRange range = layers.value_or(LayerRange{0, layout.num_layers()});
  if (range.first < 0 || range.last > layout.num_layers() || range.size() < 1) {
    return InvalidArgumentError("model workspace: layers [" + std::to_string(range.first) + ", " +
                                std::to_string(range.last) + ") are not a range of the model's " +
                                std::to_string(layout.num_layers()) + " layers");
  }
  MlpWorkspace workspace;
  workspace.max_rows_ = max_rows;
  workspace.layers_ = range;
  int64_t widest = 0;
  workspace.outputs_.resize(static_cast<size_t>(range.size()));
  workspace.pre_activations_.resize(static_cast<size_t>(range.size()));
  for (int l = range.first; l < range.last; ++l) {
    const LayerLayout& layer = layout.layers[static_cast<size_t>(l)];
    const auto i = static_cast<size_t>(l - range.first);
    LOCKSTEP_RETURN_IF_ERROR(workspace.outputs_[i].Allocate(device, max_rows * layer.out));
    if (layer.activation == ActivationType::kGelu) {
      LOCKSTEP_RETURN_IF_ERROR(
          workspace.pre_activations_[i].Allocate(device, max_rows * layer.out));
    }
    widest = std::max({widest, layer.in, layer.out});
  }
  LOCKSTEP_RETURN_IF_ERROR(workspace.grad_a_.Allocate(device, max_rows * widest));
  LOCKSTEP_RETURN_IF_ERROR(workspace.grad_b_.Allocate(device, max_rows * widest));
  if (model.precision() == Precision::kBf16) {
    LOCKSTEP_RETURN_IF_ERROR(workspace.bf16_params_.Allocate(device, RangeCount(layout, range)));
    const int64_t in = layout.layers[static_cast<size_t>(range.first)].in;
    LOCKSTEP_RETURN_IF_ERROR(workspace.bf16_input_.Allocate(device, max_rows * in));
    LOCKSTEP_RETURN_IF_ERROR(workspace.bf16_zero_bias_.Allocate(device, widest));
    kernels::SetZero(device.compute(), widest, workspace.bf16_zero_bias_.device_data());
    LOCKSTEP_RETURN_IF_ERROR(workspace.bf16_discarded_dbias_.Allocate(device, widest));
  }
  return workspace;
}

int64_t MlpWorkspace::floats() const {
  int64_t total = grad_a_.size() + grad_b_.size() + bf16_params_.size() + bf16_input_.size() +
                  bf16_zero_bias_.size() + bf16_discarded_dbias_.size();
  for (const auto& output : outputs_) total += output.size();
  for (const auto& pre : pre_activations_) total += pre.size();
  return total;
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

void MlpModel::InitializeParameters(uint64_t seed, float* params,
                                    std::optional<LayerRange> layers) const {
  const LayerRange range = layers.value_or(LayerRange{0, layout_.num_layers()});
  const int64_t shift = RangeOffset(layout_, range);
  for (int l = range.first; l < range.last; ++l) {
    const LayerLayout& layer = layout_.layers[static_cast<size_t>(l)];
    // One stream per layer: a layer's values do not depend on the other layers' sizes.
    SplitMix64 rng(MixSeed(seed, static_cast<uint64_t>(l)));
    const float bound = 1.0f / std::sqrt(static_cast<float>(layer.in));
    float* weight = params + (layer.weight_offset - shift);
    for (int64_t i = 0; i < layer.in * layer.out; ++i) weight[i] = rng.UniformFloat(-bound, bound);
    float* bias = params + (layer.bias_offset - shift);
    for (int64_t i = 0; i < layer.out; ++i) bias[i] = rng.UniformFloat(-bound, bound);
  }
}

// Where a layer's weight and bias are in the range's slice that the layers read: the caller's,
// or in bf16 the workspace's rounded copy.
struct MlpModel::LayerParams {
  const float* base;
  int64_t shift;  // the flat offset of base[0]
  const float* weight(const LayerLayout& layer) const {
    return base + (layer.weight_offset - shift);
  }
  const float* bias(const LayerLayout& layer) const { return base + (layer.bias_offset - shift); }
};

MlpModel::LayerParams MlpModel::ReadParams(const float* params,
                                           const MlpWorkspace& workspace) const {
  const int64_t shift = RangeOffset(layout_, workspace.layers_);
  return {bf16() ? workspace.bf16_params_.device_data() : params, shift};
}

const float* MlpModel::Forward(const kernels::ExecutionContext& ctx, const float* params,
                               const float* input, int64_t rows, MlpWorkspace& workspace) const {
  const LayerRange range = workspace.layers_;
  if (bf16() && rows > 0) {
    // The input of a later stage is a bf16 layer output already: rounding it again changes
    // nothing.
    kernels::RoundToBf16(ctx, RangeCount(layout_, range), params,
                         workspace.bf16_params_.device_data());
    const int64_t in = layout_.layers[static_cast<size_t>(range.first)].in;
    kernels::RoundToBf16(ctx, rows * in, input, workspace.bf16_input_.device_data());
    input = workspace.bf16_input_.device_data();
  }
  const LayerParams p = ReadParams(params, workspace);
  const kernels::ExecutionContext gemm = GemmContext(ctx, bf16());
  for (int l = range.first; l < range.last; ++l) {
    const LayerLayout& layer = layout_.layers[static_cast<size_t>(l)];
    const auto i = static_cast<size_t>(l - range.first);
    float* out = workspace.outputs_[i].device_data();
    if (rows > 0) {
      // out[rows, out] = input[rows, in] * W^T, W being [out, in].
      kernels::Gemm(gemm, false, true, rows, layer.out, layer.in, 1.0f, input, p.weight(layer),
                    0.0f, out);
      float* pre = workspace.pre_activations_[i].empty()
                       ? nullptr
                       : workspace.pre_activations_[i].device_data();
      if (bf16() && RoundsBetweenBiasAndActivation(layer.activation)) {
        // z = bf16(x W^T + b), then y = bf16(act(z)), pre = z (z + 0 is z).
        kernels::BiasActivationForward(ctx, ActivationType::kIdentity, rows, layer.out,
                                       p.bias(layer), out, nullptr);
        kernels::RoundToBf16(ctx, rows * layer.out, out, out);
        kernels::BiasActivationForward(ctx, layer.activation, rows, layer.out,
                                       workspace.bf16_zero_bias_.device_data(), out, pre);
        kernels::RoundToBf16(ctx, rows * layer.out, out, out);
      } else {
        kernels::BiasActivationForward(ctx, layer.activation, rows, layer.out, p.bias(layer), out,
                                       pre);
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
  if (rows > 0) Forward(ctx, params, features, rows, workspace);
  OutputGradient from;
  from.labels = labels;
  from.grad_scale = grad_scale;
  from.loss_sum = loss_sum;
  Backward(ctx, params, features, rows, from, grads, workspace, on_layer_ready, accumulate);
}

void MlpModel::Backward(const kernels::ExecutionContext& ctx, const float* params,
                        const float* input, int64_t rows, const OutputGradient& from, float* grads,
                        MlpWorkspace& workspace, const LayerReadyFn& on_layer_ready,
                        bool accumulate, float* grad_input) const {
  const LayerRange range = workspace.layers_;
  const int num_layers = layout_.num_layers();
  if (rows == 0) {
    // A rank whose slice of a short final batch is empty still takes part in every all-reduce
    // with zero gradients, in the same bucket order as its peers.
    if (!accumulate) kernels::SetZero(ctx, RangeCount(layout_, range), grads);
    for (int l = range.last - 1; l >= range.first; --l) {
      if (on_layer_ready) on_layer_ready(num_layers - 1 - l);
    }
    return;
  }
  // What the layers read in Forward: in bf16, the rounded copies.
  const LayerParams p = ReadParams(params, workspace);
  if (bf16()) input = workspace.bf16_input_.device_data();
  const int64_t shift = p.shift;  // grads is the range's slice too
  const kernels::ExecutionContext gemm = GemmContext(ctx, bf16());

  const LayerLayout& top = layout_.layers[static_cast<size_t>(range.last) - 1];
  float* dy = from.grad_output;
  float* dx = workspace.grad_b_.device_data();
  if (dy == nullptr) {
    dy = workspace.grad_a_.device_data();
    const float* logits = workspace.outputs_.back().device_data();
    kernels::SoftmaxCrossEntropyAccumulate(ctx, rows, top.out, logits, from.labels, from.grad_scale,
                                           dy, from.loss_sum);
    // The gradient of the bf16 logits is bf16.
    if (bf16()) kernels::RoundToBf16(ctx, rows * top.out, dy, dy);
  }

  for (int l = range.last - 1; l >= range.first; --l) {
    const LayerLayout& layer = layout_.layers[static_cast<size_t>(l)];
    const auto i = static_cast<size_t>(l - range.first);
    const float* y = workspace.outputs_[i].device_data();
    const float* pre = workspace.pre_activations_[i].empty()
                           ? nullptr
                           : workspace.pre_activations_[i].device_data();
    // dy: d(loss)/d(output) becomes d(loss)/d(pre-activation); the bias gradient is its column
    // sum.
    if (bf16() && RoundsBetweenBiasAndActivation(layer.activation)) {
      // dy * act'(z), rounded; the bias gradient is the sum of the rounded values.
      kernels::BiasActivationBackward(ctx, layer.activation, rows, layer.out, y, pre, dy,
                                      workspace.bf16_discarded_dbias_.device_data());
      kernels::RoundToBf16(ctx, rows * layer.out, dy, dy);
      kernels::BiasActivationBackward(ctx, ActivationType::kIdentity, rows, layer.out, nullptr,
                                      nullptr, dy, grads + (layer.bias_offset - shift), accumulate);
    } else {
      // relu's and the identity's backward only mask a bf16 dy: still bf16.
      kernels::BiasActivationBackward(ctx, layer.activation, rows, layer.out, y, pre, dy,
                                      grads + (layer.bias_offset - shift), accumulate);
    }
    const float* x = (l == range.first) ? input : workspace.outputs_[i - 1].device_data();
    // dW[out, in] = dy^T[out, rows] * x[rows, in].
    kernels::Gemm(gemm, true, false, layer.out, layer.in, rows, 1.0f, dy, x,
                  accumulate ? 1.0f : 0.0f, grads + (layer.weight_offset - shift));
    // The layer's gradients are final: its bucket may go on the wire while the rest of
    // backward runs.
    if (on_layer_ready) on_layer_ready(num_layers - 1 - l);
    const bool last = l == range.first;
    if (last && grad_input == nullptr) break;
    // dx[rows, in] = dy[rows, out] * W[out, in]; the range's input gradient goes to grad_input.
    float* target = last ? grad_input : dx;
    kernels::Gemm(gemm, false, false, rows, layer.in, layer.out, 1.0f, dy, p.weight(layer), 0.0f,
                  target);
    if (bf16()) kernels::RoundToBf16(ctx, rows * layer.in, target, target);
    if (!last) {
      // The next layer down reads the new gradient; dy's buffer becomes the scratch, unless it
      // is the caller's grad_output, which the workspace's spare buffer replaces.
      dx = (dy == from.grad_output) ? workspace.grad_a_.device_data() : dy;
      dy = target;
    }
  }
}

}  // namespace lockstep::trainer
