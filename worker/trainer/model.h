// The built-in trainer's model: a multi-layer perceptron (input -> hidden... -> classes) whose
// parameters live in ONE flat float buffer, and whose gradients live in a second flat buffer of
// the same layout.
//
// Layout: layers are stored in BACKWARD order (the last layer first), each as its weight
// [out, in] (row-major, PyTorch Linear's convention) followed by its bias [out]. Backward
// produces the last layer's gradients first, so the gradients it has produced at any moment are
// one contiguous prefix of the buffer, and a gradient bucket (a run of whole layers) is a
// contiguous slice that can be all-reduced in place while backward continues.
//
// Every pointer the model's compute functions take is memory of the device the ExecutionContext
// names (kernels/device.h): the same code runs on the CPU and on a GPU.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(MlpModel model, MlpModel::Create(784, {256}, 10, kRelu));
//   std::vector<float> params(model.layout().num_params);
//   model.InitializeParameters(/*seed=*/1, params.data());           // host memory
//   ... copy params to the device: DeviceArray<float> device_params ...
//   LOCKSTEP_ASSIGN_OR_RETURN(MlpWorkspace ws, MlpWorkspace::Create(model, 64, device));
//   model.ForwardBackward(device.compute(), device_params.device_data(), x, labels, rows,
//                         /*grad_scale=*/1.0f / global_batch, grads, ws,
//                         [&](int backward_layer) { ... }, loss_sum);  // all device memory
//
// Precision (spec.trainer.precision): kBf16 is mixed precision as PyTorch's autocast computes an
// nn.Linear stack, emulated on fp32 storage: every value autocast would hold in bf16 is rounded to
// the nearest bf16 and kept as a float (kernels::RoundToBf16), so a GEMM of such values with fp32
// sums computes what a bf16 tensor-core GEMM computes (each product of two bf16 is exact in fp32);
// on a GPU the GEMMs do run on bf16 tensor cores (kernels::ExecutionContext::bf16_operands).
// Rounded: the weights and biases a layer reads (a copy; the fp32 master parameters are left as
// they are), the input features, every layer's pre-activation (before its activation is applied)
// and output (the logits included), and every activation gradient (before it enters a GEMM or
// the bias gradient's sum). Kept in fp32: the parameters, the softmax, the loss, and the weight
// and bias gradients, which are the GEMM's and the column sum's fp32 results accumulated into the
// fp32 gradient buffer (Megatron-LM's main_grad; autocast would round them to bf16 before adding
// them to .grad). The optimizer and the all-reduce never see a bf16 value.
//
// Thread safety: a model is immutable after Create; a workspace is used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "common/status.h"
#include "kernels/device.h"
#include "kernels/kernels.h"

namespace lockstep::trainer {

enum class Precision { kFp32, kBf16 };

// One fully connected layer and where its tensors sit in the flat buffers.
struct LayerLayout {
  int64_t in = 0;
  int64_t out = 0;
  kernels::ActivationType activation = kernels::ActivationType::kIdentity;
  int64_t weight_offset = 0;  // [out, in] at flat[weight_offset ...]
  int64_t bias_offset = 0;    // [out], right after the weight
  int64_t num_params() const { return in * out + out; }
};

struct ParameterLayout {
  std::vector<LayerLayout> layers;  // in FORWARD order (layers[0] reads the input)
  int64_t num_params = 0;

  int num_layers() const { return static_cast<int>(layers.size()); }
  // Backward index b (0 = the last layer, which backward finishes first) to forward index.
  int ForwardIndex(int backward_index) const { return num_layers() - 1 - backward_index; }
  // The layer's contiguous slice [offset, offset + count) of the flat buffers.
  int64_t SegmentOffset(int forward_index) const { return layers[forward_index].weight_offset; }
};

// Layers [first, last) in forward order: what one pipeline stage holds (all of them without a
// pipeline). Their tensors are one contiguous slice of the flat buffers, as layers are stored
// in backward order.
struct LayerRange {
  int first = 0;
  int last = 0;  // exclusive
  int size() const { return last - first; }
  bool operator==(const LayerRange& other) const {
    return first == other.first && last == other.last;
  }
};
// The slice [offset, offset + count) of the flat buffers that `range` of `layout` occupies.
int64_t RangeOffset(const ParameterLayout& layout, LayerRange range);
int64_t RangeCount(const ParameterLayout& layout, LayerRange range);

class MlpModel;

// Activations and scratch for up to max_rows samples per call of layers `layers()`, in one
// device's memory. A pipeline stage keeps one per micro-batch whose activations it holds.
class MlpWorkspace {
 public:
  // RESOURCE_EXHAUSTED when the buffers do not fit on the device; INVALID_ARGUMENT for a range
  // outside the model or an empty one. Without `layers`, all of the model's.
  static StatusOr<MlpWorkspace> Create(const MlpModel& model, int64_t max_rows,
                                       kernels::Device& device,
                                       std::optional<LayerRange> layers = std::nullopt);
  int64_t max_rows() const { return max_rows_; }
  LayerRange layers() const { return layers_; }
  // Floats it holds on its device.
  int64_t floats() const;

