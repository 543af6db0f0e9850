#include "worker/trainer/checkpoint_state.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/logging.h"

namespace lockstep::trainer {
namespace {

// One tensor of the checkpoint: where its bytes live in the trainer's memory.
struct TensorView {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data;    // for Fill
  void* mutable_data;  // for Restore
  size_t bytes;
  bool on_device;  // data is memory of the state's device, else host memory
};

std::string RngState(const spec::TrainerSpec& spec) {
  return "splitmix64 seed=" + std::to_string(spec.seed);
}

// The tensors of `state` in stream order. `mutable_state` may be null (Fill).
std::vector<TensorView> Views(const TrainingState& state, TrainingState* mutable_state,
                              const ParameterLayout& layout) {
  std::vector<TensorView> views;
  auto add_buffer = [&](const std::string& prefix, const float* data, float* mutable_data) {
    for (int b = 0; b < layout.num_layers(); ++b) {
      const int i = layout.ForwardIndex(b);
      const LayerLayout& layer = layout.layers[static_cast<size_t>(i)];
      const std::string base = prefix + "layers." + std::to_string(i);
      views.push_back({base + ".weight",
                       "f32",
                       {layer.out, layer.in},
                       data + layer.weight_offset,
                       mutable_data ? mutable_data + layer.weight_offset : nullptr,
                       static_cast<size_t>(layer.in * layer.out) * sizeof(float), true});
      views.push_back({base + ".bias",
                       "f32",
                       {layer.out},
                       data + layer.bias_offset,
                       mutable_data ? mutable_data + layer.bias_offset : nullptr,
                       static_cast<size_t>(layer.out) * sizeof(float), true});
    }
  };
  add_buffer("", state.params.device_data(),
             mutable_state ? mutable_state->params.device_data() : nullptr);
  const auto buffers = state.optimizer.StateBuffers();
  const auto names = state.optimizer.StateBufferNames();
  std::vector<std::pair<float*, int64_t>> mutable_buffers;
  if (mutable_state != nullptr) mutable_buffers = mutable_state->optimizer.StateBuffers();
  for (size_t k = 0; k < buffers.size(); ++k) {
    add_buffer("optimizer/" + names[k] + "/", buffers[k].first,
               mutable_state ? mutable_buffers[k].first : nullptr);
  }
  views.push_back({"trainer/samples",
                   "i64",
                   {1},
                   &state.samples,
                   mutable_state ? &mutable_state->samples : nullptr,
                   sizeof(int64_t), false});
  views.push_back({"trainer/loss_scale",
                   "f32",
                   {1},
                   &state.loss_scale,
                   mutable_state ? &mutable_state->loss_scale : nullptr,
                   sizeof(float), false});
  views.push_back({"trainer/loss_scale_good_steps",
                   "i64",
                   {1},
                   &state.loss_scale_good_steps,
                   mutable_state ? &mutable_state->loss_scale_good_steps : nullptr,
                   sizeof(int64_t), false});
  if (!state.sample_counts.empty()) {
    views.push_back({"accounting/sample_counts",
                     "i32",
                     {static_cast<int64_t>(state.sample_counts.size())},
                     state.sample_counts.data(),
                     mutable_state ? mutable_state->sample_counts.data() : nullptr,
                     state.sample_counts.size() * sizeof(int32_t), false});
  }
  return views;
}

}  // namespace

void FillCheckpointState(const TrainingState& state, const ParameterLayout& layout,
                         const spec::TrainerSpec& spec, checkpoint::CheckpointState* out,
                         const kernels::DeviceEvent* ready) {
  kernels::Device& device = *state.params.device();
  const kernels::ExecutionContext& on = ready != nullptr ? device.side() : device.compute();
  if (ready != nullptr) device.Wait(on, *ready);
  out->step = state.step;
  out->epoch = state.cursor.epoch;
  out->cursor = checkpoint::DataCursor{state.cursor.epoch, state.cursor.offset};
  out->rng_state = RngState(spec);
  out->optimizer =
      checkpoint::OptimizerInfo{state.optimizer.TypeName(), state.optimizer.steps_taken()};
  const std::vector<TensorView> views = Views(state, nullptr, layout);
  out->tensors.resize(views.size());
  for (size_t k = 0; k < views.size(); ++k) {
    checkpoint::NamedTensor& tensor = out->tensors[k];
    if (tensor.name != views[k].name) tensor.name = views[k].name;
    tensor.dtype = views[k].dtype;
    tensor.shape = views[k].shape;
    tensor.bytes.resize(views[k].bytes);
    if (views[k].on_device) {
      device.CopyToHost(on, tensor.bytes.data(), views[k].data, views[k].bytes);
    } else {
      std::memcpy(tensor.bytes.data(), views[k].data, views[k].bytes);
    }
  }
  device.Synchronize(on);
}

Status CheckpointFitsModel(const checkpoint::Manifest& manifest, const TrainingState& state,
                           const ParameterLayout& layout) {
  if (manifest.optimizer.type != state.optimizer.TypeName()) {
    return FailedPreconditionError("it holds " + manifest.optimizer.type +
                                   " optimizer state; the manifest asks for " +
                                   state.optimizer.TypeName());
  }
  std::map<std::string, const checkpoint::TensorEntry*> by_name;
  for (const checkpoint::TensorEntry& tensor : manifest.tensors) by_name[tensor.name] = &tensor;
  for (const TensorView& view : Views(state, nullptr, layout)) {
    if (view.name == "accounting/sample_counts") continue;  // reset when it does not fit
    auto found = by_name.find(view.name);
    if (found == by_name.end()) {
      return FailedPreconditionError("it has no tensor " + view.name +
                                     " (written for a different model?)");
    }
    if (found->second->dtype != view.dtype || found->second->shape != view.shape) {
      return FailedPreconditionError(
          "tensor " + view.name + " is " + found->second->dtype +
          checkpoint::ShapeText(found->second->shape) + ", this model's " + view.dtype +
          checkpoint::ShapeText(view.shape) + " (written for a different model?)");
    }
  }
  return OkStatus();
}

Status RestoreFromCheckpointState(const checkpoint::CheckpointState& checkpoint,
                                  const ParameterLayout& layout, const spec::TrainerSpec& spec,
                                  TrainingState* state) {
  // The loader's checks (its manifest's table, then the fit to this model), before anything
  // changes: every tensor's bytes then match this model's view of it.
  const checkpoint::Manifest table = checkpoint::BuildManifest(checkpoint, 1, false);
  Status fits = checkpoint::CheckTensorTable(table);
  if (fits.ok()) fits = CheckpointFitsModel(table, *state, layout);
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
  if (!restore_counts && !state->sample_counts.empty()) {
    LOCKSTEP_LOG(WARNING) << "checkpoint of step " << checkpoint.step
                          << " has no sample counts for this data set: accounting restarts";
    std::fill(state->sample_counts.begin(), state->sample_counts.end(), 0);
  }
  const std::vector<TensorView> views = Views(*state, state, layout);
  kernels::Device& device = *state->params.device();
  for (const TensorView& view : views) {
    if (view.name == "accounting/sample_counts" && !restore_counts) continue;
    if (view.on_device) {
      device.CopyToDevice(device.compute(), view.mutable_data, by_name[view.name]->bytes.data(),
                          view.bytes);
    } else {
      std::memcpy(view.mutable_data, by_name[view.name]->bytes.data(), view.bytes);
    }
  }
  device.Synchronize(device.compute());
  state->step = checkpoint.step;
  state->cursor = DataCursor{checkpoint.cursor.epoch, checkpoint.cursor.offset};
  state->optimizer.set_steps_taken(checkpoint.optimizer.step);
  return OkStatus();
}

}  // namespace lockstep::trainer
