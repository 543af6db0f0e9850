// ToJson: the manifest's own camelCase form, with every default written out (the resolved
// manifest), so that ParseTrainingJobJson(ToJson(job)) == job.
#include "common/spec/enum_names.h"
#include "common/spec/training_job.h"

namespace lockstep::spec {
namespace {

using internal::EnumToString;
using json = nlohmann::json;

json MetadataToJson(const ObjectMeta& metadata) {
  json out = {{"name", metadata.name}, {"namespace", metadata.namespace_}};
  if (!metadata.labels.empty()) out["labels"] = metadata.labels;
  if (!metadata.annotations.empty()) out["annotations"] = metadata.annotations;
  if (!metadata.uid.empty()) out["uid"] = metadata.uid;
  if (metadata.generation != 0) out["generation"] = metadata.generation;
  return out;
}

json TrainerToJson(const TrainerSpec& trainer) {
  const OptimizerSpec& optimizer = trainer.optimizer;
  json out = {
      {"model",
       {{"type", trainer.model.type},
        {"hidden", trainer.model.hidden},
        {"activation", EnumToString(trainer.model.activation)}}},
      {"data",
       {{"format", EnumToString(trainer.data.format)},
        {"train", trainer.data.train},
        {"test", trainer.data.test}}},
      {"batchSize", trainer.batch_size},
      {"optimizer",
       {{"type", EnumToString(optimizer.type)},
        {"learningRate", optimizer.learning_rate},
        {"momentum", optimizer.momentum},
        {"weightDecay", optimizer.weight_decay},
        {"lrScaling", EnumToString(optimizer.lr_scaling)},
        {"warmupSteps", optimizer.warmup_steps},
        {"beta1", optimizer.beta1},
        {"beta2", optimizer.beta2},
        {"epsilon", optimizer.epsilon}}},
      {"seed", trainer.seed},
      {"device", EnumToString(trainer.device)},
      {"precision", EnumToString(trainer.precision)},
      {"allreduce",
       {{"bucketMiB", trainer.allreduce.bucket_mib},
        {"compression", EnumToString(trainer.allreduce.compression)},
        {"timeoutSeconds", trainer.allreduce.timeout_seconds}}},
      {"sync",
       {{"strategy", EnumToString(trainer.sync.strategy)},
        {"localSGD",
         {{"period", trainer.sync.local_sgd.period},
          {"startStep", trainer.sync.local_sgd.start_step}}},
        {"dgc",
         {{"sparsity", trainer.sync.dgc.sparsity},
          {"warmupSteps", trainer.sync.dgc.warmup_steps},
          {"minBucketElements", trainer.sync.dgc.min_bucket_elements}}},
        {"parameterServer",
         {{"mode", EnumToString(trainer.sync.parameter_server.mode)},
          {"staleness", trainer.sync.parameter_server.staleness},
          {"geoInterval", trainer.sync.parameter_server.geo_interval}}}}},
      {"pipeline",
       {{"stages", trainer.pipeline.stages},
        {"microBatches", trainer.pipeline.micro_batches},
        {"schedule", EnumToString(trainer.pipeline.schedule)},
        {"recompute", trainer.pipeline.recompute},
        {"stageLayers", trainer.pipeline.stage_layers}}},
      {"logIntervalSteps", trainer.log_interval_steps},
  };
  if (trainer.model.embedding.has_value()) {
    out["model"]["embedding"] = {{"fields", trainer.model.embedding->fields},
                                 {"dim", trainer.model.embedding->dim},
                                 {"rows", trainer.model.embedding->rows}};
  }
  // Zero means "not set" for both; writing only the one in use keeps the output valid.
  if (trainer.steps > 0) out["steps"] = trainer.steps;
  if (trainer.epochs > 0) out["epochs"] = trainer.epochs;
  return out;
}

json RunPolicyToJson(const RunPolicy& policy) {
  json out = {
      {"restartPolicy", EnumToString(policy.restart_policy)},
      {"backoffLimit", policy.backoff_limit},
      {"suspend", policy.suspend},
      {"scheduling",
       {{"gang", EnumToString(policy.scheduling.gang)},
        {"queue", policy.scheduling.queue},
        {"priorityClassName", policy.scheduling.priority_class_name},
        {"scheduleTimeoutSeconds", policy.scheduling.schedule_timeout_seconds}}},
      {"retryableExitCodes", policy.retryable_exit_codes},
  };
  if (policy.active_deadline_seconds) {
    out["activeDeadlineSeconds"] = *policy.active_deadline_seconds;
  }
  if (policy.ttl_seconds_after_finished) {
    out["ttlSecondsAfterFinished"] = *policy.ttl_seconds_after_finished;
  }
  return out;
}

}  // namespace

nlohmann::json ToJson(const TrainingJob& job) {
  const TrainingJobSpec& spec = job.spec;
  json out_spec = {
      {"replicas", spec.replicas},
      {"image", spec.image},
      {"resources",
       {{"gpus", spec.resources.gpus},
        {"cpu", spec.resources.cpu},
        {"memory", spec.resources.memory}}},
      {"checkpoint",
       {{"uri", spec.checkpoint.uri},
        {"intervalSteps", spec.checkpoint.interval_steps},
        {"keep", spec.checkpoint.keep},
        {"async", spec.checkpoint.async}}},
      {"network",
       {{"mode", EnumToString(spec.network.mode)},
        {"rdmaResource",
         {{"name", spec.network.rdma_resource.name}, {"count", spec.network.rdma_resource.count}}},
        {"multusNetworks", spec.network.multus_networks},
        {"hostNetwork", spec.network.host_network},
        {"ncclEnv", json(spec.network.nccl_env)}}},
      {"runPolicy", RunPolicyToJson(spec.run_policy)},
      {"metrics", {{"port", spec.metrics.port}}},
  };
  // Only what was set: an unset limit is the ranks' default, not a number to carry.
  json store = json::object();
  if (spec.rendezvous.store.max_keys > 0) store["maxKeys"] = spec.rendezvous.store.max_keys;
  if (spec.rendezvous.store.max_bytes > 0) store["maxBytes"] = spec.rendezvous.store.max_bytes;
  if (!store.empty()) out_spec["rendezvous"] = {{"store", store}};
  // Defaulted elastic bounds are not written, so elastic_set survives the round trip.
  if (spec.elastic_set) {
    out_spec["elastic"] = {{"minReplicas", spec.elastic.min_replicas},
                           {"maxReplicas", spec.elastic.max_replicas},
                           {"globalBatch", EnumToString(spec.elastic.global_batch)}};
    if (spec.elastic.replace_stragglers) out_spec["elastic"]["replaceStragglers"] = true;
    if (spec.elastic.standby > 0) out_spec["elastic"]["standby"] = spec.elastic.standby;
  }
  if (spec.ranks_per_worker != 1) out_spec["ranksPerWorker"] = spec.ranks_per_worker;
  if (spec.parameter_servers.replicas > 0) {
    const ResourcesSpec& resources = spec.parameter_servers.resources;
    out_spec["parameterServers"] = {
        {"replicas", spec.parameter_servers.replicas},
        {"resources",
         {{"gpus", resources.gpus}, {"cpu", resources.cpu}, {"memory", resources.memory}}}};
  }
  if (spec.trainer) out_spec["trainer"] = TrainerToJson(*spec.trainer);
  if (!spec.command.empty()) out_spec["command"] = spec.command;
  if (!spec.template_.is_null()) out_spec["template"] = spec.template_;
  if (!spec.placement.topology.empty()) {
    out_spec["placement"] = {{"topology", spec.placement.topology},
                             {"mode", EnumToString(spec.placement.mode)}};
    if (spec.placement.volcano_tier > 0) {
      out_spec["placement"]["volcanoTier"] = spec.placement.volcano_tier;
    }
  }
  return {{"apiVersion", job.api_version},
          {"kind", job.kind},
          {"metadata", MetadataToJson(job.metadata)},
          {"spec", std::move(out_spec)}};
}

}  // namespace lockstep::spec
