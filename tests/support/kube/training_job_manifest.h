// The TrainingJob the operator's integration tests and its scale benchmark apply: the built-in
// trainer on sklearn's digits (a small MLP, 200 steps), `replicas` workers, metrics on a free
// port. Tests change fields of the returned object as they need.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace lockstep::testing {

inline nlohmann::json JobManifest(const std::string& name, int replicas) {
  return {{"apiVersion", "lockstep.io/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}}},
          {"spec",
           {{"replicas", replicas},
            {"trainer",
             {{"model", {{"type", "mlp"}, {"hidden", {32}}}},
              {"data",
               {{"format", "csv"},
                {"train",
                 {"file:///usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"}}}},
              {"batchSize", 32},
              {"steps", 200}}},
            {"metrics", {{"port", 0}}}}}};
}

// A parameter-server job (docs/parameter-servers.md): `replicas` workers and 2 servers.
inline nlohmann::json ParameterServerManifest(const std::string& name, int replicas = 2) {
  nlohmann::json manifest = JobManifest(name, replicas);
  nlohmann::json& trainer = manifest["spec"]["trainer"];
  trainer["model"]["embedding"] = {{"fields", 8}, {"dim", 8}, {"rows", 65536}};
  trainer["data"] = {{"format", "clickLog"}, {"train", {"file:///data/ctr/train.tsv.gz"}}};
  trainer["optimizer"] = {{"type", "sgd"}, {"learningRate", 0.5}, {"momentum", 0}};
  trainer["sync"] = {{"strategy", "parameterServer"}, {"parameterServer", {{"mode", "async"}}}};
  manifest["spec"]["parameterServers"] = {{"replicas", 2},
                                          {"resources", {{"cpu", "2"}, {"memory", "1Gi"}}}};
  manifest["spec"]["runPolicy"] = {{"restartPolicy", "OnFailure"}, {"backoffLimit", 3}};
  return manifest;
}

}  // namespace lockstep::testing
