// The TrainingJob (lockstep.io/v1alpha1) spec model: one C++ model of the manifest that the
// operator, the worker and `lockstep run` all use.
//
//   StatusOr<TrainingJob> job = LoadTrainingJobFile("examples/fashion-mnist.yaml");
//   if (!job.ok()) { std::cerr << job.status().message(); return 2; }   // one problem per line
//
// Parsing reads YAML (yaml-cpp) or JSON (a JSON document is YAML, and ParseTrainingJobJson takes
// nlohmann::json for the operator's watch stream), applies the defaults written below, and
// validates. Every problem is reported, one per line, each naming the field by its path and the
// problem, e.g.
//   spec.elastic.minReplicas (5) > spec.elastic.maxReplicas (4)
//   spec.trainer.bachSize: unknown field (did you mean "batchSize"?)
// Unknown fields are errors, never silently dropped. The CRD in crds/ is the same schema for the
// API server; keep the two in step (the field names of both are checked against the one table of
// manifest_fields.h by tests/common/spec/crd_schema_test.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace lockstep::spec {

enum class Activation { kRelu, kGelu, kTanh };
enum class DataFormat { kIdx, kCsv, kClickLog };
enum class OptimizerType { kSgd, kAdamW };
enum class LrScaling { kNone, kLinear };
enum class Device { kCpu, kCuda };
enum class Precision { kFp32, kBf16 };
enum class Compression { kNone, kBf16, kFp16 };
enum class SyncStrategy { kAllreduce, kLocalSgd, kDgc, kParameterServer };
enum class ParameterServerMode { kSync, kAsync, kGeo };
enum class NetworkMode { kTcp, kRoce, kInfiniband };
enum class RestartPolicy { kOnFailure, kExitCode, kNever };
enum class GangScheduler { kNone, kVolcano, kSchedulerPlugins };
enum class GlobalBatch { kFixed, kScaleWithWorld };
enum class PlacementMode { kRequired, kPreferred };
enum class PipelineSchedule { kGpipe, k1F1B };

const char* ToString(Activation value);     // "relu" | "gelu" | "tanh"
const char* ToString(DataFormat value);     // "idx" | "csv" | "clickLog"
const char* ToString(OptimizerType value);  // "sgd" | "adamw"
const char* ToString(LrScaling value);      // "none" | "linear"
const char* ToString(Device value);         // "cpu" | "cuda"
const char* ToString(Precision value);      // "fp32" | "bf16"
const char* ToString(Compression value);    // "none" | "bf16" | "fp16"
const char* ToString(SyncStrategy value);   // "allreduce" | "localSGD" | "dgc" | "parameterServer"
const char* ToString(ParameterServerMode value);  // "sync" | "async" | "geo"
const char* ToString(NetworkMode value);    // "tcp" | "roce" | "infiniband"
const char* ToString(RestartPolicy value);  // "OnFailure" | "ExitCode" | "Never"
const char* ToString(GangScheduler value);  // "" (none) | "volcano" | "scheduler-plugins"
const char* ToString(GlobalBatch value);    // "fixed" | "scaleWithWorld"
const char* ToString(PlacementMode value);  // "required" | "preferred"
const char* ToString(PipelineSchedule value);  // "gpipe" | "1f1b"

struct ObjectMeta {
  std::string name;                    // required, a DNS-1123 label
  std::string namespace_ = "default";  // `namespace`
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
  std::string uid;         // set by the API server; empty locally
  int64_t generation = 0;  // set by the API server
};

