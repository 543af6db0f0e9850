#include "worker/trainer/gradient_synchronizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "common/deadline.h"
#include "common/logging.h"

namespace lockstep::trainer {
namespace {

// Slack on top of the collectives' own deadline before Wait gives up on the communication thread:
// the thread's collective is bounded by timeout_ms; this only guards against a backend that
// overruns it.
constexpr int64_t kWaitSlackMs = 5000;

}  // namespace

GradientSynchronizer::GradientSynchronizer(comm::Communicator& communicator,
                                           kernels::Device& device,
                                           std::vector<GradientBucket> buckets,
                                           const SynchronizerOptions& options)
    : comm_(communicator), device_(device), buckets_(std::move(buckets)), options_(options) {
  if (options_.compression != spec::Compression::kNone && comm_.size() > 1) {
    int64_t total = 0, largest = 0;
    for (const GradientBucket& bucket : buckets_) {
      total = std::max(total, bucket.offset + bucket.count);
      largest = std::max(largest, bucket.count);
    }
    half_allocation_ = half_.Allocate(device_, total);
    unpacked_.resize(static_cast<size_t>(largest));
  }
  if (comm_.size() > 1) {
    for (size_t i = 0; i < buckets_.size(); ++i) bucket_ready_.push_back(device_.CreateEvent());
    reduced_ = device_.CreateEvent();
  }
  sparse_.assign(buckets_.size(), false);
  if (options_.dgc != nullptr && comm_.size() > 1) {
    for (size_t i = 0; i < buckets_.size(); ++i) {
      sparse_[i] = options_.dgc->IsSparse(buckets_[i]);
      if (sparse_[i]) momentum_free_.push_back({buckets_[i].offset, buckets_[i].count});
    }
    std::sort(momentum_free_.begin(), momentum_free_.end(),
              [](const ParamRange& a, const ParamRange& b) { return a.offset < b.offset; });
  }
  bucket_seconds_.resize(buckets_.size());
  bucket_wire_bytes_.resize(buckets_.size());
  thread_ = std::thread([this] { CommunicationLoop(); });
}

GradientSynchronizer::~GradientSynchronizer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    if (busy_) comm_.Abort("gradient synchronizer shutting down");
  }
  work_cv_.notify_all();
  thread_.join();
}

void GradientSynchronizer::BeginStep(float* grads, float loss_scale, bool leave_vote,
                                     int64_t step, const float* params) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    grads_ = grads;
    loss_scale_ = loss_scale;
    step_ = step;
    params_ = params;
    next_bucket_ = 0;
    done_buckets_ = 0;
    step_status_ = OkStatus();
    overflow_ = false;
    queue_.clear();
    leave_vote_ = leave_vote ? 1 : 0;
    // The vote goes first on every rank, so the collective order stays identical everywhere.
    control_done_ = comm_.size() == 1;
    if (comm_.size() == 1) return;
    queue_.push_back(kControlItem);
  }
  work_cv_.notify_one();
}

void GradientSynchronizer::OnLayerReady(int backward_layer) {
  bool enqueued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (next_bucket_ < buckets_.size() &&
           buckets_[next_bucket_].last_backward_layer <= backward_layer) {
      if (comm_.size() == 1) {
        // A world of one: the sum over ranks is the rank's own gradient, and there is nothing
        // to compress on a wire that is not used. Skipping the hand-off to the communication
        // thread keeps a single worker at the speed of its compute.
        bucket_seconds_[next_bucket_] = 0;
        bucket_wire_bytes_[next_bucket_] = 0;
        ++next_bucket_;
        ++done_buckets_;
        continue;
      }
      // Backward has queued this bucket's last kernels: mark the point for the side stream.
      device_.Record(*bucket_ready_[next_bucket_], device_.compute());
      queue_.push_back(next_bucket_++);
      enqueued = true;
    }
  }
  if (enqueued) work_cv_.notify_one();
}

