#include "common/spec/tf_config.h"

#include <nlohmann/json.hpp>

namespace lockstep::spec {

TfTask TfTaskOfWorker(int worker) {
  return worker == 0 ? TfTask{"chief", 0} : TfTask{"worker", worker - 1};
}

TfTask TfTaskOfServer(int server) { return TfTask{"ps", server}; }

std::string TfConfig(const std::vector<std::string>& workers,
                     const std::vector<std::string>& servers, const TfTask& task) {
  nlohmann::json cluster = nlohmann::json::object();
  if (!workers.empty()) cluster["chief"] = nlohmann::json::array({workers.front()});
  if (workers.size() > 1) {
    cluster["worker"] = std::vector<std::string>(workers.begin() + 1, workers.end());
  }
  if (!servers.empty()) cluster["ps"] = servers;
  return nlohmann::json{{"cluster", std::move(cluster)},
                        {"task", {{"type", task.type}, {"index", task.index}}}}
      .dump();
}

}  // namespace lockstep::spec