 private:
  friend class MlpModel;
  MlpWorkspace() = default;
  int64_t max_rows_ = 0;
  LayerRange layers_;
  // Per layer of layers_ (index l - layers_.first): [rows, out] post-activation, and the
  // pre-activation (gelu only).
  std::vector<kernels::DeviceArray<float>> outputs_;
  std::vector<kernels::DeviceArray<float>> pre_activations_;
  kernels::DeviceArray<float> grad_a_, grad_b_;  // ping-pong d(activation) buffers
  // Precision::kBf16 only: the range's parameters and its input rounded to bf16; for gelu and
  // tanh layers, a zero bias (the activation applied to the rounded pre-activation) and a bias
  // gradient that is thrown away (the one summed before the activation gradient is rounded).
  kernels::DeviceArray<float> bf16_params_, bf16_input_;
  kernels::DeviceArray<float> bf16_zero_bias_, bf16_discarded_dbias_;
};

class MlpModel {
 public:
  // Called by ForwardBackward once a layer's weight and bias gradients are final; the argument
  // is the layer's backward index (0, 1, ... in the order backward finishes them).
  using LayerReadyFn = std::function<void(int backward_index)>;

  // InvalidArgument when a size is < 1.
  static StatusOr<MlpModel> Create(int64_t input_features, const std::vector<int32_t>& hidden,
                                   int64_t num_classes, kernels::ActivationType activation,
                                   Precision precision = Precision::kFp32);

  const ParameterLayout& layout() const { return layout_; }
  Precision precision() const { return precision_; }
  int64_t input_features() const { return layout_.layers.front().in; }
  int64_t num_classes() const { return layout_.layers.back().out; }

  // PyTorch Linear's default initialisation, weights and biases both drawn from
  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from a private splitmix64 stream per layer: a pure
  // function of (seed, architecture), identical on every rank and platform.
  // With `layers`, only theirs, into their slice (params[0] is flat offset RangeOffset): the
  // values the whole model's initialisation gives them.
  void InitializeParameters(uint64_t seed, float* params,
                            std::optional<LayerRange> layers = std::nullopt) const;

  // Forward and backward over `rows` samples (0 <= rows <= workspace.max_rows()) with a
  // whole-model workspace: loss =
  // grad_scale * sum of per-sample cross-entropy. Overwrites grads with d(loss)/d(params), or
  // with `accumulate` adds d(loss)/d(params) to them (the micro-batches of one step: the sum is
  // the gradient of the micro-batches together, up to float rounding), and
  // calls on_layer_ready (may be empty) for every layer in backward order, each call right after
  // the kernels that finish that layer's gradient slice were QUEUED on ctx (on a GPU they may
  // still be running: the caller orders its use of the slice after them, e.g. with an event) and
  // before the remaining layers' backward is queued. ADDS the UNSCALED sum of per-sample losses
  // to *loss_sum (device memory), with no host synchronisation. rows == 0 yields zero gradients
  // (a rank with an empty slice of a short batch), or leaves them as they are with `accumulate`.
  void ForwardBackward(const kernels::ExecutionContext& ctx, const float* params,
                       const float* features, const int32_t* labels, int64_t rows, float grad_scale,
                       float* grads, MlpWorkspace& workspace, const LayerReadyFn& on_layer_ready,
                       double* loss_sum, bool accumulate = false) const;

  // Forward only, over the workspace's layers: `input` is [rows, in] of its first layer (the
  // features, or the previous pipeline stage's output); `params` is their slice of the flat
  // buffer (params[0] is flat offset RangeOffset(layout(), workspace.layers()): the whole buffer
  // for a whole-model workspace), so that a pipeline stage holds only its own layers. Returns a
  // pointer to the last layer's output [rows, out] inside the workspace (the logits when that is
  // the model's last layer), which Backward then reads.
  const float* Forward(const kernels::ExecutionContext& ctx, const float* params,
                       const float* input, int64_t rows, MlpWorkspace& workspace) const;

  // Where backward over a workspace's layers starts: the gradient of their output from the next
  // pipeline stage, or, for the layers that end with the model's last one, the loss.
  struct OutputGradient {
    // d(loss)/d(output) [rows, out]; Backward overwrites it (it becomes scratch).
    float* grad_output = nullptr;
    // Without grad_output: loss = grad_scale * sum of the rows' cross-entropy, whose unscaled
    // sum is ADDED to *loss_sum (device memory).
    const int32_t* labels = nullptr;
    float grad_scale = 1.0f;
    double* loss_sum = nullptr;
  };

  // Backward over the workspace's layers, after Forward of the same `input` and rows with the
  // same workspace (and parameters): writes (or with `accumulate` adds) d(loss)/d(params) to
  // `grads`, the layers' slice as `params` is, calling on_layer_ready as ForwardBackward does, and
  // with `grad_input` writes d(loss)/d(input) [rows, in] there (what the previous stage's backward
  // starts from). rows == 0 behaves as in ForwardBackward and leaves grad_input alone.
  void Backward(const kernels::ExecutionContext& ctx, const float* params, const float* input,
                int64_t rows, const OutputGradient& from, float* grads, MlpWorkspace& workspace,
                const LayerReadyFn& on_layer_ready, bool accumulate,
                float* grad_input = nullptr) const;

 private:
  MlpModel(ParameterLayout layout, Precision precision)
      : layout_(std::move(layout)), precision_(precision) {}
  bool bf16() const { return precision_ == Precision::kBf16; }
  struct LayerParams;
  LayerParams ReadParams(const float* params, const MlpWorkspace& workspace) const;
  ParameterLayout layout_;
  Precision precision_ = Precision::kFp32;
};

}  // namespace lockstep::trainer
