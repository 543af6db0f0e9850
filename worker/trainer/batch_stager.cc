#include "worker/trainer/batch_stager.h"

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common/env.h"
#include "common/logging.h"

namespace lockstep::trainer {
namespace {

// Batches smaller than this are gathered by the training thread alone: below it, starting
// threads costs more than it saves.
constexpr int64_t kParallelGatherBytes = 1 << 20;

int GatherThreads() {
  static const int threads = [] {
    const int64_t configured = EnvInt("LOCKSTEP_GATHER_THREADS", 0);
    if (configured > 0) return static_cast<int>(std::min<int64_t>(configured, 64));
    return static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 4u));
  }();
  return threads;
}

}  // namespace

StatusOr<BatchStager> BatchStager::Create(kernels::Device& device, int64_t max_rows,
                                          int64_t num_features) {
  BatchStager stager;
  stager.device_ = &device;
  stager.max_rows_ = max_rows;
  stager.num_features_ = num_features;
  stager.gather_threads_ = GatherThreads();
  for (int slot = 0; slot < kSlots; ++slot) {
    LOCKSTEP_RETURN_IF_ERROR(stager.host_features_[slot].Allocate(device, max_rows * num_features));
    LOCKSTEP_RETURN_IF_ERROR(stager.host_labels_[slot].Allocate(device, max_rows));
    LOCKSTEP_RETURN_IF_ERROR(stager.features_[slot].Allocate(device, max_rows * num_features));
    LOCKSTEP_RETURN_IF_ERROR(stager.labels_[slot].Allocate(device, max_rows));
    stager.copied_[slot] = device.CreateEvent();
    stager.released_[slot] = device.CreateEvent();
  }
  return stager;
}

BatchStager::DeviceBatch BatchStager::Stage(const Dataset& dataset, const int64_t* ids,
                                            int64_t rows) {
  if (rows > max_rows_) {
    LOCKSTEP_LOG(ERROR) << "BatchStager::Stage: " << rows << " rows, room for " << max_rows_;
    std::abort();  // a programming error: the trainer sizes the stager for its largest slice
  }
  const int slot = next_slot_;
  const int other = (slot + 1) % kSlots;
  next_slot_ = other;
  const kernels::ExecutionContext& compute = device_->compute();
  const kernels::ExecutionContext& side = device_->side();
  // Everything queued on the compute stream so far is the work of the steps up to the previous
  // one, which read the other slot: once it is done, the other slot may be refilled.
  device_->Record(*released_[other], compute);
  // The copy that last read this host slot (two steps ago) must be done before it is overwritten.
  device_->WaitHost(*copied_[slot]);
  Gather(dataset, ids, rows, slot);
  device_->Wait(side, *released_[slot]);
  device_->CopyToDevice(side, features_[slot].device_data(), host_features_[slot].data(),
                        static_cast<size_t>(rows * num_features_) * sizeof(float));
  device_->CopyToDevice(side, labels_[slot].device_data(), host_labels_[slot].data(),
                        static_cast<size_t>(rows) * sizeof(int32_t));
  device_->Record(*copied_[slot], side);
  device_->Wait(compute, *copied_[slot]);
  return DeviceBatch{features_[slot].device_data(), labels_[slot].device_data()};
}

void BatchStager::Gather(const Dataset& dataset, const int64_t* ids, int64_t rows, int slot) {
  const int64_t bytes = rows * num_features_ * static_cast<int64_t>(sizeof(float));
  const int threads = bytes >= kParallelGatherBytes ? gather_threads_ : 1;
  auto part = [&](int t) {
    const int64_t lo = rows * t / threads, hi = rows * (t + 1) / threads;
    GatherBatch(dataset, ids + lo, hi - lo, host_features_[slot].data() + lo * num_features_,
                host_labels_[slot].data() + lo);
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(part, t);
  part(0);
  for (std::thread& helper : helpers) helper.join();
}

}  // namespace lockstep::trainer
