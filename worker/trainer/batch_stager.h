// BatchStager: moves the training batches the host gathers onto the trainer's device.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(BatchStager stager, BatchStager::Create(device, batch, features));
//   BatchStager::DeviceBatch batch = stager.Stage(dataset, ids, rows);  // device pointers
//   model.ForwardBackward(device.compute(), params, batch.features, batch.labels, rows, ...);
//
// Two page-locked host slots, used in turn: the host gathers step t+1's samples into one slot
// while the GPU still computes step t, and the copy into device memory is queued on the compute
// stream (so it follows step t's kernels, which read the device batch, and precedes step t+1's).
// Before a slot is refilled the host waits for the copy that read it two steps earlier: that is
// also what keeps the host from running more than two steps ahead of the GPU. On the CPU device
// the slots are plain memory and the copy is a memcpy of one batch (a few hundred KB).
//
// Thread safety: used by the training thread only.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "kernels/device.h"
#include "worker/trainer/dataset.h"

namespace lockstep::trainer {

class BatchStager {
 public:
  struct DeviceBatch {
    const float* features;  // [rows, num_features], device memory
    const int32_t* labels;  // [rows], device memory
  };

  // Buffers for batches of up to max_rows samples of num_features each. RESOURCE_EXHAUSTED when
  // they do not fit.
  static StatusOr<BatchStager> Create(kernels::Device& device, int64_t max_rows,
                                      int64_t num_features);

  // Gathers samples ids[0..rows) (rows <= max_rows) and queues their copy to the device. The
  // returned memory holds them for the kernels queued on the compute stream until the next Stage.
  DeviceBatch Stage(const Dataset& dataset, const int64_t* ids, int64_t rows);

 private:
  static constexpr int kSlots = 2;
  BatchStager() = default;

  kernels::Device* device_ = nullptr;
  int64_t max_rows_ = 0;
  int64_t num_features_ = 0;
  kernels::HostArray<float> host_features_[kSlots];
  kernels::HostArray<int32_t> host_labels_[kSlots];
  std::unique_ptr<kernels::DeviceEvent> copied_[kSlots];
  kernels::DeviceArray<float> features_;
  kernels::DeviceArray<int32_t> labels_;
  int next_slot_ = 0;
};

}  // namespace lockstep::trainer
