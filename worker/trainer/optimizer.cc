#include "worker/trainer/optimizer.h"

namespace lockstep::trainer {

double LearningRate(const spec::OptimizerSpec& optimizer, int64_t step, int64_t batches_per_step) {
  double lr = optimizer.learning_rate;
  if (optimizer.lr_scaling == spec::LrScaling::kLinear) lr *= static_cast<double>(batches_per_step);
  if (optimizer.warmup_steps > 0 && step < optimizer.warmup_steps) {
    lr *= static_cast<double>(step + 1) / static_cast<double>(optimizer.warmup_steps);
  }
  return lr;
}

Optimizer::Optimizer(const spec::OptimizerSpec& spec, int64_t num_params)
    : spec_(spec), num_params_(num_params) {}

Status Optimizer::Allocate(kernels::Device& device) {
  LOCKSTEP_RETURN_IF_ERROR(state_a_.Allocate(device, num_params_));
  if (spec_.type == spec::OptimizerType::kAdamW) {
    LOCKSTEP_RETURN_IF_ERROR(state_b_.Allocate(device, num_params_));
  }
  return OkStatus();
}

void Optimizer::Step(const kernels::ExecutionContext& ctx, float lr, float* params,
                     const float* grads, const std::vector<ParamRange>& momentum_free) {
  switch (spec_.type) {
    case spec::OptimizerType::kSgd: {
      // Alternating runs of the buffer: with the momentum, then one momentum-free slice.
      const auto update = [&](int64_t offset, int64_t count, double momentum,
                              double weight_decay) {
        if (count <= 0) return;
        kernels::SgdMomentumUpdate(ctx, count, lr, static_cast<float>(momentum),
                                   static_cast<float>(weight_decay),
                                   /*first_step=*/steps_taken_ == 0, params + offset,
                                   grads + offset, state_a_.device_data() + offset);
      };
      int64_t next = 0;
      for (const ParamRange& range : momentum_free) {
        update(next, range.offset - next, spec_.momentum, spec_.weight_decay);
        update(range.offset, range.count, 0.0, 0.0);
        kernels::SetZero(ctx, range.count, state_a_.device_data() + range.offset);
        next = range.offset + range.count;
      }
      update(next, num_params_ - next, spec_.momentum, spec_.weight_decay);
      break;
    }
    case spec::OptimizerType::kAdamW:
      kernels::AdamWUpdate(ctx, num_params_, lr, static_cast<float>(spec_.beta1),
                           static_cast<float>(spec_.beta2), static_cast<float>(spec_.epsilon),
                           static_cast<float>(spec_.weight_decay), steps_taken_ + 1, params, grads,
                           state_a_.device_data(), state_b_.device_data());
      break;
  }
  ++steps_taken_;
}

std::vector<std::pair<float*, int64_t>> Optimizer::StateBuffers() {
  std::vector<std::pair<float*, int64_t>> buffers{{state_a_.device_data(), num_params_}};
  if (!state_b_.empty()) buffers.emplace_back(state_b_.device_data(), num_params_);
  return buffers;
}

std::vector<std::pair<const float*, int64_t>> Optimizer::StateBuffers() const {
  std::vector<std::pair<const float*, int64_t>> buffers{{state_a_.device_data(), num_params_}};
  if (!state_b_.empty()) buffers.emplace_back(state_b_.device_data(), num_params_);
  return buffers;
}

std::vector<std::string> Optimizer::StateBufferNames() const {
  if (spec_.type == spec::OptimizerType::kAdamW) return {"exp_avg", "exp_avg_sq"};
  return {"momentum"};
}

std::string Optimizer::TypeName() const {
  return spec_.type == spec::OptimizerType::kAdamW ? "adamw" : "sgd";
}

}  // namespace lockstep::trainer
