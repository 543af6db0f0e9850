// LoadKubeconfig and InClusterConfig on files written by the test: contexts, inline and file
// credentials, relative paths, and errors that name the file and the field.
#include "operator/kube/kube_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace lockstep::op::kube {
namespace {

namespace fs = std::filesystem;

class KubeconfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/kubeconfig-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path) << text;
    return path;
  }

  std::string dir_;
};

// base64 of "CA PEM\n", "CERT\n", "KEY\n".
constexpr char kConfig[] = R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: dev-cluster
  cluster:
    server: https://10.0.0.1:6443/
    certificate-authority-data: Q0EgUEVNCg==
- name: prod-cluster
  cluster:
    server: https://prod.example:443
    certificate-authority: certs/ca.crt
- name: lab-cluster
  cluster:
    server: https://lab.example:6443
    insecure-skip-tls-verify: true
contexts:
- name: dev
  context: {cluster: dev-cluster, user: dev-user, namespace: team-a}
- name: prod
  context: {cluster: prod-cluster, user: prod-user}
- name: lab
  context: {cluster: lab-cluster, user: file-token-user}
- name: cloud
  context: {cluster: lab-cluster, user: exec-user}
- name: broken
  context: {cluster: dev-cluster, user: broken-user}
users:
- name: dev-user
  user:
    token: secret-token
- name: prod-user
  user:
    client-certificate-data: Q0VSVAo=
    client-key: keys/client.key
- name: file-token-user
  user:
    tokenFile: token.txt
- name: exec-user
  user:
    exec: {command: gke-gcloud-auth-plugin, apiVersion: client.authentication.k8s.io/v1beta1}
- name: broken-user
  user:
    client-certificate-data: Q0VSVAo=
    client-key-data: "***not base64***"
)";

TEST_F(KubeconfigTest, CurrentContextWithInlineCaAndToken) {
  const std::string path = Write("config", kConfig);
  StatusOr<KubeConfig> config = LoadKubeconfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.0.0.1:6443");  // trailing slash dropped
  EXPECT_EQ(config->ca_pem, "CA PEM\n");
  EXPECT_EQ(config->token, "secret-token");
  EXPECT_EQ(config->default_namespace, "team-a");
  EXPECT_FALSE(config->insecure_skip_tls_verify);
}

TEST_F(KubeconfigTest, NamedContextReadsFilesRelativeToTheKubeconfig) {
  Write("certs/ca.crt", "PROD CA\n");
  Write("keys/client.key", "PROD KEY\n");
  const std::string path = Write("config", kConfig);
  StatusOr<KubeConfig> config = LoadKubeconfig(path, "prod");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://prod.example:443");
  EXPECT_EQ(config->ca_pem, "PROD CA\n");
  EXPECT_EQ(config->client_cert_pem, "CERT\n");
  EXPECT_EQ(config->client_key_pem, "PROD KEY\n");
  EXPECT_TRUE(config->token.empty());
  EXPECT_EQ(config->default_namespace, "default");
}

TEST_F(KubeconfigTest, TokenFileAndInsecureSkipTlsVerify) {
  Write("token.txt", "from-file\n");
  StatusOr<KubeConfig> config = LoadKubeconfig(Write("config", kConfig), "lab");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->token, "from-file");
  EXPECT_TRUE(config->insecure_skip_tls_verify);
}

TEST_F(KubeconfigTest, ErrorsNameTheFileAndTheField) {
  const std::string path = Write("config", kConfig);
  Status missing_context = LoadKubeconfig(path, "staging").status();
  EXPECT_EQ(missing_context.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(missing_context.message(), "kubeconfig " + path + ": context \"staging\" not found");

  Status bad_key = LoadKubeconfig(path, "broken").status();
  EXPECT_EQ(bad_key.message(),
            "kubeconfig " + path + ": users[4].user.client-key-data: not base64");

  Status exec = LoadKubeconfig(path, "cloud").status();
  EXPECT_EQ(exec.code(), StatusCode::kUnimplemented);
  EXPECT_NE(exec.message().find("exec-user"), std::string::npos) << exec;

  // prod's CA file does not exist here.
  Status no_file = LoadKubeconfig(path, "prod").status();
  EXPECT_NE(no_file.message().find("clusters[1].cluster.certificate-authority"), std::string::npos)
      << no_file;

  EXPECT_EQ(LoadKubeconfig(dir_ + "/absent").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(LoadKubeconfig(Write("bad", "clusters: [")).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(KubeconfigTest, InClusterReadsTheServiceAccountDirectory) {
  unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_EQ(InClusterConfig(dir_).status().code(), StatusCode::kFailedPrecondition);

  Write("token", "sa-token\n");
  Write("ca.crt", "CLUSTER CA\n");
  Write("namespace", "lockstep-system");
  setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  StatusOr<KubeConfig> config = InClusterConfig(dir_);
  unsetenv("KUBERNETES_SERVICE_HOST");
  unsetenv("KUBERNETES_SERVICE_PORT");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://[fd00::1]:443");
  EXPECT_EQ(config->token, "sa-token");
  EXPECT_EQ(config->ca_pem, "CLUSTER CA\n");
  EXPECT_EQ(config->default_namespace, "lockstep-system");
}

}  // namespace
}  // namespace lockstep::op::kube
