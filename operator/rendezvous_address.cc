#include "operator/rendezvous_address.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/deadline.h"
#include "common/logging.h"
#include "operator/kube/resource.h"

namespace lockstep::op {
namespace {

using json = nlohmann::json;

// The address in a Service object, or an error that retrying will not fix.
StatusOr<std::string> AddressOf(const json& service, const std::string& where) {
  const json& spec = service.value("spec", json::object());
  const std::string ip = spec.value("clusterIP", "");
  if (ip == "None") {
    return InvalidArgumentError("Service " + where +
                                " is headless (clusterIP None): workers need its cluster IP");
  }
  if (ip.empty()) return UnavailableError("Service " + where + " has no cluster IP yet");
  const json ports = spec.value("ports", json::array());
  const json* chosen = nullptr;
  for (const json& port : ports) {
    if (port.value("name", "").find("rendezvous") != std::string::npos) chosen = &port;
  }
  if (chosen == nullptr && ports.size() == 1) chosen = &ports[0];
  if (chosen == nullptr || !chosen->contains("port") || !(*chosen)["port"].is_number_integer()) {
    return InvalidArgumentError("Service " + where +
                                " has no port named *rendezvous* and not exactly one port");
  }
  const std::string host = ip.find(':') == std::string::npos ? ip : "[" + ip + "]";
  return host + ":" + std::to_string(chosen->at("port").get<int>());
}

}  // namespace

StatusOr<std::string> RendezvousServiceAddress(kube::KubeClient* client, const std::string& ns,
                                               const std::string& name, int64_t timeout_ms) {
  const std::string where = ns + "/" + name;
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  Status last = OkStatus();
  while (!deadline.expired()) {
    StatusOr<json> service = client->Get(kube::resources::kServices, ns, name);
    if (service.ok()) {
      StatusOr<std::string> address = AddressOf(*service, where);
      if (address.ok() || address.status().code() == StatusCode::kInvalidArgument) return address;
      last = address.status();
    } else {
      last = service.status();
    }
    LOCKSTEP_LOG(WARNING) << "rendezvous Service " << where << ": " << last.message();
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::min<int64_t>(1000, deadline.remaining_ms())));
  }
  return DeadlineExceededError("no cluster IP for rendezvous Service " + where + " within " +
                               std::to_string(timeout_ms) + " ms: " + last.message());
}

}  // namespace lockstep::op
