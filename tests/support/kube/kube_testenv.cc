// See kube_testenv.h.
#include "tests/support/kube/kube_testenv.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "common/spec/problems.h"
#include "common/spec/yaml_to_json.h"
#include "tests/support/process/process.h"

#ifndef LOCKSTEP_KUBE_APISERVER_SCRIPT
#error "LOCKSTEP_KUBE_APISERVER_SCRIPT must name scripts/kubernetes.sh"
#endif

namespace lockstep::testing {
namespace {

using json = nlohmann::json;

std::string Tail(const std::string& text, size_t bytes) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

std::string TailOfFile(const std::string& path, size_t bytes) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return Tail(buffer.str(), bytes);
}

std::string Trim(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  size_t line = text.rfind('\n');
  return line == std::string::npos ? text : text.substr(line + 1);
}

// The absolute path of a program on PATH (the process runner execs without a PATH search).
std::string Tool(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "/usr/bin/" + name;  // exec fails with 127 and the error names it
}

std::string RandomHex(int bytes) {
  std::random_device device;
  std::ostringstream out;
  for (int i = 0; i < bytes; ++i) {
    out << std::hex << ((device() >> 4) & 0xf) << (device() & 0xf);
  }
  return out.str();
}

// True while `pid` runs (exists and is not a zombie).
bool IsRunning(pid_t pid) {
  if (pid <= 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
}

// argv run under a small bash guard, its output appended to `log`. The guard leads the process
// group (so StopChild's group signal reaches both) and kills the server when this test process
// dies without tearing down (a crash, ctest's timeout), so no etcd or kube-apiserver outlives
// its test. It exits when the server exits, so IsRunning(guard) tells whether the server runs.
std::unique_ptr<ChildProcess> StartLogged(const std::vector<std::string>& argv,
                                          const std::string& log) {
  static const char* const kGuard =
      "log=$1; parent=$2; shift 2\n"
      "\"$@\" >>\"$log\" 2>&1 &\n"
      "child=$!\n"
      "trap 'kill -TERM $child 2>/dev/null; wait $child; exit 143' TERM\n"
      "while kill -0 \"$parent\" 2>/dev/null && kill -0 \"$child\" 2>/dev/null; do\n"
      "  sleep 0.5 & wait $!\n"
      "done\n"
      "kill -TERM $child 2>/dev/null\n"
      "wait $child\n";
  std::vector<std::string> wrapped = {Tool("bash"),         "-c", kGuard,
                                      "kube-testenv-guard", log,  std::to_string(getpid())};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return std::make_unique<ChildProcess>(wrapped,
                                        std::vector<std::pair<std::string, std::string>>{});
}

void StopChild(std::unique_ptr<ChildProcess>& child) {
  if (!child) return;
  if (child->pid() > 0) {
    kill(-child->pid(), SIGTERM);
    child->Wait(10000);  // SIGKILLs the group past the deadline
  }
  child.reset();
}

// Every document of a YAML file, as JSON (empty documents skipped).
bool LoadDocuments(const std::string& path, std::vector<json>* out, std::string* why) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAllFromFile(path);
  } catch (const YAML::Exception& error) {
    *why = path + ": " + error.msg;
    return false;
  }
  for (const YAML::Node& document : documents) {
    spec::internal::Problems problems;
    json j = spec::internal::YamlToJson(document, &problems);
    if (!problems.empty()) {
      *why = path + ": " + problems.Join("yaml");
      return false;
    }
    if (!j.is_null()) out->push_back(std::move(j));
  }
  return true;
}

}  // namespace

std::vector<int> FreePorts(int count) {
  std::vector<int> sockets, ports;
  for (int i = 0; i < count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    socklen_t length = sizeof(address);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      if (fd >= 0) close(fd);
      break;
    }
    sockets.push_back(fd);
    ports.push_back(ntohs(address.sin_port));
  }
  for (int fd : sockets) close(fd);
  return ports;
}

