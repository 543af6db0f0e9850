// The manifest walker: reads a TrainingJob from its JSON form (YAML is converted first) field by
// field, applying defaults and collecting every problem. ParseTrainingJobYaml and
// ParseTrainingJobJson both end here, so the two formats cannot drift apart.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <string>

#include "common/spec/field_reader.h"
#include "common/spec/manifest_fields.h"
#include "common/spec/problems.h"
#include "common/spec/training_job.h"
#include "common/spec/yaml_to_json.h"

namespace lockstep::spec {
namespace {

using internal::Bound;
using internal::Describe;
using internal::ObjectReader;
using internal::Problems;
using json = nlohmann::json;

constexpr char kApiVersion[] = "lockstep.io/v1alpha1";
constexpr char kKind[] = "TrainingJob";
constexpr int32_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// The map `key` of `parent`, read with the fields that manifest_fields.h lists for its path: the
// one table of field names the CRD test checks too.
ObjectReader ChildMap(const ObjectReader& parent, std::string_view key) {
  return parent.Child(key, ManifestFields(parent.PathOf(key)));
}

// RFC 1123 label, as Kubernetes requires for names: lowercase alphanumerics and '-', starting
// and ending with an alphanumeric, at most 63 characters.
bool IsDns1123Label(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  for (char c : name) {
    if (!alnum(c) && c != '-') return false;
  }
  return alnum(name.front()) && alnum(name.back());
}

void ReadDns1123Label(const ObjectReader& reader, std::string_view key, std::string* out) {
  std::string value;
  if (!reader.ReadString(key, &value)) return;
  if (!IsDns1123Label(value)) {
    reader.problems()->Add(reader.PathOf(key),
                           "must be a DNS-1123 label: at most 63 lowercase letters, digits and "
                           "'-', starting and ending with a letter or digit (got " +
                               Describe(json(value)) + ")");
    return;
  }
  *out = value;
}

// A job's name also names its headless Service, which must be an RFC 1035 label: a DNS-1123
// label that starts with a letter ("3d-unet" cannot have a Service).
void ReadJobName(const ObjectReader& reader, std::string_view key, std::string* out) {
  std::string value;
  if (!reader.ReadString(key, &value)) return;
  if (!IsDns1123Label(value) || value.front() < 'a' || value.front() > 'z') {
    reader.problems()->Add(reader.PathOf(key),
                           "must be a DNS-1035 label: at most 63 lowercase letters, digits and "
                           "'-', starting with a letter and ending with a letter or digit (got " +
                               Describe(json(value)) + ")");
    return;
  }
  *out = value;
}

// "file:///abs/path" or "hdfs://host:port/path"; anything else is reported.
bool IsCheckpointUri(const std::string& uri) {
  constexpr std::string_view kFile = "file://";
  constexpr std::string_view kHdfs = "hdfs://";
  if (uri.rfind(kFile, 0) == 0) return uri.size() > kFile.size() + 1 && uri[kFile.size()] == '/';
  if (uri.rfind(kHdfs, 0) != 0) return false;
  std::string rest = uri.substr(kHdfs.size());
  size_t slash = rest.find('/');
  if (slash == std::string::npos || slash + 1 >= rest.size()) return false;
  std::string authority = rest.substr(0, slash);
  size_t colon = authority.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  std::string port = authority.substr(colon + 1);
  if (port.empty() || port.size() > 5) return false;
  for (char c : port) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  int number = std::stoi(port);
  return number >= 1 && number <= 65535;
}

// Kubernetes quantity: a decimal number with an optional binary (Ki..Ei) or decimal (n..E)
// suffix or exponent, e.g. "8", "500m", "64Gi", "1e3".
bool IsQuantity(const std::string& text) {
  size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  size_t digits = 0;
  bool dot = false;
  for (; i < text.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(text[i]))) {
      ++digits;
    } else if (text[i] == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (digits == 0) return false;
  std::string suffix = text.substr(i);
  static const char* const kSuffixes[] = {"",  "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n",
                                          "u", "m",  "k",  "M",  "G",  "T",  "P",  "E"};
  for (const char* allowed : kSuffixes) {
    if (suffix == allowed) return true;
  }
  if (suffix.size() >= 2 && (suffix[0] == 'e' || suffix[0] == 'E')) {
    size_t j = (suffix[1] == '+' || suffix[1] == '-') ? 2 : 1;
    if (j >= suffix.size()) return false;
    for (; j < suffix.size(); ++j) {
      if (!std::isdigit(static_cast<unsigned char>(suffix[j]))) return false;
    }
    return true;
  }
  return false;
}

void ReadQuantity(const ObjectReader& reader, std::string_view key, std::string* out) {
  std::string value;
  if (!reader.ReadIntOrString(key, &value)) return;
  // Empty means "not requested", which is also how ToJson writes an unset quantity.
  if (!value.empty() && !IsQuantity(value)) {
    reader.problems()->Add(reader.PathOf(key),
                           "must be a Kubernetes quantity such as \"8\", "
                           "\"500m\" or \"64Gi\" (got " +
                               Describe(json(value)) + ")");
    return;
  }
  *out = value;
}

void ReadMetadata(const ObjectReader& top, ObjectMeta* metadata) {
  ObjectReader reader = ChildMap(top, "metadata");
  if (!reader.valid()) return;
  if (reader.Require("name")) ReadJobName(reader, "name", &metadata->name);
  ReadDns1123Label(reader, "namespace", &metadata->namespace_);
  reader.ReadStringMap("labels", &metadata->labels);
  reader.ReadStringMap("annotations", &metadata->annotations);
  reader.ReadString("uid", &metadata->uid);
  reader.ReadInt("generation", &metadata->generation, 0);
}

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
  std::string rule = format == DataFormat::kIdx ? "format idx needs 2 files [images, labels]"
                                                : "format csv needs 1 file";
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
  if (!spec.checkpoint.uri.empty()) {
    spec_reader.problems()->Add(spec_reader.PathOf("checkpoint") + ".uri",
                                "a pipeline job does not write checkpoints yet: it recovers a lost "
                                "rank from its stage's other replicas (docs/pipeline.md)" +
                                    why);
  }
  if (spec.elastic.min_replicas != spec.elastic.max_replicas || spec.elastic.standby > 0) {
    spec_reader.problems()->Add(spec_reader.PathOf("elastic"),
                                "a pipeline job has a fixed world (replicas x ranksPerWorker "
                                "ranks); minReplicas, maxReplicas and standby must be left "
                                "out or equal to replicas" +
                                    why);
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

void ReadCheckpoint(const ObjectReader& spec, CheckpointSpec* checkpoint) {
  ObjectReader reader = ChildMap(spec, "checkpoint");
  if (!reader.valid()) return;
  std::string uri;
  if (reader.ReadString("uri", &uri)) {
    if (uri.empty() || IsCheckpointUri(uri)) {
      checkpoint->uri = uri;
    } else {
      reader.problems()->Add(
          reader.PathOf("uri"),
          "must be file:///path or hdfs://host:port/path (got " + Describe(json(uri)) + ")");
    }
  }
  reader.ReadInt("intervalSteps", &checkpoint->interval_steps, 0);
  reader.ReadInt("keep", &checkpoint->keep, 1);
  reader.ReadBool("async", &checkpoint->async);
}

void ReadNetwork(const ObjectReader& spec, NetworkSpec* network) {
  ObjectReader reader = ChildMap(spec, "network");
  if (!reader.valid()) return;
  reader.ReadEnum("mode", &network->mode);
  ObjectReader rdma = ChildMap(reader, "rdmaResource");
  rdma.ReadString("name", &network->rdma_resource.name);
  rdma.ReadInt("count", &network->rdma_resource.count, 1);
  reader.ReadStringList("multusNetworks", &network->multus_networks);
  reader.ReadBool("hostNetwork", &network->host_network);
  reader.ReadStringMap("ncclEnv", &network->nccl_env);
}

void ReadRunPolicy(const ObjectReader& spec, RunPolicy* policy) {
  ObjectReader reader = ChildMap(spec, "runPolicy");
  if (!reader.valid()) return;
  reader.ReadEnum("restartPolicy", &policy->restart_policy);
  reader.ReadInt("backoffLimit", &policy->backoff_limit, 0);
  int64_t seconds = 0;
  if (reader.ReadInt("activeDeadlineSeconds", &seconds, 1)) {
    policy->active_deadline_seconds = seconds;
  }
  if (reader.ReadInt("ttlSecondsAfterFinished", &seconds, 0)) {
    policy->ttl_seconds_after_finished = seconds;
  }
  reader.ReadBool("suspend", &policy->suspend);
  ObjectReader scheduling = ChildMap(reader, "scheduling");
  scheduling.ReadEnum("gang", &policy->scheduling.gang);
  scheduling.ReadString("queue", &policy->scheduling.queue);
  scheduling.ReadString("priorityClassName", &policy->scheduling.priority_class_name);
  scheduling.ReadInt("scheduleTimeoutSeconds", &policy->scheduling.schedule_timeout_seconds, 0);
  std::vector<int64_t> codes;
  if (reader.ReadIntList("retryableExitCodes", 0, 255, &codes)) {
    policy->retryable_exit_codes.assign(codes.begin(), codes.end());
  }
}

// A label key: an optional prefix (a DNS-1123 subdomain of at most 253 characters) and '/',
// then a name of at most 63 characters of letters, digits, '-', '_' and '.', starting and
// ending with a letter or digit (Kubernetes' qualified name).
bool IsLabelKey(const std::string& key) {
  std::string prefix, name = key;
  if (const size_t slash = key.find('/'); slash != std::string::npos) {
    prefix = key.substr(0, slash);
    name = key.substr(slash + 1);
    if (prefix.empty() || prefix.size() > 253) return false;
    // A DNS-1123 subdomain: DNS-1123 labels joined by dots.
    for (size_t begin = 0; begin <= prefix.size();) {
      size_t dot = prefix.find('.', begin);
      if (dot == std::string::npos) dot = prefix.size();
      if (!IsDns1123Label(prefix.substr(begin, dot - begin))) return false;
      begin = dot + 1;
    }
  }
  if (name.empty() || name.size() > 63) return false;
  auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  for (char c : name) {
    if (!alnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return alnum(name.front()) && alnum(name.back());
}

void ReadPlacement(const ObjectReader& spec, TrainingJobSpec* job_spec) {
  if (!spec.Has("placement")) return;
  ObjectReader reader = ChildMap(spec, "placement");
  if (!reader.valid()) return;
  PlacementSpec& placement = job_spec->placement;
  std::string topology;
  if (reader.Require("topology") && reader.ReadString("topology", &topology)) {
    if (IsLabelKey(topology)) {
      placement.topology = topology;
    } else {
      reader.problems()->Add(reader.PathOf("topology"),
                             "must be a node label key such as topology.kubernetes.io/zone "
                             "(got " + Describe(json(topology)) + ")");
    }
  }
  reader.ReadEnum("mode", &placement.mode);
  if (reader.ReadInt("volcanoTier", &placement.volcano_tier, 1, 64) &&
      job_spec->run_policy.scheduling.gang != GangScheduler::kVolcano) {
    reader.problems()->Add(reader.PathOf("volcanoTier"),
                           "only Volcano reads it: set spec.runPolicy.scheduling.gang to volcano, "
                           "or leave it out");
  }
}

void ReadElastic(const ObjectReader& spec, bool replicas_ok, TrainingJobSpec* job_spec) {
  ObjectReader reader = ChildMap(spec, "elastic");
  job_spec->elastic_set = spec.Has("elastic") && reader.valid();
  bool min_ok = reader.ReadInt("minReplicas", &job_spec->elastic.min_replicas, 1, kMaxReplicas);
  bool max_ok = reader.ReadInt("maxReplicas", &job_spec->elastic.max_replicas, 1, kMaxReplicas);
  bool min_given = reader.Has("minReplicas"), max_given = reader.Has("maxReplicas");
  // An end that is not given defaults to replicas; an end given wrongly is already reported.
  if (!min_given) job_spec->elastic.min_replicas = job_spec->replicas;
  if (!max_given) job_spec->elastic.max_replicas = job_spec->replicas;
  // A fixed-size job keeps its global batch when a failure shrinks the world for a while, so its
  // model does not depend on when failures happened; an elastic job's batch follows its world
  // unless it asks otherwise.
  if (!reader.ReadEnum("globalBatch", &job_spec->elastic.global_batch)) {
    job_spec->elastic.global_batch = job_spec->elastic.min_replicas < job_spec->elastic.max_replicas
                                         ? GlobalBatch::kScaleWithWorld
                                         : GlobalBatch::kFixed;
  }
  reader.ReadBool("replaceStragglers", &job_spec->elastic.replace_stragglers);
  const bool standby_ok = reader.ReadInt("standby", &job_spec->elastic.standby, 0, kMaxReplicas);
  if (standby_ok && replicas_ok &&
      job_spec->replicas + job_spec->elastic.standby > kMaxReplicas) {
    spec.problems()->Add(reader.PathOf("standby"),
                         "replicas + standby must be <= " + std::to_string(kMaxReplicas) +
                             " (got " + std::to_string(job_spec->replicas) + " + " +
                             std::to_string(job_spec->elastic.standby) + ")");
  }
  if (!reader.valid() || (min_given && !min_ok) || (max_given && !max_ok)) return;
  const ElasticSpec& elastic = job_spec->elastic;
  if (min_given && max_given && elastic.min_replicas > elastic.max_replicas) {
    spec.problems()->Add(
        "", reader.PathOf("minReplicas") + " (" + std::to_string(elastic.min_replicas) + ") > " +
                reader.PathOf("maxReplicas") + " (" + std::to_string(elastic.max_replicas) + ")");
    return;
  }
  if (!replicas_ok || !job_spec->elastic_set) return;
  if (job_spec->replicas < elastic.min_replicas) {
    spec.problems()->Add(spec.PathOf("replicas"), "must be >= " + reader.PathOf("minReplicas") +
                                                      " (" + std::to_string(elastic.min_replicas) +
                                                      ") (got " +
                                                      std::to_string(job_spec->replicas) + ")");
  } else if (job_spec->replicas > elastic.max_replicas) {
    spec.problems()->Add(spec.PathOf("replicas"), "must be <= " + reader.PathOf("maxReplicas") +
                                                      " (" + std::to_string(elastic.max_replicas) +
                                                      ") (got " +
                                                      std::to_string(job_spec->replicas) + ")");
  }
}

// `ranksPerWorker`: an integer in 1..kMaxRanksPerWorker, or "auto" (one rank per requested GPU).
// A cuda job's ranks each take one of the pod's GPUs, so it may not ask for more ranks than GPUs.
void ReadRanksPerWorker(const ObjectReader& reader, TrainingJobSpec* spec) {
  const json* value = reader.Find("ranksPerWorker");
  if (value == nullptr) return;
  if (value->is_string()) {
    if (*value != "auto") {
      reader.problems()->Add(reader.PathOf("ranksPerWorker"),
                             "must be a positive integer or \"auto\" (got " + Describe(*value) +
                                 ")");
      return;
    }
    spec->ranks_per_worker = std::max(1, spec->resources.gpus);
  } else if (!reader.ReadInt("ranksPerWorker", &spec->ranks_per_worker, 1, kMaxRanksPerWorker)) {
    return;
  }
  if (spec->trainer && spec->trainer->device == Device::kCuda && spec->resources.gpus > 0 &&
      spec->ranks_per_worker > spec->resources.gpus) {
    reader.problems()->Add(reader.PathOf("ranksPerWorker"),
                           "must be <= spec.resources.gpus (" +
                               std::to_string(spec->resources.gpus) + ") for a cuda trainer: " +
                               "each rank uses one of its pod's GPUs (got " +
                               std::to_string(spec->ranks_per_worker) + ")");
  }
}

void ReadSpec(const ObjectReader& top, TrainingJobSpec* spec) {
  ObjectReader reader = ChildMap(top, "spec");
  if (!reader.valid()) return;
  bool replicas_ok = reader.Require("replicas") && reader.ReadInt("replicas", &spec->replicas, 1, kMaxReplicas);
  ReadElastic(reader, replicas_ok, spec);

  bool has_trainer = reader.Has("trainer"), has_command = reader.Has("command");
  if (has_trainer == has_command) {
    reader.problems()->Add(reader.path(),
                           std::string("exactly one of trainer and command must be set (got ") +
                               (has_trainer ? "both" : "neither") + ")");
  }
  if (has_trainer) {
    spec->trainer.emplace();
    ReadTrainer(reader, &*spec->trainer);
  }
  if (reader.ReadStringList("command", &spec->command) && has_command) {
    if (spec->elastic.replace_stragglers) {
      reader.problems()->Add(
          reader.PathOf("elastic") + ".replaceStragglers",
          "a command job reports no pace, so no straggler is ever named: only the built-in "
          "trainer (spec.trainer) can have its stragglers replaced");
    }
    if (spec->command.empty()) {
      reader.problems()->Add(reader.PathOf("command"), "must not be empty");
    } else if (spec->command.front().empty()) {
      reader.problems()->Add(internal::IndexPath(reader.PathOf("command"), 0),
                             "must name the program to run (got \"\")");
    }
  }
  reader.ReadString("image", &spec->image);
  ObjectReader resources = ChildMap(reader, "resources");
  // A pod of more GPUs than ranks it may run does not exist; "auto" makes one rank per GPU.
  resources.ReadInt("gpus", &spec->resources.gpus, 0, kMaxRanksPerWorker);
  ReadQuantity(resources, "cpu", &spec->resources.cpu);
  ReadQuantity(resources, "memory", &spec->resources.memory);
  ReadRanksPerWorker(reader, spec);
  if (const json* pod_template = reader.Find("template")) {
    if (pod_template->is_object()) {
      spec->template_ = *pod_template;
    } else {
      reader.problems()->Add(reader.PathOf("template"),
                             "expected a map (a PodTemplateSpec), got " + Describe(*pod_template));
    }
  }
  ReadCheckpoint(reader, &spec->checkpoint);
  ReadNetwork(reader, &spec->network);
  ReadRunPolicy(reader, &spec->run_policy);
  ReadPlacement(reader, spec);
  if (replicas_ok) CheckPipeline(reader, *spec);
  ObjectReader metrics = ChildMap(reader, "metrics");
  metrics.ReadInt("port", &spec->metrics.port, 0, 65535);
}

StatusOr<TrainingJob> ParseDocument(const json& document, const std::string& source,
                                    Problems problems) {
  TrainingJob job;
  if (document.is_null()) {
    problems.Add("", "empty document: expected a TrainingJob manifest");
    return InvalidArgumentError(problems.Join(source));
  }
  if (!document.is_object()) {
    problems.Add(
        "", "expected a TrainingJob manifest (a map) at the top level, got " + Describe(document));
    return InvalidArgumentError(problems.Join(source));
  }
  ObjectReader top(document, "", ManifestFields(""), &problems);
  std::string api_version, kind;
  if (top.Require("apiVersion") && top.ReadString("apiVersion", &api_version) &&
      api_version != kApiVersion) {
    problems.Add("apiVersion", std::string("must be ") + kApiVersion + " (got " +
                                   Describe(json(api_version)) + ")");
  }
  if (top.Require("kind") && top.ReadString("kind", &kind) && kind != kKind) {
    problems.Add("kind", std::string("must be ") + kKind + " (got " + Describe(json(kind)) + ")");
  }
  if (top.Require("metadata")) ReadMetadata(top, &job.metadata);
  if (top.Require("spec")) ReadSpec(top, &job.spec);
  if (!problems.empty()) return InvalidArgumentError(problems.Join(source));
  return job;
}

}  // namespace

StatusOr<TrainingJob> ParseTrainingJobJson(const nlohmann::json& document,
                                           const std::string& source) {
  try {
    return ParseDocument(document, source, Problems());
  } catch (const std::exception& error) {
    // Types are checked before every access, so this is a bug here, not bad input.
    return InternalError(source + ": reading the manifest: " + error.what());
  }
}

StatusOr<TrainingJob> ParseTrainingJobYaml(const std::string& text, const std::string& source) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::Exception& error) {
    std::string where = source;
    if (!error.mark.is_null()) {
      where +=
          ":" + std::to_string(error.mark.line + 1) + ":" + std::to_string(error.mark.column + 1);
    }
    Problems problems;
    problems.Add("", "malformed YAML: " + error.msg);
    return InvalidArgumentError(problems.Join(where));
  }
  Problems problems;
  if (documents.size() > 1) {
    problems.Add("", "expected one YAML document, got " + std::to_string(documents.size()));
    return InvalidArgumentError(problems.Join(source));
  }
  json document;
  try {
    if (!documents.empty()) document = internal::YamlToJson(documents.front(), &problems);
  } catch (const std::exception& error) {
    // yaml-cpp's accessors and nlohmann's containers may throw; neither escapes this module.
    problems.Add("", std::string("cannot read the YAML document: ") + error.what());
    return InvalidArgumentError(problems.Join(source));
  }
  try {
    return ParseDocument(document, source, std::move(problems));
  } catch (const std::exception& error) {
    return InternalError(source + ": reading the manifest: " + error.what());
  }
}

}  // namespace lockstep::spec
