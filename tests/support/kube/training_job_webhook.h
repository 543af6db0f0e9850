// The chart's TrainingJob admission webhook as tests and benchmarks register it on the test API
// server: the same rules, failure policy choice, side effects and review versions as
// charts/lockstep/templates/webhook.yaml, but called by URL on loopback (nothing routes Services
// here) and without a caBundle (the operator under test writes it).
//
//   kube.Request("POST", kValidatingWebhookConfigurations,
//                TrainingJobWebhookConfiguration("my-webhook", port, "Fail", selector));
//   ASSERT_TRUE(WaitUntilWebhookRefuses(kube, "team-a", invalid_job, 30000, &last)) << last;
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/kube/kube_testenv.h"

namespace lockstep::testing {

inline constexpr char kTrainingJobWebhookName[] = "trainingjobs.lockstep.io";
inline constexpr char kTrainingJobWebhookPath[] = "/validate-trainingjob";
inline constexpr char kValidatingWebhookConfigurations[] =
    "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";

// A ValidatingWebhookConfiguration `name` calling https://127.0.0.1:<port>/validate-trainingjob
// for TrainingJob creates, updates and scale in the namespaces `namespace_selector` matches.
inline nlohmann::json TrainingJobWebhookConfiguration(const std::string& name, int port,
                                                      const std::string& failure_policy,
                                                      const nlohmann::json& namespace_selector) {
  return {{"apiVersion", "admissionregistration.k8s.io/v1"},
          {"kind", "ValidatingWebhookConfiguration"},
          {"metadata", {{"name", name}}},
          {"webhooks",
           {{{"name", kTrainingJobWebhookName},
             {"clientConfig",
              {{"url", "https://127.0.0.1:" + std::to_string(port) + kTrainingJobWebhookPath}}},
             {"rules",
              {{{"apiGroups", {"lockstep.io"}},
                {"apiVersions", {"v1alpha1"}},
                {"operations", {"CREATE", "UPDATE"}},
                {"resources", {"trainingjobs", "trainingjobs/scale"}},
                {"scope", "Namespaced"}}}},
             {"namespaceSelector", namespace_selector},
             {"failurePolicy", failure_policy},
             {"sideEffects", "None"},
             {"timeoutSeconds", 5},
             {"admissionReviewVersions", {"v1", "v1beta1"}}}}}};
}

// Polls (bounded by timeout_ms) until a dry-run create of `invalid_job` in `ns` is refused by the
// webhook: the API server loads a new configuration, and the caBundle the operator writes into
// it, from its own watch a moment later. `last` gets the last answer's body.
inline bool WaitUntilWebhookRefuses(const KubeTestEnv& env, const std::string& ns,
                                    const nlohmann::json& invalid_job, int64_t timeout_ms,
                                    std::string* last = nullptr) {
  return KubeTestEnv::WaitFor(
      [&] {
        KubeTestEnv::Response r = env.Request(
            "POST", "/apis/lockstep.io/v1alpha1/namespaces/" + ns + "/trainingjobs?dryRun=All",
            invalid_job);
        if (last) *last = r.raw;
        return r.status == 422 && r.raw.find("denied the request") != std::string::npos;
      },
      timeout_ms);
}

}  // namespace lockstep::testing
