// Keeps the chart's ValidatingWebhookConfiguration trusting the operator's CA: the API server
// verifies the webhook's serving certificate against each webhook's clientConfig.caBundle, and
// only the operator knows its CA (created once, kept in its own Secret, the same CA the
// rendezvous service's certificates come from). The chart installs the configuration without a
// caBundle; every operator replica writes it at start and checks it again periodically, so a
// `helm upgrade` that resets it is mended within one period.
//
//   StatusOr<bool> changed = EnsureWebhookCaBundle(client, "lockstep-operator", ca.cert_pem);
//
// RBAC: get and update on that one validatingwebhookconfigurations name.
#pragma once

#include <string>

#include "common/status.h"
#include "operator/kube/kube_client.h"

namespace lockstep::op::webhook {

// Sets clientConfig.caBundle of every webhook in the configuration `name` to `ca_pem` where it
// differs; true when it wrote. NOT_FOUND when the configuration does not exist (the webhook is
// turned off in the chart); other errors as KubeClient's. Retries on a conflicting write; each
// call is bounded by the client's request deadline.
StatusOr<bool> EnsureWebhookCaBundle(kube::KubeClient* client, const std::string& name,
                                     const std::string& ca_pem);

}  // namespace lockstep::op::webhook
