#include "worker/trainer/pipeline_schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace lockstep::trainer {

const char* PipelineScheduleName(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::kGPipe ? "gpipe" : "1f1b";
}

std::vector<PipelineAction> StageSchedule(PipelineSchedule schedule, int stages, int stage,
                                          int micro_batches) {
  std::vector<PipelineAction> actions;
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1) return actions;
  actions.reserve(2 * static_cast<size_t>(micro_batches));
  if (schedule == PipelineSchedule::kGPipe) {
    for (int m = 0; m < micro_batches; ++m) actions.push_back({PipelineAction::kForward, m});
    for (int m = micro_batches - 1; m >= 0; --m) {
      actions.push_back({PipelineAction::kBackward, m});
    }
    return actions;
  }
  // 1F1B: warm up with the forwards the later stages need before the first backward comes
  // back, then one forward and one backward in turn, then the remaining backwards.
  const int warmup = std::min(stages - 1 - stage, micro_batches);
  int forwards = 0, backwards = 0;
  for (; forwards < warmup; ++forwards) actions.push_back({PipelineAction::kForward, forwards});
  while (forwards < micro_batches) {
    actions.push_back({PipelineAction::kForward, forwards++});
    actions.push_back({PipelineAction::kBackward, backwards++});
  }
  while (backwards < micro_batches) actions.push_back({PipelineAction::kBackward, backwards++});
  return actions;
}

int PeakActivationsHeld(const std::vector<PipelineAction>& actions) {
  int held = 0, peak = 0;
  for (const PipelineAction& action : actions) {
    held += action.kind == PipelineAction::kForward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

StatusOr<std::vector<int>> BalanceStages(const std::vector<double>& layer_costs, int stages) {
  const int layers = static_cast<int>(layer_costs.size());
  if (stages < 1 || stages > layers) {
    return InvalidArgumentError("cannot split " + std::to_string(layers) + " layers into " +
                                std::to_string(stages) +
                                " stages: a stage holds at least one layer");
  }
  for (int l = 0; l < layers; ++l) {
    if (!(layer_costs[l] >= 0) || std::isinf(layer_costs[l])) {
      return InvalidArgumentError("layer " + std::to_string(l) + " has cost " +
                                  std::to_string(layer_costs[l]));
    }
  }
  std::vector<double> prefix(layers + 1, 0.0);
  for (int l = 0; l < layers; ++l) prefix[l + 1] = prefix[l] + layer_costs[l];
  // best[s][l]: the least possible cost of the costliest stage when layers [0, l) form s stages;
  // cut[s][l]: where the last of those stages begins. O(stages x layers^2): models have tens of
  // layers.
  constexpr double kNone = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(layers + 1, kNone));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(layers + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int l = s; l <= layers - (stages - s); ++l) {
      // The last stage is [k, l); the earlier ones [0, k). Scanning k downwards and keeping
      // only a strictly better cost makes ties go to the larger earlier stages.
      for (int k = l - 1; k >= s - 1; --k) {
        const double cost = std::max(best[s - 1][k], prefix[l] - prefix[k]);
        if (cost < best[s][l]) {
          best[s][l] = cost;
          cut[s][l] = k;
        }
      }
    }
  }
  std::vector<int> first(stages + 1);
  first[stages] = layers;
  for (int s = stages, l = layers; s >= 1; --s) {
    l = cut[s][l];
    first[s - 1] = l;
  }
  return first;
}

StatusOr<std::vector<int>> PipelineStageBoundaries(const spec::PipelineSpec& spec,
                                                   const std::vector<int64_t>& layer_ins,
                                                   const std::vector<int64_t>& layer_outs) {
  const int layers = static_cast<int>(layer_ins.size());
  if (!spec.stage_layers.empty()) {
    std::vector<int> first{0};
    for (int32_t count : spec.stage_layers) first.push_back(first.back() + count);
    if (static_cast<int>(spec.stage_layers.size()) != spec.stages || first.back() != layers) {
      return InvalidArgumentError("spec.trainer.pipeline.stageLayers: must have " +
                                  std::to_string(spec.stages) + " entries adding up to the " +
                                  "model's " + std::to_string(layers) + " layers");
    }
    return first;
  }
  std::vector<double> costs;
  for (int l = 0; l < layers; ++l) {
    costs.push_back(3.0 * static_cast<double>(layer_ins[static_cast<size_t>(l)]) *
                    static_cast<double>(layer_outs[static_cast<size_t>(l)]));
  }
  StatusOr<std::vector<int>> balanced = BalanceStages(costs, spec.stages);
  if (!balanced.ok()) {
    return InvalidArgumentError("spec.trainer.pipeline.stages: " + balanced.status().message());
  }
  return balanced;
}

}  // namespace lockstep::trainer
