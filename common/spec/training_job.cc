// The TrainingJob model's small pieces: enum names, equality, file loading, data paths and step
// counts. Parsing lives in training_job_parse.cc, serialization in training_job_json.cc.
#include "common/spec/training_job.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include "common/env.h"
#include "common/spec/enum_names.h"

namespace lockstep::spec {

const char* ToString(Activation value) { return internal::EnumToString(value); }
const char* ToString(DataFormat value) { return internal::EnumToString(value); }
const char* ToString(OptimizerType value) { return internal::EnumToString(value); }
const char* ToString(LrScaling value) { return internal::EnumToString(value); }
const char* ToString(Device value) { return internal::EnumToString(value); }
const char* ToString(Precision value) { return internal::EnumToString(value); }
const char* ToString(PipelineSchedule value) { return internal::EnumToString(value); }
const char* ToString(Compression value) { return internal::EnumToString(value); }
const char* ToString(SyncStrategy value) { return internal::EnumToString(value); }
const char* ToString(ParameterServerMode value) { return internal::EnumToString(value); }
const char* ToString(NetworkMode value) { return internal::EnumToString(value); }
const char* ToString(RestartPolicy value) { return internal::EnumToString(value); }
const char* ToString(GangScheduler value) { return internal::EnumToString(value); }
const char* ToString(GlobalBatch value) { return internal::EnumToString(value); }
const char* ToString(PlacementMode value) { return internal::EnumToString(value); }

bool operator==(const ObjectMeta& a, const ObjectMeta& b) {
  return std::tie(a.name, a.namespace_, a.labels, a.annotations, a.uid, a.generation) ==
         std::tie(b.name, b.namespace_, b.labels, b.annotations, b.uid, b.generation);
}
bool operator==(const ElasticSpec& a, const ElasticSpec& b) {
  return a.min_replicas == b.min_replicas && a.max_replicas == b.max_replicas &&
         a.global_batch == b.global_batch && a.replace_stragglers == b.replace_stragglers &&
         a.standby == b.standby;
}
bool operator==(const ModelSpec& a, const ModelSpec& b) {
  return std::tie(a.type, a.hidden, a.activation, a.embedding) ==
         std::tie(b.type, b.hidden, b.activation, b.embedding);
}
bool operator==(const DataSpec& a, const DataSpec& b) {
  return std::tie(a.format, a.train, a.test) == std::tie(b.format, b.train, b.test);
}
bool operator==(const OptimizerSpec& a, const OptimizerSpec& b) {
  return std::tie(a.type, a.learning_rate, a.momentum, a.weight_decay, a.lr_scaling, a.warmup_steps,
                  a.beta1, a.beta2,
                  a.epsilon) == std::tie(b.type, b.learning_rate, b.momentum, b.weight_decay,
                                         b.lr_scaling, b.warmup_steps, b.beta1, b.beta2, b.epsilon);
}
bool operator==(const AllreduceSpec& a, const AllreduceSpec& b) {
  return std::tie(a.bucket_mib, a.compression, a.timeout_seconds) ==
         std::tie(b.bucket_mib, b.compression, b.timeout_seconds);
}
bool operator==(const EmbeddingSpec& a, const EmbeddingSpec& b) {
  return std::tie(a.fields, a.dim, a.rows) == std::tie(b.fields, b.dim, b.rows);
}
bool operator==(const ParameterServerSyncSpec& a, const ParameterServerSyncSpec& b) {
  return std::tie(a.mode, a.staleness, a.geo_interval) ==
         std::tie(b.mode, b.staleness, b.geo_interval);
}
bool operator==(const SyncSpec& a, const SyncSpec& b) {
  return std::tie(a.strategy, a.local_sgd.period, a.local_sgd.start_step, a.dgc.sparsity,
                  a.dgc.warmup_steps, a.dgc.min_bucket_elements) ==
             std::tie(b.strategy, b.local_sgd.period, b.local_sgd.start_step, b.dgc.sparsity,
                      b.dgc.warmup_steps, b.dgc.min_bucket_elements) &&
         a.parameter_server == b.parameter_server;
}
bool operator==(const PipelineSpec& a, const PipelineSpec& b) {
  return std::tie(a.stages, a.micro_batches, a.schedule, a.recompute, a.stage_layers) ==
         std::tie(b.stages, b.micro_batches, b.schedule, b.recompute, b.stage_layers);
}
bool operator==(const TrainerSpec& a, const TrainerSpec& b) {
  return a.model == b.model && a.data == b.data && a.batch_size == b.batch_size &&
         a.steps == b.steps && a.epochs == b.epochs && a.optimizer == b.optimizer &&
         a.seed == b.seed && a.device == b.device && a.precision == b.precision &&
         a.allreduce == b.allreduce && a.sync == b.sync && a.pipeline == b.pipeline &&
         a.log_interval_steps == b.log_interval_steps;
}
bool operator==(const ResourcesSpec& a, const ResourcesSpec& b) {
  return std::tie(a.gpus, a.cpu, a.memory) == std::tie(b.gpus, b.cpu, b.memory);
}
bool operator==(const ParameterServersSpec& a, const ParameterServersSpec& b) {
  return a.replicas == b.replicas && a.resources == b.resources;
}
bool operator==(const CheckpointSpec& a, const CheckpointSpec& b) {
  return std::tie(a.uri, a.interval_steps, a.keep, a.async) ==
         std::tie(b.uri, b.interval_steps, b.keep, b.async);
}
bool operator==(const RdmaResource& a, const RdmaResource& b) {
  return a.name == b.name && a.count == b.count;
}
bool operator==(const NetworkSpec& a, const NetworkSpec& b) {
  return a.mode == b.mode && a.rdma_resource == b.rdma_resource &&
         a.multus_networks == b.multus_networks && a.host_network == b.host_network &&
         a.nccl_env == b.nccl_env;
}
bool operator==(const SchedulingSpec& a, const SchedulingSpec& b) {
  return std::tie(a.gang, a.queue, a.priority_class_name, a.schedule_timeout_seconds) ==
         std::tie(b.gang, b.queue, b.priority_class_name, b.schedule_timeout_seconds);
}
bool operator==(const PlacementSpec& a, const PlacementSpec& b) {
  return std::tie(a.topology, a.mode, a.volcano_tier) ==
         std::tie(b.topology, b.mode, b.volcano_tier);
}
bool operator==(const RunPolicy& a, const RunPolicy& b) {
  return a.restart_policy == b.restart_policy && a.backoff_limit == b.backoff_limit &&
         a.active_deadline_seconds == b.active_deadline_seconds &&
         a.ttl_seconds_after_finished == b.ttl_seconds_after_finished && a.suspend == b.suspend &&
         a.scheduling == b.scheduling && a.retryable_exit_codes == b.retryable_exit_codes;
}
bool operator==(const MetricsSpec& a, const MetricsSpec& b) { return a.port == b.port; }
bool operator==(const RendezvousSpec& a, const RendezvousSpec& b) {
  return a.store.max_keys == b.store.max_keys && a.store.max_bytes == b.store.max_bytes;
}
bool operator==(const TrainingJobSpec& a, const TrainingJobSpec& b) {
  return a.replicas == b.replicas && a.ranks_per_worker == b.ranks_per_worker &&
         a.elastic == b.elastic && a.elastic_set == b.elastic_set && a.trainer == b.trainer &&
         a.command == b.command && a.image == b.image && a.resources == b.resources &&
         a.template_ == b.template_ && a.checkpoint == b.checkpoint && a.network == b.network &&
         a.run_policy == b.run_policy && a.placement == b.placement && a.metrics == b.metrics &&
         a.parameter_servers == b.parameter_servers && a.rendezvous == b.rendezvous;
}
bool operator==(const TrainingJob& a, const TrainingJob& b) {
  return a.api_version == b.api_version && a.kind == b.kind && a.metadata == b.metadata &&
         a.spec == b.spec && a.base_dir == b.base_dir;
}

StatusOr<TrainingJob> LoadTrainingJobFileOrEnv(const std::string& path) {
  if (!path.empty()) return LoadTrainingJobFile(path);
  const std::string text = EnvString("LOCKSTEP_SPEC", "");
  if (text.empty()) {
    return InvalidArgumentError("no manifest: pass --manifest FILE or set LOCKSTEP_SPEC");
  }
  nlohmann::json document = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) return InvalidArgumentError("LOCKSTEP_SPEC: not valid JSON");
  return ParseTrainingJobJson(document, "LOCKSTEP_SPEC");
}

