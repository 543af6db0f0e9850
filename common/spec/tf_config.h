// TensorFlow's TF_CONFIG for an exec-mode job with parameter servers (spec.command and
// spec.parameterServers): the JSON a TensorFlow program reads to learn its cluster and its own
// task, as TensorFlow documents it (tf.distribute.cluster_resolver.TFConfigClusterResolver;
// run_standard_tensorflow_server):
//
//   {"cluster": {"chief": ["w0:2222"], "worker": ["w1:2222", "w2:2222"], "ps": ["p0:2222"]},
//    "task": {"type": "worker", "index": 1}}
//
// Worker pod 0 is the chief (the coordinator of TensorFlow 2's ParameterServerStrategy, the
// chief worker of an Estimator), worker pods 1..W-1 are workers 0..W-2, and parameter-server pod
// s is ps s; as Kubeflow's TFJob with one Chief replica. A cluster of one worker has no "worker"
// list. Every task listens on kTfPort in a pod (under `lockstep run`, on ports of its own).
#pragma once

#include <string>
#include <vector>

namespace lockstep::spec {

inline constexpr int kTfPort = 2222;  // TFJob's default port

struct TfTask {
  std::string type;  // "chief" | "worker" | "ps"
  int index = 0;
};

// The task of worker pod `worker` (0 .. W-1) or parameter-server pod `server`.
TfTask TfTaskOfWorker(int worker);
TfTask TfTaskOfServer(int server);

// TF_CONFIG's JSON text: `workers` are the worker pods' host:port by index, `servers` the
// parameter servers'.
std::string TfConfig(const std::vector<std::string>& workers,
                     const std::vector<std::string>& servers, const TfTask& task);

}  // namespace lockstep::spec