Status GradientSynchronizer::Wait(StepCommStats* stats) {
  const double started = MonotonicSeconds();
  const Deadline deadline = Deadline::AfterMs(
      options_.timeout_ms * static_cast<int64_t>(buckets_.size() + 1) + kWaitSlackMs);
  std::unique_lock<std::mutex> lock(mu_);
  // The main thread only waits here; it does not reduce trailing buckets itself. (Measured:
  // taking the last bucket on this thread, to save the hand-off, made 2-worker steps ~15%
  // slower on a 2-core machine.)
  const bool finished = done_cv_.wait_until(lock, deadline.at(), [this] {
    return (done_buckets_ == buckets_.size() && control_done_) || !step_status_.ok();
  });
  if (!finished) {
    comm_.Abort("gradient all-reduce overran its deadline");
    step_status_ = DeadlineExceededError(
        "gradient all-reduce: " + std::to_string(buckets_.size() - done_buckets_) +
        " bucket(s) not reduced within the deadline");
  }
  if (!step_status_.ok()) {
    // The communicator is unusable after an error; make sure a collective still in flight on the
    // communication thread ends promptly, and that no queued bucket is issued.
    queue_.clear();
    comm_.Abort(step_status_.message());
    // Wait for the thread to leave the collective so the caller may drop the communicator.
    done_cv_.wait(lock, [this] { return !busy_; });
    return step_status_;
  }
  if (comm_.size() > 1) {
    // The optimizer's kernels, queued on the compute stream next, follow the unpacking.
    device_.Record(*reduced_, device_.side());
    device_.Wait(device_.compute(), *reduced_);
  }
  if (stats != nullptr) {
    stats->exposed_seconds = MonotonicSeconds() - started;
    stats->overflow = overflow_;
    stats->leave_agreed = leave_vote_ > 0;
    stats->bucket_seconds = bucket_seconds_;
    stats->bucket_wire_bytes = bucket_wire_bytes_;
    stats->allreduce_seconds = 0;
    stats->wire_bytes = 0;
    stats->reduced_bytes = 0;
    for (size_t i = 0; i < buckets_.size(); ++i) {
      stats->allreduce_seconds += bucket_seconds_[i];
      stats->wire_bytes += bucket_wire_bytes_[i];
      stats->reduced_bytes += buckets_[i].count * static_cast<int64_t>(sizeof(float));
    }
  }
  return OkStatus();
}

void GradientSynchronizer::CommunicationLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [this] { return shutdown_ || !queue_.empty(); });
    if (shutdown_) return;
    ReduceNextQueuedBucket(lock);
  }
}

void GradientSynchronizer::ReduceNextQueuedBucket(std::unique_lock<std::mutex>& lock) {
  const size_t index = queue_.front();
  queue_.pop_front();
  if (!step_status_.ok()) return;  // a failed step issues nothing more
  busy_ = true;
  if (index == kControlItem) {
    int64_t vote = leave_vote_;
    lock.unlock();
    Status status = comm_.AllReduce(&vote, 1, comm::DataType::kInt64, comm::ReduceOp::kMax,
                                    options_.timeout_ms);
    lock.lock();
    busy_ = false;
    leave_vote_ = vote;
    control_done_ = true;
    if (!status.ok() && step_status_.ok()) {
      step_status_ = status.WithContext("all-reduce of the leave vote");
    }
    done_cv_.notify_all();
    return;
  }
  lock.unlock();
  double seconds = 0;
  int64_t wire_bytes = 0;
  Status status = ReduceBucket(index, &seconds, &wire_bytes);
  lock.lock();
  busy_ = false;
  bucket_seconds_[index] = seconds;
  bucket_wire_bytes_[index] = wire_bytes;
  if (!status.ok() && step_status_.ok()) {
    step_status_ = status.WithContext("all-reduce of gradient bucket " + std::to_string(index));
  }
  ++done_buckets_;
  done_cv_.notify_all();
}

Status GradientSynchronizer::ReduceBucket(size_t index, double* seconds, int64_t* wire_bytes) {
  const GradientBucket& bucket = buckets_[index];
  float* slice = grads_ + bucket.offset;
  const double started = MonotonicSeconds();
  device_.Wait(device_.side(), *bucket_ready_[index]);
  Status status;
  if (sparse_[index]) {
    status = ExchangeSparseBucket(index, slice, wire_bytes);
  } else if (options_.compression == spec::Compression::kNone) {
    *wire_bytes = bucket.count * static_cast<int64_t>(sizeof(float));
    status = comm_.AllReduce(slice, static_cast<size_t>(bucket.count), comm::DataType::kFloat32,
                             comm::ReduceOp::kSum, options_.timeout_ms);
  } else {
    status = ReduceHalfBucket(bucket, slice, wire_bytes);
  }
  *seconds = MonotonicSeconds() - started;
  return status;
}

