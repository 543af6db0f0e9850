// One real kube-apiserver + etcd per test binary (tests/support/kube), as a gtest global
// Environment, and the helpers the kube and controller tests share: an admin client from the
// test server's kubeconfig, a fresh namespace per test, the TrainingJob CRD installed once.
//
//   int main(int argc, char** argv) {
//     ::testing::InitGoogleTest(&argc, argv);
//     ::testing::AddGlobalTestEnvironment(new lockstep::op::testing::KubeServer);
//     return RUN_ALL_TESTS();
//   }
//   TEST(X, Y) { auto client = KubeServer::AdminClient(); std::string ns =
//   KubeServer::NewNamespace("x"); }
#pragma once

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "common/spec/problems.h"
#include "common/spec/yaml_to_json.h"
#include "operator/kube/kube_client.h"
#include "operator/kube/kube_config.h"
#include "tests/support/kube/kube_testenv.h"

namespace lockstep::op::testing {

using json = nlohmann::json;

inline const kube::Resource kNamespaces{"", "v1", "namespaces", "Namespace", false};
inline const kube::Resource kConfigMaps{"", "v1", "configmaps", "ConfigMap", true};
inline const kube::Resource kServiceAccounts{"", "v1", "serviceaccounts", "ServiceAccount", true};

class KubeServer : public ::testing::Environment {
 public:
  void SetUp() override {
    std::cerr << "starting kube-apiserver + etcd (a first run builds kube-apiserver: minutes)\n";
    kube_ = lockstep::testing::KubeTestEnv::Start({}, &error_);
  }
  void TearDown() override { kube_.reset(); }

  static lockstep::testing::KubeTestEnv* kube() { return kube_.get(); }
  static const std::string& error() { return error_; }

  static kube::KubeConfig Config() {
    StatusOr<kube::KubeConfig> config = kube::LoadKubeconfig(kube_->kubeconfig());
    EXPECT_TRUE(config.ok()) << config.status();
    return config.ok() ? *config : kube::KubeConfig{};
  }

  static std::unique_ptr<kube::KubeClient> AdminClient(kube::ClientOptions options = {}) {
    auto client = kube::KubeClient::Create(Config(), options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // A namespace of its own per test: tests never see each other's objects.
  static std::string NewNamespace(const std::string& prefix) {
    static std::atomic<int> counter{0};
    const std::string name = prefix + "-" + std::to_string(++counter);
    json ns = {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", name}}}};
    auto response = kube_->Request("POST", "/api/v1/namespaces", ns);
    EXPECT_EQ(response.status, 201) << response.raw << response.error;
    return name;
  }

  // Installs crds/trainingjob.yaml once and waits until it is served. Empty string: OK.
  static std::string InstallTrainingJobCrd() {
    static std::string result = [] {
      std::ifstream in(std::string(LOCKSTEP_SOURCE_DIR) + "/crds/trainingjob.yaml");
      std::stringstream text;
      text << in.rdbuf();
      json crd;
      try {
        spec::internal::Problems problems;
        crd = spec::internal::YamlToJson(YAML::Load(text.str()), &problems);
      } catch (const std::exception& e) {
        return std::string("crds/trainingjob.yaml: ") + e.what();
      }
      auto created =
          kube_->Request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd);
      if (created.status != 201) return "CRD refused: " + created.raw + created.error;
      const bool served = lockstep::testing::KubeTestEnv::WaitFor(
          [] {
            return kube_->Request("GET", "/apis/lockstep.io/v1alpha1/trainingjobs").status == 200;
          },
          30000);
      return served ? std::string() : std::string("CRD not served within 30 s");
    }();
    return result;
  }

  // A minimal valid TrainingJob.
  static json TrainingJob(const std::string& ns, const std::string& name) {
    return {{"apiVersion", "lockstep.io/v1alpha1"},
            {"kind", "TrainingJob"},
            {"metadata", {{"name", name}, {"namespace", ns}}},
            {"spec",
             {{"replicas", 2},
              {"command", {"python3", "train.py"}},
              {"image", "registry.example/worker:1"}}}};
  }

  static json ConfigMap(const std::string& ns, const std::string& name, json data = json::object(),
                        json labels = json::object()) {
    return {{"apiVersion", "v1"},
            {"kind", "ConfigMap"},
            {"metadata", {{"name", name}, {"namespace", ns}, {"labels", labels}}},
            {"data", data}};
  }

 private:
  static inline std::unique_ptr<lockstep::testing::KubeTestEnv> kube_;
  static inline std::string error_;
};

// Fails the test at once when the server did not come up.
#define LOCKSTEP_REQUIRE_KUBE()                                   \
  ASSERT_NE(::lockstep::op::testing::KubeServer::kube(), nullptr) \
      << ::lockstep::op::testing::KubeServer::error()

}  // namespace lockstep::op::testing