bool KubeTestEnv::InstallCrds(const std::string& path, std::string* error) const {
  std::vector<json> documents;
  if (!LoadDocuments(path, &documents, error)) return false;
  for (const json& crd : documents) {
    if (!crd.is_object() || crd.value("kind", "") != "CustomResourceDefinition") {
      *error = path + ": not a CustomResourceDefinition: " + crd.dump().substr(0, 200);
      return false;
    }
    Response created =
        Request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd);
    if (created.status != 201 && created.status != 409) {
      *error = path + ": CRD refused (" + std::to_string(created.status) + "): " + created.raw +
               created.error;
      return false;
    }
    const json& spec = crd["spec"];
    const std::string group = spec.value("group", "");
    const std::string plural = spec["names"].value("plural", "");
    for (const json& version : spec.value("versions", json::array())) {
      if (!version.value("served", false)) continue;
      const std::string discovery = "/apis/" + group + "/" + version.value("name", "");
      bool served = KubeTestEnv::WaitFor(
          [&] {
            Response r = Request("GET", discovery, nullptr, "application/json", 5000);
            if (r.status != 200 || !r.body.is_object()) return false;
            for (const json& resource : r.body.value("resources", json::array())) {
              if (resource.value("name", "") == plural) return true;
            }
            return false;
          },
          30000);
      if (!served) {
        *error =
            path + ": " + plural + "." + group + " not served at " + discovery + " within 30 s";
        return false;
      }
    }
  }
  return true;
}

bool KubeTestEnv::WaitFor(const std::function<bool()>& condition, int64_t timeout_ms) {
  return PollUntil(condition, timeout_ms, 100);
}