StatusOr<TrainingJob> LoadTrainingJobFile(const std::string& path) {
  namespace fs = std::filesystem;
  StatusOr<std::string> text = ReadManifestFile(path);
  if (!text.ok()) return text.status();
  StatusOr<TrainingJob> job = ParseTrainingJobYaml(*text, path);
  if (!job.ok()) return job;
  std::error_code error;
  fs::path absolute = fs::absolute(path, error);
  if (error) return InternalError(path + ": cannot make the path absolute: " + error.message());
  job->base_dir = absolute.lexically_normal().parent_path().string();
  return job;
}

StatusOr<std::string> ReadManifestFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading must not wait for a writer; the type check below
  // refuses it (and devices, sockets) before anything is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) return NotFoundError(path + ": no such file");
    if (error == EACCES) return PermissionDeniedError(path + ": cannot be read (permission denied)");
    return InvalidArgumentError(path + ": cannot be opened: " + std::strerror(error));
  }
  struct stat info {};
  Status status;
  std::string text;
  if (::fstat(fd, &info) != 0) {
    status = UnknownError(path + ": cannot stat: " + std::strerror(errno));
  } else if (S_ISDIR(info.st_mode)) {
    status = InvalidArgumentError(path + ": is a directory");
  } else if (!S_ISREG(info.st_mode)) {
    status = InvalidArgumentError(path + ": not a regular file (a manifest is read from a file)");
  } else {
    // Read one byte past the limit, whatever the size said: a file may grow while it is read.
    text.resize(kMaxManifestBytes + 1);
    size_t used = 0;
    while (used < text.size()) {
      const ssize_t got = ::read(fd, text.data() + used, text.size() - used);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        status = UnknownError(path + ": read failed: " + std::strerror(errno));
        break;
      }
      if (got == 0) break;
      used += static_cast<size_t>(got);
    }
    text.resize(used);
    if (status.ok() && used > kMaxManifestBytes) {
      status = InvalidArgumentError(path + ": larger than " +
                                    std::to_string(kMaxManifestBytes / 1024) +
                                    " KiB, the most a manifest may be (the API server's limit "
                                    "on one object)");
    }
  }
  ::close(fd);
  if (!status.ok()) return status;
  return text;
}