struct ElasticSpec {
  int32_t min_replicas = 0;  // default: replicas
  int32_t max_replicas = 0;  // default: replicas
  // `globalBatch`: what one step of the built-in trainer trains when the world is not `replicas`
  // workers (a failure being replaced, or an elastic job above or below it).
  //  - fixed: replicas x ranksPerWorker x batchSize samples at every world size; survivors take
  //    larger slices (in micro-batches of at most batchSize), so the model does not depend on
  //    when failures happened. The default of a fixed-size job (minReplicas == maxReplicas).
  //  - scaleWithWorld: world size x batchSize, each rank a batch of batchSize. The default of an
  //    elastic job (minReplicas < maxReplicas): throughput follows the membership.
  // Resolved after parsing. A command job ignores it (its program picks its own batch).
  GlobalBatch global_batch = GlobalBatch::kFixed;
  // `replaceStragglers`: a worker the rendezvous service names a straggler (docs/elastic.md,
  // "Stragglers") is replaced: its pod deleted and created again, preferring another node
  // (`lockstep run`: its process killed and started again), not counted as a restart. Only the
  // built-in trainer reports the pace stragglers are found by, so a command job may not ask.
  bool replace_stragglers = false;
  // `standby`: hot-standby workers kept beside the job's `replicas`: scheduled, started and
  // waiting in the rendezvous, never training. A lost worker's place is taken by a standby in
  // the generation that re-forms at once, and the failed worker's replacement becomes a standby
  // in turn. With standbys the world never grows past `replicas` (docs/elastic.md).
  int32_t standby = 0;
};

// `embedding`: a sparse input (docs/parameter-servers.md): each sample's `fields` categorical
// features select rows of one shared table of `rows` rows of `dim` floats (each feature hashed
// to its row), and the fields' rows, concatenated, are the MLP's input. Trained only through
// parameter servers (sync.strategy parameterServer), on data of format clickLog.
struct EmbeddingSpec {
  int32_t fields = 0;               // required, 1..kMaxEmbeddingFields
  int32_t dim = 8;                  // 1..kMaxEmbeddingDim
  int64_t rows = int64_t{1} << 20;  // 1..kMaxEmbeddingRows
};
inline constexpr int32_t kMaxEmbeddingFields = 1024;
inline constexpr int32_t kMaxEmbeddingDim = 4096;
inline constexpr int64_t kMaxEmbeddingRows = int64_t{1} << 40;

struct ModelSpec {
  std::string type = "mlp";          // only "mlp" for now
  std::vector<int32_t> hidden{256};  // each >= 1
  Activation activation = Activation::kRelu;
  std::optional<EmbeddingSpec> embedding;
};

struct DataSpec {
  DataFormat format = DataFormat::kIdx;
  // idx: [images, labels]; csv: [file] whose rows are features..., label (last column);
  // clickLog: [file] whose lines are label<TAB>feature<TAB>feature... (one categorical feature
  // per embedding field, any text: it is hashed; worker/ps/click_log.h).
  // URIs: file:///abs/path or a plain path (relative to the manifest's directory).
  std::vector<std::string> train;
  std::vector<std::string> test;  // optional: no evaluation when empty
};

struct OptimizerSpec {
  OptimizerType type = OptimizerType::kSgd;
  double learning_rate = 0.05;  // > 0
  double momentum = 0.9;        // [0, 1) for sgd
  double weight_decay = 0.0;    // >= 0
  LrScaling lr_scaling = LrScaling::kNone;
  int64_t warmup_steps = 0;  // >= 0
  double beta1 = 0.9;        // adamw
  double beta2 = 0.999;      // adamw
  double epsilon = 1e-8;     // adamw
};

struct AllreduceSpec {
  double bucket_mib = 25;  // > 0
  Compression compression = Compression::kNone;
  int64_t timeout_seconds = 300;  // > 0
};

