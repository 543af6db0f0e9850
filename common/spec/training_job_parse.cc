// The manifest walker: reads a TrainingJob from its JSON form (YAML is converted first) field by
// field, applying defaults and collecting every problem. ParseTrainingJobYaml and
// ParseTrainingJobJson both end here, so the two formats cannot drift apart.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "common/spec/field_reader.h"
#include "common/spec/manifest_fields.h"
#include "common/spec/parse_sections.h"
#include "common/spec/problems.h"
#include "common/spec/training_job.h"
#include "common/spec/yaml_to_json.h"

namespace lockstep::spec {

namespace internal {

ObjectReader ChildMap(const ObjectReader& parent, std::string_view key) {
  return parent.Child(key, ManifestFields(parent.PathOf(key)));
}

}  // namespace internal

namespace {

using internal::Bound;
using internal::ChildMap;
using internal::Describe;
using internal::kMaxInt32;
using internal::ObjectReader;
using internal::Problems;
using internal::ReadTrainer;
using json = nlohmann::json;

constexpr char kApiVersion[] = "lockstep.io/v1alpha1";
constexpr char kKind[] = "TrainingJob";

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

// A quantity of bytes ("64Mi", "1G", "4096") as a whole number within 1..max; a problem naming
// the field otherwise. Fractions of a byte ("500m") are refused.
void ReadByteQuantity(const ObjectReader& reader, std::string_view key, int64_t max,
                      int64_t* out) {
  std::string value;
  if (!reader.ReadIntOrString(key, &value)) return;
  const double bytes = IsQuantity(value) ? QuantityValue(value) : std::nan("");
  if (std::isnan(bytes) || bytes != std::floor(bytes)) {
    reader.problems()->Add(reader.PathOf(key),
                           "must be a whole number of bytes, a Kubernetes quantity such as "
                           "\"64Mi\" or \"1G\" (got " + Describe(json(value)) + ")");
    return;
  }
  if (bytes < 1 || bytes > static_cast<double>(max)) {
    reader.problems()->Add(reader.PathOf(key), "must be within 1.." + std::to_string(max) +
                                                   " bytes (got " + value + ")");
    return;
  }
  *out = static_cast<int64_t>(bytes);
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

// What spec.template's "worker" container may not say: an image other than spec.image's (both
// name the worker's image: one would silently lose), a command or args (what the worker runs is
// the operator's: lockstep-worker train, or the agent running spec.command).
void CheckTemplateWorker(const ObjectReader& reader, const TrainingJobSpec& spec) {
  const json& pod_template = spec.template_;
  if (!pod_template.is_object() || !pod_template.contains("spec") ||
      !pod_template["spec"].is_object()) {
    return;
  }
  const json& containers = pod_template["spec"].value("containers", json());
  if (!containers.is_array()) return;
  for (size_t i = 0; i < containers.size(); ++i) {
    const json& container = containers[i];
    if (!container.is_object() || container.value("name", "") != kWorkerContainerName) continue;
    const std::string path = internal::IndexPath(reader.PathOf("template") + ".spec.containers", i);
    if (container.contains("image")) {
      const json& image = container["image"];
      if (!image.is_string() || image.get<std::string>().empty()) {
        reader.problems()->Add(path + ".image",
                               "must be an image name (got " + Describe(image) + ")");
      } else if (!spec.image.empty() && image.get<std::string>() != spec.image) {
        reader.problems()->Add(path + ".image", "names " + image.get<std::string>() +
                                                    " but spec.image names " + spec.image +
                                                    ": name the worker's image once");
      }
    }
    for (const char* field : {"command", "args"}) {
      if (!container.contains(field)) continue;
      reader.problems()->Add(
          path + "." + field,
          spec.trainer.has_value()
              ? std::string("the worker runs the built-in trainer (lockstep-worker train); "
                            "to run a program of yours, use spec.command instead of "
                            "spec.trainer")
              : std::string("the worker runs the Lockstep agent, which runs spec.command: put "
                            "the program and its arguments in spec.command"));
    }
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
  CheckTemplateWorker(reader, *spec);
  ReadCheckpoint(reader, &spec->checkpoint);
  ReadNetwork(reader, &spec->network);
  ReadRunPolicy(reader, &spec->run_policy);
  ReadPlacement(reader, spec);
  if (replicas_ok) internal::CheckPipeline(reader, *spec);
  if (reader.Has("parameterServers")) {
    ObjectReader servers = ChildMap(reader, "parameterServers");
    servers.Require("replicas");
    servers.ReadInt("replicas", &spec->parameter_servers.replicas, 1, kMaxParameterServers);
    ObjectReader server_resources = ChildMap(servers, "resources");
    server_resources.ReadInt("gpus", &spec->parameter_servers.resources.gpus, 0, kMaxInt32);
    ReadQuantity(server_resources, "cpu", &spec->parameter_servers.resources.cpu);
    ReadQuantity(server_resources, "memory", &spec->parameter_servers.resources.memory);
  }
  internal::CheckParameterServers(reader, *spec);
  ObjectReader metrics = ChildMap(reader, "metrics");
  metrics.ReadInt("port", &spec->metrics.port, 0, 65535);
  ObjectReader store = ChildMap(ChildMap(reader, "rendezvous"), "store");
  store.ReadInt("maxKeys", &spec->rendezvous.store.max_keys, 1, kMaxStoreKeys);
  ReadByteQuantity(store, "maxBytes", kMaxStoreBytes, &spec->rendezvous.store.max_bytes);
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
