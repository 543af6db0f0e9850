#include "common/spec/manifest_fields.h"

#include <algorithm>

#include "common/spec/problems.h"

namespace lockstep::spec {

const std::vector<ManifestMap>& ManifestMaps() {
  static const std::vector<ManifestMap> kMaps = {
      // `status` belongs to the operator; a manifest read back from the cluster carries it.
      {"", {"apiVersion", "kind", "metadata", "spec", "status"}},
      // Besides what users write, the API server's fields, so the operator can parse watched
      // objects.
      {"metadata",
       {"name", "namespace", "labels", "annotations", "uid", "generation", "resourceVersion",
        "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "finalizers",
        "ownerReferences", "managedFields", "generateName", "selfLink"}},
      {"spec",
       {"replicas", "ranksPerWorker", "elastic", "trainer", "command", "image", "resources",
        "template", "checkpoint", "network", "runPolicy", "placement", "metrics",
        "parameterServers", "rendezvous"}},
      {"spec.rendezvous", {"store"}},
      {"spec.rendezvous.store", {"maxKeys", "maxBytes"}},
      {"spec.parameterServers", {"replicas", "resources"}},
      {"spec.parameterServers.resources", {"gpus", "cpu", "memory"}},
      {"spec.elastic",
       {"minReplicas", "maxReplicas", "globalBatch", "replaceStragglers", "standby"}},
      {"spec.trainer",
       {"model", "data", "batchSize", "steps", "epochs", "optimizer", "seed", "device", "precision",
        "allreduce", "sync", "pipeline", "logIntervalSteps"}},
      {"spec.trainer.model", {"type", "hidden", "activation", "embedding"}},
      {"spec.trainer.model.embedding", {"fields", "dim", "rows"}},
      {"spec.trainer.data", {"format", "train", "test"}},
      {"spec.trainer.optimizer",
       {"type", "learningRate", "momentum", "weightDecay", "lrScaling", "warmupSteps", "beta1",
        "beta2", "epsilon"}},
      {"spec.trainer.allreduce", {"bucketMiB", "compression", "timeoutSeconds"}},
      {"spec.trainer.sync", {"strategy", "localSGD", "dgc", "parameterServer"}},
      {"spec.trainer.sync.parameterServer", {"mode", "staleness", "geoInterval"}},
      {"spec.trainer.sync.localSGD", {"period", "startStep"}},
      {"spec.trainer.sync.dgc", {"sparsity", "warmupSteps", "minBucketElements"}},
      {"spec.trainer.pipeline", {"stages", "microBatches", "schedule", "recompute", "stageLayers"}},
      {"spec.resources", {"gpus", "cpu", "memory"}},
      {"spec.checkpoint", {"uri", "intervalSteps", "keep", "async"}},
      {"spec.network", {"mode", "rdmaResource", "multusNetworks", "hostNetwork", "ncclEnv"}},
      {"spec.network.rdmaResource", {"name", "count"}},
      {"spec.runPolicy",
       {"restartPolicy", "backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished",
        "suspend", "scheduling", "retryableExitCodes"}},
      {"spec.runPolicy.scheduling",
       {"gang", "queue", "priorityClassName", "scheduleTimeoutSeconds"}},
      {"spec.placement", {"topology", "mode", "volcanoTier"}},
      {"spec.metrics", {"port"}},
  };
  return kMaps;
}

const std::vector<std::string_view>& ManifestFields(std::string_view path) {
  static const std::vector<std::string_view> kNone;
  for (const ManifestMap& map : ManifestMaps()) {
    if (map.path == path) return map.fields;
  }
  return kNone;
}

std::vector<std::string> ManifestFieldPaths() {
  std::vector<std::string> paths;
  for (const ManifestMap& map : ManifestMaps()) {
    for (std::string_view field : map.fields) {
      paths.push_back(internal::JoinPath(std::string(map.path), std::string(field)));
    }
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace lockstep::spec