Status GradientSynchronizer::ExchangeSparseBucket(size_t index, float* slice,
                                                  int64_t* wire_bytes) {
  // Read under no lock: step_ and params_ are set before the step's first item is queued.
  DgcExchanger& dgc = *options_.dgc;
  const GradientBucket& bucket = buckets_[index];
  DgcExchangeStats stats;
  // Host memory (dgc runs on cpu devices): the side stream's wait above is the ordering.
  LOCKSTEP_RETURN_IF_ERROR(dgc.Exchange(comm_, index, slice, params_ + bucket.offset, bucket.count,
                                        dgc.Density(step_), step_, options_.timeout_ms, &stats));
  *wire_bytes = stats.wire_bytes;
  return OkStatus();
}

Status GradientSynchronizer::ReduceHalfBucket(const GradientBucket& bucket, float* slice,
                                              int64_t* wire_bytes) {
  const bool fp16 = options_.compression == spec::Compression::kFp16;
  const kernels::HalfType half_type = fp16 ? kernels::HalfType::kFp16 : kernels::HalfType::kBf16;
  const comm::DataType comm_type = fp16 ? comm::DataType::kFloat16 : comm::DataType::kBFloat16;
  // bf16 has float's exponent range: no scaling needed.
  const float scale = fp16 ? loss_scale_ : 1.0f;
  LOCKSTEP_RETURN_IF_ERROR(half_allocation_);
  const kernels::ExecutionContext& side = device_.side();
  uint16_t* packed = half_.device_data() + bucket.offset;
  const size_t count = static_cast<size_t>(bucket.count);
  *wire_bytes = bucket.count * static_cast<int64_t>(sizeof(uint16_t));
  kernels::PackHalf(side, half_type, bucket.count, scale, slice, packed);

  if (!use_allgather_.load()) {
    Status status =
        comm_.AllReduce(packed, count, comm_type, comm::ReduceOp::kSum, options_.timeout_ms);
    if (status.ok()) {
      kernels::UnpackHalf(side, half_type, bucket.count, 1.0f / scale, packed, slice);
      // A host answer: on a GPU this waits for the side stream (the unpacking), not for backward.
      if (fp16 && kernels::CountNonFinite(side, bucket.count, slice) > 0) overflow_ = true;
      return OkStatus();
    }
    if (status.code() != StatusCode::kUnimplemented) return status;
    if (device_.type() != kernels::DeviceType::kCpu) {
      return FailedPreconditionError("communicator " + comm_.backend() + " cannot reduce " +
                                     comm::DataTypeName(comm_type) +
                                     ", and the all-gather fallback sums in host memory");
    }
    LOCKSTEP_LOG(INFO) << "communicator " << comm_.backend() << " cannot reduce "
                       << comm::DataTypeName(comm_type)
                       << "; compressing by all-gather and a local float sum instead";
    use_allgather_ = true;
  }

  const int world = comm_.size();
  if (gathered_.size() < static_cast<size_t>(world) * unpacked_.size()) {
    gathered_.resize(static_cast<size_t>(world) * unpacked_.size());
  }
  LOCKSTEP_RETURN_IF_ERROR(
      comm_.AllGather(packed, count * sizeof(uint16_t), gathered_.data(), options_.timeout_ms));
  // Sum in rank order on every rank: identical inputs, identical order, identical bits.
  std::fill(slice, slice + bucket.count, 0.0f);
  for (int r = 0; r < world; ++r) {
    kernels::UnpackHalf(side, half_type, bucket.count, 1.0f / scale,
                        gathered_.data() + static_cast<size_t>(r) * count, unpacked_.data());
    for (size_t i = 0; i < count; ++i) slice[i] += unpacked_[i];
  }
  if (fp16 && kernels::CountNonFinite(side, bucket.count, slice) > 0) overflow_ = true;
  return OkStatus();
}

}  // namespace lockstep::trainer