double QuantityValue(const std::string& quantity) {
  const char* begin = quantity.c_str();
  char* end = nullptr;
  // strtod reads the number and a decimal exponent ("1e3"); what is left is the suffix.
  const double number = std::strtod(begin, &end);
  if (end == begin) return std::nan("");
  static const std::pair<std::string_view, double> kSuffixes[] = {
      {"", 1},        {"Ki", 0x1p10}, {"Mi", 0x1p20}, {"Gi", 0x1p30}, {"Ti", 0x1p40},
      {"Pi", 0x1p50}, {"Ei", 0x1p60}, {"n", 1e-9},    {"u", 1e-6},    {"m", 1e-3},
      {"k", 1e3},     {"M", 1e6},     {"G", 1e9},     {"T", 1e12},    {"P", 1e15},
      {"E", 1e18}};
  const std::string_view suffix(end);
  for (const auto& [name, factor] : kSuffixes) {
    if (suffix == name) return number * factor;
  }
  return std::nan("");
}

std::string NamedWorkerImage(const TrainingJobSpec& spec) {
  const nlohmann::json& pod_template = spec.template_;
  if (pod_template.is_object() && pod_template.contains("spec") &&
      pod_template["spec"].is_object()) {
    const nlohmann::json& containers = pod_template["spec"].value("containers", nlohmann::json());
    if (containers.is_array()) {
      for (const nlohmann::json& container : containers) {
        if (!container.is_object() || container.value("name", "") != kWorkerContainerName) {
          continue;
        }
        const nlohmann::json image = container.value("image", nlohmann::json());
        if (image.is_string() && !image.get<std::string>().empty()) return image;
      }
    }
  }
  return spec.image;
}