std::unique_ptr<KubeTestEnv> KubeTestEnv::Start(const KubeTestEnvOptions& options,
                                                std::string* error) {
  // 1. The binaries: cached, or built now (bounded).
  ProcessResult built =
      RunProcess({Tool("bash"), LOCKSTEP_KUBE_APISERVER_SCRIPT}, {}, options.build_timeout_ms);
  if (built.timed_out || built.signaled || built.exit_code != 0) {
    *error = std::string("kube-apiserver is not available: ") + LOCKSTEP_KUBE_APISERVER_SCRIPT +
             (built.timed_out ? " did not finish within " +
                                    std::to_string(options.build_timeout_ms / 1000) + " s"
                              : " failed (exit " + std::to_string(built.exit_code) + ")") +
             "; its output:\n" + Tail(built.err + built.out, 4000);
    return nullptr;
  }
  std::unique_ptr<KubeTestEnv> env(new KubeTestEnv());
  env->apiserver_binary_ = Trim(built.out);
  const char* etcd_binary = "/usr/bin/etcd";
  if (access(etcd_binary, X_OK) != 0) {
    *error = "etcd not found at /usr/bin/etcd: install Debian's etcd-server (scripts/setup.sh)";
    return nullptr;
  }

  // 2. The directory: tokens, service account key, certificates, data, logs.
  env->dir_ = MakeTempDir("lockstep-kube");
  const std::string& dir = env->dir_;
  env->token_ = RandomHex(16);
  WriteFile(dir + "/tokens.csv",
            env->token_ + ",lockstep-admin,lockstep-admin,\"system:masters\"\n");
  ProcessResult key =
      RunProcess({Tool("openssl"), "genrsa", "-out", dir + "/sa.key", "2048"}, {}, 60000);
  if (key.exit_code != 0) {
    *error = "openssl genrsa failed (is openssl installed?): " + key.err;
    return nullptr;
  }
  std::vector<int> ports = FreePorts(3);
  if (ports.size() != 3) {
    *error = "cannot find free loopback ports";
    return nullptr;
  }
  const std::string etcd_url = "http://127.0.0.1:" + std::to_string(ports[0]);
  const std::string peer_url = "http://127.0.0.1:" + std::to_string(ports[1]);
  env->server_ = "https://127.0.0.1:" + std::to_string(ports[2]);
  env->ca_file_ = dir + "/certs/apiserver.crt";

  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options.start_timeout_ms);
  auto left_ms = [&] {
    return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
  };

  // 3. etcd.
  env->etcd_ =
      StartLogged({etcd_binary, "--name", "default", "--data-dir", dir + "/etcd",
                   "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                   "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                   "--initial-cluster", "default=" + peer_url, "--log-level", "warn"},
                  dir + "/etcd.log");
  bool etcd_ok = WaitFor(
      [&] {
        if (!IsRunning(env->etcd_->pid())) return true;  // exited: stop waiting
        ProcessResult health =
            RunProcess({Tool("curl"), "-sS", "--max-time", "2", etcd_url + "/health"}, {}, 5000);
        return health.out.find("\"health\":\"true\"") != std::string::npos;
      },
      left_ms());
  if (!etcd_ok || !IsRunning(env->etcd_->pid())) {
    *error = "etcd did not become healthy:\n" + TailOfFile(dir + "/etcd.log", 3000);
    return nullptr;
  }

  // 4. kube-apiserver.
  env->apiserver_ = StartLogged(
      {env->apiserver_binary_, "--etcd-servers=" + etcd_url, "--bind-address=127.0.0.1",
       "--advertise-address=127.0.0.1", "--secure-port=" + std::to_string(ports[2]),
       "--insecure-port=0", "--cert-dir=" + dir + "/certs",
       "--token-auth-file=" + dir + "/tokens.csv", "--authorization-mode=RBAC",
       "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
       "--service-account-key-file=" + dir + "/sa.key",
       "--service-account-signing-key-file=" + dir + "/sa.key",
       "--service-cluster-ip-range=10.0.0.0/24", "--endpoint-reconciler-type=none",
       "--disable-admission-plugins=ServiceAccount", "--allow-privileged=true", "--v=1"},
      dir + "/kube-apiserver.log");
  bool ready = WaitFor(
      [&] {
        if (!IsRunning(env->apiserver_->pid())) return true;
        if (access(env->ca_file_.c_str(), R_OK) != 0) return false;
        Response response = env->Request("GET", "/readyz", nullptr, "application/json", 5000);
        return response.status == 200;
      },
      left_ms());
  if (!ready || !IsRunning(env->apiserver_->pid())) {
    *error = "kube-apiserver did not become ready within " +
             std::to_string(options.start_timeout_ms / 1000) + " s:\n" + env->LogTails();
    return nullptr;
  }

  // 5. A kubeconfig for kubectl-like clients.
  WriteFile(dir + "/kubeconfig",
            "apiVersion: v1\nkind: Config\nclusters:\n- name: lockstep-test\n  cluster:\n"
            "    server: " +
                env->server_ + "\n    certificate-authority: " + env->ca_file_ +
                "\nusers:\n- name: lockstep-admin\n  user:\n    token: " + env->token_ +
                "\ncontexts:\n- name: lockstep-test\n  context:\n    cluster: lockstep-test\n"
                "    user: lockstep-admin\n    namespace: default\n"
                "current-context: lockstep-test\n");
  env->kubeconfig_ = dir + "/kubeconfig";

  return env;
}

bool KubeTestEnv::StartControllerManager(const std::vector<std::string>& controllers,
                                         std::string* error) {
  if (controller_manager_) {
    if (controllers == controllers_) return true;
    *error = "kube-controller-manager already runs other controllers";
    return false;
  }
  std::string names;
  for (const std::string& controller : controllers) {
    names += (names.empty() ? "" : ",") + controller;
  }
  const std::string manager_binary =
      (std::filesystem::path(apiserver_binary_).parent_path() / "kube-controller-manager").string();
  controllers_ = controllers;
  controller_manager_ =
      StartLogged({manager_binary, "--kubeconfig=" + kubeconfig_, "--controllers=" + names,
                   "--leader-elect=false", "--port=0", "--secure-port=0", "--v=1"},
                  dir_ + "/kube-controller-manager.log");
  // It serves nothing (both ports off), so there is no readiness to ask: the controllers sync on
  // their own and tests wait for their effects with bounds. What is checked is that it stays up.
  const bool exited = WaitFor([&] { return !IsRunning(controller_manager_->pid()); }, 2000);
  if (exited) {
    *error = "kube-controller-manager exited at start:\n" +
             TailOfFile(dir_ + "/kube-controller-manager.log", 4000);
    return false;
  }
  return true;
}