// `sync`: how the ranks keep one model (worker/trainer/trainer.h, local_sgd.h, dgc.h).
//  - allreduce: every step's gradients are summed over the ranks (the default).
//  - localSGD: every rank steps on its own gradients and the ranks average their parameters
//    every `period` steps (Stich 2019); with `startStep` > 0 the steps before it all-reduce
//    gradients (post-local SGD, Lin et al. 2020).
//  - dgc: Deep Gradient Compression (Lin et al. 2018): each rank sends only the largest
//    `1 - sparsity` of its momentum-corrected gradient per bucket and keeps the rest as a local
//    residual; the sparsity ramps from 75% to the target over `warmupSteps`; buckets smaller than
//    `minBucketElements` are all-reduced densely.
struct LocalSgdSpec {
  int64_t period = 8;      // H, >= 1
  int64_t start_step = 0;  // >= 0
};
struct DgcSpec {
  double sparsity = 0.999;             // [0, 1)
  int64_t warmup_steps = 0;            // >= 0
  int64_t min_bucket_elements = 16384;  // >= 1
};
//  - parameterServer: the model lives on the job's parameter servers (spec.parameterServers);
//    each worker pulls the rows and parameters its batch needs and pushes their gradients
//    (docs/parameter-servers.md). `mode`: sync (every step waits for every worker's previous
//    one: synchronous SGD), async (no step waits; `staleness` S >= 0 bounds how many steps a
//    worker may run ahead of the slowest, stale synchronous parallel), geo (Geo-SGD: workers
//    train local copies and push their changes every `geoInterval` steps).
struct ParameterServerSyncSpec {
  ParameterServerMode mode = ParameterServerMode::kAsync;
  int64_t staleness = -1;    // async only: -1 unbounded, else >= 0
  int64_t geo_interval = 8;  // geo: >= 1
};
struct SyncSpec {
  SyncStrategy strategy = SyncStrategy::kAllreduce;
  LocalSgdSpec local_sgd;
  DgcSpec dgc;
  ParameterServerSyncSpec parameter_server;
};

// `pipeline`: the model's layers split into `stages` consecutive stages on consecutive ranks;
// the world is stages x D data-parallel replicas of the pipeline, and batchSize stays the batch
// of one replica, cut into `microBatches` (docs/pipeline.md).
struct PipelineSpec {
  int32_t stages = 1;  // 1: no pipeline
  int32_t micro_batches = 1;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  bool recompute = false;
  // `stageLayers`: the layers of each stage (stages entries summing to the model's layers);
  // empty: the trainer balances the stages' compute.
  std::vector<int32_t> stage_layers;
};

struct TrainerSpec {
  ModelSpec model;
  DataSpec data;
  int64_t batch_size = 64;  // per worker, >= 1
  int64_t steps = 0;        // exactly one of steps and epochs is > 0
  int64_t epochs = 0;
  OptimizerSpec optimizer;
  uint64_t seed = 1;
  Device device = Device::kCpu;
  // `precision`: bf16 computes the layers' matrix products and activations in bf16 and keeps
  // the parameters, their gradients, the optimizer state and the loss in fp32.
  Precision precision = Precision::kFp32;
  AllreduceSpec allreduce;
  SyncSpec sync;
  PipelineSpec pipeline;
  int64_t log_interval_steps = 50;  // `logIntervalSteps`: progress report period
};

struct ResourcesSpec {
  int32_t gpus = 0;
  std::string cpu;     // Kubernetes quantity, e.g. "8"
  std::string memory;  // Kubernetes quantity, e.g. "64Gi"
};

// `parameterServers`: the job's parameter-server pods (processes under `lockstep run`), each
// holding a shard of the model's tables: row r of a table on server r % replicas. CPU and
// memory only.
struct ParameterServersSpec {
  int32_t replicas = 0;     // 0: none; else 1..kMaxParameterServers
  ResourcesSpec resources;  // gpus must be 0
};
inline constexpr int32_t kMaxParameterServers = 1024;
// Most bytes of a table one parameter server holds (worker/ps/shard_table.h: the same bound).
inline constexpr int64_t kMaxParameterServerShardBytes = int64_t{4} << 30;

struct CheckpointSpec {
  std::string uri;             // "" (none) | file:///path | hdfs://host:port/path
  int64_t interval_steps = 0;  // 0: only at the end
  int32_t keep = 3;            // >= 1
  bool async = true;
};

