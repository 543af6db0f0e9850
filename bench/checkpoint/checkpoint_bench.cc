// checkpoint_bench: what a checkpoint costs training, measured on the trainer's own state.
//
//   checkpoint_bench --dir /path/on/the/storage [--hidden 2048,2048] [--optimizer sgd|adamw]
//                    [--repeats 7] [--batch 64]
//
// For a built-in MLP (784 inputs, 10 classes) on one rank, after one warm-up checkpoint (the
// first snapshot allocates its buffer), each repeat measures side by side:
//   sync stall    FillCheckpointState + CheckpointWriter::Commit (hash, write, fsync, manifest,
//                 rename): what a synchronous checkpoint stops training for. Retention, which
//                 follows the commit, is timed apart and not counted (counting it would only
//                 make the ratio below look better);
//   copy          FillCheckpointState alone: one copy of the state into a recycled buffer, the
//                 whole stall of an asynchronous checkpoint when the training thread made it;
//   async stall   an asynchronous checkpoint as the trainer takes it: at a step boundary
//                 SnapshotInBackground (the copy runs on the checkpointer's capture thread),
//                 then one real training step (forward and backward of a batch, reading the
//                 state), then WaitForCapture before the optimizer update changes the state. The
//                 stall is the time the training thread was held: the hand-over plus that wait.
//                 The step's time is printed next to a step without a checkpoint and one that
//                 overlaps only a copy on another thread: the background work (the copy, then the
//                 persist's hashing and writing) competes for this machine's cores;
//   through       what an asynchronous checkpoint costs the steps that run beside its persist:
//                 kThroughSteps steps back to back from a SnapshotInBackground at the first
//                 step's start (which waits for the copy before its update, as the trainer
//                 does) until past the persist's end, against the same number of steps without
//                 a checkpoint, in the same repeat. Their difference, over the sync stall, is
//                 the share of a synchronous save that the asynchronous one still costs training
//                 (goal <= 0.10);
//   persist       the background commit of a snapshot taken with nothing else running (from the
//                 checkpointer's report), as the plain writer runs; its retention apart;
//   plain write   fwrite of the same number of bytes in 8 MiB pieces into one new file in the
//                 same directory, fflush, fsync, close, rename: the storage's sequential write
//                 speed (dd-like), with the durability of a checkpoint's data.
// It prints one line per repeat and a JSON summary line: medians, and the spread (min, max) of
// the per-repeat ratios the goals are stated in: async stall / sync stall (goal <= 0.05) and
// checkpoint write throughput / plain write throughput (goal >= 0.8).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "kernels/kernels.h"
#include "worker/checkpoint/async_checkpointer.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/storage/storage.h"
#include "worker/trainer/checkpoint_state.h"
#include "worker/trainer/model.h"
#include "worker/trainer/optimizer.h"

namespace lockstep {
namespace {

struct Spread {
  double median = 0, min = 0, max = 0;
};

Spread SpreadOf(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  return {values[values.size() / 2], values.front(), values.back()};
}

std::vector<int32_t> ParseHidden(const std::string& text) {
  std::vector<int32_t> hidden;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) hidden.push_back(std::atoi(item.c_str()));
  return hidden;
}

// fwrite in 8 MiB pieces + fflush + fsync + close + rename: the plain sequential writer.
double PlainWrite(const std::string& dir, const std::vector<uint8_t>& bytes) {
  const std::string path = dir + "/plain.tmp";
  const double started = MonotonicSeconds();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return -1;
  constexpr size_t kPiece = 8 << 20;
  for (size_t offset = 0; offset < bytes.size(); offset += kPiece) {
    std::fwrite(bytes.data() + offset, 1, std::min(kPiece, bytes.size() - offset), file);
  }
  std::fflush(file);
  fsync(fileno(file));
  std::fclose(file);
  std::rename(path.c_str(), (dir + "/plain.bin").c_str());
  const double seconds = MonotonicSeconds() - started;
  std::remove((dir + "/plain.bin").c_str());
  return seconds;
}

// One training step of the built-in trainer on a fixed random batch: forward and backward
// (reading the parameters), then `before_update`, then the optimizer update (changing them).
class TrainingStep {
 public:
  TrainingStep(const trainer::MlpModel& model, int64_t num_features, int64_t batch)
      : model_(model), batch_(batch),
        workspace_(*trainer::MlpWorkspace::Create(model, batch, kernels::CpuDevice())) {
    std::mt19937 random(7);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    features_.resize(static_cast<size_t>(batch * num_features));
    for (float& value : features_) value = pixel(random);
    for (int64_t i = 0; i < batch; ++i) labels_.push_back(static_cast<int32_t>(random() % 10));
    if (!grads_.Allocate(kernels::CpuDevice(), model.layout().num_params).ok()) std::abort();
    if (!loss_sum_.Allocate(kernels::CpuDevice(), 1).ok()) std::abort();
  }

