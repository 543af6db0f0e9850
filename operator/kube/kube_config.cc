#include "operator/kube/kube_config.h"

#include <cpprest/asyncrt_utils.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace lockstep::op::kube {
namespace {

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return InternalError("error reading " + path);
  return text.str();
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// kubectl resolves relative file references against the kubeconfig's own directory.
std::string ResolvePath(const std::string& base_dir, const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  return base_dir + "/" + path;
}

StatusOr<std::string> DecodeBase64(const std::string& text) {
  try {
    const std::vector<unsigned char> bytes =
        utility::conversions::from_base64(utility::conversions::to_string_t(text));
    if (bytes.empty() && !text.empty()) return InvalidArgumentError("not base64");
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception&) {
    return InvalidArgumentError("not base64");
  }
}

// Reads one kubeconfig document. Each error names the kubeconfig and the field path.
class KubeconfigReader {
 public:
  KubeconfigReader(std::string path, YAML::Node root)
      : path_(std::move(path)), dir_(DirectoryOf(path_)), root_(std::move(root)) {}

  StatusOr<KubeConfig> Read(const std::string& requested_context) {
    std::string context_name = requested_context;
    if (context_name.empty()) context_name = Scalar(root_["current-context"]);
    if (context_name.empty()) return Error("no context given and current-context is not set");

    int index = -1;
    YAML::Node context = FindNamed("contexts", context_name, &index);
    if (index < 0) return Error("context \"" + context_name + "\" not found");
    const std::string context_field = "contexts[" + std::to_string(index) + "].context";
    YAML::Node context_body = context["context"];
    if (!context_body || !context_body.IsMap()) return Error(context_field + ": missing");
    const std::string cluster_name = Scalar(context_body["cluster"]);
    const std::string user_name = Scalar(context_body["user"]);

    KubeConfig config;
    const std::string ns = Scalar(context_body["namespace"]);
    if (!ns.empty()) config.default_namespace = ns;

    LOCKSTEP_RETURN_IF_ERROR(ReadCluster(cluster_name, &config));
    if (!user_name.empty()) LOCKSTEP_RETURN_IF_ERROR(ReadUser(user_name, &config));
    return config;
  }

 private:
  Status Error(const std::string& what, StatusCode code = StatusCode::kInvalidArgument) const {
    return Status(code, "kubeconfig " + path_ + ": " + what);
  }

  static std::string Scalar(const YAML::Node& node) {
    if (!node || !node.IsScalar()) return "";
    return node.as<std::string>();
  }