struct RdmaResource {
  std::string name;  // e.g. rdma/roce_shared
  int32_t count = 1;
};

struct NetworkSpec {
  NetworkMode mode = NetworkMode::kTcp;
  RdmaResource rdma_resource;
  std::vector<std::string> multus_networks;
  bool host_network = false;
  std::map<std::string, std::string> nccl_env;
};

struct SchedulingSpec {
  GangScheduler gang = GangScheduler::kNone;
  std::string queue = "default";
  std::string priority_class_name;
  int64_t schedule_timeout_seconds = 600;
};

// `placement`: keep the job's pods within one domain of a network level, a node label key such
// as a rack or block label (`topology`). Required or preferred; Volcano names levels by the tier
// of its HyperNodes instead (`volcanoTier`, read only with gang volcano).
struct PlacementSpec {
  std::string topology;  // a node label key; empty: no placement
  PlacementMode mode = PlacementMode::kRequired;
  int32_t volcano_tier = 0;  // >= 1 when set
};

struct RunPolicy {
  RestartPolicy restart_policy = RestartPolicy::kOnFailure;
  int32_t backoff_limit = 6;                          // >= 0
  std::optional<int64_t> active_deadline_seconds;     // > 0 when set
  std::optional<int64_t> ttl_seconds_after_finished;  // >= 0 when set
  bool suspend = false;
  SchedulingSpec scheduling;
  // ExitCode policy: exit codes that are retried (default: 128+ signals and 1..127 are not,
  // PyTorchJob's convention: retryable = 130, 137, 143 and codes in this list).
  std::vector<int32_t> retryable_exit_codes;
};

struct MetricsSpec {
  int32_t port = 9400;  // 0: no endpoint; else 1..65535
};

// `rendezvous.store`: what the job's rendezvous store may hold (common/rendezvous/
// generation_stores.h, StoreLimits), in place of the limits scaled to the ranks of its
// generations. 0: that default. Past a limit a member's call is refused (RESOURCE_EXHAUSTED) and
// the job's StoreLimit condition says so.
struct RendezvousStoreSpec {
  int64_t max_keys = 0;   // `maxKeys`: keys held across the job's two latest generations
  int64_t max_bytes = 0;  // `maxBytes` (a quantity: "64Mi"): their keys', values' and held gets' bytes
};

struct RendezvousSpec {
  RendezvousStoreSpec store;
};

// Most a job may ask its rendezvous store to hold (`rendezvous.store`): far more than a small
// job's bootstraps need, and a bound past which a value is a typo, not a job.
inline constexpr int64_t kMaxStoreKeys = 10000000;
inline constexpr int64_t kMaxStoreBytes = int64_t{16} << 30;

// Most worker pods one job may ask for (`replicas`, `elastic.maxReplicas`): ten times the largest
// cluster Kubernetes is tested at (5,000 nodes); past it a typo, not a job. Every count that is
// sized from replicas (pods, rendezvous slots, local processes) stays small at this bound.
inline constexpr int32_t kMaxReplicas = 50000;

// Most stages of a pipeline (`trainer.pipeline.stages`): Megatron-LM's largest runs use a few
// dozen; past this a typo.
inline constexpr int32_t kMaxPipelineStages = 1024;

// Most ranks one worker pod may run (`ranksPerWorker`): a node's GPUs or cores, with room.
inline constexpr int32_t kMaxRanksPerWorker = 256;

