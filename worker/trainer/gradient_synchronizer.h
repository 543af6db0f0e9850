// GradientSynchronizer: the DDP engine's communication half. It all-reduces the gradient buckets
// of one step on a dedicated communication thread while backward is still producing the
// remaining gradients.
//
// Protocol of one step (main thread = the thread running backward):
//
//   sync.BeginStep(grads, loss_scale);
//   model.ForwardBackward(..., [&](int b) { sync.OnLayerReady(b); });   // enqueues buckets
//   LOCKSTEP_RETURN_IF_ERROR(sync.Wait(&stats));   // all buckets reduced: grads hold the SUM
//
// Ordering: buckets are enqueued strictly in bucket order (a bucket becomes ready when backward
// finishes its last layer, and backward finishes layers in backward order), and the single
// communication thread issues them in queue order. Every rank computes the same buckets from the
// same layout (buckets.h), so every rank issues the same collectives in the same order, the
// contract the communicator requires. No negotiation between ranks is needed (unlike Horovod's
// coordinator) because the model, and hence the order, is static.
//
// Compression (allreduce.compression bf16|fp16): each bucket is packed to 16-bit floats (fp16
// multiplied by the loss scale first so small gradients survive), reduced, and unpacked (divided
// by the loss scale). When the communicator cannot reduce 16-bit types (it answers
// UNIMPLEMENTED, before any traffic, identically on every rank), the engine switches for good to
// all-gathering the packed halves and summing them in float locally, in rank order, so every rank
// computes bit-identical sums (host memory: CPU devices only; on a GPU the communicator is NCCL,
// which reduces both 16-bit types). Bytes on the wire: a ring all-reduce of floats moves 8(W-1)/W bytes
// per element per rank, a ring all-gather of halves 2(W-1): half the bytes at W = 2, equal at
// W = 4, more beyond; native 16-bit reduction, where the backend has it, always halves them.
//
// Deep Gradient Compression (sync.strategy dgc, dgc.h): buckets of at least minBucketElements
// entries are exchanged sparsely (momentum-corrected top-k, all-gathered) and hold, after Wait,
// the update the optimizer applies WITHOUT its momentum or weight decay (MomentumFreeRanges: dgc
// adds both locally); smaller buckets are all-reduced as above. The trainer drops the residuals
// at checkpoint steps and after a failed step (dgc.h).
//
// A world of one issues no collective at all (and so does not compress either).
//
// Devices (kernels/device.h): the gradients are device memory. OnLayerReady, on the main thread,
// records an event on the compute stream right after backward queued the bucket's last kernel;
// the communication thread makes the device's side stream wait for that event before it packs the
// bucket or hands it to the communicator (which orders its collective after the side stream:
// CommunicatorOptions::cuda_stream). So a bucket goes on the wire as soon as ITS gradients exist
// on the GPU, while later layers' backward kernels still run: the host queues all of backward
// long before the GPU finishes it, so ordering on anything coarser would serialise. Wait, once
// every bucket is reduced, makes the compute stream wait for the side stream (the unpacking), so
// the optimizer update that follows reads reduced gradients. On the CPU device the events are
// no-ops and both streams are the calling thread.
//
// Leaving a generation together: when a member joins, the rendezvous ends the generation while
// every current member is alive and possibly inside a collective. Rather than aborting (which
// loses the step, and which libgloo cannot do to a blocked call anyway), each step starts with a
// one-element MAX all-reduce of every rank's "leave" vote, issued on the communication thread
// before the first bucket, so it overlaps forward and backward and costs no exposed time. All
// ranks read the same reduced vote in Wait (StepCommStats::leave_agreed) and so all finish this
// same step, apply it, and leave the generation at the same step boundary.
//
// Overflow (fp16): a non-finite value after unpacking sets StepCommStats::overflow; since every
// rank holds the same reduced values, every rank sees the same flag and skips the same step.
//
// Thread safety: BeginStep, OnLayerReady and Wait are called by one thread (the main thread).
// The communicator must outlive the synchronizer and is used only by the communication thread
// between BeginStep and Wait's return; outside that window the caller may use it directly.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/spec/training_job.h"
#include "common/status.h"
#include "kernels/device.h"
#include "kernels/kernels.h"
#include "worker/comm/communicator.h"
#include "worker/trainer/buckets.h"
#include "worker/trainer/dgc.h"

