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

}  // namespace lockstep::testing