struct TrainingJobSpec {
  int32_t replicas = 0;  // required, >= 1: worker pods
  // `ranksPerWorker`: ranks (processes) per worker pod, rank = pod index * this + local rank
  // (torchrun's --nproc-per-node). Resolved: "auto" is one per requested GPU, at least 1.
  int32_t ranks_per_worker = 1;
  ElasticSpec elastic;   // resolved: min/max always set after parsing
  bool elastic_set = false;
  std::optional<TrainerSpec> trainer;  // exactly one of trainer and command
  std::vector<std::string> command;
  std::string image;
  ResourcesSpec resources;
  nlohmann::json template_;  // `template`: PodTemplateSpec merged into every pod (object or null)
  CheckpointSpec checkpoint;
  NetworkSpec network;
  RunPolicy run_policy;
  PlacementSpec placement;
  MetricsSpec metrics;
  ParameterServersSpec parameter_servers;
  RendezvousSpec rendezvous;
};

// Worker pods (or `lockstep run` processes) the job runs: replicas plus its standbys.
inline int32_t WorkersToRun(const TrainingJobSpec& spec) {
  return spec.replicas + spec.elastic.standby;
}

// Most pods a generation admits: maxReplicas, or replicas when the job keeps standbys (they
// wait for a place to free up rather than train beside the others).
inline int32_t MaxWorld(const TrainingJobSpec& spec) {
  return spec.elastic.standby > 0 ? spec.replicas : spec.elastic.max_replicas;
}

// Pods that hold whole pipeline replicas: every generation is a multiple of this many pods
// (stages / gcd(stages, ranksPerWorker)); 1 without a pipeline.
inline int32_t PodsPerPipelineReplicas(const TrainingJobSpec& spec) {
  const int32_t stages = spec.trainer.has_value() ? spec.trainer->pipeline.stages : 1;
  if (stages <= 1) return 1;
  int32_t a = stages, b = std::max<int32_t>(1, spec.ranks_per_worker);
  while (b != 0) a = std::exchange(b, a % b);
  return stages / a;
}

struct TrainingJob {
  std::string api_version = "lockstep.io/v1alpha1";
  std::string kind = "TrainingJob";
  ObjectMeta metadata;
  TrainingJobSpec spec;
  // Directory of the manifest file; relative data paths resolve against it. Empty: cwd.
  std::string base_dir;
};

// Field-by-field equality (template_ compared as JSON; base_dir included for TrainingJob). The
// operator compares specs to decide whether anything changed.
bool operator==(const ObjectMeta& a, const ObjectMeta& b);
bool operator==(const ElasticSpec& a, const ElasticSpec& b);
bool operator==(const EmbeddingSpec& a, const EmbeddingSpec& b);
bool operator==(const ModelSpec& a, const ModelSpec& b);
bool operator==(const DataSpec& a, const DataSpec& b);
bool operator==(const OptimizerSpec& a, const OptimizerSpec& b);
bool operator==(const AllreduceSpec& a, const AllreduceSpec& b);
bool operator==(const ParameterServerSyncSpec& a, const ParameterServerSyncSpec& b);
bool operator==(const SyncSpec& a, const SyncSpec& b);
bool operator==(const PipelineSpec& a, const PipelineSpec& b);
bool operator==(const TrainerSpec& a, const TrainerSpec& b);
bool operator==(const ResourcesSpec& a, const ResourcesSpec& b);
bool operator==(const ParameterServersSpec& a, const ParameterServersSpec& b);
bool operator==(const CheckpointSpec& a, const CheckpointSpec& b);
bool operator==(const RdmaResource& a, const RdmaResource& b);
bool operator==(const NetworkSpec& a, const NetworkSpec& b);
bool operator==(const SchedulingSpec& a, const SchedulingSpec& b);
bool operator==(const PlacementSpec& a, const PlacementSpec& b);
bool operator==(const RunPolicy& a, const RunPolicy& b);
bool operator==(const MetricsSpec& a, const MetricsSpec& b);
bool operator==(const RendezvousSpec& a, const RendezvousSpec& b);
bool operator==(const TrainingJobSpec& a, const TrainingJobSpec& b);
bool operator==(const TrainingJob& a, const TrainingJob& b);
inline bool operator!=(const TrainingJobSpec& a, const TrainingJobSpec& b) { return !(a == b); }
inline bool operator!=(const TrainingJob& a, const TrainingJob& b) { return !(a == b); }

