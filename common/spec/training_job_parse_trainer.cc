// The manifest walker's trainer section (spec.trainer): the model, data, optimizer, gradient
// synchronisation and pipeline, and the checks that compare them with each other and with the
// rest of the spec. training_job_parse.cc walks the rest of the manifest.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/spec/field_reader.h"
#include "common/spec/parse_sections.h"
#include "common/spec/problems.h"
#include "common/spec/training_job.h"

namespace lockstep::spec::internal {
namespace {

using json = nlohmann::json;

// Data URIs are local: file:///abs/path or a plain path. Other schemes are reported here because
// the files layer could only say "not found" about them.
void CheckDataUris(const ObjectReader& reader, std::string_view key,
                   const std::vector<std::string>& uris) {
  for (size_t i = 0; i < uris.size(); ++i) {
    const std::string& uri = uris[i];
    std::string path = internal::IndexPath(reader.PathOf(key), i);
    size_t scheme_end = uri.find("://");
    if (uri.empty()) {
      reader.problems()->Add(path, "must not be empty");
    } else if (scheme_end != std::string::npos && uri.rfind("file://", 0) != 0) {
      reader.problems()->Add(
          path, "must be a file:// URI or a plain path (got " + Describe(json(uri)) + ")");
    }
  }
}

void CheckDataFileCount(const ObjectReader& reader, std::string_view key, DataFormat format,
                        size_t count) {
  size_t expected = format == DataFormat::kIdx ? 2 : 1;
  if (count == expected) return;
  std::string rule = format == DataFormat::kIdx
                         ? "format idx needs 2 files [images, labels]"
                         : std::string("format ") + ToString(format) + " needs 1 file";
  reader.problems()->Add(reader.PathOf(key), rule + " (got " + std::to_string(count) + ")");
}

void ReadData(const ObjectReader& trainer, DataSpec* data) {
  ObjectReader reader = ChildMap(trainer, "data");
  if (!reader.valid()) return;
  bool format_ok = reader.ReadEnum("format", &data->format) || !reader.Has("format");
  if (reader.Require("train") && reader.ReadStringList("train", &data->train)) {
    CheckDataUris(reader, "train", data->train);
    if (format_ok) CheckDataFileCount(reader, "train", data->format, data->train.size());
  }
  // An empty test list means no evaluation, like an absent one.
  if (reader.ReadStringList("test", &data->test) && !data->test.empty()) {
    CheckDataUris(reader, "test", data->test);
    if (format_ok) CheckDataFileCount(reader, "test", data->format, data->test.size());
  }
}

void ReadModel(const ObjectReader& trainer, ModelSpec* model) {
  ObjectReader reader = ChildMap(trainer, "model");
  if (!reader.valid()) return;
  std::string type;
  if (reader.ReadString("type", &type)) {
    if (type == "mlp") {
      model->type = type;
    } else {
      reader.problems()->Add(reader.PathOf("type"),
                             "must be one of mlp (got " + Describe(json(type)) + ")");
    }
  }
  std::vector<int64_t> hidden;
  if (reader.ReadIntList("hidden", 1, kMaxInt32, &hidden)) {
    model->hidden.assign(hidden.begin(), hidden.end());
  }
  reader.ReadEnum("activation", &model->activation);
  if (reader.Has("embedding")) {
    ObjectReader embedding = ChildMap(reader, "embedding");
    if (!embedding.valid()) return;
    EmbeddingSpec spec;
    embedding.Require("fields");
    embedding.ReadInt("fields", &spec.fields, 1, kMaxEmbeddingFields);
    embedding.ReadInt("dim", &spec.dim, 1, kMaxEmbeddingDim);
    embedding.ReadInt("rows", &spec.rows, 1, kMaxEmbeddingRows);
    model->embedding = spec;
  }
}

void ReadOptimizer(const ObjectReader& trainer, OptimizerSpec* optimizer) {
  ObjectReader reader = ChildMap(trainer, "optimizer");
  if (!reader.valid()) return;
  const Bound kAboveZero{0, false}, kZeroOrMore{0, true}, kBelowOne{1, false};
  reader.ReadEnum("type", &optimizer->type);
  reader.ReadDouble("learningRate", &optimizer->learning_rate, &kAboveZero);
  reader.ReadDouble("momentum", &optimizer->momentum, &kZeroOrMore, &kBelowOne);
  reader.ReadDouble("weightDecay", &optimizer->weight_decay, &kZeroOrMore);
  reader.ReadEnum("lrScaling", &optimizer->lr_scaling);
  reader.ReadInt("warmupSteps", &optimizer->warmup_steps, 0);
  reader.ReadDouble("beta1", &optimizer->beta1, &kZeroOrMore, &kBelowOne);
  reader.ReadDouble("beta2", &optimizer->beta2, &kZeroOrMore, &kBelowOne);
  reader.ReadDouble("epsilon", &optimizer->epsilon, &kAboveZero);
}

void ReadAllreduce(const ObjectReader& trainer, AllreduceSpec* allreduce) {
  ObjectReader reader = ChildMap(trainer, "allreduce");
  if (!reader.valid()) return;
  const Bound kAboveZero{0, false};
  reader.ReadDouble("bucketMiB", &allreduce->bucket_mib, &kAboveZero);
  reader.ReadEnum("compression", &allreduce->compression);
  reader.ReadInt("timeoutSeconds", &allreduce->timeout_seconds, 1);
}

void ReadSync(const ObjectReader& trainer, SyncSpec* sync) {
  ObjectReader reader = ChildMap(trainer, "sync");
  if (!reader.valid()) return;
  reader.ReadEnum("strategy", &sync->strategy);
  ObjectReader local_sgd = ChildMap(reader, "localSGD");
  local_sgd.ReadInt("period", &sync->local_sgd.period, 1);
  local_sgd.ReadInt("startStep", &sync->local_sgd.start_step, 0);
  ObjectReader dgc = ChildMap(reader, "dgc");
  const Bound kZeroOrMore{0, true};
  const Bound kBelowOne{1, false};
  dgc.ReadDouble("sparsity", &sync->dgc.sparsity, &kZeroOrMore, &kBelowOne);
  dgc.ReadInt("warmupSteps", &sync->dgc.warmup_steps, 0);
  dgc.ReadInt("minBucketElements", &sync->dgc.min_bucket_elements, 1);
  ObjectReader ps = ChildMap(reader, "parameterServer");
  ps.ReadEnum("mode", &sync->parameter_server.mode);
  ps.ReadInt("staleness", &sync->parameter_server.staleness, -1);
  ps.ReadInt("geoInterval", &sync->parameter_server.geo_interval, 1);
}

// What dgc cannot be combined with, named by the field that conflicts.
void CheckSyncCombinations(const ObjectReader& reader, const TrainerSpec& trainer) {
  if (trainer.sync.strategy != SyncStrategy::kDgc) return;
  const std::string strategy = reader.PathOf("sync") + ".strategy";
  if (trainer.optimizer.type != OptimizerType::kSgd) {
    reader.problems()->Add(strategy,
                           "dgc needs optimizer.type sgd: its momentum correction takes the place "
                           "of the optimizer's momentum (got " +
                               std::string(ToString(trainer.optimizer.type)) + ")");
  }
  if (trainer.allreduce.compression == Compression::kFp16) {
    reader.problems()->Add(strategy,
                           "dgc cannot be combined with allreduce.compression fp16: a step "
                           "skipped on overflow would leave the residuals advanced (use bf16)");
  }
  if (trainer.device == Device::kCuda) {
    reader.problems()->Add(strategy,
                           "dgc selects gradients in host memory and runs on device cpu only; "
                           "on cuda use allreduce or localSGD");
  }
}

// `pipeline`, checked against the model and batch it splits (read before it).
void ReadPipeline(const ObjectReader& trainer_reader, TrainerSpec* trainer) {
  ObjectReader reader = ChildMap(trainer_reader, "pipeline");
  if (!reader.valid()) return;
  PipelineSpec& pipeline = trainer->pipeline;
  const bool stages_ok =
      reader.ReadInt("stages", &pipeline.stages, 1, kMaxPipelineStages) || !reader.Has("stages");
  const bool micro_ok = reader.ReadInt("microBatches", &pipeline.micro_batches, 1, kMaxInt32) ||
                        !reader.Has("microBatches");
  reader.ReadEnum("schedule", &pipeline.schedule);
  reader.ReadBool("recompute", &pipeline.recompute);
  const int64_t layers = static_cast<int64_t>(trainer->model.hidden.size()) + 1;
  const std::string model_layers = "the model has " + std::to_string(layers) + " layers (" +
                                   std::to_string(trainer->model.hidden.size()) +
                                   " hidden and the output layer)";
  if (stages_ok && pipeline.stages > layers) {
    reader.problems()->Add(reader.PathOf("stages"), std::to_string(pipeline.stages) +
                                                        " stages, but " + model_layers +
                                                        ": a stage holds at least one layer");
  }
  if (micro_ok && trainer->batch_size >= 1 && trainer->batch_size % pipeline.micro_batches != 0) {
    reader.problems()->Add(reader.PathOf("microBatches"),
                           "must divide batchSize " + std::to_string(trainer->batch_size) +
                               " (got " + std::to_string(pipeline.micro_batches) + ")");
  }
  if (stages_ok && pipeline.stages == 1) {
    // One stage is the data-parallel trainer, which cuts nothing into micro-batches. (The API
    // server fills in every default, so only values that would change something are refused.)
    if (micro_ok && pipeline.micro_batches > 1) {
      reader.problems()->Add(reader.PathOf("microBatches"),
                             "applies to a pipeline of 2 or more stages (stages is 1)");
    }
    if (pipeline.recompute) {
      reader.problems()->Add(reader.PathOf("recompute"),
                             "applies to a pipeline of 2 or more stages (stages is 1)");
    }
  }
  std::vector<int64_t> stage_layers;
  // Empty, as ToJson writes an unset list: balanced.
  if (reader.ReadIntList("stageLayers", 1, kMaxInt32, &stage_layers) && stages_ok &&
      !stage_layers.empty()) {
    int64_t sum = 0;
    for (int64_t count : stage_layers) sum += count;
    if (static_cast<int64_t>(stage_layers.size()) != pipeline.stages) {
      reader.problems()->Add(reader.PathOf("stageLayers"),
                             "must have one entry per stage: " + std::to_string(pipeline.stages) +
                                 " (got " + std::to_string(stage_layers.size()) + ")");
    } else if (sum != layers) {
      reader.problems()->Add(reader.PathOf("stageLayers"),
                             "must add up to the model's layers: " + model_layers + " (got " +
                                 std::to_string(sum) + ")");
    } else {
      pipeline.stage_layers.assign(stage_layers.begin(), stage_layers.end());
    }
  }
}

}  // namespace

// What a pipeline cannot be combined with, named by the field that conflicts; and the world it
// needs (every rank of a replica is one stage).
void CheckPipeline(const ObjectReader& spec_reader, const TrainingJobSpec& spec) {
  if (!spec.trainer.has_value() || spec.trainer->pipeline.stages <= 1) return;
  const TrainerSpec& trainer = *spec.trainer;
  const int32_t stages = trainer.pipeline.stages;
  const std::string trainer_path = spec_reader.PathOf("trainer");
  const std::string why =
      " (" + trainer_path + ".pipeline.stages is " + std::to_string(stages) + ")";
  const int64_t world = static_cast<int64_t>(spec.replicas) * spec.ranks_per_worker;
  if (world % stages != 0) {
    spec_reader.problems()->Add(
        spec_reader.PathOf("replicas"),
        "replicas x ranksPerWorker (" + std::to_string(world) +
            ") must be a multiple of the pipeline's stages: every replica of the pipeline has "
            "one rank per stage" +
            why);
  }
  if (trainer.sync.strategy != SyncStrategy::kAllreduce) {
    spec_reader.problems()->Add(trainer_path + ".sync.strategy",
                                std::string("a pipeline's stages all-reduce their gradients "
                                            "among their replicas: only allreduce (got ") +
                                    ToString(trainer.sync.strategy) + ")" + why);
  }
  if (trainer.device == Device::kCuda) {
    spec_reader.problems()->Add(trainer_path + ".device",
                                "pipeline stages run on device cpu (got cuda)" + why);
  }
  if (spec.elastic.standby > 0) {
    spec_reader.problems()->Add(spec_reader.PathOf("elastic") + ".standby",
                                "a pipeline job keeps no standbys (a lost rank's replica goes "
                                "out and comes back whole)" +
                                    why);
  }
  // With a fixed global batch, more replicas than `replicas` each train a smaller share of it;
  // every share must still give each micro-batch a sample.
  if (spec.elastic.global_batch == GlobalBatch::kFixed &&
      spec.elastic.max_replicas > spec.replicas && spec.elastic.max_replicas > 0) {
    const int64_t share =
        static_cast<int64_t>(trainer.batch_size) * spec.replicas / spec.elastic.max_replicas;
    if (share < trainer.pipeline.micro_batches) {
      spec_reader.problems()->Add(
          spec_reader.PathOf("elastic") + ".maxReplicas",
          "with globalBatch fixed, " + std::to_string(spec.elastic.max_replicas) +
              " workers give each pipeline replica " + std::to_string(share) +
              " samples of the global batch, fewer than microBatches (" +
              std::to_string(trainer.pipeline.micro_batches) + ")" + why);
    }
  }
  // Generations hold whole replicas of the pipeline: a multiple of this many workers.
  const int32_t whole = PodsPerPipelineReplicas(spec);
  for (const auto& [field, value] :
       {std::pair<const char*, int32_t>{"minReplicas", spec.elastic.min_replicas},
        {"maxReplicas", spec.elastic.max_replicas}}) {
    if (whole > 1 && value % whole != 0) {
      spec_reader.problems()->Add(
          spec_reader.PathOf("elastic") + "." + field,
          "a pipeline's generations hold whole replicas of it (" + std::to_string(whole) +
              " workers of " + std::to_string(spec.ranks_per_worker) +
              " rank(s) each): must be a multiple of " + std::to_string(whole) + " (got " +
              std::to_string(value) + ")" + why);
    }
  }
}

// Parameter-server training (docs/parameter-servers.md): its servers, its sparse model and data,
// and what it cannot be combined with, each named by the field that conflicts.
void CheckParameterServers(const ObjectReader& spec_reader, const TrainingJobSpec& spec) {
  Problems& problems = *spec_reader.problems();
  const std::string servers = spec_reader.PathOf("parameterServers");
  const bool has_servers = spec.parameter_servers.replicas > 0;
  if (!spec.trainer.has_value()) {
    // A command job's servers run its command as TensorFlow's ps tasks (TF_CONFIG,
    // common/spec/tf_config.h): one task per pod, a fixed cluster.
    if (!has_servers) return;
    const std::string why = " (spec.parameterServers with a command: TF_CONFIG)";
    if (spec.ranks_per_worker != 1) {
      problems.Add(spec_reader.PathOf("ranksPerWorker"),
                   "a TensorFlow task is one process per pod (got " +
                       std::to_string(spec.ranks_per_worker) + ")" + why);
    }
    if (spec.elastic.min_replicas != spec.elastic.max_replicas || spec.elastic.standby > 0) {
      problems.Add(spec_reader.PathOf("elastic"),
                   "TF_CONFIG names a fixed cluster: no elastic range or standbys" + why);
    }
    if (spec.parameter_servers.resources.gpus > 0) {
      problems.Add(servers + ".resources.gpus",
                   "parameter servers use no GPU (got " +
                       std::to_string(spec.parameter_servers.resources.gpus) + ")" + why);
    }
    return;
  }
  const TrainerSpec& trainer = *spec.trainer;
  const std::string path = spec_reader.PathOf("trainer");
  const bool ps = trainer.sync.strategy == SyncStrategy::kParameterServer;
  if (ps != has_servers) {
    problems.Add(ps ? servers : path + ".sync.strategy",
                 ps ? "required by sync.strategy parameterServer: replicas >= 1"
                    : std::string("spec.parameterServers needs sync.strategy parameterServer "
                                  "(got ") +
                          ToString(trainer.sync.strategy) + ")");
  }
  if (trainer.model.embedding.has_value() != ps) {
    problems.Add(path + ".model.embedding",
                 ps ? "required by sync.strategy parameterServer: the servers hold the embedding "
                      "table (fields, dim, rows)"
                    : "an embedding table is trained through parameter servers only: set "
                      "sync.strategy parameterServer and spec.parameterServers");
  }
  if ((trainer.data.format == DataFormat::kClickLog) != ps) {
    problems.Add(path + ".data.format",
                 ps ? std::string("sync.strategy parameterServer trains on format clickLog "
                                  "(got ") +
                          ToString(trainer.data.format) + ")"
                    : "format clickLog feeds the embedding model of sync.strategy "
                      "parameterServer");
  }
  const ParameterServerSyncSpec& sync = trainer.sync.parameter_server;
  if (sync.staleness >= 0 && sync.mode != ParameterServerMode::kAsync) {
    problems.Add(path + ".sync.parameterServer.staleness",
                 std::string("bounds mode async (mode ") + ToString(sync.mode) +
                     (sync.mode == ParameterServerMode::kSync ? " waits for every step" : "") +
                     ")");
  }
  if (spec.parameter_servers.resources.gpus > 0) {
    problems.Add(servers + ".resources.gpus",
                 "parameter servers hold their tables in host "
                 "memory and use no GPU (got " +
                     std::to_string(spec.parameter_servers.resources.gpus) + ")");
  }
  if (!ps) return;
  if (trainer.model.embedding.has_value() && has_servers) {
    // Each server holds its share of the table, and refuses more than it may hold.
    const EmbeddingSpec& embedding = *trainer.model.embedding;
    const int64_t servers_count = spec.parameter_servers.replicas;
    const int64_t rows_per_server = (embedding.rows + servers_count - 1) / servers_count;
    const double bytes = static_cast<double>(rows_per_server) * embedding.dim * 4;
    if (bytes > static_cast<double>(kMaxParameterServerShardBytes)) {
      const int64_t needed =
          static_cast<int64_t>(std::ceil(static_cast<double>(embedding.rows) * embedding.dim * 4 /
                                         static_cast<double>(kMaxParameterServerShardBytes)));
      problems.Add(path + ".model.embedding.rows",
                   std::to_string(embedding.rows) + " rows of " + std::to_string(embedding.dim) +
                       " floats are " + std::to_string(static_cast<int64_t>(bytes / (1 << 20))) +
                       " MiB per parameter server, more than one holds (4 GiB): use at least " +
                       std::to_string(needed) + " spec.parameterServers.replicas or fewer rows");
    }
  }
  // What the servers and the sparse model do not do (yet), so that no field is silently ignored.
  const std::string why = " (sync.strategy parameterServer)";
  const OptimizerSpec& optimizer = trainer.optimizer;
  if (optimizer.type != OptimizerType::kSgd || optimizer.momentum != 0 ||
      optimizer.weight_decay != 0 || optimizer.warmup_steps != 0 ||
      optimizer.lr_scaling != LrScaling::kNone) {
    problems.Add(path + ".optimizer",
                 "the parameter servers apply plain SGD: type sgd with momentum 0, weightDecay 0, "
                 "warmupSteps 0 and lrScaling none" +
                     why);
  }
  if (trainer.device != Device::kCpu) {
    problems.Add(path + ".device", "the sparse model trains on device cpu" + why);
  }
  if (trainer.precision != Precision::kFp32) {
    problems.Add(path + ".precision", "the sparse model trains in fp32" + why);
  }
  if (spec.ranks_per_worker != 1) {
    problems.Add(spec_reader.PathOf("ranksPerWorker"),
                 "a parameter-server worker is one process (got " +
                     std::to_string(spec.ranks_per_worker) + ")" + why);
  }
  if (spec.elastic.min_replicas != spec.elastic.max_replicas || spec.elastic.standby > 0) {
    problems.Add(spec_reader.PathOf("elastic"),
                 "a parameter-server job runs a fixed number of workers (a lost one is "
                 "replaced; the others go on)" +
                     why);
  }
  if (!spec.checkpoint.uri.empty() && spec.checkpoint.interval_steps < 1) {
    problems.Add(spec_reader.PathOf("checkpoint") + ".intervalSteps",
                 "the parameter servers checkpoint their shards every intervalSteps steps of the "
                 "slowest worker: 1 or more (got " +
                     std::to_string(spec.checkpoint.interval_steps) + ")" + why);
  }
}

void ReadTrainer(const ObjectReader& spec, TrainerSpec* trainer) {
  ObjectReader reader = ChildMap(spec, "trainer");
  if (!reader.valid()) return;
  ReadModel(reader, &trainer->model);
  ReadData(reader, &trainer->data);
  reader.ReadInt("batchSize", &trainer->batch_size, 1);
  bool steps_ok = reader.ReadInt("steps", &trainer->steps, 0) || !reader.Has("steps");
  bool epochs_ok = reader.ReadInt("epochs", &trainer->epochs, 0) || !reader.Has("epochs");
  if (steps_ok && epochs_ok && (trainer->steps > 0) == (trainer->epochs > 0)) {
    reader.problems()->Add(
        reader.path(),
        "exactly one of steps and epochs must be > 0 (got " +
            (trainer->steps > 0 ? "steps " + std::to_string(trainer->steps) + " and epochs " +
                                      std::to_string(trainer->epochs)
                                : std::string("neither")) +
            ")");
  }
  ReadOptimizer(reader, &trainer->optimizer);
  reader.ReadUint64("seed", &trainer->seed);
  reader.ReadEnum("device", &trainer->device);
  reader.ReadEnum("precision", &trainer->precision);
  ReadAllreduce(reader, &trainer->allreduce);
  ReadSync(reader, &trainer->sync);
  CheckSyncCombinations(reader, *trainer);
  ReadPipeline(reader, trainer);
  reader.ReadInt("logIntervalSteps", &trainer->log_interval_steps, 1);
}

}  // namespace lockstep::spec::internal
