// BatchStager: moves the training batches the host gathers onto the trainer's device.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(BatchStager stager, BatchStager::Create(device, batch, features));
//   BatchStager::DeviceBatch batch = stager.Stage(dataset, ids, rows);  // device pointers
//   model.ForwardBackward(device.compute(), params, batch.features, batch.labels, rows, ...);
//
// Two slots, used in turn, each a page-locked host buffer and a device buffer: the host gathers
// step t's samples into slot t % 2 while the GPU still computes step t-1, and the copy to the
// device runs on the device's side stream, overlapping that computation (on an H100 an 8 MiB
// batch takes ~0.3 ms over PCIe: 15% of a GEMM-bound 4096-wide MLP step when it was queued on the
// compute stream instead). Three events keep it correct:
//  - the copy into device slot k waits for `released[k]`, recorded on the compute stream when the
//    next step was staged: the kernels of the step that last read slot k are done;
//  - the compute stream waits for `copied[k]` before the step's kernels run;
//  - the host waits for `copied[k]` of two steps earlier before it refills host slot k, which also
//    keeps the host at most two steps ahead of the GPU.
// On the CPU device the slots are plain memory, the copy is a memcpy and the events are no-ops.
//
// Gathering is a memcpy per sample into the host slot. A batch of 1 MiB or more is gathered by
// several threads (LOCKSTEP_GATHER_THREADS, read once; default: half the cores, at most 4): at
// batch 512 of 4096 features (8 MiB) one thread's gather is about as long as an H100's whole
// training step, and the host would become the bottleneck.
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

  // Gathers samples ids[0..rows) (rows <= max_rows) and queues their copy to the device; work
  // queued on the compute stream after this call sees them. The returned memory holds them until
  // the second Stage after this one.
  DeviceBatch Stage(const Dataset& dataset, const int64_t* ids, int64_t rows);

 private:
  static constexpr int kSlots = 2;
  BatchStager() = default;
  void Gather(const Dataset& dataset, const int64_t* ids, int64_t rows, int slot);

  kernels::Device* device_ = nullptr;
  int64_t max_rows_ = 0;
  int64_t num_features_ = 0;
  kernels::HostArray<float> host_features_[kSlots];
  kernels::HostArray<int32_t> host_labels_[kSlots];
  std::unique_ptr<kernels::DeviceEvent> copied_[kSlots];
  std::unique_ptr<kernels::DeviceEvent> released_[kSlots];
  kernels::DeviceArray<float> features_[kSlots];
  kernels::DeviceArray<int32_t> labels_[kSlots];
  int next_slot_ = 0;
  int gather_threads_ = 1;
};

}  // namespace lockstep::trainer