// Parses and validates. On failure: InvalidArgument whose message holds every problem, one per
// line, each prefixed by `source` ("examples/x.yaml: spec.replicas: must be within 1..50000 (got 0)").
StatusOr<TrainingJob> ParseTrainingJobYaml(const std::string& text, const std::string& source);
StatusOr<TrainingJob> ParseTrainingJobJson(const nlohmann::json& document,
                                           const std::string& source);
// A Kubernetes quantity's value ("64Gi" -> 68719476736, "500m" -> 0.5, "1e3" -> 1000); NaN when
// `quantity` is not one (the parser has refused such a manifest already).
double QuantityValue(const std::string& quantity);

// Most bytes a manifest file may hold: etcd's default request limit (1.5 MiB), the largest
// object a cluster stores, so a manifest that loads here could also be applied.
inline constexpr size_t kMaxManifestBytes = 1536 * 1024;

// Reads the file (NotFound naming it when missing) and parses it; sets base_dir.
StatusOr<TrainingJob> LoadTrainingJobFile(const std::string& path);
// A worker's manifest (lockstep-worker train|exec|ps): the file at `path` when it is not empty,
// else the JSON of the LOCKSTEP_SPEC environment variable (ToJson's, as the operator gives its
// pods); INVALID_ARGUMENT naming both when neither is there, or LOCKSTEP_SPEC when it is not JSON.
StatusOr<TrainingJob> LoadTrainingJobFileOrEnv(const std::string& path);
// A manifest file's bytes: a regular file only (a FIFO or a device is refused before anything is
// read), at most kMaxManifestBytes (InvalidArgument naming the limit past that).
StatusOr<std::string> ReadManifestFile(const std::string& path);

// Problems the schema cannot see, on this machine's file system: data files that do not exist or
// cannot be read, a file:// checkpoint directory below something that is not a directory. One
// per line, naming the field and the file: "spec.trainer.data.train[1]: file not found: /x/y.gz".
std::vector<std::string> CheckDataFiles(const TrainingJob& job);
// "spec.checkpoint.uri: /a/b is not a directory, ..." when a file:// checkpoint directory can
// never be created; "" when it exists, can be, or the URI is not file://.
std::string CheckCheckpointDirectory(const std::string& uri);

// A file:// URI or plain path resolved to an absolute path (relative to job.base_dir).
std::string ResolveDataPath(const TrainingJob& job, const std::string& uri);

// The name of the container that runs the worker, in the pods and in spec.template.
inline constexpr char kWorkerContainerName[] = "worker";

// The image named for the worker container: spec.template's "worker" container's image (how a
// Kubernetes user names an image), else spec.image; "" when neither names one (the operator's
// default worker image then). ParseTrainingJobJson refuses a manifest whose two differ.
std::string NamedWorkerImage(const TrainingJobSpec& spec);

// Serialization in the manifest's own camelCase form; ParseTrainingJobJson(ToJson(job)) == job.
nlohmann::json ToJson(const TrainingJob& job);

// Samples one step of the built-in trainer trains at `world_size` ranks (see
// ElasticSpec::global_batch): replicas x ranksPerWorker x batchSize for globalBatch fixed,
// world_size x batchSize for scaleWithWorld; divided by trainer.pipeline.stages (a replica of
// the pipeline trains one batchSize); at least 1. Requires spec.trainer.
int64_t GlobalBatchSize(const TrainingJobSpec& spec, int32_t world_size);

// Total steps the trainer will run for a given dataset size and world size (steps, or epochs
// converted with GlobalBatchSize). Used for progress and time-left displays. Requires
// spec.trainer.
int64_t TotalSteps(const TrainingJobSpec& spec, int64_t train_samples, int32_t world_size);

}  // namespace lockstep::spec
