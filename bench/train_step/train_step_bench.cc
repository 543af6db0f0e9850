// The built-in trainer's step time on one device, for the side-by-side with PyTorch
// (bench/train_step/torch_step.py measures the same MLP, batch, optimizer and precision).
//
//   train_step_bench --device cuda --layers 784,256,10 --batch 64 --steps 300 --warmup 50
//   -> lockstep-cuda layers=784,256,10 batch=64 step_ms=0.123 samples_per_s=520000
//
// What is timed: the real Trainer::Train loop in a world of one (the same code `lockstep run`
// runs: the host gathers each batch from a synthetic in-memory data set into pinned memory and
// copies it over, forward, backward, SGD with momentum 0.9), from the end of step `warmup` to the
// end of the last step, which includes the final device synchronisation (the loss read of the
// last log interval). step_ms is that wall time over the timed steps: on a GPU the host queues
// ahead, so per-step host timestamps would measure queueing, not the device.
//
// With --checkpoint-every N (and --checkpoint-dir DIR, a local folder): asynchronous checkpoints
// every N steps as `lockstep run` takes them (TrainingCheckpointer: the state copied off the
// device while the next steps run, then persisted on a helper thread), printed as
// lockstep-<device>-ckpt; the step time against the run without is what a checkpoint costs.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/logging.h"
#include "common/rendezvous/kv_store.h"
#include "kernels/kernels.h"
#include "worker/comm/communicator_factory.h"
#include "worker/trainer/random.h"
#include "worker/trainer/trainer.h"
#include "worker/trainer/training_checkpointer.h"