  // Returns the seconds of the forward and backward.
  template <typename BeforeUpdate>
  double Run(trainer::TrainingState& state, BeforeUpdate before_update) {
    const double started = MonotonicSeconds();
    model_.ForwardBackward(ctx_, state.params.device_data(), features_.data(), labels_.data(),
                           batch_, 1.0f / static_cast<float>(batch_), grads_.device_data(),
                           workspace_, nullptr, loss_sum_.device_data());
    const double forward_backward = MonotonicSeconds() - started;
    before_update();
    state.optimizer.Step(ctx_, 0.01f, state.params.device_data(), grads_.device_data());
    return forward_backward;
  }

 private:
  const trainer::MlpModel& model_;
  int64_t batch_;
  trainer::MlpWorkspace workspace_;
  std::vector<float> features_;
  std::vector<int32_t> labels_;
  kernels::DeviceArray<float> grads_;
  kernels::DeviceArray<double> loss_sum_;
  const kernels::ExecutionContext ctx_;
};

int Main(int argc, char** argv) {
  std::string dir, hidden_text = "2048,2048", optimizer = "sgd";
  int repeats = 7;
  int64_t batch = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dir") dir = value;
    if (flag == "--hidden") hidden_text = value;
    if (flag == "--optimizer") optimizer = value;
    if (flag == "--repeats") repeats = std::atoi(value.c_str());
    if (flag == "--batch") batch = std::atoll(value.c_str());
  }
  if (dir.empty() || repeats < 1 || batch < 1) {
    std::fprintf(stderr,
                 "usage: checkpoint_bench --dir DIR [--hidden 2048,2048] "
                 "[--optimizer sgd|adamw] [--repeats 7] [--batch 64]\n");
    return 2;
  }
  // One compute thread, as `lockstep run` gives each worker.
  kernels::SetCpuBlasThreads(1);
  std::filesystem::create_directories(dir);
  auto model =
      trainer::MlpModel::Create(784, ParseHidden(hidden_text), 10, kernels::ActivationType::kRelu);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 2;
  }
  spec::TrainerSpec spec;
  spec.optimizer.type =
      optimizer == "adamw" ? spec::OptimizerType::kAdamW : spec::OptimizerType::kSgd;
  const trainer::ParameterLayout& layout = model->layout();
  auto made = trainer::MakeTrainingState(layout.num_params, spec.optimizer, kernels::CpuDevice());
  if (!made.ok()) return 1;
  trainer::TrainingState state = std::move(made).value();
  std::vector<float> initial(static_cast<size_t>(layout.num_params));
  model->InitializeParameters(1, initial.data());
  if (!state.params.CopyFromHost(initial.data(), layout.num_params).ok()) return 1;
  TrainingStep step(*model, 784, batch);
  step.Run(state, [] {});  // optimizer state that is not all zeros

  auto storage = checkpoint::OpenStorage("file://" + dir, {});
  if (!storage.ok()) return 1;
  const std::string sync_root = dir + "/sync", async_root = dir + "/async";
  checkpoint::CheckpointWriter sync_writer(**storage, sync_root, 0, 1, {.keep = 2});

  // The report of the newest persist (the callback runs on the checkpointer's thread; read
  // after Flush).
  checkpoint::PersistReport last_report;
  checkpoint::AsyncCheckpointer async(
      std::make_unique<checkpoint::CheckpointWriter>(
          **storage, async_root, 0, 1, checkpoint::CheckpointWriterOptions{.keep = 2}),
      {}, [&last_report](const checkpoint::PersistReport& report) { last_report = report; });
  // An asynchronous checkpoint of step `step_number` through the capture thread; `between`
  // runs while the copy is (or may be) in progress and gets the wait for the copy to call.
  // Returns the time the calling thread was held; sets *between_seconds to the time from the
  // hand-over to the end of `between`, and *report to the persist's report once flushed.
  auto async_checkpoint = [&](int64_t step_number, auto between, double* between_seconds,
                              checkpoint::PersistReport* report) -> double {
    state.step = step_number;
    double held = 0;
    const double started = MonotonicSeconds();
    async.SnapshotInBackground(async.TakeRecycledState(),
                               [&state, &layout, &spec](checkpoint::CheckpointState* out) {
                                 trainer::FillCheckpointState(state, layout, spec, out);
                               });
    held += MonotonicSeconds() - started;
    between([&] {
      const double waited = MonotonicSeconds();
      async.WaitForCapture();
      held += MonotonicSeconds() - waited;
    });
    *between_seconds = MonotonicSeconds() - started;
    Status flushed = async.Flush(Deadline::AfterMs(600000));
    if (!flushed.ok() || !last_report.status.ok()) {
      std::fprintf(stderr, "async persist: %s %s\n", flushed.ToString().c_str(),
                   last_report.status.ToString().c_str());
      std::exit(1);
    }
    *report = last_report;
    return held;
  };

  checkpoint::CheckpointState staging;
  trainer::FillCheckpointState(state, layout, spec, &staging);
  int64_t total_bytes = 0;
  for (const auto& tensor : staging.tensors) {
    total_bytes += static_cast<int64_t>(tensor.bytes.size());
  }
  std::vector<uint8_t> plain_bytes(static_cast<size_t>(total_bytes), 0x5a);
  std::printf("state: %lld parameters, optimizer %s, %.1f MiB per checkpoint, batch %lld, dir %s\n",
              static_cast<long long>(layout.num_params), optimizer.c_str(), total_bytes / 1048576.0,
              static_cast<long long>(batch), dir.c_str());

  // The first asynchronous checkpoint allocates its buffer (on the capture thread); the repeats
  // measure the steady state, where it is recycled.
  checkpoint::PersistReport report;
  double between_seconds = 0;
  async_checkpoint(
      1, [](auto wait) { wait(); }, &between_seconds, &report);

  // The shards' checksums over the whole state on one thread: the floor of rank 0's persist (its
  // hashing overlaps its writing, and every shard's checksum is computed there).
  std::vector<double> hash_seconds;
  {
    const checkpoint::Manifest manifest = checkpoint::BuildManifest(staging, 1, false);
    for (int k = 0; k < 3; ++k) {
      const double started = MonotonicSeconds();
      checkpoint::HashShards(staging, manifest);
      hash_seconds.push_back(MonotonicSeconds() - started);
    }
    std::printf("checksums of the state on one thread: %.1f ms (median of 3)\n",
                SpreadOf(hash_seconds).median * 1e3);
  }

  std::vector<double> sync_stall, copy_seconds, sync_retention, async_stall, plain_step, copy_step,
      snapshot_step, persist_seconds, persist_training_seconds, retention_seconds, plain_seconds,
      through_extra, through_unfinished;
  checkpoint::CheckpointState spare_for_copy = staging;
  for (int r = 0; r < repeats; ++r) {
    // Each repeat checkpoints new steps, so nothing is "already committed".
    const int64_t base_step = 10 * (r + 1);
    // Synchronous: the training thread copies and commits.
    state.step = base_step;
    double started = MonotonicSeconds();
    trainer::FillCheckpointState(state, layout, spec, &staging);
    copy_seconds.push_back(MonotonicSeconds() - started);
    Status written = sync_writer.Commit(staging, Deadline::AfterMs(600000));
    sync_stall.push_back(MonotonicSeconds() - started);
    if (!written.ok()) {
      std::fprintf(stderr, "sync write: %s\n", written.ToString().c_str());
      return 1;
    }
    started = MonotonicSeconds();
    sync_writer.ApplyRetention(state.step, Deadline::AfterMs(600000));
    sync_retention.push_back(MonotonicSeconds() - started);

    // A step without a checkpoint, and one that overlaps only a copy of the state on another
    // thread (no persist), for comparison with the one that overlaps the snapshot and persist.
    started = MonotonicSeconds();
    step.Run(state, [] {});
    plain_step.push_back(MonotonicSeconds() - started);
    started = MonotonicSeconds();
    {
      std::thread copier(
          [&] { trainer::FillCheckpointState(state, layout, spec, &spare_for_copy); });
      step.Run(state, [&] { copier.join(); });
    }
    copy_step.push_back(MonotonicSeconds() - started);

    // Asynchronous, as the trainer takes it: the next step runs while the state is copied.
    async_stall.push_back(async_checkpoint(
        base_step + 1, [&](auto wait) { step.Run(state, wait); }, &between_seconds, &report));
    snapshot_step.push_back(between_seconds);
    persist_training_seconds.push_back(report.persist_seconds);

    // Steps back to back through a whole persist, against as many without a checkpoint.
    {
      constexpr int kThroughSteps = 12;
      started = MonotonicSeconds();
      for (int k = 0; k < kThroughSteps; ++k) step.Run(state, [] {});
      const double alone = MonotonicSeconds() - started;
      const int64_t persisted_before = async.stats().persisted;
      state.step = base_step + 3;
      started = MonotonicSeconds();
      async.SnapshotInBackground(async.TakeRecycledState(),
                                 [&state, &layout, &spec](checkpoint::CheckpointState* out) {
                                   trainer::FillCheckpointState(state, layout, spec, out);
                                 });
      step.Run(state, [&] { async.WaitForCapture(); });
      for (int k = 1; k < kThroughSteps; ++k) step.Run(state, [] {});
      const double beside = MonotonicSeconds() - started;
      // A persist still running after the steps would make the cost look smaller than it is.
      through_unfinished.push_back(async.stats().persisted == persisted_before ? 1 : 0);
      (void)async.Flush(Deadline::AfterMs(600000));
      through_extra.push_back(beside - alone);
    }

    // The same checkpoint with nothing else running, as the plain writer runs: the write
    // throughput.
    async_checkpoint(
        base_step + 2, [](auto wait) { wait(); }, &between_seconds, &report);
    persist_seconds.push_back(report.persist_seconds);
    retention_seconds.push_back(report.retention_seconds);

    plain_seconds.push_back(PlainWrite(dir, plain_bytes));
    std::printf(
        "repeat %d: sync stall %.1f ms (copy %.1f ms), async stall %.3f ms; step %.1f ms with a "
        "snapshot and its persist / %.1f ms with a copy alone / %.1f ms without; persist %.1f ms "
        "(%.1f ms while training; + retention %.1f ms), plain write %.1f ms; steps through a "
        "persist %+.1f ms (%.3f of the sync stall)%s\n",
        r, sync_stall.back() * 1e3, copy_seconds.back() * 1e3, async_stall.back() * 1e3,
        snapshot_step.back() * 1e3, copy_step.back() * 1e3, plain_step.back() * 1e3,
        persist_seconds.back() * 1e3, persist_training_seconds.back() * 1e3,
        retention_seconds.back() * 1e3, plain_seconds.back() * 1e3, through_extra.back() * 1e3,
        through_extra.back() / sync_stall.back(),
        through_unfinished.back() != 0 ? " (the persist outlasted the steps)" : "");
  }
  const double mib = total_bytes / 1048576.0;
  const Spread sync = SpreadOf(sync_stall), copy = SpreadOf(copy_seconds),
               held = SpreadOf(async_stall), persist = SpreadOf(persist_seconds),
               retention = SpreadOf(retention_seconds), plain = SpreadOf(plain_seconds),
               with_snapshot = SpreadOf(snapshot_step), with_copy = SpreadOf(copy_step),
               without = SpreadOf(plain_step),
               persist_training = SpreadOf(persist_training_seconds);
  // Per-repeat ratios (each against the same repeat's peer), then their spread.
  std::vector<double> stall_ratio, write_ratio, through_ratio;
  for (size_t k = 0; k < async_stall.size(); ++k) {
    stall_ratio.push_back(async_stall[k] / sync_stall[k]);
    write_ratio.push_back(plain_seconds[k] / persist_seconds[k]);
    through_ratio.push_back(through_extra[k] / sync_stall[k]);
  }
  const Spread stall_ratios = SpreadOf(stall_ratio), write_ratios = SpreadOf(write_ratio),
               through_ratios = SpreadOf(through_ratio);
  std::printf(
      "{\"state_mib\": %.1f, \"sync_stall_ms\": %.2f, \"copy_ms\": %.2f, \"async_stall_ms\": %.3f, "
      "\"async_stall_ms_max\": %.3f, \"async_over_sync\": %.4f, \"async_over_sync_min\": %.4f, "
      "\"async_over_sync_max\": %.4f, \"step_ms_with_snapshot\": %.1f, "
      "\"step_ms_with_copy\": %.1f, \"step_ms_without\": %.1f, "
      "\"checkpoint_write_mib_s\": %.0f, \"plain_write_mib_s\": %.0f, "
      "\"checkpoint_over_plain\": %.3f, \"checkpoint_over_plain_min\": %.3f, "
      "\"checkpoint_over_plain_max\": %.3f, \"persist_ms_while_training\": %.1f, "
      "\"retention_ms\": %.1f, \"sync_retention_ms\": %.1f, \"through_extra_ms\": %.1f, "
      "\"through_over_sync\": %.3f, \"through_over_sync_min\": %.3f, "
      "\"through_over_sync_max\": %.3f}\n",
      mib, sync.median * 1e3, copy.median * 1e3, held.median * 1e3, held.max * 1e3,
      stall_ratios.median, stall_ratios.min, stall_ratios.max, with_snapshot.median * 1e3,
      with_copy.median * 1e3, without.median * 1e3, mib / persist.median, mib / plain.median,
      write_ratios.median, write_ratios.min, write_ratios.max, persist_training.median * 1e3,
      retention.median * 1e3, SpreadOf(sync_retention).median * 1e3,
      SpreadOf(through_extra).median * 1e3, through_ratios.median, through_ratios.min,
      through_ratios.max);
  return 0;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) { return lockstep::Main(argc, argv); }
