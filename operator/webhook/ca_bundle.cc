#include "operator/webhook/ca_bundle.h"

#include "common/base64.h"

namespace lockstep::op::webhook {

using json = nlohmann::json;

StatusOr<bool> EnsureWebhookCaBundle(kube::KubeClient* client, const std::string& name,
                                     const std::string& ca_pem) {
  const std::string bundle = Base64Encode(ca_pem);
  bool wrote = false;
  Status status = kube::RetryOnConflict([&]() -> Status {
    LOCKSTEP_ASSIGN_OR_RETURN(
        json configuration,
        client->Get(kube::resources::kValidatingWebhookConfigurations, "", name));
    bool stale = false;
    json& webhooks = configuration["webhooks"];
    if (!webhooks.is_array()) return OkStatus();
    for (json& hook : webhooks) {
      json& client_config = hook["clientConfig"];
      if (client_config.value("caBundle", "") != bundle) {
        client_config["caBundle"] = bundle;
        stale = true;
      }
    }
    if (!stale) return OkStatus();
    LOCKSTEP_RETURN_IF_ERROR(
        client->Update(kube::resources::kValidatingWebhookConfigurations, "", configuration)
            .status());
    wrote = true;
    return OkStatus();
  });
  if (!status.ok()) return status;
  return wrote;
}

}  // namespace lockstep::op::webhook