namespace lockstep {
namespace {

std::vector<int32_t> ParseLayers(const std::string& text) {
  std::vector<int32_t> layers;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) layers.push_back(std::atoi(item.c_str()));
  return layers;
}

trainer::Dataset RandomDataset(int64_t samples, int64_t features, int32_t classes) {
  trainer::Dataset data;
  data.num_samples = samples;
  data.num_features = features;
  data.num_classes = classes;
  data.features.resize(static_cast<size_t>(samples * features));
  data.labels.resize(static_cast<size_t>(samples));
  trainer::SplitMix64 rng(17);
  for (float& value : data.features) value = rng.UniformFloat(0.0f, 1.0f);
  for (int64_t i = 0; i < samples; ++i) {
    data.labels[static_cast<size_t>(i)] = static_cast<int32_t>(rng.Next() % classes);
  }
  data.labels[0] = classes - 1;  // num_classes is max label + 1
  data.description = "random";
  return data;
}

int Main(int argc, char** argv) {
  std::string device = "cpu", layers_text = "784,256,10", precision = "fp32";
  std::string checkpoint_dir;
  int64_t batch = 64, steps = 300, warmup = 50, checkpoint_every = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--device")
      device = value;
    else if (flag == "--layers")
      layers_text = value;
    else if (flag == "--batch")
      batch = std::atoll(value.c_str());
    else if (flag == "--steps")
      steps = std::atoll(value.c_str());
    else if (flag == "--warmup")
      warmup = std::atoll(value.c_str());
    else if (flag == "--precision")
      precision = value;
    else if (flag == "--checkpoint-every")
      checkpoint_every = std::atoll(value.c_str());
    else if (flag == "--checkpoint-dir")
      checkpoint_dir = value;
    else {
      std::fprintf(stderr, "train_step_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const std::vector<int32_t> layers = ParseLayers(layers_text);
  if ((device != "cpu" && device != "cuda") || (precision != "fp32" && precision != "bf16") ||
      layers.size() < 2 || batch < 1 || steps < 1 || warmup < 0 || checkpoint_every < 0 ||
      (checkpoint_every > 0) != !checkpoint_dir.empty()) {
    std::fprintf(stderr,
                 "usage: train_step_bench [--device cpu|cuda] [--layers 784,256,10] [--batch 64] "
                 "[--steps 300] [--warmup 50] [--precision fp32|bf16] "
                 "[--checkpoint-every N --checkpoint-dir DIR]\n");
    return 2;
  }
  SetLogLevel(LogLevel::kWarning);
  kernels::SetCpuBlasThreads(1);

  spec::TrainingJob job;
  job.metadata.name = "train-step-bench";
  job.spec.replicas = 1;  // the global batch is batchSize x replicas
  spec::TrainerSpec trainer_spec;
  trainer_spec.model.hidden.assign(layers.begin() + 1, layers.end() - 1);
  trainer_spec.model.activation = spec::Activation::kRelu;
  trainer_spec.batch_size = batch;
  trainer_spec.steps = warmup + steps;
  trainer_spec.optimizer.type = spec::OptimizerType::kSgd;
  trainer_spec.optimizer.learning_rate = 0.01;
  trainer_spec.optimizer.momentum = 0.9;
  trainer_spec.device = device == "cuda" ? spec::Device::kCuda : spec::Device::kCpu;
  trainer_spec.precision = precision == "bf16" ? spec::Precision::kBf16 : spec::Precision::kFp32;
  trainer_spec.log_interval_steps = warmup + steps;  // one loss read, at the end
  job.spec.trainer = trainer_spec;

  trainer::DataSplits splits;
  splits.train = RandomDataset(batch * 16, layers.front(), layers.back());
  auto trainer = trainer::Trainer::Create(job, std::move(splits), nullptr);
  if (!trainer.ok()) {
    std::fprintf(stderr, "train_step_bench: %s\n", trainer.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<rendezvous::KeyValueStore> store = rendezvous::NewInMemoryStore();
  comm::CommunicatorOptions options;
  options.job_name = "train-step-bench";
  if (device == "cuda") {
    options.cuda = true;
    options.cuda_stream = (*trainer)->device().side().cuda_stream;
  }
  auto communicator = comm::CreateCommunicator(options, *store);
  if (!communicator.ok()) {
    std::fprintf(stderr, "train_step_bench: %s\n", communicator.status().ToString().c_str());
    return 1;
  }
  const trainer::GenerationInfo info{1, 0, 1};
  Status agreed = (*trainer)->AgreeOnState(**communicator, info);
  if (!agreed.ok()) {
    std::fprintf(stderr, "train_step_bench: %s\n", agreed.ToString().c_str());
    return 1;
  }
  std::unique_ptr<trainer::TrainingCheckpointer> checkpointer;
  if (checkpoint_every > 0) {
    trainer::TrainingCheckpointerOptions options;
    options.checkpoint.uri = "file://" + checkpoint_dir;
    options.checkpoint.interval_steps = checkpoint_every;
    options.checkpoint.keep = 2;
    options.checkpoint.async = true;
    auto created = trainer::TrainingCheckpointer::Create(options, (*trainer)->spec(),
                                                         (*trainer)->model().layout(), nullptr);
    if (!created.ok()) {
      std::fprintf(stderr, "train_step_bench: %s\n", created.status().ToString().c_str());
      return 1;
    }
    checkpointer = std::move(created).value();
    (*trainer)->SetBeforeStateChange([&] { checkpointer->WaitForCapture(); });
    checkpointer->BeginGeneration("bench", 0, 1, (*trainer)->state());
  }
  std::atomic<bool> stop{false};
  double timed_from = MonotonicSeconds();
  Status trained = (*trainer)->Train(**communicator, info, stop, nullptr,
                                     [&](const trainer::TrainingState& state) {
                                       if (state.step == warmup) timed_from = MonotonicSeconds();
                                       if (checkpointer == nullptr) return OkStatus();
                                       return checkpointer->OnStep(state, **communicator, 60000);
                                     });
  const double seconds = MonotonicSeconds() - timed_from;
  if (!trained.ok()) {
    std::fprintf(stderr, "train_step_bench: %s\n", trained.ToString().c_str());
    return 1;
  }
  const double step_ms = seconds * 1000.0 / static_cast<double>(steps);
  // The host's share for comparison: one thread gathering the same batches (what the step does
  // before the device sees the data; BatchStager splits large batches over several threads).
  trainer::Dataset gather_source = RandomDataset(batch * 16, layers.front(), layers.back());
  std::vector<float> gathered(static_cast<size_t>(batch * layers.front()));
  std::vector<int32_t> gathered_labels(static_cast<size_t>(batch));
  std::vector<int64_t> ids(static_cast<size_t>(batch));
  trainer::SplitMix64 pick(3);
  const double gather_started = MonotonicSeconds();
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t& id : ids) id = static_cast<int64_t>(pick.Next() % (batch * 16));
    trainer::GatherBatch(gather_source, ids.data(), batch, gathered.data(), gathered_labels.data());
  }
  const double gather_ms = (MonotonicSeconds() - gather_started) * 1000.0 / steps;
  std::printf(
      "lockstep-%s%s layers=%s batch=%lld precision=%s step_ms=%.4f samples_per_s=%.0f loss=%.4f "
      "gather_ms_one_thread=%.4f",
      device.c_str(), checkpointer ? "-ckpt" : "", layers_text.c_str(),
      static_cast<long long>(batch), precision.c_str(), step_ms,
      static_cast<double>(batch) * steps / seconds, (*trainer)->last_progress().loss, gather_ms);
  if (checkpointer) {
    std::printf(" checkpoint_every=%lld last_checkpoint_step=%lld",
                static_cast<long long>(checkpoint_every),
                static_cast<long long>(checkpointer->last_checkpoint_step()));
  }
  std::printf("\n");
  return 0;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) { return lockstep::Main(argc, argv); }
