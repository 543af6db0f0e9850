#include "worker/trainer/checkpoint_state.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/logging.h"

namespace lockstep::trainer {
namespace {

// One tensor of a scope's checkpoint and where the trainer keeps it.
enum class Buffer { kParams, kOptimizer, kSamples, kLossScale, kLossScaleGoodSteps, kSampleCounts };
struct TensorSpec {
  checkpoint::TensorEntry entry;  // name, dtype, shape, bytes (offset: in the scope's stream)
  Buffer buffer = Buffer::kParams;
  size_t optimizer_buffer = 0;  // kOptimizer: which of the optimizer's state buffers
  int64_t element = 0;          // kParams, kOptimizer: first float in the scope's slice
};

// The tensors of `scope` in stream order: the one place that names them.
std::vector<TensorSpec> Specs(const ParameterLayout& layout, const CheckpointScope& scope,
                              const std::vector<std::string>& optimizer_buffers,
                              int64_t sample_counts) {
  std::vector<TensorSpec> specs;
  int64_t offset = 0;
  auto add = [&](TensorSpec spec) {
    spec.entry.offset = offset;
    offset += spec.entry.bytes;
    specs.push_back(std::move(spec));
  };
  const int64_t base = RangeOffset(layout, scope.layers);
  auto add_buffer = [&](const std::string& prefix, Buffer buffer, size_t k) {
    // The flat buffer's (backward) order, which a scope's layers keep as one slice.
    for (int b = 0; b < layout.num_layers(); ++b) {
      const int i = layout.ForwardIndex(b);
      if (i < scope.layers.first || i >= scope.layers.last) continue;
      const LayerLayout& layer = layout.layers[static_cast<size_t>(i)];
      const std::string name = prefix + "layers." + std::to_string(i);
      const auto f32 = static_cast<int64_t>(sizeof(float));
      add({{name + ".weight", "f32", {layer.out, layer.in}, 0, layer.in * layer.out * f32},
           buffer,
           k,
           layer.weight_offset - base});
      add({{name + ".bias", "f32", {layer.out}, 0, layer.out * f32},
           buffer,
           k,
           layer.bias_offset - base});
    }
  };
  add_buffer("", Buffer::kParams, 0);
  for (size_t k = 0; k < optimizer_buffers.size(); ++k) {
    add_buffer("optimizer/" + optimizer_buffers[k] + "/", Buffer::kOptimizer, k);
  }
  if (!scope.trainer_tensors) return specs;
  add({{"trainer/samples", "i64", {1}, 0, sizeof(int64_t)}, Buffer::kSamples});
  add({{"trainer/loss_scale", "f32", {1}, 0, sizeof(float)}, Buffer::kLossScale});
  add({{"trainer/loss_scale_good_steps", "i64", {1}, 0, sizeof(int64_t)},
       Buffer::kLossScaleGoodSteps});
  if (sample_counts > 0) {
    add({{"accounting/sample_counts",
          "i32",
          {sample_counts},
          0,
          sample_counts * static_cast<int64_t>(sizeof(int32_t))},
         Buffer::kSampleCounts});
  }
  return specs;
}

// One tensor of the checkpoint: where its bytes live in the trainer's memory.
struct TensorView {
  const TensorSpec* spec;
  const void* data;    // for Fill
  void* mutable_data;  // for Restore
  size_t bytes;
  bool on_device;  // data is memory of the state's device, else host memory
};

std::string RngState(const spec::TrainerSpec& spec) {
  return "splitmix64 seed=" + std::to_string(spec.seed);
}

// The tensors of `state` (a state of `scope`) in stream order, pointing into `specs`, which
// must outlive them. `mutable_state` may be null (Fill).
std::vector<TensorView> Views(const std::vector<TensorSpec>& specs, const TrainingState& state,
                              TrainingState* mutable_state) {
  const auto buffers = state.optimizer.StateBuffers();
  std::vector<std::pair<float*, int64_t>> mutable_buffers;
  if (mutable_state != nullptr) mutable_buffers = mutable_state->optimizer.StateBuffers();
  std::vector<TensorView> views;
  for (const TensorSpec& spec : specs) {
    TensorView view{&spec, nullptr, nullptr, static_cast<size_t>(spec.entry.bytes), false};
    switch (spec.buffer) {
      case Buffer::kParams:
        view.data = state.params.device_data() + spec.element;
        if (mutable_state) view.mutable_data = mutable_state->params.device_data() + spec.element;
        view.on_device = true;
        break;
      case Buffer::kOptimizer:
        view.data = buffers[spec.optimizer_buffer].first + spec.element;
        if (mutable_state)
          view.mutable_data = mutable_buffers[spec.optimizer_buffer].first + spec.element;
        view.on_device = true;
        break;
      case Buffer::kSamples:
        view.data = &state.samples;
        if (mutable_state) view.mutable_data = &mutable_state->samples;
        break;
      case Buffer::kLossScale:
        view.data = &state.loss_scale;
        if (mutable_state) view.mutable_data = &mutable_state->loss_scale;
        break;
      case Buffer::kLossScaleGoodSteps:
        view.data = &state.loss_scale_good_steps;
        if (mutable_state) view.mutable_data = &mutable_state->loss_scale_good_steps;
        break;
      case Buffer::kSampleCounts:
        view.data = state.sample_counts.data();
        if (mutable_state) view.mutable_data = mutable_state->sample_counts.data();
        break;
    }
    views.push_back(view);
  }
  return views;
}

std::vector<TensorSpec> SpecsOf(const TrainingState& state, const ParameterLayout& layout,
                                const CheckpointScope& scope) {
  return Specs(layout, scope, state.optimizer.StateBufferNames(),
               scope.trainer_tensors ? static_cast<int64_t>(state.sample_counts.size()) : 0);
}

}  // namespace

CheckpointScope WholeScope(const ParameterLayout& layout) {
  return {LayerRange{0, layout.num_layers()}, true};
}

CheckpointScope StageScope(const std::vector<LayerRange>& stages, int stage) {
  return {stages[static_cast<size_t>(stage)], stage == 0};
}

std::vector<checkpoint::TensorEntry> CheckpointTable(const ParameterLayout& layout,
                                                     const CheckpointScope& scope,
                                                     const Optimizer& optimizer,
                                                     int64_t sample_counts) {
  std::vector<checkpoint::TensorEntry> table;
  for (TensorSpec& spec : Specs(layout, scope, optimizer.StateBufferNames(),
                                scope.trainer_tensors ? sample_counts : 0)) {
    table.push_back(std::move(spec.entry));
  }
  return table;
}

void FillCheckpointState(const TrainingState& state, const ParameterLayout& layout,
                         const spec::TrainerSpec& spec, checkpoint::CheckpointState* out,
                         const kernels::DeviceEvent* ready,
                         const std::optional<CheckpointScope>& scope) {
  kernels::Device& device = *state.params.device();
  const kernels::ExecutionContext& on = ready != nullptr ? device.background() : device.compute();
  if (ready != nullptr) device.Wait(on, *ready);
  out->step = state.step;
  out->epoch = state.cursor.epoch;
  out->cursor = checkpoint::DataCursor{state.cursor.epoch, state.cursor.offset};
  out->rng_state = RngState(spec);
  out->optimizer =
      checkpoint::OptimizerInfo{state.optimizer.TypeName(), state.optimizer.steps_taken()};
  const std::vector<TensorSpec> specs = SpecsOf(state, layout, scope.value_or(WholeScope(layout)));
  const std::vector<TensorView> views = Views(specs, state, nullptr);
  out->tensors.resize(views.size());
  for (size_t k = 0; k < views.size(); ++k) {
    checkpoint::NamedTensor& tensor = out->tensors[k];
    const checkpoint::TensorEntry& entry = views[k].spec->entry;
    if (tensor.name != entry.name) tensor.name = entry.name;
    tensor.dtype = entry.dtype;
    tensor.shape = entry.shape;
    tensor.bytes.resize(views[k].bytes);
    if (views[k].on_device) {
      device.CopyToHost(on, tensor.bytes.data(), views[k].data, views[k].bytes);
    } else {
      std::memcpy(tensor.bytes.data(), views[k].data, views[k].bytes);
    }
  }
  device.Synchronize(on);
}

Status CheckpointFitsTable(const checkpoint::Manifest& manifest,
                           const std::vector<checkpoint::TensorEntry>& wanted,
                           const std::string& optimizer) {
  if (manifest.optimizer.type != optimizer) {
    return FailedPreconditionError("it holds " + manifest.optimizer.type +
                                   " optimizer state; the manifest asks for " + optimizer);
  }
  std::map<std::string, const checkpoint::TensorEntry*> by_name;
  for (const checkpoint::TensorEntry& tensor : manifest.tensors) by_name[tensor.name] = &tensor;
  for (const checkpoint::TensorEntry& tensor : wanted) {
    if (tensor.name == "accounting/sample_counts") continue;  // reset when it does not fit
    auto found = by_name.find(tensor.name);
    if (found == by_name.end()) {
      return FailedPreconditionError("it has no tensor " + tensor.name +
                                     " (written for a different model?)");
    }
    if (found->second->dtype != tensor.dtype || found->second->shape != tensor.shape) {
      return FailedPreconditionError(
          "tensor " + tensor.name + " is " + found->second->dtype +
          checkpoint::ShapeText(found->second->shape) + ", this model's " + tensor.dtype +
          checkpoint::ShapeText(tensor.shape) + " (written for a different model?)");
    }
  }
  return OkStatus();
}

Status CheckpointFitsModel(const checkpoint::Manifest& manifest, const TrainingState& state,
                           const ParameterLayout& layout) {
  return CheckpointFitsTable(manifest,
                             CheckpointTable(layout, WholeScope(layout), state.optimizer,
                                             static_cast<int64_t>(state.sample_counts.size())),
                             state.optimizer.TypeName());
}

Status RestoreFromCheckpointState(const checkpoint::CheckpointState& checkpoint,
                                  const ParameterLayout& layout, const spec::TrainerSpec& spec,
                                  TrainingState* state,
                                  const std::optional<CheckpointScope>& scope) {
  const CheckpointScope scoped = scope.value_or(WholeScope(layout));
  const std::vector<TensorSpec> specs = SpecsOf(*state, layout, scoped);
  // The loader's checks (its manifest's table, then the fit to this state), before anything
  // changes: every tensor's bytes then match this state's view of it.
  const checkpoint::Manifest table = checkpoint::BuildManifest(checkpoint, 1, false);
  Status fits = checkpoint::CheckTensorTable(table);
  if (fits.ok()) {
    std::vector<checkpoint::TensorEntry> wanted;
    for (const TensorSpec& spec : specs) wanted.push_back(spec.entry);
    fits = CheckpointFitsTable(table, wanted, state->optimizer.TypeName());
  }
  if (!fits.ok()) {
    return FailedPreconditionError("checkpoint of step " + std::to_string(checkpoint.step) + ": " +
                                   fits.message());
  }
  if (checkpoint.rng_state != RngState(spec)) {
    LOCKSTEP_LOG(WARNING) << "checkpoint of step " << checkpoint.step << " was written with "
                          << checkpoint.rng_state << ", the manifest has seed " << spec.seed
                          << ": the data order continues with the manifest's seed";
  }
  std::map<std::string, const checkpoint::NamedTensor*> by_name;
  for (const checkpoint::NamedTensor& tensor : checkpoint.tensors) by_name[tensor.name] = &tensor;
  const bool restore_counts = !state->sample_counts.empty() &&
                              by_name.count("accounting/sample_counts") > 0 &&
                              by_name["accounting/sample_counts"]->bytes.size() ==
                                  state->sample_counts.size() * sizeof(int32_t);
  // A scope without the trainer's tensors leaves them, the counts included, as they are.
  if (scoped.trainer_tensors && !restore_counts && !state->sample_counts.empty()) {
    LOCKSTEP_LOG(WARNING) << "checkpoint of step " << checkpoint.step
                          << " has no sample counts for this data set: accounting restarts";
    std::fill(state->sample_counts.begin(), state->sample_counts.end(), 0);
  }
  const std::vector<TensorView> views = Views(specs, *state, state);
  kernels::Device& device = *state->params.device();
  for (const TensorView& view : views) {
    const std::string& name = view.spec->entry.name;
    if (name == "accounting/sample_counts" && !restore_counts) continue;
    if (view.on_device) {
      device.CopyToDevice(device.compute(), view.mutable_data, by_name[name]->bytes.data(),
                          view.bytes);
    } else {
      std::memcpy(view.mutable_data, by_name[name]->bytes.data(), view.bytes);
    }
  }
  device.Synchronize(device.compute());
  state->step = checkpoint.step;
  state->cursor = DataCursor{checkpoint.cursor.epoch, checkpoint.cursor.offset};
  state->optimizer.set_steps_taken(checkpoint.optimizer.step);
  return OkStatus();
}

}  // namespace lockstep::trainer