  YAML::Node FindNamed(const std::string& list, const std::string& name, int* index) const {
    YAML::Node items = root_[list];
    if (!items || !items.IsSequence()) return YAML::Node();
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].IsMap() && Scalar(items[i]["name"]) == name) {
        *index = static_cast<int>(i);
        return items[i];
      }
    }
    return YAML::Node();
  }

  // `data_key` (base64 inline) wins over `file_key` (a path), as in kubectl.
  Status ReadInlineOrFile(const YAML::Node& body, const std::string& field,
                          const std::string& data_key, const std::string& file_key,
                          std::string* out) const {
    const std::string data = Scalar(body[data_key]);
    if (!data.empty()) {
      StatusOr<std::string> decoded = DecodeBase64(data);
      if (!decoded.ok()) return Error(field + "." + data_key + ": not base64");
      *out = std::move(*decoded);
      return OkStatus();
    }
    const std::string file = Scalar(body[file_key]);
    if (file.empty()) return OkStatus();
    StatusOr<std::string> text = ReadWholeFile(ResolvePath(dir_, file));
    if (!text.ok()) return Error(field + "." + file_key + ": " + text.status().message());
    *out = std::move(*text);
    return OkStatus();
  }

  Status ReadCluster(const std::string& name, KubeConfig* config) const {
    int index = -1;
    YAML::Node cluster = FindNamed("clusters", name, &index);
    if (index < 0) return Error("cluster \"" + name + "\" not found");
    const std::string field = "clusters[" + std::to_string(index) + "].cluster";
    YAML::Node body = cluster["cluster"];
    if (!body || !body.IsMap()) return Error(field + ": missing");
    config->server = Scalar(body["server"]);
    while (!config->server.empty() && config->server.back() == '/') config->server.pop_back();
    if (config->server.empty()) return Error(field + ".server: missing");
    if (config->server.rfind("https://", 0) != 0 && config->server.rfind("http://", 0) != 0) {
      return Error(field + ".server: \"" + config->server + "\" is not an http(s) URL");
    }
    try {
      if (body["insecure-skip-tls-verify"]) {
        config->insecure_skip_tls_verify = body["insecure-skip-tls-verify"].as<bool>();
      }
    } catch (const YAML::Exception&) {
      return Error(field + ".insecure-skip-tls-verify: not a boolean");
    }
    return ReadInlineOrFile(body, field, "certificate-authority-data", "certificate-authority",
                            &config->ca_pem);
  }

  Status ReadUser(const std::string& name, KubeConfig* config) const {
    int index = -1;
    YAML::Node user = FindNamed("users", name, &index);
    if (index < 0) return Error("user \"" + name + "\" not found");
    const std::string field = "users[" + std::to_string(index) + "].user";
    YAML::Node body = user["user"];
    if (!body) return OkStatus();  // anonymous
    if (!body.IsMap()) return Error(field + ": not a map");
    if (body["exec"] || body["auth-provider"]) {
      return Error("user \"" + name + "\": exec and auth-provider plugins are not supported",
                   StatusCode::kUnimplemented);
    }
    config->token = Scalar(body["token"]);
    const std::string token_file = Scalar(body["tokenFile"]);
    if (config->token.empty() && !token_file.empty()) {
      StatusOr<std::string> token = ReadWholeFile(ResolvePath(dir_, token_file));
      if (!token.ok()) return Error(field + ".tokenFile: " + token.status().message());
      config->token = *token;
      while (!config->token.empty() && isspace(static_cast<unsigned char>(config->token.back()))) {
        config->token.pop_back();
      }
    }
    LOCKSTEP_RETURN_IF_ERROR(ReadInlineOrFile(body, field, "client-certificate-data",
                                              "client-certificate", &config->client_cert_pem));
    LOCKSTEP_RETURN_IF_ERROR(
        ReadInlineOrFile(body, field, "client-key-data", "client-key", &config->client_key_pem));
    if (config->client_cert_pem.empty() != config->client_key_pem.empty()) {
      return Error(field + ": client certificate and key must be given together");
    }
    return OkStatus();
  }

  std::string path_;
  std::string dir_;
  YAML::Node root_;
};

}  // namespace

StatusOr<KubeConfig> LoadKubeconfig(const std::string& path, const std::string& context) {
  StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return NotFoundError("kubeconfig " + path + ": " + text.status().message());
  YAML::Node root;
  try {
    root = YAML::Load(*text);
  } catch (const YAML::Exception& error) {
    return InvalidArgumentError("kubeconfig " + path + ": malformed YAML: " + error.msg);
  }
  if (!root.IsMap()) return InvalidArgumentError("kubeconfig " + path + ": not a YAML map");
  try {
    return KubeconfigReader(path, root).Read(context);
  } catch (const YAML::Exception& error) {
    // Type mismatches deep in the tree (a list where a scalar belongs).
    return InvalidArgumentError("kubeconfig " + path + ": " + error.msg);
  }
}

StatusOr<KubeConfig> InClusterConfig(const std::string& root) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || port == nullptr || *host == '\0' || *port == '\0') {
    return FailedPreconditionError(
        "not in a Kubernetes cluster: KUBERNETES_SERVICE_HOST/PORT are not set");
  }
  KubeConfig config;
  const std::string host_text = host;
  // An IPv6 service address needs brackets in a URL.
  const bool ipv6 = host_text.find(':') != std::string::npos;
  config.server = "https://" + (ipv6 ? "[" + host_text + "]" : host_text) + ":" + port;

  StatusOr<std::string> token = ReadWholeFile(root + "/token");
  if (!token.ok()) {
    return FailedPreconditionError("in-cluster config: " + token.status().message());
  }
  config.token = std::move(*token);
  while (!config.token.empty() && isspace(static_cast<unsigned char>(config.token.back()))) {
    config.token.pop_back();
  }
  StatusOr<std::string> ca = ReadWholeFile(root + "/ca.crt");
  if (!ca.ok()) return FailedPreconditionError("in-cluster config: " + ca.status().message());
  config.ca_pem = std::move(*ca);
  StatusOr<std::string> ns = ReadWholeFile(root + "/namespace");
  if (ns.ok()) {
    std::string name = *ns;
    while (!name.empty() && isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    if (!name.empty()) config.default_namespace = name;
  }
  return config;
}

}  // namespace lockstep::op::kube