std::string ResolveDataPath(const TrainingJob& job, const std::string& uri) {
  namespace fs = std::filesystem;
  constexpr std::string_view kFileScheme = "file://";
  std::string path = uri.rfind(kFileScheme, 0) == 0 ? uri.substr(kFileScheme.size()) : uri;
  fs::path resolved(path);
  if (resolved.is_relative()) {
    std::error_code error;
    fs::path base = job.base_dir.empty() ? fs::current_path(error) : fs::path(job.base_dir);
    resolved = base / resolved;
  }
  return resolved.lexically_normal().string();
}

std::vector<std::string> CheckDataFiles(const TrainingJob& job) {
  namespace fs = std::filesystem;
  std::vector<std::string> problems;
  auto check = [&](const std::vector<std::string>& uris, const std::string& field) {
    for (size_t i = 0; i < uris.size(); ++i) {
      std::string prefix = field + "[" + std::to_string(i) + "]: ";
      std::string path = ResolveDataPath(job, uris[i]);
      std::error_code error;
      fs::file_status status = fs::status(path, error);
      if (!fs::exists(status)) {
        problems.push_back(prefix + "file not found: " + path);
      } else if (!fs::is_regular_file(status)) {
        problems.push_back(prefix + "not a regular file: " + path);
      } else if (!std::ifstream(path, std::ios::binary)) {
        problems.push_back(prefix + "cannot be read: " + path);
      }
    }
  };
  if (job.spec.trainer) {
    check(job.spec.trainer->data.train, "spec.trainer.data.train");
    check(job.spec.trainer->data.test, "spec.trainer.data.test");
  }
  if (std::string problem = CheckCheckpointDirectory(job.spec.checkpoint.uri); !problem.empty()) {
    problems.push_back(problem);
  }
  return problems;
}

std::string CheckCheckpointDirectory(const std::string& uri) {
  namespace fs = std::filesystem;
  constexpr std::string_view kFileScheme = "file://";
  if (uri.rfind(kFileScheme, 0) != 0) return "";  // hdfs:// or none: nothing local to check
  const fs::path directory = fs::path(uri.substr(kFileScheme.size())).lexically_normal();
  // The nearest part of the path that exists must be a directory, or no checkpoint can ever be
  // created below it (the first commit would fail with ENOTDIR after a whole interval of work).
  for (fs::path part = directory; !part.empty(); part = part.parent_path()) {
    std::error_code error;
    const fs::file_status status = fs::status(part, error);
    if (!fs::exists(status)) {
      if (part == part.root_path()) break;
      continue;
    }
    if (fs::is_directory(status)) return "";
    return "spec.checkpoint.uri: " + part.string() + " is not a directory, so " +
           directory.string() + " cannot hold checkpoints";
  }
  return "";
}

int64_t GlobalBatchSize(const TrainingJobSpec& spec, int32_t world_size) {
  const int64_t ranks = spec.elastic.global_batch == GlobalBatch::kFixed
                            ? int64_t{spec.replicas} * spec.ranks_per_worker
                            : int64_t{world_size};
  // A pipeline's stages train one batch together: one batchSize per replica of the pipeline.
  const int64_t stages = std::max<int64_t>(1, spec.trainer->pipeline.stages);
  return std::max<int64_t>(1, spec.trainer->batch_size * (ranks / stages));
}

int64_t TotalSteps(const TrainingJobSpec& spec, int64_t train_samples, int32_t world_size) {
  const TrainerSpec& trainer = *spec.trainer;
  if (trainer.steps > 0) return trainer.steps;
  if (trainer.epochs <= 0 || train_samples <= 0) return 0;
  // An epoch is one pass of the global cursor over the permutation; the last, partial global
  // batch still counts as a step, so every sample is seen once per epoch.
  const int64_t global_batch = GlobalBatchSize(spec, world_size);
  int64_t steps_per_epoch = (train_samples + global_batch - 1) / global_batch;
  return trainer.epochs * steps_per_epoch;
}

}  // namespace lockstep::spec
