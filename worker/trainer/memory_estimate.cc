#include "worker/trainer/memory_estimate.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <vector>

#include "worker/trainer/pipeline_schedule.h"

namespace lockstep::trainer {
namespace {

constexpr double kFloatBytes = 4;
// The batch stager keeps this many batches in flight (batch_stager.h's kSlots).
constexpr double kStagedBatches = 2;

}  // namespace

std::string FormatBytes(double bytes) {
  static const char* const kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 6) {
    bytes /= 1024;
    ++unit;
  }
  char text[64];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%.0f bytes", bytes);
  } else {
    std::snprintf(text, sizeof text, bytes < 10 ? "%.1f %s" : "%.0f %s", bytes, kUnits[unit]);
  }
  return text;
}

std::string MemoryEstimate::Describe() const {
  const std::string parameters_text =
      parameters == std::numeric_limits<int64_t>::max() ? "more than 2^63"
                                                        : std::to_string(parameters);
  return FormatBytes(total()) + " (" +
         (stages > 1 ? "stage " + std::to_string(stage) + " of " + std::to_string(stages) + ": "
                     : std::string()) +
         "model " + FormatBytes(model_bytes) + " for " + parameters_text + " parameters; batch " +
         FormatBytes(batch_bytes) + "; data " + FormatBytes(data_bytes) + ")";
}

namespace {

// Layers [first, last) of `widths` (widths[l] feeds layer l; all of them without a pipeline):
// their state, and `workspaces` sets of activations for `rows` samples each. A pipeline stage
// also keeps `slots` micro-batches' inputs (a later stage) and message buffers; only the stages
// holding the first or last layer stage batches (features, labels).
MemoryEstimate EstimateLayers(const spec::TrainerSpec& trainer, const DataShape& shape,
                              const std::vector<double>& widths, int first, int last, double rows,
                              double workspaces, int slots) {
  MemoryEstimate estimate;
  const double samples = static_cast<double>(shape.train_samples + shape.test_samples);
  estimate.data_bytes = samples * (static_cast<double>(shape.features) + 1) * kFloatBytes;
  const int layers = static_cast<int>(widths.size()) - 1;
  const double activation_copies = trainer.model.activation == spec::Activation::kGelu ? 2 : 1;
  double parameters = 0, activations = 0, widest = 0;
  for (int l = first; l < last; ++l) {
    const double in = widths[static_cast<size_t>(l)], out = widths[static_cast<size_t>(l) + 1];
    parameters += in * out + out;
    activations += out * (l + 1 < layers ? activation_copies : 1);
    widest = std::max({widest, in, out});
  }
  estimate.parameters =
      parameters >= 9.2e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(parameters);
  // Parameters, gradients, one host copy (initial values, checkpoint snapshots), optimizer state;
  // on a GPU only the host copy is host memory. bf16 precision adds the rounded copies of the
  // parameters and of a batch's input (model.h), held in fp32.
  const bool on_gpu = trainer.device == spec::Device::kCuda;
  const double optimizer_slots = trainer.optimizer.type == spec::OptimizerType::kAdamW ? 2 : 1;
  const bool bf16 = trainer.precision == spec::Precision::kBf16;
  estimate.model_bytes =
      parameters * (on_gpu ? 1 : 3 + optimizer_slots + (bf16 ? 1 : 0)) * kFloatBytes;
  const double input = widths[static_cast<size_t>(first)];
  const double output = widths[static_cast<size_t>(last)];
  // Per workspace: the layers' outputs, two activation-gradient buffers, bf16's rounded input.
  const double workspace = activations + 2 * widest + (bf16 ? input : 0);
  // A later stage keeps each micro-batch's input and sends its gradient; an earlier one
  // receives its output's gradient.
  const double messages = (first > 0 ? (slots + 1) * input : 0) + (last < layers ? output : 0);
  const bool reads_batch = first == 0 || last == layers;
  const double staged = reads_batch ? kStagedBatches * static_cast<double>(trainer.batch_size) *
                                          (static_cast<double>(shape.features) + 1)
                                    : 0;
  estimate.batch_bytes =
      ((on_gpu ? 0 : rows * (workspaces * workspace + messages)) + staged) * kFloatBytes;
  return estimate;
}

std::vector<double> Widths(const spec::TrainerSpec& trainer, const DataShape& shape) {
  std::vector<double> widths{static_cast<double>(shape.features)};
  for (int32_t width : trainer.model.hidden) widths.push_back(width);
  widths.push_back(std::max<int32_t>(shape.classes, 2));
  return widths;
}

}  // namespace

MemoryEstimate EstimateRankMemory(const spec::TrainerSpec& trainer, const DataShape& shape) {
  if (trainer.pipeline.stages <= 1) return EstimateRankMemoryWithoutPipeline(trainer, shape);
  const std::vector<double> widths = Widths(trainer, shape);
  // The stages' layers as the trainer splits them (pipeline_schedule.h).
  std::vector<int64_t> ins, outs;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    ins.push_back(static_cast<int64_t>(widths[l]));
    outs.push_back(static_cast<int64_t>(widths[l + 1]));
  }
  StatusOr<std::vector<int>> first = PipelineStageBoundaries(trainer.pipeline, ins, outs);
  if (!first.ok()) return EstimateRankMemoryWithoutPipeline(trainer, shape);
  const PipelineSchedule schedule = trainer.pipeline.schedule == spec::PipelineSchedule::kGpipe
                                        ? PipelineSchedule::kGPipe
                                        : PipelineSchedule::k1F1B;
  MemoryEstimate largest;
  const int stages = static_cast<int>(first->size()) - 1;
  for (int s = 0; s < stages; ++s) {
    const int slots =
        PeakActivationsHeld(StageSchedule(schedule, stages, s, trainer.pipeline.micro_batches));
    // With recompute, one workspace serves every micro-batch.
    MemoryEstimate stage = EstimateLayers(
        trainer, shape, widths, (*first)[static_cast<size_t>(s)],
        (*first)[static_cast<size_t>(s) + 1],
        static_cast<double>(trainer.batch_size) / std::max(1, trainer.pipeline.micro_batches),
        trainer.pipeline.recompute ? 1 : slots, slots);
    stage.stage = s;
    stage.stages = stages;
    if (s == 0 || stage.total() > largest.total()) largest = stage;
  }
  return largest;
}

MemoryEstimate EstimateRankMemoryWithoutPipeline(const spec::TrainerSpec& trainer,
                                                 const DataShape& shape) {
  const std::vector<double> widths = Widths(trainer, shape);
  return EstimateLayers(trainer, shape, widths, 0, static_cast<int>(widths.size()) - 1,
                        static_cast<double>(trainer.batch_size), 1, 1);
}

double MachineMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  double bytes = pages > 0 && page_size > 0 ? static_cast<double>(pages) * page_size : 0;
  // cgroup v2: "max" or a byte count.
  std::ifstream limit("/sys/fs/cgroup/memory.max");
  std::string text;
  if (limit >> text && text != "max") {
    char* end = nullptr;
    const double cgroup = std::strtod(text.c_str(), &end);
    if (end != text.c_str() && *end == '\0' && cgroup > 0) {
      bytes = bytes > 0 ? std::min(bytes, cgroup) : cgroup;
    }
  }
  return bytes;
}

}  // namespace lockstep::trainer