namespace lockstep::trainer {

struct SynchronizerOptions {
  spec::Compression compression = spec::Compression::kNone;
  int64_t timeout_ms = 300000;  // per collective (allreduce.timeoutSeconds)
  // Deep Gradient Compression (sync.strategy dgc): its residuals live as long as the trainer,
  // across generations, so the exchanger is the trainer's and outlives the synchronizer.
  DgcExchanger* dgc = nullptr;
};

// What one step's communication cost.
struct StepCommStats {
  double exposed_seconds = 0;    // Wait's blocking time: communication not hidden by backward
  double allreduce_seconds = 0;  // sum over buckets of the collective's own duration
  int64_t wire_bytes = 0;        // payload bytes handed to the collectives (halves when packed)
  int64_t reduced_bytes = 0;     // float32 bytes of gradient reduced
  std::vector<double> bucket_seconds;
  std::vector<int64_t> bucket_wire_bytes;
  bool overflow = false;  // a non-finite reduced gradient (fp16: skip the step)
  // Some rank voted to leave the generation at this step (see the file comment); every rank
  // reads the same value.
  bool leave_agreed = false;
};

class GradientSynchronizer {
 public:
  // The device must outlive the synchronizer. Allocation failures of the 16-bit buffers surface as
  // the first step's error.
  GradientSynchronizer(comm::Communicator& communicator, kernels::Device& device,
                       std::vector<GradientBucket> buckets, const SynchronizerOptions& options);
  // Stops the communication thread. Aborts the communicator first if a collective is in flight,
  // so destruction never waits on peers.
  ~GradientSynchronizer();

  GradientSynchronizer(const GradientSynchronizer&) = delete;
  GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

  const std::vector<GradientBucket>& buckets() const { return buckets_; }
  // True once the engine fell back from native 16-bit all-reduce to all-gather.
  bool using_allgather_fallback() const { return use_allgather_.load(); }
  // The buckets exchanged sparsely (dgc), as (offset, count) of the flat buffer, ascending: after
  // Wait their gradients already carry the momentum (dgc's momentum correction). Empty without
  // dgc, or in a world of one (which sends nothing and so compresses nothing).
  const std::vector<ParamRange>& MomentumFreeRanges() const { return momentum_free_; }

  // Starts a step whose gradients will be written to `grads` (the flat gradient buffer, device
  // memory).
  // loss_scale multiplies gradients before fp16 packing (ignored otherwise). leave_vote: this
  // rank asks every rank to leave the generation after this step. step: the step's index (dgc's
  // density); params: the parameters the gradients are of (dgc's weight decay; host memory).
  void BeginStep(float* grads, float loss_scale, bool leave_vote = false, int64_t step = 0,
                 const float* params = nullptr);
  // Backward finished layer `backward_layer`: enqueues every bucket that is now complete.
  void OnLayerReady(int backward_layer);
  // Blocks until every bucket of the step is reduced (OK), a collective failed (its error;
  // the communicator is then unusable), or the collectives' deadline plus slack passed
  // (DEADLINE_EXCEEDED after aborting the communicator).
  Status Wait(StepCommStats* stats);

 private:
  void CommunicationLoop();
  // Pops the queue's front bucket and reduces it with mu_ released. Requires mu_ held (through
  // `lock`) and a non-empty queue.
  void ReduceNextQueuedBucket(std::unique_lock<std::mutex>& lock);
  Status ReduceBucket(size_t index, double* seconds, int64_t* wire_bytes);
  Status ReduceHalfBucket(const GradientBucket& bucket, float* slice, int64_t* wire_bytes);
  Status ExchangeSparseBucket(size_t index, float* slice, int64_t* wire_bytes);

  comm::Communicator& comm_;
  kernels::Device& device_;
  const std::vector<GradientBucket> buckets_;
  const SynchronizerOptions options_;
  std::atomic<bool> use_allgather_{false};

  // Per bucket: recorded on the compute stream once backward queued the bucket's gradients.
  std::vector<std::unique_ptr<kernels::DeviceEvent>> bucket_ready_;
  // Recorded on the side stream at the end of a step's communication.
  std::unique_ptr<kernels::DeviceEvent> reduced_;

  // Buffers for the 16-bit path, owned by the communication thread.
  Status half_allocation_;            // why half_ could not be allocated, or OK
  kernels::DeviceArray<uint16_t> half_;  // device: one region per bucket, same offsets as floats
  std::vector<uint16_t> gathered_;  // [world, largest bucket] for the all-gather fallback
  std::vector<float> unpacked_;     // [largest bucket]
  // dgc: which buckets the exchanger (options_.dgc; used on the communication thread) takes.
  std::vector<bool> sparse_;
  std::vector<ParamRange> momentum_free_;

  std::mutex mu_;
  std::condition_variable work_cv_;  // communication thread waits for buckets
  std::condition_variable done_cv_;  // main thread waits for completion
  std::deque<size_t> queue_;         // bucket indices, or kControlItem for the leave vote
  static constexpr size_t kControlItem = static_cast<size_t>(-1);
  int64_t leave_vote_ = 0;  // in: this rank's vote; out: the MAX over ranks
  bool control_done_ = false;
  bool shutdown_ = false;
  bool busy_ = false;  // a collective is in flight
  float* grads_ = nullptr;
  float loss_scale_ = 1.0f;
  int64_t step_ = 0;
  const float* params_ = nullptr;
  size_t next_bucket_ = 0;  // next bucket to enqueue (main thread)
  size_t done_buckets_ = 0;
  Status step_status_;
  bool overflow_ = false;
  std::vector<double> bucket_seconds_;
  std::vector<int64_t> bucket_wire_bytes_;
  std::thread thread_;
};

}  // namespace lockstep::trainer
