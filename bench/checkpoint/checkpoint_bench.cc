// checkpoint_bench: what a checkpoint costs training, measured on the trainer's own state.
//
//   checkpoint_bench --dir /path/on/the/storage [--hidden 2048,2048] [--optimizer sgd|adamw]
//                    [--repeats 5]
//
// For a built-in MLP (784 inputs, 10 classes) it times, `repeats` times each, on one rank:
//   sync stall   FillCheckpointState + CheckpointWriter::Write (hash, write, fsync, manifest,
//                rename): what a synchronous checkpoint stops training for;
//   async stall  TakeRecycledState + FillCheckpointState + AsyncCheckpointer::Snapshot: what an
//                asynchronous one stops training for, as the trainer does it (the persist then
//                runs in the background and is awaited before the next repeat, so repeats do not
//                overlap; the first repeat fills a fresh buffer, later ones a recycled one);
//   persist      the background write of that snapshot (from the checkpointer's report);
//   plain write  fwrite + fsync of the same number of bytes into one file in the same directory,
//                then close and rename: the storage's sequential write speed (dd-like).
// It prints one line per measurement and a JSON summary line (medians) with the two ratios the
// goals are stated in: async stall / sync stall (goal <= 0.05) and checkpoint write throughput
// / plain write throughput (goal >= 0.8).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "worker/checkpoint/async_checkpointer.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/storage/storage.h"
#include "worker/trainer/checkpoint_state.h"
#include "worker/trainer/model.h"

namespace lockstep {
namespace {

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
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

int Main(int argc, char** argv) {
  std::string dir, hidden_text = "2048,2048", optimizer = "sgd";
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dir") dir = value;
    if (flag == "--hidden") hidden_text = value;
    if (flag == "--optimizer") optimizer = value;
    if (flag == "--repeats") repeats = std::atoi(value.c_str());
  }
  if (dir.empty()) {
    std::fprintf(stderr,
                 "usage: checkpoint_bench --dir DIR [--hidden 2048,2048] "
                 "[--optimizer sgd|adamw] [--repeats 5]\n");
    return 2;
  }
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
  trainer::TrainingState state{
      0, {}, 0, 65536.0f, 0, {}, trainer::Optimizer(spec.optimizer, layout.num_params), {}};
  state.params.resize(static_cast<size_t>(layout.num_params));
  model->InitializeParameters(1, state.params.data());

  auto storage = checkpoint::OpenStorage("file://" + dir, {});
  if (!storage.ok()) return 1;
  const std::string sync_root = dir + "/sync", async_root = dir + "/async";
  checkpoint::CheckpointWriter sync_writer(**storage, sync_root, 0, 1, {.keep = 2});

  std::vector<double> persist_seconds;
  checkpoint::AsyncCheckpointer async(
      std::make_unique<checkpoint::CheckpointWriter>(
          **storage, async_root, 0, 1, checkpoint::CheckpointWriterOptions{.keep = 2}),
      {}, [&persist_seconds](const checkpoint::PersistReport& report) {
        if (report.status.ok()) persist_seconds.push_back(report.persist_seconds);
      });

  checkpoint::CheckpointState staging;
  trainer::FillCheckpointState(state, layout, spec, &staging);
  int64_t total_bytes = 0;
  for (const auto& tensor : staging.tensors)
    total_bytes += static_cast<int64_t>(tensor.bytes.size());
  std::vector<uint8_t> plain_bytes(static_cast<size_t>(total_bytes), 0x5a);
  std::printf("state: %lld parameters, optimizer %s, %.1f MiB per checkpoint, dir %s\n",
              static_cast<long long>(layout.num_params), optimizer.c_str(), total_bytes / 1048576.0,
              dir.c_str());

  std::vector<double> sync_stall, async_stall, async_handover, plain_seconds;
  for (int r = 0; r < repeats; ++r) {
    // Each repeat checkpoints a new step, so nothing is "already committed".
    state.step = 2 * r + 1;
    double started = MonotonicSeconds();
    trainer::FillCheckpointState(state, layout, spec, &staging);
    Status written = sync_writer.Write(staging, Deadline::AfterMs(600000));
    sync_stall.push_back(MonotonicSeconds() - started);
    if (!written.ok()) {
      std::fprintf(stderr, "sync write: %s\n", written.ToString().c_str());
      return 1;
    }

    state.step = 2 * r + 2;
    started = MonotonicSeconds();
    checkpoint::CheckpointState recycled = async.TakeRecycledState();
    trainer::FillCheckpointState(state, layout, spec, &recycled);
    const double filled = MonotonicSeconds();
    async.Snapshot(std::move(recycled));
    async_stall.push_back(MonotonicSeconds() - started);
    async_handover.push_back(MonotonicSeconds() - filled);
    Status flushed = async.Flush(Deadline::AfterMs(600000));
    if (!flushed.ok()) {
      std::fprintf(stderr, "async persist: %s\n", flushed.ToString().c_str());
      return 1;
    }

    plain_seconds.push_back(PlainWrite(dir, plain_bytes));
    std::printf(
        "repeat %d: sync stall %.1f ms, async stall %.2f ms, persist %.1f ms, "
        "plain write %.1f ms; hand-over to the checkpointer %.3f ms\n",
        r, sync_stall.back() * 1e3, async_stall.back() * 1e3,
        persist_seconds.empty() ? 0 : persist_seconds.back() * 1e3, plain_seconds.back() * 1e3,
        async_handover.back() * 1e3);
  }
  const double sync_median = Median(sync_stall), async_median = Median(async_stall);
  const double persist_median = Median(persist_seconds), plain_median = Median(plain_seconds);
  const double mib = total_bytes / 1048576.0;
  std::printf(
      "{\"state_mib\": %.1f, \"sync_stall_ms\": %.2f, \"async_stall_ms\": %.3f, "
      "\"async_over_sync\": %.4f, \"checkpoint_write_mib_s\": %.0f, \"plain_write_mib_s\": %.0f, "
      "\"checkpoint_over_plain\": %.3f}\n",
      mib, sync_median * 1e3, async_median * 1e3, async_median / sync_median, mib / persist_median,
      mib / plain_median, plain_median / persist_median);
  return 0;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) { return lockstep::Main(argc, argv); }