KubeTestEnv::~KubeTestEnv() { Stop(); }

void KubeTestEnv::Stop() {
  StopChild(controller_manager_);
  StopChild(apiserver_);
  StopChild(etcd_);
  const char* keep = std::getenv("LOCKSTEP_KEEP_KUBE_TESTENV");
  if (!dir_.empty() && !(keep && *keep && std::string(keep) != "0")) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

std::string KubeTestEnv::LogTails() const {
  return "--- etcd.log ---\n" + TailOfFile(dir_ + "/etcd.log", 2000) +
         "\n--- kube-apiserver.log ---\n" + TailOfFile(dir_ + "/kube-apiserver.log", 4000) +
         (controller_manager_ ? "\n--- kube-controller-manager.log ---\n" +
                                    TailOfFile(dir_ + "/kube-controller-manager.log", 2000)
                              : std::string());
}

KubeTestEnv::Identity KubeTestEnv::ServiceAccountIdentity(const std::string& ns,
                                                          const std::string& name) {
  return {"system:serviceaccount:" + ns + ":" + name,
          {"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}};
}

KubeTestEnv::Response KubeTestEnv::Request(const std::string& method, const std::string& path,
                                           const json& body, const std::string& content_type,
                                           int64_t timeout_ms, const std::string& accept) const {
  return Send(method, path, body, content_type, timeout_ms, accept, {});
}

KubeTestEnv::Response KubeTestEnv::RequestAs(const Identity& who, const std::string& method,
                                             const std::string& path, const json& body,
                                             const std::string& content_type) const {
  std::vector<std::string> headers = {"Impersonate-User: " + who.user};
  for (const std::string& group : who.groups) headers.push_back("Impersonate-Group: " + group);
  return Send(method, path, body, content_type, 30000, "application/json", headers);
}

KubeTestEnv::Response KubeTestEnv::Send(const std::string& method, const std::string& path,
                                        const json& body, const std::string& content_type,
                                        int64_t timeout_ms, const std::string& accept,
                                        const std::vector<std::string>& headers) const {
  static std::atomic<int> counter{0};
  std::string stem =
      dir_ + "/request-" + std::to_string(getpid()) + "-" + std::to_string(counter.fetch_add(1));
  std::vector<std::string> argv = {
      Tool("curl"), "-sS",
      "-X",         method,
      "--cacert",   ca_file_,
      "-H",         "Authorization: Bearer " + token_,
      "-H",         "Accept: " + accept,
      "--max-time", std::to_string(std::max<int64_t>(1, timeout_ms / 1000)),
      "-o",         stem + ".out",
      "-w",         "%{http_code}"};
  for (const std::string& header : headers) argv.insert(argv.end(), {"-H", header});
  if (!body.is_null()) {
    WriteFile(stem + ".in", body.dump());
    argv.insert(argv.end(),
                {"-H", "Content-Type: " + content_type, "--data-binary", "@" + stem + ".in"});
  }
  argv.push_back(server_ + path);
  ProcessResult result = RunProcess(argv, {}, timeout_ms + 5000);
  Response response;
  response.raw = ReadFile(stem + ".out");
  std::remove((stem + ".out").c_str());
  std::remove((stem + ".in").c_str());
  if (result.exit_code != 0) {
    response.error = "curl " + method + " " + path + ": " + result.err;
    return response;
  }
  response.status = std::atoi(result.out.c_str());
  response.body = json::parse(response.raw, nullptr, /*allow_exceptions=*/false);
  if (response.body.is_discarded()) response.body = nullptr;
  return response;
}

}  // namespace lockstep::testing
